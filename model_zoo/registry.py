"""Every named config of every network family, in one lookup.

Each family module exports CONFIGS (name -> frozen dataclass config) and build(config) -> nn.Module.
Add a family by adding a line to FAMILIES. Config names are unique across families.
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from .errors import AlayaError

# family name -> module under model_zoo/
FAMILIES: dict[str, str] = {
    "dit": "dit",
    "tiny-codec": "codecs.tiny",
    "gbuffer-encoder": "codecs.gbuffer_encoder",
    "wan-vae": "codecs.wan_vae",
    "gbuffer-refiner": "codecs.refiner",
    "umt5": "umt5",  # the umT5 prompt encoder (Wan's), transformers' UMT5EncoderModel
}


def _family_module(family: str):
    return importlib.import_module(f".{FAMILIES[family]}", __package__)


def all_configs() -> dict[str, tuple[str, object]]:
    """Config name -> (family, config) over every family."""
    out: dict[str, tuple[str, object]] = {}
    for family in FAMILIES:
        for name, cfg in _family_module(family).CONFIGS.items():
            out[name] = (family, cfg)
    return out


def get_config(name: str) -> tuple[str, object]:
    configs = all_configs()
    if name not in configs:
        raise AlayaError(f"unknown config {name!r}; known: {', '.join(sorted(configs))}")
    return configs[name]


def build(name: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """Build the network of a named config; device='meta' allocates no weights."""
    family, cfg = get_config(name)
    with torch.device(device):
        module = _family_module(family).build(cfg)
    return module.to(dtype) if dtype is not None else module


def build_config(family: str, config, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """Build a network of `family` from a config object (e.g. one read from a model folder)."""
    with torch.device(device):
        module = _family_module(family).build(config)
    return module.to(dtype) if dtype is not None else module


def config_class(family: str) -> type:
    """The config dataclass of a family (the type of its CONFIGS values)."""
    return type(next(iter(_family_module(family).CONFIGS.values())))
