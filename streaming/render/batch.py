"""Batch rendering: many shots over a pool of workers, a manifest beside the outputs, resume, retries.

    manifest = Manifest(Path("out/manifest.jsonl"))
    todo = [s for s in shots if not manifest.complete(s)]           # resume: finished shots stay
    summary = run_shots(todo, pool, manifest, retries=2, monitor=draw)

A shot is one input rendered to its outputs; `job` is what a worker needs (plain data, so it can
travel to a Ray worker) and `fingerprint` a hash of everything its frames depend on (workflow,
prompt, seed, settings, the models' and the input's content; streaming/cli/shots.py says which).
A long shot may instead carry `parts`, one job per frame range (streaming/cli/shot_parts.py),
rendered by any workers and joined when all are done.
The pool is where shots render: `LocalPool` (one worker in this process) or
`ray_pool.RayPool` (Ray actors); the manifest, the fingerprints and the retries are this module's,
whichever pool runs the shots.

Manifest: JSON lines, one object per shot, keyed by its first output; rewritten atomically after
every shot, so it always reads whole. A shot is complete when its record says "done" with the same
fingerprint and every output is there at the size recorded (outputs are written atomically, so one
that exists is whole). A failed shot is tried again (up to `retries` more times, on whichever worker
is free) and then recorded "failed" with its error; the batch goes on past it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from ...model_zoo import jsonfile
from ...model_zoo.errors import AlayaError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.jsonl"
READ_BLOCK = 1 << 20


# ---------------------------------------------------------------------------------------------
# Fingerprints.


def fingerprint(parts: dict) -> str:
    """sha256 of the parts as canonical JSON (sorted keys), 32 hex digits."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


class Digests:
    """Content hashes (sha256) of files and folders. A file's hash is remembered by (size, mtime) in
    a JSON file beside the manifest, so a rerun reads only what changed since."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.known: dict[str, list] = {}
        if path is not None and path.is_file():
            try:
                loaded = jsonfile.loads(path.read_text(encoding="utf-8"))
                self.known = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                log.warning("%s: unreadable, content hashes are computed again", path)

    def of(self, path: Path) -> str:
        """A file's content hash; a folder's covers every file's relative path and content (hidden
        names skipped: temporary outputs, .DS_Store)."""
        path = Path(path)
        if path.is_file():
            return self._file(path)
        if not path.is_dir():
            raise AlayaError(f"{path}: not found (an input or model file of the batch)")
        h = hashlib.sha256()
        for p in sorted(path.rglob("*")):
            rel = p.relative_to(path)
            if p.is_file() and not any(part.startswith(".") for part in rel.parts):
                h.update(f"{rel.as_posix()}\0{self._file(p)}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def _file(self, path: Path) -> str:
        st = path.stat()
        key = os.path.abspath(path)
        seen = self.known.get(key)
        if seen and seen[:2] == [st.st_size, st.st_mtime_ns]:
            return seen[2]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(READ_BLOCK):
                h.update(block)
        self.known[key] = [st.st_size, st.st_mtime_ns, h.hexdigest()]
        return h.hexdigest()

    def save(self) -> None:
        if self.path is not None:
            _write_atomic(self.path, json.dumps(self.known, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------
# Shots and the manifest.


@dataclass
class Shot:
    name: str
    input: str
    outputs: list[str]  # absolute destinations (files, or folders for frame sequences)
    job: dict  # what a worker renders: {"name", "workflow": API-format dict}
    fingerprint: str = ""
    invalid: str | None = None  # why it cannot run at all (checked before the batch starts)
    parts: list[dict] = field(default_factory=list)  # a long shot's frame ranges, each a job (else: job)
    local: Any = None  # the caller's own data about the shot (never sent to a worker)

    def jobs(self) -> list[dict]:
        return self.parts or [self.job]


def output_bytes(path: Path) -> int | None:
    """Size of an output file, or of every file in an output folder; None when it is not there."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return None


class Manifest:
    """The batch's record, JSON lines beside the outputs: one object per shot, keyed by its first output.

    Fields: name, input, outputs, fingerprint, status ("done" or "failed"), frames, attempts,
    worker, host, seconds {render, setup, wall}, finished (UTC), bytes (per output), error.
    Records of shots not in the current batch are kept.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.records: dict[str, dict] = {}
        if self.path.exists():
            self._read()

    def _read(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise AlayaError(f"{self.path}: cannot read the batch manifest ({err})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = jsonfile.loads(line)
            except ValueError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get("outputs"), list) or not record["outputs"]:
                raise AlayaError(f"{self.path}:{number}: not a manifest record (a JSON object with 'outputs'); "
                                 "fix or delete that line")
            self.records[self.key(record["outputs"][0])] = record

    def key(self, output: str) -> str:
        return os.path.abspath(output)

    def get(self, shot: Shot) -> dict | None:
        return self.records.get(self.key(shot.outputs[0]))

    def complete(self, shot: Shot) -> bool:
        """Done before with this fingerprint, and every output still there at its recorded size."""
        record = self.get(shot)
        if not record or record.get("status") != "done" or record.get("fingerprint") != shot.fingerprint:
            return False
        sizes = record.get("bytes") or {}
        return all(output_bytes(Path(out)) is not None and output_bytes(Path(out)) == sizes.get(out)
                   for out in shot.outputs)

    def put(self, shot: Shot, **fields) -> dict:
        record = {"name": shot.name, "input": shot.input, "outputs": shot.outputs, "fingerprint": shot.fingerprint,
                  **fields, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if record.get("status") == "done":
            record["bytes"] = {out: output_bytes(Path(out)) for out in shot.outputs}
        self.records[self.key(shot.outputs[0])] = record
        self.save()
        return record

    def save(self) -> None:
        _write_atomic(self.path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records.values()))


class ManifestLock:
    """One batch at a time per manifest: an exclusive lock on `.NAME.lock` beside it, held for the batch
    (two batches on one --out both rendered everything and raced on the manifest). The operating
    system drops the lock with its process, so a killed batch leaves nothing to clean up.

        with ManifestLock(manifest_path):   # AlayaError naming the holder's pid when another batch has it
            ...
    """

    def __init__(self, manifest: Path):
        self.path = Path(manifest).with_name(f".{Path(manifest).name}.lock")
        self.file = None

    def __enter__(self) -> "ManifestLock":
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise AlayaError(f"{self.path.with_name(self.path.name[1:-5])}: another batch ({holder}) is rendering "
                             "into this manifest; wait for it to finish, or give this one another --out or --manifest")
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()}")
        self.file.flush()
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()  # releases the lock; the file stays (removing it would race a batch waiting to lock it)


def _write_atomic(path: Path, text: str) -> None:
    from ..files.sinks import AtomicOutput

    out = AtomicOutput(path, overwrite=True)
    try:
        out.tmp.write_text(text, encoding="utf-8")
    except BaseException:
        out.abort()
        raise
    out.commit()


# ---------------------------------------------------------------------------------------------
# Pools: where shots render. A pool offers free() / submit(shot) / poll(timeout, tick) / statuses() / close().


class LocalPool:
    """One worker in this process (ShotWorker): the batch without Ray, with the same manifest."""

    def __init__(self, worker):
        self.worker = worker
        self.size = 1
        self.pending: tuple | None = None

    def free(self) -> bool:
        return self.pending is None

    def busy(self) -> bool:
        return self.pending is not None

    def submit(self, tag, job: dict) -> None:
        self.pending = (tag, job)

    def poll(self, timeout: float, tick: Callable[[], None] | None = None) -> list[tuple[Any, dict]]:
        """Render the submitted job here and now; tick() after each of its chunks (progress)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return []
        tag, job = pending
        self.worker.on_progress = tick
        try:
            return [(tag, self.worker.render(job))]
        finally:
            self.worker.on_progress = None

    def statuses(self) -> list[dict]:
        return [self.worker.status()]

    def close(self) -> None:
        self.worker.close()


# ---------------------------------------------------------------------------------------------
# The scheduler.


@dataclass
class Progress:
    """What a monitor sees after every poll: shots finished of total, frames rendered (finished shots
    plus the workers' current ones), each worker's status, and the seconds since the pool started."""

    total: int
    done: int = 0
    failed: int = 0
    frames: int = 0
    seconds: float = 0.0
    workers: list[dict] = field(default_factory=list)
    last: dict | None = None  # the record of the shot that just finished, if one did

    @property
    def fps(self) -> float:
        current = sum(w.get("frames", 0) for w in self.workers if w.get("shot"))
        return (self.frames + current) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Summary:
    shots: int  # in the batch
    rendered: int
    skipped: int
    failed: list[dict]  # {name, input, error, attempts}
    frames: int
    seconds: float
    workers: int
    manifest: str

    @property
    def shots_per_hour(self) -> float:
        return 3600.0 * self.rendered / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {"shots": self.shots, "rendered": self.rendered, "skipped": self.skipped, "failed": self.failed,
                "frames": self.frames, "seconds": round(self.seconds, 3), "workers": self.workers,
                "shots_per_hour": round(self.shots_per_hour, 1), "manifest": self.manifest}


def run_shots(shots: list[Shot], pool, manifest: Manifest, retries: int = 2,
              monitor: Callable[[Progress], None] | None = None, poll_seconds: float = 0.5,
              assemble: Callable[[Shot], int] | None = None) -> Progress:
    """Render every shot on the pool, recording each in the manifest as it finishes. The pool runs
    jobs: a shot's one job, or each of its parts (any worker, in any order). A failed job goes back
    in the queue until it has had 1 + retries attempts, then its shot is recorded as failed. When
    every part of a split shot is done, assemble(shot) joins them (returns the frames written).
    Returns the final Progress."""
    queue = deque((shot, i) for shot in shots for i in range(len(shot.jobs())))
    attempts: dict[tuple[str, int], int] = {}  # shots are keyed by their first output (unique)
    results: dict[str, dict[int, dict]] = {shot.outputs[0]: {} for shot in shots}
    started: dict[str, float] = {}
    failed: set[str] = set()
    progress = Progress(total=len(shots))
    start = time.perf_counter()

    def report(last: dict | None = None) -> None:
        progress.seconds = time.perf_counter() - start
        progress.workers = pool.statuses()
        progress.last = last
        if monitor is not None:
            monitor(progress)

    def record(shot: Shot, parts: dict[int, dict], n: int, error: str | None = None, frames: int | None = None) -> None:
        last = parts[max(parts)] if parts else {}
        seconds = {"render": round(sum(r.get("seconds", 0.0) for r in parts.values()), 3),
                   "setup": round(sum(r.get("setup_seconds") or 0.0 for r in parts.values()), 3),
                   "wall": round(time.perf_counter() - started[shot.outputs[0]], 3)}
        workers = sorted({str(r.get("worker")) for r in parts.values()})
        common = dict(attempts=n, worker=", ".join(workers) or None, host=last.get("host"), seconds=seconds)
        progress.done += 1
        if error is None:
            progress.frames += frames
            report(manifest.put(shot, status="done", error=None, frames=frames, **common))
        else:
            failed.add(shot.outputs[0])
            progress.failed += 1
            report(manifest.put(shot, status="failed", error=error, frames=frames or 0, **common))

    while queue or pool.busy():
        while queue and pool.free():
            shot, i = queue.popleft()
            if shot.outputs[0] in failed:
                continue
            key = (shot.outputs[0], i)
            attempts[key] = attempts.get(key, 0) + 1
            started.setdefault(shot.outputs[0], time.perf_counter())
            job = shot.jobs()[i]
            job["attempt"] = attempts[key]
            pool.submit((shot, i), job)
        finished = pool.poll(poll_seconds, tick=report if monitor is not None else None)
        for (shot, i), result in finished:
            if shot.outputs[0] in failed:
                continue
            n = attempts[(shot.outputs[0], i)]
            parts = results[shot.outputs[0]]
            if not result.get("ok"):
                if n <= retries:
                    log.warning("%s: attempt %d of %d failed (%s); trying again", shot.jobs()[i]["name"], n,
                                1 + retries, result.get("error"))
                    queue.append((shot, i))
                    report()
                else:
                    parts[i] = result
                    record(shot, parts, n, error=result.get("error"), frames=result.get("frames", 0))
                continue
            parts[i] = result
            if len(parts) < len(shot.jobs()):
                report()
                continue
            n = max(attempts[(shot.outputs[0], k)] for k in range(len(shot.jobs())))
            if not shot.parts:
                record(shot, parts, n, frames=result.get("frames", 0))
                continue
            try:
                frames = assemble(shot)
            except Exception as err:  # noqa: BLE001  (recorded; the batch goes on)
                record(shot, parts, n, error=f"joining the parts: {err}")
                continue
            record(shot, parts, n, frames=frames)
        if not finished:
            report()
    return progress


def summarize(shots: list[Shot], rendered: list[Shot], manifest: Manifest, seconds: float, workers: int,
              skipped: int) -> Summary:
    """The batch's outcome from the manifest: rendered now, skipped (complete already), failed."""
    records = [manifest.get(s) or {} for s in shots]
    failed = [{"name": s.name, "input": s.input, "error": r.get("error"), "attempts": r.get("attempts", 0)}
              for s, r in zip(shots, records) if r.get("status") != "done"]
    now = {id(s) for s in rendered}
    ok_now = [r for s, r in zip(shots, records) if id(s) in now and r.get("status") == "done"]
    return Summary(shots=len(shots), rendered=len(ok_now), skipped=skipped, failed=failed,
                   frames=sum(r.get("frames", 0) for r in ok_now), seconds=seconds, workers=workers,
                   manifest=str(manifest.path))


def default_manifest(template: str) -> Path:
    """manifest.jsonl in the output template's folder, above any `{name}` part: out/{name}.mp4 ->
    out/manifest.jsonl; out/{name}/frames -> out/manifest.jsonl."""
    parent = Path(template).parent
    while "{" in str(parent) and parent != parent.parent:
        parent = parent.parent
    return parent / MANIFEST_NAME


def json_ready(value: Any) -> Any:
    """Plain JSON data (the job travels to other processes and into the fingerprint)."""
    return json.loads(json.dumps(value, default=str))
