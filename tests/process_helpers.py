"""Waiting on a command that runs as a real process (signal tests)."""
import time

import pytest


def wait_until(proc, ready, what: str, polls: int = 2400, every: float = 0.05) -> None:
    """Poll ready() until it holds; fail naming `what` if the process ends first or it never holds
    (a bounded number of polls: a liveness guard, not a speed measurement)."""
    for _ in range(polls):
        if ready():
            return
        if proc.poll() is not None:
            pytest.fail(f"{what}: the process ended first ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(every)
    pytest.fail(f"{what}: not after {polls} polls")
