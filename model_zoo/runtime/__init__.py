"""Which runtime runs a Flash model's networks: torch, or a CPU inference runtime (OpenVINO).

    model = folders.load_flash(folder)            # torch modules
    model = runtime.accelerate(model, "auto")    # the same FlashModel, its networks compiled where
                                                 # OpenVINO is installed and the model is on the CPU

The compiled networks keep the torch networks' interfaces (a DiT's cached pass, `new_stream()` of
the encoder and the decoder, the refiner's `refine`), so the chunk loop, the nodes and the tests do
not care which runtime runs a stage. `configure(backend)` sets this process's choice (the CLI's
`--backend`), which "auto" then follows; the ALAYA_FLASH_BACKEND environment variable does the same
for a process that configures nothing (the tests pin torch with it).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os

from ..errors import AlayaError

BACKENDS = ("auto", "torch", "openvino")
ENV = "ALAYA_FLASH_BACKEND"
log = logging.getLogger(__name__)

_configured: str | None = None


@functools.lru_cache(maxsize=None)
def openvino_version() -> str | None:
    """The installed OpenVINO's version, or None when it is not installed."""
    try:
        import openvino
    except ImportError:
        return None
    return openvino.__version__


def configure(backend: str | None) -> None:
    """This process's backend (the CLI's --backend); None forgets it. A named backend is also put in
    the environment, so worker processes this process starts (a local Ray's) choose the same."""
    global _configured
    if backend is not None:
        _check(backend)
        if backend != "auto":
            os.environ[ENV] = backend
    _configured = backend


def _check(backend: str) -> None:
    if backend not in BACKENDS:
        raise AlayaError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")


def choose(backend: str = "auto", device="cpu") -> str:
    """'torch' or 'openvino' for a choice: 'auto' follows configure(), else $ALAYA_FLASH_BACKEND, else
    OpenVINO where it is installed and the model is on the CPU (it ran the default model 1.19x faster
    than the torch path at 256x256 on the EPYC measured, docs/benchmarks.md), else torch, saying once
    why when OpenVINO is missing. 'openvino' without the package, or on a GPU, is an error that says so."""
    _check(backend)
    if backend == "auto":
        backend = (_configured if _configured != "auto" else None) or os.environ.get(ENV) or "auto"
        _check(backend)
    import torch

    on_cpu = torch.device(device).type == "cpu"
    if backend == "auto":
        if on_cpu and openvino_version() is None:
            _say_once("OpenVINO is not installed: the networks run on torch (pip install \"alaya-flash[openvino]\" "
                      "for the faster CPU runtime)")
        return "openvino" if on_cpu and openvino_version() else "torch"
    if backend == "openvino":
        if openvino_version() is None:
            raise AlayaError("backend openvino: the openvino package is not installed "
                             "(pip install \"alaya-flash[openvino]\"), or choose --backend torch")
        if not on_cpu:
            raise AlayaError(f"backend openvino runs on the CPU; the model is on {device} (use --backend torch)")
    return backend


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    log.warning(message)
    import sys

    print(message, file=sys.stderr)


def accelerate(model, backend: str = "auto"):
    """A FlashModel whose networks run on the chosen backend (the same object's networks for torch).
    A teacher, or a Flash release without the KV-cache DiT, stays on torch; so does a refiner that reads the
    light (its shading prior is eager torch)."""
    if getattr(model, "kind", "") != "flash" or choose(backend, model.device) == "torch":
        return model
    if getattr(model.dit, "sampler_kind", "kv-cache") != "kv-cache":
        return model
    from . import openvino as ov

    return dataclasses.replace(
        model, dit=ov.CompiledDiT(model.dit), gbuffer_encoder=ov.CompiledEncoder(model.gbuffer_encoder),
        decoder=ov.CompiledDecoder(model.decoder),
        refiner=model.refiner if model.refiner is None or getattr(model.refiner, "reads_light", False)
        else ov.CompiledRefiner(model.refiner))


def backend_of(model) -> str:
    """'openvino' when a model's DiT runs compiled, else 'torch'."""
    return getattr(model.dit, "backend", "torch")
