"""Running a test's code as a real process (signal tests): waiting on a command, a test in a process
of its own."""
import functools
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_OWN_PROCESS = "ALAYA_FLASH_TEST_IN_OWN_PROCESS"


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


def store_prompts(*prompts: str) -> None:
    """Encode prompts into the session's prompt store (conftest.py's cache_home), so a process the test
    starts reads them back instead of loading MiniLM for them (about 3 s of CPU a process): what the
    process does with a prompt is the test's subject, not how it encodes one."""
    from alaya_flash.model_zoo.bundle import model_text_encoder
    from alaya_flash.model_zoo.text_encoder import MINILM

    encoder = model_text_encoder(MINILM)
    for prompt in prompts:
        encoder.states([prompt])


def in_own_process(test):
    """Run the test in a pytest process of its own, for a test that raises signals in its process.

    The suite's process (or a pytest-xdist worker) may have loaded a library that changed how signals
    are delivered there: after OpenVINO's CPU plugin had set an alternate signal stack and gone, a
    signal raised in the process died with SIGSEGV and took the whole run with it (docs/runner.md).
    The test keeps its body and assertions; they run in the child, whose failure fails the test."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        if os.environ.get(_OWN_PROCESS) == test.__name__:
            return test(*args, **kwargs)
        node = f"{Path(inspect.getfile(test)).relative_to(ROOT)}::{test.__name__}"
        # a --basetemp of its own: pytest's numbered temporary folders would have the child delete the
        # oldest of them on its way out (another session's, a whole suite's GB at times)
        with tempfile.TemporaryDirectory(prefix="alaya-own-process-") as basetemp:
            child = subprocess.run(
                [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                 "--basetemp", str(Path(basetemp) / "tmp"), node],
                cwd=ROOT, env={**os.environ, _OWN_PROCESS: test.__name__}, capture_output=True, text=True, timeout=600)
        out = child.stdout + child.stderr
        assert child.returncode == 0 and re.search(r"\b1 passed\b", out), f"{node} in its own process ({child.returncode}):\n{out[-4000:]}"

    return run
