"""World v2 cost and noise: seconds per frame of G-buffers, sun visibility and path-traced truth.

    .venv/bin/python benchmarks/world_v2.py                          # 256x256, spp 16 and 64, vs 1024 spp
    .venv/bin/python benchmarks/world_v2.py --size 128 --spp 8,32 --reference 256 --frames 2
    .venv/bin/python benchmarks/world_v2.py --variant scalar_rgb    # against llvm_ad_rgb (auto's choice)

For each scene kind (street/walk, courtyard/orbit, interior/walk; seed 1) and --frames frames it
prints the median seconds per frame of: the G-buffer caster (numpy, one thread), the sun
visibility (Mitsuba, one centred sample), and the truth under --preset at each --spp (Mitsuba
--variant, all cores; llvm_ad_rgb JIT-compiles its kernels on a scene's first render, which the
median over --frames leaves out), plus the truth's noise: PSNR (dB, 8-bit sRGB) against a --reference spp
render of the same frame. Load on the machine changes the figures; the script prints os.getloadavg().
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--spp", default="16,64")
    p.add_argument("--reference", type=int, default=1024, help="spp of the noise reference (0: no noise figures)")
    p.add_argument("--frames", type=int, default=2)
    p.add_argument("--preset", default="bright_sunny")
    p.add_argument("--max-depth", type=int, default=4)
    p.add_argument("--variant", default="auto", help="Mitsuba variant: auto, scalar_rgb or llvm_ad_rgb")
    args = p.parse_args(argv)
    from alaya_flash.streaming.world.traced import TracedConfig, TracedWorld
    from alaya_flash.streaming.world.traced.render import resolve_variant, tone_map

    spps = [int(s) for s in args.spp.split(",")]
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores; {args.size}x{args.size}, preset {args.preset}, "
          f"max_depth {args.max_depth}, Mitsuba {resolve_variant(args.variant)}")
    print("| scene | G-buffers s | sun visibility s | " + " | ".join(f"truth {s} spp s (PSNR dB)" for s in spps) + " |")
    print("|---|---|---|" + "---|" * len(spps))
    for kind, camera in (("street", "walk"), ("courtyard", "orbit"), ("interior", "walk")):
        world = TracedWorld(TracedConfig(seed=1, scene=kind, camera=camera, width=args.size, height=args.size,
                                         presets=(args.preset,), fps=8.0, variant=args.variant))
        ms, (truth, sun) = world.mitsuba_scene(), world.preset_scenes(0)
        light = world.lighting[0]
        t_gb, t_vis, t_truth, noise = [], [], {s: [] for s in spps}, {s: [] for s in spps}
        for index in range(args.frames):
            camera_ = world.camera(index * 4)
            t = time.perf_counter()
            frame = world.caster.render(camera_)
            t_gb.append(time.perf_counter() - t)
            t = time.perf_counter()
            ms.sun_visibility(sun, camera_, light.sun_direction, frame.normal, np.isfinite(frame.depth))
            t_vis.append(time.perf_counter() - t)
            ref = None
            if args.reference:
                ref = tone_map(ms.radiance(truth, camera_, args.reference, args.max_depth, seed=999), frame.depth,
                               light, world.desc.exposure)
            for s in spps:
                t = time.perf_counter()
                rgb = tone_map(ms.radiance(truth, camera_, s, args.max_depth, seed=index), frame.depth, light,
                               world.desc.exposure)
                t_truth[s].append(time.perf_counter() - t)
                if ref is not None:
                    noise[s].append(psnr(rgb, ref))
        cells = [f"{statistics.median(t_truth[s]):.2f}" + (f" ({statistics.mean(noise[s]):.1f})" if noise[s] else "")
                 for s in spps]
        print(f"| {kind} ({camera}) | {statistics.median(t_gb):.3f} | {statistics.median(t_vis):.3f} | "
              + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
