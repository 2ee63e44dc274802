"""Tensors out of a PyTorch pickle (.pth, .pt, .bin, .ckpt), and nothing else: no code is ever run.

Wan-AI's folders ship the Wan2.1 VAE (`Wan2.1_VAE.pth`) and the umT5 encoder
(`models_t5_umt5-xxl-enc-bf16.pth`) as pickles. A pickle is a program: unpickled as such it can
call anything (os.system, exec, ...). These files are read with torch's restricted unpickler,
`torch.load(weights_only=True)`, which rebuilds tensors, storages, dicts, lists, tuples and plain
numbers, and refuses any other global the file names before calling it. What comes back must be a
state dict (names -> tensors); anything else is refused too. Files in torch's zip format (every
torch.save since 1.6) are memory-mapped (`mmap=True`): tensors are read from disk when first used,
as from a safetensors file.
"""
from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import torch

from .errors import CheckpointError

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle")
READER = "torch.load(weights_only=True): tensors only, no code run"  # how `model identify` says it is read
# torch dtypes -> safetensors' dtype names (the names the rest of model_zoo speaks)
DTYPE_NAMES = {
    torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2", torch.int8: "I8", torch.uint8: "U8",
    torch.int16: "I16", torch.int32: "I32", torch.int64: "I64", torch.bool: "BOOL",
}  # fmt: skip


def is_pickle(path: str | os.PathLike) -> bool:
    """A pickle by its name (.pth, .pt, ...) or its first bytes (torch's zip container, a bare pickle)."""
    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    # a safetensors file starts with its header's length (8 bytes, little-endian), then "{"
    return head[:2] == b"PK" or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05") and head[8:9] != b"{")


def read_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict of a pickle, read tensors-only (module docstring); one line naming the file when
    it is not one, or when it asks for anything but tensors (that part of it never runs)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    named = path.suffix.lower() in PICKLE_SUFFIXES  # torch.load reads some other names (.safetensors) as their format
    mmap = named and zipfile.is_zipfile(path)  # torch's zip format maps; the legacy format is read whole
    try:
        if named:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        else:
            with open(path, "rb") as f:
                state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as err:  # the restricted unpickler's UnpicklingError, or a corrupt / non-torch file
        raise CheckpointError(f"{path}: refused: {_why(err)}; a pickle is read for its tensors only "
                              "(torch.load weights_only) and nothing in it is run") from None
    if isinstance(state, dict) and set(state) == {"state_dict"} and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # a checkpoint that wraps its weights
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        got = type(state).__name__ if not isinstance(state, dict) else \
            next(f"{k!r}: {type(v).__name__}" for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor)))
        raise CheckpointError(f"{path}: expected a state dict (names -> tensors), got {got}")
    return state


def header(state: dict[str, torch.Tensor]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype name) of a state dict: what loading.read_header gives for a file."""
    return {k: (tuple(v.shape), DTYPE_NAMES.get(v.dtype, str(v.dtype).removeprefix("torch."))) for k, v in state.items()}


def _why(err: Exception) -> str:
    """torch's multi-paragraph refusal, cut to what the file asked for."""
    text = str(err)
    asked = re.search(r"(?:Unsupported global: |unsupported )GLOBAL ([\w.]+)", text)
    if asked:
        return f"it asks for {asked[1]}, which is code, not a tensor"
    opcode = re.search(r"Unsupported operand (\d+)", text)
    if opcode:
        return f"not a tensors-only torch checkpoint (pickle opcode {opcode[1]} is not read)"
    if "Weights only load failed" in text:
        return "it asks for more than tensors"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(err).__name__)
    return f"not a tensors-only torch checkpoint ({type(err).__name__}: {first[:160]})"
