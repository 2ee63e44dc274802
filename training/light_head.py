"""Stage light-head: teach the light head (model_zoo/light_head.py) what light a prompt asks for.

    alaya-flash train light-head --config training/configs/light-head.json

Supervision comes from what the worlds already know: every wording of a lighting preset
(prompts.py: the train, refiner and anchor splits; the held-out split is never read) names that
preset; world v2's captions name the sun's side ("..., with the sun on the left, ..."), and so do
the training wordings of presets with a sun or moon, each with one of TRAIN_SIDE_PHRASES appended.
The prompt encoder runs once over every example; the head (two small MLPs, about 60k weights)
then trains in seconds on the cached outputs, with noise on them so it does not fit the exact
points. The report scores the held-out paraphrases, alone (their preset, no side) and with the
side phrasings of HELDOUT_SIDE_PHRASES, which no training example uses: nearest preset, sun side,
and the sun elevation of the mixed light against the preset's.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model_zoo.errors import AlayaError
from .common import StageConfig

# How training wordings name the sun's side ({light}: sun or moon); the first is world v2's caption phrase.
TRAIN_SIDE_PHRASES = {
    "ahead": ("with the {light} ahead, shining towards the camera", "facing the {light}", "the {light} in front of us",
              "looking into the {light}", "against the {light}, everything in silhouette", "the camera pointed at the {light}",
              "into the glare of the {light}"),
    "left": ("with the {light} on the left", "the {light} to the left", "{light}light from the left",
             "lit from the left side", "the {light} over on the left", "light coming from the left",
             "the {light} on the left-hand side"),
    "behind": ("with the {light} behind the camera", "the {light} at the viewer's back", "lit from behind the camera",
               "the {light} behind us", "our backs to the {light}", "the {light} over the camera's shoulder",
               "front-lit by the {light} behind the camera"),
    "right": ("with the {light} on the right", "the {light} to the right", "{light}light from the right",
              "lit from the right side", "the {light} over on the right", "light coming from the right",
              "the {light} on the right-hand side"),
}
# Never trained on: what a user might write instead.
HELDOUT_SIDE_PHRASES = {
    "ahead": ("backlit, the {light} straight ahead of the viewer", "shooting straight into the {light}"),
    "left": ("the {light} low on our left", "light falling in from the left-hand side"),
    "behind": ("the {light} at our backs", "the {light} shining from behind the viewer"),
    "right": ("the {light} off to the right", "light falling in from the right-hand side"),
}
TRAIN_SPLITS = ("train", "refiner", "anchor")


@dataclass(frozen=True)
class LightHeadStageConfig(StageConfig):
    out: str = "runs/light-head"
    steps: int = 300
    lr: float = 3e-3
    noise: float = 0.03  # Gaussian noise on the encoder's outputs per step (unit-norm embeddings)
    weight_decay: float = 1e-3

    def validate(self):
        if self.steps < 1:
            raise AlayaError(f"light-head: steps {self.steps} must be >= 1")
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


def _with_side(wording: str, phrase: str, light: str) -> str:
    return f"{wording.rstrip('.')}, {phrase.format(light=light)}"


def examples(split: str) -> list[tuple[str, str, str]]:
    """(text, preset, side) for 'train' (every wording and caption it may learn from) or 'heldout'."""
    from ..streaming.world.traced.presets import SIDES as CAPTION_SIDES
    from ..streaming.world.traced.presets import TRACED_PRESETS, caption
    from ..streaming.world.traced.scene import KINDS
    from .prompts import prompts

    out = []
    for preset in preset_lights():
        light = _light_word(preset)
        if split == "heldout":
            for wording in prompts(preset, "heldout"):
                out.append((wording, preset, "none"))
                for side, phrases in (HELDOUT_SIDE_PHRASES.items() if light else ()):
                    out += [(_with_side(wording, p, light), preset, side) for p in phrases]
            continue
        wordings = [w for s in TRAIN_SPLITS for w in prompts(preset, s)]
        out += [(w, preset, "none") for w in wordings]
        if light:
            for k, wording in enumerate(w for s in TRAIN_SPLITS[:2] for w in prompts(preset, s)):
                for side, phrases in TRAIN_SIDE_PHRASES.items():
                    out.append((_with_side(wording, phrases[k % len(phrases)], light), preset, side))
        if preset in TRACED_PRESETS:
            for kind in KINDS:
                out.append((caption(TRACED_PRESETS[preset], kind, None), preset, "none"))
                if light:
                    out += [(caption(TRACED_PRESETS[preset], kind, s), preset, s) for s in CAPTION_SIDES]
    return out


def _encode(text_encoder, texts: list[str], batch: int = 64):
    """The encoder's outputs for every text, padded to one length: pooled (N, D), tokens (N, L, D), mask (N, L)."""
    parts = [text_encoder.states(texts[a:a + batch]) for a in range(0, len(texts), batch)]
    longest = max(p[1].shape[1] for p in parts)
    pooled = torch.cat([p[0] for p in parts])
    tokens = torch.cat([F.pad(p[1], (0, 0, 0, longest - p[1].shape[1])) for p in parts])
    mask = torch.cat([F.pad(p[2], (0, longest - p[2].shape[1])) for p in parts])
    return pooled, tokens, mask


def score(head, text_encoder, items: list[tuple[str, str, str]]) -> dict:
    """Nearest-preset rate, sun-side rate (on texts naming a side, and 'none' on those that do not) and
    the mixed light's sun elevation error against the preset's, each text encoded alone as at render time."""
    from ..model_zoo.light import SLICES
    from ..model_zoo.light_head import SIDES

    lights = preset_lights()
    preset_right, side_right, none_right, sided, plain, errors, misses = 0, 0, 0, 0, 0, [], []
    by_side: dict[str, list[int]] = {}
    with torch.no_grad():
        for text, preset, side in items:
            pooled, tokens, mask = text_encoder.states([text])
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


def run_light_head(cfg: LightHeadStageConfig, log, progress=None) -> int:
    from ..model_zoo.light_head import SIDES, LightHead, LightHeadConfig, save, table_of
    from ..model_zoo.text_encoder import TextEncoder

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    text_encoder = TextEncoder.load()
    train = examples("train")
    names, table = table_of(preset_lights())
    log.info("light-head: %d training texts over %d presets", len(train), len(names))
    pooled, tokens, mask = _encode(text_encoder, [t for t, _, _ in train])
    preset_target = torch.tensor([names.index(p) for _, p, _ in train])
    side_target = torch.tensor([SIDES.index(s) for _, _, s in train])
    head = LightHead(LightHeadConfig(text_dim=pooled.shape[1]), names, table)
    optim = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    for step in range(cfg.steps):
        noisy = [x + cfg.noise * torch.randn(x.shape, generator=gen) for x in (pooled, tokens)]
        preset_logits, side_logits = head(noisy[0], noisy[1], mask)
        loss_preset = F.cross_entropy(preset_logits, preset_target)
        loss_side = F.cross_entropy(side_logits, side_target)
        optim.zero_grad()
        (loss_preset + loss_side).backward()
        optim.step()
        losses = {"preset": loss_preset.item(), "side": loss_side.item()}
        if progress:
            progress(step + 1, losses)
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            log.info("step %d preset=%.4f side=%.4f", step + 1, losses["preset"], losses["side"])
    head.eval()
    report = {"train": score(head, text_encoder, train), "heldout": score(head, text_encoder, examples("heldout"))}
    h = report["heldout"]
    log.info("held-out: preset %.1f%%, side %.1f%% (none %.1f%%), elevation within 10 degrees %.1f%%",
             100 * h["preset_rate"], 100 * h["side_rate"], 100 * h["none_rate"], 100 * h["elevation_error_deg"]["within_10"])
    save(head, out / "light_head.safetensors", notes={"steps": cfg.steps, "heldout": {k: v for k, v in h.items() if k != "misses"}})
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    if not math.isfinite(losses["preset"]):
        raise AlayaError("light-head: the loss is not finite; lower lr")
    return cfg.steps
