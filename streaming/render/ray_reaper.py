"""Stop what a private Ray left running when the batch process that started it is gone.

    python ray_reaper.py MARKER DRIVER_PID     # stdin: a pipe the batch process holds open

ray_pool.start_local starts Ray with ALAYA_FLASH_RAY=MARKER in its processes' environment and
this script beside it. The script waits until its stdin ends, which happens however the batch
process ends (a normal stop, an error, SIGKILL), then stops every process whose environment holds
that marker (SIGTERM, then SIGKILL after a grace period). Without it, a batch killed with `kill -9`
leaves the raylet's agents (ray::DashboardAgent, ray::RuntimeEnvAgent) running for a minute or
more: they notice the raylet is gone, then wait on the dead GCS to report it. It ignores SIGINT
and SIGHUP (a Ctrl-C reaches the terminal's whole process group; the batch stops and this cleans
up after it) and runs in its own session.

`sweep_orphans()` does the same for markers whose batch process no longer runs (a reaper that was
killed too), when the next private Ray starts. Linux only (it reads /proc); elsewhere it finds
nothing. Standard library only: it runs as a script, without the package.
"""
from __future__ import annotations

import os
import signal
import sys
import time

VAR = "ALAYA_FLASH_RAY"
"""The environment variable that marks a private Ray's processes: "<batch pid>-<random hex>"."""
GRACE_SECONDS = 3.0  # SIGTERM first; SIGKILL for what is still running after this


def marked(marker: str | None = None) -> dict[int, str]:
    """pid -> marker of this user's processes whose environment holds VAR (=marker, when given)."""
    found = {}
    prefix = f"{VAR}=".encode()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc (not Linux)
        return found
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or another user's
            continue
        for entry in env.split(b"\0"):
            if entry.startswith(prefix):
                value = entry[len(prefix):].decode(errors="replace")
                if marker is None or value == marker:
                    found[pid] = value
                break
    return found


def stop(pids, grace: float = GRACE_SECONDS) -> None:
    """SIGTERM each, then SIGKILL those still running after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
            except PermissionError:
                pass
        pids = alive
        deadline = time.monotonic() + grace
        while pids and sig == signal.SIGTERM and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in pids if _running(p)]
        if not pids:
            return


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie has ended
    except (OSError, IndexError):
        return False


def sweep_orphans() -> list[int]:
    """Stop the marked processes whose batch process (the marker's pid) no longer runs; returns their pids."""
    stale = [pid for pid, marker in marked().items() if not _running(int(marker.split("-", 1)[0]))]
    stop(stale)
    return stale


def main(argv: list[str]) -> int:
    marker, driver = argv[0], int(argv[1])
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # until the batch process closes it or is gone
        pass
    stop([pid for pid in marked(marker) if pid != driver])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
