"""Evaluate a Flash model and its teacher side by side on held-out world clips.

  alaya-flash eval --json                                   # the embedded default and its teacher
  alaya-flash eval --model runs/model --data runs/data --clips 2 --teacher-steps 20 --json
  alaya-flash eval --data runs/data-v2 --no-teacher --json  # world v2 (path-traced): + the lighting axis

Held-out clips (scene seeds never trained on) come from a dataset folder's held-out split
(--data, made by `alaya-flash train data`) or are rendered now (--size, --frames). Every clip is
rendered by both models under every lighting preset's prompt, once with a training wording and
once with each held-out paraphrase (2 per preset; --heldout-wordings 1 scores the first only, as
reports made before 2026-12-04 did), and scored on the five axes:

  content       PSNR / SSIM against the ground truth of the prompted preset (training wordings),
                also with the render's content coarser than 128 ... 4 pixels swapped for the truth's
                (which scales the error lives at), and PSNR under the held-out paraphrases (pooled, by
                paraphrase and by preset: what a user's own wording gets), and the student's against
                the teacher's render; from world v2 held-out clips whose
                truths average several renders (data config heldout_passes), also the truth's own
                noise (its PSNR against the noise-free image, from the spread of its passes) and the
                render's PSNR against the noise-free truth (metrics.noise_free_psnr, an estimate)
  temporal      error of frame-to-frame differences against the ground truth's, and the ratio of
                their magnitudes (1.0 = as much change as the ground truth)
  cross_window  change across chunk (student) / window (teacher) boundaries over change inside
                them, and the same ratio for the ground truth at the same frames
  control       how often a render is nearest (PSNR) to the ground truth of its prompted preset
                among all presets, and the mean margin in dB; for training and held-out wordings
                (pooled over the paraphrases, and each paraphrase's rate), with each miss as
                "clip K: prompted -> nearest preset (margin) [paraphrase N]"
  runtime       frames per second and first-frame latency of the streaming render, peak memory
  lighting      world v2 datasets only (their clips carry sun visibility and the ground's pixels):
                cast shadows (shadow ratio on the ground, render against truth, for presets whose
                caption names a sun side; the share within 20% of the truth's), bare metals
                (luminance contrast and PSNR over metallic >= 0.9 pixels), the sky's colour
                (mean error in 8-bit levels) and the sun's side (each shadow render again with the
                caption naming the opposite side: how far it moves, and whether the caption's own
                side darkens the truth's shadows more); a world v2 clip's training wording is its caption
  long_stream   one long world stream (--long-frames, default 1,000, at --long-size, default 128x128;
                an unseen seed, a held-out sunset wording; --long-world: the physics world, or world
                v2's street walked at eye height and path traced at 32 spp, by default the world
                of --data) rendered as ONE stream by the student:
                PSNR per --long-block frames against its ground truth, first and last block, the
                drop, and fresh streams started at the midpoint and the last block (each block against
                the long stream's same block: what the stream's state costs; at the last block, the
                drift); --no-long-stream leaves it out

Speed figures come from this machine as it is (say whether it was shared when quoting them).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import args as args_
from ..args import out_path, parse_size
from ....training.eval import LONG_WORLDS, evaluate

HELP = "evaluate student vs teacher on held-out clips (content, temporal, cross-window, control, runtime, long stream)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + "; default: the embedded model_zoo/default")
    parser.add_argument("--teacher", type=Path, help="teacher model folder (default: MODEL/teacher when present)")
    parser.add_argument("--no-teacher", action="store_true", help="evaluate the student only")
    parser.add_argument("--no-refiner", action="store_true",
                        help="score the tiny decoder's frames, leaving out the model's G-buffer refiner (what it buys)")
    parser.add_argument("--data", type=Path, help="dataset folder whose --split to score (default: render held-out clips now)")
    parser.add_argument("--split", choices=("heldout", "train"), default="heldout",
                        help="--data's split to score: train scores clips the model may have trained on, so that "
                             "beside heldout it measures how far the model generalises")
    parser.add_argument("--clips", type=args_.bounded(int, 1, 10_000), default=2, help="clips to evaluate (the first of the split)")
    parser.add_argument("--size", type=parse_size, default=None, metavar="N|WxH",
                        help="frame size of rendered clips (default: the model's trained size)")
    parser.add_argument("--frames", type=args_.FRAMES, default=25, help="frames per rendered clip")
    parser.add_argument("--presets", default="all",
                        help="comma-separated lighting presets, or 'all' (a world v2 dataset's: its own presets)")
    parser.add_argument("--teacher-steps", type=args_.STEPS, help="teacher Euler steps (default: the teacher's, 50)")
    parser.add_argument("--heldout-wordings", type=int, default=0, metavar="N",
                        help="held-out paraphrases per preset to score control with (0: all of them, 2 each)")
    parser.add_argument("--light", choices=("prompt", "data"), default="prompt",
                        help="the light a light-reading refiner (and the prior-only baseline) gets: the prompt's, as the "
                             "light head reads it, or each clip's recorded light per frame, as an engine that knows its "
                             "sun sends it (default: prompt)")
    parser.add_argument("--shadows", choices=("screen", "pass"), default="screen",
                        help="where the shading prior's shadows come from: marched in screen space from the depth, or "
                             "each clip's recorded sun visibility, as an engine's shadow pass gives it (world v2 data "
                             "records it; default: screen)")
    parser.add_argument("--sky", choices=("screen", "pass"), default="screen",
                        help="where the shading prior's ambient occlusion comes from: screen space, or each clip's "
                             "recorded sky visibility, as an engine's sky pass gives it (world v2 data made since "
                             "2026-12-08 records it; default: screen)")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="sampling seed")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="weights' dtype for inference")
    parser.add_argument("--runtime-size", type=parse_size, default=(256, 256), metavar="N|WxH",
                        help="frame size of the student runtime measurement")
    parser.add_argument("--runtime-frames", type=args_.FRAMES, default=33, help="frames of the runtime measurement")
    parser.add_argument("--long-frames", type=args_.bounded(int, 1, args_.MAX_FRAMES), default=1000, metavar="N",
                        help="frames of the long-stream axis (a multiple of --long-block, at least 2 blocks)")
    parser.add_argument("--long-size", type=parse_size, default="128", metavar="N|WxH",
                        help="frame size of the long stream (multiples of 16)")
    parser.add_argument("--long-block", type=args_.bounded(int, 1, args_.MAX_FRAMES), default=25, metavar="N",
                        help="frames per PSNR block of the long stream")
    parser.add_argument("--long-world", choices=("auto",) + LONG_WORLDS, default="auto",
                        help="world of the long stream: physics, or v2 (a path-traced street walk, Mitsuba); "
                             "auto: the --data dataset's world (physics without --data)")
    parser.add_argument("--no-long-stream", action="store_true", help="leave out the long-stream axis")
    parser.add_argument("--out", type=out_path, help="also write the JSON report here (atomically)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on stdout")
    args_.add_cpu_arguments(parser)


def run(args) -> int:
    import os

    report = evaluate(args)
    text = json.dumps(report, indent=1, default=lambda v: None)
    if args.out:
        from ...files.sinks import temp_name

        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(args.out)
        tmp.write_text(text + "\n")
        os.replace(tmp, args.out)
    if args.json:
        print(text)
    elif not args.quiet:
        for m in ("student", "teacher"):
            if m in report:
                r = report[m]
                print(f"{m}: PSNR {r['content']['psnr_db']:.2f} dB, SSIM {r['content']['ssim']:.3f}, "
                      f"temporal ratio {r['temporal']['ratio']:.2f}, control (held-out wordings) "
                      f"{r['control']['heldout_wordings']['nearest_rate']:.0%}", file=sys.stderr)
                if "truth_noise" in r["content"]:
                    tn = r["content"]["truth_noise"]
                    print(f"{m}: PSNR {tn['psnr_db_noise_free']:.2f} dB against the noise-free truth (estimated; the "
                          f"truth's own noise: {tn['truth_psnr_db']:.2f} dB)", file=sys.stderr)
                if "lighting" in r:
                    li = r["lighting"]
                    shadow = li["shadows"]
                    if shadow["renders"]:
                        print(f"{m} lighting: shadow ratio {shadow['ratio']:.2f} (truth {shadow['gt_ratio']:.2f}, "
                              f"{shadow['within_tolerance']:.0%} within 20%)", file=sys.stderr)
                    side = li["sun_side"]
                    if side["pairs"] and side["move_db"] is not None:
                        print(f"{m} sun side: the opposite side named moves the render to {side['move_db']:.1f} dB; "
                              f"shadow ratio {side['shadow_ratio']:.2f} against {side['opposite_shadow_ratio']:.2f} "
                              f"({side['follows_rate']:.0%} follow the caption)", file=sys.stderr)
                if "long_stream" in r:
                    ls = r["long_stream"]
                    print(f"{m} long stream ({ls['frames']} frames): first block {ls['first_block_psnr_db']:.2f} dB, "
                          f"last {ls['last_block_psnr_db']:.2f} dB; drift {ls['drift_db']:+.2f} dB (a fresh stream "
                          f"at frame {ls['fresh_starts'][-1]['frame']} against the long one)", file=sys.stderr)
    return 0
