"""Benchmark the Flash pipeline (and optionally the teacher) on generated G-buffers.

  alaya-flash bench --size 128 --frames 48 --json
  alaya-flash bench --size 832x448 --dit alayarenderer-teacher --compare-teacher --json   # on a GPU

Drives the Flash stage list (pipelines.flash_steps: encode, sample, decode, refine when the model
has a G-buffer refiner) between a generated npy clip read chunk by chunk and an mp4 (or png) writer,
on the one chunk loop (streaming/render/driver.py), and reports from its per-step timings: steady-state FPS
(after the first chunk), first-frame latency (from the end of setup to the first frames reaching
the writer; `first_frame_cold_s`: the same for the process's first stream, the warm-up, which also
loads the compiled models from their disk cache and builds kernels), p50/p99 latency of a runner tick (`--chunk` frames, from pulling them to their last
step), peak resident memory and per-stage milliseconds per frame (read, encode, sample,
decode, refine, write; the writer encodes on a worker thread, so write is only what the loop still
waits for). --compare-teacher runs the teacher on the same input and size (bidirectional, 50
steps, CFG, full Wan VAE) and prints the speed-up. Without --model the networks have RANDOM
weights (said in the output): speed does not depend on the weights' values.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import args as args_
from ..args import parse_size

HELP = "measure FPS, latency, memory and per-stage time of the Flash pipeline (vs the teacher)"
PROMPT = "a sunny street"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=parse_size, default=(128, 128), metavar="N|WxH", help="frame size (multiples of 16)")
    parser.add_argument("--frames", type=args_.FRAMES, default=48, help="frames to render")
    parser.add_argument("--chunk", type=args_.bounded(int, 1, 4096), default=12, help="frames per runner tick (one AR chunk = 12 frames)")
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + "; default: random weights, configs below")
    parser.add_argument("--dit", default="dit-small", help="DiT config for random weights (alayarenderer-teacher = full "
                        "1.3B); helios-flash-1.3b / helios-flash-small: the Flash release's Helios backbone with "
                        "its compressed-history sampler, its grouped encoder (hidden 128) and taew2_1")
    parser.add_argument("--encoder", default="gbuffer-encoder-slim", help="G-buffer encoder config for random weights")
    parser.add_argument("--decoder", default="taew-slim", help="tiny decoder config for random weights")
    parser.add_argument("--refiner", default="gbuffer-refiner-16-prompt",
                        help="G-buffer refiner config for random weights, or 'none' (with --model the model's own "
                             "refiner, if it has one; 'none' leaves it out)")
    parser.add_argument("--steps", type=args_.STEPS, default=4, help="Flash denoising passes per chunk")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="device")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto", help="weights' dtype")
    parser.add_argument("--compare-teacher", action="store_true", help="also run the teacher (50 steps, CFG 5, full VAE)")
    parser.add_argument("--teacher-steps", type=args_.STEPS, default=50, help="teacher Euler steps")
    parser.add_argument("--format", choices=("mp4", "png"), default="mp4",
                        help="what the Save node writes (png: no video encoder needed, e.g. where PyAV is missing)")
    args_.add_cpu_arguments(parser)
    parser.add_argument("--sessions", type=args_.bounded(int, 1, 16), default=1,
                        help="then also run N streams at once sharing the weights (two live viewers, two batch "
                             "shots): each one's FPS and latency, and the memory an extra session costs")
    parser.add_argument("--busy-neighbour", action="store_true",
                        help="start one busy process beside the renderer for the run (what a game engine is)")
    parser.add_argument("--no-shade", action="store_true",
                        help="leave out the shading prior's timing (`shade`: the passes lit by a Light, on one thread)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _clip(folder: Path, size, frames: int) -> Path:
    """A generated G-buffer clip (npy windows) of the synthetic scene."""
    from ...files.sinks import NpyWindowSink, write_stream
    from ...files.synthetic import synthetic_stream

    h, w = size
    out = folder / "clip"
    write_stream(synthetic_stream(w, h, frames), NpyWindowSink(out, window=16))
    return out


@contextlib.contextmanager
def busy_neighbour(on: bool):
    """One ordinary busy process (a Python loop) beside the renderer while the block runs: what a game
    engine on the same machine is, reproducibly."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def _out(folder: Path, name: str, fmt: str) -> Path:
    """Where the frames go: an mp4 file, or a folder of frames."""
    return folder / (f"{name}.mp4" if fmt == "mp4" else name)


def measure(make_steps, clip: Path, size, frames: int, chunk: int, out: Path, fmt: str = "mp4", sync=None,
            lanes=None) -> dict:
    """Drive read -> make_steps(feed="read") -> write over the clip on the one chunk loop; figures
    from its per-step timings (sync: called after each step, so asynchronous GPU work is billed to
    its own step). Setup (prompt encoding, starting the stages, opening the clip) is timed apart."""
    from ...render.driver import RunStats, StageGraph, Step, drive
    from ...values import gbuffer_chunks
    from ...files.readers import open_gbuffers
    from ...files.sinks import FrameWriter

    start = time.perf_counter()
    steps = make_steps(feed="read")
    writer = FrameWriter(out, fmt, fps=16.0, overwrite=True)
    steps.append(Step("write", writer, {"images": (steps[-1].name, 0)}, outputs=0))
    stream = open_gbuffers(clip, "npy-windows", stop=frames, size=size, resize="stretch")
    source = ((g,) for g in gbuffer_chunks(stream, chunk))
    stats = drive(StageGraph(["read"], steps, sync=sync), {"read": source}, stats=RunStats(), start=start, lanes=lanes)
    loop = stats.seconds - stats.setup_seconds
    first_tick = (stats.first_chunk_seconds or stats.seconds) - stats.setup_seconds
    steady_frames = stats.frames - stats.first_chunk_frames
    steady = steady_frames / (loop - first_tick) if steady_frames and loop > first_tick else stats.frames / loop
    ticks = stats.tick_latencies[1:] or stats.tick_latencies  # after the first tick (it pays one-off costs)
    return {
        "frames": stats.frames,
        "fps_steady": round(steady, 3),
        "fps_overall": round(stats.frames / loop, 3),
        "first_frame_latency_s": round(stats.first_output_seconds or 0.0, 3),
        "ms_per_frame": {k: round(1000 * v / max(1, stats.frames), 2) for k, v in stats.node_seconds.items()},
        "chunk_latency_ms": {"p50": _percentile(ticks, 50), "p99": _percentile(ticks, 99)},
        "seconds": round(loop, 2),
    }


def _percentile(seconds: list[float], q: float) -> float:
    """The q-th percentile of `seconds` in milliseconds (nearest rank), 0 when empty."""
    if not seconds:
        return 0.0
    ordered = sorted(seconds)
    rank = max(0, min(len(ordered) - 1, -(-len(ordered) * q // 100) - 1))
    return round(1000 * ordered[int(rank)], 2)


def concurrent_sessions(count: int, make_steps, clip: Path, size, frames: int, chunk: int, folder: Path, fmt: str,
                        device, threads: int) -> dict:
    """`count` streams at once over one model (each its own stream state, writer and thread; on CUDA
    each on its own stream), measured like one: per-stream figures, their sum, and memory."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.max_memory_allocated(device)

    def one(i: int) -> dict:
        torch.set_num_threads(max(1, threads // count))  # this thread's share of the CPU
        if not cuda:
            return measure(make_steps, clip, size, frames, chunk, _out(folder, f"session-{i}", fmt), fmt)
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            return measure(make_steps, clip, size, frames, chunk, _out(folder, f"session-{i}", fmt), fmt,
                           sync=stream.synchronize)

    with ThreadPoolExecutor(count, thread_name_prefix="alaya-bench-session") as pool:
        runs = list(pool.map(one, range(count)))
    out = {"count": count, "fps_steady": [r["fps_steady"] for r in runs],
           "fps_steady_total": round(sum(r["fps_steady"] for r in runs), 3),
           "first_frame_latency_s": [r["first_frame_latency_s"] for r in runs],
           "chunk_latency_ms": [r["chunk_latency_ms"] for r in runs]}
    if cuda:
        out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        out["gpu_mib_per_session_beyond_weights"] = round((torch.cuda.max_memory_allocated(device) - before) / 2**20 / count, 1)
    return out


def shade_timing(clip: Path, size, frames: int, chunk: int, prior) -> dict:
    """The model's shading prior (`prior`, lighting.model_prior) over the clip's G-buffers, chunk by chunk on ONE
    torch thread (its budget: a core beside the networks): median and worst ms per frame, after a
    warm-up chunk, as wall-clock time and as the thread's own CPU time (what it costs a core; on a
    shared machine the wall clock also counts the time other processes hold it)."""
    import torch

    from ....model_zoo.light import Light, pack
    from ...values import gbuffer_chunks
    from ...files.readers import open_gbuffers

    light = pack(Light())[0]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        per_frame, cpu_per_frame = [], []
        with torch.inference_mode():
            stream = open_gbuffers(clip, "npy-windows", stop=frames, size=size, resize="stretch")
            for k, g in enumerate(gbuffer_chunks(stream, chunk)):
                t0, c0 = time.perf_counter(), time.thread_time()
                prior(g.images, light, depth_near=g.depth_near)
                if k:  # the first chunk pays one-off costs
                    per_frame.append((time.perf_counter() - t0) / len(g))
                    cpu_per_frame.append((time.thread_time() - c0) / len(g))
    finally:
        torch.set_num_threads(before)
    per_frame, cpu_per_frame = per_frame or [0.0], cpu_per_frame or [0.0]
    return {"ms_per_frame_median": _percentile(per_frame, 50), "ms_per_frame_worst": _percentile(per_frame, 100),
            "cpu_ms_per_frame_median": _percentile(cpu_per_frame, 50), "threads": 1, "chunks": len(per_frame),
            "reflections": prior.config.reflections}


def run(args) -> int:
    import dataclasses

    import torch

    from ....model_zoo import bundle, folders, precision, runtime
    from ....model_zoo.errors import AlayaError
    from ...render import pipelines
    from ...render.cpu import cpu_plan
    from ...values import PromptSchedule

    h, w = args.size
    if h % 16 or w % 16:
        raise AlayaError(f"--size {w}x{h}: width and height must be multiples of 16 (8 for the codecs x 2 for the DiT's patches)")
    if args.frames < 1 or args.chunk < 1:
        raise AlayaError("--frames and --chunk must be at least 1")
    dev = precision.choose_device(args.device)
    dtype = precision.choose_dtype(args.precision, dev)
    if args.model:
        flash = folders.load_flash(args.model, dev, dtype)
        if args.refiner == "none":
            flash.refiner = None
    elif args.dit.startswith("helios-"):
        from ....model_zoo.release import make_random_release

        flash = make_random_release(args.dit, dev, dtype)
        args.encoder, args.decoder, args.refiner = "release grouped encoder (hidden 128)", "taew2_1", "none"
    else:
        flash = bundle.make_random_flash(args.dit, args.encoder, args.decoder, device=dev, dtype=dtype,
                                         refiner=None if args.refiner == "none" else args.refiner)
    flash = runtime.accelerate(flash, args.backend)  # (the weights' networks, compiled where chosen)
    plan = cpu_plan(args.threads, lanes=not args.no_pipeline and dev.type == "cpu")
    plan.apply()  # (cli.main configured the same plan; this one also knows the device chosen)
    result = {"size": [w, h], "frames": args.frames, "device": str(dev), "dtype": str(dtype).replace("torch.", ""),
              "weights": str(args.model) if args.model else f"RANDOM ({args.dit}, {args.encoder}, {args.decoder}, {args.refiner})",
              "torch_threads": plan.threads, "cpu": plan.describe(), "busy_neighbour": args.busy_neighbour,
              "backend": runtime.backend_of(flash)}
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="alaya-bench-") as tmp, busy_neighbour(args.busy_neighbour):
        tmp = Path(tmp)
        clip = _clip(tmp, args.size, args.frames)
        s = flash.settings

        def flash_steps(feed):
            prompts = PromptSchedule.encode(flash.text_encoder(), PROMPT)
            return pipelines.flash_steps(flash, prompts, seed=0, feed=feed, steps=args.steps, chunk_frames=s.chunk_frames,
                                         window_frames=s.window_frames, sink_frames=s.sink_frames)

        # Warm-up: a throwaway 5-frame stream at the same size, so that one-off costs (oneDNN building its
        # kernels for each new shape, first allocations) stay out of the first-frame figure, as after any
        # earlier stream in a long-running process (the live server, ComfyUI).
        # Its first frame is the process's first: compiled models read from their disk cache, kernels built.
        t0 = time.perf_counter()
        warm = measure(flash_steps, clip, args.size, min(args.frames, 5), args.chunk, _out(tmp, "warm-up", args.format),
                       args.format, sync, plan.lanes)
        result["warm_up_s"] = round(time.perf_counter() - t0, 3)
        result["first_frame_cold_s"] = warm["first_frame_latency_s"]
        result["flash"] = measure(flash_steps, clip, args.size, args.frames, args.chunk, _out(tmp, "flash", args.format),
                                  args.format, sync, plan.lanes)
        if not args.no_shade:
            from ...render.lighting import model_prior

            result["shade"] = shade_timing(clip, args.size, args.frames, args.chunk, model_prior(flash))
        if args.sessions > 1:
            result["sessions"] = concurrent_sessions(args.sessions, flash_steps, clip, args.size, args.frames, args.chunk,
                                                     tmp, args.format, dev, plan.threads)
        if args.compare_teacher:
            teacher = bundle.make_random_teacher(args.dit, "wan2.1-vae", device=dev, dtype=dtype)
            teacher.dit = flash.dit  # same DiT architecture as the student (the paper's setting)
            teacher._text = flash._text
            teacher.settings = dataclasses.replace(teacher.settings, steps=args.teacher_steps)

            def teacher_steps(feed):
                text = teacher.text_encoder()
                return pipelines.teacher_steps(teacher, PromptSchedule.encode(text, PROMPT), text(["blurry"]), seed=0,
                                               feed=feed, steps=args.teacher_steps, cfg=5.0, shift=5.0)

            result["teacher"] = measure(teacher_steps, clip, args.size, args.frames, args.chunk,
                                        _out(tmp, "teacher", args.format), args.format, sync)
            result["speedup"] = round(result["flash"]["fps_overall"] / max(1e-9, result["teacher"]["fps_overall"]), 2)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if dev.type == "cuda":  # weights, activations and KV cache live on the GPU: its peak is the figure that matters
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
        result["gpu"] = torch.cuda.get_device_name(dev)
    if args.json:
        print(json.dumps(result))
    else:
        f = result["flash"]
        print(f"Flash {w}x{h}, {args.frames} frames, {result['weights']}, {result['cpu']}"
              f"{', beside a busy process' if args.busy_neighbour else ''}: {f['fps_steady']} FPS steady, "
              f"first frames after {f['first_frame_latency_s']} s, ms/frame {f['ms_per_frame']}, peak RSS {result['peak_rss_mib']} MiB")
        if "shade" in result:
            print(f"shade (shading prior, one thread): {result['shade']['ms_per_frame_median']} ms/frame median, "
                  f"{result['shade']['ms_per_frame_worst']} worst, {result['shade']['cpu_ms_per_frame_median']} CPU")
        if "sessions" in result:
            ss = result["sessions"]
            print(f"{ss['count']} sessions at once: {ss['fps_steady']} FPS steady each ({ss['fps_steady_total']} in all)"
                  + (f", {ss['gpu_mib_per_session_beyond_weights']} MiB of GPU memory per session beyond the weights"
                     if "peak_gpu_mib" in ss else ""))
        if "teacher" in result:
            print(f"teacher: {result['teacher']['fps_overall']} FPS; speed-up {result['speedup']}x")
    if result["weights"].startswith("RANDOM") and not args.quiet:
        print("alaya-flash: note: random weights (no model given): the frames are noise, the timings are real", file=sys.stderr)
    return 0
