"""Prompt encodings kept on disk: a process whose prompts were encoded before (a render, a batch's
worker, `serve`) reads them back instead of loading the text encoder (transformers' import and
MiniLM's 90 MB of weights): a one-frame 32x32 render takes 5.8 s of CPU with the store off, 2.3 s
with its prompt stored (`python benchmarks/cli_start.py`, medians of 3, a shared 2-core EPYC).

What is kept is one prompt's TextEncoder.states (its sentence embedding, every token's output and
the mask), which is what the encoder gives that prompt alone (model_zoo/text_encoder.py encodes each
prompt alone), so a stored prompt has the bits that encoding it again gives. One safetensors file a
prompt (about 1.5 KB a token): <store>/<key>/<hash of the prompt>.safetensors, the prompt's text in
the file's metadata; <store> is $ALAYA_FLASH_PROMPT_STORE ('off' turns the store off), else the
prompts/ folder of the cache (model_zoo/cache_home.py). The key is a hash of the
encoder's files, the device type and the torch and transformers versions: other weights or another
build of the libraries never read another's encodings. A file that does not read back (cut short,
another prompt's) counts as missing; a folder that cannot be written leaves the prompt unstored.
Deleting the folder only costs the next process its encoder load.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections import OrderedDict
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch

from . import jsonfile
from .cache_home import cache_home
from .text_encoder import MINILM_DIM, TextEncoder

STORE_VERSION = 1  # bump when what a file holds changes: older folders are then never read
_KEYED_FILES = ("config.json", "tokenizer.json", "model.safetensors")


def store_folder() -> Path | None:
    """$ALAYA_FLASH_PROMPT_STORE ('off': no store), else <cache>/prompts."""
    chosen = os.environ.get("ALAYA_FLASH_PROMPT_STORE")
    if chosen:
        return None if chosen.lower() == "off" else Path(chosen)
    return cache_home() / "prompts"


def encoder_key(model_dir: Path, device: torch.device) -> str:
    """A hash of what an encoding depends on: the encoder's files, the device type, the library versions."""
    h = hashlib.sha256(f"v{STORE_VERSION};{device.type};torch {torch.__version__};"
                       f"transformers {metadata.version('transformers')};".encode())
    for name in _KEYED_FILES:
        path = model_dir / name
        h.update(f"{name}:".encode())
        if path.is_file():
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:32]


class StoredTextEncoder(TextEncoder):
    """A TextEncoder that reads a prompt's states from the store and loads its network (`load`: the
    process's shared TextEncoder) only for a prompt the store lacks, then stores it."""

    def __init__(self, load: Callable[[], TextEncoder], model_dir: Path, folder: Path,
                 device: str | torch.device = "cpu", tokens: int = 0, cache_size: int = 64):
        self._load, self.model_dir, self.folder = load, Path(model_dir), Path(folder)
        self._device = torch.device(device)
        self.cache_size = cache_size
        self.tokens = tokens
        self.text_len = 1 + tokens
        self.text_dim = _hidden_size(self.model_dir)
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._key: str | None = None

    @property
    def model(self):
        return self._load().model

    @property
    def tokenizer(self):
        return self._load().tokenizer

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def key_folder(self) -> Path:
        if self._key is None:
            self._key = encoder_key(self.model_dir, self._device)
        return self.folder / self._key

    def path(self, prompt: str) -> Path:
        return self.key_folder / f"{hashlib.sha256(prompt.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}.safetensors"

    def states(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """TextEncoder.states; one prompt comes from the store when it is there, and goes into it when not."""
        self._check_prompts(prompts)
        if len(prompts) != 1:
            return super().states(prompts)
        stored = self._read(prompts[0])
        if stored is None:
            stored = super().states(prompts)
            self._write(prompts[0], stored)
        return stored

    def _read(self, prompt: str):
        from safetensors import safe_open

        path = self.path(prompt)
        try:
            with safe_open(str(path), framework="pt") as f:
                if (f.metadata() or {}).get("prompt") != prompt:
                    return None
                pooled, hidden, mask = (f.get_tensor(k) for k in ("pooled", "hidden", "mask"))
        except Exception:  # missing, cut short or not safetensors: encode it again
            return None
        if pooled.shape != (1, self.text_dim) or hidden.shape[::2] != (1, self.text_dim) or mask.shape != hidden.shape[:2]:
            return None
        return pooled.to(self._device), hidden.to(self._device), mask.to(self._device)

    def _write(self, prompt: str, states) -> None:
        from safetensors.torch import save

        pooled, hidden, mask = (t.detach().cpu().contiguous() for t in states)
        path, tmp = self.path(prompt), None
        try:
            data = save({"pooled": pooled, "hidden": hidden, "mask": mask}, metadata={"prompt": prompt})
        except Exception:  # safetensors' own error: a prompt its metadata cannot hold stays unstored
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a name of its own: two processes storing one prompt at once each rename a whole file
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:  # a read-only or full disk: the prompt stays unstored
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


def _hidden_size(model_dir: Path) -> int:
    """The encoder's width from its config.json (all-MiniLM-L6-v2's without one; loading checks the rest)."""
    try:
        raw = jsonfile.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        return int(raw.get("hidden_size", MINILM_DIM))
    except (OSError, ValueError, TypeError, AttributeError):
        return MINILM_DIM
