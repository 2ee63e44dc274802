"""Frames per second of every G-buffer writer and reader at the model size (832x448, five passes).

    .venv/bin/python benchmarks/io_throughput.py             # 32 frames per format
    .venv/bin/python benchmarks/io_throughput.py --frames 64 --size 416x224

For each format: write N teacher-form frames through its sink, then read them back in teacher
form (what the models eat). Prints the write time per frame (mean, including the final flush,
because some sinks buffer) and the median read time per frame, with frames/s. A model
running at ~30 FPS needs a reader well above that. Figures only; no assertions.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import import_package


def timed(iterable):
    """Yield items and record the time each took to produce."""
    times = []
    t = time.perf_counter()
    for item in iterable:
        now = time.perf_counter()
        times.append(now - t)
        yield item, times
        t = time.perf_counter()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=32, help="frames per format")
    p.add_argument("--size", default="832x448", help="WIDTHxHEIGHT")
    args = p.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))

    import_package()
    import numpy as np

    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.files.readers import open_gbuffers
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    frames = np.stack(list(synthetic_stream(w, h, args.frames).teacher_frames()))
    print(f"{args.frames} frames of {w}x{h}, teacher form uint8 (5, {h}, {w}, 3)")
    print(f"{'format':<8} {'write ms':>9} {'write fps':>10} {'read ms':>9} {'read fps':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("npy", "mp4", "png", "exr"):
            dst = Path(tmp) / fmt
            t = time.perf_counter()
            with sinks.open_sink(dst, fmt) as sink:
                for images in frames:
                    sink.write(gbuffer=images)
            wm = (time.perf_counter() - t) / len(frames)  # mean incl. close: sinks buffer (npy, mp4)
            read_times = None
            for _, read_times in timed(open_gbuffers(dst).teacher_frames()):
                pass
            rm = statistics.median(read_times)
            print(f"{fmt:<8} {wm * 1e3:9.1f} {1 / wm:10.1f} {rm * 1e3:9.1f} {1 / rm:9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
