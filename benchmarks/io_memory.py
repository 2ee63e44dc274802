"""Resident memory while streaming a long G-buffer sequence through readers and writers.

    .venv/bin/python benchmarks/io_memory.py                 # 2,000 frames at 160x96
    .venv/bin/python benchmarks/io_memory.py --frames 500 --size 320x192

Three legs, each a reader feeding a writer frame by frame:
  1. synthetic scene          -> teacher layout ({mod}.mp4, lossless H.264)
  2. teacher-mp4 reader        -> npy windows (16 frames each)
  3. npy-windows reader        -> PNG sequence (8-bit, one folder per modality)
For each leg it prints RSS after the warm-up frames, at the end, the growth between the two and
the peak. Flat memory means the growth stays near zero however many frames go through. Prints
figures only; no assertions (the figures go to docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _common import import_package, rss_mib


def leg(name: str, stream, sink, warmup: int) -> None:
    from alaya_flash.streaming.files.sinks import write_stream

    marks = {"n": 0, "warm": None, "peak": 0.0}

    def tick(_):
        marks["n"] += 1
        rss = rss_mib()
        marks["peak"] = max(marks["peak"], rss)
        if marks["n"] == warmup:
            marks["warm"] = rss

    write_stream(stream, sink, progress=tick)
    end = rss_mib()
    print(f"{name:<28} frames {marks['n']:>5}  RSS after {warmup} frames {marks['warm']:7.1f} MiB  "
          f"end {end:7.1f} MiB  growth {end - marks['warm']:+6.1f} MiB  peak {marks['peak']:7.1f} MiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=2000, help="frames to stream")
    p.add_argument("--size", default="160x96", help="WIDTHxHEIGHT of the frames")
    p.add_argument("--warmup", type=int, default=100, help="frames before the baseline RSS reading")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))

    import_package()

    from alaya_flash.streaming.files.readers import open_gbuffers
    from alaya_flash.streaming.files.sinks import NpyWindowSink, PngSequenceSink, TeacherMp4Sink
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    print(f"streaming {args.frames} frames of {w}x{h} (5 passes each); start RSS {rss_mib():.1f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        leg("synthetic -> teacher mp4", synthetic_stream(w, h, args.frames), TeacherMp4Sink(tmp / "mp4"), args.warmup)
        leg("teacher mp4 -> npy windows", open_gbuffers(tmp / "mp4"), NpyWindowSink(tmp / "npy"), args.warmup)
        leg("npy windows -> png", open_gbuffers(tmp / "npy"), PngSequenceSink(tmp / "png"), args.warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
