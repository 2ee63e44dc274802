"""Run a saved workflow headless: once over the whole sequence, or chunk by chunk over a stream.

One graph, two runtimes. ComfyUI calls each node's FUNCTION once with whole sequences; this
module's `execute_whole` does the same (it is what ComfyUI does, minus the server). `StreamRunner`
runs the same graph chunk by chunk, so memory stays flat on endless inputs, through the one chunk
loop of streaming/render/driver.py:

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
from typing import Any, Callable, Mapping

from .driver import Lanes, RunStats, StageGraph, Step, chunk_length, concat_chunks, drive, run_once
from .workflow import Link, Workflow, WorkflowError, upstream_of, validate

__all__ = ["RunStats", "StreamRunner", "chunk_length", "concat_chunks", "execute_whole", "run_source_whole",
           "run_stage_whole"]


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
    """A stage or sink node's FUNCTION: start, one step over the whole sequence, flush (driver.run_once)."""
    cls = type(node)
    stream_names = set(cls.STREAM_INPUTS)
    static = {k: v for k, v in inputs.items() if k not in stream_names}
    stage = node.start_stream(**static)
    outputs, flushed = run_once(stage, {k: v for k, v in inputs.items() if k in stream_names}, len(cls.RETURN_TYPES))
    if not cls.RETURN_TYPES:
        return flushed if isinstance(flushed, dict) else {"ui": {}}
    return outputs or (None,) * len(cls.RETURN_TYPES)


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


class StreamRunner:
    """Runs a validated workflow chunk by chunk: run-once nodes first, then its stream nodes as a
    StageGraph driven by driver.drive (the one chunk loop).

    progress(stats) is called after every tick (the CLI draws a bar from it); should_stop() is
    polled between ticks. State lives in the stage objects.
    """

    def __init__(
        self,
        wf: Workflow,
        node_classes: Mapping[str, type],
        progress: Callable[[RunStats], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        static_cache: dict | None = None,
        sync: Callable[[], None] | None = None,
        targets: list[str] | None = None,
        lanes: Lanes | None = None,
    ):
        """static_cache: a dict kept by the caller across runs; run-once nodes (model loaders, prompt
        encoding) whose class and inputs match an earlier run reuse its outputs (`run --inputs`).
        sync: called at the end of every node's step before its time is read (torch.cuda.synchronize
        in `bench`: GPU work is asynchronous and would otherwise be billed to whichever node waits).
        targets: the nodes whose outputs are wanted (default: the output nodes); only what they
        depend on runs.
        lanes: run the stream nodes on lanes (worker threads) (driver.Lanes; the CLI passes its
        configured plan, streaming/render/cpu.py)."""
        self.wf, self.classes = wf, node_classes
        self.lanes = lanes
        self.progress, self.should_stop = progress, should_stop
        self.static_cache = static_cache
        self._sync = sync
        self.order = validate(wf, node_classes)
        outputs = targets or [n for n in self.order if getattr(self._cls(n), "OUTPUT_NODE", False)]
        needed = upstream_of(wf, outputs)
        self.order = [n for n in self.order if n in needed]
        self.streaming = self._classify()
        self.sources = [n for n in self.order if getattr(self._cls(n), "STREAM", None) == "source"]
        self.values: dict[str, tuple] = {}  # run-once node outputs

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
        if not any(getattr(self._cls(n), "STREAM", None) == "source" for n in self.order) and not any(
                getattr(self._cls(n), "OUTPUT_NODE", False) and getattr(self._cls(n), "STREAM", None) is None
                for n in self.order):
            # (an output node that runs once streams on its own: Render G-Buffer Stream)
            problems.append("the workflow has no stream source (Load G-Buffers, Physics World, ...)")
        if problems:
            raise WorkflowError(self.wf.source, problems)
        return streaming

    def _static_inputs(self, nid: str) -> dict:
        return {k: self.values[v.node][v.output] if isinstance(v, Link) else v
                for k, v in self.wf.nodes[nid].inputs.items() if not (isinstance(v, Link) and v.node in self.streaming)}

    def run_static(self, node_seconds: dict | None = None) -> None:
        """Run (or take from static_cache) every run-once node, in order."""
        for nid in self.order:
            if nid in self.streaming:
                continue
            t0 = time.perf_counter()
            spec, static = self.wf.nodes[nid], self._static_inputs(nid)
            key = _static_key(spec.class_type, static) if self.static_cache is not None else None
            if key is not None and key in self.static_cache:
                self.values[nid] = self.static_cache[key]
            else:
                self.values[nid] = _result_tuple(_call_function(self._cls(nid)(), static))
                if key is not None:
                    self.static_cache[key] = self.values[nid]
            if node_seconds is not None:
                node_seconds[nid] = time.perf_counter() - t0

    def start(self, node_seconds: dict | None = None) -> StageGraph:
        """Start every stream stage with its static inputs: the workflow's stream part as a StageGraph
        fed by its source nodes (run_static first)."""
        steps = []
        try:
            for nid in self.order:
                if nid not in self.streaming or nid in self.sources:
                    continue
                t0 = time.perf_counter()
                stage = self._cls(nid)().start_stream(**self._static_inputs(nid))
                links = {k: (v.node, v.output) for k, v in self.wf.nodes[nid].inputs.items()
                         if isinstance(v, Link) and v.node in self.streaming}
                steps.append(Step(nid, stage, links, len(self._cls(nid).RETURN_TYPES)))
                if node_seconds is not None:
                    node_seconds[nid] = time.perf_counter() - t0
        except BaseException:
            StageGraph(self.sources, steps).abort()
            raise
        return StageGraph(self.sources, steps, sync=self._sync)

    def run(self) -> RunStats:
        stats = RunStats()
        start = time.perf_counter()
        self.run_static(stats.node_seconds)
        sources = {}
        for nid in self.sources:
            t0 = time.perf_counter()
            sources[nid] = iter(self._cls(nid)().open_stream(**self._static_inputs(nid)))
            stats.node_seconds[nid] = time.perf_counter() - t0
        graph = self.start(stats.node_seconds)
        stats.setup_seconds = time.perf_counter() - start
        sinks = [n for n in self.order if getattr(self._cls(n), "OUTPUT_NODE", False) and n in self.streaming]
        return drive(graph, sources, sinks, self.progress, self.should_stop, stats, start, self.lanes)
