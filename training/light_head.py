"""Stage light-head: teach the light head (model_zoo/light_head.py) what light a prompt asks for.

    alaya-flash train light-head --config training/configs/light-head.json

Supervision comes from what the worlds already know: every wording of a lighting preset
(prompts.py: the train, refiner and anchor splits; the held-out split is never read) names that
preset; world v2's captions name the sun's side ("..., with the sun on the left, ..."), and so do
the wordings of presets with a sun or moon, each with side phrases drawn from side_phrases.py's
grammar appended (3 a side per wording), so every side is named as often and in the same carrier
words; every wording also appears with a clause that names no side. The prompt encoder runs once
over every example; the head (two small MLPs, about 77k weights) then trains on the cached outputs,
with noise on them so it does not fit the exact points. The report scores the held-out paraphrases,
alone (their preset, no side) and with each of side_phrases.HELDOUT (six a side, never generated
for training): nearest preset, sun side (per side), and the sun elevation of the mixed light
against the preset's.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model_zoo.errors import AlayaError
from .common import StageConfig

TRAIN_SPLITS = ("train", "refiner", "anchor")


@dataclass(frozen=True)
class LightHeadStageConfig(StageConfig):
    out: str = "runs/light-head"
    steps: int = 600
    batch: int = 256  # texts a step, drawn at random
    lr: float = 3e-3
    noise: float = 0.03  # Gaussian noise on the encoder's outputs per step (unit-norm embeddings)
    weight_decay: float = 1e-3
    side_phrases: int = 3  # phrases per side drawn for each training wording of a preset with a sun or moon

    def validate(self):
        if min(self.steps, self.batch, self.side_phrases) < 1:
            raise AlayaError(f"light-head: steps {self.steps}, batch {self.batch} and side_phrases {self.side_phrases} "
                             "must be >= 1")
        if self.noise < 0 or self.lr <= 0:
            raise AlayaError(f"light-head: noise {self.noise} must be >= 0 and lr {self.lr} > 0")
        return self


def preset_lights() -> dict:
    """Every lighting preset the worlds know, as camera-relative Lights (the light head's table)."""
    from ..streaming.world.traced.presets import named_lights

    return named_lights()


def _light_word(preset: str) -> str | None:
    from ..streaming.world.traced.presets import TRACED_PRESETS

    return TRACED_PRESETS[preset].light if preset in TRACED_PRESETS else None


def _join(wording: str, phrase: str) -> str:
    return f"{wording.rstrip('.')}, {phrase}"


def examples(split: str, per_side: int = 3, seed: int = 0) -> list[tuple[str, str, str]]:
    """(text, preset, side) for 'train' (every wording and caption it may learn from) or 'heldout'.
    Training: every wording alone and with a clause that names no side ('none'); the wordings of
    presets with a sun or moon with `per_side` phrases per side drawn from side_phrases' grammar
    (seeded); world v2's captions. Held-out: the held-out wordings alone and with every HELDOUT phrase."""
    from ..streaming.world.traced.presets import SIDES as CAPTION_SIDES
    from ..streaming.world.traced.presets import TRACED_PRESETS, caption
    from ..streaming.world.traced.scene import KINDS
    from .prompts import prompts
    from .side_phrases import HELDOUT, neutral_phrase, side_phrase

    rng = random.Random(seed)
    out = []
    for preset in preset_lights():
        light = _light_word(preset)
        if split == "heldout":
            for wording in prompts(preset, "heldout"):
                out.append((wording, preset, "none"))
                for side, phrases in (HELDOUT.items() if light else ()):
                    out += [(_join(wording, p.format(light=light)), preset, side) for p in phrases]
            continue
        wordings = [w for s in TRAIN_SPLITS for w in prompts(preset, s)]
        out += [(w, preset, "none") for w in wordings]
        out += [(_join(w, neutral_phrase(rng)), preset, "none") for w in wordings]
        if light:
            for wording in wordings:
                for side in HELDOUT:
                    out += [(_join(wording, side_phrase(side, light, rng)), preset, side) for _ in range(per_side)]
        if preset in TRACED_PRESETS:
            for kind in KINDS:
                out.append((caption(TRACED_PRESETS[preset], kind, None), preset, "none"))
                if light:
                    out += [(caption(TRACED_PRESETS[preset], kind, s), preset, s) for s in CAPTION_SIDES]
    return list(dict.fromkeys(out))


def _encode(text_encoder, texts: list[str], batch: int = 64):
    """The encoder's outputs for every text, padded to one length: pooled (N, D), tokens (N, L, D), mask (N, L)."""
    parts = [text_encoder.states(texts[a:a + batch]) for a in range(0, len(texts), batch)]
    longest = max(p[1].shape[1] for p in parts)
    pooled = torch.cat([p[0] for p in parts])
    tokens = torch.cat([F.pad(p[1], (0, 0, 0, longest - p[1].shape[1])) for p in parts])
    mask = torch.cat([F.pad(p[2], (0, longest - p[2].shape[1])) for p in parts])
    return pooled, tokens, mask


def score(head, text_encoder, items: list[tuple[str, str, str]], encoded=None) -> dict:
    """Nearest-preset rate, sun-side rate (on texts naming a side, and 'none' on those that do not) and
    the mixed light's sun elevation error against the preset's, each text encoded alone as at render time
    (or read from `encoded`, the padded outputs `_encode` gave for the items)."""
    from ..model_zoo.light import SLICES
    from ..model_zoo.light_head import SIDES

    lights = preset_lights()
    preset_right, side_right, none_right, sided, plain, errors, misses = 0, 0, 0, 0, 0, [], []
    by_side: dict[str, list[int]] = {}
    with torch.no_grad():
        for i, (text, preset, side) in enumerate(items):
            if encoded is None:
                pooled, tokens, mask = text_encoder.states([text])
            else:
                pooled, tokens, mask = (x[i:i + 1] for x in encoded)
            logits, side_logits = head(pooled, tokens, mask)
            got = head.names[int(logits.argmax())]
            got_side = SIDES[int(side_logits.argmax())]
            elevation = float(head.packed(pooled, tokens, mask)[0, SLICES["sun_elevation"]])
            errors.append(abs(elevation - lights[preset].sun_elevation))
            preset_right += got == preset
            by_side.setdefault(side, []).append(got_side == side)
            if side == "none":
                plain += 1
                none_right += got_side == "none"
            else:
                sided += 1
                side_right += got_side == side
            if got != preset or got_side != side:
                misses.append(f"{text!r}: {preset}/{side} -> {got}/{got_side}")
    errors.sort()
    return {"texts": len(items), "preset_rate": preset_right / len(items),
            "side_rate": side_right / sided if sided else None, "none_rate": none_right / plain if plain else None,
            "side_rate_by_side": {s: sum(v) / len(v) for s, v in by_side.items()},
            "elevation_error_deg": {"median": errors[len(errors) // 2], "within_10": sum(e <= 10 for e in errors) / len(errors)},
            "misses": misses}


def fit(cfg: LightHeadStageConfig, encoded, items: list[tuple[str, str, str]], log=None, progress=None):
    """A light head trained on the encoder's outputs `encoded` (pooled, tokens, mask) of `items`."""
    from ..model_zoo.light_head import SIDES, LightHead, LightHeadConfig, table_of

    pooled, tokens, mask = encoded
    names, table = table_of(preset_lights())
    preset_target = torch.tensor([names.index(p) for _, p, _ in items])
    side_target = torch.tensor([SIDES.index(s) for _, _, s in items])
    torch.manual_seed(cfg.seed)
    head = LightHead(LightHeadConfig(text_dim=pooled.shape[1]), names, table)
    optim = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    for step in range(cfg.steps):
        pick = torch.randperm(len(items), generator=gen)[:cfg.batch]
        length = int(mask[pick].sum(1).max())  # the batch's longest text: less padding to run
        noisy = [x + cfg.noise * torch.randn(x.shape, generator=gen) for x in (pooled[pick], tokens[pick, :length])]
        preset_logits, side_logits = head(noisy[0], noisy[1], mask[pick, :length])
        loss_preset = F.cross_entropy(preset_logits, preset_target[pick])
        loss_side = F.cross_entropy(side_logits, side_target[pick])
        optim.zero_grad()
        (loss_preset + loss_side).backward()
        optim.step()
        losses = {"preset": loss_preset.item(), "side": loss_side.item()}
        if not all(math.isfinite(v) for v in losses.values()):
            raise AlayaError(f"light-head: the loss is not finite at step {step + 1}; lower lr")
        if progress:
            progress(step + 1, losses)
        if log and ((step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps):
            log.info("step %d preset=%.4f side=%.4f", step + 1, losses["preset"], losses["side"])
    return head.eval()


def run_light_head(cfg: LightHeadStageConfig, log, progress=None) -> int:
    from ..model_zoo.light_head import save
    from ..model_zoo.text_encoder import TextEncoder

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    text_encoder = TextEncoder.load()
    train = examples("train", cfg.side_phrases, cfg.seed)
    log.info("light-head: %d training texts over %d presets", len(train), len(preset_lights()))
    encoded = _encode(text_encoder, [t for t, _, _ in train])
    head = fit(cfg, encoded, train, log, progress)
    report = {"train": score(head, text_encoder, train, encoded), "heldout": score(head, text_encoder, examples("heldout"))}
    h = report["heldout"]
    log.info("held-out: preset %.1f%%, side %.1f%% (%s; none %.1f%%), elevation within 10 degrees %.1f%%",
             100 * h["preset_rate"], 100 * h["side_rate"],
             ", ".join(f"{s} {100 * r:.1f}%" for s, r in h["side_rate_by_side"].items() if s != "none"),
             100 * h["none_rate"], 100 * h["elevation_error_deg"]["within_10"])
    save(head, out / "light_head.safetensors", notes={"steps": cfg.steps, "heldout": {k: v for k, v in h.items() if k != "misses"}})
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return cfg.steps
