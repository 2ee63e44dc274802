"""Shared pieces of the batch tests: tiny shots, the command, reading outputs back, and a worker
that holds one shot mid-render so the test can kill its process there."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from alaya_flash.streaming.files.sinks import OUTPUT_MARK

ROOT = Path(__file__).resolve().parents[1]
RENDER = ROOT / "workflows" / "api" / "render-gbuffer-sequence.json"
# The CLI in a new process, importing this checkout's package (as tests/test_signals.py does).
CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]
TINY = ["--set", "2.model=random:tiny", "--set", "2.precision=fp32", "--set", "1.chunk=4"]


def make_clips(folder: Path, n: int, frames: int = 12, size: int = 32) -> list[Path]:
    """n synthetic G-buffer clips (npy windows), clips c0..c{n-1}, each a different scene."""
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    out = []
    for i in range(n):
        write_stream(synthetic_stream(size, size, frames, seed=i), NpyWindowSink(folder / f"c{i}", window=16))
        out.append(folder / f"c{i}")
    return out


def write_list(path: Path, shots: list[dict]) -> Path:
    path.write_text("".join(json.dumps(s) + "\n" for s in shots))
    return path


def batch(*args, capsys=None) -> tuple[int, dict | None]:
    """`alaya-flash --quiet batch RENDER TINY... --json ARGS`: (exit status, the JSON summary)."""
    from alaya_flash.streaming.cli import main

    code = main(["--quiet", "batch", str(RENDER), *TINY, "--json", *args])
    summary = None
    if capsys is not None:
        out = capsys.readouterr().out
        summary = json.loads(out) if out.strip() else None
    return code, summary


def manifest(path: Path) -> dict[str, dict]:
    """name -> record."""
    return {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}


def output_bytes(path: Path) -> dict[str, bytes]:
    """An output's content: a file's bytes, or each frame's in a frame folder (its hidden mark left out)."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != OUTPUT_MARK}


def leftovers(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.alaya-tmp.tmp"))


def holding_worker(target: str, mark: Path) -> type:
    """A ShotWorker that, the first time any worker reaches frame > 0 of shot `target`, writes its pid
    to `mark` and waits there for the test to kill it. Defined in a function, so Ray ships the class
    by value to its worker processes (they need not import this file); `mark` makes it happen once."""
    from alaya_flash.streaming.cli.shots import ShotWorker

    class HoldingWorker(ShotWorker):
        def _progress(self, stats):
            super()._progress(stats)
            if self.state["shot"] != target or stats.frames == 0:
                return
            try:
                fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return  # held once already: this is the retry
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            for _ in range(1200):  # the test kills this process; a bound in case it never does
                time.sleep(0.1)

    return HoldingWorker
