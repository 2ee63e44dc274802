"""Where `alaya-flash bench`'s time goes: the bench's pipeline under torch.profiler.

  python benchmarks/profile_bench.py --device cuda --size 832x448 --dit alayarenderer-teacher \\
      --encoder gbuffer-encoder --decoder taew2_1 --frames 24
  python benchmarks/profile_bench.py --size 64x32 --dit dit-tiny --frames 8      # CPU, toy size

Runs the bench three times (a warm-up, a plain run, a profiled run) and prints the Flash pipeline's
loop time (the runner's run, without building the networks), the device's kernel time in the
profiled run and its share of the plain run (far below 100%: launches, Python or the CPU stages
bound the pipeline, not the GPU's arithmetic), the number of kernel launches, and the top
operators by their own device (or CPU) time. Any other option is passed to `alaya-flash bench` as
is (--model DIR, --steps N, ...).
"""
from __future__ import annotations

import argparse
import contextlib
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=25, help="operators to list")
    p.add_argument("--shapes", action="store_true", help="one row per operator and input shapes (which copies, which matmuls)")
    args, rest = p.parse_known_args(argv)
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from alaya_flash.streaming.cli import main as cli

    bench = ["--quiet", "bench", "--device", args.device, "--precision", "bf16", "--format", "png", "--json", *rest]
    from alaya_flash.streaming.cli.commands import bench as bench_command

    cuda = args.device == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    measure = bench_command.measure
    runs = []  # (profile or None, the pipeline's loop seconds) per measured pipeline

    def recorded(with_profiler):
        def run(*a, **k):  # only the pipeline's run: not building the networks or the input clip
            ctx = profile(activities=acts, record_shapes=args.shapes) if with_profiler else contextlib.nullcontext()
            with ctx as got:
                out = measure(*a, **k)
            runs.append((got, out["seconds"]))
            return out
        return run

    flash = []  # per bench: its first measured pipeline, the Flash one (a second is the teacher's)
    for with_profiler in (False, False, True):  # a warm-up (first-call set-up, allocator growth), plain, profiled
        bench_command.measure = recorded(with_profiler)
        start = len(runs)
        try:
            if cli(bench):
                return 1
        finally:
            bench_command.measure = measure
        flash.append(runs[start])
    plain, (prof, wall) = flash[1][1], flash[2]
    ev = prof.key_averages(group_by_input_shape=args.shapes)
    if cuda:
        field = "self_device_time_total" if hasattr(ev[0], "self_device_time_total") else "self_cuda_time_total"
        # Only the device's own events (kernels, copies): an operator's row repeats its kernels' time.
        busy = sum(getattr(e, field) for e in ev if e.device_type == DeviceType.CUDA) / 1e6
        launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
        print(f"Flash pipeline: run {plain:.2f} s ({wall:.2f} s profiled); device busy {busy:.2f} s, "
              f"{100 * busy / plain:.0f}% of the run; {launches} kernel launches")
    else:
        field = "self_cpu_time_total"
        print(f"Flash pipeline: run {plain:.2f} s ({wall:.2f} s profiled, CPU)")
    print(ev.table(sort_by=field, row_limit=args.rows, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
