"""Readers <-> writers: every writer's output reads back within its format's precision."""
import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.gbuffer import LIGHT_PASSES, MODALITIES, teacher_to_frame
from alaya_flash.streaming.files.readers import GBufferStream, detect_layout, open_gbuffers
from alaya_flash.streaming.files.synthetic import SyntheticScene, synthetic_stream

H, W, N = 24, 32, 6


@pytest.fixture(scope="module")
def source():
    return synthetic_stream(W, H, N, seed=1)


@pytest.fixture(scope="module")
def teacher(source):
    return np.stack(list(source.teacher_frames()))


def write(stream, path, fmt, **kw):
    n = sinks.write_stream(stream, sinks.open_sink(path, fmt, **kw))
    assert n == stream.info.num_frames
    return path


@pytest.mark.parametrize("fmt,layout", [("mp4", "teacher-mp4"), ("png", "image-sequence"), ("npy", "npy-windows")])
def test_8bit_formats_are_bit_exact(tmp_path, source, teacher, fmt, layout):
    out = write(source, tmp_path / fmt, fmt, window=4)
    assert detect_layout(out) == layout
    stream = open_gbuffers(out)
    assert stream.info.layout == layout and stream.info.num_frames == N and stream.info.size == (H, W)
    back = np.concatenate(list(stream.teacher_chunks(4)))
    np.testing.assert_array_equal(back, teacher)


@pytest.mark.parametrize("src_fmt", ["mp4", "png", "npy"])
@pytest.mark.parametrize("dst_fmt", ["mp4", "png", "npy", "exr"])
def test_every_8bit_reader_to_every_writer(tmp_path, source, teacher, src_fmt, dst_fmt):
    src = open_gbuffers(write(source, tmp_path / "src", src_fmt, window=5))
    back = open_gbuffers(write(src, tmp_path / "dst", dst_fmt, window=5))
    got = np.stack(list(back.teacher_frames()))
    if dst_fmt != "exr":
        np.testing.assert_array_equal(got, teacher)
        return
    # EXR stores the decoded canonical floats; re-encoding gives the same bytes except normals,
    # which canonical form renormalises to unit length (a change of at most one 8-bit step).
    normal = MODALITIES.index("normal")
    np.testing.assert_array_equal(np.delete(got, normal, 1), np.delete(teacher, normal, 1))
    assert np.abs(got[:, normal].astype(int) - teacher[:, normal]).max() <= 1


def test_exr_keeps_canonical_floats_exactly(tmp_path, source):
    back = open_gbuffers(write(source, tmp_path / "exr", "exr"))
    assert back.source.kind == "canonical"
    for a, b in zip(source, back):
        for m in MODALITIES:
            np.testing.assert_array_equal(getattr(a, m), getattr(b, m), err_msg=m)  # float32 EXR: lossless
        assert np.isinf(b.depth).any()  # background survives as +inf


def test_png16_within_16bit_precision(tmp_path, source):
    back = open_gbuffers(write(source, tmp_path / "p16", "png", png_bits=16))
    assert back.source.kind == "canonical"
    for a, b in zip(source, back):
        assert np.abs(a.metallic - b.metallic).max() <= 0.5 / 65535 + 1e-7
        assert np.abs(a.albedo - b.albedo).max() < 1e-3
        assert np.abs(a.normal - b.normal).max() < 3e-5  # one 16-bit step is 2 / 65535 in [-1, 1]
        fin = np.isfinite(a.depth)
        np.testing.assert_array_equal(fin, np.isfinite(b.depth))
        inv_err = np.abs(0.5 / a.depth[fin] - 0.5 / b.depth[fin])
        assert inv_err.max() <= 0.5 / 65535 + 1e-7


def test_rgb_ground_truth_travels_as_extras(tmp_path, source):
    rng = np.random.default_rng(0)
    rgbs = rng.integers(0, 256, (N, H, W, 3), dtype=np.uint8)
    for fmt in ("mp4", "png", "npy", "exr"):
        with sinks.open_sink(tmp_path / fmt, fmt, window=4) as sink:
            for rgb, images in zip(rgbs, source.teacher_frames()):
                sink.write(rgb=rgb, gbuffer=images)
        got = np.stack([f.extras["rgb"] for f in open_gbuffers(tmp_path / fmt)])
        tol = 1 if fmt == "exr" else 0  # EXR stores linear float; sRGB re-encoding may round by 1
        assert np.abs(got.astype(int) - rgbs).max() <= tol, fmt


@pytest.mark.parametrize("name", LIGHT_PASSES)
def test_light_passes_travel_as_extras(tmp_path, source, name):
    """A light pass written beside the passes comes back as extras[name], uint8 and exact, in every format whose
    layout has one, canonical frames as teacher form (npy windows have none); the other light pass stays absent."""
    planes = np.random.default_rng(1).integers(0, 256, (N, H, W), dtype=np.uint8)
    for fmt in ("mp4", "png", "npy", "exr"):
        with sinks.open_sink(tmp_path / fmt, fmt, window=4) as sink:
            for plane, images in zip(planes, source.teacher_frames()):
                sink.write(gbuffer=images, **{name: plane})
        canonical = [f.extras for f in open_gbuffers(tmp_path / fmt)]
        teacher_form = [e for _, e in open_gbuffers(tmp_path / fmt).teacher_frames(extras=True)]
        for extras in (canonical, teacher_form):
            assert all(set(LIGHT_PASSES) & set(e) == ({name} if fmt != "npy" else set()) for e in extras), fmt
            if fmt != "npy":
                np.testing.assert_array_equal(np.stack([e[name] for e in extras]), planes, err_msg=fmt)


def test_teacher_clip_naming_and_rgb(tmp_path, source, teacher):
    """{clip}_{mod}.mp4 (the teacher's second naming) with {clip}_rgb.mp4 ground truth."""
    write(source, tmp_path / "tmpclip", "mp4")
    clip = tmp_path / "clip_0052"
    clip.mkdir()
    for mod in MODALITIES:
        (tmp_path / "tmpclip" / f"{mod}.mp4").rename(clip / f"clip_0052_{mod}.mp4")
    with sinks.Mp4Sink(clip / "clip_0052_rgb.mp4", fps=16) as rgb_sink:
        for i in range(N):
            rgb_sink.write(np.full((H, W, 3), 40 * i, np.uint8))
    stream = open_gbuffers(clip)
    assert "{clip}_{mod}.mp4" in stream.source.description and "rgb" in stream.source.description
    frames = list(stream.teacher_frames(extras=True))
    np.testing.assert_array_equal(np.stack([f for f, _ in frames]), teacher)
    # yuv420p H.264 is lossy: flat grey frames come back within a few levels
    assert all(abs(int(e["rgb"].mean()) - 40 * i) <= 2 for i, (_, e) in enumerate(frames))


def test_slicing_and_chunks(tmp_path, source, teacher):
    out = write(source, tmp_path / "npy", "npy", window=4)
    s = open_gbuffers(out, start=1, stop=6, stride=2)
    assert s.info.num_frames == 3 and s.info.fps == 8.0
    np.testing.assert_array_equal(np.stack(list(s.teacher_frames())), teacher[1:6:2])
    chunks = list(open_gbuffers(out).teacher_chunks(4))
    assert [c.shape[0] for c in chunks] == [4, 2]
    assert [c.shape[0] for c in open_gbuffers(out).teacher_chunks(4, drop_last=True)] == [4]
    frames = list(s)
    assert [f.index for f in frames] == [0, 1, 2] and frames[2].timestamp == pytest.approx(2 / 8.0)


def test_canonical_iteration_matches_teacher_decoding(tmp_path, source):
    """Iterating an 8-bit source gives teacher_to_frame of its bytes (no extra rounding)."""
    out = write(source, tmp_path / "png", "png")
    for frame, images in zip(open_gbuffers(out), open_gbuffers(out).teacher_frames()):
        ref = teacher_to_frame(images)
        for m in MODALITIES:
            np.testing.assert_array_equal(getattr(frame, m), getattr(ref, m), err_msg=m)


def test_name_pattern_sequences(tmp_path, source, teacher):
    """Flat folders whose file names carry the modality: albedo_0000.png, 0000.depth.png, ..."""
    write(source, tmp_path / "png", "png")
    flat = tmp_path / "flat"
    flat.mkdir()
    for mod in MODALITIES:
        for i, p in enumerate(sorted((tmp_path / "png" / mod).iterdir())):
            name = f"frame{i}.{mod}.png" if mod == "depth" else f"{mod}_{i}.png"
            p.rename(flat / name)
    s = open_gbuffers(flat)
    assert "file names" in s.source.description
    np.testing.assert_array_equal(np.stack(list(s.teacher_frames())), teacher)


def test_per_modality_exr_folders(tmp_path, source):
    """User EXRs: depth as a single Z channel in scene units, normals as float RGB."""
    from alaya_flash.streaming.files.image_files import write_exr

    frames = list(source)
    for mod in MODALITIES:
        (tmp_path / mod).mkdir()
    for i, f in enumerate(frames):
        write_exr(tmp_path / "albedo" / f"{i:04d}.exr", {c: f.albedo[..., k] for k, c in enumerate("RGB")})
        write_exr(tmp_path / "normal" / f"{i:04d}.exr", {c: f.normal[..., k] for k, c in enumerate("RGB")})
        write_exr(tmp_path / "depth" / f"{i:04d}.exr", {"Z": f.depth})
        write_exr(tmp_path / "metallic" / f"{i:04d}.exr", {"Y": f.metallic})
        write_exr(tmp_path / "roughness" / f"{i:04d}.exr", {"R": f.roughness})
    for a, b in zip(frames, open_gbuffers(tmp_path)):
        for m in MODALITIES:
            np.testing.assert_array_equal(getattr(a, m), getattr(b, m), err_msg=m)


def test_from_frames_stream_is_reiterable():
    scene = SyntheticScene(16, 8, seed=3)
    s = GBufferStream.from_frames(scene.info(4), lambda: (scene.frame(i) for i in range(4)))
    a, b = [f.depth for f in s], [f.depth for f in s]
    assert len(a) == 4 and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_synthetic_scene_is_exact_and_seeded():
    a, b = SyntheticScene(40, 30, seed=5).frame(7), SyntheticScene(40, 30, seed=5).frame(7)
    np.testing.assert_array_equal(a.albedo, b.albedo)
    a.validate()
    np.testing.assert_allclose(np.linalg.norm(a.normal, axis=-1), 1.0, atol=1e-5)
    sky = np.isinf(a.depth)
    assert sky.any() and (~sky).any() and (a.depth[~sky] > 0).all()
    assert (a.normal[sky] == [0, 0, 1]).all()
    # the ground plane seen by a camera pitched down: its normal tilts towards the viewer (+z)
    ground = (a.roughness == np.float32(0.8)) & ~sky
    assert (a.normal[ground][:, 1] > 0.9).all() and (a.normal[ground][:, 2] > 0).all()
    assert not np.array_equal(SyntheticScene(40, 30, seed=6).frame(7).albedo, a.albedo)


def test_sink_refuses_mixed_parts_and_cleans_up(tmp_path, teacher):
    dst = tmp_path / "npy"
    sink = sinks.NpyWindowSink(dst)
    sink.write(gbuffer=teacher[0])
    with pytest.raises(AlayaError, match="frame 1: has rgb and gbuffer but earlier frames have gbuffer"):
        sink.write(rgb=np.zeros((H, W, 3), np.uint8), gbuffer=teacher[1])
    assert not dst.exists() and not list(tmp_path.iterdir())


def test_sinks_take_canonical_frames_and_float_rgb(tmp_path, source):
    """What the physics world and the renderers hand over: GBufferFrame objects and float RGB."""
    from alaya_flash.streaming.gbuffer import frame_to_teacher, srgb_to_linear
    from alaya_flash.streaming.files.image_files import read_exr

    frames = list(source)
    rgb = np.random.default_rng(1).uniform(0, 1, (H, W, 3)).astype(np.float32)
    with sinks.TeacherMp4Sink(tmp_path / "clip", fps=16) as clip, sinks.ExrSequenceSink(tmp_path / "exr") as exr:
        for f in frames:
            clip.write(gbuffer=f, rgb=rgb)
            exr.write(gbuffer=f, rgb=rgb)
    back = list(open_gbuffers(tmp_path / "clip").teacher_frames(extras=True))
    for f, (images, extras) in zip(frames, back):
        np.testing.assert_array_equal(images, frame_to_teacher(f))
        np.testing.assert_array_equal(extras["rgb"], np.rint(rgb * 255).astype(np.uint8))
    chans = read_exr(tmp_path / "exr" / "000000.exr")
    np.testing.assert_allclose(chans["G"], srgb_to_linear(rgb)[..., 1], atol=1e-6)
    np.testing.assert_array_equal(chans["depth.Z"], frames[0].depth)


@pytest.mark.parametrize("src_fmt,src_bits", [("exr", 8), ("png", 16)])
@pytest.mark.parametrize("dst_fmt,dst_bits", [("mp4", 8), ("png", 8), ("png", 16), ("npy", 8), ("exr", 8)])
def test_every_float_reader_to_every_writer(tmp_path, source, src_fmt, src_bits, dst_fmt, dst_bits):
    src = open_gbuffers(write(source, tmp_path / "src", src_fmt, png_bits=src_bits))
    back = open_gbuffers(write(src, tmp_path / "dst", dst_fmt, png_bits=dst_bits))
    if back.source.kind == "teacher":  # 8-bit writers store exactly the source's teacher form
        np.testing.assert_array_equal(np.stack(list(back.teacher_frames())), np.stack(list(src.teacher_frames())))
        return
    for a, b in zip(src, back):  # float writers: exact (EXR float32) or within one 16-bit step
        tol = 0 if dst_fmt == "exr" else 3e-5
        for m in ("albedo", "metallic", "normal", "roughness"):
            assert np.abs(getattr(a, m) - getattr(b, m)).max() <= tol, m
        fin = np.isfinite(a.depth)
        np.testing.assert_array_equal(fin, np.isfinite(b.depth))
        assert np.abs(0.5 / a.depth[fin] - 0.5 / b.depth[fin]).max() <= (0 if dst_fmt == "exr" else 1e-5)


_ENCODE = """
import sys; sys.path.insert(0, 'tests'); import conftest
import numpy as np
from pathlib import Path
from alaya_flash.streaming.files.sinks import Mp4Sink
rng = np.random.default_rng(0)
y, x = np.mgrid[0:64, 0:64] / 64
with Mp4Sink(Path(sys.argv[1]), fps=16) as sink:
    for t in range(24):  # a moving pattern with noise: x264's macroblock tree has work to do
        f = np.stack([np.sin(6 * x + t / 3), np.cos(5 * y - t / 4), np.sin(4 * (x + y) + t / 5)], -1) * 0.5 + 0.5
        sink.write(rgb=np.clip(f + 0.05 * rng.standard_normal(f.shape), 0, 1).astype(np.float32))
"""


def test_mp4_bytes_do_not_depend_on_the_memory_the_encoder_gets(tmp_path):
    """The same frames give the same MP4 whatever bytes malloc hands x264 (MALLOC_PERTURB_ fills fresh
    allocations with them): its macroblock-tree rate control read memory it had not written, so in
    `run --inputs` / `batch` every shot after the first (whose encoder reused what an earlier one
    freed) differed from its single-shot render by up to 33/255, and from run to run."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    outs = []
    for perturb in ("1", "77", "200"):
        out = tmp_path / f"p{perturb}.mp4"
        env = dict(os.environ, MALLOC_PERTURB_=perturb)
        proc = subprocess.run([sys.executable, "-c", _ENCODE, str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] == outs[2]
