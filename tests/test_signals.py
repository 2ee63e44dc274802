"""SIGTERM and SIGHUP stop every writing command like Ctrl-C: writers abort, nothing partial or
temporary is left, the exit status is 128 + the signal number. Each command runs as a real process
and gets the signal while its temporary output exists."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from process_helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]


def commands(tmp: Path) -> dict[str, tuple[list[str], Path]]:
    sample = str(ROOT / "samples" / "courtyard")
    return {
        "world": (["world", "--out", str(tmp / "clip"), "--frames", "4000", "--size", "64"], tmp / "clip"),
        "render": (["render", sample, "--prompt", "a street", "--out", str(tmp / "r.mp4"), "--size", "256"], tmp / "r.mp4"),
        "convert": (["gbuffers", "convert", sample, str(tmp / "conv"), "--to", "png", "--png-bits", "16",
                     "--size", "1024x1024"], tmp / "conv"),
    }


@pytest.mark.parametrize("command", ["world", "render", "convert"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_mid_write_leaves_nothing(command, sig, tmp_path):
    args, out = commands(tmp_path)[command]
    proc = subprocess.Popen(CLI + ["--quiet"] + args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    # its temporary output exists: it is writing
    wait_until(proc, lambda: list(tmp_path.glob(f".{out.name}.*.tmp")), f"{command} starting to write")
    proc.send_signal(sig)
    code = proc.wait(60)
    err = proc.stderr.read()
    assert code == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert list(tmp_path.iterdir()) == [], [p.name for p in tmp_path.iterdir()]
