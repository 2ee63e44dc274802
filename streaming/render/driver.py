"""The one chunk loop: sources -> stages -> sinks, written once.

Every way of rendering builds a `StageGraph` and drives it: the fixed Flash and teacher pipelines
(streaming/render/pipelines.py: `flash_steps`, `teacher_steps`), a saved workflow (streaming/render/runner.py
turns its stream nodes into steps), ComfyUI's one call per node (`run_stage_whole`), the live
page, `bench`, `eval` and the training renders.

A step is a stage object placed in the graph:

    stage.step(**inputs) -> tuple | None    # one output per slot; None: nothing ready yet
    stage.flush()        -> tuple | None    # at the end of the stream: what it still holds
    stage.abort()                           # optional: on error or interruption (sinks drop partial files)

`Step.inputs` names, for each keyword, the (producer, output slot) it reads; a producer is an
earlier step or one of the graph's `feeds` (what the caller pushes each tick: a source's chunk).
A step whose inputs are all None this tick is not called. Stages that take and return one plain
value (the pipelines' stages) are wrapped with `single=True`.

    graph = StageGraph(["gbuffers"], flash_steps(model, prompts))
    for chunk in chunks:
        out = graph.tick({"gbuffers": (chunk,)})      # {step name: outputs or None}
    out = graph.finish()                               # step + flush, joined per slot
    for values, frames, final in ticks(graph, {"gbuffers": iter_of_tuples}):  # the loop that pulls
        ...
    stats = drive(graph, {"gbuffers": iter_of_tuples}) # ticks() to the end, with timings and progress

Chunk values are torch tensors (joined along dim 0, like IMAGE) or objects with a `concat(list)`
classmethod. Consumers must not modify chunk values in place: one output can feed several steps.
"""
from __future__ import annotations

from collections import deque

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

Ref = tuple[str, int]  # (producer name, output slot)


def concat_chunks(values: list) -> Any:
    """Join the chunks of one output (None entries skipped); None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    first = values[0]
    if hasattr(type(first), "concat"):
        return type(first).concat(values)
    import torch

    if isinstance(first, torch.Tensor):
        return torch.cat(values, dim=0)
    raise TypeError(f"cannot join chunks of type {type(first).__name__}")


def chunk_length(value: Any) -> int:
    """Frames in a chunk value (len() of tensors along dim 0, or of chunk objects)."""
    try:
        return len(value)
    except TypeError:
        return 0


@dataclass
class Step:
    """A stage in the graph: its name, the stage object, where each keyword input comes from, how
    many output slots it has (0: a sink), and whether step/flush return one plain value."""

    name: str
    stage: Any
    inputs: dict[str, Ref]
    outputs: int = 1
    single: bool = False
    flushed: Any = field(default=None, init=False)  # what flush() returned (a ComfyUI sink's {"ui": ...})

    def call(self, inputs: dict, final: bool) -> tuple | None:
        """One tick of this step: step when any input is there, then flush at the end."""
        first = self._tuple(self.stage.step(**inputs)) if any(v is not None for v in inputs.values()) else None
        if not final:
            return first
        last = self.stage.flush()
        self.flushed = last
        if not self.outputs:
            return None
        last = self._tuple(last) if self.single or isinstance(last, tuple) else None
        empty = (None,) * self.outputs
        return tuple(concat_chunks([a, b]) for a, b in zip(first or empty, last or empty))

    def _tuple(self, out):
        if self.single:
            return None if out is None else (out,)
        return out


class StageGraph:
    """Steps in dependency order over the values the caller feeds each tick (see the module docstring).

    seconds: time spent in each step, summed over the stream (sync, e.g. torch.cuda.synchronize,
    runs after every step so asynchronous GPU work is billed to its own step).
    """

    def __init__(self, feeds: list[str], steps: list[Step], sync: Callable[[], None] | None = None):
        known = set(feeds)
        for s in steps:
            for name, (producer, _) in s.inputs.items():
                if producer not in known:
                    raise ValueError(f"step {s.name!r}: input {name!r} reads {producer!r}, which comes later or not at all")
            known.add(s.name)
        self.feeds, self.steps = list(feeds), list(steps)
        self.seconds: dict[str, float] = {s.name: 0.0 for s in steps}
        self.source_seconds: dict[str, float] = {}  # filled by ticks()
        self.pulled_at: deque[float] = deque()  # when each tick not yet yielded began pulling (ticks())
        self._sync = sync or (lambda: None)

    def __getitem__(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def _run(self, fed: Mapping[str, tuple | None], final: bool, steps: list[Step] | None = None
             ) -> dict[str, tuple | None]:
        """Run `steps` (default: all) over the values so far (the feeds, and earlier steps' outputs)."""
        values: dict[str, tuple | None] = dict(fed)
        for s in self.steps if steps is None else steps:
            inputs = {k: None if values.get(p) is None else values[p][i] for k, (p, i) in s.inputs.items()}
            t0 = time.perf_counter()
            values[s.name] = s.call(inputs, final)
            self._sync()
            self.seconds[s.name] += time.perf_counter() - t0
        return values

    def tick(self, fed: Mapping[str, tuple | None]) -> dict[str, tuple | None]:
        """Push one chunk per feed (None: that feed has nothing this tick) through every step."""
        return self._run(fed, final=False)

    def finish(self, fed: Mapping[str, tuple | None] | None = None) -> dict[str, tuple | None]:
        """The last tick: each step gets what is left upstream, then flushes; outputs joined per slot."""
        return self._run(fed or {}, final=True)

    def abort(self) -> None:
        for s in reversed(self.steps):
            if hasattr(s.stage, "abort"):
                s.stage.abort()

    def received(self, name: str, values: Mapping[str, tuple | None]) -> bool:
        """Whether a step got any input this tick."""
        return any(values.get(p) is not None and values[p][i] is not None for p, i in self[name].inputs.values())


@dataclass
class RunStats:
    ticks: int = 0
    frames: int = 0  # frames produced by the sources
    seconds: float = 0.0
    first_chunk_seconds: float | None = None
    first_chunk_frames: int = 0  # frames the first tick pulled
    setup_seconds: float = 0.0  # loading models, opening sources and starting stages (the caller's)
    first_output_seconds: float | None = None  # from the end of setup to the first tick a sink got frames
    tick_latencies: list[float] = field(default_factory=list)  # per tick: from pulling its chunk to its last step done
    node_seconds: dict[str, float] = field(default_factory=dict)  # step or node name -> time in it

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


def _pull(graph: StageGraph, sources: Mapping[str, Iterator[tuple]]) -> tuple[dict, int] | None:
    """One chunk from every source (None when all have ended), timed into graph.source_seconds."""
    fed, frames = {}, 0
    graph.pulled_at.append(time.perf_counter())
    for name, it in sources.items():
        t0 = time.perf_counter()
        chunk = next(it, None)
        graph.source_seconds[name] = graph.source_seconds.get(name, 0.0) + time.perf_counter() - t0
        fed[name] = chunk
        if chunk is not None:
            frames += max(chunk_length(c) for c in chunk)
    return None if all(chunk is None for chunk in fed.values()) else (fed, frames)


def ticks(graph: StageGraph, sources: Mapping[str, Iterator[tuple]],
          should_stop: Callable[[], bool] | None = None, lanes: "Lanes | None" = None
          ) -> Iterator[tuple[dict[str, tuple | None], int, bool]]:
    """The chunk loop itself: pull one chunk from every source and tick the graph, until the sources
    end (or should_stop() after a tick); then the finishing tick. Yields (values of every step, frames
    pulled, final). On any error, or when the consumer stops early, the stages are aborted. The time
    spent pulling from each source (reading is work too) adds up in graph.source_seconds.

    lanes: run the steps on lanes (worker threads) (`Lanes`); the ticks, their values and the
    frames are the same, each tick is yielded once its last lane is done with it."""
    if lanes is not None and lanes.count > 1 and len(graph.steps) > 1:
        yield from _lane_ticks(graph, sources, should_stop, lanes)
        return
    finished = False
    try:
        while sources:
            pulled = _pull(graph, sources)
            if pulled is None:
                break
            fed, frames = pulled
            yield graph.tick(fed), frames, False
            if should_stop and should_stop():
                break
        values = graph.finish({name: None for name in sources})
        finished = True
        yield values, 0, True
    finally:
        if not finished:
            graph.abort()


@dataclass(frozen=True)
class Lanes:
    """Run a graph's steps on lanes: consecutive groups of steps (lanes), each on its own worker
    thread with its own number of torch threads, so chunk k+1's first steps run while chunk k's last
    ones do. On a small CPU this beats splitting every operation over all cores: one thread per lane
    never waits at OpenMP's barriers, which is what collapses a 2-thread renderer when another busy
    process (a game engine) holds a core (docs/benchmarks.md, "On the CPU").

    threads: torch intra-op threads per lane (its length is the number of lanes).
    split: the first step of each lane after the first; None: chosen after `measure` ticks run on the
    first lane alone, so that the slowest lane's measured time is as small as possible.
    """

    threads: tuple[int, ...] = (1, 1)
    split: tuple[str, ...] | None = None
    measure: int = 2

    @property
    def count(self) -> int:
        return len(self.threads)

    def groups(self, graph: StageGraph, seconds: Mapping[str, float] | None = None) -> list[list[Step]]:
        """The graph's steps cut into `count` consecutive lanes (fewer when there are fewer steps)."""
        steps = graph.steps
        if self.split is not None:
            names = [s.name for s in steps]
            unknown = [n for n in self.split if n not in names]
            if unknown:
                raise ValueError(f"lanes: no step named {unknown[0]!r} (steps: {', '.join(names)})")
            cuts = sorted({names.index(n) for n in self.split} - {0})
        else:
            cuts = balanced_cuts([(seconds or {}).get(s.name, 0.0) for s in steps], self.count)
        bounds = [0, *cuts, len(steps)]
        return [steps[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def balanced_cuts(costs: list[float], parts: int) -> list[int]:
    """Indices cutting `costs` into at most `parts` consecutive non-empty runs whose largest sum is
    smallest (ties: the earliest cuts). Exhaustive: a graph has a handful of steps."""
    from itertools import combinations

    n = len(costs)
    parts = max(1, min(parts, n))
    best, best_cost = [], float("inf")
    for cuts in combinations(range(1, n), parts - 1):
        bounds = [0, *cuts, n]
        cost = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        if cost < best_cost - 1e-12:
            best, best_cost = list(cuts), cost
    return best


class _LaneStopped(Exception):
    """A lane's tick skipped because a step of an earlier tick failed (that failure is raised)."""


def _lane_ticks(graph: StageGraph, sources: Mapping[str, Iterator[tuple]], should_stop, lanes: Lanes):
    """ticks() with the steps split into lanes, one worker thread each (see Lanes). Tick k is
    submitted to lane 0 as soon as it is pulled; lane i takes tick k once lane i-1 is done with it
    and lane i is done with tick k-1. At most `lanes.count` ticks are in flight."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    def start(n):
        import torch

        torch.set_num_threads(n)  # this worker thread's own OpenMP setting; the caller's is untouched

    workers = [ThreadPoolExecutor(1, thread_name_prefix=f"alaya-lane{i}", initializer=start, initargs=(n,))
               for i, n in enumerate(lanes.threads)]
    groups = [graph.steps] if lanes.split is None else lanes.groups(graph)
    failed = threading.Event()  # once a step fails, no lane starts another step

    def run(values, final, group):
        if failed.is_set():
            raise _LaneStopped()
        try:
            return graph._run(values, final, group)
        except BaseException:
            failed.set()
            raise

    def submit(fed: dict, final: bool):
        future = workers[0].submit(run, fed, final, groups[0])
        for i, group in enumerate(groups[1:], 1):
            future = workers[i].submit(lambda prev=future, g=group: run(prev.result(), final, g))
        return future

    finished, stop, measured, inflight = False, False, 0, deque()
    first = dict(graph.seconds)
    try:
        while sources and not stop:
            if len(groups) == 1 and measured == lanes.measure:  # measured serially, on the first lane
                # the cut balances the times measured after the first tick (which also pays one-off setup)
                groups = lanes.groups(graph, {k: v - first.get(k, 0.0) for k, v in graph.seconds.items()})
            pulled = _pull(graph, sources)
            if pulled is None:
                break
            fed, frames = pulled
            inflight.append((submit(fed, False), frames))
            measured += 1
            while len(inflight) >= len(groups) and not stop:  # one tick in flight per lane
                future, n = inflight.popleft()
                yield future.result(), n, False
                stop = bool(should_stop and should_stop())
                if measured == 1 and lanes.measure > 1:
                    first = dict(graph.seconds)
        while inflight:  # ticks already pulled finish normally
            future, n = inflight.popleft()
            yield future.result(), n, False
        # The finishing tick (flushes, sinks committing their outputs) runs in the caller's thread, as
        # without lanes: a signal or Ctrl-C, which Python delivers to the main thread, then lands
        # inside it, so a sink never commits after the run was stopped.
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(lanes.threads[-1])
        try:
            values = graph.finish({name: None for name in sources})
        finally:
            torch.set_num_threads(threads)
        finished = True
        yield values, 0, True
    finally:
        for w in workers:  # no lane may still be running a step when the stages are aborted
            w.shutdown(wait=True, cancel_futures=True)
        if not finished:
            graph.abort()


def drive(graph: StageGraph, sources: Mapping[str, Iterator[tuple]], sinks: list[str] | None = None,
          progress: Callable[[RunStats], None] | None = None, should_stop: Callable[[], bool] | None = None,
          stats: RunStats | None = None, start: float | None = None, lanes: Lanes | None = None) -> RunStats:
    """Run `ticks` to the end with figures: frames, ticks, time to the first chunk and to the first
    output, per-step and per-source seconds.

    sinks: the steps whose first input marks the first output (default: steps with no outputs).
    stats/start: the caller's, when it timed a setup before (RunStats.seconds counts from `start`).
    lanes: run the steps on lanes (worker threads) (`Lanes`).
    """
    stats = stats or RunStats()
    start = time.perf_counter() if start is None else start
    stats.setup_seconds = stats.setup_seconds or (time.perf_counter() - start)
    sinks = [s.name for s in graph.steps if not s.outputs] if sinks is None else sinks
    for values, frames, final in ticks(graph, sources, should_stop, lanes):
        if stats.first_output_seconds is None and any(graph.received(n, values) for n in sinks):
            stats.first_output_seconds = time.perf_counter() - start - stats.setup_seconds
        if final:
            break
        if graph.pulled_at:
            stats.tick_latencies.append(time.perf_counter() - graph.pulled_at.popleft())
        stats.frames += frames
        stats.ticks += 1
        stats.seconds = time.perf_counter() - start
        if stats.first_chunk_seconds is None:
            stats.first_chunk_seconds, stats.first_chunk_frames = stats.seconds, frames
        if progress:
            progress(stats)
    stats.seconds = time.perf_counter() - start
    for name, sec in {**graph.source_seconds, **graph.seconds}.items():
        stats.node_seconds[name] = stats.node_seconds.get(name, 0.0) + sec
    return stats


def run_once(stage: Any, stream_inputs: dict, outputs: int) -> tuple[tuple | None, Any]:
    """One stage over whole sequences (ComfyUI's single call): one tick, then flush.

    Returns (outputs joined per slot, or None for a sink; what flush returned). Aborts on error."""
    graph = StageGraph(["whole"], [Step("stage", stage, {k: ("whole", i) for i, k in enumerate(stream_inputs)}, outputs)])
    try:
        values = graph.finish({"whole": tuple(stream_inputs.values())})
    except BaseException:
        graph.abort()
        raise
    return values["stage"], graph["stage"].flushed
