"""What recording costs the live loop: milliseconds per frame spent in Recorder.write.

    .venv/bin/python benchmarks/live_recording.py                 # 60 frames at 256x256, with G-buffers
    .venv/bin/python benchmarks/live_recording.py --size 832x448 --frames 30 --no-gbuffers

The recorder encodes through sinks.BackgroundWriter (a worker thread); for comparison the same
recording is made with the sink written inline (what the loop paid before). Between frames the
loop sleeps --gap ms, standing in for the renderer's own work. Runs alternate, --runs each;
prints each run's loop milliseconds per frame and the close() seconds, and the medians.
Figures only; no assertions.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


class _Inline:
    """The BackgroundWriter interface, writing in the caller's thread."""

    def __init__(self, sink, depth=0):
        self.sink = sink

    def put(self, frames):
        for rgb, gbuffer in frames:
            self.sink.write(rgb=rgb, gbuffer=gbuffer)

    def close(self):
        return self.sink.close()

    def abort(self):
        self.sink.abort()


def main(argv=None) -> int:
    import numpy as np

    from alaya_flash.streaming.files import sinks
    from alaya_flash.streaming.cli.args import parse_size
    from alaya_flash.streaming.live import recorder

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=parse_size, default=(256, 256), metavar="N|WxH")
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gap", type=float, default=20.0, help="ms the loop spends elsewhere between frames")
    p.add_argument("--no-gbuffers", action="store_true", help="record RGB only (one H.264 stream)")
    args = p.parse_args(argv)
    h, w = args.size
    g = np.random.default_rng(0)
    base = g.integers(0, 256, (5, h, w, 3), dtype=np.uint8)
    frames = [(np.roll(base[0], i, 1).copy(), np.roll(base, i, 2).copy()) for i in range(args.frames)]
    results: dict[str, list[tuple[float, float]]] = {"inline": [], "background": []}
    real = recorder.BackgroundWriter
    try:
        for _ in range(args.runs):
            for mode in results:
                recorder.BackgroundWriter = _Inline if mode == "inline" else sinks.BackgroundWriter
                with tempfile.TemporaryDirectory() as tmp:
                    rec = recorder.Recorder(Path(tmp) / "rec", fps=30, gbuffers=not args.no_gbuffers)
                    in_loop = 0.0
                    for rgb, teacher in frames:
                        t = time.perf_counter()
                        rec.write(rgb, teacher)
                        in_loop += time.perf_counter() - t
                        time.sleep(args.gap / 1000)
                    t = time.perf_counter()
                    rec.close()
                    results[mode].append((1000 * in_loop / len(frames), time.perf_counter() - t))
    finally:
        recorder.BackgroundWriter = real
    what = "RGB" if args.no_gbuffers else "RGB + G-buffers (6 lossless H.264 streams)"
    print(f"recording {what}, {w}x{h}, {args.frames} frames, {args.gap:g} ms between frames")
    for mode, runs in results.items():
        loop = [round(a, 2) for a, _ in runs]
        print(f"{mode:>10}: loop ms/frame {loop} (median {statistics.median(loop):.2f}); "
              f"close s {[round(c, 2) for _, c in runs]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
