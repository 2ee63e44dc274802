"""Seconds per student-rollout training step, by torch thread count: what THREADS to give a recipe.

    .venv/bin/python benchmarks/train_step.py                       # 256x256 clips, 1 and 2 threads, 5 runs
    .venv/bin/python benchmarks/train_step.py --size 128 --threads 1 2 --runs 7

One step as `train student-rollout` takes it (training/student.py): the shipped student
streams a 25-frame clip's 7 latent frames through its rolling KV cache (window 1 + sink 1, 4 steps
a chunk, gradients at one exit step, the autocast the stage uses), a mean-squared error, one AdamW
update. The inputs are random (speed does not depend on them); the batch is student-rollout.json's.
Thread counts alternate within each run, and the first run is left out as warm-up. It prints the
median per thread count and the ratio to the first; another busy process on the machine changes
the figures (two threads collapse beside one), so it prints os.getloadavg() before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256, help="clip side in pixels, a multiple of 16 (256)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts (1 2)")
    p.add_argument("--runs", type=int, default=5, help="runs, the first left out as warm-up (5)")
    args = p.parse_args(argv)
    if args.size % 16 or args.runs < 2:
        p.error("--size must be a multiple of 16 and --runs at least 2")

    from alaya_flash.model_zoo import folders
    from alaya_flash.training.common import descend
    from alaya_flash.training.student import rollout

    batch = json.loads((ROOT / "training/configs/student-rollout.json").read_text()).get("batch", 1)
    student = folders.load_flash(None, torch.device("cpu"), torch.float32).dit.train().requires_grad_(True)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    side = args.size // 8  # the codecs' 8x downsampling
    cond = torch.randn(batch, student.config.in_dim - student.config.out_dim, 7, side, side)
    prompt = torch.randn(batch, 1, student.config.text_dim)
    target = torch.randn(batch, student.config.out_dim, 7, side, side)

    print(f"load before {os.getloadavg()[0]:.2f}; batch {batch}, {args.size}x{args.size}, 25 frames")
    times: dict[int, list[float]] = {t: [] for t in args.threads}
    for run in range(args.runs):
        for threads in args.threads:
            torch.set_num_threads(threads)
            start = time.perf_counter()
            x = rollout(student, cond, prompt, 1, run % 4, g, 1, 1, finish=True)
            descend(opt, (x - target).pow(2).mean(), student.parameters())
            if run:
                times[threads].append(time.perf_counter() - start)
    first = statistics.median(times[args.threads[0]])
    for threads, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{threads} thread{'s' if threads > 1 else ''}: {median:.3f} s a step (median of {len(seconds)}), "
              f"{first / median:.2f}x the speed of {args.threads[0]}")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
