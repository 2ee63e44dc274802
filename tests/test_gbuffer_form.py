"""Canonical G-buffer frames <-> teacher form: conventions and round trips."""
import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming import gbuffer as gb


def random_frame(h=8, w=12, seed=0):
    rng = np.random.default_rng(seed)
    n = rng.normal(size=(h, w, 3)).astype(np.float32)
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    depth = rng.uniform(0.6, 50.0, size=(h, w)).astype(np.float32)
    depth[0, 0] = np.inf
    return gb.GBufferFrame(
        index=3,
        timestamp=0.25,
        albedo=rng.uniform(0, 1, (h, w, 3)).astype(np.float32),
        depth=depth,
        metallic=rng.uniform(0, 1, (h, w)).astype(np.float32),
        normal=n,
        roughness=rng.uniform(0, 1, (h, w)).astype(np.float32),
    ).validate()


def test_teacher_form_layout_and_order():
    f = random_frame()
    t = gb.frame_to_teacher(f)
    assert t.shape == (5, 8, 12, 3) and t.dtype == np.uint8
    # single-channel passes are replicated to 3 channels
    for i in (1, 2, 4):
        assert (t[i, ..., 0] == t[i, ..., 1]).all() and (t[i, ..., 0] == t[i, ..., 2]).all()
    # background depth is black, brighter is closer
    assert t[1, 0, 0, 0] == 0
    near, far = np.unravel_index(np.argmin(f.depth), f.depth.shape), np.unravel_index(
        np.argmax(np.where(np.isfinite(f.depth), f.depth, 0)), f.depth.shape
    )
    assert t[1][near][0] > t[1][far][0]
    m = gb.teacher_to_model(t)
    assert float(m.min()) >= -1.0 and float(m.max()) <= 1.0
    assert m[0, 0, 0, 0].item() == pytest.approx(int(t[0, 0, 0, 0]) * 2 / 255 - 1)


def test_round_trip_within_8bit_precision():
    f = random_frame()
    back = gb.teacher_to_frame(gb.frame_to_teacher(f), index=f.index)
    # 8-bit sRGB: worst-case linear step is below 1/255 * (d lin / d srgb) <= ~0.013 at the top
    assert np.abs(back.albedo - f.albedo).max() < 0.01
    assert np.abs(back.metallic - f.metallic).max() <= 0.5 / 255 + 1e-6
    assert np.abs(back.roughness - f.roughness).max() <= 0.5 / 255 + 1e-6
    ang = np.degrees(np.arccos(np.clip((back.normal * f.normal).sum(-1), -1, 1)))
    assert ang.max() < 1.0
    assert np.isinf(back.depth[0, 0])
    # inverse depth quantisation: relative error grows with distance, 1/255 of depth_near/depth steps
    inv_err = np.abs(gb.DEFAULT_DEPTH_NEAR / back.depth - gb.DEFAULT_DEPTH_NEAR / f.depth)
    assert np.nanmax(inv_err[np.isfinite(f.depth)]) <= 0.5 / 255 + 1e-6


def test_validate_names_bad_pass():
    f = random_frame()
    f.normal = f.normal[..., :2]
    with pytest.raises(AlayaError, match=r"clip\.npy: frame 3: normal has shape"):
        f.validate("clip.npy")
    with pytest.raises(AlayaError, match="expected uint8"):
        gb.teacher_to_frame(np.zeros((4, 2, 2, 3), np.uint8))
