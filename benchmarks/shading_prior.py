"""The shading prior against the physics world's truth, and its cost on one thread.

    python benchmarks/shading_prior.py                 # 256x256, 4 seeds x 3 frames, every preset
    python benchmarks/shading_prior.py --size 128 --seeds 2 --json
    python benchmarks/shading_prior.py --data runs/data-v2 [--ambient 0.35] [--every 4]

With --data (a world v2 dataset) it scores the prior (with reflections, as the default's refiner shades)
against each held-out clip's path-traced truth instead, per scene and preset, under the clip's recorded
light, with its recorded sun visibility as the shadows (the shadow pass), with that and its recorded sky
visibility as the ambient occlusion (the sky pass too; datasets made since 2026-12-08), and with its own
shadows; --ambient scales the light's sky and ground light, to show what the sky the scene's walls and
ceiling block costs.

For each frame and preset (the preset as a camera-relative Light, the camera's own up vector) it
prints the prior's PSNR against the truth three ways: with the truth's sun visibility (the shading
model alone: it is the truth's, so this bounds the 8-bit G-buffers' loss), with its own
screen-space shadows (what it renders), and with no shadows at all (what the shadows buy). Then the
median milliseconds per frame of the whole prior on ONE torch thread (the budget: a core beside the
networks), after a warm-up frame: wall-clock, and the thread's own CPU time (on a machine shared with
other work the wall clock also counts the time they hold the core).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--data", help="a world v2 dataset: score its held-out clips instead")
    parser.add_argument("--ambient", type=float, default=1.0, help="with --data: scale the lights' ambient")
    parser.add_argument("--every", type=int, default=4, help="with --data: score every n-th frame")
    args = parser.parse_args()
    if args.data:
        return world_v2(args)

    from alaya_flash.model_zoo.light import pack
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming import metrics
    from alaya_flash.streaming.gbuffer import frame_to_teacher
    from alaya_flash.streaming.world import WorldConfig, WorldSource
    from alaya_flash.streaming.world.shading import PRESETS, heading, light_of

    torch.set_num_threads(1)
    prior = ShadingPrior()
    names = list(PRESETS)
    scores = {n: {"truth_visibility": [], "own_shadows": [], "no_shadows": []} for n in names}
    seconds, cpu_seconds = [], []
    for seed in range(args.seeds):
        world = WorldConfig(seed=1000 + seed, width=args.size, height=args.size, num_frames=args.frames,
                            presets=tuple(names), shadows=True)
        for frame, camera in WorldSource(world).frames_with_cameras():
            images = torch.from_numpy(frame_to_teacher(frame))
            up = torch.tensor(camera.rotation @ np.array([0.0, 0.0, 1.0]), dtype=torch.float32)
            for name in names:
                light = pack(light_of(name, heading(camera)))[0]
                vis = torch.from_numpy(frame.extras[f"sun_visibility_{name}"])
                truth = torch.from_numpy(frame.extras[f"rgb_{name}"]).permute(2, 0, 1).float() / 255
                with torch.inference_mode():
                    runs = {"truth_visibility": prior(images, light, up=up, sun_visibility=vis, ao=False),
                            "no_shadows": prior(images, light, up=up, sun_visibility=torch.ones_like(vis))}
                    t0, c0 = time.perf_counter(), time.thread_time()
                    runs["own_shadows"] = prior(images, light)  # as it renders: up from the normals, its own shadows
                    seconds.append(time.perf_counter() - t0)
                    cpu_seconds.append(time.thread_time() - c0)
                for key, out in runs.items():
                    scores[name][key].append(metrics.psnr(out[:3], truth))
    report = {"size": args.size, "frames": args.seeds * args.frames,
              "psnr_db": {n: {k: round(statistics.mean(v), 2) for k, v in s.items()} for n, s in scores.items()},
              "psnr_db_mean": {k: round(statistics.mean(statistics.mean(s[k]) for s in scores.values()), 2)
                               for k in ("truth_visibility", "own_shadows", "no_shadows")},
              "ms_per_frame_one_thread": round(1000 * statistics.median(seconds[1:] or seconds), 2),
              "cpu_ms_per_frame_one_thread": round(1000 * statistics.median(cpu_seconds[1:] or cpu_seconds), 2)}
    if args.json:
        print(json.dumps(report))
        return
    print(f"shading prior vs the physics world's truth, {args.size}x{args.size}, {report['frames']} frames per preset")
    print(f"{'preset':18s} {'truth vis.':>10s} {'own shadows':>12s} {'no shadows':>11s}")
    for n, s in report["psnr_db"].items():
        print(f"{n:18s} {s['truth_visibility']:10.2f} {s['own_shadows']:12.2f} {s['no_shadows']:11.2f}")
    m = report["psnr_db_mean"]
    print(f"{'mean':18s} {m['truth_visibility']:10.2f} {m['own_shadows']:12.2f} {m['no_shadows']:11.2f}")
    print(f"cost: {report['ms_per_frame_one_thread']} ms a frame on one thread (median; "
          f"{report['cpu_ms_per_frame_one_thread']} ms of the thread's CPU time)")


def world_v2(args) -> None:
    """The prior against a world v2 dataset's held-out truths, per scene and preset (see the module docstring)."""
    from alaya_flash.model_zoo.light import SLICES
    from alaya_flash.model_zoo.shading_prior import PriorConfig, ShadingPrior
    from alaya_flash.streaming import metrics
    from alaya_flash.training.data import ClipSet

    torch.set_num_threads(1)
    prior = ShadingPrior(PriorConfig(reflections=True))
    held = ClipSet(args.data, "heldout")
    if held.light is None or held.sun_visibility is None:
        raise SystemExit(f"{args.data}: not a world v2 dataset (its clips record no light or sun visibility)")
    report = {"data": args.data, "ambient": args.ambient, "every": args.every, "clips": []}
    for c, file in enumerate(held.meta["clips"]["heldout"]):
        frames = slice(None, None, args.every)
        images = torch.from_numpy(held.gbuffers[c][frames])
        scores = {}
        for p, name in enumerate(held.presets):
            light = torch.from_numpy(held.light[c][p][frames]).clone()
            light[:, SLICES["ambient"]] *= args.ambient
            vis = torch.from_numpy(held.sun_visibility[c][p][frames]).float() / 255
            truth = torch.from_numpy(held.rgb[c][p][frames]).float().div(255).permute(0, 3, 1, 2)
            with torch.inference_mode():
                scores[name] = {"shadow_pass": metrics.psnr(prior(images, light, sun_visibility=vis)[:, :3], truth),
                                "own_shadows": metrics.psnr(prior(images, light)[:, :3], truth)}
                if held.sky_visibility is not None:
                    sky = torch.from_numpy(held.sky_visibility[c][frames]).float() / 255
                    scores[name]["sky_pass"] = metrics.psnr(
                        prior(images, light, sun_visibility=vis, sky_visibility=sky)[:, :3], truth)
        scene = held.meta.get("clip_info", {}).get(file, {}).get("scene", file)
        report["clips"].append({"scene": scene, "psnr_db": scores,
                                "psnr_db_mean": {k: round(statistics.mean(s[k] for s in scores.values()), 2)
                                                 for k in next(iter(scores.values()))}})
    if args.json:
        print(json.dumps(report))
        return
    for clip in report["clips"]:
        m = clip["psnr_db_mean"]
        sky = f", {m['sky_pass']:.2f} with the sky pass too" if "sky_pass" in m else ""
        print(f"{clip['scene']}: the prior alone, ambient x{args.ambient}: {m['shadow_pass']:.2f} dB with the shadow pass"
              f"{sky}, {m['own_shadows']:.2f} with its own shadows")
        for name, s in clip["psnr_db"].items():
            print(f"  {name:18s} " + " ".join(f"{v:6.2f}" for v in s.values()))


if __name__ == "__main__":
    main()
