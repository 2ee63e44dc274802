"""Quality guard: every model shipped in model_zoo/ renders a small held-out clip as well as its model
card says, so a broken stage, loader or weight file fails here and not in a user's stream.

One held-out scene (seed 100000, the card's held-out scene 0) at 64x64, 9 frames, of the model's
world: the default's, the physics world with the training data's settings (16 fps, 12 objects) under
each of its 8 presets' first training wording; world_v2's, world v2 path traced under each of its 10
presets' caption. Rendered by the model's pipeline (refiner on) in the dtype `precision.preferred_dtype`
picks, and scored as `alaya-flash eval` scores: PSNR against the prompted preset's ground truth, and
control (is the render nearest its own preset's ground truth, by how many dB). About 2 s of rendering
on one thread per model, and 10 s of path tracing for world v2. `python tests/test_quality_guard.py
[MODEL]` prints the figures (what the references below were read from). The last test renders a
200-frame stream and checks that it holds (the long-stream axis of `alaya-flash eval`).
"""
from __future__ import annotations

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
from alaya_flash.streaming.render.pipelines import FlashPipeline
from alaya_flash.streaming.values import PromptSchedule
from alaya_flash.streaming.world.shading import PRESETS

# Measured at exactly this configuration by this file run as a script (2026-12-05, 2-core AMD EPYC with
# AVX512-BF16, bf16, one thread; docs/model-card.md, "Quality guard"): 24.08 dB / 8 of 8 / +6.07 dB.
# fp32 weights, 2 threads and the plain (unfused) convolutions gave the same figures within 0.01 dB,
# ground truth from the ray caster (machines without OpenGL) within 0.02 dB.
REFERENCE = {"psnr_db": 24.08, "nearest_rate": 1.0, "margin_db": 6.07}
# 50x the spread above; every broken stage tried cost more: the refiner dropped -6.1 dB, decoder
# weights shuffled -13.5 dB, two decoder tensors swapped -1.7 dB, depth and roughness swapped on the
# way into the G-buffer encoder -1.6 dB (metallic/roughness -5.3, albedo/normal -10.1).
PSNR_MARGIN_DB = 0.5
CONTROL_MARGIN_DB = 1.0  # mean margin; the two swaps above cost 1.2 and 1.4 dB of it
MIN_NEAREST_RATE = 7 / 8  # bright_sunny's caption wins by only +0.2 dB here: allow that one miss

SIZE, FRAMES, SCENE_SEED = 64, 9, 100000

# model_zoo/world_v2 on world v2's held-out scene 0 (seed 100000: a courtyard), path traced by Mitsuba at
# 8 samples a pixel (the truth's noise does not matter to a guard, its seconds do), each of the 10 presets
# prompted with its caption (the sun's side), as `alaya-flash eval` prompts world v2. Measured by
# `python tests/test_quality_guard.py world_v2` (2026-12-06, 2-core AMD EPYC with AVX512-BF16, bf16, one
# thread; docs/model-card-world-v2.md, "Quality guard"): 18.24 dB / 6 of 10 / +1.57 dB, misses overcast ->
# bright_sunny, snowy_winter -> foggy, autumn_warm -> rainy_wet, rainy_wet -> snowy_winter; allow one more.
WORLD_V2_REFERENCE = {"psnr_db": 18.24, "nearest_rate": 0.6, "margin_db": 1.57}
WORLD_V2_SPP = 8
WORLD_V2_MIN_NEAREST_RATE = 5 / 10


class Guard(NamedTuple):
    """What one shipped model is held to."""
    world: str  # the world of its held-out clip: "physics" or "pathtrace" (world v2)
    reference: dict  # its figures at this configuration (above)
    min_nearest_rate: float  # the share of presets nearest their own truth it may not fall below
    max_long_drop_db: float  # how much its long stream (below) may drop, first block to last


# every model folder shipped in model_zoo/ has a guard
GUARDS = {"default": Guard("physics", REFERENCE, MIN_NEAREST_RATE, max_long_drop_db=1.0),
          "world_v2": Guard("pathtrace", WORLD_V2_REFERENCE, WORLD_V2_MIN_NEAREST_RATE, max_long_drop_db=2.0)}


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


def guard_figures(model: str = "default") -> dict:
    """Mean PSNR, nearest rate and mean control margin of a shipped model over its world's presets."""
    clip = held_out_clip(GUARDS[model].world)
    names = [str(n) for n in clip["presets"]]
    gt = [torch.from_numpy(clip["rgb"][p]).float() / 255 for p in range(len(names))]
    flash = load_shipped(model)
    text = flash.text_encoder()
    psnr, hits, margins, misses = [], [], [], []
    for p, name in enumerate(names):
        prompt = str(clip["captions"][p]) if "captions" in clip else wordings(name, "train")[0]
        sched = PromptSchedule.encode(text, prompt)
        out, _, _ = _render(FlashPipeline(flash, sched, seed=0), clip["gbuffers"])
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
    assert set(bundle.shipped_models()) == set(GUARDS)


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
# over 200 frames with the model's own session. Measured (2026-12-05, Xeon-AMX, bf16, 2 threads, about 6
# s): the default's drop (first block - last block) 0.0 dB, a fresh stream at frame 100 +0.9 dB. With the
# training window of 6 latent frames instead of the shipped 1, the same run drops 2.6 dB and the fresh
# stream gains 4.2 (docs/model-card.md, "Long streams"): the bounds sit between the two. world_v2
# (2026-12-06, EPYC, one thread) drops 1.3 dB there, and a fresh stream is 0.4 dB *worse* than its long
# one: the last block's content, not the stream's state; with the window of 6 its previous weights dropped
# 4.4 dB and a fresh stream gained 3.2. Its bound sits between (GUARDS).
MAX_FRESH_GAIN_DB = 2.0


def long_stream_figures(model: str) -> dict:
    from alaya_flash.training.eval import long_stream

    flash = load_shipped(model)
    return long_stream(flash, flash.text_encoder(), 200, 25, (64, 64))


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(GUARDS))
def test_shipped_model_holds_over_a_long_stream(model):
    r = long_stream_figures(model)
    max_drop = GUARDS[model].max_long_drop_db
    assert r["drop_db"] <= max_drop, f"{model}: long stream drops {r['drop_db']:.2f} dB: {r['psnr_db_by_block']}"
    gain = r["fresh_start"]["gain_db"]
    assert gain <= MAX_FRESH_GAIN_DB, f"{model}: a fresh stream at frame {r['fresh_start']['frame']} is {gain:.2f} dB better"


if __name__ == "__main__":
    import sys

    model = sys.argv[1] if len(sys.argv) > 1 else "default"
    long = long_stream_figures(model)
    print(json.dumps({**guard_figures(model), "long_drop_db": long["drop_db"], "fresh_gain_db": long["fresh_start"]["gain_db"]}))
