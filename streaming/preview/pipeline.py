"""What the live engine renders with: the standard Flash pipeline (or, later, a saved workflow).

`pipeline_factory(...)` returns a zero-argument callable that the render thread calls once, so the
model loads on the thread that uses it. Every pipeline follows engine.LivePipeline:
chunk_frames, reset(), set_prompt(text), render(uint8 (T, 5, H, W, 3)) -> uint8 (T', H, W, 3).

FlashLive drives streaming/pipelines.py's Flash stages (G-buffer encoder -> few-step AR sampler
-> tiny streaming decoder) on an endless stream: it never flushes. It asks the engine for exactly
the frames that complete the next autoregressive chunk (Wan's arithmetic: the first chunk of c
latent frames covers 1 + 4(c - 1) pixel frames, every later one 4c), so each render call returns
the frames it was given. A prompt change recomputes the text keys/values and keeps the KV cache
(FlashSession.set_prompt), so the style changes mid-stream without a cut; reset() starts the
stream over with the same seed and the current prompt.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import numpy as np

from ...model_zoo.errors import AlayaError
from ...model_zoo.latents import TIME_COMPRESSION

log = logging.getLogger(__name__)


class FlashLive:
    """engine.LivePipeline over a Flash model (model_zoo.bundle.FlashModel)."""

    def __init__(self, model, seed: int = 0, fps: float = 30.0, chunk_latents: int | None = None,
                 steps: int | None = None):
        self.model, self.seed, self.fps = model, seed, fps
        self.chunk_latents = chunk_latents or model.settings.chunk_frames
        self.steps = steps
        self.encode_text = model.text_encoder()
        self._emb = None
        self.text = None
        self.set_prompt("")

    @property
    def chunk_frames(self) -> int:
        """Pixel frames that complete the next AR chunk (first chunk: 1 + 4(c - 1), then 4c)."""
        c = self.chunk_latents
        return TIME_COMPRESSION * c - (TIME_COMPRESSION - 1 if self._frames == 0 else 0)

    def reset(self) -> None:
        from ..pipelines import FlashPipeline, PromptSchedule

        self.pipe = FlashPipeline(self.model, PromptSchedule.constant(self._emb, self.text), seed=self.seed,
                                  steps=self.steps, chunk_frames=self.chunk_latents)
        self._frames = 0

    def set_prompt(self, text: str) -> None:
        import torch

        with torch.no_grad():
            emb = self.encode_text([text]).to(self.model.device)
        self._emb, self.text = emb, text
        if getattr(self, "pipe", None) is None:
            self.reset()
            return
        from ..pipelines import PromptSchedule

        sampler = self.pipe.stages[1]
        sampler.prompts = PromptSchedule.constant(emb, text)  # what a later reset of the stage would use
        sampler.session.set_prompt(sampler.state, emb)

    def render(self, chunk: np.ndarray) -> np.ndarray:
        from ..pipelines import GBuffers, to_uint8

        self._frames += len(chunk)
        frames = self.pipe.step(GBuffers(chunk, fps=self.fps))
        if frames is None:
            return np.zeros((0, *chunk.shape[2:4], 3), np.uint8)
        return to_uint8(frames)


def load_flash_model(model: Path | None, random_model: bool, device: str):
    """The Flash model the page renders with: --random-model, a folder, or the embedded default."""
    from ...model_zoo import bundle

    if random_model:
        log.warning("live: rendering with tiny RANDOM weights (the pictures are noise; the plumbing is real)")
        return bundle.make_random_flash(seed=0, device=device)
    if model is None and not bundle.has_default_flash():
        raise AlayaError("no default Flash model is installed yet; pass --model FOLDER, or --random-model to try "
                         "the page with tiny random weights")
    return bundle.load_flash(model, device=device)


def pipeline_factory(model: Path | None = None, workflow: Path | None = None, random_model: bool = False,
                     seed: int = 0, fps: float = 30.0, device: str = "cpu", chunk_latents: int | None = None,
                     steps: int | None = None) -> Callable:
    """A callable that builds the live pipeline on the render thread (see the module docstring)."""
    if workflow is not None:
        raise AlayaError(f"{workflow}: workflows as the live pipeline are not supported by this build yet")
    if model is not None and not Path(model).is_dir():
        raise AlayaError(f"{model}: no such model folder")
    if model is None and not random_model:
        from ...model_zoo import bundle

        if not bundle.has_default_flash():  # say so now, not later inside the render thread
            load_flash_model(None, False, device)

    def make():
        return FlashLive(load_flash_model(model, random_model, device), seed=seed, fps=fps,
                         chunk_latents=chunk_latents, steps=steps)

    return make
