"""The live page's Flash adapter equals the project's Flash pipeline run over the same frames."""
import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.values import GBuffers, PromptSchedule
from alaya_flash.streaming.files.sinks import to_uint8
from alaya_flash.streaming.live.renderers import FlashLive


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
    ref = pl.FlashPipeline(model, PromptSchedule.constant(emb), seed=5, chunk_frames=1)
    want = to_uint8(ref.step(GBuffers(frames, fps=30)))
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


def test_workflow_renderer_equals_the_flash_pipeline_it_describes(tmp_path):
    """workflows/api/live-preview.json as the live renderer: the page's frames replace its source."""
    import json
    from pathlib import Path

    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS
    from alaya_flash.streaming.live.renderers import WorkflowLive

    path = Path(__file__).resolve().parents[1] / "workflows" / "api" / "live-preview.json"
    live = WorkflowLive(path, NODE_CLASS_MAPPINGS, fps=30)
    live.set_prompt("a sunny street")
    frames = _frames(9, seed=2)
    got = _live(live, frames)
    assert got.shape == (9, 32, 32, 3)
    flash = live.values["2"][0]  # the model the workflow's Load Flash Model made
    sampler = json.loads(path.read_text())["5"]["inputs"]
    own = {k: None if sampler[k] == -1 else sampler[k] for k in ("steps", "chunk_frames", "window_frames", "sink_frames")}
    ref = pl.FlashPipeline(flash, PromptSchedule.encode(flash.text_encoder(), "a sunny street"), seed=sampler["seed"],
                           **own)  # -1 in a workflow: the model's own setting
    assert np.array_equal(got, to_uint8(ref.step(GBuffers(frames, fps=30))))
    live.reset()
    assert np.array_equal(_live(live, frames), got)
    live.set_prompt("a rainy night")
    assert not np.array_equal(_live(live, frames), got)
    # a workflow that shows no frames is refused with one line naming the file
    bad = json.loads(path.read_text())
    del bad["8"]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(AlayaError, match="bad.json"):
        WorkflowLive(tmp_path / "bad.json", NODE_CLASS_MAPPINGS)


def test_live_page_renders_with_the_models_refiner_unless_told_not_to(tmp_path):
    """`serve` keeps a model folder's G-buffer refiner (the Flash pipeline's refine stage); `--no-refiner`
    leaves it out, and the frames are then the decoder's."""
    from alaya_flash.streaming.live.renderers import renderer_factory

    flash = bundle.make_random_flash(seed=0, refiner="gbuffer-refiner-16")
    with torch.no_grad():
        flash.refiner.tail[-1].bias.fill_(0.2)
    bundle.save_flash(flash, tmp_path / "m")
    refined = renderer_factory(model=tmp_path / "m", chunk_latents=1)()
    plain = renderer_factory(model=tmp_path / "m", chunk_latents=1, refine=False)()
    assert refined.pipe.refine is not None and plain.pipe.refine is None
    frames = _frames(5)
    assert not np.array_equal(_live(refined, frames), _live(plain, frames))


def test_prompt_change_reaches_a_refiner_that_reads_the_prompt():
    from alaya_flash.model_zoo.codecs import refiner as rf

    model = bundle.make_random_flash(seed=0, refiner="gbuffer-refiner-16-prompt")
    live = FlashLive(model, seed=0, chunk_latents=1)
    live.set_prompt("a sunny street")
    live.render(_frames(5, seed=3)[:1])
    live.set_prompt("a rainy night")
    night = model.text_encoder()(["a rainy night"])
    assert isinstance(live.pipe.refine.refiner, rf.GBufferRefiner)
    assert torch.equal(live.pipe.refine.prompts.at(live.pipe.refine.frame)[1], night)
