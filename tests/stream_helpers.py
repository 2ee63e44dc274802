"""Shared pieces of the pipeline and node tests: random G-buffers, a whole-stream render, a sink node."""
from __future__ import annotations

import torch

from alaya_flash.streaming.values import GBuffers
from alaya_flash.streaming.render import runner as rn


def random_gbuffers(n: int, h: int = 16, w: int = 16, seed: int = 0) -> GBuffers:
    g = torch.Generator().manual_seed(seed)
    return GBuffers(torch.randint(0, 256, (n, 5, h, w, 3), dtype=torch.uint8, generator=g))


def render_all(pipeline, chunks) -> torch.Tensor:
    """Every frame a pipeline gives for these G-buffer chunks (flush included), joined."""
    return torch.cat(list(pipeline.run(chunks)))


def render_ticks(flash, chunks, lanes=None) -> torch.Tensor:
    """A Flash model's frames for these G-buffer chunks through the driver's ticks (with `lanes`, the
    CLI's plan with lanes), a sunny prompt, seed 3."""
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.render.driver import StageGraph, ticks
    from alaya_flash.streaming.values import PromptSchedule

    prompts = PromptSchedule.encode(flash.text_encoder(), "a sunny street at noon")
    graph = StageGraph(["gbuffers"], pl.flash_steps(flash, prompts, seed=3))
    outs = []
    for values, _, _ in ticks(graph, {"gbuffers": ((c,) for c in chunks)}, lanes=lanes):
        out = values[graph.steps[-1].name]
        if out is not None and out[0] is not None:
            outs.append(out[0])
    return torch.cat(outs)


class Collect:
    """Test sink: keeps every IMAGE chunk it receives (stream stage, output node)."""

    STREAM, STREAM_INPUTS, RETURN_TYPES, OUTPUT_NODE, FUNCTION, CATEGORY = "stage", ("images",), (), True, "save", "test"
    got: list = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",)}}

    def start_stream(self):
        parts = Collect.got

        class _S:
            def step(self, images):
                parts.append(images.clone())

            def flush(self):
                return {"ui": {}}

        return _S()

    save = rn.run_stage_whole


def random_refiner(name: str, seed: int = 3):
    """A G-buffer refiner of config `name` with every weight random (a fresh one's last layers are zero: the identity)."""
    import torch

    from alaya_flash.model_zoo.codecs import refiner as rf

    net = rf.build(rf.CONFIGS[name])
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return net


def moving_shadow(n: int, h: int, w: int, start: int, step: int, width: int, edge: int | None = None,
                  gradient: int = 0, rows: slice = slice(None)):
    """A shadow pass uint8 (n, H, W): 255 lit, a band of `width` columns in shadow (0) over `rows` that moves
    `step` columns a frame from `start`, then one column at level `edge` (a soft edge) and, with `gradient`,
    the last row a ramp of that step per column (so many levels appear)."""
    import numpy as np

    out = np.full((n, h, w), 255, np.uint8)
    for i in range(n):
        a = start + step * i
        out[i, rows, a: a + width] = 0
        if edge is not None:
            out[i, rows, a + width] = edge
        if gradient:
            out[i, -1] = np.arange(w) * gradient
    return out
