"""Light a G-buffer sequence with the shading prior alone: no network, a lighting preview.

  alaya-flash shade samples/courtyard --prompt "a low golden sun at sunset, with the sun on the left" --out out/prior.mp4
  alaya-flash shade samples/courtyard --light "az=90,el=30" --out out/prior.mp4
  alaya-flash shade samples/courtyard --light "0: sunset_dramatic,az=90
16: sunset_dramatic,az=-90" --out out/sun-moves.mp4        # the sun swings round over 16 frames

The light is --light when given: one light (JSON, or key=value pairs: az (0 ahead, 90 left, 180
behind, -90 right), el (degrees above the horizon), sun, zenith, horizon, ground, fog (r:g:b or one
value), ambient, fog_density, exposure; a preset name first starts from that preset), or lines
'FRAME: light' that the light moves through. Otherwise the light head reads it from --prompt (or
each entry of a prompt schedule): the nearest lighting preset and the sun's side. Directions are
relative to the camera; "up" comes from the upward-facing normals. Frames are what the model's
networks will read as their light (model_zoo/shading_prior.py), and what eval scores as the
prior-only baseline.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ..args import out_path, parse_size

HELP = "light G-buffers with the shading prior alone (a light from --light or the prompt): a lighting preview"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gbuffers", type=Path, help="G-buffer folder or .npy file (any layout Load G-Buffers reads)")
    parser.add_argument("--prompt", default="", help="prompt (or 'FRAME: prompt' lines) the light head reads a light from")
    args_.add_light_argument(parser)
    parser.add_argument("--out", type=out_path, required=True, help="output file (mp4) or folder (png, exr, npy)")
    parser.add_argument("--format", choices=("mp4", "png", "exr", "npy"), default="mp4", help="output format")
    parser.add_argument("--size", type=parse_size, metavar="N|WxH", help="resize the input")
    parser.add_argument("--frames", type=args_.FRAMES, default=0, help="frames to shade (0: all)")
    parser.add_argument("--fps", type=args_.FPS, default=16.0, help="output frame rate (mp4)")
    parser.add_argument("--fov", type=args_.bounded(float, 1.0, 179.0), default=60.0,
                        help="vertical field of view of the camera (degrees) when the clip does not say")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--depth-range", default="0.5", metavar="NEAR[:FAR]|auto",
                        help="depth shown brightest in the 8-bit depth (scene units), or auto from the data")
    args_.add_cpu_arguments(parser)


def light_schedule(light: str | None, prompt: str):
    """The LightSchedule of --light, else of the prompt through the shipped light head."""
    from ....model_zoo.errors import AlayaError
    from ...render.lighting import LightSchedule, user_lights

    if light is not None:
        return user_lights(light, "--light")
    if not prompt.strip():
        raise AlayaError("shade: give --light, or a --prompt for the light head to read a light from")
    from ....model_zoo import light_head
    from ....model_zoo.text_encoder import TextEncoder

    return LightSchedule.from_prompts(prompt, light_head.load(), TextEncoder.load())


def run(args) -> int:
    from ....model_zoo.errors import AlayaError
    from ....model_zoo.shading_prior import PriorConfig, ShadingPrior
    from ...render.driver import StageGraph, Step, drive
    from ...render.lighting import Shade
    from ...values import gbuffer_chunks
    from ...files.conventions import parse_depth_range
    from ...files.readers import open_gbuffers
    from ...files.sinks import FrameWriter

    if args.out.exists() and not args.overwrite:
        raise AlayaError(f"{args.out}: already exists; pass --overwrite to replace it")
    lights = light_schedule(args.light, args.prompt)
    near, far = parse_depth_range(args.depth_range)
    stream = open_gbuffers(args.gbuffers, stop=args.frames or None, size=args.size, depth_near=near, depth_far=far)
    shade = Shade(lights, ShadingPrior(PriorConfig(fov_y=args.fov)))
    writer = FrameWriter(args.out, args.format, fps=args.fps, overwrite=args.overwrite)
    steps = [Step("shade", shade, {"gbuffers": ("read", 0)}, single=True), Step("write", writer, {"images": ("shade", 0)}, outputs=0)]
    stats = drive(StageGraph(["read"], steps), {"read": ((g,) for g in gbuffer_chunks(stream, 16))})
    if not args.quiet:
        described = ", ".join(f"az {x.sun_azimuth:.0f} el {x.sun_elevation:.0f}" for x in lights.lights()[:4])
        print(f"wrote {stats.frames} frames to {writer.path} (the shading prior alone; light: {described})", file=sys.stderr)
    return 0
