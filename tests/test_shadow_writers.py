"""The shadow pass written where G-buffers are written: the sinks (PNG 8/16-bit, EXR, the teacher's MP4
layout) write it in the layout the readers read back, `gbuffers convert` (write_stream) carries it, a
render's FrameWriter keeps it with its G-buffers, and `alaya-flash world --shadows` exports the world's sun
visibility as the pass. Read back, a stream renders exactly as GBuffers(..., shadow=...) directly."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.values import GBuffers, gbuffer_chunks
from stream_helpers import moving_shadow

H, W, N = 24, 32, 5


@pytest.fixture(scope="module")
def teacher():
    return np.stack(list(synthetic_stream(W, H, N, seed=4).teacher_frames()))


@pytest.fixture(scope="module")
def shadows():
    """A band of shadow that moves, a soft edge and a gradient: every level appears somewhere."""
    return moving_shadow(N, H, W, start=3, step=4, width=9, edge=100, gradient=8)


def _read(path, **kw) -> GBuffers:
    """A folder read back as the renderer gets it (gbuffer_chunks, chunks of 1 then 2), joined."""
    chunks = list(gbuffer_chunks(open_gbuffers(path, **kw), 2))
    assert [len(c) for c in chunks] == [1, 2, 2]
    return GBuffers.concat(chunks)


def _write(sink, teacher, shadows):
    with sink:
        for images, s in zip(teacher, shadows):
            sink.write(gbuffer=images, shadow=s)
    return sink.path


@pytest.mark.parametrize("to, png_bits", [("png", 8), ("png", 16), ("exr", 8), ("mp4", 8)])
def test_written_with_a_shadow_pass_read_back_identical(tmp_path, teacher, shadows, to, png_bits):
    """Each G-buffer folder sink writes the pass in its layout (shadow/ PNGs, the EXRs' shadow layer,
    shadow.mp4) and the readers give it back exactly (the passes too, as without it); converting that
    folder to every other format carries it along."""
    path = _write(sinks.open_sink(tmp_path / "clip", to, png_bits=png_bits), teacher, shadows)
    expect = {"png": path / "shadow" / "000000.png", "exr": path / "000000.exr", "mp4": path / "shadow.mp4"}[to]
    assert expect.exists()
    got = _read(path)
    np.testing.assert_array_equal(got.shadow.numpy(), shadows)
    plain = _read(_write(sinks.open_sink(tmp_path / "plain", to, png_bits=png_bits), teacher, [None] * N))
    assert plain.shadow is None and torch.equal(plain.images, got.images)
    if png_bits == 8 and to != "exr":  # 8-bit layouts hold the teacher form exactly (EXR, 16-bit PNG: canonical)
        np.testing.assert_array_equal(got.images.numpy(), teacher)
    for other, bits in (("png", 8), ("png", 16), ("exr", 8), ("mp4", 8)):
        dst = tmp_path / f"to-{other}{bits}"
        assert sinks.write_stream(open_gbuffers(path), sinks.open_sink(dst, other, png_bits=bits)) == N
        back = _read(dst)
        np.testing.assert_array_equal(back.shadow.numpy(), shadows, err_msg=f"{to} -> {other}")


def test_a_stream_read_back_shades_as_the_gbuffers_given_directly(tmp_path, teacher, shadows):
    """The shading prior (Shade) on the folder read back = on GBuffers(..., shadow=...) built in memory."""
    from alaya_flash.model_zoo.light import Light
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade

    path = _write(sinks.open_sink(tmp_path / "clip", "png"), teacher, shadows)
    light = LightSchedule.constant(Light(sun_azimuth=40.0, sun_elevation=35.0))
    got = Shade(light).step(_read(path))
    want = Shade(light).step(GBuffers(teacher, shadow=shadows))
    assert torch.equal(got, want)
    assert not torch.allclose(got, Shade(light).step(GBuffers(teacher)), atol=1e-2)


def test_float_sun_visibility_in_a_frames_extras_is_written(tmp_path, teacher):
    """A GBufferFrame whose extras hold a world's float "sun_visibility" writes it as the pass: EXR keeps the
    float (read back rounded to 8 bits), PNG 8-bit rounds it."""
    from alaya_flash.streaming.gbuffer import teacher_to_frame

    vis = np.random.default_rng(0).random((N, H, W), np.float32)
    want = np.rint(vis * 255).astype(np.uint8)
    for to in ("exr", "png"):
        sink = sinks.open_sink(tmp_path / to, to)
        with sink:
            for images, v in zip(teacher, vis):
                frame = teacher_to_frame(images)
                frame.extras["sun_visibility"] = v
                sink.write(gbuffer=frame)
        np.testing.assert_array_equal(_read(sink.path).shadow.numpy(), want, err_msg=to)


def test_frame_writer_keeps_the_shadow_pass_with_its_gbuffers(tmp_path, teacher, shadows):
    frames = torch.rand(N, H, W, 3)
    writer = sinks.FrameWriter(tmp_path / "out", "png")
    g = GBuffers(teacher, shadow=shadows)
    first, second = g.pieces(3)
    writer.step(gbuffers=first)  # the decoder lags: frames arrive after their G-buffers
    writer.step(images=frames[:2], gbuffers=second)
    writer.step(images=frames[2:])
    path = writer.flush()
    np.testing.assert_array_equal(_read(path).shadow.numpy(), shadows)


def test_a_bad_shadow_pass_is_one_line_and_leaves_nothing(tmp_path, teacher, shadows):
    cases = [
        (list(shadows[:2]) + [None] * 3, "frame 2: has no shadow pass but earlier frames have one; a stream carries "
                                         "it with every frame or never"),
        ([None] + list(shadows[1:]), "frame 1: has a shadow pass but earlier frames have none"),
        ([shadows[0], shadows[1][:, :-2]], r"frame 1: shadow pass is 30x24, G-buffer is 32x24"),
        ([shadows[0].astype(np.int32)], r"frame 0: shadow pass has int32 \(24, 32\), expected uint8 \(H, W\) or float"),
        ([np.full((H, W), np.nan, np.float32)], "frame 0: shadow pass has NaN/Inf pixels"),
    ]
    for k, (given, message) in enumerate(cases):
        for to in ("png", "exr", "mp4"):
            dst = tmp_path / f"bad{k}-{to}"
            with pytest.raises(AlayaError, match=message):
                _write(sinks.open_sink(dst, to), teacher[:len(given)], given)
            assert not dst.exists() and not list(tmp_path.glob(f".bad{k}-{to}*"))
    with pytest.raises(AlayaError, match="a shadow pass goes with G-buffer frames; this frame has none"):
        with sinks.PngSequenceSink(tmp_path / "rgb-only") as sink:
            sink.write(rgb=teacher[0, 0], shadow=shadows[0])


def test_world_shadows_export_the_shadow_pass(tmp_path):
    """`alaya-flash world --shadows` writes shadow.mp4 (and the EXRs' shadow layer): read back, the clip's
    chunks carry exactly the world source's own (its first preset's sun visibility)."""
    from alaya_flash.streaming.world import WorldConfig, world_stream

    out = tmp_path / "clip"
    assert main(["--quiet", "world", "--frames", "5", "--size", "48x32", "--objects", "6", "--seed", "2",
                 "--presets", "bright_sunny,sunset_dramatic", "--shadows", "--exr", "--out", str(out)]) == 0
    source = GBuffers.concat(list(gbuffer_chunks(world_stream(WorldConfig(
        seed=2, width=48, height=32, num_frames=5, num_objects=6, presets=("bright_sunny", "sunset_dramatic"),
        shadows=True)), 2)))
    assert source.shadow is not None and 0 < (source.shadow < 128).float().mean() < 1  # some shadow, some sun
    clip = GBuffers.concat(list(gbuffer_chunks(open_gbuffers(out), 2)))
    assert torch.equal(clip.images, source.images) and torch.equal(clip.shadow, source.shadow)
    exr = GBuffers.concat(list(gbuffer_chunks(open_gbuffers(out / "exr"), 2)))
    assert torch.equal(exr.shadow, source.shadow)
    assert main(["--quiet", "world", "--frames", "2", "--size", "32", "--out", str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "shadow.mp4").exists()
    assert all(g.shadow is None for g in gbuffer_chunks(open_gbuffers(tmp_path / "plain"), 2))
