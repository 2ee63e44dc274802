"""Quality guard: every model shipped in model_zoo/ renders a small held-out clip of each world it was
trained on as well as its model card says, so a broken stage, loader or weight file fails here and not
in a user's stream.

One held-out scene (seed 100000, the card's held-out scene 0) at 64x64, 9 frames, of each world: the
physics world with the training data's settings (16 fps, 12 objects) under each of its 8 presets' first
training wording, and world v2 path traced under each of its 10 presets' caption. Rendered by the model's pipeline (refiner on) in the dtype `precision.preferred_dtype`
picks, and scored as `alaya-flash eval` scores: PSNR against the prompted preset's ground truth, and
control (is the render nearest its own preset's ground truth, by how many dB). About 2 s of rendering
on one thread per model, and 10 s of path tracing for world v2. `python tests/test_quality_guard.py
[GUARD]` prints the figures (what the references below were read from). The last test renders a
200-frame stream and checks that it holds (the long-stream axis of `alaya-flash eval`).
"""
from __future__ import annotations

import functools
import json
from typing import NamedTuple

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.precision import preferred_dtype
from alaya_flash.training.data import DataConfig, render_clip
from alaya_flash.training.prompts import prompts as wordings
from alaya_flash.streaming import metrics
from alaya_flash.training.eval import _render
from alaya_flash.streaming.render.lighting import recorded
from alaya_flash.streaming.render.pipelines import FlashPipeline
from alaya_flash.streaming.values import PromptSchedule
from alaya_flash.streaming.world.shading import PRESETS

# Measured at exactly this configuration by this file run as a script (`python tests/test_quality_guard.py
# default-physics`, `... default-world-v2`, `... default-world-v2-given`; 2026-12-07, 2-core AMD EPYC with
# AVX512-BF16 shared with other work, bf16, one thread; docs/model-card.md, "Quality guard"). Rendered as a
# stream without a user's light: the refiner reads the light head's reading of each prompt.
REFERENCE = {"psnr_db": 25.44, "nearest_rate": 7 / 8, "margin_db": 7.05}  # miss: bright_sunny -> overcast
# 50x the spread of machines, threads and dtypes (0.01 dB); every broken stage tried on the earlier default
# cost more: the refiner dropped -6.1 dB, decoder weights shuffled -13.5 dB, two decoder tensors swapped
# -1.7 dB, depth and roughness swapped on the way into the G-buffer encoder -1.6 dB (metallic/roughness -5.3,
# albedo/normal -10.1).
PSNR_MARGIN_DB = 0.5
CONTROL_MARGIN_DB = 1.0  # mean margin; the two swaps above cost 1.2 and 1.4 dB of it

SIZE, FRAMES, SCENE_SEED = 64, 9, 100000

# World v2's held-out scene 0 (seed 100000: a courtyard), path traced by Mitsuba at 8 samples a pixel (the
# truth's noise does not matter to a guard, its seconds do), each of the 10 presets prompted with its caption
# (the sun's side), as `alaya-flash eval` prompts world v2.
# Misses: snowy_winter -> foggy, autumn_warm -> rainy_wet, rainy_wet -> snowy_winter.
WORLD_V2_REFERENCE = {"psnr_db": 19.31, "nearest_rate": 7 / 10, "margin_db": 2.89}
WORLD_V2_SPP = 8


# The same clip as an engine renders it: each preset's recorded light per frame and its shadow pass (the path
# tracer's sun visibility), which the refiner is told were given. No miss.
WORLD_V2_GIVEN_REFERENCE = {"psnr_db": 20.95, "nearest_rate": 10 / 10, "margin_db": 4.96}


class Guard(NamedTuple):
    """What a shipped model is held to on one world's held-out clip."""
    model: str  # its folder in model_zoo/
    world: str  # the world of its held-out clip: "physics" or "pathtrace" (world v2)
    reference: dict  # its figures at this configuration (above)
    min_nearest_rate: float  # the share of presets nearest their own truth it may not fall below
    given: bool = False  # rendered under the clip's recorded light and shadow pass, not the prompt's light


# every model folder shipped in model_zoo/ has a guard on each world it was trained on
GUARDS = {"default-physics": Guard("default", "physics", REFERENCE, 6 / 8),  # one miss more than measured
          "default-world-v2": Guard("default", "pathtrace", WORLD_V2_REFERENCE, 6 / 10),
          "default-world-v2-given": Guard("default", "pathtrace", WORLD_V2_GIVEN_REFERENCE, 9 / 10, given=True)}


@functools.cache
def held_out_clip(world: str) -> dict:
    """The guard's held-out clip of a world: G-buffers (T, 5, H, W, 3), truths (P, T, H, W, 3), preset
    names and, for world v2, each preset's caption."""
    if world == "pathtrace":
        cfg = DataConfig(world="pathtrace", width=SIZE, height=SIZE, frames=FRAMES, fps=16.0, spp=WORLD_V2_SPP,
                         train_clips=1, heldout_clips=1, heldout_seed=SCENE_SEED).validate()
    else:
        cfg = DataConfig(width=SIZE, height=SIZE, frames=FRAMES, fps=16.0, objects=12, presets=tuple(PRESETS),
                         train_clips=1, heldout_clips=1, heldout_seed=SCENE_SEED).validate()
    return render_clip(cfg, SCENE_SEED)


def load_shipped(model: str):
    """A shipped model's Flash bundle in the dtype this CPU prefers, as users' commands load it."""
    return bundle.load_flash_folder(bundle.shipped_models()[model], dtype=preferred_dtype("cpu"))


def guard_figures(guard: str = "default-physics") -> dict:
    """Mean PSNR, nearest rate and mean control margin of a shipped model over a world's presets."""
    model = GUARDS[guard].model
    clip = held_out_clip(GUARDS[guard].world)
    names = [str(n) for n in clip["presets"]]
    gt = [torch.from_numpy(clip["rgb"][p]).float() / 255 for p in range(len(names))]
    flash = load_shipped(model)
    text = flash.text_encoder()
    psnr, hits, margins, misses = [], [], [], []
    for p, name in enumerate(names):
        prompt = str(clip["captions"][p]) if "captions" in clip else wordings(name, "train")[0]
        sched = PromptSchedule.encode(text, prompt)
        lights, passes = None, {}
        if GUARDS[guard].given:
            lights, passes = recorded(clip["light"][p]), {"shadow": clip["sun_visibility"][p]}
        out, _, _ = _render(FlashPipeline(flash, sched, seed=0, lights=lights), clip["gbuffers"], passes=passes)
        assert out.shape == (FRAMES, SIZE, SIZE, 3)
        near = metrics.nearest(out, gt, p)
        psnr.append(metrics.psnr(out, gt[p]))
        hits.append(near["hit"])
        margins.append(near["margin_db"])
        if not near["hit"]:
            misses.append(f"{name} -> {names[near['nearest']]}")
    return {"psnr_db": float(np.mean(psnr)), "nearest_rate": float(np.mean(hits)), "margin_db": float(np.mean(margins)),
            "misses": misses}


@pytest.fixture(scope="module", params=sorted(GUARDS))
def guarded(request):
    return request.param, guard_figures(request.param)


def test_every_shipped_model_has_a_guard():
    assert set(bundle.shipped_models()) == {g.model for g in GUARDS.values()}


@pytest.mark.slow
def test_shipped_model_psnr_holds_on_a_held_out_clip(guarded):
    model, figures = guarded
    reference = GUARDS[model].reference
    floor = reference["psnr_db"] - PSNR_MARGIN_DB
    assert figures["psnr_db"] >= floor, f"{model}: PSNR {figures['psnr_db']:.2f} dB < {floor:.2f} dB (reference {reference})"


@pytest.mark.slow
def test_shipped_model_prompt_control_holds_on_a_held_out_clip(guarded):
    model, figures = guarded
    guard = GUARDS[model]
    assert figures["nearest_rate"] >= guard.min_nearest_rate, f"{model}: misses: {figures['misses']}"
    floor = guard.reference["margin_db"] - CONTROL_MARGIN_DB
    assert figures["margin_db"] >= floor, f"{model}: control margin {figures['margin_db']:+.2f} dB < {floor:+.2f} dB"



# The long stream: eval's long-stream axis (an unseen physics-world scene, one continuous stream) at 64x64
# over 200 frames with the model's own session, lit by the world's own sun (as an engine lights it). The
# shipped default (measured with the figures above): a drop of 3.22 dB from the first block to the last, the
# scene's, not the stream's: fresh streams started at frame 100 and at the last block (175) score 0.55 and 0.76 dB
# *below* the long one there. A stream whose state decays shows as a fresh stream that does better (an
# earlier model with the training window of 6 latent frames instead of the shipped 1: +4.2 dB), so that
# gain is bounded tightly.
MAX_LONG_DROP_DB = 3.7  # the drop measured + 0.5
MAX_FRESH_GAIN_DB = 1.0


def long_stream_figures(model: str) -> dict:
    from alaya_flash.training.eval import long_stream

    flash = load_shipped(model)
    return long_stream(flash, flash.text_encoder(), 200, 25, (64, 64), world_light=True)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted({g.model for g in GUARDS.values()}))
def test_shipped_model_holds_over_a_long_stream(model):
    r = long_stream_figures(model)
    max_drop = MAX_LONG_DROP_DB
    assert r["drop_db"] <= max_drop, f"{model}: long stream drops {r['drop_db']:.2f} dB: {r['psnr_db_by_block']}"
    for start in r["fresh_starts"]:
        assert start["gain_db"] <= MAX_FRESH_GAIN_DB, \
            f"{model}: a fresh stream at frame {start['frame']} is {start['gain_db']:.2f} dB better"


if __name__ == "__main__":
    import sys

    guard = sys.argv[1] if len(sys.argv) > 1 else "default-physics"
    long = long_stream_figures(GUARDS[guard].model)
    print(json.dumps({**guard_figures(guard), "long_drop_db": long["drop_db"], "fresh_gain_db": [f["gain_db"] for f in long["fresh_starts"]]}))
