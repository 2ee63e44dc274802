"""Render physics-world clips: G-buffers, ground truth under lighting presets, cameras.

  alaya-flash world --out clips/seed3 --frames 64 --size 256 --seed 3 --presets all

OUT becomes one clip folder (written atomically; an existing OUT needs --overwrite):
  albedo.mp4 depth.mp4 metallic.mp4 normal.mp4 roughness.mp4   the teacher layout (lossless)
  rgb.mp4                   ground truth under the first preset (lossless)
  shadow.mp4                with --shadows: the shadow pass, the first preset's sun visibility (lossless)
  windows/window-0000.npy   uint8 (T, 5, H, W, 3) G-buffer windows (+ rgb-0000.npy)
  presets/{preset}.mp4      ground truth per preset (H.264 yuv420p, for viewing)
  exr/000000.exr            with --exr: canonical float passes (exact; shade() them to get any preset),
                            with --shadows a shadow layer
  extras/object_id-0000.npy uint16 (T, H, W) object ids per window (+ sun_visibility with --shadows)
  clip.json                 seed, presets and prompts, camera intrinsics and per-frame extrinsics
  scene.xml                 the MuJoCo scene (MJCF) the clip was simulated from
`alaya-flash gbuffers info OUT` (or open_gbuffers(OUT)) reads the clip back.

World v2 (docs/world.md): --renderer pathtrace renders a street, courtyard or interior
(--scene) with exact G-buffers and ground truth path traced by Mitsuba 3 (pip install
'alaya-flash[pathtrace]'); scene.json replaces scene.xml, cast shadows are always on (so is shadow.mp4), and
sky.mp4 is the sky pass (the share of the sky each pixel's surface sees; extras/sky_visibility-0000.npy float16).
  alaya-flash world --renderer pathtrace --scene street --camera drive --sun left --out clips/street3
"""
from __future__ import annotations

import argparse
import sys

from .. import args as args_
from ..args import out_path, parse_size

HELP = "render physics-world clips (G-buffers, ground truth per lighting preset, cameras)"

PATHS = ("orbit", "fly", "follow")  # camera paths that need no live input
TRACED_PATHS = ("walk", "drive", "orbit")  # world v2's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=out_path, required=True, help="output clip folder")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--frames", type=args_.FRAMES, default=64, help="frames to render")
    parser.add_argument("--size", type=parse_size, default=(256, 256), metavar="N|WxH",
                        help="frame size: N for NxN or WIDTHxHEIGHT (even numbers, 8..4096)")
    parser.add_argument("--fps", type=args_.FPS, default=16.0, help="frame rate (physics advances 1/fps per frame)")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="scene seed: same seed, same clip, bit for bit")
    parser.add_argument("--objects", type=args_.bounded(int, 0, 200), default=16, help="scene density: number of dynamic objects")
    parser.add_argument("--camera", choices=PATHS + TRACED_PATHS[:2], default="orbit",
                        help="camera path: orbit, fly, follow (physics world); walk, drive (streets), orbit (pathtrace)")
    parser.add_argument("--fov", type=args_.bounded(float, 1.0, 179.0), default=60.0, help="vertical field of view, degrees")
    parser.add_argument("--presets", default="bright_sunny",
                        help="comma-separated lighting presets for ground truth, 'all', or 'none'")
    parser.add_argument("--shadows", action="store_true",
                        help="cast sun shadows in the ground truth and write the shadow pass (shadow.mp4: "
                             "the first preset's sun visibility, what an engine's shadow map gives)")
    parser.add_argument("--window", type=args_.bounded(int, 1, 4096), default=16, help="frames per npy window")
    parser.add_argument("--exr", action="store_true", help="also write the canonical float passes as EXR")
    parser.add_argument("--renderer", choices=("auto", "gl", "torch", "pathtrace"), default="auto",
                        help="gl: moderngl/EGL rasterizer; torch: PyTorch ray caster; auto: gl, else torch; "
                             "pathtrace: world v2 (Mitsuba 3 path tracer, its own scenes)")
    v2 = parser.add_argument_group("world v2 (--renderer pathtrace)")
    v2.add_argument("--scene", choices=("street", "courtyard", "interior"), default="street", help="kind of scene")
    v2.add_argument("--spp", type=args_.bounded(int, 1, 4096), default=64, help="path-traced samples per pixel")
    v2.add_argument("--max-depth", type=args_.bounded(int, 3, 16), default=4,
                    help="path length (3: one indirect bounce)")
    v2.add_argument("--sun", choices=("auto", "ahead", "left", "behind", "right"), default="auto",
                    help="the sun's side relative to the camera's first-frame heading (auto: from the seed)")
    v2.add_argument("--sky-samples", type=args_.bounded(int, 0, 4096), default=None,
                    help="rays a pixel for the sky pass (sky.mp4: the share of the sky each surface sees; default "
                         "256); 0: none")


def parse_presets(text: str, names=None) -> tuple[str, ...]:
    from ...world.shading import PRESETS

    names = PRESETS if names is None else names
    text = text.strip().lower()
    if text == "none":
        return ()
    if text == "all":
        return tuple(names)
    return tuple(p.strip() for p in text.split(",") if p.strip())


def run(args) -> int:
    from ....model_zoo.errors import AlayaError
    from ...world import WorldConfig
    from ...world.clip import write_clip

    h, w = args.size
    if h % 2 or w % 2:
        raise AlayaError(f"--size {w}x{h}: width and height must be even (H.264 ground-truth videos)")
    if args.window < 1:
        raise AlayaError(f"--window {args.window}: must be at least 1")
    if args.renderer == "pathtrace":
        return _run_traced(args, w, h)
    if args.camera in TRACED_PATHS[:2]:
        raise AlayaError(f"--camera {args.camera}: a world v2 path; use it with --renderer pathtrace "
                         f"(physics world: {', '.join(PATHS)})")
    config = WorldConfig(seed=args.seed, width=w, height=h, fps=args.fps, num_frames=args.frames,
                         num_objects=args.objects, camera=args.camera, fov_y=args.fov,
                         presets=parse_presets(args.presets), shadows=args.shadows, backend=args.renderer)
    config.validate()
    return _write(args, "world", lambda bar: write_clip(config, args.out, overwrite=args.overwrite, window=args.window,
                                                        exr=args.exr, progress=bar.update))


def _run_traced(args, w: int, h: int) -> int:
    from ....model_zoo.errors import AlayaError
    from ...world.traced import TRACED_PRESETS, TracedConfig
    from ...world.traced.clip import write_traced_clip

    if args.camera not in TRACED_PATHS:
        raise AlayaError(f"--camera {args.camera}: a physics-world path; world v2 has {', '.join(TRACED_PATHS)}")
    config = TracedConfig(seed=args.seed, scene=args.scene, width=w, height=h, fps=args.fps, num_frames=args.frames,
                          camera=args.camera, fov_y=args.fov, presets=parse_presets(args.presets, TRACED_PRESETS),
                          sun=args.sun, spp=args.spp, max_depth=args.max_depth,
                          **({} if args.sky_samples is None else {"sky_samples": args.sky_samples}))
    config.validate()
    return _write(args, "world v2", lambda bar: write_traced_clip(config, args.out, overwrite=args.overwrite,
                                                                  window=args.window, exr=args.exr, progress=bar.update))


def _write(args, label: str, write) -> int:
    """Run write(bar) under a frame progress bar on stderr, then say where the clip went."""
    from tqdm import tqdm

    with tqdm(total=args.frames, desc=label, unit="frame", file=sys.stderr,
              disable=args.quiet or not sys.stderr.isatty()) as bar:
        out = write(bar)
    if not args.quiet:
        print(f"wrote {args.frames} frames to {out}", file=sys.stderr)
    return 0
