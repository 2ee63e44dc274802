"""The engine's shadow pass: read beside the five G-buffer passes in every layout, carried by GBuffers
through chunking, and taken by the shading prior (Shade) and a light-reading refiner (Refine) as their
shadows instead of the screen-space ones."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.image_files import read_exr, write_exr, write_png
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.values import GBuffers, gbuffer_chunks
from stream_helpers import moving_shadow

H, W, N = 24, 32, 5


@pytest.fixture(scope="module")
def source():
    return synthetic_stream(W, H, N, seed=3)


@pytest.fixture(scope="module")
def shadows():
    """A shadow per frame: a band that moves, soft at one edge."""
    return moving_shadow(N, H, W, start=4, step=3, width=10, edge=128)


def _chunked_shadow(path, chunk: int = 2, **kw):
    stream = open_gbuffers(path, **kw)
    got = list(gbuffer_chunks(stream, chunk))
    assert [len(g) for g in got] == [1] + [min(chunk, N - 1 - k) for k in range(0, N - 1, chunk)]
    return torch.cat([g.shadow for g in got]).numpy()


def test_a_png_shadow_folder_beside_the_passes_is_read_exactly(tmp_path, source, shadows):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "clip", "png"))
    (tmp_path / "clip" / "shadow").mkdir()
    for i, s in enumerate(shadows):  # an engine's grey PNG, written as RGB
        write_png(tmp_path / "clip" / "shadow" / f"{i:06d}.png", np.repeat(s[..., None], 3, -1))
    np.testing.assert_array_equal(_chunked_shadow(tmp_path / "clip"), shadows)
    # resized with the passes: the band stays where it was, at half the size
    half = _chunked_shadow(tmp_path / "clip", size=(H // 2, W // 2))
    assert half.shape == (N, H // 2, W // 2)
    assert (half[0, :, 3:6] < 30).all() and (half[0, :, 9:] > 225).all()
    # without the folder there is no shadow pass
    sinks.write_stream(source, sinks.open_sink(tmp_path / "plain", "png"))
    assert all(g.shadow is None for g in gbuffer_chunks(open_gbuffers(tmp_path / "plain"), 2))


def test_16_bit_and_exr_shadow_passes(tmp_path, source, shadows):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "exr", "exr"))
    for i, s in enumerate(shadows):  # one float channel a frame, values past 1 clamped
        write_exr(tmp_path / "exr" / f"shadow_{i:06d}.exr", {"Y": s.astype(np.float32) / 255 * 1.5 - 0.25})
    want = np.rint(np.clip(shadows.astype(np.float32) / 255 * 1.5 - 0.25, 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(_chunked_shadow(tmp_path / "exr"), want)
    # 16-bit grey PNGs: scaled to 8 bits
    sinks.write_stream(source, sinks.open_sink(tmp_path / "png16", "png"))
    (tmp_path / "png16" / "shadow").mkdir()
    for i, s in enumerate(shadows):
        write_png(tmp_path / "png16" / "shadow" / f"{i:06d}.png", s.astype(np.uint16) * 257)
    np.testing.assert_array_equal(_chunked_shadow(tmp_path / "png16"), shadows)
    # a multi-layer EXR frame with a `shadow` layer
    layered = tmp_path / "layered"
    sinks.write_stream(source, sinks.open_sink(layered, "exr"))
    for i, f in enumerate(sorted(layered.glob("*.exr"))):
        write_exr(f, {**read_exr(f), "shadow.Y": shadows[i].astype(np.float32) / 255})
    np.testing.assert_array_equal(_chunked_shadow(layered), shadows)


def test_an_mp4_shadow_pass_beside_the_teacher_layout(tmp_path, source, shadows):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "mp4", "mp4"))
    with sinks.Mp4Sink(tmp_path / "mp4" / "shadow.mp4", fps=16) as sink:
        for s in shadows:
            sink.write(np.repeat(s[..., None], 3, -1))
    stream = open_gbuffers(tmp_path / "mp4")
    got = _chunked_shadow(tmp_path / "mp4")
    # H.264 (yuv420p) is lossy: the lit and shadowed halves come back within a few levels away from edges
    assert np.abs(got[:, :, 20:].astype(int) - shadows[:, :, 20:]).max() <= 12 and (got[0, :, 6:11] < 20).all()
    assert stream.info.num_frames == N


def test_gbuffers_check_carry_and_cut_their_shadow_pass(source, shadows):
    images = np.stack(list(source.teacher_frames()))
    g = GBuffers(images, shadow=shadows)
    parts = g.pieces(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert torch.equal(GBuffers.concat(parts).shadow, g.shadow)
    assert torch.equal(g.sun_visibility(), torch.from_numpy(shadows).float() / 255)
    with pytest.raises(AlayaError, match=r"shadow pass must be uint8 \(T, H, W\)"):
        GBuffers(images, shadow=shadows[:, :, :-1])
    with pytest.raises(AlayaError, match="shadow pass must be uint8"):
        GBuffers(images, shadow=shadows.astype(np.float32))
    with pytest.raises(AlayaError, match="some chunks carry a shadow pass and some do not"):
        GBuffers.concat([parts[0], GBuffers(parts[1].images)])


def test_shade_and_refine_take_their_shadows_from_the_pass(source, shadows):
    """Shade's frames equal the prior's given the pass as its sun visibility, and differ from its own
    screen-space ones; a light-reading refiner streamed in chunks equals one call given the pass."""
    from alaya_flash.model_zoo.codecs import refiner as refiner_codec
    from alaya_flash.model_zoo.light import Light, pack
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade
    from alaya_flash.streaming.render.pipelines import Refine

    images = torch.from_numpy(np.stack(list(source.teacher_frames())))
    light = Light(sun_azimuth=30.0, sun_elevation=40.0)
    g = GBuffers(images, shadow=shadows)
    shaded = Shade(LightSchedule.constant(light)).step(g)
    want = ShadingPrior()(images, pack(light)[0], g.depth_near, sun_visibility=g.sun_visibility())
    torch.testing.assert_close(shaded, want[:, :3].movedim(1, -1))
    assert not torch.allclose(shaded, Shade(LightSchedule.constant(light)).step(GBuffers(images)), atol=1e-2)

    torch.manual_seed(0)
    net = refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-blend"]).eval()
    with torch.no_grad():
        net.tail[-1].bias[3:].fill_(0.5)  # the blend share at 0.5: the prior's shadows show in the frame
    frames = torch.rand(N, H, W, 3)
    text = torch.randn(1, 1, net.text_dim)  # one prompt's context (B, L, D)
    from alaya_flash.streaming.values import PromptSchedule

    stage = Refine(net, PromptSchedule.constant(text), LightSchedule.constant(light))
    outs = [stage.step(frames[a:a + 2], piece) for a, piece in zip(range(0, N, 2), g.pieces(2))]
    stage.flush()
    lights = pack(light).expand(N, -1)
    from alaya_flash.streaming.render.pipelines import sentence_embedding

    emb = sentence_embedding(text).expand(N, -1)
    direct = net.refine(frames, images, emb, lights, g.depth_near, sun_visibility=g.sun_visibility())
    torch.testing.assert_close(torch.cat(outs), direct)
    assert not torch.allclose(direct, net.refine(frames, images, emb, lights, g.depth_near), atol=1e-2)
    with pytest.raises(AlayaError, match="some chunks carry a shadow pass and some do not"):
        stage = Refine(net, PromptSchedule.constant(text), LightSchedule.constant(light))
        stage.add_gbuffers(g.pieces(2)[0])
        stage.add_gbuffers(GBuffers(images[2:4]))


def test_a_bad_shadow_pass_is_one_line_naming_it(tmp_path, source, shadows):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "short", "png"))
    (tmp_path / "short" / "shadow").mkdir()
    for i, s in enumerate(shadows[:-1]):
        write_png(tmp_path / "short" / "shadow" / f"{i:06d}.png", s)
    with pytest.raises(AlayaError, match="disagree in frame count: .*shadow has 4"):
        open_gbuffers(tmp_path / "short")
    sinks.write_stream(source, sinks.open_sink(tmp_path / "nan", "exr"))
    for i, s in enumerate(shadows):
        v = s.astype(np.float32) / 255
        v[2, 3] = np.nan
        write_exr(tmp_path / "nan" / f"shadow_{i:06d}.exr", {"Y": v})
    with pytest.raises(AlayaError, match=r"shadow_000000\.exr: the shadow pass has NaN/Inf pixels"):
        list(gbuffer_chunks(open_gbuffers(tmp_path / "nan"), 2))
    for f in sorted((tmp_path / "nan").glob("shadow_*.exr"))[1:]:
        f.unlink()
    with pytest.raises(AlayaError, match="1 shadow files for 5 multi-layer EXR frames"):
        open_gbuffers(tmp_path / "nan")
