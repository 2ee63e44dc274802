"""Which CPU inference runtime runs the default model's networks fastest: OpenVINO or ONNX Runtime,
against the torch path, on the G-buffer encoder (one latent = 4 frames) and the DiT's cached pass.

Each network's streaming step (model_zoo/runtime/graphs.py) is exported once, run on one thread
(a lane's share of a small CPU), and timed alternately round by round; prints milliseconds (median
over rounds) per backend and precision. Asserts nothing.

    python benchmarks/runtime_choice.py --size 256 --rounds 15
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from alaya_flash.model_zoo import bundle, folders
from alaya_flash.model_zoo.codecs.gbuffer_encoder import GBufferEncoderStream
from alaya_flash.model_zoo.dit import rope_freqs
from alaya_flash.model_zoo.runtime import graphs


def encoder_case(size: int):
    f32 = folders.load_flash(bundle.default_flash_dir(), dtype=torch.float32)
    graph = graphs.EncoderGroup(f32.gbuffer_encoder).eval()
    images = torch.randint(0, 256, (4, 5, size, size, 3), dtype=torch.uint8)
    inputs = (images, *[torch.randn(*s) for s in graph.memory_shapes(size, size)])
    bf16 = folders.load_flash(bundle.default_flash_dir(), dtype=torch.bfloat16)
    stream = GBufferEncoderStream(bf16.gbuffer_encoder)
    stream.encode(images[:1])

    def torch_bf16():
        stream.encode(images)

    return graph, inputs, torch_bf16


def dit_case(size: int):
    f32 = folders.load_flash(bundle.default_flash_dir(), dtype=torch.float32)
    dit, cfg = f32.dit, f32.dit.config
    h = w = size // 16
    n = h * w
    graph = graphs.DiTStep(dit, single_token=True, has_past=True, rotated_keys=False).eval()
    t_emb, t_mod = dit.time_embed(torch.tensor([500.0]))
    rope = rope_freqs(1, 1, h, w, cfg.head_dim, cfg.rope_theta, "cpu")
    past = (cfg.num_layers, 1, cfg.num_heads, n, cfg.head_dim)
    inputs = (torch.randn(1, cfg.in_dim, 1, 2 * h, 2 * w), t_emb, t_mod, torch.zeros(0),
              torch.randn(cfg.num_layers, 1, 1, cfg.dim), rope.real.contiguous(), rope.imag.contiguous(),
              torch.randn(past), torch.randn(past), torch.zeros(n))
    bf16 = folders.load_flash(bundle.default_flash_dir(), dtype=torch.bfloat16).dit
    prompt = bf16.prepare_prompt(torch.randn(1, 1, cfg.text_dim))
    cache = bf16.new_cache(1, 2 * h, 2 * w, window_frames=1, sink_frames=1)
    x = inputs[0]
    with torch.no_grad():
        bf16(x, torch.tensor([0.0]), prompt, cache=cache, start_frame=0)
        bf16(x, torch.tensor([0.0]), prompt, cache=cache, start_frame=1)

    def torch_bf16():
        with torch.no_grad():
            bf16(x, torch.tensor([500.0]), prompt, cache=cache, start_frame=1)

    return graph, inputs, torch_bf16


def openvino_runner(graph, inputs, precision: str):
    import openvino as ov

    from alaya_flash.model_zoo.runtime.openvino import core

    model = ov.convert_model(graph, example_input=tuple(i for i in inputs if i.numel() or True))
    compiled = core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1,
                                                   "INFERENCE_PRECISION_HINT": precision,
                                                   "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    feed = [i.numpy() for i in inputs]
    return lambda: request.infer(feed)


def onnxruntime_runner(graph, inputs, folder: Path):
    import onnxruntime as ort

    path = folder / "g.onnx"
    names = [f"in{i}" for i in range(len(inputs))]
    torch.onnx.export(graph, tuple(inputs), str(path), input_names=names, dynamo=False, opset_version=17)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}  # the exporter drops inputs the graph never reads
    feed = {n: t.numpy() for n, t in zip(names, inputs) if n in wanted}
    return lambda: session.run(None, feed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (("G-buffer encoder, 1 latent (4 frames)", encoder_case), ("DiT cached pass", dit_case)):
            graph, inputs, torch_run = make(args.size)
            runners = {"torch bf16 (fused)": torch_run}
            for precision in ("bf16", "f32"):
                runners[f"openvino {precision}"] = openvino_runner(graph, inputs, precision)
            try:
                runners["onnxruntime f32"] = onnxruntime_runner(graph, inputs, Path(tmp))
            except Exception as err:  # noqa: BLE001  (a missing exporter dependency: say so, keep the others)
                print(f"onnxruntime: not measured ({type(err).__name__}: {str(err).splitlines()[0]})")
            times = {k: [] for k in runners}
            for run in runners.values():  # warm-up
                run()
            for _ in range(args.rounds):
                for k, run in runners.items():
                    t0 = time.perf_counter()
                    run()
                    times[k].append(1000 * (time.perf_counter() - t0))
            print(f"{name}, {args.size}x{args.size}, 1 thread, median of {args.rounds} alternated rounds:")
            base = statistics.median(times["torch bf16 (fused)"])
            for k, v in times.items():
                m = statistics.median(v)
                print(f"  {k:22s} {m:8.2f} ms  ({base / m:.2f}x torch)")


if __name__ == "__main__":
    main()
