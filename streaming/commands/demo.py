"""Render the bundled demo G-buffer stream to a preview video (the quickstart's main job).

Until the default model ships, the video is a labelled panel of the five passes (as the model
sees them) plus a simple Lambert shading. --source picks a bundled stream by name or reads any
G-buffer path (teacher clip folder, image sequence, npy windows).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .gbuffers import parse_size

HELP = "render the demo G-buffer stream to a preview video"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="output MP4 file")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--source", default="synthetic",
                        help="a bundled stream name (synthetic, world) or a G-buffer path")
    parser.add_argument("--frames", type=int, default=64, help="frames to render")
    parser.add_argument("--size", type=parse_size, default=(144, 256), metavar="WxH",
                        help="size of each pass tile, WIDTHxHEIGHT (even numbers); default 256x144")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bundled synthetic scene")


def run(args) -> int:
    from tqdm import tqdm

    from ...model_zoo.errors import AlayaError
    from ..demo import DEMO_SOURCES, render_demo
    from ..readers import open_gbuffers

    if args.frames < 1:
        raise AlayaError(f"--frames must be >= 1, got {args.frames}")
    h, w = args.size
    if h % 2 or w % 2:
        raise AlayaError(f"--size {w}x{h}: tiles need even width and height for H.264")
    if args.source in DEMO_SOURCES:
        stream = DEMO_SOURCES[args.source](width=w, height=h, num_frames=args.frames, seed=args.seed)
    elif Path(args.source).exists():
        stream = open_gbuffers(args.source, stop=args.frames, size=(h, w))
    else:
        raise AlayaError(f"--source {args.source!r} is neither a bundled stream ({', '.join(DEMO_SOURCES)}) "
                         f"nor an existing path")
    with tqdm(total=stream.info.num_frames, desc="demo", unit="frame", file=sys.stderr,
              disable=args.quiet or not sys.stderr.isatty()) as bar:
        n = render_demo(stream, args.out, overwrite=args.overwrite, progress=bar.update)
    print(f"wrote {n} frames to {args.out}", file=sys.stderr)
    return 0
