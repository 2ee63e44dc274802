"""Safetensors in, safetensors out: strict, checked loading and atomic saving of weights.

Only `.safetensors` files are ever opened; no pickle is loaded. A checkpoint whose keys are
missing, unexpected or mis-shaped is refused with the first offenders and their counts named.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Mapping

import torch
from torch import nn

from .errors import CheckpointError

MAX_LISTED = 5  # offenders named per category in an error message


def shape_str(shape) -> str:
    """(1536, 96, 1, 2, 2) -> '1536x96x1x2x2'; a scalar -> '' (the format of the shared key files)."""
    return "x".join(str(int(s)) for s in shape)


def spec_lines(module: nn.Module) -> list[str]:
    """One 'name shape' line per parameter and persistent buffer, sorted by name."""
    return [f"{name} {shape_str(t.shape)}" for name, t in sorted(module.state_dict().items())]


def _open_checked(path: Path):
    from safetensors import safe_open

    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: only .safetensors weight files are loaded (got {path.suffix or 'no suffix'})")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weight file")
    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a safetensors file (configs are stored here as JSON)."""
    with _open_checked(Path(path)) as f:
        return dict(f.metadata() or {})


def read_shapes(path: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors file, without reading the data."""
    with _open_checked(Path(path)) as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def read_state_dict(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file (memory-mapped by safetensors on CPU)."""
    path = Path(path)
    with _open_checked(path) as f:
        try:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:
            raise CheckpointError(f"{path}: truncated or corrupt tensor data ({err})") from None
    if str(device) != "cpu":
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors


def check_shapes(
    expected: Mapping[str, tuple[int, ...]], got: Mapping[str, tuple[int, ...]], source: str
) -> None:
    """Raise CheckpointError naming missing, unexpected and mis-shaped keys (first few of each)."""
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    misshaped = sorted(k for k in set(expected) & set(got) if tuple(expected[k]) != tuple(got[k]))
    if not (missing or unexpected or misshaped):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({', '.join(missing[:MAX_LISTED])}{', ...' if len(missing) > MAX_LISTED else ''})")
    if unexpected:
        parts.append(
            f"{len(unexpected)} unexpected ({', '.join(unexpected[:MAX_LISTED])}{', ...' if len(unexpected) > MAX_LISTED else ''})"
        )
    if misshaped:
        shown = ", ".join(
            f"{k} is {shape_str(got[k])}, expected {shape_str(expected[k])}" for k in misshaped[:MAX_LISTED]
        )
        parts.append(f"{len(misshaped)} mis-shaped ({shown}{', ...' if len(misshaped) > MAX_LISTED else ''})")
    raise CheckpointError(f"{source}: keys do not match the network: " + "; ".join(parts))


def load_strict(
    module: nn.Module,
    weights: str | os.PathLike | Mapping[str, torch.Tensor],
    convert: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> nn.Module:
    """Load weights (a safetensors path or a state dict) into module, strictly.

    convert maps another naming (e.g. diffusers') to the module's names before checking.
    Tensors are cast to each parameter's dtype; a module on the meta device is materialised.
    """
    source = str(weights) if isinstance(weights, (str, os.PathLike)) else "state dict"
    state = read_state_dict(weights) if isinstance(weights, (str, os.PathLike)) else dict(weights)
    if convert is not None:
        state = convert(state)
    own = module.state_dict()
    check_shapes({k: tuple(v.shape) for k, v in own.items()}, {k: tuple(v.shape) for k, v in state.items()}, source)
    state = {k: v.to(own[k].dtype) for k, v in state.items()}
    on_meta = any(t.is_meta for t in own.values())
    module.load_state_dict(state, strict=True, assign=on_meta)
    return module


def save_safetensors(
    tensors: Mapping[str, torch.Tensor], path: str | os.PathLike, metadata: Mapping[str, object] | None = None
) -> Path:
    """Write tensors atomically (name.tmp then os.replace). Non-string metadata is stored as JSON."""
    from safetensors.torch import save_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: weights are saved as .safetensors only")
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (metadata or {}).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path
