"""Render a G-buffer sequence to video with the standard workflow (workflows/render-gbuffer-sequence).

  alaya-flash world --out clips/s3 --frames 64 --size 256 --seed 3      # a G-buffer clip to render
  alaya-flash render clips/s3 --prompt "a sunny street" --out out/render.mp4
  alaya-flash render clips/s3 --prompt "0: dawn
48: dusk" --out frames/ --format png --model model_zoo/default

The prompt may be a schedule keyed by pixel frame ('FRAME: prompt' per line). Without --model the
embedded default model (model_zoo/default) renders; where none is installed, a tiny model with
RANDOM weights renders instead (the output says so).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ..args import parse_size

HELP = "render G-buffers + a prompt to video (the standard render workflow)"
WORKFLOW = Path(__file__).resolve().parents[3] / "workflows" / "render-gbuffer-sequence.api.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gbuffers", type=Path, help="G-buffer folder or .npy file (any layout Load G-Buffers reads)")
    parser.add_argument("--prompt", required=True, help="prompt, or lines 'FRAME: prompt' (a schedule)")
    parser.add_argument("--out", type=Path, required=True, help="output file (mp4) or folder (png, exr, npy)")
    parser.add_argument("--format", choices=("mp4", "png", "exr", "npy"), default="mp4", help="output format")
    parser.add_argument("--model", type=Path, help="Flash model folder (default: the embedded default model)")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="noise seed (same seed, same frames)")
    parser.add_argument("--steps", type=args_.STEPS, help="denoising passes per chunk (default: the model's trained value)")
    parser.add_argument("--size", type=parse_size, metavar="N|WxH", help="resize the input (multiples of 8)")
    parser.add_argument("--frames", type=args_.FRAMES, default=0, help="frames to render (0: all)")
    parser.add_argument("--fps", type=args_.FPS, default=16.0, help="output frame rate (mp4)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def model_choice(model: Path | None) -> tuple[str, str | None]:
    """(value for Load Flash Model's 'model', a warning or None)."""
    from ....model_zoo.bundle import has_default_flash

    if model is not None:
        return str(model.resolve()), None
    if has_default_flash():
        return "default", None
    return "random:tiny", "no default Flash model ships yet: rendering with a tiny model with RANDOM weights (pass --model DIR)"


def run(args) -> int:
    from ....model_zoo.errors import AlayaError
    from .run import execute, load

    model, warning = model_choice(args.model)
    if warning:
        print(f"alaya-flash: warning: {warning}", file=sys.stderr)
    if args.out.exists() and not args.overwrite:
        raise AlayaError(f"{args.out}: already exists; pass --overwrite to replace it")
    h, w = args.size or (0, 0)
    sets = [f"1.path={args.gbuffers.resolve()}", f"1.frames={args.frames}", f"1.width={w}", f"1.height={h}",
            f"2.model={model}", f"3.text={args.prompt}", f"5.seed={args.seed}", f"5.steps={args.steps or -1}",
            f"Save.filename={args.out.resolve()}", f"Save.format={args.format}", f"Save.fps={args.fps}",
            f"Save.overwrite={args.overwrite}"]
    wf, classes = load(WORKFLOW, sets)
    stats = execute(wf, classes, args.quiet, label="render")
    if not args.quiet:
        print(f"wrote {stats.frames} frames to {args.out} ({stats.fps:.2f} FPS overall)", file=sys.stderr)
    return 0
