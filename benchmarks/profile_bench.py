"""Where `alaya-flash bench`'s time goes: one warm-up run, then the same run under torch.profiler.

  python benchmarks/profile_bench.py --device cuda --size 832x448 --dit alayarenderer-teacher \\
      --encoder gbuffer-encoder --decoder taew2_1 --frames 24
  python benchmarks/profile_bench.py --size 64x32 --dit dit-tiny --frames 8      # CPU, toy size

Prints the Flash pipeline's profiled run's wall time (the runner's run, without building the networks), the device's summed kernel time over it (its busy share: far
below 100% means launches, Python or the CPU stages bound the pipeline, not the GPU's arithmetic),
the top operators by their own device (or CPU) time, and the number of kernel launches. Any other
option is passed to `alaya-flash bench` as is (--model DIR, --steps N, ...).
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=25, help="operators to list")
    args, rest = p.parse_known_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    from alaya_flash.streaming.cli import main as cli

    bench = ["--quiet", "bench", "--device", args.device, "--precision", "bf16", "--format", "png", "--json", *rest]
    if cli(bench):  # warm-up: first-call set-up and the allocator's growth stay out of the profile
        return 1
    from alaya_flash.streaming.commands import bench as bench_command

    cuda = args.device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    runs = []
    measure = bench_command.measure

    def profiled(*a, **k):  # only the pipeline's run: not building the networks or the input clip
        t = time.perf_counter()
        with profile(activities=acts) as got:
            out = measure(*a, **k)
        runs.append((got, time.perf_counter() - t))
        return out

    bench_command.measure = profiled
    try:
        cli(bench)
    finally:
        bench_command.measure = measure
    prof, wall = runs[0]  # the Flash pipeline (a second one is the teacher's, with --compare-teacher)
    ev = prof.key_averages()
    if cuda:
        field = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
        busy = sum(getattr(e, field) for e in ev) / 1e6
        launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
        print(f"profiled run {wall:.2f} s, summed kernel time {busy:.2f} s ({100 * busy / wall:.0f}% busy), "
              f"{launches} kernel launches")
    else:
        field = "self_cpu_time_total"
        print(f"profiled run {wall:.2f} s (CPU)")
    print(ev.table(sort_by=field, row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
