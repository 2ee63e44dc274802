"""Benchmark the Flash pipeline (and optionally the teacher) on generated G-buffers.

  alaya-flash bench --size 128 --frames 48 --json
  alaya-flash bench --size 832x448 --dit alayarenderer-teacher --compare-teacher --json   # on a GPU

Runs the standard render workflow through the streaming runner (Load G-Buffers from a generated
npy clip, Encode G-Buffers, Flash Sampler, Decode, Refine when the model has a G-buffer refiner,
Save mp4) and reports, from the runner's per-node timings: steady-state FPS (after the first
chunk), first-frame latency (from the end of model loading to the first frames reaching the
sink), peak resident memory and per-stage milliseconds per frame (read, encode, sample, decode,
refine, write; the Save node encodes on a
worker thread, so write is only what the loop still waits for). --compare-teacher runs
the teacher on the same input and size (bidirectional, 50 steps, CFG, full Wan VAE) and prints
the speed-up. Without --model the networks have RANDOM weights (said in the output): speed does
not depend on the weights' values.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

from .world import parse_size

HELP = "measure FPS, latency, memory and per-stage time of the Flash pipeline (vs the teacher)"
STAGES = {"AlayaFlash_LoadGBuffers": "read", "AlayaFlash_EncodeGBuffers": "encode", "AlayaFlash_FlashSampler": "sample",
          "AlayaFlash_TeacherSampler": "sample", "AlayaFlash_Decode": "decode", "AlayaFlash_Refine": "refine",
          "AlayaFlash_Save": "write"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=parse_size, default=(128, 128), metavar="N|WxH", help="frame size (multiples of 16)")
    parser.add_argument("--frames", type=int, default=48, help="frames to render")
    parser.add_argument("--chunk", type=int, default=12, help="frames per runner tick (one AR chunk = 12 frames)")
    parser.add_argument("--model", type=Path, help="Flash model folder (default: random weights, configs below)")
    parser.add_argument("--dit", default="dit-small", help="DiT config for random weights (alayarenderer-teacher = full 1.3B)")
    parser.add_argument("--encoder", default="gbuffer-encoder-slim", help="G-buffer encoder config for random weights")
    parser.add_argument("--decoder", default="taew-slim", help="tiny decoder config for random weights")
    parser.add_argument("--refiner", default="gbuffer-refiner-16-prompt",
                        help="G-buffer refiner config for random weights, or 'none' (with --model the model's own "
                             "refiner, if it has one; 'none' leaves it out)")
    parser.add_argument("--steps", type=int, default=4, help="Flash denoising passes per chunk")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="device")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto", help="weights' dtype")
    parser.add_argument("--compare-teacher", action="store_true", help="also run the teacher (50 steps, CFG 5, full VAE)")
    parser.add_argument("--teacher-steps", type=int, default=50, help="teacher Euler steps")
    parser.add_argument("--format", choices=("mp4", "png"), default="mp4",
                        help="what the Save node writes (png: no video encoder needed, e.g. where PyAV is missing)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _clip(folder: Path, size, frames: int) -> Path:
    """A generated G-buffer clip (npy windows) of the synthetic scene."""
    from ..sinks import NpyWindowSink, write_stream
    from ..synthetic import synthetic_stream

    h, w = size
    out = folder / "clip"
    write_stream(synthetic_stream(w, h, frames), NpyWindowSink(out, window=16))
    return out


def _out(folder: Path, name: str, fmt: str) -> Path:
    """The Save node's destination: an mp4 file, or a folder of frames."""
    return folder / (f"{name}.mp4" if fmt == "mp4" else name)


def _graph(clip: Path, size, frames: int, chunk: int, steps: int, out: Path, sampler: dict, fmt: str = "mp4",
           refine: bool = False) -> dict:
    h, w = size
    load = {"path": str(clip), "layout": "npy-windows", "start": 0, "frames": frames, "stride": 1, "resize": "stretch",
            "width": w, "height": h, "chunk": chunk}
    return {
        "1": {"class_type": "AlayaFlash_LoadGBuffers", "inputs": load},
        "3": {"class_type": "AlayaFlash_EncodePrompt", "inputs": {"text_encoder": ["2", 3], "text": "a sunny street"}},
        "4": {"class_type": "AlayaFlash_EncodeGBuffers", "inputs": {"gbuffer_encoder": ["2", 1], "gbuffers": ["1", 0]}},
        "5": sampler,
        "6": {"class_type": "AlayaFlash_Decode", "inputs": {"decoder": ["2", 2], "latents": ["5", 0]}},
        **({"8": {"class_type": "AlayaFlash_Refine", "inputs": {"refiner": ["2", 4], "images": ["6", 0], "gbuffers": ["1", 0],
                                                                    "prompt": ["3", 0]}}}
           if refine else {}),
        "7": {"class_type": "AlayaFlash_Save", "inputs": {"images": ["8" if refine else "6", 0], "filename": str(out),
                                                          "format": fmt, "fps": 16.0, "overwrite": True}},
    }


def measure(graph: dict, models: tuple, frames: int, chunk: int, sync=None) -> dict:
    """Run a graph with pre-loaded model outputs for node "2"; figures from the runner's timings
    (sync: called after each node's step, so asynchronous GPU work is billed to its own node)."""
    from ...nodes import NODE_CLASS_MAPPINGS
    from ..runner import StreamRunner
    from ..workflow import parse_workflow

    graph = dict(graph)
    graph["2"] = {"class_type": "_Models", "inputs": {}}
    classes = {**NODE_CLASS_MAPPINGS, "_Models": _models_node(models)}
    stats = StreamRunner(parse_workflow(graph, classes), classes, sync=sync).run()
    per_stage: dict[str, float] = {}
    for nid, sec in stats.node_seconds.items():
        stage = STAGES.get(graph[nid]["class_type"])
        if stage:
            per_stage[stage] = per_stage.get(stage, 0.0) + sec
    loop = stats.seconds - stats.setup_seconds
    first_tick = (stats.first_chunk_seconds or stats.seconds) - stats.setup_seconds
    steady_frames = stats.frames - min(chunk, stats.frames)
    steady = steady_frames / (loop - first_tick) if steady_frames and loop > first_tick else stats.frames / loop
    return {
        "frames": stats.frames,
        "fps_steady": round(steady, 3),
        "fps_overall": round(stats.frames / loop, 3),
        "first_frame_latency_s": round(stats.first_output_seconds or 0.0, 3),
        "ms_per_frame": {k: round(1000 * v / max(1, stats.frames), 2) for k, v in per_stage.items()},
        "seconds": round(loop, 2),
    }


def _models_node(outputs: tuple):
    class _Models:
        RETURN_TYPES = ("ALAYA_FLASH" if outputs[0].kind == "flash" else "ALAYA_TEACHER",
                        "ALAYA_GBUFFER_ENCODER", "ALAYA_DECODER", "ALAYA_TEXT_ENCODER", "ALAYA_REFINER")[:len(outputs)]
        FUNCTION = "get"
        CATEGORY = "bench"

        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        def get(self):
            return outputs

    return _Models


def run(args) -> int:
    import dataclasses

    import torch

    from ...model_zoo import bundle
    from ...model_zoo.errors import AlayaError
    from ...nodes import comfy
    from ...nodes.models import DecoderHandle, EncoderHandle, RefinerHandle, TextHandle

    h, w = args.size
    if h % 16 or w % 16:
        raise AlayaError(f"--size {w}x{h}: width and height must be multiples of 16 (8 for the codecs x 2 for the DiT's patches)")
    if args.frames < 1 or args.chunk < 1:
        raise AlayaError("--frames and --chunk must be at least 1")
    dev = comfy.torch_device(args.device)
    dtype = comfy.torch_dtype(args.precision, dev)
    if args.model:
        flash = bundle.load_flash(args.model, dev, dtype)
        if args.refiner == "none":
            flash.refiner = None
    else:
        flash = bundle.make_random_flash(args.dit, args.encoder, args.decoder, device=dev, dtype=dtype,
                                         refiner=None if args.refiner == "none" else args.refiner)
    result = {"size": [w, h], "frames": args.frames, "device": str(dev), "dtype": str(dtype).replace("torch.", ""),
              "weights": str(args.model) if args.model else f"RANDOM ({args.dit}, {args.encoder}, {args.decoder}, {args.refiner})",
              "torch_threads": torch.get_num_threads()}
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="alaya-bench-") as tmp:
        tmp = Path(tmp)
        clip = _clip(tmp, args.size, args.frames)
        s = flash.settings
        sampler = {"class_type": "AlayaFlash_FlashSampler", "inputs": {
            "model": ["2", 0], "cond": ["4", 0], "prompt": ["3", 0], "seed": 0, "steps": args.steps,
            "chunk_frames": s.chunk_frames, "window_frames": s.window_frames, "sink_frames": s.sink_frames}}
        models = (flash, EncoderHandle("flash", flash.gbuffer_encoder), DecoderHandle("tiny", flash.decoder), TextHandle(flash),
                  RefinerHandle(flash.refiner))
        graph = _graph(clip, args.size, args.frames, args.chunk, args.steps, _out(tmp, "flash", args.format), sampler,
                       args.format, refine=flash.refiner is not None)
        result["flash"] = measure(graph, models, args.frames, args.chunk, sync)
        if args.compare_teacher:
            teacher = bundle.make_random_teacher(args.dit, "wan2.1-vae", device=dev, dtype=dtype)
            teacher.dit = flash.dit  # same DiT architecture as the student (the paper's setting)
            teacher._text = flash._text
            teacher.settings = dataclasses.replace(teacher.settings, steps=args.teacher_steps)
            tsampler = {"class_type": "AlayaFlash_TeacherSampler", "inputs": {
                "model": ["2", 0], "cond": ["4", 0], "prompt": ["3", 0], "negative_prompt": "blurry", "seed": 0,
                "steps": args.teacher_steps, "cfg": 5.0, "shift": 5.0}}
            tmodels = (teacher, EncoderHandle("teacher", teacher.vae, teacher.settings.window_frames),
                       DecoderHandle("vae", teacher.vae), TextHandle(teacher))
            graph = _graph(clip, args.size, args.frames, args.chunk, args.steps, _out(tmp, "teacher", args.format),
                           tsampler, args.format)
            result["teacher"] = measure(graph, tmodels, args.frames, args.chunk, sync)
            result["speedup"] = round(result["flash"]["fps_overall"] / max(1e-9, result["teacher"]["fps_overall"]), 2)
    result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if dev.type == "cuda":  # weights, activations and KV cache live on the GPU: its peak is the figure that matters
        result["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
        result["gpu"] = torch.cuda.get_device_name(dev)
    if args.json:
        print(json.dumps(result))
    else:
        f = result["flash"]
        print(f"Flash {w}x{h}, {args.frames} frames, {result['weights']}: {f['fps_steady']} FPS steady, "
              f"first frames after {f['first_frame_latency_s']} s, ms/frame {f['ms_per_frame']}, peak RSS {result['peak_rss_mib']} MiB")
        if "teacher" in result:
            print(f"teacher: {result['teacher']['fps_overall']} FPS; speed-up {result['speedup']}x")
    if result["weights"].startswith("RANDOM") and not args.quiet:
        print("alaya-flash: note: random weights (no model given): the frames are noise, the timings are real", file=sys.stderr)
    return 0
