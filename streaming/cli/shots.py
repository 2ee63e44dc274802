"""Shots: one G-buffer input rendered through a saved workflow, as `run --inputs` and `batch` do it.

The per-input substitution both commands share (the source node's `path`, `{name}` in the Save
filenames), the output-name collision check, what a shot's fingerprint is made of, and
`ShotWorker`, which renders shots one after another with the models loaded once (in this process,
or as a Ray actor in `batch`).
"""
from __future__ import annotations

import copy
import os
import socket
import time
from pathlib import Path

from ...model_zoo.errors import AlayaError

SAVE = "AlayaFlash_Save"
PROMPT = "AlayaFlash_EncodePrompt"
SAMPLERS = ("AlayaFlash_FlashSampler", "AlayaFlash_TeacherSampler")
# Loader inputs that name model files, and the model folder kind each is looked up in (nodes/models.py).
MODEL_INPUTS = {
    "AlayaFlash_LoadFlashModel": {"model": "diffusion_models", "decoder": "vae_approx", "text_encoder": "text_encoders"},
    "AlayaFlash_LoadTeacherModel": {"model": "diffusion_models", "vae": "vae", "text_encoder": "text_encoders"},
}


def node_classes() -> dict:
    from ...nodes import NODE_CLASS_MAPPINGS

    return NODE_CLASS_MAPPINGS


def source_node(wf, ref: str | None) -> str:
    """The node whose `path` each input replaces: `ref` (id, title or type), else the only node with a path."""
    if ref is not None:
        hits = [n for n, s in wf.nodes.items() if ref in (n, s.title, s.class_type)]
    else:
        hits = [n for n, s in wf.nodes.items() if "path" in s.inputs]
    if len(hits) != 1:
        raise AlayaError(f"{wf.source}: --inputs needs exactly one source node with a 'path' input; found "
                         f"{len(hits)} ({', '.join(hits) or 'none'}); name one with --input-node")
    return hits[0]


def save_nodes(wf) -> list[str]:
    return [n for n, s in wf.nodes.items() if s.class_type == SAVE]


def outputs(wf) -> list[Path]:
    """What the workflow's Save nodes write (an mp4 gets its .mp4 suffix; sequences are folders)."""
    return [output_of(wf, n) for n in save_nodes(wf)]


def output_of(wf, save: str) -> Path:
    from ...nodes.output import destination

    return destination(wf.nodes[save].inputs["filename"], wf.nodes[save].inputs.get("format", "mp4"))


def batch_classes() -> dict:
    """The pack's nodes plus the batch's own stage (shot_parts.Trim, which drops a part's pre-roll)."""
    from .shot_parts import NODES

    return {**node_classes(), **NODES}


def input_name(path: str) -> str:
    """`{name}` of an input: a file's stem (clips/c1.npy -> c1), a folder's name (clips/c1/ -> c1)."""
    p = Path(path)
    return p.stem if p.is_file() else p.name


def per_input(wf, source: str, path: str, name: str):
    """A copy of wf reading `path` and writing to its Save filenames with `{name}` replaced (a filename
    without `{name}` gets `-{name}` before its suffix)."""
    one = copy.deepcopy(wf)
    one.nodes[source].inputs["path"] = path
    for n in save_nodes(one):
        fn = one.nodes[n].inputs["filename"]
        if "{name}" not in fn:
            p = Path(fn)
            fn = str(p.with_name(f"{p.stem}-{{name}}{p.suffix}"))
        one.nodes[n].inputs["filename"] = fn.replace("{name}", name)
    return one


def refuse_collisions(planned: list[tuple[str, list[Path]]]) -> None:
    """Refuse, before anything runs, two inputs that would write the same output (c1/ and c1.npy)."""
    writers: dict[Path, list[str]] = {}
    for source, outs in planned:
        for out in outs:
            writers.setdefault(Path(os.path.abspath(out)), []).append(source)
    clashes = {out: who for out, who in writers.items() if len(who) > 1}
    if clashes:
        out, who = next(iter(clashes.items()))
        more = f" (and {len(clashes) - 1} more output(s))" if len(clashes) > 1 else ""
        raise AlayaError(f"inputs {', '.join(map(repr, who))} would all write {out}{more}; nothing was rendered: "
                         "rename an input, or give each a distinct 'name' in an input list")


def model_files(wf) -> dict[str, Path]:
    """'NODE.INPUT' -> the model file or folder a loader input names (random weights and '(from model)' name none)."""
    from ...nodes import comfy

    found = {}
    for nid, spec in wf.nodes.items():
        for name, kind in MODEL_INPUTS.get(spec.class_type, {}).items():
            value = spec.inputs.get(name)
            if isinstance(value, str) and not value.startswith("random:") and not value.startswith("("):
                path = comfy.resolve(kind, value)
                if path is not None:
                    found[f"{nid}.{name}"] = path
                    found.update({f"{nid}.{name}:{p.name}": p for p in _shards(path)})
    return found


def _shards(path: Path) -> list[Path]:
    """The shard files a published DiT's .index.json names (their content is the model too)."""
    if not path.name.endswith(".index.json"):
        return []
    from ...model_zoo import jsonfile

    try:
        names = sorted(set(jsonfile.loads(path.read_text(encoding="utf-8")).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError):
        return []
    return [path.parent / n for n in names if (path.parent / n).is_file()]


def fingerprint_parts(wf, source: str, input_path: Path, digest, settings: dict) -> dict:
    """What a shot's frames depend on: the workflow (its prompt, seed and every setting; not the input's
    path nor where the output goes), the models' and the input's content, and the render settings.
    digest(path) -> content hash."""
    graph = copy.deepcopy(wf.to_api())
    for node in graph.values():
        node.pop("_meta", None)
    graph[source]["inputs"].pop("path", None)
    for n in save_nodes(wf):
        graph[n]["inputs"].pop("filename", None)
        graph[n]["inputs"].pop("overwrite", None)
    return {"workflow": graph, "models": {k: digest(p) for k, p in sorted(model_files(wf).items())},
            "input": digest(input_path), "settings": settings}


class ShotWorker:
    """Renders shots one at a time with the models loaded once: run-once node outputs (models, prompt
    embeddings) are cached across shots, stream stages are new for every shot.

    threads: torch's intra-op threads, set here and before every shot, never inherited: on a CPU the
    frames' last bits depend on how many threads split a reduction (Ray gives its workers
    OMP_NUM_THREADS = their CPUs; a shell may set anything), so every worker of a batch uses the same.
    render(job) returns plain data (it travels back from Ray workers); a shot's error is a result, not
    an exception, so one bad shot leaves the worker running. cpu_only (a Ray worker given no GPU) hides
    the GPUs from this process before torch looks at them.
    """

    def __init__(self, threads: int, worker: str = "w1", cpu_only: bool = False):
        if cpu_only:  # a worker given no GPU renders on the CPU, as its fingerprint says ("auto" devices)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        import torch

        self.threads = threads
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        self.cache: dict = {}
        self.classes = batch_classes()
        self.on_progress = None  # called after every tick (in-process progress bars)
        self.state = {"worker": worker, "pid": os.getpid(), "host": socket.gethostname(), "shot": None,
                      "attempt": 0, "frames": 0, "shots": 0}

    def render(self, job: dict) -> dict:
        """Render one shot: job = {"name", "attempt", "workflow": API-format dict}; returns
        {"ok", "frames", "seconds", "setup_seconds", "error", "worker", "host", "pid"}."""
        import torch

        from ..render.runner import StreamRunner
        from ..render.workflow import parse_workflow

        torch.set_num_threads(self.threads)
        self.state.update(shot=job["name"], attempt=job.get("attempt", 1), frames=0)
        start = time.perf_counter()
        out = {k: self.state[k] for k in ("worker", "host", "pid")}
        try:
            wf = parse_workflow(job["workflow"], self.classes, source=job["name"])
            stats = StreamRunner(wf, self.classes, progress=self._progress, static_cache=self.cache).run()
            out.update(ok=True, frames=stats.frames, seconds=stats.seconds, setup_seconds=stats.setup_seconds)
        except Exception as err:  # noqa: BLE001  (the shot failed, the worker goes on)
            text = str(err) if isinstance(err, AlayaError) else f"{type(err).__name__}: {err}"
            out.update(ok=False, frames=self.state["frames"], seconds=time.perf_counter() - start, error=text)
        finally:
            self.state.update(shot=None, shots=self.state["shots"] + 1)
        return out

    def _progress(self, stats) -> None:
        self.state["frames"] = stats.frames
        if self.on_progress is not None:
            self.on_progress()

    def status(self) -> dict:
        return dict(self.state)

    def close(self) -> None:
        """Give the process its thread count back (an in-process batch runs inside someone's process)."""
        import torch

        torch.set_num_threads(self._threads_before)
