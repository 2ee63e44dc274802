"""Physics-world throughput: frames per second of the playable loop on this machine.

    .venv/bin/python benchmarks/world.py                 # 256 and 512, all variants
    .venv/bin/python benchmarks/world.py --sizes 256 --frames 40

Each variant runs the playable loop (controls in, physics step, render, readback to numpy) for
--frames ticks after a warm-up and prints the median time per frame and its FPS:
  gbuffer        G-buffers only (the rasterizer's one geometry pass)
  +gt            plus ground truth under one preset (GL deferred PBR pass, = shading.shade)
  +gt+shadows    plus a shadow map and the sun-visibility pass
  raycast        the PyTorch ray caster fallback, G-buffers only (few frames: it is slow)
llvmpipe takes its thread count from LP_NUM_THREADS (default: one per core); torch (ray caster)
from --torch-threads. On a loaded machine one torch thread is much faster than two.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def run_variant(size: int, frames: int, presets: tuple, shadows: bool, backend: str, objects: int) -> float:
    from alaya_flash.streaming.world import Controls, PlayableWorld, WorldConfig

    game = PlayableWorld(WorldConfig(seed=1, width=size, height=size, fps=30.0, num_objects=objects,
                                     presets=presets, shadows=shadows, backend=backend))
    ticks = [Controls(move=(0.3, 1.0), yaw=1.0), Controls(move=(-0.5, 0.5), push=True), Controls(jump=True)]
    for k in range(3):  # warm-up: first draws compile shaders
        game.step(ticks[k % 3])
    times = []
    for k in range(frames):
        t = time.perf_counter()
        game.step(ticks[k % 3])
        times.append(time.perf_counter() - t)
    game.close()
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512], help="square frame sizes")
    parser.add_argument("--frames", type=int, default=60, help="timed frames per variant")
    parser.add_argument("--objects", type=int, default=20, help="dynamic objects in the scene")
    parser.add_argument("--no-raycast", action="store_true", help="skip the (slow) ray-caster variant")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (ray caster)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.torch_threads)
    print(f"cpu cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.2f}, "
          f"LP_NUM_THREADS={os.environ.get('LP_NUM_THREADS', 'unset')}, torch threads: {args.torch_threads}")
    print(f"{'size':>5} {'variant':<13} {'ms/frame':>9} {'fps':>7}")
    for size in args.sizes:
        variants = [("gbuffer", (), False, "gl"), ("+gt", ("bright_sunny",), False, "gl"),
                    ("+gt+shadows", ("bright_sunny",), True, "gl")]
        if not args.no_raycast:
            variants.append(("raycast", (), False, "torch"))
        for name, presets, shadows, backend in variants:
            n = max(5, args.frames // 6) if backend == "torch" else args.frames
            dt = run_variant(size, n, presets, shadows, backend, args.objects)
            print(f"{size:>5} {name:<13} {dt * 1e3:>9.1f} {1 / dt:>7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
