"""Inside ComfyUI the Flash Sampler shows each chunk on the canvas: one progress update per AR
chunk, each carrying a JPEG preview decoded by the model's tiny decoder; the stream is unchanged."""
import sys
import types

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.nodes.render import FlashSampler, _Sampling
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.values import GBuffers, PromptSchedule


def _stand_in_comfy(monkeypatch, updates):
    class Bar:
        def __init__(self, total):
            self.total = total

        def update_absolute(self, value, total, preview):
            updates.append((value, total, preview))

    comfy_mod = types.ModuleType("comfy")
    comfy_mod.utils = types.SimpleNamespace(ProgressBar=Bar)
    monkeypatch.setitem(sys.modules, "comfy", comfy_mod)
    monkeypatch.setitem(sys.modules, "comfy.utils", comfy_mod.utils)


def _sample(model, cond):
    prompt = PromptSchedule.encode(model.text_encoder(), "a sunny street")
    stage = FlashSampler().start_stream(model, prompt, seed=0, steps=2, chunk_frames=1, window_frames=4, sink_frames=1)
    return stage.step(cond)[0]


def test_flash_sampler_previews_each_chunk_inside_comfyui(monkeypatch):
    model = bundle.make_random_flash(seed=0)
    images = np.random.default_rng(0).integers(0, 256, (9, 5, 32, 32, 3), dtype=np.uint8)
    cond = pl.GBufferEncode(model.gbuffer_encoder).step(GBuffers(images))
    # outside ComfyUI: no preview is decoded
    monkeypatch.setattr(_Sampling, "_preview", lambda self, z: pytest.fail("decoded a preview outside ComfyUI"))
    plain = _sample(model, cond)
    monkeypatch.undo()
    updates = []
    _stand_in_comfy(monkeypatch, updates)
    shown = _sample(model, cond)
    assert torch.equal(shown.tensor, plain.tensor)  # previews do not touch the stream
    assert [(v, t) for v, t, _ in updates] == [(1, 3), (2, 3), (3, 3)]  # 3 latents, 1 per chunk
    for _, _, (fmt, image, max_size) in updates:
        assert fmt == "JPEG" and image.size == (32, 32) and max_size is None  # its own size: never scaled up
