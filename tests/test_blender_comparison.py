"""integrations/blender/blender_comparison.py's compare half on a tiny synthetic street (no Blender, no model):
the report's figures for a render equal to the truth and for one without cast shadows."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from alaya_flash.streaming.gbuffer import srgb_to_linear

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bc():
    spec = importlib.util.spec_from_file_location("blender_comparison", ROOT / "integrations" / "blender" / "blender_comparison.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def street(frames: int = 2, n: int = 16):
    """Truth (T, n, n, 3) float sRGB and masks: sky above, road below (left half shadowed, right lit),
    pavement in the bottom row (lit, brighter), a sphere (id 2) of varying brightness."""
    objects = np.full((n, n), -1, np.int8)
    objects[n // 2:] = 0
    objects[-1] = 1
    objects[2:6, 2:7] = 2  # 20 pixels (contrast needs 16)
    sun = np.zeros((n, n), np.float32)
    sun[n // 2:, n // 2:] = 1
    sun[-1] = 1
    truth = np.full((n, n, 3), 0.5, np.float32)
    truth[objects == 0] = 0.6
    truth[(objects == 0) & (sun == 0)] = 0.2
    truth[objects == 1] = 0.9
    truth[2:6, 2:7] = np.linspace(0.1, 0.9, 20, dtype=np.float32).reshape(4, 5, 1)
    masks = [{"sun": sun, "objects": objects, "sphere": objects == 2} for _ in range(frames)]
    return np.stack([truth] * frames), masks


def test_edge_free_region_drops_edges():
    from alaya_flash.streaming.metrics import edge_free

    truth, masks = street()
    ok = edge_free(masks[0]["objects"] == 0, masks[0]["sun"])
    assert not ok[:9].any() and not ok[:, 7:9].any()  # the road's top row and both sides of the shadow's edge
    assert ok[9:14, :7].all() and ok[9:14, 9:].all()
    assert not ok[14:].any()  # next to the pavement (id 1) or on it


def test_score_render_equal_to_truth_and_flat(bc):
    truth, masks = street()
    regions = {"road": [0], "ground": [0, 1]}
    same = bc.score(truth, truth, masks, regions)
    assert set(same) == {"psnr_db", "psnr_db_mean_of_frames", "psnr_db_surfaces_mean_of_frames", "shadow_ratio",
                         "sphere_contrast", "frames"}
    assert same["psnr_db"] == float("inf") and len(same["frames"]) == 2
    road = same["shadow_ratio"]["road"]
    lin = srgb_to_linear(np.array([0.2, 0.6]))
    assert road["render"] == road["truth"] == pytest.approx(lin[0] / lin[1], rel=1e-5)  # linear luminance ratio
    assert same["sphere_contrast"]["render"] == same["sphere_contrast"]["truth"] > 0.5
    flat = truth.copy()
    flat[:, 8:] = 0.6  # no cast shadows, one colour everywhere on the ground, a flat sphere
    flat[:, 2:6, 2:7] = 0.5
    scored = bc.score(flat, truth, masks, regions)
    assert scored["shadow_ratio"]["road"]["render"] == pytest.approx(1.0)
    assert scored["shadow_ratio"]["road"]["truth"] == road["truth"]
    assert scored["sphere_contrast"]["render"] == pytest.approx(0.0, abs=1e-6)
    assert scored["frames"][0]["shadowed_sunlit_pixels"]["road"] == [35, 35]
    assert 0 < scored["psnr_db"] < 30


def test_the_scenes_sun_and_light_passes_as_an_engine_gives_them(bc, tmp_path):
    """given_light: the scene's sun with its azimuth relative to the camera's heading (camera.json's first
    frame); with_light_passes: the export beside the ray-cast sun masks as `shadow_NNNN.exr` and the sky
    masks as `sky_NNNN.exr`, which the readers take as the light passes."""
    import json

    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.files.readers import open_gbuffers
    from alaya_flash.streaming.files.synthetic import synthetic_stream
    from alaya_flash.streaming.values import gbuffer_chunks

    src = tmp_path / "street"
    src.mkdir()
    (src / "scene.json").write_text(json.dumps({"sun": {"azimuth": -55.0, "elevation": 40.0, "strength": 4.0},
                                                "sky": {"color": [0.2, 0.4, 0.8], "strength": 0.5}}))
    sinks.write_stream(synthetic_stream(16, 16, 3, seed=0), sinks.open_sink(src / "gbuffers", "exr"))
    # a camera looking along +y (heading 90 degrees): its -Z axis is world +y
    pose = [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, 1.6], [0.0, 0.0, 0.0, 1.0]]
    (src / "gbuffers" / "camera.json").write_text(json.dumps({"camera_to_world": [pose] * 3}))
    assert bc.given_light(src) == ("bright_sunny,az=-145.0,el=40,sun=4,zenith=0.1:0.2:0.4,horizon=0.1:0.2:0.4,"  # -55 - 90
                                   "ground=0.1:0.2:0.4,ambient=1")
    (src / "masks").mkdir()
    suns = [np.zeros((16, 16), np.float32) for _ in range(3)]
    skies = [np.full((16, 16), 0.25 * k, np.float32) for k in range(3)]
    for k, (sun, sky) in enumerate(zip(suns, skies)):
        sun[:, k * 4:] = 1.0
        sky[:8] = 1.0
        np.save(src / "masks" / f"sun_{k + 1:04d}.npy", sun)
        np.save(src / "masks" / f"sky_{k + 1:04d}.npy", sky)

    def passes(folder):
        chunks = list(gbuffer_chunks(open_gbuffers(folder), 2))
        return {name: None if getattr(chunks[0], name) is None else np.concatenate([getattr(g, name).numpy() for g in chunks])
                for name in ("shadow", "sky")}

    assert bc.with_light_passes(src, []) == src / "gbuffers"
    both = bc.with_light_passes(src, ["shadow", "sky"])
    assert both == src / "gbuffers-shadow-sky"
    got = passes(both)
    np.testing.assert_array_equal(got["shadow"], np.stack(suns).astype(np.uint8) * 255)
    np.testing.assert_array_equal(got["sky"], np.rint(np.stack(skies) * 255))
    only = passes(bc.with_light_passes(src, ["sky"]))
    assert only["shadow"] is None
    np.testing.assert_array_equal(only["sky"], got["sky"])
