"""Resizing to a model size: the teacher's LANCZOS stretch and the aspect-preserving centre crop."""
import numpy as np
import pytest
from PIL import Image

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files.resize import crop_box, resize_frame, resize_teacher
from alaya_flash.streaming.files.synthetic import SyntheticScene, synthetic_stream


def teacher_images(h=36, w=64, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (5, h, w, 3), dtype=np.uint8)


def test_stretch_is_the_teachers_lanczos():
    imgs = teacher_images()
    out = resize_teacher(imgs, (30, 52), "stretch")
    for img, got in zip(imgs, out):
        want = np.asarray(Image.fromarray(img).resize((52, 30), Image.LANCZOS))  # PIL takes (w, h)
        np.testing.assert_array_equal(got, want)


def test_crop_keeps_aspect_by_centre_crop():
    assert crop_box((36, 64), (32, 32), "crop") == (14, 0, 50, 36)
    assert crop_box((64, 36), (32, 32), "crop") == (0, 14, 36, 50)
    assert crop_box((480, 854), (448, 832), "crop") == (0, 10, 854, 470)  # 854x480 -> 832x448 keeps 854x460
    imgs = teacher_images()
    imgs[:, :, :14] = 255  # bright bars outside the centred square
    imgs[:, :, 50:] = 255
    imgs[:, :, 14:50] = 0
    out = resize_teacher(imgs, (18, 18), "crop")
    assert out.max() == 0  # nothing of the bars leaks in
    stretched = resize_teacher(imgs, (18, 18), "stretch")
    assert stretched.max() == 255
    with pytest.raises(AlayaError, match="resize mode 'fit'"):
        crop_box((4, 4), (2, 2), "fit")


def test_canonical_resize_keeps_passes_meaningful():
    f = SyntheticScene(64, 40, seed=4).frame(3)
    for mode in ("stretch", "crop"):
        g = resize_frame(f, (24, 30), mode).validate()
        assert g.size == (24, 30)
        np.testing.assert_allclose(np.linalg.norm(g.normal, axis=-1), 1.0, atol=1e-5)
        # depth is resampled NEAREST: every value is a real source depth (no ringing, +inf kept)
        assert np.isin(g.depth, f.depth).all() and np.isinf(g.depth).any()
        for name in ("albedo", "metallic", "roughness"):
            arr = getattr(g, name)
            assert arr.min() >= 0 and arr.max() <= 1


def test_stream_resizes_8bit_sources_in_teacher_form(tmp_path):
    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.files.readers import open_gbuffers

    sinks.write_stream(synthetic_stream(48, 32, 2), sinks.open_sink(tmp_path / "n", "npy"))
    native = list(open_gbuffers(tmp_path / "n").teacher_frames())
    resized = list(open_gbuffers(tmp_path / "n", size=(16, 20), resize="crop").teacher_frames())
    for a, b in zip(native, resized):
        np.testing.assert_array_equal(b, resize_teacher(a, (16, 20), "crop"))
