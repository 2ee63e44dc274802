"""Run a saved workflow headless: once over the whole sequence, or chunk by chunk over a stream.

One graph, two runtimes. ComfyUI calls each node's FUNCTION once with whole sequences; this
module's `execute_whole` does the same (it is what ComfyUI does, minus the server). `StreamRunner`
runs the same graph chunk by chunk, so memory stays flat on endless inputs:

- static nodes (loaders, prompt encoding) run once, through FUNCTION;
- source nodes (STREAM = "source") yield one chunk per tick from `open_stream(**inputs)`;
- stage nodes (STREAM = "stage"; sinks are stages with OUTPUT_NODE) are started once with their
  static inputs, `start_stream(**static) -> stage`, then get `stage.step(**chunk_inputs)` per tick
  (the inputs named in STREAM_INPUTS) and `stage.flush()` at the end; `stage.abort()`, when
  defined, runs on error or interruption so sinks leave no partial file.

A step returns a tuple aligned with RETURN_TYPES (or None: nothing ready yet); an output slot may
be None for "nothing this tick". Stages keep their state (KV cache, codec memory, open writers)
between ticks, and buffer internally, so the frames do not depend on how the stream was cut:
the whole-sequence run and the chunked run give the same frames. Chunk values are torch tensors
(concatenated along dim 0, like IMAGE) or objects with a `concat(list)` classmethod. Consumers
must not modify chunk values in place: one output can feed several nodes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from .workflow import Link, Workflow, WorkflowError, upstream_of, validate


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


def _call_function(node: Any, inputs: dict) -> Any:
    return getattr(node, type(node).FUNCTION)(**inputs)


def _result_tuple(ret: Any) -> tuple:
    if isinstance(ret, dict):  # {"ui": ..., "result": (...)}
        return tuple(ret.get("result") or ())
    return tuple(ret) if ret is not None else ()


# ---------------------------------------------------------------------------------------------
# Helpers the nodes use for their FUNCTION, so ComfyUI's one-shot call and the runner share code.


def run_source_whole(node: Any, **inputs) -> tuple:
    """A source node's FUNCTION: every chunk of open_stream, joined per output."""
    chunks = list(node.open_stream(**inputs))
    n = len(type(node).RETURN_TYPES)
    return tuple(concat_chunks([c[i] for c in chunks]) for i in range(n))


def run_stage_whole(node: Any, **inputs) -> Any:
    """A stage or sink node's FUNCTION: start, one step over the whole sequence, flush."""
    cls = type(node)
    stream_names = set(cls.STREAM_INPUTS)
    static = {k: v for k, v in inputs.items() if k not in stream_names}
    stage = node.start_stream(**static)
    try:
        first = stage.step(**{k: v for k, v in inputs.items() if k in stream_names})
        last = stage.flush()
    except BaseException:
        if hasattr(stage, "abort"):
            stage.abort()
        raise
    if not cls.RETURN_TYPES:
        return last if isinstance(last, dict) else {"ui": {}}
    first, last = first or (None,) * len(cls.RETURN_TYPES), last or (None,) * len(cls.RETURN_TYPES)
    return tuple(concat_chunks([a, b]) for a, b in zip(first, last))


# ---------------------------------------------------------------------------------------------
# Whole-sequence execution (what ComfyUI does with a prompt).


def execute_whole(wf: Workflow, node_classes: Mapping[str, type]) -> dict[str, tuple]:
    """Run every needed node once, in order, through FUNCTION; return node id -> outputs."""
    order = validate(wf, node_classes)
    outputs_wanted = [n for n in order if getattr(node_classes[wf.nodes[n].class_type], "OUTPUT_NODE", False)]
    needed = upstream_of(wf, outputs_wanted)
    results: dict[str, tuple] = {}
    for nid in order:
        if nid not in needed:
            continue
        spec = wf.nodes[nid]
        inputs = {k: results[v.node][v.output] if isinstance(v, Link) else v for k, v in spec.inputs.items()}
        results[nid] = _result_tuple(_call_function(node_classes[spec.class_type](), inputs))
    return results


# ---------------------------------------------------------------------------------------------
# Chunk-by-chunk execution.


def _static_key(class_type: str, inputs: dict) -> tuple | None:
    """A cache key for a run-once node: its class and inputs (objects by identity)."""
    parts = []
    for k, v in sorted(inputs.items()):
        try:
            hash(v)
            parts.append((k, type(v).__name__, v))
        except TypeError:
            parts.append((k, "id", id(v)))
    return (class_type, tuple(parts))


@dataclass
class RunStats:
    ticks: int = 0
    frames: int = 0  # frames produced by the sources
    seconds: float = 0.0
    first_chunk_seconds: float | None = None
    setup_seconds: float = 0.0  # run-once nodes, opening sources and starting stages
    first_output_seconds: float | None = None  # from the end of setup to the first tick a sink got frames
    node_seconds: dict[str, float] = field(default_factory=dict)  # node id -> time in that node

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


class StreamRunner:
    """Runs a validated workflow chunk by chunk.

    progress(stats) is called after every tick (the CLI draws a bar from it); should_stop() is
    polled between ticks (the live preview's pause/stop). State lives in the stage objects.
    """

    def __init__(
        self,
        wf: Workflow,
        node_classes: Mapping[str, type],
        progress: Callable[[RunStats], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        static_cache: dict | None = None,
        sync: Callable[[], None] | None = None,
    ):
        """static_cache: a dict kept by the caller across runs; run-once nodes (model loaders, prompt
        encoding) whose class and inputs match an earlier run reuse its outputs (`run --inputs`).
        sync: called at the end of every node's step before its time is read (torch.cuda.synchronize
        in `bench`: GPU work is asynchronous and would otherwise be billed to whichever node waits)."""
        self.wf, self.classes = wf, node_classes
        self.progress, self.should_stop = progress, should_stop
        self.static_cache = static_cache
        self._sync = sync or (lambda: None)
        self.order = validate(wf, node_classes)
        outputs = [n for n in self.order if getattr(self._cls(n), "OUTPUT_NODE", False)]
        needed = upstream_of(wf, outputs)
        self.order = [n for n in self.order if n in needed]
        self.streaming = self._classify()

    def _cls(self, nid: str) -> type:
        return self.classes[self.wf.nodes[nid].class_type]

    def _classify(self) -> set[str]:
        """Which nodes carry streams; reject graphs where a run-once node would see a stream."""
        streaming: set[str] = set()
        problems = []
        for nid in self.order:
            spec, cls = self.wf.nodes[nid], self._cls(nid)
            role = getattr(cls, "STREAM", None)
            stream_inputs = set(getattr(cls, "STREAM_INPUTS", ()))
            fed = {k for k, v in spec.inputs.items() if isinstance(v, Link) and v.node in streaming}
            if role == "source":
                streaming.add(nid)
            elif role == "stage":
                for name in fed - stream_inputs:
                    problems.append(f"{spec.label(nid)}: input {name!r} receives a stream but is read once")
                for name in stream_inputs - fed:
                    if name in spec.inputs:
                        problems.append(f"{spec.label(nid)}: input {name!r} must come from a stream source (e.g. Load G-Buffers)")
                streaming.add(nid)
            elif fed:
                for name in sorted(fed):
                    problems.append(f"{spec.label(nid)}: input {name!r} receives a stream, but this node runs once over whole sequences")
        if not any(getattr(self._cls(n), "STREAM", None) == "source" for n in self.order):
            problems.append("the workflow has no stream source (Load G-Buffers, Physics World, ...)")
        if problems:
            raise WorkflowError(self.wf.source, problems)
        return streaming

    def run(self) -> RunStats:
        stats = RunStats()
        values: dict[str, tuple] = {}  # static node outputs
        stages: dict[str, Any] = {}
        sources: dict[str, Iterator] = {}
        start = time.perf_counter()
        try:
            # 1. Run-once nodes, then start stages and open sources with their static inputs.
            for nid in self.order:
                spec, cls = self.wf.nodes[nid], self._cls(nid)
                static = {k: values[v.node][v.output] if isinstance(v, Link) else v
                          for k, v in spec.inputs.items() if not (isinstance(v, Link) and v.node in self.streaming)}
                t0 = time.perf_counter()
                if nid not in self.streaming:
                    key = _static_key(spec.class_type, static) if self.static_cache is not None else None
                    if key is not None and key in self.static_cache:
                        values[nid] = self.static_cache[key]
                    else:
                        values[nid] = _result_tuple(_call_function(cls(), static))
                        if key is not None:
                            self.static_cache[key] = values[nid]
                elif cls.STREAM == "source":
                    sources[nid] = iter(cls().open_stream(**static))
                else:
                    stages[nid] = cls().start_stream(**static)
                self._sync()
                stats.node_seconds[nid] = time.perf_counter() - t0
            stats.setup_seconds = time.perf_counter() - start
            sinks = [n for n in self.order if getattr(self._cls(n), "OUTPUT_NODE", False) and n in self.streaming]
            # 2. One tick per source chunk: every stream node steps once, in graph order.
            while sources:
                tick: dict[str, tuple] = {}
                alive = False
                for nid in self.order:
                    if nid not in self.streaming:
                        continue
                    t0 = time.perf_counter()
                    if nid in sources:
                        chunk = next(sources[nid], None)
                        alive |= chunk is not None
                        tick[nid] = chunk
                        if chunk is not None:
                            stats.frames += max(chunk_length(c) for c in chunk)
                    else:
                        tick[nid] = self._step(nid, stages[nid], tick, final=False)
                    self._sync()
                    stats.node_seconds[nid] = stats.node_seconds.get(nid, 0.0) + time.perf_counter() - t0
                if not alive:
                    break
                stats.ticks += 1
                stats.seconds = time.perf_counter() - start
                if stats.first_chunk_seconds is None:
                    stats.first_chunk_seconds = stats.seconds
                if stats.first_output_seconds is None and any(self._fed(n, tick) for n in sinks):
                    stats.first_output_seconds = stats.seconds - stats.setup_seconds
                if self.progress:
                    self.progress(stats)
                if self.should_stop and self.should_stop():
                    break
            # 3. Flush: what stages still buffer flows downstream once more.
            tick = {nid: None for nid in sources}
            for nid in self.order:
                if nid in stages:
                    if stats.first_output_seconds is None and nid in sinks and self._fed(nid, tick):
                        stats.first_output_seconds = time.perf_counter() - start - stats.setup_seconds
                    t0 = time.perf_counter()
                    tick[nid] = self._step(nid, stages[nid], tick, final=True)
                    self._sync()
                    stats.node_seconds[nid] += time.perf_counter() - t0
        except BaseException:
            for nid in reversed(self.order):
                if nid in stages and hasattr(stages[nid], "abort"):
                    stages[nid].abort()
            raise
        stats.seconds = time.perf_counter() - start
        return stats

    def _fed(self, nid: str, tick: dict[str, tuple | None]) -> bool:
        """Whether a node received any stream value this tick."""
        for v in self.wf.nodes[nid].inputs.values():
            if isinstance(v, Link) and v.node in self.streaming:
                out = tick.get(v.node)
                if out is not None and out[v.output] is not None:
                    return True
        return False

    def _step(self, nid: str, stage: Any, tick: dict[str, tuple | None], final: bool) -> tuple | None:
        spec, cls = self.wf.nodes[nid], self._cls(nid)
        inputs = {}
        for k, v in spec.inputs.items():
            if isinstance(v, Link) and v.node in self.streaming:
                out = tick.get(v.node)
                inputs[k] = None if out is None else out[v.output]
        n = len(cls.RETURN_TYPES)
        first = stage.step(**inputs) if any(x is not None for x in inputs.values()) else None
        if not final:
            return first
        last = stage.flush()
        if not n:
            return None
        first, last = first or (None,) * n, (last if isinstance(last, tuple) else None) or (None,) * n
        return tuple(concat_chunks([a, b]) for a, b in zip(first, last))

