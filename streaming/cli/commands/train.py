"""Train the default model's networks, stage by stage, from the physics world.

  alaya-flash train data        --config training/configs/data.json
  alaya-flash train vae         --config training/configs/vae.json
  alaya-flash train codecs      --config training/configs/codecs.json
  alaya-flash train teacher     --config training/configs/teacher.json
  alaya-flash train student-ode --config training/configs/student-ode.json
  alaya-flash train student-dmd --config training/configs/student-dmd.json
  alaya-flash train student-rollout --config training/configs/student-rollout.json
  alaya-flash train decoder     --config training/configs/decoder.json
  alaya-flash train export      --config training/configs/export.json
  alaya-flash train refiner     --config training/configs/refiner.json  (then export with refiner_run)
  alaya-flash train text-anchor --config training/configs/text-anchor.json (then export from it)
  alaya-flash train import      --config training/configs/import.json   (a model folder -> run folders)

Each stage reads a JSON config (keys: the stage's dataclass in training/; unknown keys
are refused), writes into its "out" folder: train.log, ckpt-NNNNNN.safetensors (networks,
optimizer state and RNG state; the last two kept) and resumes from the latest checkpoint when run
again. --set KEY=VALUE overrides a config key (JSON value), e.g. --set steps=50.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP = "train the model stage by stage (data, vae, codecs, teacher, student-ode, student-dmd, student-rollout, decoder, export, refiner, text-anchor, import)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ....training import STAGES

    parser.add_argument("stage", choices=list(STAGES), help="training stage to run")
    parser.add_argument("--config", type=Path, required=True, help="stage config (JSON)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key with a JSON value (repeatable)")


def parse_overrides(items: list[str]) -> dict:
    from ....model_zoo.errors import AlayaError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AlayaError(f"--set {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a bare string
    return out


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from ....training import stage
    from ....training.common import close_logger, load_config, run_logger, seed_everything

    cls, fn = stage(args.stage)
    cfg = load_config(args.config, cls, parse_overrides(args.set))
    if getattr(cfg, "threads", 0):
        torch.set_num_threads(cfg.threads)
    seed_everything(cfg.seed if hasattr(cfg, "seed") else 0)
    out = Path(cfg.out)
    log = run_logger(out, args.stage)
    total = getattr(cfg, "steps", None) or (cfg.train_clips + cfg.heldout_clips if args.stage == "data" else None)
    bar = tqdm(total=total, desc=args.stage, unit="step" if args.stage != "data" else "clip", file=sys.stderr,
               disable=args.quiet or not sys.stderr.isatty())

    def progress(n: int, losses: dict) -> None:
        bar.update(n)
        if losses:
            bar.set_postfix({k: f"{v:.4f}" for k, v in losses.items()}, refresh=False)

    try:
        log.info("stage %s, config %s: %s", args.stage, args.config, json.dumps(_plain(cfg)))
        reached = fn(cfg, log, progress)
        log.info("stage %s done (%s)", args.stage, reached)
    finally:
        bar.close()
        close_logger(log)
    return 0


def _plain(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)
