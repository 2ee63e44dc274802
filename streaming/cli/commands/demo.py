"""Render the bundled demo G-buffer stream with the default model to a video (the quickstart's main job).

The video is a labelled panel: the five passes (as the model sees them) plus the frame the Flash
model renders from them, streamed chunk by chunk (G-buffer encoder, 4-step autoregressive DiT with
its rolling KV cache, tiny decoder). The model is the embedded default (model_zoo/default/,
docs/model-card.md) unless --model names another folder; without any model, or with --preview,
the sixth tile is a plain Lambert shading instead. --source picks a bundled stream by name
(world: the physics world the default was trained on) or reads any G-buffer path. The world knows
its sun: with the default prompt and a model that reads the light, it lights the stream itself (as an
engine sends its light), otherwise the prompt's light (the light head's reading) is used.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ..args import out_path, parse_size

HELP = "render the demo G-buffer stream to a preview video"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=out_path, required=True, help="output MP4 file")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--source", default="world",
                        help="a bundled stream name (world, synthetic) or a G-buffer path")
    parser.add_argument("--frames", type=args_.FRAMES, default=64, help="frames to render")
    parser.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                        help="size of each tile, WIDTHxHEIGHT (multiples of 16 with a model); "
                             "default: the model's trained size, else 256x144")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="seed of the bundled scene and of the sampler")
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + "; default: the embedded default model")
    parser.add_argument("--prompt", help="prompt for the model (default: a sunset lighting prompt)")
    parser.add_argument("--preview", action="store_true", help="no model: the passes plus a Lambert shading")
    args_.add_cpu_arguments(parser)


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from ....model_zoo.errors import AlayaError
    from ..demo import DEMO_SOURCES, render_demo
    from ...files.readers import open_gbuffers

    from ....model_zoo import bundle, folders
    from ..demo import DEMO_PROMPT, WorldDemo, render_model_demo

    if args.frames < 1:
        raise AlayaError(f"--frames must be >= 1, got {args.frames}")
    model = None
    if not args.preview and (args.model is not None or bundle.has_default_flash()):
        model = folders.load_flash(args.model, dtype=torch.float32)
    h, w = args.size or ((model.trained_size or (144, 256)) if model is not None else (144, 256))
    if model is not None and (h % 16 or w % 16):
        raise AlayaError(f"--size {w}x{h}: the model renders sizes that are multiples of 16")
    if h % 2 or w % 2:
        raise AlayaError(f"--size {w}x{h}: tiles need even width and height for H.264")
    light = None
    if args.source == "world" and model is not None and not args.prompt and getattr(model.refiner, "reads_light", False):
        world = WorldDemo(w, h, args.frames, args.seed)  # lit by its own sun, as an engine lights a stream
        stream, light = world.stream, world.light
    elif args.source in DEMO_SOURCES:
        stream = DEMO_SOURCES[args.source](width=w, height=h, num_frames=args.frames, seed=args.seed)
    elif Path(args.source).exists():
        stream = open_gbuffers(args.source, stop=args.frames, size=(h, w))
    else:
        raise AlayaError(f"--source {args.source!r} is neither a bundled stream ({', '.join(DEMO_SOURCES)}) "
                         f"nor an existing path")
    with tqdm(total=stream.info.num_frames, desc="demo", unit="frame", file=sys.stderr,
              disable=args.quiet or not sys.stderr.isatty()) as bar:
        if model is not None:
            n = render_model_demo(stream, args.out, model, args.prompt or DEMO_PROMPT, seed=args.seed,
                                  overwrite=args.overwrite, progress=bar.update, light=light)
        else:
            n = render_demo(stream, args.out, overwrite=args.overwrite, progress=bar.update)
    print(f"wrote {n} frames to {args.out}", file=sys.stderr)
    return 0
