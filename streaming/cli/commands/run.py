"""Run a saved workflow (ComfyUI API or UI format) headless, chunk by chunk.

  alaya-flash run workflows/api/render-gbuffer-sequence.json --set "Load G-Buffers.path=clip/" \\
      --set "Save.filename=out/render.mp4"
  alaya-flash run workflows/render-gbuffer-sequence.json --inputs 'clips/*' --set Save.filename=out/{name}.mp4
  alaya-flash run my-workflow.json --validate-only

Sources yield chunks, stateful nodes keep their state between chunks, sinks write as frames come,
so memory stays flat however long the input. --set NODE.INPUT=VALUE overrides a widget (NODE is a
node id, a unique title or a unique node type). --inputs GLOB renders every match in one process
(models loaded once): each match replaces the G-buffer source's path, '{name}' in a Save filename
becomes the match's name (without one, '-{name}' is added), and inputs whose outputs all exist
already are skipped (outputs appear only when complete, so an existing one is finished); two
inputs that would write the same output are refused before anything runs. `alaya-flash batch`
does the same on a pool of workers, with a manifest, fingerprints and retries.
--light LIGHT renders under that light (one light, or 'FRAME: light' keyframes): a Light node carrying
it feeds every light input of the graph (Refine with G-Buffers, Render G-Buffer Stream, Shade G-Buffers),
replacing what fed them; a model whose refiner does not read the light refuses it.
An interruption (Ctrl-C) removes the output being written; nothing partial is left.
"""
from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

from .. import args as args_

HELP = "run a saved workflow headless, chunk by chunk (API or UI format)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow", type=Path, help="workflow JSON (API format, UI format, or a /prompt body)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="NODE.INPUT=VALUE",
                        help="override a widget value (repeatable)")
    args_.add_light_argument(parser, ": a Light node carrying it feeds every node with a light input (Refine with "
                             "G-Buffers, Render G-Buffer Stream, Shade G-Buffers), replacing what fed them")
    parser.add_argument("--inputs", metavar="GLOB", help="render every G-buffer folder/file matching GLOB")
    parser.add_argument("--input-node", metavar="NODE", help="with --inputs: the source node whose 'path' is replaced "
                        "(default: the only node with a 'path' input)")
    parser.add_argument("--force", action="store_true", help="with --inputs: render inputs whose outputs already exist")
    parser.add_argument("--validate-only", action="store_true", help="check the workflow and exit")
    args_.add_cpu_arguments(parser)


def node_classes() -> dict:
    from ..shots import node_classes as classes

    return classes()


def load(path: Path, sets: list[str], check: bool = True, light: str | None = None):
    """Read, override, give the light (--light) and (unless check=False) validate a workflow; returns
    (workflow, classes)."""
    from ...render.workflow import apply_overrides, feed_light, load_workflow, validate

    classes = node_classes()
    wf = load_workflow(path, classes)
    apply_overrides(wf, sets, classes)
    if light is not None:
        feed_light(wf, light, classes)
    if check:
        validate(wf, classes)
    return wf, classes


def execute(wf, classes, quiet: bool, label: str = "", static_cache: dict | None = None, light: bool = False):
    """Run one workflow with a tqdm bar (frames, FPS) on stderr; returns RunStats. light: the workflow's
    light came from --light (a model that does not read it is refused naming the flag)."""
    from tqdm import tqdm

    from ....model_zoo.errors import AlayaError
    from ...render.cpu import configured_lanes
    from ...render.lighting import LightNotRead
    from ...render.runner import StreamRunner

    bar = tqdm(desc=label or "run", unit="frame", file=sys.stderr, disable=quiet or not sys.stderr.isatty())

    def progress(stats):
        bar.update(stats.frames - bar.n)
        bar.set_postfix(fps=f"{stats.fps:.2f}")

    try:
        stats = StreamRunner(wf, classes, progress=progress, static_cache=static_cache, lanes=configured_lanes()).run()
    except LightNotRead as err:
        if not light:
            raise
        raise AlayaError(f"--light: {err.what}") from None
    finally:
        bar.close()
    return stats


def run(args) -> int:
    from ...render.runner import StreamRunner
    from ..shots import input_name, outputs, per_input, refuse_collisions, save_nodes, source_node

    wf, classes = load(args.workflow, args.sets, check=not args.inputs, light=args.light)  # --inputs: checked per input
    if args.validate_only:
        for one in ([per_input(wf, source_node(wf, args.input_node), p, "x") for p in sorted(glob.glob(args.inputs))[:1]]
                    if args.inputs else [wf]):
            StreamRunner(one, classes)  # also checks the stream roles (a run-once node fed a stream, no source)
        if not args.quiet:
            print(f"{args.workflow}: ok ({len(wf.nodes)} nodes, {wf.format} format)", file=sys.stderr)
        return 0
    if not args.inputs:
        stats = execute(wf, classes, args.quiet, light=args.light is not None)
        _report(stats, outputs(wf), args.quiet)
        return 0
    source = source_node(wf, args.input_node)
    matches = sorted(glob.glob(args.inputs))
    if not matches:
        from ....model_zoo.errors import AlayaError

        raise AlayaError(f"--inputs {args.inputs!r}: no files or folders match")
    planned = [(path, per_input(wf, source, path, input_name(path))) for path in matches]
    refuse_collisions([(path, outputs(one)) for path, one in planned])
    cache: dict = {}  # run-once outputs (models, prompts) shared by every input
    done = skipped = 0
    for path, one in planned:
        name = input_name(path)
        outs = outputs(one)
        if outs and all(p.exists() for p in outs) and not args.force:
            skipped += 1
            if not args.quiet:
                print(f"{name}: skipped, {', '.join(map(str, outs))} already exist(s)", file=sys.stderr)
            continue
        for n in save_nodes(one):
            one.nodes[n].inputs["overwrite"] = True  # a stale output of an unfinished set is replaced
        stats = execute(one, classes, args.quiet, label=name, static_cache=cache, light=args.light is not None)
        _report(stats, outs, args.quiet, name)
        done += 1
    if not args.quiet:
        print(f"{done} rendered, {skipped} skipped", file=sys.stderr)
    return 0


def _report(stats, outputs, quiet: bool, name: str = "") -> None:
    if quiet:
        return
    where = ", ".join(str(p) for p in outputs) or "(no Save node)"
    head = f"{name}: " if name else ""
    print(f"{head}{stats.frames} frames in {stats.seconds:.1f} s ({stats.fps:.2f} FPS) -> {where}", file=sys.stderr)
