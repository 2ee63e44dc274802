"""Which safetensors files hold one set of weights: a single file, or shards through their index.

A weight unit is a `.safetensors` file or a `<name>.safetensors.index.json` (`weight_map`: key ->
shard file, as Wan and diffusers repos ship large models). `unit_parts` returns its files, each
with its header, after checking the set: a missing shard, a key the index puts in a shard that
lacks it, a shard holding keys the index does not map there, and a shard given without its index
are each refused in one line; a shard given alone is read through the index beside it. Pickles
(.pth, .bin, ...) are refused here, before they are opened.

The teacher's published files (published.py) and the Flash release's transformer/ (helios.py)
are both read through these checks.
"""
from __future__ import annotations

import re
from pathlib import Path

from .errors import CheckpointError
from . import jsonfile
from .loading import read_header, read_metadata
from .pickled import PICKLE_SUFFIXES

SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.safetensors$")


def refuse_non_safetensors(path: Path) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        hint = ""
        low = path.name.lower()
        if "vae" in low:
            hint = " (the Wan2.1 VAE as safetensors: ComfyUI's models/vae/wan_2.1_vae.safetensors, or a diffusers repo's vae/ folder)"
        elif "t5" in low:
            hint = " (umT5-XXL as safetensors: ComfyUI's models/text_encoders/umt5_xxl_fp16.safetensors, or a diffusers repo's text_encoder/)"
        raise CheckpointError(f"{path}: a PyTorch pickle ({path.suffix}); only .safetensors are read here{hint}")
    raise CheckpointError(f"{path}: not a weight file this renderer reads (.safetensors, a .safetensors.index.json, or a folder)")


def index_parts(index: Path) -> tuple[list[tuple[Path, dict]], dict]:
    """The shards of an index, each with its header (only the keys the index maps to it), checked."""
    try:
        data = jsonfile.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{index}: not a readable index ({err})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no 'weight_map' (an index maps each tensor name to its shard file)")
    by_file: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        by_file.setdefault(name, []).append(key)
    parts, metadata = [], {}
    for name in sorted(by_file):
        shard = index.parent / name
        if not shard.is_file():
            raise CheckpointError(f"{index}: shard {name} is missing ({len(by_file[name])} tensors, e.g. {by_file[name][0]})")
        header = read_header(shard)
        absent = [k for k in by_file[name] if k not in header]
        if absent:
            raise CheckpointError(f"{shard}: {len(absent)} tensors the index maps here are not in it (e.g. {absent[0]})")
        extra = sorted(set(header) - set(by_file[name]) - {"scaled_fp8"})
        if extra:
            raise CheckpointError(f"{shard}: holds {len(extra)} tensors its index {index.name} does not map here (e.g. {extra[0]})")
        parts.append((shard, header))
        metadata.update(read_metadata(shard))
    return parts, metadata


def shard_index(path: Path) -> Path | None:
    """The index beside a shard file (name-0000N-of-0000M.safetensors), if there is one."""
    m = SHARD_RE.match(path.name)
    if not m:
        return None
    index = path.with_name(f"{m['stem']}.safetensors.index.json")
    return index if index.is_file() else None


def unit_parts(path: Path) -> tuple[list[tuple[Path, dict]], dict, str, str]:
    """A file or an index -> (parts, metadata, source, layout)."""
    if path.name.endswith(".index.json"):
        parts, meta = index_parts(path)
        return parts, meta, str(path), f"sharded ({len(parts)} files + index)"
    if path.suffix != ".safetensors":
        refuse_non_safetensors(path)
    index = shard_index(path)
    if index is not None:  # one shard given: read the whole set through its index
        parts, meta = index_parts(index)
        return parts, meta, str(index), f"sharded ({len(parts)} files + index)"
    m = SHARD_RE.match(path.name)
    if m:
        raise CheckpointError(f"{path}: shard {int(m['i'])} of {int(m['n'])} without its index "
                              f"({m['stem']}.safetensors.index.json); a shard alone is not a model")
    return [(path, read_header(path))], read_metadata(path), str(path), "single file"
