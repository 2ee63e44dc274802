"""`alaya-flash gbuffers info|convert` and `alaya-flash demo` through main(argv)."""
import shutil

import numpy as np
import pytest

from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream


def npy_windows(folder, n=2, t=16, h=64, w=64):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(n):
        np.save(folder / f"window-{k:02d}.npy", rng.integers(0, 256, (t, 5, h, w, 3), dtype=np.uint8))
    return folder


def test_info_on_two_npy_windows(tmp_path, capsys):
    assert main(["gbuffers", "info", str(npy_windows(tmp_path / "w"))]) == 0
    out = capsys.readouterr().out
    assert "frames:  32" in out and "size:    64x64" in out and "npy-windows" in out
    assert "albedo     min 0  max 255" in out


def test_info_on_float_exr(tmp_path, capsys):
    from alaya_flash.streaming.files import sinks

    sinks.write_stream(synthetic_stream(32, 16, 3), sinks.open_sink(tmp_path / "e", "exr"))
    assert main(["gbuffers", "info", str(tmp_path / "e"), "--size", "16x8"]) == 0
    out = capsys.readouterr().out
    assert "canonical float" in out and "size:    16x8" in out and "background +inf" in out


def test_convert_resizes_and_reads_back(tmp_path, capsys):
    src = npy_windows(tmp_path / "w", n=1, t=5, h=48, w=64)
    dst = tmp_path / "clip"
    assert main(["--quiet", "gbuffers", "convert", str(src), str(dst), "--to", "mp4", "--size", "32x32",
                 "--resize", "crop", "--stride", "2"]) == 0
    s = open_gbuffers(dst)
    assert s.info.layout == "teacher-mp4" and s.info.size == (32, 32) and s.info.num_frames == 3
    assert s.info.fps == 8.0  # the stride halves the rate and the MP4 records it


@pytest.mark.parametrize("damage,match", [
    ("missing", "missing modality"),
    ("truncated", "truncated"),
    ("unknown", "unknown layout"),
])
def test_convert_bad_input_one_line_nothing_written(tmp_path, capsys, damage, match):
    src = npy_windows(tmp_path / "w", n=2, t=3, h=8, w=8)
    if damage == "missing":
        shutil.rmtree(src)
        src = tmp_path / "png"
        for mod in ("albedo", "depth", "metallic", "normal"):
            (src / mod).mkdir(parents=True)
    elif damage == "truncated":
        f = src / "window-01.npy"
        f.write_bytes(f.read_bytes()[:200])
    else:
        for f in src.iterdir():
            f.rename(f.with_suffix(".bin"))
    dst = tmp_path / "out" / "converted"
    assert main(["gbuffers", "convert", str(src), str(dst), "--to", "png"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("alaya-flash: error: ") and match in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_convert_failure_mid_stream_leaves_nothing(tmp_path, capsys):
    from alaya_flash.streaming.files import sinks

    src = tmp_path / "png"
    sinks.write_stream(synthetic_stream(16, 8, 4), sinks.open_sink(src, "png"))
    (src / "depth" / "000002.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    dst = tmp_path / "exr"
    assert main(["gbuffers", "convert", str(src), str(dst), "--to", "exr"]) == 2
    assert "000002.png" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["png"]


def test_convert_refuses_existing_destination(tmp_path, capsys):
    src = npy_windows(tmp_path / "w", n=1, t=2, h=8, w=8)
    dst = tmp_path / "dst"
    dst.mkdir()
    assert main(["gbuffers", "convert", str(src), str(dst), "--to", "npy"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["gbuffers", "convert", str(src), str(dst), "--to", "npy", "--overwrite"]) == 0
    np.testing.assert_array_equal(np.load(dst / "window-0000.npy"), np.load(src / "window-00.npy"))


def test_nan_policy_flag(tmp_path, capsys):
    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.files.image_files import read_exr, write_exr

    src = tmp_path / "e"
    sinks.write_stream(synthetic_stream(16, 8, 2), sinks.open_sink(src, "exr"))
    chans = read_exr(src / "000001.exr")
    chans["normal.Y"][3, 4] = np.nan
    write_exr(src / "000001.exr", chans)
    assert main(["gbuffers", "convert", str(src), str(tmp_path / "a"), "--to", "npy"]) == 2
    assert "normal has 1 NaN/Inf pixel, first at (x=4, y=3)" in capsys.readouterr().err
    assert main(["gbuffers", "convert", str(src), str(tmp_path / "b"), "--to", "npy", "--nan-policy", "fix"]) == 0
    assert (tmp_path / "b" / "window-0000.npy").exists() and not (tmp_path / "a").exists()


def test_demo_writes_a_panel_video(tmp_path, capsys):
    import av

    out = tmp_path / "o" / "demo.mp4"
    assert main(["--quiet", "demo", "--out", str(out), "--frames", "5", "--size", "32x16", "--preview",
                 "--source", "synthetic"]) == 0
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 5 and frames[0].shape == (32, 96, 3)
    assert main(["--quiet", "demo", "--out", str(out), "--frames", "5", "--size", "32x16", "--preview"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["--quiet", "demo", "--out", str(out), "--source", "nowhere"]) == 2
    assert "neither a bundled stream" in capsys.readouterr().err


def test_demo_renders_with_a_flash_model(tmp_path):
    """With a model the sixth tile is the model's render: one output frame per input frame, streamed."""
    import av

    from alaya_flash.model_zoo import bundle

    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=2, sink_frames=0))
    bundle.save_flash(flash, tmp_path / "model")
    out = tmp_path / "demo.mp4"
    assert main(["--quiet", "demo", "--out", str(out), "--frames", "6", "--size", "32x32", "--source", "synthetic",
                 "--model", str(tmp_path / "model")]) == 0
    with av.open(str(out)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 6 and frames[0].shape == (64, 96, 3)
    assert main(["--quiet", "demo", "--out", str(tmp_path / "b.mp4"), "--size", "40x32",
                 "--model", str(tmp_path / "model")]) == 2


@pytest.mark.parametrize("argv", [["gbuffers", "--help"], ["gbuffers", "info", "--help"],
                                  ["gbuffers", "convert", "--help"], ["demo", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0 and "usage: alaya-flash" in capsys.readouterr().out


def test_the_parser_and_info_start_without_torch_and_a_model_loads_without_sympy():
    """A fresh process: building every command's parser and `gbuffers info` import no torch (serve's
    --preset names load when first needed), and loading the shipped model imports neither sympy nor
    torch._dynamo (its modulation tables are only allocated on the meta device): seconds of every start."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.path.insert(0, 'tests'); import conftest; from alaya_flash.streaming.cli import main; "
            "main(['gbuffers', 'info', 'samples/courtyard']); print('torch' in sys.modules); "
            "from alaya_flash.model_zoo.folders import load_flash; load_flash(); "
            "print('torch' in sys.modules, 'sympy' in sys.modules, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-2:] == ["False", "True False False"], out.stdout


def test_a_preset_serve_does_not_know_is_one_line_naming_them(capsys):
    assert main(["serve", "--preset", "nope"]) == 2
    err = capsys.readouterr().err
    assert "argument --preset: invalid choice: 'nope' (choose from 'bright_sunny', 'overcast'" in err


def test_the_world_demo_lights_a_light_reading_model_by_its_own_sun(tmp_path, monkeypatch):
    """The physics world knows its sun, as an engine does: the demo hands a light-reading model each frame's
    light (the demo preset's sun turned with that frame's camera), and renders what a pipeline given those
    lights renders; without them (the prompt's light) the frames differ."""
    import numpy as np
    import torch

    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.light import pack
    from alaya_flash.streaming.cli.demo import DEMO_PROMPT, WorldDemo, render_model_demo
    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.gbuffer import frame_to_teacher
    from alaya_flash.streaming.render.lighting import recorded
    from alaya_flash.streaming.render.pipelines import FlashPipeline
    from alaya_flash.streaming.values import GBuffers, PromptSchedule
    from alaya_flash.streaming.world import WorldConfig
    from alaya_flash.streaming.world.shading import heading, light_of
    from alaya_flash.streaming.world.world import WorldSource
    from stream_helpers import random_refiner

    flash = bundle.make_random_flash(seed=0)
    flash.refiner = random_refiner("gbuffer-refiner-16-blend")
    written = []

    class Capture:  # the panels the demo would encode
        def __init__(self, *args, **kwargs):
            self.count = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, image):
            written.append(image)
            self.count += 1

    monkeypatch.setattr(sinks, "Mp4Sink", Capture)

    def demo(lit: bool) -> np.ndarray:
        written.clear()
        world = WorldDemo(32, 32, 6, seed=1)
        assert render_model_demo(world.stream, tmp_path / "x.mp4", flash, light=world.light if lit else None) == 6
        return np.stack([w[32 + 16:, 64:] for w in written])  # the render's tile below its label

    source = WorldSource(WorldConfig(seed=1, width=32, height=32, num_frames=6, presets=()))
    images, lights = [], []
    for frame, camera in source.frames_with_cameras():
        images.append(frame_to_teacher(frame, source.info.depth_near))
        lights.append(light_of(WorldDemo.PRESET, heading(camera)))
    assert len({round(heading(c), 3) for _, c in source.frames_with_cameras()}) > 1  # the camera turns
    sched = PromptSchedule.encode(flash.text_encoder(), DEMO_PROMPT)
    pipe = FlashPipeline(flash, sched, seed=0, lights=recorded(pack(lights)))
    gb = torch.from_numpy(np.stack(images))
    want = torch.cat(list(pipe.run(GBuffers(gb[a:a + 4], source.info.fps, source.info.depth_near) for a in (0, 4))))
    want = sinks.to_uint8(want)[:, 16:]
    lit = demo(True)
    assert np.abs(lit.astype(int) - want).max() <= 1
    assert np.abs(demo(False).astype(int) - want).max() > 8
