"""The node pack: both runtimes give the same frames, `alaya-flash run` / `render`, bad input."""
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle, folders
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
from alaya_flash.nodes import comfy
from alaya_flash.streaming.render import runner as rn
from alaya_flash.streaming.render import workflow as wfm
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
from alaya_flash.streaming.files.synthetic import synthetic_stream
from stream_helpers import Collect

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "workflows" / "api" / "render-gbuffer-sequence.json"


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A generated 64-frame G-buffer clip (npy windows), 32x32."""
    out = tmp_path_factory.mktemp("clip") / "clip"
    write_stream(synthetic_stream(32, 32, 64, seed=1), NpyWindowSink(out, window=16))
    return out


CLASSES = {**NODES, "Collect": Collect}


def graph(clip, frames=20, chunk=5, **sets):
    g = json.loads(RENDER.read_text())
    g["1"]["inputs"].update(path=str(clip), frames=frames, chunk=chunk)
    g["2"]["inputs"].update(model="random:tiny", precision="fp32", device="cpu")
    g["3"]["inputs"]["text"] = "0: a sunny street\n8: a rainy night"
    g["5"]["inputs"]["seed"] = 5
    g["8"] = {"class_type": "Collect", "inputs": {"images": ["7", 0]}}  # after Refine, instead of Save
    for k, v in sets.items():
        node, name = k.split("__")
        g[node]["inputs"][name] = v
    return g


def test_two_runtimes_same_frames(clip):
    """The workflow through execute_whole (ComfyUI's way) vs StreamRunner chunk by chunk."""
    Collect.got.clear()
    rn.execute_whole(wfm.parse_workflow(graph(clip, chunk=64), CLASSES), CLASSES)
    whole = torch.cat(Collect.got)
    Collect.got.clear()
    stats = rn.StreamRunner(wfm.parse_workflow(graph(clip, chunk=3), CLASSES), CLASSES).run()
    chunked = torch.cat(Collect.got)
    assert len(Collect.got) >= 2  # frames really arrived chunk by chunk (two AR chunks)
    assert stats.frames == 20 and whole.shape == (20, 32, 32, 3)
    assert torch.equal(chunked, whole)
    Collect.got.clear()
    rn.StreamRunner(wfm.parse_workflow(graph(clip, chunk=3, **{"5__seed": 6}), CLASSES), CLASSES).run()
    assert not torch.equal(torch.cat(Collect.got), whole)  # the seed matters


def _mp4_frames(path):
    import av

    with av.open(str(path)) as f:
        return sum(1 for _ in f.decode(video=0))


def test_run_renders_64_frames_to_mp4(clip, tmp_path, capsys):
    out = tmp_path / "render.mp4"
    code = main(["--quiet", "run", str(RENDER), "--set", f"Load G-Buffers.path={clip}", "--set", "2.precision=fp32",
                 "--set", f"Save.filename={out}", "--set", "1.chunk=16"])
    assert code == 0
    assert _mp4_frames(out) == 64
    assert not list(tmp_path.glob("*.tmp"))


def test_render_command_says_random_weights(clip, tmp_path, capsys):
    out = tmp_path / "r.mp4"
    assert main(["render", str(clip), "--prompt", "a street", "--out", str(out), "--frames", "9"]) == 0
    assert _mp4_frames(out) == 9
    if not bundle.has_default_flash():
        assert "RANDOM weights" in capsys.readouterr().err
    assert main(["render", str(clip), "--prompt", "x", "--out", str(out)]) == 2  # exists, no --overwrite


def test_render_overwrite_keeps_a_users_folder(clip, tmp_path, capsys):
    """`render --out DIR --format png --overwrite` on a folder it did not write refuses (it used to replace the
    folder, deleting what was in it); an empty --out is refused; an earlier png output is replaced."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    args = ["render", str(clip), "--prompt", "x", "--frames", "5", "--format", "png", "--overwrite", "--out"]
    assert main([*args, str(mine)]) == 2
    assert f"{mine}: is a folder alaya-flash did not write" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert main([*args, ""]) == 2
    assert "argument --out: an empty path names no output" in capsys.readouterr().err
    frames = tmp_path / "frames"
    assert main([*args, str(frames)]) == 0 and main([*args, str(frames)]) == 0
    assert len(list(frames.glob("*.png"))) == 5


def test_shipped_models_are_listed_and_render_by_name(clip, tmp_path, monkeypatch):
    """Load Flash Model lists every folder shipped in model_zoo/, and `render --model default` renders
    with that folder from any directory."""
    from alaya_flash.nodes.models import _flash_choices

    assert set(bundle.shipped_models()) <= set(_flash_choices()) and "default" in _flash_choices()
    from alaya_flash.nodes.models import _teacher_choices

    assert "default/teacher" in _teacher_choices()  # and not the light head, a safetensors file that is no DiT
    assert not any(c.endswith("light_head.safetensors") for c in _teacher_choices())
    monkeypatch.chdir(tmp_path)
    loaded = []
    real = folders.load_flash
    monkeypatch.setattr(folders, "load_flash", lambda folder=None, *a, **k: loaded.append(folder) or real(folder, *a, **k))
    out = tmp_path / "v2.mp4"
    assert main(["--quiet", "render", str(clip), "--model", "default", "--prompt", "a street at dusk", "--out", str(out),
                 "--frames", "5"]) == 0
    assert _mp4_frames(out) == 5
    assert [Path(f).resolve() for f in loaded] == [bundle.shipped_models()["default"]]


def test_inputs_glob_skips_finished_and_loads_models_once(clip, tmp_path, monkeypatch, capsys):
    import shutil

    inputs = tmp_path / "in"
    for name in ("a", "b"):
        shutil.copytree(clip, inputs / name)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.mp4").write_bytes(b"finished earlier")
    loads = []
    real = bundle.make_random_flash
    monkeypatch.setattr(bundle, "make_random_flash", lambda *a, **k: loads.append(1) or real(*a, **k))
    for name in ("c", "d"):
        shutil.copytree(clip, inputs / name)
    code = main(["run", str(RENDER), "--inputs", str(inputs / "*"), "--set", "1.frames=5",
                 "--set", "2.model=random:tiny", "--set", "2.precision=fp32", "--set", f"Save.filename={out}/{{name}}.mp4"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (out / "a.mp4").read_bytes() == b"finished earlier"
    assert "a: skipped" in err and "3 rendered, 1 skipped" in err
    assert all(_mp4_frames(out / f"{n}.mp4") == 5 for n in "bcd")
    assert len(loads) == 1


def test_interruption_leaves_no_partial_output(clip, tmp_path, monkeypatch):
    from alaya_flash.streaming.render import pipelines

    calls = []
    real = pipelines.Decode.step

    def step(self, latents):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, latents)

    monkeypatch.setattr(pipelines.Decode, "step", step)
    out = tmp_path / "o" / "render.mp4"
    code = main(["--quiet", "run", str(RENDER), "--set", f"1.path={clip}", "--set", "1.chunk=8",
                 "--set", "2.precision=fp32", "--set", f"Save.filename={out}"])
    assert code == 130
    assert len(calls) == 3
    assert not out.exists() and not (tmp_path / "o").exists()


def test_validation_errors_name_node_and_input(clip, tmp_path, capsys):
    code = main(["run", str(RENDER), "--validate-only", "--set", "1.path=/nonexistent/clip",
                 "--set", "2.model=no-such-model", "--set", "5.window_frames=2", "--set", "5.chunk_frames=3",
                 "--set", "5.steps=0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "node 1 (Load G-Buffers): G-buffer path '/nonexistent/clip' not found" in err
    assert "node 2 (Load Flash Model): Flash model 'no-such-model' not found (searched: " in err
    assert str(comfy.PACKAGE_ROOT / "model_zoo") in err
    assert "node 5 (Flash Sampler): window_frames (2) must be at least chunk_frames (3)" in err
    assert "node 5 (Flash Sampler): steps is 0: use -1 for the model's value or a value in [1, 50]" in err
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": {"class_type": "AlayaFlash_Decode",\n "inputs": {]}}')
    assert main(["run", str(bad)]) == 2
    assert "line 2, column" in capsys.readouterr().err
    assert main(["run", str(RENDER), "--validate-only", "--set", f"1.path={clip}"]) == 0


def test_bad_model_file_is_named(clip, tmp_path, capsys):
    folder = bundle.save_flash(bundle.make_random_flash(), tmp_path / "m")
    (folder / "dit.safetensors").write_bytes(b"not a safetensors file")
    code = main(["run", str(RENDER), "--set", f"1.path={clip}", "--set", f"2.model={folder}",
                 "--set", f"Save.filename={tmp_path / 'x.mp4'}"])
    err = capsys.readouterr().err
    assert code == 2 and "dit.safetensors" in err
    assert not (tmp_path / "x.mp4").exists()


def test_gbuffers_to_images_and_back_is_exact():
    images = torch.randint(0, 256, (6, 5, 8, 16, 3), dtype=torch.uint8)
    passes = NODES["AlayaFlash_GBuffersToImages"]().run(gbuffers=GBuffers(images))
    (back,) = NODES["AlayaFlash_GBuffersFromImages"]().run(**dict(zip(("albedo", "depth", "metallic", "normal", "roughness"), passes)),
                                                             encoding="teacher", depth_near=0.5, fps=16.0)
    grey = images.clone()
    for m in (1, 2, 4):  # single-channel passes read channel 0
        grey[:, m] = images[:, m, ..., :1]
    assert torch.equal(back.images, grey)


def test_gbuffers_from_float_images_match_canonical_encoding():
    from alaya_flash.streaming.gbuffer import frame_to_teacher

    frame = next(iter(synthetic_stream(16, 8, 1)))
    img = lambda a: torch.from_numpy(np.ascontiguousarray(a if a.ndim == 3 else a[..., None]))[None]  # noqa: E731
    (g,) = NODES["AlayaFlash_GBuffersFromImages"]().run(
        albedo=img(frame.albedo), depth=img(np.where(np.isinf(frame.depth), 1e9, frame.depth).astype(np.float32)),
        metallic=img(frame.metallic), normal=img(frame.normal), roughness=img(frame.roughness),
        encoding="float", depth_near=0.5, fps=16.0)
    assert torch.equal(g.images[0], torch.from_numpy(frame_to_teacher(frame)))


def test_encode_prompt_accepts_conditioning_of_the_right_width():
    flash, _, _, text, _ = NODES["AlayaFlash_LoadFlashModel"]().load("random:tiny", "(from model)", "cpu", "fp32", "(from model)")
    node = NODES["AlayaFlash_EncodePrompt"]()
    emb = torch.randn(1, 7, flash.text_dim)
    (p,) = node.encode(text, "ignored", conditioning=[[emb, {}]])
    assert torch.equal(p.entries[0][2], emb)
    with pytest.raises(Exception, match="384"):
        node.encode(text, "x", conditioning=[[torch.randn(1, 7, 4096), {}]])


@pytest.mark.parametrize("encoder_name, text_len", [("all-minilm-l6-v2", 1), (bundle.MINILM_TOKENS, 77)])
def test_a_minilm_folder_chosen_in_the_loader_gives_the_context_the_model_reads(encoder_name, text_len):
    """Load Flash Model's text_encoder input: a MiniLM-style folder in text_encoders replaces the model's
    encoder with the same kind of context (the sentence embedding, with word tokens for a +tokens model)."""
    from alaya_flash.model_zoo.text_encoder import default_model_dir
    from alaya_flash.nodes.models import _text_override

    model = bundle.make_random_flash()
    model.text_encoder_name = encoder_name
    _text_override(model, str(default_model_dir()), "cpu")
    assert model.text_encoder()(["a moonlit night"]).shape == (1, text_len, 384)


class Interrupted(Exception):
    """Stands in for ComfyUI's InterruptProcessingException."""


def fake_comfy(monkeypatch, cancel_at: int | None = None):
    """Stand-ins for ComfyUI's progress bar and cancel hook: returns a record of every bar update
    (bar number, value, total, preview kind) and of every cancel check; the cancel_at-th check raises."""
    import sys
    import types

    record = {"updates": [], "checks": 0, "bars": 0}

    class Bar:
        def __init__(self, total):
            record["bars"] += 1
            self.index, self.total = record["bars"], total

        def update_absolute(self, value, total, preview):
            record["updates"].append((self.index, value, total, preview[0] if preview else None))

    def check():
        record["checks"] += 1
        record["threads"] = torch.get_num_threads()  # what the node's work runs with
        if cancel_at is not None and record["checks"] >= cancel_at:
            raise Interrupted

    comfy_mod = types.ModuleType("comfy")
    comfy_mod.utils = types.SimpleNamespace(ProgressBar=Bar)
    comfy_mod.model_management = types.SimpleNamespace(throw_exception_if_processing_interrupted=check,
                                                       intermediate_device=lambda: "cpu",
                                                       get_torch_device=lambda: torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "comfy", comfy_mod)
    monkeypatch.setitem(sys.modules, "comfy.utils", comfy_mod.utils)
    monkeypatch.setitem(sys.modules, "comfy.model_management", comfy_mod.model_management)
    return record


def test_comfy_progress_and_interruption_hooks(monkeypatch):
    """With a stand-in for ComfyUI's modules: one bar update per chunk with a preview, and cancel raises."""
    record = fake_comfy(monkeypatch)
    bar = comfy.Progress(2)
    bar.update(1, preview=torch.rand(8, 8, 3))
    assert record["updates"] == [(1, 1, 2, "JPEG")]
    monkeypatch.setitem(record, "checks", 0)
    record2 = fake_comfy(monkeypatch, cancel_at=1)
    with pytest.raises(Interrupted):
        comfy.Progress(2).update(1)
    assert record2["checks"] == 1


def test_piece_clock_sizes_pieces_by_measured_time():
    """Pieces are sized by time, not by frames: one frame first, then what fits in PIECE_SECONDS at the
    measured rate (growing at most twofold), shrinking at once when the machine gets busy."""
    clock = comfy.PieceClock(most=16, target=0.25)
    sizes = [clock.size]
    for seconds_per_frame in (0.01, 0.01, 0.01, 0.01, 0.01, 0.1, 0.3, 0.02):
        clock.took(clock.size, clock.size * seconds_per_frame)
        sizes.append(clock.size)
    assert sizes == [1, 2, 4, 8, 16, 16, 2, 1, 2]


def test_every_long_node_checks_cancel_and_moves_its_bar_every_piece(monkeypatch):
    """Inside ComfyUI each node runs once over the whole sequence; encode, refine and save cut it into
    pieces sized by time (here PIECE_SECONDS is huge, so they double up to the cap: 1, 2, 4, 8, 8 ... frames;
    decode keeps 3 latents a piece), check for cancel and update a progress bar (with a preview frame) between pieces."""
    from alaya_flash.nodes.models import DecoderHandle, EncoderHandle, RefinerHandle

    monkeypatch.setattr(comfy, "PIECE_SECONDS", 1e9)
    flash = bundle.make_random_flash(refiner="gbuffer-refiner-16-prompt")
    gb = GBuffers(torch.from_numpy(np.random.default_rng(0).integers(0, 256, (33, 5, 16, 16, 3), dtype=np.uint8)))
    record = fake_comfy(monkeypatch)
    (cond,) = NODES["AlayaFlash_EncodeGBuffers"]().run(gbuffer_encoder=EncoderHandle("flash", flash.gbuffer_encoder), gbuffers=gb)
    assert [u[1:] for u in record["updates"]] == [(n, 33, "JPEG") for n in (1, 3, 7, 15, 23, 31, 33)]
    assert record["checks"] >= 7
    prompt = PromptSchedule.encode(flash.text_encoder(), "a street")
    sampled = NODES["AlayaFlash_FlashSampler"]().run(model=flash, cond=cond, prompt=prompt, seed=0, steps=-1,
                                                     chunk_frames=-1, window_frames=-1, sink_frames=-1)
    (latents,) = sampled["result"]
    record = fake_comfy(monkeypatch)
    (frames,) = NODES["AlayaFlash_Decode"]().run(decoder=DecoderHandle("tiny", flash.decoder), latents=latents)
    assert len(frames) == 33 and len(record["updates"]) == 3 and all(u[3] == "JPEG" for u in record["updates"])
    record = fake_comfy(monkeypatch)
    (refined,) = NODES["AlayaFlash_Refine"]().run(refiner=RefinerHandle(flash.refiner), images=frames, gbuffers=gb,
                                                  prompt=prompt)
    assert refined.shape == frames.shape and record["checks"] >= 7 and len(record["updates"]) == 7

    # a piece is checked before it runs and again by its bar update: cancel at the 3rd check stops the
    # encoder before its second piece, with 1 of the 33 frames read
    record = fake_comfy(monkeypatch, cancel_at=3)
    node = NODES["AlayaFlash_EncodeGBuffers"]()
    started = []
    original = node.start_stream
    monkeypatch.setattr(node, "start_stream", lambda **kw: started.append(original(**kw)) or started[-1])
    with pytest.raises(Interrupted):
        node.run(gbuffer_encoder=EncoderHandle("flash", flash.gbuffer_encoder), gbuffers=gb)
    assert started[0].inner.inner.frames == 1


def test_a_slow_machine_gets_one_frame_pieces(monkeypatch):
    """Where a frame takes longer than PIECE_SECONDS (a busy machine), every piece is one frame, so the
    frames between two cancel checks never grow with the piece count of an idle machine."""
    from alaya_flash.nodes.models import EncoderHandle

    monkeypatch.setattr(comfy, "PIECE_SECONDS", 1e-9)
    flash = bundle.make_random_flash()
    gb = GBuffers(torch.from_numpy(np.random.default_rng(0).integers(0, 256, (9, 5, 16, 16, 3), dtype=np.uint8)))
    record = fake_comfy(monkeypatch)
    NODES["AlayaFlash_EncodeGBuffers"]().run(gbuffer_encoder=EncoderHandle("flash", flash.gbuffer_encoder), gbuffers=gb)
    assert [u[1] for u in record["updates"]] == list(range(1, 10))


def test_cancelled_save_leaves_nothing(monkeypatch, tmp_path):
    """Save writes piece by piece; a cancel between pieces aborts the writer: no output, no temporary file."""
    record = fake_comfy(monkeypatch, cancel_at=2)
    frames = torch.rand(40, 16, 16, 3)
    with pytest.raises(Interrupted):
        NODES["AlayaFlash_Save"]().run(images=frames, filename=str(tmp_path / "out.mp4"), format="mp4", fps=16.0,
                                       overwrite=False)
    assert record["checks"] == 2 and list(tmp_path.iterdir()) == []


def inside_comfyui(monkeypatch, cancel_at: int | None = None):
    """fake_comfy, plus a stand-in for ComfyUI's folder_paths, so the pack believes it runs inside ComfyUI."""
    import sys
    import types

    record = fake_comfy(monkeypatch, cancel_at)
    monkeypatch.setitem(sys.modules, "folder_paths", types.SimpleNamespace(get_folder_paths=lambda kind: []))
    return record


def test_cancel_lands_inside_a_frame(monkeypatch):
    """Inside ComfyUI a node's run checks for cancel before every torch module's forward (throttled to
    HOOK_SECONDS, here 0), so a frame slower than a piece (a busy machine) still stops within it: the
    refiner is stopped in its first frame, before any progress update; the hook is gone afterwards."""
    from alaya_flash.nodes.models import RefinerHandle

    monkeypatch.setattr(comfy, "HOOK_SECONDS", 0.0)
    flash = bundle.make_random_flash(refiner="gbuffer-refiner-16-prompt")
    gb = GBuffers(torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 5, 16, 16, 3), dtype=np.uint8)))
    prompt = PromptSchedule.encode(flash.text_encoder(), "a street")
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    before = torch.get_num_threads()
    record = inside_comfyui(monkeypatch, cancel_at=3)  # the piece's own check, then two module forwards
    torch.set_num_threads(2)
    try:
        with pytest.raises(Interrupted):
            NODES["AlayaFlash_Refine"]().run(refiner=RefinerHandle(flash.refiner), images=torch.rand(4, 16, 16, 3),
                                             gbuffers=gb, prompt=prompt)
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert record["checks"] == 3 and record["updates"] == []
    assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks
    # on a CPU the node's work ran on one torch thread (split ops collapse beside a busy process), restored after
    assert record["threads"] == 1 and threads == 2
    # outside ComfyUI no hook is installed: the same run makes only the pieces' checks
    import sys

    monkeypatch.delitem(sys.modules, "folder_paths")
    record = fake_comfy(monkeypatch)
    NODES["AlayaFlash_Refine"]().run(refiner=RefinerHandle(flash.refiner), images=torch.rand(4, 16, 16, 3), gbuffers=gb,
                                     prompt=prompt)
    assert record["checks"] <= 2 * 4


def test_interruptible_work_stops_waiting_at_a_cancel(monkeypatch):
    """Work with no loop to check in (importing transformers, reading a model) runs on the pack's worker
    thread inside ComfyUI, while the node's thread checks for cancel: a cancel ends the node while the
    work is still going; the work finishes in the background; outside ComfyUI it is a plain call."""
    import threading

    release, finished = threading.Event(), threading.Event()

    def slow_load():
        release.wait(30)
        finished.set()
        return "model"

    record = inside_comfyui(monkeypatch, cancel_at=3)
    with pytest.raises(Interrupted):
        comfy.interruptible(slow_load)
    assert record["checks"] == 3 and not finished.is_set()  # stopped waiting, the load still running
    release.set()
    assert finished.wait(30)
    fake_comfy(monkeypatch)
    assert comfy.interruptible(lambda: "plain") == "plain"


def test_samplers_show_the_settings_they_ran_with():
    """A -1 widget takes the model's trained value; after a run the node shows which values it used
    (ComfyUI's ui text), the model's marked with *."""
    from alaya_flash.nodes.base import settings_line
    from alaya_flash.nodes.models import EncoderHandle

    flash = bundle.make_random_flash()
    s = flash.settings
    gb = GBuffers(torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, 5, 16, 16, 3), dtype=np.uint8)))
    (cond,) = NODES["AlayaFlash_EncodeGBuffers"]().run(gbuffer_encoder=EncoderHandle("flash", flash.gbuffer_encoder), gbuffers=gb)
    prompt = PromptSchedule.encode(flash.text_encoder(), "a street")
    out = NODES["AlayaFlash_FlashSampler"]().run(model=flash, cond=cond, prompt=prompt, seed=0, steps=2, chunk_frames=-1,
                                                 window_frames=-1, sink_frames=-1)
    assert out["ui"]["text"] == [f"steps 2 · chunk {s.chunk_frames}* · window {s.window_frames}* · sink {s.sink_frames}*"
                                 "  (*: the model's)"]
    assert out["result"][0].tensor.shape[2] == cond.tensor.shape[2]
    assert settings_line({"steps": 50, "CFG": 3.0, "shift": 5.0}, {"steps": 8, "CFG": 3.0, "shift": 2.5}) == \
        "steps 50 · CFG 3 · shift 5"
    teacher = NODES["AlayaFlash_LoadTeacherModel"]().load("random:tiny", "(from model)", -1, "cpu", "fp32", "(from model)")
    assert teacher["ui"]["text"] == [f"window {teacher['result'][0].settings.window_frames}*  (*: the model's)"]


def test_sources_check_cancel_every_frame_and_move_their_bar_by_time(clip, monkeypatch):
    """Load G-Buffers and Physics World also run once over the whole sequence inside ComfyUI: they read a
    frame at a time (whatever their chunk), check for cancel after each and move a bar (out of the frames
    the source announces) with the newest albedo at once and then every PIECE_SECONDS; the frames are
    those of the runner."""
    load = NODES["AlayaFlash_LoadGBuffers"]
    inputs = dict(path=str(clip), layout="auto", start=0, frames=40, stride=1, resize="stretch", width=0, height=0,
                  chunk=16)
    plain, count = load().run(**inputs)
    monkeypatch.setattr(comfy, "PIECE_SECONDS", 1e9)
    record = fake_comfy(monkeypatch)
    gbuffers, count2 = load().run(**inputs)
    assert count == count2 == 40 and torch.equal(gbuffers.images, plain.images)
    assert record["updates"] == [(1, 1, 40, "JPEG"), (1, 40, 40, "JPEG")]  # the first frame at once, then the rest
    assert record["checks"] == 40 + 2  # after every frame, and in each bar update
    monkeypatch.setattr(comfy, "PIECE_SECONDS", 0.0)
    record = fake_comfy(monkeypatch)
    load().run(**inputs)
    assert [u[1] for u in record["updates"]] == list(range(1, 41))
    record = fake_comfy(monkeypatch, cancel_at=3)
    with pytest.raises(Interrupted):
        load().run(**inputs)
    assert len(record["updates"]) == 1


def test_every_node_validates_at_most_one_input_in_comfyui():
    """ComfyUI repeats a VALIDATE_INPUTS message on every input the method takes: each node's takes at
    most one (Save's took filename, format and overwrite, and showed each refusal three times); the
    other checks run when the node starts (check_values; Save's before the render, from
    check_lazy_status), and the runner's validation runs those too."""
    import inspect

    many = {name: list(inspect.signature(cls.VALIDATE_INPUTS).parameters) for name, cls in NODES.items()
            if hasattr(cls, "VALIDATE_INPUTS") and len(inspect.signature(cls.VALIDATE_INPUTS).parameters) > 1}
    assert many == {}
    with pytest.raises(AlayaError, match=r"^Load Flash Model: decoder 'nope.safetensors' not found"):
        NODES["AlayaFlash_LoadFlashModel"]().load("random:tiny", "nope.safetensors", "cpu", "fp32", "(from model)")


def test_save_checks_its_output_before_comfyui_renders_its_frames(tmp_path):
    """`images` is lazy, so ComfyUI calls Save's check_lazy_status before it runs the nodes that make
    the frames: an output that exists without overwrite stops the prompt there, in one line."""
    save = NODES["AlayaFlash_Save"]
    assert save.INPUT_TYPES()["required"]["images"][1].get("lazy") is True
    (tmp_path / "shot.mp4").write_bytes(b"earlier")
    with pytest.raises(AlayaError, match=r"^Save: output .*shot.mp4 already exists \(set overwrite to replace it\)$"):
        save().check_lazy_status(str(tmp_path / "shot"), "mp4", 16.0, False)
    assert save().check_lazy_status(str(tmp_path / "shot"), "mp4", 16.0, True) == ["images"]
    assert save().check_lazy_status(str(tmp_path / "new"), "png", 16.0, False, images=torch.zeros(1, 8, 8, 3)) == []


def test_error_type_names_carry_no_install_path(tmp_path):
    """ComfyUI imports a custom node folder under its path ("/home/x/ComfyUI/custom_nodes/alaya-flash")
    and shows `module.Class` as an error's type: the install path showed on every error."""
    import subprocess
    import sys

    code = ("import importlib.util, sys; root = sys.argv[1]; name = root + '/custom_nodes/alaya-flash'; "
            "spec = importlib.util.spec_from_file_location(name, root + '/__init__.py', submodule_search_locations=[root]); "
            "m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); "
            "errors = importlib.import_module(name + '.model_zoo.errors'); wf = importlib.import_module(name + '.streaming.render.workflow'); "
            "print(*(c.__module__ + '.' + c.__qualname__ for c in (errors.AlayaError, errors.CheckpointError, wf.WorkflowError)))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["alaya_flash.model_zoo.errors.AlayaError", "alaya_flash.model_zoo.errors.CheckpointError",
                                  "alaya_flash.streaming.render.workflow.WorkflowError"]


def test_load_gbuffers_reports_each_problem_once_on_its_input(clip, tmp_path):
    """ComfyUI repeats a VALIDATE_INPUTS message for every input the method takes, so Load G-Buffers'
    takes only `path` (a missing path: one error, on path); a width without a height and a bad depth
    range stop the node when it runs (it runs first), one line naming the node."""
    import inspect

    from alaya_flash.model_zoo.errors import AlayaError

    load = NODES["AlayaFlash_LoadGBuffers"]
    assert list(inspect.signature(load.VALIDATE_INPUTS).parameters) == ["path"]
    assert load.VALIDATE_INPUTS(str(tmp_path / "none")) == f"G-buffer path {str(tmp_path / 'none')!r} not found (looked at {tmp_path / 'none'})"
    inputs = dict(path=str(clip), layout="auto", start=0, frames=0, stride=1, resize="stretch", chunk=16)
    with pytest.raises(AlayaError, match=r"^Load G-Buffers: width and height must both be 0 \(source size\) or both set, got 32x0$"):
        load().run(**inputs, width=32, height=0)
    with pytest.raises(AlayaError, match=r"^Load G-Buffers: depth range 'x': "):
        load().run(**inputs, width=0, height=0, depth_range="x")


@pytest.mark.parametrize("width, height, says", [
    (100, 64, "width 100 must be a multiple of 8 (the models work on 8x8 blocks), e.g. 104x64"),
    (64, 60, "height 60 must be a multiple of 8"),
    (32, 0, "width and height must both be 0 (source size) or both set, got 32x0"),
])
def test_a_load_gbuffers_size_off_the_8_grid_stops_before_anything_is_read(clip, tmp_path, width, height, says):
    """width 100 was accepted (ComfyUI checks a widget's range, not its step) and failed in Encode
    G-Buffers; now Load G-Buffers, which runs first, stops with one line, and the runner's validation
    says the same before any work."""
    from alaya_flash.streaming.cli import main

    load = NODES["AlayaFlash_LoadGBuffers"]
    inputs = dict(path=str(clip), layout="auto", start=0, frames=0, stride=1, resize="stretch", chunk=16)
    with pytest.raises(AlayaError, match=f"^Load G-Buffers: {re.escape(says)}"):
        load().run(**inputs, width=width, height=height)
    render = ROOT / "graphs" / "render-gbuffer-sequence.api.json"
    assert main(["--quiet", "run", str(render), "--set", f"1.path={clip}", "--set", f"1.width={width}",
                 "--set", f"1.height={height}", "--validate-only"]) == 2


def test_save_refuses_an_empty_filename_and_a_folder_it_did_not_write(tmp_path, monkeypatch):
    """Save's filename: empty is refused (it once reached Path.with_name and a traceback); with overwrite,
    a user's folder is refused (replacing it would delete its files), and the refusal is its message."""
    save = NODES["AlayaFlash_Save"]
    monkeypatch.chdir(tmp_path)
    for name in ("", "  "):
        assert save.VALIDATE_INPUTS(name) == "filename is empty: name the output file (mp4) or folder (png, exr, npy)"
    # a NUL reached the writer's os calls as a ValueError (a traceback after the render)
    assert save.VALIDATE_INPUTS("a\x00b.mp4") == "filename holds a NUL character (\\x00), which no file name may hold"
    assert save.check_values("a\x00b.mp4", "mp4", True) == []
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    assert "mine: is a folder alaya-flash did not write" in save.check_values(str(tmp_path / "mine"), "png", True)[0]
    assert save.check_values(".", "mp4", True) == [".: is a folder, not a file; choose another path"]
    assert save.check_values(str(tmp_path / "mine"), "mp4", True) == [None]  # writes mine.mp4 beside it
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


@pytest.mark.parametrize("fmt", ["png", "exr", "npy"])
def test_save_sequences_with_gbuffers(clip, tmp_path, fmt):
    g = graph(clip, frames=5, chunk=2)
    g["8"] = {"class_type": "AlayaFlash_Save", "inputs": {"images": ["7", 0], "gbuffers": ["1", 0], "filename": str(tmp_path / "seq"),
                                                          "format": fmt, "fps": 16.0, "overwrite": False}}
    rn.StreamRunner(wfm.parse_workflow(g, NODES), NODES).run()
    from alaya_flash.streaming.files.readers import open_gbuffers

    back = open_gbuffers(tmp_path / "seq")  # the passes come back through the readers
    assert back.info.num_frames == 5
    if fmt == "png":
        assert len(list((tmp_path / "seq").glob("*.png"))) == 5
    if fmt == "npy":
        assert np.load(tmp_path / "seq" / "rgb-0000.npy").shape == (5, 32, 32, 3)


def test_save_npy_without_gbuffers_is_refused_cleanly(clip, tmp_path):
    g = graph(clip, frames=5, chunk=5)
    g["8"] = {"class_type": "AlayaFlash_Save", "inputs": {"images": ["7", 0], "filename": str(tmp_path / "seq"),
                                                          "format": "npy", "fps": 16.0, "overwrite": False}}
    with pytest.raises(Exception, match="npy windows need G-buffer frames"):
        rn.StreamRunner(wfm.parse_workflow(g, NODES), NODES).run()
    assert not list(tmp_path.iterdir())


def test_sampler_widgets_at_minus_one_take_the_models_trained_settings():
    """Every sampler widget defaults to -1, the loaded model's own setting (config.json "session"), as
    the default model was trained and evaluated; an explicit value still overrides it."""
    import dataclasses

    from alaya_flash.model_zoo import bundle, folders

    flash = bundle.make_random_flash()
    flash.settings = dataclasses.replace(flash.settings, steps=2, chunk_frames=1, window_frames=6, sink_frames=1)
    prompt = PromptSchedule.encode(flash.text_encoder(), "a street")
    sampler = NODES["AlayaFlash_FlashSampler"]
    defaults = {k: v[1]["default"] for k, v in sampler.INPUT_TYPES()["required"].items() if k != "seed" and len(v) > 1
                and "default" in v[1]}
    assert defaults == {"steps": -1, "chunk_frames": -1, "window_frames": -1, "sink_frames": -1}
    own = sampler().start_stream(flash, prompt, seed=0, **defaults).inner
    assert (own.chunk_frames, own.sampler.config.window_frames, own.sampler.config.sink_frames) == (1, 6, 1)
    assert len(own.sampler.config.nominal_steps) == 2
    mine = sampler().start_stream(flash, prompt, seed=0, steps=3, chunk_frames=2, window_frames=8, sink_frames=0).inner
    assert (mine.chunk_frames, mine.sampler.config.window_frames, mine.sampler.config.sink_frames) == (2, 8, 0)
    assert len(mine.sampler.config.nominal_steps) == 3

    teacher = bundle.make_random_teacher()
    teacher.settings = dataclasses.replace(teacher.settings, steps=7, cfg=3.0, shift=4.0, negative_prompt="blurry")
    tprompt = PromptSchedule.encode(teacher.text_encoder(), "a street")
    stage = NODES["AlayaFlash_TeacherSampler"]().start_stream(teacher, tprompt, "", seed=0, steps=-1, cfg=-1.0, shift=-1.0)
    inner = stage.inner
    assert (inner.steps, inner.cfg, inner.shift) == (7, 3.0, 4.0)
    assert torch.equal(inner.negative, teacher.text_encoder()(["blurry"]))  # empty: the model's negative prompt
    assert NODES["AlayaFlash_TeacherSampler"].check_values(steps=-1, cfg=0.5, shift=-1.0) == \
        ["cfg is 0.5: use -1 for the model's value or a value in [1.0, 30.0]"]
    with pytest.raises(AlayaError, match=r"^Teacher Sampler: cfg is 0.5: use -1"):
        NODES["AlayaFlash_TeacherSampler"]().start_stream(teacher, tprompt, "", seed=0, steps=-1, cfg=0.5, shift=-1.0)


def fake_folder_paths(monkeypatch, root):
    """A stand-in for ComfyUI's folder_paths with input/, output/ and temp/ under root."""
    import sys
    import types

    fp = types.ModuleType("folder_paths")
    for name in ("input", "output", "temp"):
        (root / name).mkdir(exist_ok=True)
    fp.get_input_directory = lambda: str(root / "input")
    fp.get_output_directory = lambda: str(root / "output")
    fp.get_temp_directory = lambda: str(root / "temp")
    fp.get_folder_paths = lambda kind: []
    monkeypatch.setitem(sys.modules, "folder_paths", fp)


def test_save_and_preview_show_their_results_on_the_canvas(monkeypatch, tmp_path):
    """Inside ComfyUI Save's result is what ComfyUI's own SaveVideo returns (the mp4 as an animated
    entry the frontend plays on the node and in the queue); frame folders and Stream Preview show their
    last frame through a PNG in the temp folder, as Preview Image does. Outside ComfyUI: text only."""
    frames = torch.rand(9, 16, 16, 3)
    save = NODES["AlayaFlash_Save"]
    outside = save().run(images=frames, filename=str(tmp_path / "plain.mp4"), format="mp4", fps=16.0, overwrite=False)
    assert set(outside["ui"]) == {"text"}
    fake_folder_paths(monkeypatch, tmp_path)
    ui = save().run(images=frames, filename="shots/render.mp4", format="mp4", fps=16.0, overwrite=False)["ui"]
    assert ui["images"] == [{"filename": "render.mp4", "subfolder": "shots", "type": "output"}]
    assert ui["animated"] == (True,) and (tmp_path / "output" / "shots" / "render.mp4").is_file()
    ui = save().run(images=frames, filename="frames", format="png", fps=16.0, overwrite=False)["ui"]
    (still,) = ui["images"]
    assert still["type"] == "temp" and "animated" not in ui
    from PIL import Image

    shown = np.asarray(Image.open(tmp_path / "temp" / still["subfolder"] / still["filename"]))
    assert np.array_equal(shown, (frames[-1] * 255).round().byte().numpy())
    ui = NODES["AlayaFlash_StreamPreview"]().run(images=frames, filename="")["ui"]
    assert ui["images"][0]["type"] == "temp" and ui["text"] == ["previewed 9 frames"]


def _png_frames(folder):
    from PIL import Image

    return np.stack([np.asarray(Image.open(p)) for p in sorted(Path(folder).glob("*.png"))])


def test_render_gbuffer_stream_gives_the_render_workflows_frames(clip, tmp_path):
    """Render G-Buffer Stream (one node: read, encode, sample, decode, refine, write, chunk by chunk) writes
    the frames of Load G-Buffers -> ... -> Save for the same seed, prompt and chunk; it shows its settings."""
    render = json.loads(RENDER.read_text())
    render["1"]["inputs"].update(path=str(clip), frames=24, chunk=8)
    render["2"]["inputs"].update(model="random:tiny", precision="fp32", device="cpu")
    render["5"]["inputs"]["seed"] = 3
    render["8"]["inputs"].update(filename=str(tmp_path / "nodes"), format="png")
    rn.StreamRunner(wfm.parse_workflow(render, NODES), NODES).run()
    model, _, _, text, _ = NODES["AlayaFlash_LoadFlashModel"]().load("random:tiny", "(from model)", "cpu", "fp32", "(from model)")
    (prompt,) = NODES["AlayaFlash_EncodePrompt"]().encode(text, render["3"]["inputs"]["text"])
    out = NODES["AlayaFlash_RenderGBufferStream"]().render(
        model=model, prompt=prompt, path=str(clip), start=0, frames=24, width=0, height=0, chunk=8, seed=3, steps=-1,
        chunk_frames=-1, window_frames=-1, sink_frames=-1, filename=str(tmp_path / "stream"), format="png", fps=16.0,
        overwrite=False)
    assert np.array_equal(_png_frames(tmp_path / "stream"), _png_frames(tmp_path / "nodes"))
    assert len(list((tmp_path / "stream").glob("*.png"))) == 24
    assert out["ui"]["text"][0].startswith("steps ") and "wrote 24 frames" in out["ui"]["text"][1]


def test_render_gbuffer_stream_writes_as_it_reads_and_a_cancel_leaves_nothing(clip, tmp_path, monkeypatch):
    """Memory stays flat because the node writes frames while the clip is still being read (the clip is
    never whole in memory); a cancel mid-clip removes the temporary output."""
    from alaya_flash.nodes import gbuffers, stream

    written, pulled = [], []
    savers = []

    class Recording(stream._Saving):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            savers.append(self)

    original = gbuffers.LoadGBuffers.open_stream

    def reading(self, *a, **kw):
        for chunk in original(self, *a, **kw):
            pulled.append(len(chunk[0]))
            written.append(savers[-1].inner.count if savers else 0)
            yield chunk

    monkeypatch.setattr(stream, "_Saving", Recording)
    monkeypatch.setattr(gbuffers.LoadGBuffers, "open_stream", reading)
    model, _, _, text, _ = NODES["AlayaFlash_LoadFlashModel"]().load("random:tiny", "(from model)", "cpu", "fp32", "(from model)")
    (prompt,) = NODES["AlayaFlash_EncodePrompt"]().encode(text, "a street")
    inputs = dict(model=model, prompt=prompt, path=str(clip), start=0, frames=48, width=0, height=0, chunk=8, seed=0,
                  steps=-1, chunk_frames=-1, window_frames=-1, sink_frames=-1, format="mp4", fps=16.0, overwrite=False)
    NODES["AlayaFlash_RenderGBufferStream"]().render(filename=str(tmp_path / "out.mp4"), **inputs)
    assert sum(pulled) == 48 and written[-1] >= 24  # half the clip was written before its last chunk was read
    assert _mp4_frames(tmp_path / "out.mp4") == 48
    fake_comfy(monkeypatch, cancel_at=3)  # the bar's cancel check, a few chunks in
    with pytest.raises(Interrupted):
        NODES["AlayaFlash_RenderGBufferStream"]().render(filename=str(tmp_path / "cut.mp4"), **inputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mp4"]


def test_load_gbuffer_videos_reads_one_clip_of_a_folder(tmp_path, monkeypatch):
    """Load G-Buffer Videos reads the five pass videos of one clip: a folder of {pass}.mp4 (AlayaRenderer's
    clip layout) or FOLDER/CLIP for the CLIP_{pass}.mp4 of a folder holding several; inside ComfyUI it
    lists the clips of the input folder (and the bundled sample)."""
    import shutil
    import sys
    import types

    from alaya_flash.streaming.files.readers import find_video_clips

    sample = ROOT / "samples" / "courtyard"
    shots = tmp_path / "input" / "shots"
    shots.mkdir(parents=True)
    for clip_name in ("street", "yard"):
        for f in sample.glob("*.mp4"):
            shutil.copy(f, shots / f"{clip_name}_{f.stem}.mp4")
    shutil.copytree(sample, tmp_path / "input" / "courtyard")
    (shots / "half_albedo.mp4").write_bytes((sample / "albedo.mp4").read_bytes())  # a clip missing 4 passes
    assert find_video_clips(tmp_path / "input") == ["courtyard", "shots/street", "shots/yard"]

    monkeypatch.setitem(sys.modules, "folder_paths", types.SimpleNamespace(
        get_input_directory=lambda: str(tmp_path / "input"), get_folder_paths=lambda kind: []))
    node = NODES["AlayaFlash_LoadGBufferVideos"]
    assert node.INPUT_TYPES()["required"]["clip"][0] == ["courtyard", "shots/street", "shots/yard", "samples/courtyard"]
    assert node.VALIDATE_INPUTS("shots/yard") is True
    assert "G-buffer videos 'shots/half' not found" in node.VALIDATE_INPUTS("shots/half")
    want, count = NODES["AlayaFlash_LoadGBuffers"]().run(path=str(sample), layout="auto", start=2, frames=8, stride=1,
                                                          resize="stretch", width=64, height=64, chunk=4)
    got, count2 = node().run(clip="shots/yard", start=2, frames=8, width=64, height=64, chunk=4)
    assert count == count2 == 8 and torch.equal(got.images, want.images)
    bundled, n = node().run(clip="samples/courtyard", start=0, frames=0, width=0, height=0, chunk=16)  # from the pack
    assert n == 17 and bundled.images.shape[1:] == (5, 256, 256, 3)
