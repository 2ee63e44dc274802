"""The default model on both backends (torch, openvino), measured alternately in one run.

    python benchmarks/backends.py                          # 256 and 512, 3 runs each
    python benchmarks/backends.py --sizes 256 --runs 3 --busy-neighbour
    python benchmarks/backends.py --sizes 256 --backends torch openvino openvino-int8

For each size it runs `alaya-flash bench --model model_zoo/default --chunk 4 --json --backend B`
for each B of --backends in turn (torch, then openvino), `runs` times, and prints the medians per
backend (steady FPS, first frame after warm-up and the process's first frame (bench's
first_frame_cold_s: compiled models read from the disk cache), stage milliseconds a frame, tick
latency p99, peak RSS) and each one's FPS ratio to the first. The compiled-model cache is warmed by one throwaway run first (bench's own warm-up
stream then keeps compilation out of the first-frame figure too). Prints the CPU's model name.
Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
from pathlib import Path

from cpu_speed import bench, summary


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--busy-neighbour", action="store_true", help="one busy process runs beside every bench")
    parser.add_argument("--bench-args", default="", help="more bench options, e.g. '--threads 1'")
    parser.add_argument("--backends", nargs="+", default=["torch", "openvino"], help="measured in turn; the first is the base")
    args = parser.parse_args()
    extra = args.bench_args.split()
    print(f"{cpu_name()}, {os.cpu_count()} CPUs; load average before: {os.getloadavg()[0]:.2f}")
    for size in args.sizes:
        for backend in args.backends:  # converts and caches the compiled models
            if backend != "torch":
                bench(size, 8, ["--backend", backend, *extra], None, False)
        rows = {b: [] for b in args.backends}
        for _ in range(args.runs):
            for backend in rows:
                rows[backend].append(bench(size, args.frames, ["--backend", backend, *extra], None, args.busy_neighbour))
        figures = {}
        for backend, runs in rows.items():
            s = summary(runs)
            p99 = statistics.median(r["flash"]["chunk_latency_ms"]["p99"] for r in runs)
            figures[backend] = s
            cold = statistics.median(r["first_frame_cold_s"] for r in runs)
            print(f"{size}x{size} {backend:13s}: {s['fps']:.2f} FPS steady, first frame {s['first']:.3f} s "
                  f"(process's first {cold:.3f} s), tick p99 "
                  f"{p99:.0f} ms, ms/frame " + ", ".join(f"{k} {v:.1f}" for k, v in s["ms"].items())
                  + f", peak RSS {s['rss']:.0f} MiB [{s['cpu']}]", flush=True)
        base = args.backends[0]
        print("    " + ", ".join(f"{b} / {base}: {figures[b]['fps'] / figures[base]['fps']:.2f}x" for b in args.backends[1:])
              + (" (beside a busy process)" if args.busy_neighbour else ""))
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
