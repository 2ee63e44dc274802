"""Full INT8 (weights and activations) for the G-buffer encoder and the DiT's cached pass: NNCF
post-training quantization calibrated on real frames, measured against the shipped OpenVINO bf16
graphs and the torch path. Prints figures, asserts nothing; ships nothing (docs/benchmarks.md: not
within the issue's bounds on every clip). Needs nncf (pip install nncf).

    python benchmarks/int8_static.py --size 256 --frames 32 --rounds 9

Calibration: the bundled demo stream (the physics world, seed 0, the demo prompt) rendered through
the OpenVINO pipeline, every encoder group's and DiT pass's inputs recorded (the encoder's memory
read from its infer request). The encoder is quantized as a stateless graph (memory in and out),
then made stateful as the backend runs it. Quality: a held-out eval clip (training/eval.py's first,
first preset and its held-out wording) rendered by torch, OpenVINO bf16 and OpenVINO with the INT8
encoder and DiT: PSNR against the clip's truth and against the torch frames. Speed: one thread, one
encoder group and one DiT pass, the bf16 and INT8 compiled models alternated round by round (medians).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def render(flash, images: torch.Tensor, prompt: str) -> torch.Tensor:
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.values import GBuffers, PromptSchedule

    s = flash.settings
    pipe = pl.FlashPipeline(flash, PromptSchedule.encode(flash.text_encoder(), prompt), seed=0,
                            chunk_frames=s.chunk_frames, window_frames=s.window_frames, sink_frames=s.sink_frames)
    outs = [pipe.step(GBuffers(c)) for c in images.split(4)] + [pipe.flush()]
    return torch.cat([o for o in outs if o is not None]).float()


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(10 * torch.log10(1 / ((a.float() - b.float()) ** 2).mean()))


class Recorder:
    """Wraps Requests.take: every request records the inputs of each infer (with its state's values)."""

    def __init__(self):
        from alaya_flash.model_zoo.runtime import openvino as rov

        self.samples: dict[int, list[dict]] = {}
        self.original = rov.Requests.take
        recorder = self

        def take(pool):
            return Recording(recorder.original(pool), recorder.samples.setdefault(id(pool), []))

        rov.Requests.take = take

    def stop(self):
        from alaya_flash.model_zoo.runtime import openvino as rov

        rov.Requests.take = self.original


class Recording:
    def __init__(self, request, into: list):
        self.request, self.into = request, into

    def infer(self, feed):
        # a state made from input m and output m_out is named m + m_out
        states = {s.name[:(len(s.name) - 4) // 2]: s.state.data.copy() for s in self.request.query_state()}
        self.into.append({**{k: np.array(v) for k, v in feed.items()}, **states})
        return self.request.infer(feed)

    def __getattr__(self, name):
        return getattr(self.request, name)


def stateless_encoder(encoder, size: int):
    """The encoder's group graph with its memory as plain inputs and outputs (named as the backend's)."""
    import openvino as ov

    from alaya_flash.model_zoo.latents import TIME_COMPRESSION
    from alaya_flash.model_zoo.runtime import graphs

    memory = graphs.EncoderGroup.memory_shapes_for(encoder, size, size)
    example = {"images": torch.zeros(TIME_COMPRESSION, encoder.config.branches, size, size, 3, dtype=torch.uint8)}
    example.update({f"memory{i}": torch.zeros(s) for i, s in enumerate(memory)})
    with torch.no_grad():
        model = ov.convert_model(graphs.EncoderGroup(encoder).eval(), example_input=tuple(example.values()),
                                 input=[tuple(t.shape) for t in example.values()])
    for param, name in zip(model.get_parameters(), example):
        param.output(0).get_tensor().set_names({name})
        param.set_friendly_name(name)
    for i, result in enumerate(model.get_results()[1:]):
        result.output(0).get_tensor().set_names({f"memory{i}_out"})
    return model, {f"memory{i}": f"memory{i}_out" for i in range(len(memory))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import nncf
    from openvino._offline_transformations import apply_make_stateful_transformation

    from alaya_flash.model_zoo import bundle, folders, runtime
    from alaya_flash.model_zoo.runtime.openvino import core
    from alaya_flash.streaming.cli.demo import DEMO_PROMPT, DEMO_SOURCES
    from alaya_flash.streaming.values import gbuffer_chunks
    from alaya_flash.streaming.world.shading import PRESETS
    from alaya_flash.training.data import DataConfig, render_clip
    from alaya_flash.training.prompts import prompts as wordings

    size = args.size
    torch_flash = folders.load_flash(bundle.default_flash_dir(), torch.device("cpu"), torch.bfloat16)
    fast = runtime.accelerate(torch_flash, "openvino")
    demo = DEMO_SOURCES["world"](width=size, height=size, num_frames=args.frames, seed=0)
    demo_images = torch.cat([c.images for c in gbuffer_chunks(demo, 4)])[:args.frames]
    recorder = Recorder()
    render(fast, demo_images, DEMO_PROMPT)
    recorder.stop()
    enc_pool = next(iter(fast.gbuffer_encoder.compiler.compiled.values()))
    (dit_key, dit_pool), = fast.dit.compiler.compiled.items()
    enc_samples, dit_samples = recorder.samples[id(enc_pool)], recorder.samples[id(dit_pool)]
    dit_samples = dit_samples[::max(1, len(dit_samples) // 300)]  # NNCF's default subset
    print(f"calibration: {len(enc_samples)} encoder groups, {len(dit_samples)} DiT passes (demo world, "
          f"{len(demo_images)} frames at {size}x{size})")

    config = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "bf16"}
    encoder_model, pairs = stateless_encoder(torch_flash.gbuffer_encoder, size)
    t0 = time.perf_counter()
    enc_q = nncf.quantize(encoder_model, nncf.Dataset(enc_samples), subset_size=len(enc_samples),
                          preset=nncf.QuantizationPreset.MIXED)
    apply_make_stateful_transformation(enc_q, pairs)
    dit_model = core().read_model(str(fast.dit.compiler._folder(dit_key[0], dit_key[1]) / "model.xml"))
    dit_q = nncf.quantize(dit_model, nncf.Dataset(dit_samples), subset_size=len(dit_samples),
                          preset=nncf.QuantizationPreset.MIXED, model_type=nncf.ModelType.TRANSFORMER)
    print(f"quantized in {time.perf_counter() - t0:.1f} s")
    enc_int8, dit_int8 = core().compile_model(enc_q, "CPU", config), core().compile_model(dit_q, "CPU", config)

    # speed: one encoder group, one DiT pass; bf16 (shipped) and INT8 alternated
    runners = {}
    for name, compiled, feed in (("encoder bf16", enc_pool.compiled, {"images": enc_samples[-1]["images"]}),
                                 ("encoder int8", enc_int8, {"images": enc_samples[-1]["images"]}),
                                 ("DiT pass bf16", dit_pool.compiled, dit_samples[-1]),
                                 ("DiT pass int8", dit_int8, dit_samples[-1])):
        request = compiled.create_infer_request()
        runners[name] = (lambda r, f: lambda: r.infer(f))(request, feed)
    times = {k: [] for k in runners}
    for run in runners.values():
        run()
    for _ in range(args.rounds):
        for k, run in runners.items():
            t = time.perf_counter()
            run()
            times[k].append(1000 * (time.perf_counter() - t))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"  {k:14s} {v:8.2f} ms")
    print(f"  INT8 / bf16 speed: encoder {med['encoder bf16'] / med['encoder int8']:.2f}x, "
          f"DiT {med['DiT pass bf16'] / med['DiT pass int8']:.2f}x")

    # quality on a held-out eval clip
    names = list(PRESETS)[:2]
    cfg = DataConfig(width=size, height=size, frames=args.frames, presets=tuple(names), train_clips=1, heldout_clips=1).validate()
    clip = render_clip(cfg, cfg.heldout_seed)
    images, truth = torch.from_numpy(clip["gbuffers"]), torch.from_numpy(clip["rgb"][0]).float() / 255
    prompt = wordings(names[0], "heldout")[0]
    frames = {"torch": render(torch_flash, images, prompt), "openvino bf16": render(fast, images, prompt)}
    enc_pool.compiled, enc_pool.idle = enc_int8, []
    dit_pool.compiled, dit_pool.idle = dit_int8, []
    frames["openvino int8"] = render(fast, images, prompt)
    for k, f in frames.items():
        print(f"  {k:14s} PSNR vs truth {psnr(f, truth):.2f} dB, vs torch {psnr(f, frames['torch']):.2f} dB")


if __name__ == "__main__":
    main()
