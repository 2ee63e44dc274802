"""Render many G-buffer shots through one saved workflow on a pool of workers, with a manifest and resume.

  alaya-flash batch workflows/api/render-gbuffer-sequence.json --inputs 'clips/*' --out 'out/{name}.mp4'
  alaya-flash batch WORKFLOW --inputs shots.jsonl --out 'out/{name}.mp4' --workers 2 --json
  alaya-flash batch WORKFLOW --inputs 'clips/*' --out 'out/{name}.mp4' --address HEAD:6379 --gpus-per-worker 1

Each input (a GLOB's matches, or a LIST file: .txt with one path per line, or .jsonl / .json with
objects {"input", "name", "prompt", "seed", "set"}) replaces the workflow's G-buffer source path
and is rendered whole by one worker; '{name}' in --out becomes the input's name. Workers are Ray
actors (installed with the `ray` extra): without --address a private Ray runs on this machine,
with one the batch joins that cluster. Without Ray the shots render here, one after another.

A manifest (JSON lines, beside the outputs) records each shot's input, outputs, fingerprint
(workflow, prompt, seed, settings, model and input content), frames, status, timings and error.
A rerun skips shots whose fingerprint matches a complete output and renders changed ones. A failed
shot is tried again (--retries), then listed; the batch goes on past it and exits with status 1
at the end. Two inputs that would write the same output are refused before anything runs.
--split N renders longer shots in parts of N frames on any workers, each warmed up by --preroll
frames it then drops, and joins them, crossfading the --overlap frames two parts both render
(docs/runner.md, "Long shots": the seam, measured).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import sys
import time
from pathlib import Path

from .. import args as args_
from ..args import SEED, bounded

HELP = "render many shots through a workflow on a pool of workers (Ray), with a manifest and resume"
LIST_SUFFIXES = (".txt", ".json", ".jsonl")
LIST_KEYS = ("input", "name", "prompt", "seed", "set")
FINGERPRINT_VERSION = 2  # 2: MP4s encoded without x264's macroblock tree (deterministic bytes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", type=Path, help="workflow JSON (API format, UI format, or a /prompt body)")
    parser.add_argument("--inputs", required=True, metavar="GLOB|LIST",
                        help="G-buffer folders/files matching GLOB, or a list file (.txt, .json, .jsonl)")
    parser.add_argument("--out", metavar="TEMPLATE",
                        help="the Save node's filename; {name} becomes each input's name; unset: the workflow's")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NODE.INPUT=VALUE",
                        help="override a widget value for every shot (repeatable)")
    parser.add_argument("--input-node", metavar="NODE", help="the source node whose 'path' is replaced; "
                        "unset: the only node with a 'path' input")
    parser.add_argument("--manifest", type=Path, help="manifest file; unset: manifest.jsonl in the output folder")
    parser.add_argument("--retries", type=bounded(int, 0, 100), default=2, help="more attempts for a failed shot")
    parser.add_argument("--force", action="store_true", help="render every shot, complete or not")
    parser.add_argument("--engine", choices=["auto", "ray", "local"], default="auto",
                        help="auto: Ray when installed; local: one worker in this process")
    parser.add_argument("--workers", type=bounded(int, 1, 100_000), help="worker processes; unset: as many as fit")
    parser.add_argument("--threads", type=bounded(int, 1, 1024), default=1,
                        help="torch threads per worker (also the CPUs each Ray worker reserves); part of the "
                             "fingerprint, since on a CPU the frames' last bits depend on it")
    args_.add_backend_argument(parser)
    parser.add_argument("--gpus-per-worker", type=bounded(float, 0.0, 64.0),
                        help="GPUs each Ray worker reserves (0.25: four share one; 0: CPU only); unset: 1 where "
                             "the machine (or the cluster, with --address) has GPUs, else 0")
    parser.add_argument("--address", help="join this Ray cluster (HOST:PORT of `ray start --head`); "
                        "unset: start a private one on this machine")
    parser.add_argument("--split", type=bounded(int, 0, 10_000_000), default=0, metavar="FRAMES",
                        help="render shots longer than FRAMES in parts of FRAMES frames, on any workers, then join "
                             "them (0: whole shots); a part is its own stream: see --preroll")
    parser.add_argument("--preroll", type=bounded(int, 0, 10_000), default=48, metavar="FRAMES",
                        help="with --split: frames each part renders before its range to warm up the stream, "
                             "then drops")
    parser.add_argument("--overlap", type=bounded(int, 0, 10_000), default=None, metavar="FRAMES",
                        help="with --split: frames before its range each part renders as well (after its pre-roll) "
                             "and crossfades with the previous part's, so the seam is no jump; below --split "
                             "(default: 8, at most half of --split)")
    parser.add_argument("--allow-outside", action="store_true",
                        help="let an input list's 'set' send a Save node's output outside the --out folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


# ---------------------------------------------------------------------------------------------
# Inputs: a glob or a list file -> entries {input, name, prompt, seed, set}.


def read_inputs(text: str) -> list[dict]:
    from ....model_zoo.errors import AlayaError

    path = Path(text)
    if path.suffix.lower() in LIST_SUFFIXES and path.is_file():
        return _read_list(path)
    matches = sorted(glob.glob(text))
    if not matches:
        raise AlayaError(f"--inputs {text!r}: no files or folders match")
    return [{"input": m} for m in matches]


def _read_list(path: Path) -> list[dict]:
    """A .txt list (a path per line, '#' comments) or JSON objects (.jsonl a line each, .json an array);
    relative paths start at the list's folder."""
    from ....model_zoo import jsonfile
    from ....model_zoo.errors import AlayaError

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise AlayaError(f"{path}: cannot read the input list ({err})") from None
    items: list[tuple[str, object]] = []
    if path.suffix.lower() == ".txt":
        items = [(f"{path}:{i}", line.strip()) for i, line in enumerate(text.splitlines(), 1)
                 if line.strip() and not line.strip().startswith("#")]
    elif path.suffix.lower() == ".jsonl":
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append((f"{path}:{i}", jsonfile.loads(line)))
                except ValueError as err:
                    raise AlayaError(f"{path}:{i}: not JSON ({err})") from None
    else:
        try:
            data = jsonfile.loads(text)
        except ValueError as err:
            raise AlayaError(f"{path}: not JSON ({err})") from None
        if not isinstance(data, list):
            raise AlayaError(f"{path}: expected a JSON array of inputs")
        items = [(f"{path}: item {i}", v) for i, v in enumerate(data, 1)]
    entries = []
    for where, item in items:
        entry = {"input": item} if isinstance(item, str) else item
        if not isinstance(entry, dict) or not isinstance(entry.get("input"), str) or not entry["input"]:
            raise AlayaError(f"{where}: expected a path or an object with an 'input' path")
        unknown = sorted(set(entry) - set(LIST_KEYS))
        if unknown:
            raise AlayaError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(LIST_KEYS)}")
        checks = {"name": (str,), "prompt": (str,), "seed": (int,), "set": (list,)}
        for key, kinds in checks.items():
            if key in entry and (not isinstance(entry[key], kinds) or isinstance(entry[key], bool)):
                raise AlayaError(f"{where}: {key!r} must be {'an integer' if key == 'seed' else 'a list of NODE.INPUT=VALUE' if key == 'set' else 'a string'}")
        if "seed" in entry:
            try:
                SEED(str(entry["seed"]))
            except argparse.ArgumentTypeError as err:  # an error of the list's line, not of a flag
                raise AlayaError(f"{where}: 'seed' {err}") from None
        nul = next((k for k in ("input", "name") if "\x00" in entry.get(k, "")), None)
        if nul:  # a path or file name with one reached os calls as a ValueError (a traceback)
            raise AlayaError(f"{where}: {nul} {entry[nul]!r} holds a NUL character, which no path or file name may hold")
        if "name" in entry and (not entry["name"] or "/" in entry["name"] or entry["name"] in (".", "..")):
            raise AlayaError(f"{where}: name {entry['name']!r} must be a non-empty file name without '/'")
        entry = dict(entry, where=where)
        try:
            p = Path(entry["input"]).expanduser()
        except RuntimeError:  # '~name' of a user this machine does not have
            raise AlayaError(f"{where}: input {entry['input']!r}: no home directory for "
                             f"{entry['input'].split('/')[0]!r} (no such user)") from None
        entry["input"] = str(p if p.is_absolute() else path.parent / p)
        entries.append(entry)
    if not entries:
        raise AlayaError(f"{path}: the input list is empty")
    return entries


# ---------------------------------------------------------------------------------------------
# Shots.


def plan(args, settings: dict, digests) -> list:
    """One Shot per input: its workflow (input, per-shot prompt/seed/overrides, absolute output paths),
    outputs, fingerprint, and why it cannot run when validation refuses it."""
    from ....model_zoo.errors import AlayaError
    from ...render.batch import Shot, default_manifest, fingerprint, json_ready
    from ...render.runner import StreamRunner
    from ...render.workflow import apply_overrides, parse_workflow
    from .. import shot_parts
    from ..shots import (PROMPT, SAMPLERS, batch_classes, fingerprint_parts, input_name, output_of, outputs, per_input,
                         refuse_collisions, save_nodes, source_node)
    from ....nodes import comfy
    from .run import load

    wf, _ = load(args.workflow, args.sets, check=False)  # checked per shot below
    classes = batch_classes()
    saves = save_nodes(wf)
    if not saves:
        raise AlayaError(f"{args.workflow}: the workflow has no Save node, so a batch would write nothing")
    if args.out is not None:
        if len(saves) != 1:
            raise AlayaError(f"{args.workflow}: --out needs exactly one Save node, found {len(saves)} ({', '.join(saves)}); "
                             "put {name} in each one's filename with --set NODE.filename=... instead")
        wf.nodes[saves[0]].inputs["filename"] = args.out
    source = source_node(wf, args.input_node)
    # where outputs may go: the output template's folder above any {name} (an input list's 'set' that
    # writes elsewhere, `Save.filename=/etc/x`, is refused without --allow-outside)
    root = Path(os.path.abspath(default_manifest(wf.nodes[saves[0]].inputs["filename"]).parent))
    entries = read_inputs(args.inputs)
    shots, planned = [], []
    for entry in entries:
        path = str(comfy.input_path(entry["input"]).absolute())
        name = entry.get("name") or input_name(path)
        one = per_input(wf, source, path, name)
        where = entry.get("where", entry["input"])
        if "prompt" in entry:
            _set_all(one, [PROMPT], "text", entry["prompt"], where)
        if "seed" in entry:
            _set_all(one, list(SAMPLERS), "seed", entry["seed"], where)
        if entry.get("set"):
            apply_overrides(one, [str(s) for s in entry["set"]], classes)
        for n in save_nodes(one):
            node = one.nodes[n].inputs
            node["filename"] = str(output_of(one, n).absolute())
            node["overwrite"] = True  # replaced only once the new render is complete (atomic outputs)
        outs = [str(p) for p in outputs(one)]
        nul = next((o for o in outs if "\x00" in o), None)  # from a 'set' or the workflow's own filename
        if nul:
            raise AlayaError(f"{where}: its output {nul!r} holds a NUL character, which no file name may hold")
        outside = [o for o in outs if not args.allow_outside and not _inside(o, root)]
        if outside:
            raise AlayaError(f"{where}: its output {outside[0]} is outside {root}, where --out puts this batch's "
                             "outputs; pass --allow-outside to let the list choose")
        planned.append((entry["input"], outs))
        invalid, parts, shot_settings = None, [], settings
        try:
            StreamRunner(one, classes)  # validates, and checks the stream roles
            if args.split:
                overlap = min(8, args.split // 2) if args.overlap is None else args.overlap
                frames = shot_parts.shot_frames(one, source, classes)
                if frames > args.split:
                    if len(save_nodes(one)) != 1:
                        raise AlayaError(f"--split needs exactly one Save node, found {len(save_nodes(one))}")
                    parts = shot_parts.part_jobs(one, name, source, save_nodes(one)[0], frames, args.split, args.preroll,
                                                 overlap)
                    for part in parts:
                        StreamRunner(parse_workflow(part["workflow"], classes), classes)
                    shot_settings = {**settings, "split": args.split, "preroll": args.preroll, "overlap": overlap}
        except AlayaError as err:
            invalid = str(err)
        job = json_ready({"name": name, "workflow": one.to_api()})
        shot = Shot(name=name, input=path, outputs=outs, job=job, invalid=invalid, parts=json_ready(parts))
        shot.local = (one, shot_settings)  # its workflow (to join its parts) and what its bits depend on
        shots.append(shot)
    refuse_collisions(planned)
    for shot in shots:  # reads every input and model file (content hashes): after the cheap checks
        one, shot_settings = shot.local
        shot.local = one
        if shot.invalid is None:
            shot.fingerprint = fingerprint(json_ready(fingerprint_parts(one, source, Path(shot.input), digests.of,
                                                                        shot_settings)))
    return shots


def _inside(path: str, root: Path) -> bool:
    """Whether path lies in root, links resolved (a '..' or a link out of the folder is outside)."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))


def _set_all(wf, class_types: list[str], name: str, value, where: str) -> None:
    from ....model_zoo.errors import AlayaError

    hits = [n for n, s in wf.nodes.items() if s.class_type in class_types]
    if not hits:
        raise AlayaError(f"{where}: the workflow has no {' or '.join(class_types)} node to take the shot's {name!r}")
    for n in hits:
        wf.nodes[n].inputs[name] = value


def _join_parts(shot) -> int:
    """A split shot's parts, done: join them into its output (shot_parts.assemble)."""
    from .. import shot_parts
    from ..shots import output_of, save_nodes

    save = save_nodes(shot.local)[0]
    inputs = shot.local.nodes[save].inputs
    folder = shot_parts.parts_folder(shot.local, save)
    parts = [folder / f"part-{i:04d}" for i in range(len(shot.parts))]
    return shot_parts.assemble(output_of(shot.local, save), inputs.get("format", "mp4"), inputs.get("fps", 16.0), parts,
                               [job.get("overlap", 0) for job in shot.parts])


def _remove_parts(shot) -> None:
    from .. import shot_parts
    from ..shots import save_nodes

    shot_parts.remove_parts(shot_parts.parts_folder(shot.local, save_nodes(shot.local)[0]))


# ---------------------------------------------------------------------------------------------
# Progress: one overall bar (shots, frames/s across workers, ETA) and a status line per worker.


class Display:
    def __init__(self, total: int, workers: int, quiet: bool):
        from tqdm import tqdm

        self.quiet = quiet
        self.live = not quiet and sys.stderr.isatty()
        self.bar = tqdm(total=total, desc="batch", unit="shot", file=sys.stderr, disable=not self.live)
        self.lines = [tqdm(total=0, position=i + 1, bar_format="{desc}", file=sys.stderr, disable=not self.live)
                      for i in range(workers)]

    def __call__(self, p) -> None:
        if p.last is not None and not self.quiet:
            r = p.last
            what = (f"{r['frames']} frames in {r['seconds']['render']:.1f} s" if r["status"] == "done"
                    else f"FAILED after {r['attempts']} attempt(s): {r['error']}")
            line = f"{r['name']}: {what} ({r.get('worker')}) -> {', '.join(r['outputs'])}"
            if self.live:
                self.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr)
        if not self.live:
            return
        self.bar.update(p.done - self.bar.n)
        self.bar.set_postfix_str(f"{p.fps:.1f} frames/s, {p.failed} failed", refresh=False)
        self.bar.refresh()
        for line, w in zip(self.lines, p.workers):
            doing = f"{w['shot']} (attempt {w.get('attempt', 1)}): {w.get('frames', 0)} frames" if w.get("shot") else w.get("state", "idle")
            line.set_description_str(f"  {w.get('worker', '?')} {w.get('host', '')}:{w.get('pid', '')}  {doing}")

    def close(self) -> None:
        for line in self.lines:
            line.close()
        self.bar.close()


# ---------------------------------------------------------------------------------------------


def run(args) -> int:
    import torch

    from ....model_zoo.errors import AlayaError
    from ...render.batch import Digests, ManifestLock, default_manifest
    from ...render import ray_pool

    use_ray = args.engine == "ray" or (args.engine == "auto" and ray_pool.available())
    if use_ray and not ray_pool.available():
        raise AlayaError("--engine ray: Ray is not installed; pip install 'alaya-flash[ray]' (or use --engine local)")
    if args.address and not use_ray:
        raise AlayaError("--address needs Ray (pip install 'alaya-flash[ray]') and --engine auto or ray")
    if args.split and args.overlap is not None and args.overlap >= args.split:
        raise AlayaError(f"--overlap {args.overlap} must be below --split {args.split} (a part's last frames "
                         f"crossfade into the next part)")
    template = args.out
    manifest_path = args.manifest
    gpus = args.gpus_per_worker
    if use_ray and gpus is None:
        if args.address:  # what the cluster has decides; a rerun with nothing to render still asks it
            ray_pool.connect(args.address, debug=args.debug)
            gpus = 1.0 if ray_pool.cluster_gpus() > 0 else 0.0
        else:
            gpus = 1.0 if torch.cuda.is_available() else 0.0
    gpu = gpus > 0 if use_ray else torch.cuda.is_available()
    # What besides the workflow and the files decides the bits (docs/runner.md, "Determinism").
    from ....model_zoo import runtime

    backend = runtime.choose(args.backend, "cuda" if gpu else "cpu")  # its kernels decide the frames' last bits too
    settings = {"version": FINGERPRINT_VERSION, "threads": args.threads, "torch": torch.__version__,
                "accelerator": "cuda" if gpu else "cpu", "backend": backend,
                **({"openvino": runtime.openvino_version()} if backend == "openvino" else {})}
    if manifest_path is None:
        if template is None:
            from .run import load
            from ..shots import save_nodes

            wf, _ = load(args.workflow, args.sets, check=False)
            template = next((wf.nodes[n].inputs["filename"] for n in save_nodes(wf)), "out/x")
        manifest_path = default_manifest(template)
    digests = Digests(manifest_path.with_name(f".{manifest_path.name}.digests.json"))
    shots = plan(args, settings, digests)  # checks everything; writes nothing
    with ManifestLock(manifest_path):  # one batch at a time per manifest, from its first write
        return _render(args, manifest_path, shots, digests, use_ray, gpu, gpus)


def _render(args, manifest_path: Path, shots: list, digests, use_ray: bool, gpu: bool, gpus: float | None) -> int:
    from ....model_zoo.errors import AlayaError
    from ...render.batch import LocalPool, Manifest, run_shots, summarize
    from ...render import ray_pool
    from ..shots import ShotWorker

    manifest = Manifest(manifest_path)
    invalid = [s for s in shots if s.invalid]
    if len(invalid) == len(shots):
        raise AlayaError(invalid[0].invalid)
    for shot in invalid:
        manifest.put(shot, status="failed", error=shot.invalid, frames=0, attempts=0, worker=None, host=None, seconds={})
    todo = [s for s in shots if not s.invalid and (args.force or not manifest.complete(s))]
    digests.save()
    skipped = len(shots) - len(todo) - len(invalid)
    if not args.quiet and skipped:
        print(f"{skipped} of {len(shots)} shot(s) complete already (manifest {manifest.path}); {len(todo)} to render",
              file=sys.stderr)
    start = time.perf_counter()
    workers = 0
    if todo:
        if not use_ray and args.workers not in (None, 1):
            raise AlayaError(f"--workers {args.workers}: without Ray shots render in this process, one at a time")
        # Ray's driver prints worker notices (a worker died, ...) on stdout, which is for data (--json): stderr
        with contextlib.redirect_stdout(sys.stderr):
            if use_ray:
                pool = ray_pool.RayPool(ShotWorker, {"threads": args.threads, "cpu_only": not gpu}, workers=args.workers,
                                        cpus=args.threads, gpus=gpus, address=args.address,
                                        most=sum(len(s.jobs()) for s in todo),  # a split shot's parts run side by side
                                        debug=args.debug)
            else:
                pool = LocalPool(ShotWorker(args.threads))
            workers = pool.size
            display = Display(len(todo), workers, args.quiet)
            try:
                run_shots(todo, pool, manifest, retries=args.retries, monitor=display, assemble=_join_parts)
            finally:
                display.close()
                pool.close()
                for shot in todo:
                    if shot.parts:
                        _remove_parts(shot)
    summary = summarize(shots, todo, manifest, time.perf_counter() - start, workers, skipped)
    if args.json:
        print(json.dumps(summary.to_json(), indent=1))
    if not args.quiet:
        print(f"{summary.rendered} rendered, {summary.skipped} skipped, {len(summary.failed)} failed; "
              f"{summary.frames} frames in {summary.seconds:.1f} s on {workers} worker(s) "
              f"({summary.shots_per_hour:.0f} shots/hour); manifest {manifest.path}", file=sys.stderr)
        for f in summary.failed:
            print(f"  failed: {f['name']} ({f['input']}): {f['error']}", file=sys.stderr)
    return 1 if summary.failed else 0

