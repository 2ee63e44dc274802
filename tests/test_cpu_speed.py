"""The CPU speed work changes how frames are computed, never which frames: fused convolutions and
the lanes against the plain ops and the serial loop; the lanes' scheduling and errors."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from alaya_flash import model_zoo
from alaya_flash.model_zoo import bundle, fused
from alaya_flash.model_zoo.codecs import gbuffer_encoder
from alaya_flash.streaming.values import GBuffers, gbuffer_chunks
from alaya_flash.streaming.render.cpu import cpu_plan
from alaya_flash.streaming.render.driver import Lanes, StageGraph, Step, balanced_cuts, drive, ticks
from alaya_flash.streaming.files.synthetic import synthetic_stream
from stream_helpers import render_ticks

DEFAULT = Path(model_zoo.__file__).parent / "default"


_render = render_ticks  # stream_helpers: the frames through the driver's ticks


def _clip(size: int, frames: int) -> list[GBuffers]:
    return list(gbuffer_chunks(synthetic_stream(size, size, frames), 4))


def test_default_model_frames_are_unchanged_by_fusion_and_lanes(monkeypatch):
    """The shipped model in bf16: fused ops and folded pools on 2 lanes against plain ops
    and separate pools in one loop."""
    flash = bundle.load_flash_folder(DEFAULT, torch.device("cpu"), torch.bfloat16)
    chunks = _clip(64, 13)
    fast = _render(flash, chunks, Lanes(threads=(1, 1)))
    monkeypatch.setattr(fused, "FUSED_OP", False)
    monkeypatch.setattr(gbuffer_encoder, "fold_pools", lambda stack: stack)  # the encoder's pools unfolded
    plain = _render(flash, chunks)
    assert fast.shape == plain.shape == (13, 64, 64, 3)
    psnr = 10 * torch.log10(1 / ((fast - plain) ** 2).mean())
    assert psnr > 40, f"{psnr:.1f} dB"  # bf16 rounding only (one bf16 step per fused add)
    assert (fast - plain).abs().max() < 0.05


def test_float32_renders_take_no_fused_op(monkeypatch):
    """float32 keeps the plain ops, so its bit-for-bit guarantees (chunked == whole) hold."""
    flash = bundle.make_random_flash(seed=1, dtype=torch.float32, refiner="gbuffer-refiner-16")
    chunks = [GBuffers(torch.randint(0, 256, (5, 5, 16, 16, 3), dtype=torch.uint8))]
    real, fast = fused.fusable, []
    monkeypatch.setattr(fused, "fusable", lambda x: fast.append(real(x)) or fast[-1])
    out = _render(flash, chunks)
    assert fast and not any(fast)  # asked at every convolution, and never fused
    monkeypatch.setattr(fused, "FUSED_OP", False)
    assert torch.equal(out, _render(flash, chunks))


@pytest.mark.skipif(not fused.FUSED_OP, reason="this PyTorch build has no oneDNN pointwise convolution")
def test_fused_conv_matches_the_separate_ops():
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(2, 8, 12, 12).bfloat16().contiguous(memory_format=cl)
    w, b = torch.randn(6, 8, 3, 3).bfloat16(), torch.randn(6).bfloat16()
    add = torch.randn(2, 6, 6, 6).bfloat16()
    with torch.no_grad():
        for stride in (1, 2):
            ref = torch.nn.functional.conv2d(x, w, b, stride, 1)
            extra = add if stride == 2 else None
            got = fused.conv2d(x, w, b, stride, 1, relu=True, add=extra)
            want = torch.relu(ref + extra if extra is not None else ref)
            assert got.shape == want.shape
            assert (got.float() - want.float()).abs().max() <= 0.02 * want.abs().max().float()
        one = x[:1]  # a one-frame view whose batch stride is not canonical
        view = one.as_strided(one.shape, (7, *one.stride()[1:]))
        got = fused.conv2d(view, w, b, 1, 1, relu=True, add=torch.ones(1, 6, 12, 12).bfloat16())
        want = torch.relu(torch.nn.functional.conv2d(one, w, b, 1, 1) + 1)
        assert (got.float() - want.float()).abs().max() <= 0.02 * want.abs().max().float()
    layer = torch.nn.Linear(8, 16).bfloat16()
    h = torch.randn(3, 8).bfloat16()
    with torch.no_grad():
        want = torch.nn.functional.gelu(layer(h), approximate="tanh")
        assert (fused.linear_gelu(h, layer).float() - want.float()).abs().max() < 0.05


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_dtype_takes_the_fused_path_only_where_this_cpu_runs_it(dtype):
    """oneDNN's fp16 kernels need AVX512-FP16 or AVX-NE-CONVERT and fail outright without them (an AMD
    EPYC with AVX512-BF16 does): `fusable` follows what the fused ops did on this CPU, and a model in
    that dtype renders either way."""
    x = torch.randn(1, 8, 12, 12).to(dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8, 8, 3, 3).to(dtype)
    try:
        with torch.no_grad():
            torch.ops.mkldnn._convolution_pointwise(x, w, None, [1, 1], [1, 1], [1, 1], 1, "relu", [], "")
            torch.ops.mkldnn._linear_pointwise(x[0, 0], torch.randn(4, 12).to(dtype), None, "gelu", [], "tanh")
        runs = True
    except (AttributeError, RuntimeError):
        runs = False
    with torch.no_grad():
        assert fused.fusable(x) == runs
        got = fused.conv2d(x, w, None, 1, 1, relu=True, add=torch.ones(1, 8, 12, 12).to(dtype))
        want = torch.relu(torch.nn.functional.conv2d(x.float(), w.float(), None, 1, 1) + 1)
        assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()
        layer = torch.nn.Linear(12, 16).to(dtype)
        h = torch.randn(3, 12).to(dtype)
        want = torch.nn.functional.gelu(torch.nn.functional.linear(h.float(), layer.weight.float(), layer.bias.float()),
                                        approximate="tanh")
        assert (fused.linear_gelu(h, layer).float() - want).abs().max() < 0.05
    flash = bundle.make_random_flash(seed=1, dtype=dtype, refiner="gbuffer-refiner-16")
    frames = _render(flash, [GBuffers(torch.randint(0, 256, (5, 5, 16, 16, 3), dtype=torch.uint8))])
    assert frames.shape == (5, 16, 16, 3) and frames.isfinite().all()


class _Add:
    """A toy stage: adds its amount, remembers the thread that ran it, can fail at a given call."""

    def __init__(self, amount, fail_at=None, threads=None):
        self.amount, self.fail_at, self.calls, self.threads = amount, fail_at, 0, threads
        self.aborted = False

    def step(self, x):
        self.calls += 1
        if self.threads is not None:
            self.threads.add(threading.current_thread().name)
        if self.fail_at == self.calls:
            raise RuntimeError(f"stage failed at call {self.calls}")
        return None if x is None else x + self.amount

    def flush(self):
        return None

    def abort(self):
        self.aborted = True


def _graph(fail_at=None, names=None):
    stages = [_Add(1, threads=names), _Add(10, threads=names), _Add(100, fail_at, threads=names)]
    steps = [Step("a", stages[0], {"x": ("feed", 0)}, single=True), Step("b", stages[1], {"x": ("a", 0)}, single=True),
             Step("c", stages[2], {"x": ("b", 0)}, single=True)]
    return StageGraph(["feed"], steps), stages


@pytest.mark.parametrize("lanes", [Lanes(threads=(1, 1)), Lanes(threads=(1, 1, 1)), Lanes(threads=(1, 1), split=("c",)),
                                   Lanes(threads=(1, 1), measure=0)])
def test_lanes_give_the_serial_ticks_in_order(lanes):
    serial, _ = _graph()
    want = [(v["c"], n, final) for v, n, final in ticks(serial, {"feed": ((torch.tensor([i]),) for i in range(9))})]
    names = set()
    graph, _ = _graph(names=names)
    got = [(v["c"], n, final) for v, n, final in ticks(graph, {"feed": ((torch.tensor([i]),) for i in range(9))}, lanes=lanes)]
    def plain(rows):
        return [(None if v is None or v[0] is None else v[0].item(), n, f) for v, n, f in rows]

    assert plain(got) == plain(want) and len(want) == 10
    assert any(n.startswith("alaya-lane1") for n in names) and threading.current_thread().name not in names


def test_a_failing_lane_aborts_every_stage_and_leaves_no_thread():
    graph, stages = _graph(fail_at=5)
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(RuntimeError, match="call 5"):
        for _ in ticks(graph, {"feed": ((torch.tensor([i]),) for i in range(20))}, lanes=Lanes(threads=(1, 1))):
            pass
    assert all(s.aborted for s in stages)
    assert stages[0].calls < 20  # the feed stopped soon after the failure
    assert not [t for t in threading.enumerate() if t.name.startswith("alaya-lane") and t.name not in before]


def test_should_stop_finishes_the_ticks_in_flight_then_flushes():
    graph, stages = _graph()
    seen = []
    stats = drive(graph, {"feed": ((torch.tensor([i]),) for i in range(50))}, should_stop=lambda: len(seen) >= 3,
                  progress=lambda s: seen.append(s.ticks), lanes=Lanes(threads=(1, 1)))
    assert stats.ticks == stages[2].calls - 0 and stats.ticks < 50
    assert stages[0].calls == stages[1].calls == stages[2].calls  # every pulled tick went through every step


def test_balanced_cuts():
    assert balanced_cuts([33, 20, 9, 12, 1], 2) == [1]  # encode | sample decode refine write
    assert balanced_cuts([5, 5, 5, 5], 2) == [2]
    assert balanced_cuts([1, 1, 10], 2) == [2]
    assert balanced_cuts([4, 4, 4], 3) == [1, 2]
    assert balanced_cuts([7], 2) == []
    assert balanced_cuts([0, 0, 0], 2) == [1]


def test_lanes_refuse_an_unknown_split_step():
    graph, _ = _graph()
    with pytest.raises(ValueError, match="no step named 'nope'"):
        Lanes(split=("nope",)).groups(graph)


def test_cpu_plan():
    assert cpu_plan(1).lanes is None and cpu_plan(1).threads == 1
    assert cpu_plan(2).lanes.threads == (1, 1)
    assert cpu_plan(5).lanes.threads == (2, 3)
    assert cpu_plan(4, lanes=False).lanes is None
    assert "on 2 lanes" in cpu_plan(2).describe() and "one lane" in cpu_plan(3, lanes=False).describe()
    with pytest.raises(ValueError, match="at least 1"):
        cpu_plan(0)


def test_first_chunk_is_the_first_frame_alone():
    sizes = [len(c) for c in gbuffer_chunks(synthetic_stream(16, 16, 14), 4)]
    assert sizes == [1, 4, 4, 4, 1]
    assert [len(c) for c in gbuffer_chunks(synthetic_stream(16, 16, 3), 1)] == [1, 1, 1]


def test_configure_sets_the_process_plan_and_the_cli_refuses_bad_threads(monkeypatch, capsys):
    from alaya_flash.streaming.cli import main
    from alaya_flash.streaming.render import cpu

    monkeypatch.setattr(cpu, "_configured", None)
    assert cpu.configured_lanes() is None  # nothing configured: library callers keep the serial loop
    threads = torch.get_num_threads()
    try:
        assert cpu.configure(1).lanes is None and torch.get_num_threads() == 1
        assert cpu.configure(2, lanes=False).lanes is None and torch.get_num_threads() == 2
        if not torch.cuda.is_available():
            assert cpu.configure(2).lanes == Lanes(threads=(1, 1)) == cpu.configured_lanes()
    finally:
        torch.set_num_threads(threads)
    assert main(["render", "x", "--prompt", "p", "--out", "y.mp4", "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


def test_cached_key_rotations_equal_rotating_every_key_on_every_pass(monkeypatch):
    """Relative RoPE keeps the held frames' rotated keys between a chunk's passes; past the window
    (evictions move every frame) the frames must equal rotating all keys each pass, bit for bit."""
    from alaya_flash.model_zoo.kv_cache import KVCache

    flash = bundle.load_flash_folder(DEFAULT, torch.device("cpu"), torch.bfloat16)
    assert flash.settings.window_frames + flash.settings.sink_frames < 10  # 37 frames = 10 latents: evictions
    chunks = _clip(32, 37)
    kept = _render(flash, chunks)

    def every_time(self, layer, rotate):
        end = self.frames * self.tokens_per_frame
        return rotate(self.k[layer, :, :, :end], 0)

    monkeypatch.setattr(KVCache, "rotated_keys", every_time)
    assert torch.equal(kept, _render(flash, chunks))


def test_a_live_stream_thread_takes_one_thread_when_lanes_are_planned(monkeypatch):
    from alaya_flash.streaming.render import cpu

    seen = {}

    def stream(key):
        cpu.use_stream_threads()
        seen[key] = torch.get_num_threads()

    for key, plan in (("lanes", cpu.CpuPlan(2, Lanes(threads=(1, 1)))), ("serial", cpu.CpuPlan(2, None))):
        monkeypatch.setattr(cpu, "_configured", plan)
        t = threading.Thread(target=stream, args=(key,))
        t.start()
        t.join()
    assert seen == {"lanes": 1, "serial": 2}


def test_one_token_prompts_skip_the_cross_attention_query():
    """A pooled prompt (text_len 1): every query reads the one value, so the block adds o(v)."""
    from alaya_flash.model_zoo import dit

    torch.manual_seed(0)
    block = dit.Block(dit.CONFIGS["dit-tiny"]).eval()
    x = torch.randn(1, 12, block.cross_attn.q.in_features)
    heads = block.cross_attn.num_heads
    k, v = torch.randn(1, heads, 1, 32 // heads), torch.randn(1, heads, 1, 32 // heads)
    full = block.cross_attn(torch.nn.functional.layer_norm(x, x.shape[-1:]), k, v)
    with torch.no_grad():
        short = block.cross_attn.single_key(v).expand_as(full)
    assert torch.allclose(full, short, atol=1e-6)


def test_lanes_give_the_one_thread_frames_bit_for_bit():
    """Each lane runs its stages on one thread, so the CLI's default on lanes renders exactly what
    `--threads 1` renders (a frame's last bits depend on the thread count, docs/runner.md)."""
    flash = bundle.load_flash_folder(DEFAULT, torch.device("cpu"), torch.bfloat16)
    chunks = _clip(32, 9)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        serial = _render(flash, chunks)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(serial, _render(flash, chunks, Lanes(threads=(1, 1))))
