"""What the live engine renders with: the standard Flash pipeline, or a saved workflow.

`pipeline_factory(...)` returns a zero-argument callable the render thread calls once, so the
model is loaded on the thread that uses it. Every pipeline follows engine.LivePipeline:
chunk_frames, reset(), set_prompt(text), render(uint8 (T, 5, H, W, 3)) -> uint8 (T', H, W, 3).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ...model_zoo.errors import AlayaError


def pipeline_factory(model: Path | None = None, workflow: Path | None = None, random_model: bool = False,
                     size: tuple[int, int] = (256, 256), seed: int = 0, device: str = "cpu") -> Callable:
    """A callable that builds the live pipeline (see the module docstring)."""
    raise AlayaError("the Flash pipeline (streaming/pipelines.py) is not on this branch yet")
