"""The light head: a prompt -> the `Light` it asks for (model_zoo/light.py).

It reads the prompt encoder's outputs (all-MiniLM-L6-v2: the pooled sentence embedding and each
token's output) and answers two questions, each a classifier:

    preset  pooled -> MLP -> logits over a table of named lights (the worlds' lighting presets);
            the light is the softmax mixture of the table's rows (colours, elevations, fog ...)
    side    each token -> MLP -> logits over (ahead, left, behind, right, none), max over tokens;
            the sun's azimuth is that of the likeliest side, NO_SIDE_AZIMUTH for "none"

The side reads tokens because pooled embeddings barely tell left from right (0.02 apart, against
about 0.5 at the side's own token: docs/text-encoder.md). A user's wording lands on the nearest
preset; an explicit Light (CLI, node, engine) overrides the head's. The table, its names and the
text encoder the head was trained on travel in its safetensors file (tensor `table`, metadata).
`alaya-flash train light-head` trains it (training/light_head.py); model_zoo/light/ ships one.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .errors import CheckpointError
from .light import PACKED, SLICES, Light, pack

SIDES = ("ahead", "left", "behind", "right", "none")
SIDE_AZIMUTH = {"ahead": 0.0, "left": 90.0, "behind": 180.0, "right": -90.0}
NO_SIDE_AZIMUTH = 135.0  # no side named: the sun behind the camera, to the left (front-lit, shadows visible)
FORMAT = "alaya-flash/light-head"


@dataclass(frozen=True)
class LightHeadConfig:
    text_dim: int = 384
    hidden: int = 128  # the preset MLP's hidden width
    token_hidden: int = 64  # the side MLP's hidden width
    text_encoder: str = "all-minilm-l6-v2"


class LightHead(nn.Module):
    def __init__(self, cfg: LightHeadConfig, names: list[str], table: Tensor):
        super().__init__()
        if table.shape != (len(names), PACKED):
            raise CheckpointError(f"light head: a table of {len(names)} lights must be ({len(names)}, {PACKED}), "
                                  f"got {tuple(table.shape)}")
        self.config, self.names = cfg, list(names)
        self.register_buffer("table", table.float().clone())
        self.preset = nn.Sequential(nn.Linear(cfg.text_dim, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, len(names)))
        self.side = nn.Sequential(nn.Linear(cfg.text_dim, cfg.token_hidden), nn.ReLU(),
                                  nn.Linear(cfg.token_hidden, len(SIDES)))

    def forward(self, pooled: Tensor, tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """pooled (B, D), tokens (B, L, D), mask (B, L) -> preset logits (B, K), side logits (B, 5)."""
        side = self.side(tokens).masked_fill(~mask.bool()[..., None], -1e4).amax(1)
        return self.preset(pooled), side

    def packed(self, pooled: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
        """The lights the prompts ask for, packed (B, PACKED)."""
        preset, side = self(pooled, tokens, mask)
        out = preset.softmax(-1) @ self.table
        azimuth = torch.tensor([SIDE_AZIMUTH.get(s, NO_SIDE_AZIMUTH) for s in SIDES])[side.argmax(-1)]
        out[:, SLICES["sun_azimuth"]] = azimuth[:, None]
        return out

    def describe(self, pooled: Tensor, tokens: Tensor, mask: Tensor) -> list[dict]:
        """Per prompt: the nearest preset, its probability, the side read."""
        preset, side = self(pooled, tokens, mask)
        p = preset.softmax(-1)
        return [{"preset": self.names[int(k)], "p": round(float(p[i, k]), 3), "side": SIDES[int(side[i].argmax())]}
                for i, k in enumerate(p.argmax(-1))]


def save(head: LightHead, path: str | Path, notes: dict | None = None) -> None:
    from .loading import save_safetensors

    meta = {"format": FORMAT, "config": json.dumps(asdict(head.config)), "names": json.dumps(head.names),
            "notes": json.dumps(notes or {})}
    save_safetensors({k: v.detach().contiguous() for k, v in head.state_dict().items()}, Path(path), meta)


def load(path: str | Path | None = None) -> LightHead:
    """A light head file, strictly (the shipped one when path is None)."""
    from .loading import load_strict, read_metadata, read_shapes

    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise CheckpointError(f"light head: {path} is missing")
    meta = read_metadata(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a light head (format {meta.get('format')!r}, expected {FORMAT!r})")
    try:
        cfg = LightHeadConfig(**json.loads(meta["config"]))
        names = json.loads(meta["names"])
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: unreadable light head metadata ({err})") from None
    head = LightHead(cfg, names, torch.zeros(read_shapes(path).get("table", (len(names), PACKED))))
    load_strict(head, path)
    return head.eval().requires_grad_(False)


def default_path() -> Path:
    return Path(__file__).resolve().parent / "light" / "light_head.safetensors"


def table_of(lights: dict[str, Light]) -> tuple[list[str], Tensor]:
    """Names and packed rows of named lights, their azimuths zeroed (the side head sets it)."""
    names = list(lights)
    return names, pack([lights[n].replace(sun_azimuth=0.0) for n in names])
