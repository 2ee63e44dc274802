"""The light passes (shadow, sky) written where G-buffers are written: the sinks (PNG 8/16-bit, EXR, the
teacher's MP4 layout) write them in the layout the readers read back, `gbuffers convert` (write_stream)
carries them, a render's FrameWriter keeps them with its G-buffers, `alaya-flash world --shadows` exports
the world's sun visibility as the shadow pass and world v2 clips their sky visibility as the sky pass.
Read back, a stream renders exactly as GBuffers(..., shadow=..., sky=...) directly."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.gbuffer import LIGHT_PASSES
from alaya_flash.streaming.values import GBuffers, gbuffer_chunks
from stream_helpers import moving_shadow

H, W, N = 24, 32, 5
SETS = [("shadow",), ("sky",), LIGHT_PASSES]  # the light passes a stream carries
FORMATS = [("png", 8), ("png", 16), ("exr", 8), ("mp4", 8)]


@pytest.fixture(scope="module")
def teacher():
    return np.stack(list(synthetic_stream(W, H, N, seed=4).teacher_frames()))


@pytest.fixture(scope="module")
def planes():
    """Per light pass a band that moves, a soft edge and a gradient (every level appears somewhere); the sky's
    band runs the other way, so passes that swapped places would show."""
    return {"shadow": moving_shadow(N, H, W, start=3, step=4, width=9, edge=100, gradient=8),
            "sky": moving_shadow(N, H, W, start=20, step=-3, width=7, edge=60, gradient=7)}


def _read(path, **kw) -> GBuffers:
    """A folder read back as the renderer gets it (gbuffer_chunks, chunks of 1 then 2), joined."""
    chunks = list(gbuffer_chunks(open_gbuffers(path, **kw), 2))
    assert [len(c) for c in chunks] == [1, 2, 2]
    return GBuffers.concat(chunks)


def _write(sink, teacher, light: dict):
    with sink:
        for i, images in enumerate(teacher):
            sink.write(gbuffer=images, **{name: plane[i] for name, plane in light.items()})
    return sink.path


def _light(got: GBuffers) -> dict:
    return {name: plane.numpy() for name, plane in got.light_passes().items()}


def _assert_light(got: GBuffers, want: dict, msg=""):
    assert set(got.light_passes()) == set(want), msg
    for name, plane in want.items():
        np.testing.assert_array_equal(getattr(got, name).numpy(), plane, err_msg=f"{name} {msg}")


@pytest.mark.parametrize("names", SETS, ids="+".join)
@pytest.mark.parametrize("to, png_bits", FORMATS)
def test_written_with_light_passes_read_back_identical(tmp_path, teacher, planes, to, png_bits, names):
    """Each G-buffer folder sink writes the passes in its layout ({name}/ PNGs, the EXRs' {name} layer,
    {name}.mp4) and the readers give them back exactly (the passes too, as without them); converting that
    folder to every other format carries them along."""
    light = {n: planes[n] for n in names}
    path = _write(sinks.open_sink(tmp_path / "clip", to, png_bits=png_bits), teacher, light)
    for name in names:
        expect = {"png": path / name / "000000.png", "exr": path / "000000.exr", "mp4": path / f"{name}.mp4"}[to]
        assert expect.exists()
    got = _read(path)
    _assert_light(got, light)
    plain = _read(_write(sinks.open_sink(tmp_path / "plain", to, png_bits=png_bits), teacher, {}))
    assert not plain.light_passes() and torch.equal(plain.images, got.images)
    if png_bits == 8 and to != "exr":  # 8-bit layouts hold the teacher form exactly (EXR, 16-bit PNG: canonical)
        np.testing.assert_array_equal(got.images.numpy(), teacher)
    for other, bits in FORMATS:
        dst = tmp_path / f"to-{other}{bits}"
        assert sinks.write_stream(open_gbuffers(path), sinks.open_sink(dst, other, png_bits=bits)) == N
        _assert_light(_read(dst), light, f"{to} -> {other}")


def test_a_stream_read_back_shades_as_the_gbuffers_given_directly(tmp_path, teacher, planes):
    """The shading prior (Shade) on the folder read back = on GBuffers(..., shadow=..., sky=...) built in memory."""
    from alaya_flash.model_zoo.light import Light
    from alaya_flash.streaming.render.lighting import LightSchedule, Shade

    path = _write(sinks.open_sink(tmp_path / "clip", "png"), teacher, planes)
    light = LightSchedule.constant(Light(sun_azimuth=40.0, sun_elevation=35.0))
    got = Shade(light).step(_read(path))
    want = Shade(light).step(GBuffers(teacher, **planes))
    assert torch.equal(got, want)
    for name in LIGHT_PASSES:  # each pass changes the picture
        assert not torch.allclose(got, Shade(light).step(GBuffers(teacher, **{name: planes[name]})), atol=1e-2)


@pytest.mark.parametrize("name, key", [("shadow", "sun_visibility"), ("sky", "sky_visibility")])
def test_a_worlds_float_visibility_in_a_frames_extras_is_written(tmp_path, teacher, name, key):
    """A GBufferFrame whose extras hold a world's float visibility writes it as the pass: EXR keeps the float
    (read back rounded to 8 bits), PNG 8-bit rounds it."""
    from alaya_flash.streaming.gbuffer import teacher_to_frame

    vis = np.random.default_rng(0).random((N, H, W), np.float32)
    want = np.rint(vis * 255).astype(np.uint8)
    for to in ("exr", "png"):
        sink = sinks.open_sink(tmp_path / to, to)
        with sink:
            for images, v in zip(teacher, vis):
                frame = teacher_to_frame(images)
                frame.extras[key] = v
                sink.write(gbuffer=frame)
        _assert_light(_read(sink.path), {name: want}, to)


def test_frame_writer_keeps_the_light_passes_with_their_gbuffers(tmp_path, teacher, planes):
    frames = torch.rand(N, H, W, 3)
    writer = sinks.FrameWriter(tmp_path / "out", "png")
    g = GBuffers(teacher, **planes)
    first, second = g.pieces(3)
    writer.step(gbuffers=first)  # the decoder lags: frames arrive after their G-buffers
    writer.step(images=frames[:2], gbuffers=second)
    writer.step(images=frames[2:])
    _assert_light(_read(writer.flush()), planes)


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_a_bad_pass_is_one_line_and_leaves_nothing(tmp_path, teacher, planes, name):
    s = planes[name]
    meaning = {"shadow": "the sun's visibility", "sky": "the share of the sky seen"}[name]
    cases = [
        (list(s[:2]) + [None] * 3, f"frame 2: has no {name} pass but earlier frames have one; a stream carries "
                                   "it with every frame or never"),
        ([None] + list(s[1:]), f"frame 1: has a {name} pass but earlier frames have none"),
        ([s[0], s[1][:, :-2]], rf"frame 1: {name} pass is 30x24, G-buffer is 32x24"),
        ([s[0].astype(np.int32)], rf"frame 0: {name} pass has int32 \(24, 32\), expected uint8 \(H, W\) or float"),
        ([np.full((H, W), np.nan, np.float32)], f"frame 0: {name} pass has NaN/Inf pixels; it is {meaning}, 0 to 1"),
    ]
    for k, (given, message) in enumerate(cases):
        for to in ("png", "exr", "mp4"):
            dst = tmp_path / f"bad{k}-{to}"
            with pytest.raises(AlayaError, match=message):
                with sinks.open_sink(dst, to) as sink:
                    for images, plane in zip(teacher, given):
                        sink.write(gbuffer=images, **({} if plane is None else {name: plane}))
            assert not dst.exists() and not list(tmp_path.glob(f".bad{k}-{to}*"))
    with pytest.raises(AlayaError, match=f"a {name} pass goes with G-buffer frames; this frame has none"):
        with sinks.PngSequenceSink(tmp_path / "rgb-only") as sink:
            sink.write(rgb=teacher[0, 0], **{name: s[0]})


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
    assert all(not g.light_passes() for g in gbuffer_chunks(open_gbuffers(tmp_path / "plain"), 2))


def test_a_world_clip_folder_keeps_the_sky_pass(tmp_path, teacher, planes):
    """A world's frames with "sky_visibility" extras (world v2 traces it) make a clip folder (world/clip.py
    write_frames) with sky.mp4 (lossless), the EXRs' sky layer and extras/sky_visibility-NNNN.npy: read
    back, its chunks carry the visibility in 8 bits."""
    from alaya_flash.streaming.gbuffer import teacher_to_frame
    from alaya_flash.streaming.world.camera import Camera
    from alaya_flash.streaming.world.clip import write_frames

    vis = np.random.default_rng(1).random((N, H, W), np.float32)
    camera = Camera.look_at((0.0, -4.0, 1.5), (0.0, 0.0, 0.5), width=W, height=H)

    def frames():
        for i, images in enumerate(teacher):
            frame = teacher_to_frame(images, index=i)
            frame.extras.update(sky_visibility=vis[i], object_id=np.zeros((H, W), np.int32))
            yield frame, camera

    out = write_frames(tmp_path / "clip", frames(), (), 16.0, lambda cams, cam: {}, window=4, exr=True)
    want = np.rint(vis * 255).astype(np.uint8)
    _assert_light(_read(out), {"sky": want})
    _assert_light(_read(out / "exr"), {"sky": want})
    assert (out / "sky.mp4").is_file() and not (out / "shadow.mp4").exists()
    kept = np.concatenate([np.load(out / "extras" / f"sky_visibility-{k:04d}.npy") for k in range(2)])
    assert kept.dtype == np.float16 and np.array_equal(kept, vis.astype(np.float16))


def test_a_sky_pass_reaches_the_prior_through_render(tmp_path):
    """`alaya-flash render` of a folder whose sky pass is 0 everywhere (no sky seen: the prior's ambient light
    gone) with a light-reading refiner = FlashPipeline on GBuffers(..., sky=0) directly, and differs from the
    same folder rendered without its sky pass."""
    from PIL import Image

    from alaya_flash.model_zoo import bundle, folders
    from alaya_flash.model_zoo.precision import choose_dtype
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.render.lighting import user_lights
    from alaya_flash.streaming.values import PromptSchedule
    from stream_helpers import random_refiner, render_all

    prompt, light = "a sunny street, the sun on the left", "az=60,el=35"
    model = bundle.make_random_flash(seed=0)
    model.refiner = random_refiner("gbuffer-refiner-16-sky")
    folder = bundle.save_flash(model, tmp_path / "model")
    teacher = np.stack(list(synthetic_stream(32, 32, 9, seed=4).teacher_frames()))  # the model's sizes: 32x32
    dark = np.zeros(teacher.shape[:1] + teacher.shape[2:4], np.uint8)
    clips = {"sky": _write(sinks.open_sink(tmp_path / "sky", "png"), teacher, {"sky": dark}),
             "plain": _write(sinks.open_sink(tmp_path / "plain", "png"), teacher, {})}
    got = {}
    for kind, clip in clips.items():
        out = tmp_path / f"out-{kind}"
        assert main(["--quiet", "render", str(clip), "--model", str(folder), "--prompt", prompt, "--light", light,
                     "--format", "png", "--out", str(out)]) == 0
        got[kind] = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in sorted(out.glob("*.png"))])
    loaded = folders.load_flash(folder, "cpu", choose_dtype("auto", torch.device("cpu")))
    prompts = PromptSchedule.encode(loaded.text_encoder(), prompt)
    pipe = pl.FlashPipeline(loaded, prompts, seed=0, lights=user_lights(light))
    want = sinks.to_uint8(render_all(pipe, [GBuffers(teacher, sky=dark)]))
    assert got["sky"].shape == (9, 32, 32, 3) and np.array_equal(got["sky"], want)
    assert np.abs(got["sky"].astype(int) - got["plain"]).max() > 8
