"""How the renderer uses the CPU: how many threads, and whether its stages run on lanes.

On a small CPU the renderer has two choices: split every operation over all cores (torch's
intra-op threads), or give each group of stages its own core and overlap chunks (driver.Lanes).
The first collapses when another busy process (the game engine producing the G-buffers) holds a
core: OpenMP's threads spin at every barrier while one of them waits for the busy core (256x256 on
2 cores fell from 16.5 to 0.66 FPS, docs/benchmarks.md). One thread per lane never meets such a
barrier, and on a quiet machine the two lanes keep both cores busy with less overhead per op.

    plan = cpu_plan()             # from the CPUs this process may use
    plan = cpu_plan(threads=1)    # --threads 1: one thread, one lane
    drive(graph, sources, lanes=plan.lanes)

    configure(threads=None)       # the CLI: this process's plan, which StreamRunner.run and
    configured_lanes()            # Pipeline.run then use (a library caller that configures nothing
                                  # keeps torch's threads and the serial loop)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .driver import Lanes


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CpuPlan:
    threads: int  # threads in all
    lanes: Lanes | None  # None: one lane, `threads` intra-op threads in the caller's thread

    def describe(self) -> str:
        if self.lanes is None:
            return f"{self.threads} thread{'s' if self.threads > 1 else ''}, one lane"
        per = "+".join(str(n) for n in self.lanes.threads)
        return f"{self.threads} threads on {self.lanes.count} lanes ({per} per lane)"

    def apply(self) -> None:
        """Set the caller's torch threads for a plan without lanes (lanes set their own)."""
        if self.lanes is None:
            import torch

            torch.set_num_threads(self.threads)


def cpu_plan(threads: int | None = None, lanes: bool = True) -> CpuPlan:
    """threads: in all (default: the usable CPUs); lanes: two lanes when there are >= 2 threads.
    The threads are split evenly between the two lanes (the first gets the smaller half)."""
    n = usable_cpus() if threads is None else threads
    if n < 1:
        raise ValueError(f"threads must be at least 1, got {n}")
    if not lanes or n < 2:
        return CpuPlan(n, None)
    return CpuPlan(n, Lanes(threads=(n // 2, n - n // 2)))


_configured: CpuPlan | None = None


def configure(threads: int | None = None, lanes: bool = True) -> CpuPlan:
    """This process's plan (the CLI's --threads / --no-pipeline): applied to the calling thread, and
    what `configured_lanes` gives the runners. No lanes where CUDA is present: the GPU does the work
    there, and its stages already overlap with the CPU's."""
    import torch

    global _configured
    _configured = cpu_plan(threads, lanes=lanes and not torch.cuda.is_available())
    _configured.apply()
    return _configured


def configured_lanes() -> Lanes | None:
    """The configured plan's lanes (None: not configured, or one lane)."""
    return None if _configured is None else _configured.lanes


def use_stream_threads() -> None:
    """In a thread that renders one live stream (a page or an engine session): its torch threads by
    the configured plan. With lanes planned (a small CPU), one thread: the stream never waits at an
    OpenMP barrier for a core that the engine beside it holds (docs/benchmarks.md, "On the CPU"), and
    several streams share the cores by the operating system's scheduling."""
    if _configured is None:
        return
    import torch

    torch.set_num_threads(1 if _configured.lanes is not None else _configured.threads)
