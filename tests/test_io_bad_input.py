"""Bad input: one line naming the file and the problem, and nothing left behind by sinks."""
import logging
import re
import shutil

import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from conftest import ROOT
from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.gbuffer import MODALITIES
from alaya_flash.streaming.files.image_files import read_exr, write_exr, write_png
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream

H, W, N = 16, 24, 4


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One good copy of each layout; tests copy what they break."""
    root = tmp_path_factory.mktemp("good")
    src = synthetic_stream(W, H, N, seed=2)
    for fmt in ("mp4", "png", "exr", "npy"):
        sinks.write_stream(src, sinks.open_sink(root / fmt, fmt, window=2))
    return root


@pytest.fixture
def copy(made, tmp_path):
    def _copy(fmt):
        dst = tmp_path / f"{fmt}{len(list(tmp_path.iterdir()))}"
        shutil.copytree(made / fmt, dst)
        return dst

    return _copy


def fails(path, match, **kw):
    with pytest.raises(AlayaError, match=match) as info:
        for _ in open_gbuffers(path, **kw).teacher_frames():
            pass
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_missing_modality(copy):
    for fmt, victim in (("mp4", "roughness.mp4"), ("png", "roughness")):
        d = copy(fmt)
        p = d / victim
        shutil.rmtree(p) if p.is_dir() else p.unlink()
        msg = fails(d, "missing modality roughness")
        assert str(d) in msg


def test_modalities_disagree_in_size(copy):
    d = copy("png")
    for f in (d / "depth").iterdir():
        write_png(f, np.zeros((H, W + 2), np.uint8))
    fails(d, r"modalities disagree in size: .*000000.png is 26x16")
    d = copy("mp4")
    with sinks.TeacherMp4Sink(d / "small", fps=16) as s:
        for _ in range(N):
            s.write(gbuffer=np.zeros((5, 8, 8, 3), np.uint8))
    (d / "small" / "normal.mp4").replace(d / "normal.mp4")
    fails(d, r"modalities disagree in size: .*normal.mp4 is 8x8")


def test_modalities_disagree_in_frame_count(copy):
    d = copy("png")
    sorted((d / "metallic").iterdir())[-1].unlink()
    fails(d, "modalities disagree in frame count: .*metallic has 3")
    d = copy("mp4")
    with sinks.TeacherMp4Sink(d / "short", fps=16) as s:
        for _ in range(N - 1):
            s.write(gbuffer=np.zeros((5, H, W, 3), np.uint8))
    (d / "short" / "depth.mp4").replace(d / "depth.mp4")
    fails(d, r"modalities disagree in frame count: .*depth.mp4 has 3")


def test_corrupt_and_truncated_png(copy):
    d = copy("png")
    f = d / "normal" / "000002.png"
    truncate(f)
    msg = fails(d, "corrupt or truncated PNG")
    assert str(f) in msg
    f.write_bytes(b"not a png at all, just some text bytes")
    fails(d, r"000002.png: not a PNG file")


def test_corrupt_and_truncated_exr(copy):
    d = copy("exr")
    truncate(d / "000001.exr")
    fails(d, r"000001.exr: corrupt or truncated EXR")
    (d / "000000.exr").write_bytes(b"garbage" * 20)
    fails(d, r"000000.exr: corrupt or truncated EXR")


def test_truncated_mp4(copy):
    d = copy("mp4")
    truncate(d / "metallic.mp4")
    fails(d, r"metallic.mp4: not a readable MP4")


def test_truncated_and_wrong_npy(copy):
    d = copy("npy")
    truncate(d / "window-0001.npy")
    fails(d, r"window-0001.npy: truncated .npy")
    d = copy("npy")
    np.save(d / "window-0001.npy", np.zeros((2, 5, H, W, 3), np.float32))
    fails(d, r"window-0001.npy: window is float32 \(2, 5, 16, 24, 3\), expected uint8 \(T, 5, H, W, 3\)")
    np.save(d / "window-0001.npy", np.zeros((2, 4, H, W, 3), np.uint8))
    fails(d, r"window is uint8 \(2, 4, 16, 24, 3\)")
    np.save(d / "window-0001.npy", np.zeros((2, 5, H, W + 2, 3), np.uint8))
    fails(d, r"window-0001.npy: window is 26x16, window-0000.npy is 24x16")
    (d / "window-0001.npy").write_bytes(b"\x93NUMPY garbage")
    fails(d, r"window-0001.npy: not a readable .npy")


def test_wrong_channel_count(copy):
    d = copy("png")
    write_png(d / "albedo" / "000001.png", np.zeros((H, W, 3), np.uint8))  # fine
    from PIL import Image

    Image.fromarray(np.zeros((H, W, 4), np.uint8)).save(d / "albedo" / "000001.png")
    fails(d, r"albedo.000001.png: PNG has 4 channels \(with alpha\)")
    d = copy("png")
    write_png(d / "normal" / "000003.png", np.zeros((H, W), np.uint8))
    fails(d, r"normal.000003.png: normal has 1 channel, expected 3")


def test_wrong_exr_channels(copy, tmp_path):
    d = copy("exr")
    write_exr(d / "000002.exr", {"Q": np.zeros((H, W), np.float32)})
    # the first frame sets the layers; a later frame without them is named
    fails(d, r"000002.exr: albedo EXR needs channels albedo.R/albedo.G/albedo.B \(has none\)")


def _poke_exr(path, layer, value, pixels):
    chans = read_exr(path)
    for y, x in pixels:
        chans[layer][y, x] = value
    write_exr(path, chans)


def test_nan_in_exr_depth_errors_with_count_and_first_pixel(copy):
    d = copy("exr")
    _poke_exr(d / "000001.exr", "depth.Z", np.nan, [(5, 7), (3, 9), (5, 8)])
    msg = fails(d, r"000001.exr: depth has 3 NaN/-Inf pixels, first at \(x=9, y=3\)")
    assert "nan_policy='fix'" in msg


def test_nan_fix_policy_replaces_with_background(copy, caplog):
    d = copy("exr")
    _poke_exr(d / "000001.exr", "depth.Z", -np.inf, [(2, 2)])
    _poke_exr(d / "000001.exr", "normal.X", np.inf, [(4, 4)])
    with caplog.at_level(logging.WARNING):
        frames = list(open_gbuffers(d, nan_policy="fix"))
    assert np.isposinf(frames[1].depth[2, 2])
    assert (frames[1].normal[4, 4] == [0, 0, 1]).all()
    assert "depth has 1 NaN/-Inf pixel, first at (x=2, y=2)" in caplog.text
    assert "normal has 1 NaN/Inf pixel" in caplog.text
    # +inf depth is the documented background marker, not an error
    assert np.isinf(frames[0].depth).any()


def test_empty_stream(copy, tmp_path):
    d = tmp_path / "empty"
    for m in MODALITIES:
        (d / m).mkdir(parents=True)
    fails(d, "empty stream")
    fails(copy("npy"), r"empty stream \(no frames in range start=4", start=4)
    e = tmp_path / "nothing"
    e.mkdir()
    (e / "notes.txt").write_text("hi")
    fails(e, "unknown layout: found no")


def test_unknown_layout(tmp_path):
    f = tmp_path / "clip.mp4"
    f.write_bytes(b"")
    fails(f, "unknown layout: a G-buffer stream is a folder")
    d = tmp_path / "imgs"
    d.mkdir()
    write_png(d / "0001.png", np.zeros((4, 4, 3), np.uint8))
    fails(d, "unknown layout: images carry no modality")
    fails(tmp_path / "does-not-exist", "no such file or folder")
    with pytest.raises(AlayaError, match="unknown layout 'avi'"):
        open_gbuffers(d, layout="avi")


def test_bad_options():
    src = synthetic_stream(W, H, N)
    with pytest.raises(AlayaError, match="nan_policy 'ignore' is not one of error, fix"):
        open_gbuffers(".", nan_policy="ignore")
    with pytest.raises(AlayaError, match="resize mode 'fit' is not one of stretch, crop"):
        type(src)(src.source, resize="fit")


# ---------------------------------------------------------------------------------------------
# Sinks.


def test_sink_never_overwrites_without_flag(tmp_path):
    dst = tmp_path / "out.mp4"
    dst.write_bytes(b"precious")
    with pytest.raises(AlayaError, match=r"out.mp4: already exists; pass overwrite=True \(--overwrite\)"):
        sinks.Mp4Sink(dst)
    assert dst.read_bytes() == b"precious"
    with sinks.Mp4Sink(dst, overwrite=True) as s:
        s.write(np.zeros((8, 8, 3), np.uint8))
    assert dst.read_bytes() != b"precious" and not list(tmp_path.glob(".out.mp4.*"))


def test_sink_exception_leaves_nothing(tmp_path):
    for make in (lambda p: sinks.Mp4Sink(p / "a.mp4"), lambda p: sinks.PngSequenceSink(p / "seq"),
                 lambda p: sinks.ExrSequenceSink(p / "exr"), lambda p: sinks.NpyWindowSink(p / "w", window=2),
                 lambda p: sinks.TeacherMp4Sink(p / "clip")):
        root = tmp_path / "deep" / "er"
        with pytest.raises(RuntimeError):
            with make(root) as s:
                for _ in range(3):
                    s.write(rgb=np.zeros((8, 8, 3), np.uint8), gbuffer=np.zeros((5, 8, 8, 3), np.uint8)) \
                        if not isinstance(s, sinks.Mp4Sink) else s.write(np.zeros((8, 8, 3), np.uint8))
                raise RuntimeError("boom")
        assert not (tmp_path / "deep").exists(), make  # temp output and the parents it made are gone


def test_existing_output_survives_failed_overwrite(tmp_path):
    dst = tmp_path / "seq"
    dst.mkdir()
    (dst / sinks.OUTPUT_MARK).write_text("an earlier output")
    (dst / "keep.txt").write_text("old")
    with pytest.raises(AlayaError, match="size 10x8 differs from the first frame's 8x8"):
        with sinks.PngSequenceSink(dst, overwrite=True) as s:
            s.write(np.zeros((8, 8, 3), np.uint8))
            s.write(np.zeros((8, 10, 3), np.uint8))
    assert (dst / "keep.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["seq"]


def test_overwrite_replaces_only_what_alaya_flash_wrote(tmp_path):
    """--overwrite replaces an earlier output, never a user's folder (`--out ~/Desktop`), a folder with a
    file or a file with a folder; the refusal names the path and nothing there changes."""
    frame = np.zeros((8, 8, 3), np.uint8)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    with pytest.raises(AlayaError, match=r"mine: is a folder alaya-flash did not write \(it has no .alaya-flash-output\)"):
        sinks.PngSequenceSink(mine, overwrite=True)
    with pytest.raises(AlayaError, match="mine: is a folder, not a file"):
        sinks.Mp4Sink(mine, overwrite=True)
    (tmp_path / "notes.mp4").write_text("precious")
    with pytest.raises(AlayaError, match="notes.mp4: is a file; a frame sequence is written as a folder"):
        sinks.PngSequenceSink(tmp_path / "notes.mp4", overwrite=True)
    with pytest.raises(AlayaError, match="names no file or folder to write"):
        sinks.PngSequenceSink(tmp_path / "..", overwrite=True)
    assert (mine / "notes.txt").read_text() == "precious" and (tmp_path / "notes.mp4").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "notes.mp4"]
    # an earlier output (marked) and an empty folder are replaced
    for name in ("earlier", "empty"):
        with sinks.PngSequenceSink(tmp_path / name) as s:
            s.write(frame)
        if name == "empty":
            shutil.rmtree(tmp_path / name)
            (tmp_path / name).mkdir()
        with sinks.PngSequenceSink(tmp_path / name, overwrite=True) as s:
            s.write(frame)
            s.write(frame)
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == [sinks.OUTPUT_MARK, "000000.png", "000001.png"]


def test_mp4_needs_even_size_and_rgb(tmp_path):
    with pytest.raises(AlayaError, match="needs even width and height, got 9x8"):
        with sinks.Mp4Sink(tmp_path / "odd.mp4") as s:
            s.write(np.zeros((8, 9, 3), np.uint8))
    with pytest.raises(AlayaError, match=r"RGB frame has shape \(8, 8\), expected \(H, W, 3\)"):
        with sinks.Mp4Sink(tmp_path / "gray.mp4") as s:
            s.write(np.zeros((8, 8), np.uint8))
    with pytest.raises(AlayaError, match="Mp4Sink does not write gbuffer frames"):
        with sinks.Mp4Sink(tmp_path / "g.mp4") as s:
            s.write(gbuffer=np.zeros((5, 8, 8, 3), np.uint8))
    assert not list(tmp_path.iterdir())


def test_temporary_names_never_touch_a_users_files(tmp_path):
    """A user's own `out.mp4.tmp/` folder survives a write to out.mp4: the temporary name is hidden and
    carries this process id and a random token, and abort removes only what the sink created."""
    mine = tmp_path / "out.mp4.tmp"
    mine.mkdir()
    (mine / "keep.txt").write_text("precious")
    with sinks.Mp4Sink(tmp_path / "out.mp4", fps=16) as sink:
        sink.write(rgb=np.zeros((16, 16, 3), np.uint8))
    assert (mine / "keep.txt").read_text() == "precious" and (tmp_path / "out.mp4").is_file()
    aborted = sinks.Mp4Sink(tmp_path / "other.mp4", fps=16)
    aborted.write(rgb=np.zeros((16, 16, 3), np.uint8))
    aborted.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4", "out.mp4.tmp"]


def test_leftovers_of_a_killed_run_are_swept_and_a_live_runs_are_not(tmp_path):
    """kill -9 leaves a temporary file; the next write to the same destination removes it when the
    process that made it is gone, and leaves another running process's temporary file alone."""
    import os

    dead = _finished_pid()
    left = tmp_path / f".out.mp4.{dead}-0badf00d.{sinks.TEMP_MARK}.tmp"
    left.write_bytes(b"half a video")
    running = tmp_path / f".out.mp4.{os.getpid()}-0badf00d.{sinks.TEMP_MARK}.tmp"
    running.write_bytes(b"someone is writing this")
    with sinks.Mp4Sink(tmp_path / "out.mp4", fps=16) as sink:
        sink.write(rgb=np.zeros((16, 16, 3), np.uint8))
    assert not left.exists() and running.exists()


def _finished_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_output_under_a_regular_file_is_one_line(tmp_path, capsys):
    from alaya_flash.streaming.cli import main

    (tmp_path / "afile").write_text("x")
    assert main(["demo", "--out", str(tmp_path / "afile" / "demo.mp4"), "--frames", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"alaya-flash: error: {tmp_path / 'afile' / 'demo.mp4'}: cannot write here: {tmp_path / 'afile'} is a file, not a folder"]


@pytest.mark.parametrize("args, message", [
    (["render", "samples/courtyard", "--prompt", "a \udcff street", "--out", "o.mp4"],
     "node 3 (Encode Prompt): prompt: character 3 ('\\udcff') is not valid Unicode text; write the prompt in UTF-8"),
    (["render", "samples/courtyard", "--prompt", "x", "--out", "o.mp4", "--fps", "nan"],
     "argument --fps: 'nan' is not a finite number"),
    (["render", "samples/courtyard", "--prompt", "x", "--out", "o.mp4", "--fps", "0"],
     "argument --fps: 0.0 is out of range [1.0, 240.0]"),
    (["world", "--out", "w", "--size", "100000"], "argument --size: size '100000': each side must be 1..4096 pixels"),
    (["world", "--out", "w", "--frames", "-3"], "argument --frames: -3 is out of range [0, 10000000]"),
])
def test_bad_text_and_numbers_are_one_clear_line(args, message, tmp_path, monkeypatch, capsys):
    from alaya_flash.streaming.cli import main

    monkeypatch.chdir(ROOT)
    args = [str(tmp_path / a) if a in ("o.mp4", "w") else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2  # workflow: file, then node
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, message", [
    ('{"1": {"class_type": "AlayaFlash_Decode", "inputs": {}}, "1": {"class_type": "AlayaFlash_Save", "inputs": {}}}',
     "node id(s) '1' appear more than once"),
    ("[" * 200_000 + "]" * 200_000, "JSON nested too deeply to be a workflow"),
    ('{"nodes": [{"id": 1, "type": "AlayaFlash_Decode"}, {"id": 1, "type": "AlayaFlash_Decode"}], "links": []}',
     "node id 1 appears 2 times in 'nodes'"),
    ('{"nodes": [{"id": 1, "type": "AlayaFlash_LoadGBuffers", "widgets_values": 5}], "links": []}',
     "node 1 (AlayaFlash_LoadGBuffers): widgets_values must be a list or an object, got int"),
])
def test_malformed_workflows_are_named_not_tracebacks(text, message, tmp_path, capsys):
    from alaya_flash.streaming.cli import main

    path = tmp_path / "wf.json"
    path.write_text(text)
    assert main(["run", str(path), "--validate-only"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_special_files_and_contradictions_are_refused_by_name(copy, tmp_path):
    """A FIFO among the inputs would block the reader forever; passes at different frame rates or a
    negative float depth would render wrong without a word: each is one line naming the file."""
    import os

    fifo = tmp_path / "fifo-clip"
    fifo.mkdir()
    os.mkfifo(fifo / "albedo.mp4")
    with pytest.raises(AlayaError, match=r"albedo.mp4: not a regular file \(a FIFO, socket or device\)"):
        open_gbuffers(fifo)

    clip = tmp_path / "rates"
    with sinks.TeacherMp4Sink(clip, fps=16) as sink:
        for f in synthetic_stream(W, H, N):
            sink.write(gbuffer=f)
    with sinks.Mp4Sink(tmp_path / "depth24.mp4", fps=24) as other:
        for _ in range(N):
            other.write(rgb=np.zeros((H, W, 3), np.uint8))
    os.replace(tmp_path / "depth24.mp4", clip / "depth.mp4")
    with pytest.raises(AlayaError, match=r"modalities disagree in frame rate \(.*depth.mp4 at 24 fps"):
        open_gbuffers(clip)

    exr = tmp_path / "exr"
    with sinks.ExrSequenceSink(exr) as sink:
        for f in synthetic_stream(W, H, 1):
            f.depth[2, 3] = -1.5
            sink.write(gbuffer=f)
    with pytest.raises(AlayaError, match=r"depth has 1 negative pixel\(s\), first at \(x=3, y=2\), value -1.5"):
        next(iter(open_gbuffers(exr)))


@pytest.mark.slow
def test_serve_on_a_port_in_use_is_one_line(capsys):
    import socket

    from alaya_flash.streaming.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--quiet", "serve", "--random-model", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "address already in use" in err[0] and str(port) in err[0]


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.update(trained_sizee=[256, 256]), "unknown key(s) 'trained_sizee'"),
    (lambda c: c["networks"]["dit"]["config"].update(dim=8e8),
     "networks.dit.config.dim must be a whole number in [1, 1048576], got 800000000.0"),
    (lambda c: c["networks"]["dit"]["config"].update(num_layers=10**9),
     "networks.dit.config.num_layers is 1000000000, must be a whole number in [1, 1024]"),
    (lambda c: c["networks"]["dit"]["config"].update(rope_theta=float("nan")), "networks.dit.config.rope_theta must be a finite number"),
    # each of these was a ZeroDivisionError, a render that never ended, or a silent render
    (lambda c: c["networks"]["dit"]["config"].update(num_heads=0), "networks.dit.config.num_heads is 0, must be a whole number in [1, 4096]"),
    (lambda c: c["networks"]["dit"]["config"].update(patch_size=[1, 0, 2]), "networks.dit.config.patch_size item 1: is 0"),
    (lambda c: c["session"].update(chunk_frames=0), "session.chunk_frames is 0, must be a whole number in [1, 21]"),
    (lambda c: c["session"].update(steps=1e9), "session.steps must be a whole number in [1, 50], got 1000000000.0"),
    (lambda c: c["session"].update(shift=float("nan")), "session.shift must be a finite number in [0.1, 20.0], got nan"),
    (lambda c: c["session"].update(window_frames=2, chunk_frames=3), "session.window_frames (2) must be at least session.chunk_frames (3)"),
    (lambda c: c["session"].update(rope="sideways"), "session.rope is 'sideways', not one of 'absolute', 'relative'"),
    (lambda c: c.update(session="fast"), "'session' must be an object, got 'fast'"),
    (lambda c: c.update(trained_size=[-256, 1e300]), "trained_size height is -256, must be a whole number in [8, 4096], a multiple of 8"),
    (lambda c: c.update(trained_size=[256, 1e300]), "trained_size width must be a whole number in [8, 4096], a multiple of 8, got 1e+300"),
    (lambda c: c.update(trained_size="256"), "trained_size must be [height, width] or null, got '256'"),
    # loaded unchecked (a string's truth read as a flag), and a list's rule said "a list of 3 a whole number"
    (lambda c: c.update(random_weights="no"), "random_weights must be true or false, got 'no'"),
    (lambda c: c.update(notes=5), "notes must be a string, got 5"),
    (lambda c: c["networks"]["dit"].update(config_name=7), "networks.dit.config_name must be a string or null, got 7"),
    (lambda c: c["networks"]["dit"]["config"].update(patch_size=[1, 2]),
     "networks.dit.config.patch_size must be a list of 3 whole numbers in [1, 64], got [1, 2]"),
])
def test_model_config_contradictions_are_refused_before_anything_is_built(edit, message, tmp_path):
    """A model folder's config.json is checked key by key and number by number before any network is
    allocated: a typo'd key or a width of 8e8 is one line, not an overflow or a memory error."""
    import json

    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.errors import CheckpointError

    folder = tmp_path / "m"
    bundle.save_flash(bundle.make_random_flash(), folder)
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        bundle.load_flash_folder(folder)


@pytest.mark.parametrize("text, message", [
    ("[" * 5000 + "]" * 5000, "malformed JSON (nested too deeply to read"),  # was a RecursionError
    ("{not json", "malformed JSON (Expecting property name"),  # was "teacher DiT ... needs a VAE"
])
def test_render_with_a_model_config_that_is_not_json_names_it(tmp_path, capsys, text, message):
    from alaya_flash.model_zoo import bundle
    from alaya_flash.streaming.cli import main

    folder = tmp_path / "m"
    bundle.save_flash(bundle.make_random_flash(), folder)
    (folder / "config.json").write_text(text)
    code = main(["--quiet", "render", "samples/courtyard", "--prompt", "x", "--out", str(tmp_path / "o.mp4"),
                 "--frames", "2", "--size", "32", "--model", str(folder)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{folder / 'config.json'}: {message}" in err
    with pytest.raises(AlayaError, match=re.escape(f"{folder / 'config.json'}: malformed JSON")):
        bundle.load_flash_folder(folder)


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_render_to_an_existing_folder_as_mp4_is_refused(tmp_path, capsys, overwrite):
    """--out EXISTING_DIR (mp4) wrote EXISTING_DIR.mp4 beside it and exited 0."""
    from alaya_flash.streaming.cli import main

    folder = tmp_path / "shots"
    folder.mkdir()
    code = main(["--quiet", "render", "samples/courtyard", "--prompt", "x", "--out", str(folder), "--frames", "2",
                 "--size", "32", *overwrite])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{folder}: is a folder, and an mp4 is a file" in err
    assert not (tmp_path / "shots.mp4").exists() and folder.is_dir()


@pytest.mark.parametrize("session, message", [
    ({"window_frames": 80}, "session.window_frames is 80, must be a whole number in [1, 1001], of the form 4k+1"),
    ({"cfg": 0.0}, "session.cfg is 0.0, must be a finite number in [1.0, 30.0]"),
    ({"negative_prompt": 3}, "session.negative_prompt must be a string, got 3"),
])
def test_a_teacher_config_is_checked_against_the_same_table(session, message, tmp_path):
    import json

    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.errors import CheckpointError

    folder = tmp_path / "t"
    bundle.save_teacher(bundle.make_random_teacher(), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["session"].update(session)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=re.escape(f"{folder / 'config.json'}: {message}")):
        bundle.load_teacher(folder)


@pytest.mark.slow
def test_render_names_the_file_it_wrote_and_a_closed_pipe_is_quiet(tmp_path, monkeypatch, capsys):
    """--out without an extension writes NAME.mp4, and the success line names NAME.mp4 (in this process);
    a reader that leaves early (`| head -1`) ends the command quietly (a real process, its stdout a pipe)."""
    import subprocess
    import sys

    from alaya_flash.streaming.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["render", "samples/courtyard", "--prompt", "x", "--out", str(tmp_path / "shot"), "--frames", "5",
                 "--size", "32"]) == 0
    err = capsys.readouterr().err
    assert f"to {tmp_path / 'shot.mp4'} (" in err and (tmp_path / "shot.mp4").is_file(), err
    cli = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
           "from alaya_flash.streaming.cli import main; sys.exit(main())"]
    info = subprocess.Popen(cli + ["gbuffers", "info", "samples/courtyard"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    info.stdout.close()  # the reader is gone before the command prints (it reads the clip first)
    assert info.wait(60) == 0
    assert "Traceback" not in info.stderr.read()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["mp4", "png"])
def test_a_file_size_limit_mid_render_is_one_line_and_leaves_nothing(fmt, tmp_path):
    """The disk refusing mid-write (here a 3 KB file-size limit, as a full disk would) is one line naming
    the output, exit 2, and nothing is left behind. At 64x64 a PNG frame is about 7 KB and the 5 frames'
    MP4 about 6 KB: both go past the limit."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000, 3_000))

    from process_helpers import store_prompts

    cli = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
           "from alaya_flash.streaming.cli import main; sys.exit(main())"]
    store_prompts("x")
    out = tmp_path / "big"
    done = subprocess.run(cli + ["render", "samples/courtyard", "--prompt", "x", "--out", str(out), "--format", fmt,
                                 "--size", "64", "--frames", "5"],
                          cwd=ROOT, preexec_fn=limit, capture_output=True, text=True)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert "File too large" in err[0] and f"{out}" in err[0] and "alaya-tmp" not in err[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("node, name, value, message", [
    ("3", "text", "a \ud800 street", "node 3 (Encode Prompt): prompt: character 3 ('\\ud800') is not valid Unicode text"),
    ("8", "fps", float("nan"), "node 8 (Save): input 'fps' must be a finite number, got nan"),
    ("8", "fps", 0.0, "node 8 (Save): input 'fps' is 0.0, out of range [1.0, 240.0]"),
])
def test_bad_widget_values_in_a_workflow_file_are_named(node, name, value, message, tmp_path, capsys):
    """A workflow saved with a lone surrogate in a prompt or a NaN / zero frame rate is refused by node
    and input before anything runs."""
    import json

    from alaya_flash.streaming.cli import main

    api = json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
    api[node]["inputs"][name] = value
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(api))  # json writes the lone surrogate as "\\ud800" and NaN as NaN
    assert main(["run", str(path), "--validate-only"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
