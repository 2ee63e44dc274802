"""Inspect and convert G-buffer streams.

  alaya-flash gbuffers info PATH
  alaya-flash gbuffers convert SRC DST --to mp4|png|exr|npy [--overwrite]

PATH/SRC is a teacher clip folder ({mod}.mp4 or {clip}_{mod}.mp4), an image-sequence folder
(PNG/EXR, one folder per modality or modality in the file names), or npy windows (a folder of
uint8 (T, 5, H, W, 3) .npy files, or one such file). See docs/gbuffers.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ..args import out_path, parse_size

HELP = "inspect (info) or convert G-buffer streams between layouts"

FORMATS = ("mp4", "png", "exr", "npy")  # = sinks.SINK_FORMATS; kept here so --help stays import-light


def add_reader_arguments(p: argparse.ArgumentParser) -> None:
    """Options every G-buffer reading command shares (see open_from_args)."""
    p.add_argument("--layout", choices=("teacher-mp4", "image-sequence", "npy-windows"), default=None,
                   help="source layout (default: auto-detect)")
    p.add_argument("--start", type=args_.bounded(int, 0, args_.MAX_FRAMES), default=0, help="first source frame to read")
    p.add_argument("--stop", type=args_.bounded(int, 0, args_.MAX_FRAMES), default=None, help="stop before this source frame (default: the end)")
    p.add_argument("--stride", type=args_.bounded(int, 1, 4096), default=1, help="read every N-th frame")
    p.add_argument("--size", type=parse_size, default=None, metavar="WxH",
                   help="resize to WIDTHxHEIGHT (N: N x N), e.g. 832x448 (default: keep the source size)")
    p.add_argument("--resize", choices=("stretch", "crop"), default="stretch",
                   help="stretch: the teacher's LANCZOS, no crop; crop: keep aspect, centre crop")
    p.add_argument("--fps", type=args_.FPS, default=None, help="override the source frame rate (npy and images have none; 16)")
    p.add_argument("--nan-policy", choices=("error", "fix"), default="error",
                   help="NaN/Inf in float EXR passes: error (name the file, count, first pixel) or fix "
                        "(replace with background and warn)")
    p.add_argument("--conventions", choices=("auto", "alaya", "blender", "unreal", "unity"), default="auto",
                   help="which engine wrote float EXR passes (normal space and axes, depth units, pass names); "
                        "auto detects it from the pass names and logs its choice (docs/gbuffers.md, Engines)")
    p.add_argument("--depth-range", default=None, metavar="NEAR[:FAR]|auto",
                   help="depth shown at full brightness in the 8-bit encoding (default 0.5 scene units), or auto "
                        "(from the data); :FAR makes anything farther background")
    p.add_argument("--world-normals", choices=("error", "keep"), default="error",
                   help="world-space normals without camera.json: error (default) or keep them unconverted (warns)")


def open_from_args(path: Path, args):
    from ...files.conventions import parse_depth_range
    from ...files.readers import DEFAULT_DEPTH_NEAR, open_gbuffers

    near, far = parse_depth_range(args.depth_range) if args.depth_range else (DEFAULT_DEPTH_NEAR, None)
    return open_gbuffers(path, args.layout, start=args.start, stop=args.stop, stride=args.stride, size=args.size,
                         resize=args.resize, nan_policy=args.nan_policy, fps=args.fps, depth_near=near,
                         depth_far=far, conventions=args.conventions, world_normals=args.world_normals)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = sub.add_parser("info", help="print layout, frame count, size, fps and value ranges per pass",
                          formatter_class=parser.formatter_class)
    info.add_argument("path", type=Path, help="G-buffer folder or .npy window")
    info.add_argument("--scan", type=int, default=None, metavar="N",
                      help="frames to scan for value ranges (default: all; 0 skips the scan)")
    add_reader_arguments(info)
    conv = sub.add_parser("convert", help="convert a G-buffer stream to another layout",
                          formatter_class=parser.formatter_class)
    conv.add_argument("src", type=Path, help="source G-buffer folder or .npy window")
    conv.add_argument("dst", type=out_path, help="destination folder (created atomically)")
    conv.add_argument("--to", choices=FORMATS, required=True,
                      help="mp4: teacher layout {mod}.mp4 (lossless H.264); png: {mod}/000000.png; "
                           "exr: multi-layer float EXR per frame; npy: uint8 (T,5,H,W,3) windows")
    conv.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    conv.add_argument("--png-bits", type=int, choices=(8, 16), default=8, help="PNG bit depth")
    conv.add_argument("--window", type=args_.bounded(int, 1, 4096), default=16, help="frames per npy window")
    add_reader_arguments(conv)


def run(args) -> int:
    return _info(args) if args.action == "info" else _convert(args)


def _progress(args, total, desc):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="frame", file=sys.stderr, disable=args.quiet or not sys.stderr.isatty())


def _info(args) -> int:
    import numpy as np

    from ...gbuffer import MODALITIES

    stream = open_from_args(args.path, args)
    info = stream.info
    print(f"path:    {args.path}")
    print(f"layout:  {stream.source.description}")
    print(f"frames:  {info.num_frames if info.num_frames is not None else 'unknown'}")
    print(f"size:    {info.width}x{info.height} (width x height)")
    print(f"fps:     {info.fps:g}")
    if args.scan == 0:
        return 0
    limit = info.num_frames if args.scan is None else min(args.scan, info.num_frames or args.scan)
    teacher = stream.source.kind == "teacher"
    lo, hi, background, seen = {}, {}, 0, 0
    extras = set()
    with _progress(args, limit, "scanning") as bar:
        frames = stream.teacher_frames(extras=True) if teacher else ((f, f.extras) for f in stream)
        for item, ext in frames:
            extras |= set(ext)
            passes = dict(zip(MODALITIES, item)) if teacher else item.passes()
            for m, arr in passes.items():
                if m == "depth" and not teacher:
                    finite = arr[np.isfinite(arr)]
                    background += arr.size - finite.size
                    arr = finite if finite.size else np.zeros(1, np.float32)
                lo[m] = min(lo.get(m, np.inf), float(arr.min()))
                hi[m] = max(hi.get(m, -np.inf), float(arr.max()))
            seen += 1
            bar.update(1)
            if limit is not None and seen >= limit:
                break
    form = "teacher form, uint8" if teacher else "canonical float"
    print(f"ranges over {seen} frame{'s' * (seen != 1)} ({form}):")
    for m in MODALITIES:
        fmt = "{:.0f}" if teacher else "{:.4g}"
        line = f"  {m:<10} min {fmt.format(lo[m])}  max {fmt.format(hi[m])}"
        if m == "depth" and not teacher:
            share = background / max(1, seen * info.width * info.height)
            line += f"  (finite; background +inf: {share:.1%} of pixels)"
        print(line)
    if extras:
        print(f"extras:  {', '.join(sorted(extras))}")
    return 0


def _convert(args) -> int:
    from ...files.sinks import open_sink, write_stream

    stream = open_from_args(args.src, args)  # validates the source before anything is created
    sink = open_sink(args.dst, args.to, fps=stream.info.fps, overwrite=args.overwrite, png_bits=args.png_bits,
                     window=args.window, depth_near=stream.info.depth_near)
    with _progress(args, stream.info.num_frames, f"-> {args.to}") as bar:
        n = write_stream(stream, sink, progress=bar.update)
    print(f"wrote {n} frames to {args.dst} ({args.to})", file=sys.stderr)
    return 0
