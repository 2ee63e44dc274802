"""Argument types for the commands: every number and size is checked when it is parsed, so a NaN, a
zero frame rate or a 100,000-pixel frame is one argparse error line (exit 2), never a traceback or
an allocation that fails later."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

MAX_SIDE = 4096  # pixels per frame side
MAX_FRAMES = 10_000_000
MAX_SEED = 2**63 - 1


class LazyChoices:
    """argparse `choices` read when first needed. Every command's parser is built for every command
    line, and some choices live in modules that load torch (about 1.5 s of CPU), which `--help` or
    `gbuffers info` never need. Give the argument a metavar too: without one argparse lists the
    choices when the argument is added."""

    def __init__(self, load):
        self._load, self._names = load, None

    def _get(self) -> tuple:
        if self._names is None:
            self._names = tuple(self._load())
        return self._names

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __iter__(self):
        return iter(self._get())


def bounded(kind: type, low: float, high: float):
    """An argparse type: a finite `kind` (int or float) in [low, high]."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range [{low}, {high}]")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def parse_size(text: str) -> tuple[int, int]:
    """'128' (square) or 'WIDTHxHEIGHT' -> (height, width), each side 1..MAX_SIDE."""
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"size {text!r} is not N or WIDTHxHEIGHT, e.g. 256 or 320x192")
    if min(parts) < 1 or max(parts) > MAX_SIDE:
        raise argparse.ArgumentTypeError(f"size {text!r}: each side must be 1..{MAX_SIDE} pixels")
    return parts[1], parts[0]


FPS = bounded(float, 1.0, 240.0)
FRAMES = bounded(int, 0, MAX_FRAMES)  # 0 where a command reads it as "all"
SEED = bounded(int, 0, MAX_SEED)
STEPS = bounded(int, 1, 1000)


def out_path(text: str) -> Path:
    """An output path (--out, a destination): not empty, which Path would read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no output")
    return Path(text)


# --model's help, the start every command shares (tests/test_package.py checks the names against model_zoo/)
SHIPPED_MODEL_HELP = "Flash model folder, or the name of one shipped in model_zoo/ (default)"


def model_path(text: str) -> Path:
    """--model: a path, or the name of a model folder shipped in model_zoo/ ('default')
    where no such path exists here, so a pip-installed package's models are reachable by name."""
    path = Path(text)
    if path.exists() or len(path.parts) != 1:
        return path
    from ...model_zoo.bundle import shipped_models

    return shipped_models().get(text, path)  # not a shipped name either: the command says what is missing


LIGHT_HELP = ("the light: JSON, key=value pairs (az=90,el=30,...: az 0 ahead, 90 left, 180 behind, -90 right; el "
              "degrees above the horizon), a preset name first (sunset_dramatic,az=-90), or 'FRAME: light' lines the "
              "light moves through (docs/lighting.md); wins over the prompt's")


def add_light_argument(parser, reads: str = "") -> None:
    """--light, as every command that renders under a light takes it (parsed by streaming/render/lighting.py
    user_lights, with every named preset)."""
    parser.add_argument("--light", metavar="LIGHT", help=LIGHT_HELP + reads)


def add_backend_argument(parser) -> None:
    """--backend: which runtime runs the networks (applied by cli.main: model_zoo/runtime.configure)."""
    from ...model_zoo.runtime import BACKENDS

    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="runtime of the networks: openvino (compiled for the CPU, cached on disk; the "
                             "'openvino' extra), torch, or auto: openvino where installed and on the CPU")


def add_cpu_arguments(parser) -> None:
    """--threads / --no-pipeline / --backend for commands that render in this process (applied by cli.main)."""
    group = parser.add_argument_group("CPU")
    add_backend_argument(group)
    group.add_argument("--threads", type=bounded(int, 1, 1024), metavar="N",
                       help="CPU threads in all (default: the CPUs this process may use)")
    group.add_argument("--no-pipeline", action="store_true",
                       help="run every stage on all threads in turn instead of on 2 lanes that overlap chunks "
                            "(one lane per core, which keeps its speed beside a busy process)")
