"""Stop signals this process received (SIGTERM, SIGHUP), kept until the command ends.

The CLI's handler raises Stopped in the main thread, where the program happens to be. Library code
that catches everything can swallow that exception silently, and the command would then finish and
commit its output as if never asked to stop. So each signal is also recorded here: in the main
thread, every atomic output checks before it commits, and every sink before each frame
(raise_if_stopped). Other threads go on: the live server's render thread finishes its recording on
a stop, on purpose."""
from __future__ import annotations

import signal
import threading

received: list[int] = []  # signal numbers, in order; cleared when the command that caught them ends


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so every writer aborts and removes its temporary files."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


def raise_if_stopped() -> None:
    """In the main thread, raise Stopped again if a stop signal arrived (its first exception may have
    been swallowed)."""
    if received and threading.current_thread() is threading.main_thread():
        raise Stopped(received[-1])
