"""`alaya-flash world`: the clip it writes loads with the package's readers, matches the source
bit for bit, records cameras; bad options give one line and write nothing."""
import argparse
import json

import numpy as np
import pytest

from alaya_flash.streaming.cli import main
from alaya_flash.streaming.gbuffer import MODALITIES, frame_to_teacher
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.world import WorldConfig, WorldSource
from alaya_flash.streaming.world import clip as clip_module


def test_world_command_writes_a_clip_the_readers_load(tmp_path):
    out = tmp_path / "clip"
    assert main(["--quiet", "world", "--frames", "16", "--size", "128", "--out", str(out),
                 "--presets", "bright_sunny,moonlit_night", "--objects", "10"]) == 0
    stream = open_gbuffers(out)
    assert stream.info.layout == "teacher-mp4" and stream.info.num_frames == 16
    assert (stream.info.width, stream.info.height) == (128, 128)
    frames = list(stream)
    assert len(frames) == 16 and all("rgb" in f.extras for f in frames)
    for name in ("albedo", "depth", "normal"):
        a, b = getattr(frames[0], name), getattr(frames[-1], name)
        assert np.abs(np.nan_to_num(a, posinf=0) - np.nan_to_num(b, posinf=0)).mean() > 1e-3, name
    # The lossless teacher MP4s and npy windows hold exactly what the world source yields.
    source = WorldSource(WorldConfig(seed=0, width=128, height=128, num_frames=16, num_objects=10,
                                     presets=("bright_sunny", "moonlit_night")))
    source_frames = list(source)
    want = [(frame_to_teacher(f), f.extras["rgb"]) for f in source_frames]
    got = list(stream.teacher_frames(extras=True))
    for (images, rgb), (images2, ext) in zip(want, got):
        np.testing.assert_array_equal(images, images2)
        np.testing.assert_array_equal(rgb, ext["rgb"])
    windows = open_gbuffers(out / "windows")
    assert windows.info.num_frames == 16
    np.testing.assert_array_equal(next(iter(windows.teacher_chunks(16))), np.stack([w for w, _ in want]))
    meta = json.loads((out / "clip.json").read_text())
    assert meta["seed"] == 0 and meta["frames"] == 16 and len(meta["cameras"]) == 16
    assert [p["name"] for p in meta["presets"]] == ["bright_sunny", "moonlit_night"]
    assert meta["prompt"].startswith("colourful toy objects") and meta["renderer"] in ("gl", "torch")
    k = np.array(meta["intrinsics"]["K"])
    assert k[0, 2] == 64 and k[1, 2] == 64 and k[0, 0] == pytest.approx(64 / np.tan(np.radians(30)))
    w2c = np.array(meta["cameras"][3]["world_to_camera"])
    np.testing.assert_allclose(w2c @ np.array(meta["cameras"][3]["camera_to_world"]), np.eye(4), atol=1e-9)
    assert (out / "presets" / "moonlit_night.mp4").stat().st_size > 0 and (out / "scene.xml").exists()
    ids = np.load(out / "extras" / "object_id-0000.npy")
    np.testing.assert_array_equal(ids, np.stack([f.extras["object_id"] for f in source_frames]))
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("argv, message", [
    (["--presets", "sunny_mars"], "lighting preset 'sunny_mars' is unknown"),
    (["--size", "4"], "width=4 is out of range 8..4096"),
    (["--size", "65x64"], "width and height must be even"),
    (["--presets", "none", "--shadows"], "shadows need at least one lighting preset"),
    (["--frames", "0"], "frames=0 is out of range"),
    (["--fps", "0"], "argument --fps: 0.0 is out of range [1.0, 240.0]"),
    (["--window", "0"], "argument --window: 0 is out of range [1, 4096]"),
])
def test_bad_options_give_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "clip"
    assert main(["world", "--out", str(out), "--frames", "2", "--size", "32"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "clip"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["world", "--out", str(out), "--frames", "1", "--size", "16"]) == 2
    assert "already exists" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


def test_failure_mid_clip_leaves_nothing(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_frame = clip_module.World.frame

    def failing_frame(self, camera=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("renderer died")
        return real_frame(self, camera)

    monkeypatch.setattr(clip_module.World, "frame", failing_frame)
    with pytest.raises(RuntimeError):
        main(["--quiet", "world", "--out", str(tmp_path / "clip"), "--frames", "5", "--size", "16"])
    assert list(tmp_path.iterdir()) == []


def test_size_argument_forms():
    from alaya_flash.streaming.cli.args import parse_size
    from alaya_flash.streaming.cli.commands.world import parse_presets

    assert parse_size("128") == (128, 128) and parse_size("320x192") == (192, 320)
    for bad, message in (("big", "is not N or WIDTHxHEIGHT"), ("0x16", "each side must be 1..4096"), ("1x2x3", "is not N"),
                         ("5000", "each side must be 1..4096")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            parse_size(bad)
    assert len(parse_presets("all")) >= 6 and parse_presets("none") == ()
    assert main(["world", "--out", "x", "--size", "big"]) == 2  # argparse's message as one line
