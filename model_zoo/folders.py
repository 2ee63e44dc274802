"""Which loader a Flash model folder needs: ours (bundle.py) or an AlayaRenderer-Flash release (release.py).

This is the top of model_zoo's loading modules, so their imports point one way (tests/test_layers.py):

    loading (safetensors) -> weight_files (single files, shards + index) -> helios, bundle
      -> published (teacher files) -> release (Flash release) -> folders, identify

Front ends load a Flash model through `load_flash`, whatever the folder is.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from . import bundle, helios
from .bundle import FlashModel
from .release import load_release


def is_model_folder(path: str | os.PathLike) -> str | None:
    """'flash' or 'teacher' when path is a model folder of that kind (a Flash release is 'flash'), else None."""
    if helios.is_release(path):
        return "flash"
    return bundle.model_folder_kind(path)


def load_flash(folder: str | os.PathLike | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.bfloat16) -> FlashModel:
    """A Flash model folder loaded strictly; folder=None loads the embedded default. Our folders go
    through bundle.load_flash_folder, a Flash release folder (transformer/, transformer_partial.safetensors,
    ...) through release.load_release."""
    if folder is not None and helios.is_release(Path(folder)):
        return load_release(Path(folder), device, dtype)
    return bundle.load_flash_folder(folder, device, dtype)
