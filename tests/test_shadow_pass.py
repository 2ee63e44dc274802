"""The engine's light passes (the shadow pass, the sky pass): read beside the five G-buffer passes in every
layout, carried by GBuffers through chunking, and taken by the shading prior (Shade) and a light-reading
refiner (Refine) as their shadows and ambient occlusion instead of the screen-space ones."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.image_files import read_exr, write_exr, write_png
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.gbuffer import LIGHT_PASSES, MODALITIES
from alaya_flash.streaming.values import GBuffers, gbuffer_chunks
from stream_helpers import moving_shadow

H, W, N = 24, 32, 5
VISIBILITY = {"shadow": "sun_visibility", "sky": "sky_visibility"}  # GBuffers' float view of each pass
PRIOR_KEYS = {"shadow": "sun_visibility", "sky": "sky_visibility"}  # the shading prior's keyword for each


@pytest.fixture(scope="module")
def source():
    return synthetic_stream(W, H, N, seed=3)


@pytest.fixture(scope="module")
def planes():
    """A pass per frame and light pass: a band that moves, soft at one edge (the sky's another band than the shadow's)."""
    return {"shadow": moving_shadow(N, H, W, start=4, step=3, width=10, edge=128),
            "sky": moving_shadow(N, H, W, start=6, step=2, width=10, edge=128)}


def _chunked(path, name, chunk: int = 2, **kw):
    stream = open_gbuffers(path, **kw)
    got = list(gbuffer_chunks(stream, chunk))
    assert [len(g) for g in got] == [1] + [min(chunk, N - 1 - k) for k in range(0, N - 1, chunk)]
    other = [n for n in LIGHT_PASSES if n != name]
    assert all(getattr(g, n) is None for g in got for n in other)  # only the pass that is there
    return torch.cat([getattr(g, name) for g in got]).numpy()


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_png_folder_beside_the_passes_is_read_exactly(tmp_path, source, planes, name):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "clip", "png"))
    (tmp_path / "clip" / name).mkdir()
    for i, s in enumerate(planes[name]):  # an engine's grey PNG, written as RGB
        write_png(tmp_path / "clip" / name / f"{i:06d}.png", np.repeat(s[..., None], 3, -1))
    np.testing.assert_array_equal(_chunked(tmp_path / "clip", name), planes[name])
    # resized with the passes: the band stays where it was, at half the size
    half = _chunked(tmp_path / "clip", name, size=(H // 2, W // 2))
    a = {"shadow": 2, "sky": 3}[name]  # the first frame's band, halved
    assert half.shape == (N, H // 2, W // 2)
    assert (half[0, :, a + 1:a + 4] < 30).all() and (half[0, :, a + 7:] > 225).all()
    # without the folder there is no light pass
    sinks.write_stream(source, sinks.open_sink(tmp_path / "plain", "png"))
    assert all(not g.light_passes() for g in gbuffer_chunks(open_gbuffers(tmp_path / "plain"), 2))


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_16_bit_and_exr_passes(tmp_path, source, planes, name):
    s8 = planes[name]
    sinks.write_stream(source, sinks.open_sink(tmp_path / "exr", "exr"))
    for i, s in enumerate(s8):  # one float channel a frame, values past 1 clamped
        write_exr(tmp_path / "exr" / f"{name}_{i:06d}.exr", {"Y": s.astype(np.float32) / 255 * 1.5 - 0.25})
    want = np.rint(np.clip(s8.astype(np.float32) / 255 * 1.5 - 0.25, 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(_chunked(tmp_path / "exr", name), want)
    # 16-bit grey PNGs: scaled to 8 bits
    sinks.write_stream(source, sinks.open_sink(tmp_path / "png16", "png"))
    (tmp_path / "png16" / name).mkdir()
    for i, s in enumerate(s8):
        write_png(tmp_path / "png16" / name / f"{i:06d}.png", s.astype(np.uint16) * 257)
    np.testing.assert_array_equal(_chunked(tmp_path / "png16", name), s8)
    # a multi-layer EXR frame with a `shadow` / `sky` layer
    layered = tmp_path / "layered"
    sinks.write_stream(source, sinks.open_sink(layered, "exr"))
    for i, f in enumerate(sorted(layered.glob("*.exr"))):
        write_exr(f, {**read_exr(f), f"{name}.Y": s8[i].astype(np.float32) / 255})
    np.testing.assert_array_equal(_chunked(layered, name), s8)


def test_the_blender_side_files_of_both_passes(tmp_path, source, planes):
    """The Blender add-on's form: `0001.exr` frames with `shadow_0001.exr` and `sky_0001.exr` beside them."""
    folder = tmp_path / "blender"
    sinks.write_stream(source, sinks.open_sink(folder, "exr"))
    for i, f in enumerate(sorted(folder.glob("*.exr"))):
        f.rename(folder / f"{i + 1:04d}.exr")
        for name in LIGHT_PASSES:
            write_exr(folder / f"{name}_{i + 1:04d}.exr", {"V": planes[name][i].astype(np.float32) / 255})
    got = GBuffers.concat(list(gbuffer_chunks(open_gbuffers(folder), 2)))
    for name in LIGHT_PASSES:
        np.testing.assert_array_equal(getattr(got, name).numpy(), planes[name], err_msg=name)


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_an_mp4_pass_beside_the_teacher_layout(tmp_path, source, planes, name):
    sinks.write_stream(source, sinks.open_sink(tmp_path / "mp4", "mp4"))
    with sinks.Mp4Sink(tmp_path / "mp4" / f"{name}.mp4", fps=16) as sink:
        for s in planes[name]:
            sink.write(np.repeat(s[..., None], 3, -1))
    stream = open_gbuffers(tmp_path / "mp4")
    got = _chunked(tmp_path / "mp4", name)
    # H.264 (yuv420p) is lossy: the open and blocked halves come back within a few levels away from edges
    a = {"shadow": 4, "sky": 6}[name]
    assert np.abs(got[:, :, 22:].astype(int) - planes[name][:, :, 22:]).max() <= 12 and (got[0, :, a + 2:a + 7] < 20).all()
    assert stream.info.num_frames == N
    # the teacher's other naming, {clip}_{mod}.mp4, read by FOLDER/CLIP: the pass as {clip}_{name}.mp4
    clip = tmp_path / "clips"
    clip.mkdir()
    for mod in MODALITIES + (name,):
        (tmp_path / "mp4" / f"{mod}.mp4").rename(clip / f"clip_0007_{mod}.mp4")
    np.testing.assert_array_equal(_chunked(clip / "clip_0007", name), got)


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_gbuffers_check_carry_and_cut_their_light_passes(source, planes, name):
    images = np.stack(list(source.teacher_frames()))
    g = GBuffers(images, **{name: planes[name]})
    parts = g.pieces(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert torch.equal(getattr(GBuffers.concat(parts), name), getattr(g, name))
    assert torch.equal(getattr(g, VISIBILITY[name])(), torch.from_numpy(planes[name]).float() / 255)
    with pytest.raises(AlayaError, match=rf"{name} pass must be uint8 \(T, H, W\)"):
        GBuffers(images, **{name: planes[name][:, :, :-1]})
    with pytest.raises(AlayaError, match=f"{name} pass must be uint8"):
        GBuffers(images, **{name: planes[name].astype(np.float32)})
    with pytest.raises(AlayaError, match=f"some chunks carry a {name} pass and some do not"):
        GBuffers.concat([parts[0], GBuffers(parts[1].images)])


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_shade_and_refine_take_their_light_from_the_pass(source, planes, name):
    """Shade's frames equal the prior's given the pass (its sun or sky visibility), and differ from its own
    screen-space ones; a light-reading refiner streamed in chunks equals one call given the pass; a refiner whose
    prior was trained without a sky pass leaves one out."""
    from alaya_flash.model_zoo.codecs import refiner as refiner_codec
    from alaya_flash.model_zoo.light import Light, pack
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade
    from alaya_flash.streaming.render.pipelines import Refine

    images = torch.from_numpy(np.stack(list(source.teacher_frames())))
    light = Light(sun_azimuth=30.0, sun_elevation=40.0)
    g = GBuffers(images, **{name: planes[name]})
    given = {PRIOR_KEYS[name]: getattr(g, VISIBILITY[name])()}
    shaded = Shade(LightSchedule.constant(light)).step(g)
    want = ShadingPrior()(images, pack(light)[0], g.depth_near, **given)
    torch.testing.assert_close(shaded, want[:, :3].movedim(1, -1))
    assert not torch.allclose(shaded, Shade(LightSchedule.constant(light)).step(GBuffers(images)), atol=1e-2)

    torch.manual_seed(0)
    net = refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-sky"]).eval()
    with torch.no_grad():
        net.tail[-1].bias[3:].fill_(0.5)  # the blend share at 0.5: the prior's light shows in the frame
    frames = torch.rand(N, H, W, 3)
    text = torch.randn(1, 1, net.text_dim)  # one prompt's context (B, L, D)
    from alaya_flash.streaming.values import PromptSchedule

    stage = Refine(net, PromptSchedule.constant(text), LightSchedule.constant(light))
    outs = [stage.step(frames[a:a + 2], piece) for a, piece in zip(range(0, N, 2), g.pieces(2))]
    stage.flush()
    lights = pack(light).expand(N, -1)
    from alaya_flash.streaming.render.pipelines import sentence_embedding

    emb = sentence_embedding(text).expand(N, -1)
    direct = net.refine(frames, images, emb, lights, g.depth_near, **given)
    torch.testing.assert_close(torch.cat(outs), direct)
    assert not torch.allclose(direct, net.refine(frames, images, emb, lights, g.depth_near), atol=1e-2)
    if name == "sky":
        plain = refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-mirror"]).eval()
        assert torch.equal(plain.refine(frames, images, emb, lights, g.depth_near, **given),
                           plain.refine(frames, images, emb, lights, g.depth_near))
    with pytest.raises(AlayaError, match=f"some chunks carry a {name} pass and some do not"):
        stage = Refine(net, PromptSchedule.constant(text), LightSchedule.constant(light))
        stage.add_gbuffers(g.pieces(2)[0])
        stage.add_gbuffers(GBuffers(images[2:4]))


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_bad_pass_is_one_line_naming_it(tmp_path, source, planes, name):
    s8 = planes[name]
    sinks.write_stream(source, sinks.open_sink(tmp_path / "short", "png"))
    (tmp_path / "short" / name).mkdir()
    for i, s in enumerate(s8[:-1]):
        write_png(tmp_path / "short" / name / f"{i:06d}.png", s)
    with pytest.raises(AlayaError, match=f"disagree in frame count: .*{name} has 4"):
        open_gbuffers(tmp_path / "short")
    write_png(tmp_path / "short" / name / "000004.png", s8[-1][:, :-2])  # one of another size
    with pytest.raises(AlayaError, match=rf"{name}/000004\.png: image is 30x24, expected 32x24"):
        list(gbuffer_chunks(open_gbuffers(tmp_path / "short"), 2))
    sinks.write_stream(source, sinks.open_sink(tmp_path / "nan", "exr"))
    for i, s in enumerate(s8):
        v = s.astype(np.float32) / 255
        v[2, 3] = np.nan
        write_exr(tmp_path / "nan" / f"{name}_{i:06d}.exr", {"Y": v})
    with pytest.raises(AlayaError, match=rf"{name}_000000\.exr: the {name} pass has NaN/Inf pixels"):
        list(gbuffer_chunks(open_gbuffers(tmp_path / "nan"), 2))
    for f in sorted((tmp_path / "nan").glob(f"{name}_*.exr"))[1:]:
        f.unlink()
    with pytest.raises(AlayaError, match=f"1 {name} files for 5 multi-layer EXR frames"):
        open_gbuffers(tmp_path / "nan")
    # a layer in some frames only: the first frame without one decides
    layered = tmp_path / "layered"
    sinks.write_stream(source, sinks.open_sink(layered, "exr"))
    third = sorted(layered.glob("*.exr"))[2]
    write_exr(third, {**read_exr(third), f"{name}.Y": s8[2].astype(np.float32) / 255})
    with pytest.raises(AlayaError, match=rf"^{third}: has a {name} layer but 000000\.exr has none; a stream carries "
                                         f"the {name} pass with every frame or never$"):
        list(gbuffer_chunks(open_gbuffers(layered), 2))
    # an MP4 pass that ends early or is of another size
    sinks.write_stream(source, sinks.open_sink(tmp_path / "mp4", "mp4"))
    with sinks.Mp4Sink(tmp_path / "mp4" / f"{name}.mp4", fps=16) as sink:
        for s in s8[:-1]:
            sink.write(np.repeat(s[..., None], 3, -1))
    with pytest.raises(AlayaError, match=f"disagree in frame count: .*{name}.mp4 has 4"):
        open_gbuffers(tmp_path / "mp4")
    with sinks.Mp4Sink(tmp_path / "mp4" / f"{name}.mp4", fps=16, overwrite=True) as sink:
        for s in s8:
            sink.write(np.repeat(s[:, :-2, None], 3, -1))
    with pytest.raises(AlayaError, match=f"disagree in size: .*{name}.mp4 is 30x24"):
        open_gbuffers(tmp_path / "mp4")
