"""Name the known config of a safetensors file from its keys and shapes only (never its file name).

Every named config of every registered family is built on the meta device and its key shapes
are compared with the file's (after the family's name conversion, e.g. diffusers -> Wan-native).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import registry
from .errors import CheckpointError
from .loading import check_shapes, read_metadata, read_shapes


@dataclass
class Identification:
    """matches: config names whose keys and shapes equal the file's; else the closest and why not."""

    path: str
    matches: list[tuple[str, str]] = field(default_factory=list)  # (config name, family)
    converted: bool = False  # the file used another naming (converted on load)
    closest: tuple[str, str] | None = None
    mismatch: str = ""  # what differs from the closest config
    metadata_name: str | None = None

    def describe(self) -> str:
        if self.matches:
            names = ", ".join(f"{n} (family {f})" for n, f in self.matches)
            naming = "converted names" if self.converted else "native names"
            extra = f"; metadata says {self.metadata_name}" if self.metadata_name else ""
            return f"{self.path}: {names}; {naming}{extra}"
        if self.closest is None:
            return f"{self.path}: matches no known config (no registered family)"
        return f"{self.path}: matches no known config; closest {self.closest[0]} (family {self.closest[1]}): {self.mismatch}"


def _spec_shapes(name: str) -> dict[str, tuple[int, ...]]:
    module = registry.build(name, device="meta")
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def identify(path: str | os.PathLike) -> Identification:
    """Which named configs a weight file is (see module docstring)."""
    shapes = read_shapes(path)
    result = Identification(path=str(path), metadata_name=read_metadata(path).get("config_name"))
    best = None
    for name, (family, _cfg) in registry.all_configs().items():
        convert = getattr(registry._family_module(family), "convert_names", None)
        got = convert(shapes) if convert else shapes
        want = _spec_shapes(name)
        if got == want:
            result.matches.append((name, family))
            result.converted = result.converted or set(got) != set(shapes)
            continue
        diff = len(set(got) ^ set(want)) + sum(1 for k in set(got) & set(want) if got[k] != want[k])
        if best is None or diff < best[0]:
            best = (diff, name, family, got, want)
    if not result.matches and best is not None:
        _, name, family, got, want = best
        result.closest = (name, family)
        try:
            check_shapes(want, got, "keys")
        except CheckpointError as err:
            result.mismatch = str(err).removeprefix("keys: keys do not match the network: ")
    return result
