"""Quality guard: the shipped default model (model_zoo/default) renders a small held-out clip as well
as the model card says, so a broken stage, loader or weight file fails here and not in a user's
stream.

One held-out scene (seed 100000, the card's held-out scene 0) of the physics world at 64x64, 9
frames, with the training data's world settings (16 fps, 12 objects), rendered by the default
pipeline (refiner on) once under each of the 8 presets' captions, in the dtype
`precision.preferred_dtype` picks. Scored as `alaya-flash eval` scores: PSNR against the prompted
preset's ground truth, and control (is the render nearest its own preset's ground truth, by how
many dB). About 2 s of rendering on one thread. `python tests/test_quality_guard.py` prints the
figures (what REFERENCE below was read from). A third test renders a 200-frame stream and checks that
it holds (the long-stream axis of `alaya-flash eval`).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.precision import preferred_dtype
from alaya_flash.model_zoo.training.data import DataConfig, render_clip
from alaya_flash.model_zoo.training.prompts import prompts as wordings
from alaya_flash.streaming import metrics
from alaya_flash.streaming.cli.commands.eval import _render
from alaya_flash.streaming.engine.pipelines import FlashPipeline, PromptSchedule
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


def guard_figures() -> dict:
    """Mean PSNR, nearest rate and mean control margin of the default model over the 8 presets' captions."""
    names = list(PRESETS)
    cfg = DataConfig(width=SIZE, height=SIZE, frames=FRAMES, fps=16.0, objects=12, presets=tuple(names),
                     train_clips=1, heldout_clips=1, heldout_seed=SCENE_SEED).validate()
    clip = render_clip(cfg, SCENE_SEED)
    gt = [torch.from_numpy(clip["rgb"][p]).float() / 255 for p in range(len(names))]
    flash = bundle.load_flash(None, dtype=preferred_dtype("cpu"))
    text = flash.text_encoder()
    psnr, hits, margins, misses = [], [], [], []
    for p, name in enumerate(names):
        sched = PromptSchedule.encode(text, wordings(name, "train")[0])
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


@pytest.fixture(scope="module")
def figures():
    return guard_figures()


def test_default_model_psnr_holds_on_a_held_out_clip(figures):
    floor = REFERENCE["psnr_db"] - PSNR_MARGIN_DB
    assert figures["psnr_db"] >= floor, f"PSNR {figures['psnr_db']:.2f} dB < {floor:.2f} dB (reference {REFERENCE})"


def test_default_model_prompt_control_holds_on_a_held_out_clip(figures):
    assert figures["nearest_rate"] >= MIN_NEAREST_RATE, f"misses: {figures['misses']}"
    floor = REFERENCE["margin_db"] - CONTROL_MARGIN_DB
    assert figures["margin_db"] >= floor, f"control margin {figures['margin_db']:+.2f} dB < {floor:+.2f} dB"



# The long stream: eval's long-stream axis (an unseen scene, one continuous stream) at 64x64 over 200
# frames with the model's own session. Measured (2026-12-05, Xeon-AMX, bf16, 2 threads, about 6 s):
# drop (first block - last block) 0.0 dB, a fresh stream at frame 100 +0.9 dB. With the training window
# of 6 latent frames instead of the shipped 1, the same run drops 2.6 dB and the fresh stream gains 4.2
# (docs/model-card.md, "Long streams"): the bounds below sit between the two.
MAX_LONG_DROP_DB = 1.0
MAX_FRESH_GAIN_DB = 2.0


def test_default_model_holds_over_a_long_stream():
    from alaya_flash.streaming.cli.commands.eval import long_stream

    flash = bundle.load_flash(None, dtype=preferred_dtype("cpu"))
    r = long_stream(flash, flash.text_encoder(), 200, 25, (64, 64))
    assert r["drop_db"] <= MAX_LONG_DROP_DB, f"long stream drops {r['drop_db']:.2f} dB: {r['psnr_db_by_block']}"
    gain = r["fresh_start"]["gain_db"]
    assert gain <= MAX_FRESH_GAIN_DB, f"a fresh stream at frame {r['fresh_start']['frame']} is {gain:.2f} dB better"


if __name__ == "__main__":
    print(json.dumps(guard_figures()))
