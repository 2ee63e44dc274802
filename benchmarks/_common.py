"""Pieces the benchmark scripts share: this checkout as `alaya_flash`, and the process's resident memory.

The scripts run as files (`.venv/bin/python benchmarks/NAME.py`), which puts this folder on
sys.path: they import this module as `_common`.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_package() -> None:
    """Import this checkout as `alaya_flash`, whatever is installed (tests/conftest.py registers it)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import conftest  # noqa: F401


def median_seconds(fn, repeats: int, warmup: int = 1) -> float:
    """Median seconds of fn() over `repeats` runs, after `warmup` runs that are not timed."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rss_mib() -> float:
    """This process's resident set size in MiB (VmRSS in /proc/self/status)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
