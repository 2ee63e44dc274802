"""What every field of a model folder's config.json may hold: one table, checked on load.

    check_network(path, "dit", {"num_heads": 0, ...})        # CheckpointError: ... must be in [1, 4096]
    check_session(path, "flash", {"steps": 1e9})              # CheckpointError: ... a whole number in [1, 50]
    check_trained_size(path, [-256, 1e300])                   # CheckpointError: ... in [8, 4096]

A config.json is input like a command line: a zero head count divided by zero, `steps 1e9` rendered
forever, a NaN shift rendered garbage. Each field is checked the way the CLI checks its flags
(streaming/cli/args.py: whole numbers whole, floats finite, everything in range) before anything is
allocated, and the error names the file, the key, the value and the range. The sampler settings'
ranges are the Flash and Teacher Sampler widgets' (nodes/render.py reads them from here).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError

MAX_SIZE = 1 << 20  # no width, count or length of a network is larger: beyond it a config is a typo or an attack
MAX_SIDE = 4096  # pixels per frame side (the CLI's bound)


@dataclass(frozen=True)
class Field:
    """kind: "int", "float", "bool", "str" or "choice"; ints and floats in [low, high]; an int with
    `step` also equal to `low` modulo `step` (a teacher window is 4k+1 frames); `each`: a list of them."""

    kind: str
    low: float = 0
    high: float = 0
    choices: tuple = ()
    step: int = 0
    each: bool = False
    length: int = 0  # a list of exactly this many (0: any number)

    def problem(self, value: Any) -> str | None:
        """What is wrong with value (None: nothing)."""
        if self.each:
            if not isinstance(value, (list, tuple)) or not value or self.length and len(value) != self.length:
                count = f"{self.length} " if self.length else ""
                return f"must be a list of {count}{self._what(plural=True)}, got {value!r}"
            one = Field(self.kind, self.low, self.high, self.choices, self.step)
            return next((f"item {i}: {p}" for i, p in ((i, one.problem(v)) for i, v in enumerate(value)) if p), None)
        if self.kind == "bool":
            return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
        if self.kind == "str":
            return None if isinstance(value, str) else f"must be a string, got {value!r}"
        if self.kind == "choice":
            return None if value in self.choices else f"is {value!r}, not one of {', '.join(map(repr, self.choices))}"
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind == "int" and not (number and isinstance(value, int)):  # 4.0 and 1e9 are JSON floats
            return f"must be {self._what()}, got {value!r}"
        if self.kind == "float" and not (number and math.isfinite(value)):
            return f"must be {self._what()}, got {value!r}"
        if not self.low <= value <= self.high:
            return f"is {value}, must be {self._what()}"
        if self.step and (value - self.low) % self.step:
            return f"is {value}, must be {self._what()}"
        return None

    def _what(self, plural: bool = False) -> str:
        if self.kind == "int":
            rule = "" if not self.step else f", a multiple of {self.step}" if self.low % self.step == 0 \
                else f", of the form {self.step}k+{self.low % self.step}"
            return f"{'whole numbers' if plural else 'a whole number'} in [{self.low}, {self.high}]{rule}"
        if self.kind == "float":
            return f"{'finite numbers' if plural else 'a finite number'} in [{self.low}, {self.high}]"
        return {"bool": "true or false values" if plural else "true or false"}.get(self.kind, self.kind)


def _int(low: int, high: int = MAX_SIZE, step: int = 0) -> Field:
    return Field("int", low, high, step=step)


def _ints(low: int, high: int = MAX_SIZE, length: int = 0) -> Field:
    return Field("int", low, high, each=True, length=length)


def _float(low: float, high: float) -> Field:
    return Field("float", low, high)


# The one table. Networks by family (model_zoo/registry.py), then the sampler settings by model kind
# ("session"), then the frame size a model was trained at.
NETWORKS: dict[str, dict[str, Field]] = {
    "dit": {
        "in_dim": _int(1), "out_dim": _int(1), "dim": _int(1), "ffn_dim": _int(1), "freq_dim": _int(2),
        "text_dim": _int(1), "text_len": _int(0), "num_heads": _int(1, 4096), "num_layers": _int(1, 1024),
        "patch_size": _ints(1, 64, length=3), "eps": _float(1e-12, 1.0), "rope_positions": _int(1), "rope_theta": _float(1.0, 1e12),
    },
    "tiny-codec": {"latent_channels": _int(1), "encoder_width": _int(1), "decoder_widths": _ints(1, length=4), "image_channels": _int(1)},
    "gbuffer-encoder": {"hidden": _int(1), "branches": _int(1, 64), "latent_channels": _int(1), "image_channels": _int(1),
                        "reads_light": Field("bool")},
    "wan-vae": {"base_dim": _int(1), "z_dim": _int(1), "dim_mult": _ints(1, 64), "num_res_blocks": _int(1, 64),
                "temporal_downsample": Field("bool", each=True)},
    "gbuffer-refiner": {"width": _int(1), "image_channels": _int(1), "text_dim": _int(0), "text_hidden": _int(1),
                        "context": _int(0), "prior": Field("bool"), "blend": Field("bool"),
                        "given": Field("bool"), "reflections": Field("bool"), "sky": Field("bool")},
    "umt5": {"vocab_size": _int(1), "d_model": _int(1), "d_ff": _int(1), "num_heads": _int(1, 4096), "d_kv": _int(1),
             "num_layers": _int(1, 1024), "num_buckets": _int(1), "max_distance": _int(1), "eps": _float(1e-12, 1.0)},
}
SESSION: dict[str, dict[str, Field]] = {
    "flash": {"steps": _int(1, 50), "shift": _float(0.1, 20.0), "chunk_frames": _int(1, 21),
              "window_frames": _int(1, 240), "sink_frames": _int(0, 21), "rope": Field("choice", choices=("absolute", "relative"))},
    "teacher": {"steps": _int(1, 200), "cfg": _float(1.0, 30.0), "shift": _float(0.1, 20.0),
                "window_frames": _int(1, 1001, step=4), "negative_prompt": Field("str")},
}
TRAINED_SIDE = _int(8, MAX_SIDE, step=8)
MODEL: dict[str, Field] = {"random_weights": Field("bool"), "notes": Field("str")}  # the other top-level keys


def _check(path: Path, section: str, table: dict[str, Field], values: dict) -> None:
    for key, value in values.items():
        field = table.get(key)
        if field is None:
            raise CheckpointError(f"{path}: {section} has unknown key {key!r} (known: {', '.join(table)})")
        problem = field.problem(value)
        if problem:
            raise CheckpointError(f"{path}: {section}.{key} {problem}")


def check_network(path: Path, role: str, family: str, values: dict) -> None:
    """A network's config entry (networks.ROLE.config) against its family's row."""
    _check(path, f"networks.{role}.config", NETWORKS[family], values)


def check_session(path: Path, kind: str, values: Any) -> None:
    """The sampler settings ('session') of a "flash" or "teacher" model; also the ones that only make
    sense together (a KV window holds at least one chunk)."""
    if values is None:
        return
    if not isinstance(values, dict):
        raise CheckpointError(f"{path}: 'session' must be an object, got {values!r}")
    _check(path, "session", SESSION[kind], values)
    chunk, window = values.get("chunk_frames"), values.get("window_frames")
    if kind == "flash" and chunk is not None and window is not None and window < chunk:
        raise CheckpointError(f"{path}: session.window_frames ({window}) must be at least session.chunk_frames ({chunk})")


def check_model(path: Path, cfg: dict) -> None:
    """The top-level fields beside networks, session and trained_size (each optional), and each network
    entry's config_name (a label: a string or null)."""
    for key, field in MODEL.items():
        problem = field.problem(cfg[key]) if key in cfg else None
        if problem:
            raise CheckpointError(f"{path}: {key} {problem}")
    for role, entry in cfg["networks"].items():
        name = entry.get("config_name") if isinstance(entry, dict) else None
        if name is not None and not isinstance(name, str):
            raise CheckpointError(f"{path}: networks.{role}.config_name must be a string or null, got {name!r}")


def check_trained_size(path: Path, value: Any) -> None:
    """trained_size: null or [height, width], each side a multiple of 8 in [8, 4096]."""
    if value is None:
        return
    if not isinstance(value, list) or len(value) != 2:
        raise CheckpointError(f"{path}: trained_size must be [height, width] or null, got {value!r}")
    for name, side in zip(("height", "width"), value):
        problem = TRAINED_SIDE.problem(side)
        if problem:
            raise CheckpointError(f"{path}: trained_size {name} {problem}")
