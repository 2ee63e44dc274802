"""The live page's Flash adapter equals the project's Flash pipeline run over the same frames."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.streaming import pipelines as pl
from alaya_flash.streaming.preview.pipeline import FlashLive


@pytest.fixture(scope="module")
def model():
    return bundle.make_random_flash(seed=0)


def _frames(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 5, 32, 32, 3), dtype=np.uint8)


def _live(live, frames):
    out, i = [], 0
    while i < len(frames):
        n = live.chunk_frames
        out.append(live.render(frames[i:i + n]))
        i += n
    return np.concatenate(out)


def test_live_equals_the_flash_pipeline_and_reset_repeats(model):
    frames = _frames(9)  # chunks of 1 latent: 1 + 4 + 4 pixel frames
    live = FlashLive(model, seed=5, fps=30, chunk_latents=1)
    live.set_prompt("a sunny street")
    assert live.chunk_frames == 1
    got = _live(live, frames)
    emb = model.text_encoder()(["a sunny street"])
    ref = pl.FlashPipeline(model, pl.PromptSchedule.constant(emb), seed=5, chunk_frames=1)
    want = pl.to_uint8(ref.step(pl.GBuffers(frames, fps=30)))
    assert got.shape == (9, 32, 32, 3) and np.array_equal(got, want)
    live.reset()
    assert live.chunk_frames == 1 and np.array_equal(_live(live, frames), got)


def test_prompt_change_mid_stream_changes_only_later_frames(model):
    frames = _frames(13, seed=1)
    a = FlashLive(model, seed=0, chunk_latents=1)
    a.set_prompt("a sunny street")
    b = FlashLive(model, seed=0, chunk_latents=1)
    b.set_prompt("a sunny street")
    first_a, first_b = a.render(frames[:1]), b.render(frames[:1])
    first_a = np.concatenate([first_a, a.render(frames[1:5])])
    first_b = np.concatenate([first_b, b.render(frames[1:5])])
    assert np.array_equal(first_a, first_b)
    b.set_prompt("a rainy night in a neon city")
    later_a, later_b = a.render(frames[5:9]), b.render(frames[5:9])
    assert later_a.shape == later_b.shape == (4, 32, 32, 3) and not np.array_equal(later_a, later_b)
