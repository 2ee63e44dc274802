"""Safetensors in, safetensors out: strict, checked loading and atomic saving of weights.

Only `.safetensors` files are ever opened; no pickle is loaded. A checkpoint whose keys are
missing, unexpected or mis-shaped is refused with the first offenders and their counts named.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Mapping

import torch
from torch import nn

from .errors import CheckpointError

MAX_LISTED = 5  # offenders named per category in an error message


def weights_hash(module: nn.Module) -> str:
    """A hash of a network's weights (names, dtypes, shapes, bytes): compiled-model and latent caches key on it."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


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


# ---------------------------------------------------------------------------------------------
# Lazy, memory-mapped reading (published checkpoints: model_zoo/published.py)

# safetensors' dtype names -> torch dtypes (those a weight file may hold)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "BOOL": torch.bool,
}  # fmt: skip
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
# what `model identify` calls each stored dtype
DTYPE_LABELS = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F64": "fp64", "F8_E4M3": "fp8 e4m3fn", "F8_E5M2": "fp8 e5m2"}


def read_header(path: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype name, e.g. 'BF16', 'F8_E4M3') of every tensor; no data is read."""
    path = Path(path)
    with _open_checked(path) as f:
        try:
            out = {}
            for k in f.keys():
                s = f.get_slice(k)
                out[k] = (tuple(s.get_shape()), s.get_dtype())
            return out
        except Exception as err:
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An fp8 weight times its scale, in dtype (ComfyUI's scaled fp8: stored value x scale_weight).

    scale is per tensor (one element) or per output row (weight.shape[0] elements). The product is
    computed in float32 and rounded once to dtype (an fp8 value is exact in bf16/fp16; the in-place
    multiply by a float32 scale runs in float32), with no float32 copy of the weight: float32
    temporaries between the kept weights fragment the heap (measured: 5.7 GB peak instead of 3.5
    for the 1.3B teacher loaded from fp8 to bf16)."""
    s = scale.to(torch.float32)
    if s.numel() == 1:
        s = s.reshape(())
    elif s.numel() == weight.shape[0]:
        s = s.reshape(-1, *([1] * (weight.ndim - 1)))
    else:
        raise CheckpointError(f"scale of shape {tuple(scale.shape)} does not fit a weight of shape {tuple(weight.shape)}")
    return weight.to(dtype).mul_(s)


class LazyReader:
    """Reads tensors out of safetensors files one at a time (memory-mapped by safetensors).

    Each tensor comes back as its own copy (cast to the asked dtype, on the asked device), never a
    view of the file. Pages of a mapping stay resident until it is closed, so a file is reopened
    after every `window` bytes read: peak memory is what the caller keeps plus about one window.
    """

    def __init__(self, window: int = 256 << 20):
        self.window = window
        self._open: dict[Path, tuple[object, object]] = {}  # path -> (context manager, handle)
        self._read: dict[Path, int] = {}

    def _handle(self, path: Path):
        if path not in self._open:
            cm = _open_checked(path)
            self._open[path] = (cm, cm.__enter__())
            self._read[path] = 0
        return self._open[path][1]

    def _release(self, path: Path) -> None:
        cm, _ = self._open.pop(path, (None, None))
        if cm is not None:
            cm.__exit__(None, None, None)

    def raw(self, path: str | os.PathLike, key: str) -> torch.Tensor:
        """The stored tensor, a view of the mapping (use it at once, then drop it)."""
        path = Path(path)
        try:
            t = self._handle(path).get_tensor(key)
        except Exception as err:
            raise CheckpointError(f"{path}: cannot read tensor {key} (truncated or corrupt file? {err})") from None
        self._read[path] += t.numel() * t.element_size()
        return t

    def after(self, path: str | os.PathLike) -> None:
        """Call once the views from raw() are dropped: closes the file when a window has been read."""
        path = Path(path)
        if self._read.get(path, 0) >= self.window:
            self._release(path)

    def close(self) -> None:
        for path in list(self._open):
            self._release(path)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def materialize(
    module: nn.Module,
    produce: Mapping[str, Callable[[torch.dtype, torch.device], torch.Tensor]],
    source: str,
    device: str | torch.device = "cpu",
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> nn.Module:
    """Fill a module built on the meta device, strictly, one tensor at a time.

    produce maps each of the module's state-dict names to a function (dtype, device) -> tensor that
    reads that one tensor. Keys and shapes (shapes: name -> shape, read from the file headers) are
    checked first, so a wrong file fails before anything is read; then every tensor is produced in
    its parameter's dtype on device and the module takes ownership (load_state_dict(assign=True)):
    the weights are held once.
    """
    own = module.state_dict()
    if shapes is not None:
        check_shapes({k: tuple(v.shape) for k, v in own.items()}, shapes, source)
    else:
        missing, unexpected = sorted(set(own) - set(produce)), sorted(set(produce) - set(own))
        if missing or unexpected:
            check_shapes({k: tuple(v.shape) for k, v in own.items()}, {k: tuple(own[k].shape) if k in own else () for k in produce}, source)
    device = torch.device(device)
    state = {}
    for name, ref in own.items():
        t = produce[name](ref.dtype, device)
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{source}: {name} is {shape_str(t.shape)}, expected {shape_str(ref.shape)}")
        state[name] = t
    module.load_state_dict(state, strict=True, assign=True)
    return module
