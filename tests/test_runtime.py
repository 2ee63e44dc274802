"""The OpenVINO backend renders the torch path's frames: the same clip both ways (PSNR), chunked =
whole on the new backend, the on-disk cache of compiled models, and the backend choice."""
from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from alaya_flash import model_zoo
from alaya_flash.model_zoo import bundle, folders, runtime
from alaya_flash.model_zoo.cache_home import cache_home
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.values import GBuffers, PromptSchedule, gbuffer_chunks
from alaya_flash.streaming.render.driver import Lanes
from alaya_flash.streaming.files.synthetic import synthetic_stream
from stream_helpers import render_ticks

ov = pytest.importorskip("openvino")
DEFAULT = Path(model_zoo.__file__).parent / "default"


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """The file's compiled-model cache. Converting a network costs seconds (the G-buffer encoder's unrolled
    graph most), so the tests share what they converted: the cache test's IR (which it makes in a fresh
    folder of its own) is copied here for the later tests that stream the same tiny models."""
    return tmp_path_factory.mktemp("openvino-cache")


@pytest.fixture(autouse=True)
def _cache(shared_cache, monkeypatch):
    monkeypatch.setenv("ALAYA_FLASH_CACHE", str(shared_cache))


def _model_code_key() -> str:
    """A hash of everything a conversion's IR depends on that its cache folder's name does not hold (that
    name holds the weights, shapes, precision and OpenVINO's version): the network and graph code
    (model_zoo's sources and configs) and torch's version (the trace)."""
    digest = hashlib.sha256(torch.__version__.encode())
    package = Path(model_zoo.__file__).parent
    for source in sorted([*package.rglob("*.py"), *package.rglob("*.json")]):  # code and configs
        digest.update(source.relative_to(package).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def default_model_cache() -> Path:
    """The shipped model's conversions (a G-buffer encoder's unrolled graph at 64x64, about 7 s of CPU each
    precision), kept from run to run in the user's cache under a hash of the model code: the IR read back is
    the one this code converts. Folders of other code unused for a week are removed."""
    tests = cache_home() / "tests" / "openvino-default"  # (read before the autouse fixture sets the file's cache)
    folder = tests / _model_code_key()
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)
    for other in tests.iterdir():
        if other != folder and time.time() - other.stat().st_mtime > 7 * 86400:
            shutil.rmtree(other, ignore_errors=True)
    return folder


_render = render_ticks  # stream_helpers: the frames through the driver's ticks


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(1 / ((a - b) ** 2).mean()))


def _clip(size: int, frames: int, length: int = 4) -> list[GBuffers]:
    return list(gbuffer_chunks(synthetic_stream(size, size, frames), length))


def other_flash():
    """Seed 1's DiT and decoder with seed 2's G-buffer encoder: other weights but for the encoder, whose
    unrolled graph is most of a conversion's time (the cache test's other model, streamed again by the
    signal test's process from the IR the cache test made)."""
    flash = bundle.make_random_flash(seed=1, dtype=torch.float32, dit="dit-tiny")
    same = bundle.make_random_flash(seed=2, dtype=torch.float32, dit="dit-tiny").gbuffer_encoder.state_dict()
    flash.gbuffer_encoder.load_state_dict(same)
    return flash


def _kind(entry: str) -> str:
    return entry.rsplit("-", 1)[0]  # a cache entry's folder: <network kind>-<hash>


@pytest.mark.slow
def test_compiled_models_are_cached_on_disk_by_weights(tmp_path, shared_cache, monkeypatch):
    """A second load of the same weights converts nothing (the IR is read back); other weights get
    their own entries, and a network whose weights are the same shares its entry. (In a fresh folder;
    what it converted then seeds the file's shared cache.)"""
    monkeypatch.setenv("ALAYA_FLASH_CACHE", str(tmp_path / "cache"))
    flash = bundle.make_random_flash(seed=2, dtype=torch.float32, dit="dit-tiny")
    chunks = _clip(32, 5, 5)
    first = _render(runtime.accelerate(flash, "openvino"), chunks)
    root = Path(tmp_path / "cache" / "openvino")
    entries = sorted(p.name for p in root.iterdir())
    assert entries and all((root / e / "model.xml").exists() for e in entries)
    stamps = {e: (root / e / "model.xml").stat().st_mtime_ns for e in entries}
    again = _render(runtime.accelerate(flash, "openvino"), chunks)
    assert torch.equal(first, again)
    assert {e: (root / e / "model.xml").stat().st_mtime_ns for e in entries} == stamps
    _render(runtime.accelerate(other_flash(), "openvino"), chunks)
    added = sorted(_kind(p.name) for p in root.iterdir() if p.name not in entries)
    assert "gbuffer-encoder" in map(_kind, entries)
    assert added == sorted(_kind(e) for e in entries if _kind(e) != "gbuffer-encoder")
    assert {e: (root / e / "model.xml").stat().st_mtime_ns for e in entries} == stamps
    # the later tests read these back: the signal test streams both models, the chunked test seed 2's codecs
    shutil.copytree(root, shared_cache / "openvino", dirs_exist_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("dtype, floor", [(torch.float32, 60.0), (torch.bfloat16, 40.0)])
def test_default_model_renders_the_same_frames_on_openvino(dtype, floor, default_model_cache, monkeypatch):
    """The shipped model, 15 frames at 64x64 (the stream's padding included), torch against OpenVINO
    at the same precision, on 2 lanes as the CLI runs it. (Its conversions: default_model_cache.)"""
    monkeypatch.setenv("ALAYA_FLASH_CACHE", str(default_model_cache))
    flash = folders.load_flash(DEFAULT, torch.device("cpu"), dtype)
    chunks = _clip(64, 15)
    torch_frames = _render(flash, chunks)
    fast = runtime.accelerate(flash, "openvino")
    assert runtime.backend_of(fast) == "openvino" and runtime.backend_of(flash) == "torch"
    ov_frames = _render(fast, chunks, Lanes(threads=(1, 1)))
    assert ov_frames.shape == torch_frames.shape == (15, 64, 64, 3)
    assert _psnr(ov_frames, torch_frames) >= floor


@pytest.mark.slow
def test_chunked_equals_whole_on_openvino():
    """One frame at a time, chunks of 4 and of 7, and the whole clip at once give the same frames
    (every network sees the same groups, whatever the cut); a random model with a prompt-reading refiner,
    a longer KV window (the cache fills over several chunks) and a 5-token prompt. Converting it prints no
    TracerWarning (the refiner's input checks become constants of the static-shape trace)."""
    import warnings

    flash = runtime.accelerate(bundle.make_random_flash(seed=2, dtype=torch.float32, dit="dit-tiny",
                                                        refiner="gbuffer-refiner-16-prompt"), "openvino")
    chunks = _clip(32, 18, 18)
    whole = torch.cat([c.images for c in chunks])
    emb = torch.randn(1, 5, flash.text_dim)
    prompts = PromptSchedule.constant(emb)

    def render(pieces):
        pipe = pl.FlashPipeline(flash, prompts, seed=1, chunk_frames=2, window_frames=4, sink_frames=1)
        outs = [pipe.step(GBuffers(p)) for p in pieces] + [pipe.flush()]
        return torch.cat([o for o in outs if o is not None])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference = render([whole])  # the first chunk converts what the shared cache lacks
    assert reference.shape == (18, 32, 32, 3)
    assert not [w for w in caught if issubclass(w.category, torch.jit.TracerWarning)], [str(w.message) for w in caught]
    for n in (1, 4, 7):
        assert torch.equal(render(list(whole.split(n))), reference), f"chunks of {n}"


@pytest.mark.slow
def test_streams_reuse_the_infer_requests():
    """Three streams one after another on 2 lanes (new lane threads each time) render the same frames
    and make no new infer requests after the first: a codec stream's request comes back to its pool
    when the stream goes (its memory zeroed when taken again), the DiT and the refiner borrow one per
    call. A request per stream or per thread allocated its buffers anew every stream."""
    flash = runtime.accelerate(bundle.make_random_flash(seed=2, dtype=torch.float32, dit="dit-tiny",
                                                        refiner="gbuffer-refiner-16-prompt"), "openvino")
    chunks = _clip(32, 9, 4)
    first = _render(flash, chunks, Lanes(threads=(1, 1)))
    pools = lambda: {(net, key): p.made for net in (flash.gbuffer_encoder, flash.decoder, flash.refiner, flash.dit)  # noqa: E731
                     for key, p in net.compiler.compiled.items()}
    made = pools()
    assert made and all(n <= 2 for n in made.values())
    for _ in range(2):
        assert torch.equal(_render(flash, chunks, Lanes(threads=(1, 1))), first)
    assert pools() == made
    for net in (flash.gbuffer_encoder, flash.decoder):
        assert [p.made for p in net.compiler.compiled.values()] == [1]


def test_backend_choice(monkeypatch, capsys):
    monkeypatch.delenv(runtime.ENV, raising=False)
    runtime.configure(None)
    assert runtime.choose("auto", "cpu") == "openvino"  # installed here
    assert runtime.choose("auto", "cuda") == "torch"
    assert runtime.choose("torch", "cpu") == "torch"
    with pytest.raises(AlayaError, match="runs on the CPU"):
        runtime.choose("openvino", "cuda")
    with pytest.raises(AlayaError, match="not one of"):
        runtime.choose("tensorrt", "cpu")
    monkeypatch.setenv(runtime.ENV, "torch")
    assert runtime.choose("auto", "cpu") == "torch"
    runtime.configure("openvino")
    try:
        assert runtime.choose("auto", "cpu") == "openvino"  # the CLI's --backend before the environment
    finally:
        runtime.configure(None)
    monkeypatch.setattr(runtime, "openvino_version", lambda: None)
    monkeypatch.delenv(runtime.ENV)
    runtime._say_once.cache_clear()
    assert runtime.choose("auto", "cpu") == "torch"
    assert "OpenVINO is not installed: the networks run on torch" in capsys.readouterr().err
    with pytest.raises(AlayaError, match="not installed"):
        runtime.choose("openvino", "cpu")


STREAMS_THEN_A_SIGNAL = """
import gc, signal, sys, torch
from alaya_flash.model_zoo import bundle, runtime
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.render.driver import Lanes, StageGraph, ticks
from alaya_flash.streaming.files.synthetic import synthetic_stream
from alaya_flash.streaming.values import PromptSchedule, gbuffer_chunks
""" + inspect.getsource(other_flash) + """
def stream(seed):
    made = other_flash() if seed == 1 else bundle.make_random_flash(seed=seed, dit="dit-tiny")
    flash = runtime.accelerate(made, "openvino")
    graph = StageGraph(["gbuffers"], pl.flash_steps(flash, PromptSchedule.constant(torch.zeros(1, 1, 384)), seed=0))
    chunks = gbuffer_chunks(synthetic_stream(32, 32, 5), 5)
    for _ in ticks(graph, {"gbuffers": ((c,) for c in chunks)}, lanes=Lanes(threads=(1, 1))):
        pass
    return flash

first, second = stream(1), stream(2)
del first; gc.collect()  # released in the order they were made (a command's model, then the next one's)
del second; gc.collect()
seen = []
signal.signal(signal.SIGHUP, lambda *_: seen.append("SIGHUP"))
signal.raise_signal(signal.SIGHUP)
print(seen)
"""


def test_a_signal_after_openvino_streams_reaches_its_handler():
    """Two pipelined OpenVINO streams whose models are released first to last, then a signal with a
    Python handler: the handler runs and the process exits cleanly. (Each OpenVINO CPU plugin gives
    the thread that creates it an alternate signal stack and puts back the one it found when it goes;
    plugins released out of order left the main thread's pointing at unmapped memory, and the next
    signal killed the process with SIGSEGV.)"""
    done = subprocess.run([sys.executable, "-c", STREAMS_THEN_A_SIGNAL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['SIGHUP']"
