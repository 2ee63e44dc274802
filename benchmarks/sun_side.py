"""Can a renderer tell bright_sunny from overcast on a new scene without knowing where the sun is?

The G-buffers' normals are in camera space and the courtyard is square, so which walls face the
sun is not in the input of a scene never seen. For each held-out scene this re-renders the
ground truth (shading.shade is a pure function of the passes and the camera) under bright_sunny
with the sun turned by 0, 90, 180 and 270 degrees of azimuth, and scores against the real
bright_sunny and overcast ground truths, as `alaya-flash eval`'s control does (metrics.nearest):
  blend    the mean of the four: the best guess of a model that cannot know the sun's side
  turned   the sun on the opposite side: a confident guess that is wrong

    .venv/bin/python benchmarks/sun_side.py --seeds 100000 100001 100002 100003 --stride 4
"""
from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import torch

from alaya_flash.training.data import CAMERAS
from alaya_flash.streaming import metrics
from alaya_flash.streaming.world import WorldConfig, WorldSource
from alaya_flash.streaming.world.shading import PRESETS, shade


def scene_report(seed: int, size: int = 256, frames: int = 25, stride: int = 4) -> dict:
    sunny = PRESETS["bright_sunny"]
    cfg = WorldConfig(seed=seed, width=size, height=size, fps=16.0, num_frames=frames, num_objects=12,
                      camera=CAMERAS[seed % len(CAMERAS)], presets=("bright_sunny", "overcast"), shadows=False)
    truth, over, blend, turned = [], [], [], []
    for i, (frame, cam) in enumerate(WorldSource(cfg).frames_with_cameras()):
        if i % stride:
            continue
        passes = frame.passes()
        truth.append(frame.extras["rgb_bright_sunny"])
        over.append(frame.extras["rgb_overcast"])
        suns = [shade(passes, cam, dataclasses.replace(sunny, sun_azimuth=sunny.sun_azimuth + a)).astype(np.float32)
                for a in (0, 90, 180, 270)]
        blend.append(np.mean(suns, 0))
        turned.append(suns[2])

    def t(xs):
        return torch.from_numpy(np.stack(xs).astype(np.float32) / 255)

    gt = [t(truth), t(over)]
    report = {"seed": seed, "sunny_vs_overcast_db": metrics.psnr(gt[0], gt[1])}
    for name, x in (("blend", t(blend)), ("turned", t(turned))):
        near = metrics.nearest(x, gt, 0)
        report[name] = {"psnr_sunny_db": metrics.psnr(x, gt[0]), "psnr_overcast_db": metrics.psnr(x, gt[1]),
                        "nearest_sunny": bool(near["hit"]), "margin_db": near["margin_db"]}
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[100000, 100001, 100002, 100003])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--stride", type=int, default=4, help="score every stride-th frame")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps([scene_report(s, args.size, args.frames, args.stride) for s in args.seeds], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
