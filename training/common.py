"""What every training stage shares: JSON configs, seeding, logging, checkpoints with resume.

Configs are JSON files read into a stage's frozen dataclass; unknown keys are refused with the
file and the key named. A checkpoint is ONE safetensors file holding the networks
(`<net>.<param>`), the optimizer states (`<opt>.state.<i>.<name>`) and the RNG state, with the
step, the optimizer param groups and the config as JSON metadata, written atomically; a run
resumes from the latest one in its output folder (`ckpt-<step>.safetensors`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from ..model_zoo.errors import AlayaError
from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors
from ..model_zoo.text_encoder import MINILM, MINILM_NAMES

CKPT_RE = re.compile(r"ckpt-(\d+)\.safetensors$")


# -- configs

def load_config(path: str | Path, cls, overrides: Mapping[str, Any] | None = None):
    """A JSON file -> the dataclass `cls`; unknown keys and wrong types are refused by name."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise AlayaError(f"{path}: config file not found") from None
    except ValueError as err:
        raise AlayaError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise AlayaError(f"{path}: a config is a JSON object of key: value")
    raw.update(overrides or {})
    return config_from_dict(raw, cls, str(path))


def config_from_dict(raw: Mapping[str, Any], cls, source: str = "config"):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise AlayaError(f"{source}: unknown key {unknown[0]!r} for {cls.__name__}; known keys: {', '.join(fields)}")
    values = {}
    for key, value in raw.items():
        default = fields[key].default
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        if default is not None and default is not dataclasses.MISSING:
            want = float if isinstance(default, float) else type(default)
            if want is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise AlayaError(f"{source}: {key!r} is {value!r}, expected a {want.__name__}")
        values[key] = value
    try:
        config = cls(**values)
    except TypeError as err:
        raise AlayaError(f"{source}: {err}") from None
    check = getattr(config, "validate", None)
    if check is not None:
        check()
    return config


def config_dict(config) -> dict:
    return dataclasses.asdict(config)


# -- run setup

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def run_logger(out_dir: Path, stage: str) -> logging.Logger:
    """Log to out_dir/train.log (appending across resumes) and to stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger(f"alaya_flash.train.{stage}.{out_dir}")
    log.setLevel(logging.INFO)
    log.propagate = False
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()
    fmt = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
    for handler in (logging.FileHandler(out_dir / "train.log"), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        log.addHandler(handler)
    return log


def close_logger(log: logging.Logger) -> None:
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


# -- checkpoints

def save_checkpoint(path: Path, step: int, nets: Mapping[str, nn.Module], optims: Mapping[str, torch.optim.Optimizer],
                    config, extra: Mapping[str, Any] | None = None) -> Path:
    """Networks + optimizer states + RNG state + step, in one safetensors file (atomic)."""
    tensors: dict[str, torch.Tensor] = {}
    groups = {}
    for name, net in nets.items():
        for k, v in net.state_dict().items():
            tensors[f"{name}.{k}"] = v
    for name, opt in optims.items():
        sd = opt.state_dict()
        groups[name] = sd["param_groups"]
        for idx, state in sd["state"].items():
            for k, v in state.items():
                tensors[f"{name}.state.{idx}.{k}"] = torch.as_tensor(v)
    tensors["rng.torch"] = torch.get_rng_state()
    meta = {"format": "alaya-flash training checkpoint v1", "step": step, "param_groups": groups,
            "config": config_dict(config), "extra": dict(extra or {})}
    return save_safetensors(tensors, path, meta)


def load_checkpoint(path: Path, nets: Mapping[str, nn.Module], optims: Mapping[str, torch.optim.Optimizer]) -> dict:
    """Restore what save_checkpoint wrote; returns {'step', 'extra'}. Keys are checked strictly."""
    from ..model_zoo.loading import load_strict

    state = read_state_dict(path)
    meta = read_metadata(path)
    for name, net in nets.items():
        prefix = f"{name}."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and ".state." not in k[len(prefix):]}
        load_strict(net, own)
    groups = json.loads(meta["param_groups"])
    for name, opt in optims.items():
        if name not in groups:
            raise AlayaError(f"{path}: checkpoint has no optimizer {name!r}")
        per: dict[int, dict] = {}
        prefix = f"{name}.state."
        for k, v in state.items():
            if k.startswith(prefix):
                idx, key = k[len(prefix):].split(".", 1)
                per.setdefault(int(idx), {})[key] = v
        opt.load_state_dict({"state": per, "param_groups": groups[name]})
    torch.set_rng_state(state["rng.torch"])
    return {"step": int(meta["step"]), "extra": json.loads(meta.get("extra", "{}"))}


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in out_dir.glob("ckpt-*.safetensors") if (m := CKPT_RE.search(p.name))]
    return max(found)[1] if found else None


def resume(out_dir: Path, nets: Mapping[str, nn.Module], optims: Mapping[str, torch.optim.Optimizer],
           log: logging.Logger) -> tuple[dict | None, Path | None]:
    """Load the newest checkpoint that reads back whole. A damaged one (a truncated file, a disk that
    filled up) is set aside as `<name>.damaged` with a warning and the one before it is used; a
    failed load leaves the networks as they were, so falling back is safe."""
    found = sorted((int(m.group(1)), p) for p in out_dir.glob("ckpt-*.safetensors") if (m := CKPT_RE.search(p.name)))
    for _, path in reversed(found):
        saved = {n: {k: v.clone() for k, v in net.state_dict().items()} for n, net in nets.items()}
        try:
            return load_checkpoint(path, nets, optims), path
        except Exception as err:  # noqa: BLE001  (any reading error means: not usable)
            for n, net in nets.items():
                net.load_state_dict(saved[n])
            damaged = path.with_name(path.name + ".damaged")
            os.replace(path, damaged)
            log.warning("%s: cannot be read back (%s); kept as %s, resuming from the checkpoint before it",
                        path.name, str(err).splitlines()[0][:200], damaged.name)
    return None, None


def prune_checkpoints(out_dir: Path, keep: int = 2) -> None:
    found = sorted((int(m.group(1)), p) for p in out_dir.glob("ckpt-*.safetensors") if (m := CKPT_RE.search(p.name)))
    for _, p in found[:-keep]:
        p.unlink(missing_ok=True)


def net_weights(path: Path, name: str) -> dict[str, torch.Tensor]:
    """One network's weights out of a training checkpoint (the `<name>.` prefix removed)."""
    prefix = f"{name}."
    state = read_state_dict(path)
    out = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix) and ".state." not in k[len(prefix):]}
    if not out:
        raise AlayaError(f"{path}: no network {name!r} in this checkpoint")
    return out


def final_weights(run_dir: Path, name: str) -> dict[str, torch.Tensor]:
    """The weights of network `name` from a stage's output folder (its latest checkpoint)."""
    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        raise AlayaError(f"{run_dir}: no checkpoint (ckpt-N.safetensors) here; run that stage first")
    return net_weights(ckpt, name)


# -- the loop every stage runs

@dataclasses.dataclass(frozen=True)
class StageConfig:
    """Fields every stage has (each stage's config adds its own)."""

    out: str = "runs/stage"  # output folder: checkpoints, train.log
    data: str = "runs/data"  # dataset folder (train data)
    seed: int = 0
    steps: int = 1000
    batch: int = 2
    lr: float = 2e-4
    ckpt_every: int = 200
    log_every: int = 20
    max_minutes: float = 0.0  # stop (with a checkpoint) after this much training time in all runs; 0 = no limit
    threads: int = 1  # torch CPU threads (1: on a shared CPU, more threads spin and run 5-10x slower)
    warmup: int = 0  # steps of linear learning-rate warmup
    decay_steps: int = 0  # the last decay_steps steps before `steps` bring the learning rate down linearly to 5%


def lr_scale(cfg: StageConfig, step: int) -> float:
    """The learning-rate factor of a step: warmup, constant, then the final linear decay (a function
    of the step alone, so a resumed run continues the schedule exactly)."""
    scale = min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else 1.0
    left = cfg.steps - step
    if cfg.decay_steps and left <= cfg.decay_steps:
        scale *= 0.05 + 0.95 * left / cfg.decay_steps
    return scale


def check_caption_rate(stage: str, caption_rate: float) -> None:
    """caption_rate (teacher, student-rollout): the share of prompts that are the clip's caption, in [0, 1]."""
    if not 0.0 <= caption_rate <= 1.0:
        raise AlayaError(f"{stage}: caption_rate {caption_rate} must be between 0 and 1")


def check_text_encoder(stage: str, name: str) -> None:
    """text_encoder (student-rollout): a MiniLM context the CPU can embed every wording with."""
    if name not in MINILM_NAMES:
        raise AlayaError(f"{stage}: text_encoder {name!r} is not one of {', '.join(MINILM_NAMES)}")


def run_extra(run) -> dict:
    """The settings a run's latest checkpoint records (its metadata's "extra")."""
    ckpt = latest_checkpoint(Path(run))
    if ckpt is None:
        raise AlayaError(f"{run}: no checkpoint here; run that stage first")
    return json.loads(read_metadata(ckpt).get("extra", "{}"))


def run_text_encoder(run) -> str:
    """The prompt encoder a student run's latest checkpoint was trained with (older runs: all-minilm-l6-v2)."""
    return run_extra(run).get("text_encoder", MINILM)


def run_chunk_frames(run) -> int:
    """The latent frames per streaming chunk a student run was trained with (runs from before it was
    recorded: 2)."""
    return run_extra(run).get("chunk_frames", 2)


def check_mix(stage: str, mix: str, mix_rate: float) -> None:
    """mix / mix_rate (vae, codecs, student-rollout, decoder, refiner): a second source drawn for a share
    of the steps or crops."""
    if not 0.0 <= mix_rate <= 1.0:
        raise AlayaError(f"{stage}: mix_rate {mix_rate} must be between 0 and 1")
    if bool(mix) != bool(mix_rate):
        raise AlayaError(f"{stage}: mix_rate {mix_rate} and its second source {mix!r} go together (both or neither)")


def check_pair_weight(stage: str, pair_weight: float, batch: int) -> None:
    """pair_weight (student-rollout, decoder) is >= 0, and with it the batch splits into pairs."""
    if pair_weight < 0 or (pair_weight > 0 and batch % 2):
        raise AlayaError(f"{stage}: pair_weight {pair_weight} must be >= 0, and with it batch {batch} even (pairs)")


def step_generator(seed: int, step: int) -> torch.Generator:
    """The random source of one training step: a resumed run draws the same samples."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def descend(opt: torch.optim.Optimizer, loss: torch.Tensor, params, max_norm: float = 1.0) -> None:
    """One optimizer step on loss, the gradient norm of params clipped to max_norm."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()


def train_loop(cfg: StageConfig, nets: Mapping[str, nn.Module], optims: Mapping[str, torch.optim.Optimizer],
               step_fn, log: logging.Logger, progress=None, extra=None) -> int:
    """Run step_fn(step) -> {loss name: float} from the latest checkpoint to cfg.steps.

    Checkpoints every cfg.ckpt_every steps, at the end and when max_minutes runs out (keeps the
    last two). progress(n, losses) is called per step. Returns the step reached.
    """
    import time

    out = Path(cfg.out)
    start, before = 0, 0.0  # step and training seconds already done (max_minutes counts across resumes)
    got, ckpt = resume(out, nets, optims, log)
    if got is not None:
        start, before = got["step"], float(got["extra"].get("elapsed_s", 0.0))
        log.info("resumed from %s at step %d (%.1f min trained)", ckpt.name, start, before / 60)
    if progress:
        progress(start, {})
    t0 = time.monotonic() - before
    step, running = start, {}

    def save(at: int) -> None:
        meta = {**(extra or {}), "elapsed_s": time.monotonic() - t0}
        save_checkpoint(out / f"ckpt-{at:06d}.safetensors", at, nets, optims, cfg, meta)
        prune_checkpoints(out)

    if cfg.max_minutes and before > 60 * cfg.max_minutes:
        log.info("nothing to do: max_minutes=%s already spent (step %d)", cfg.max_minutes, start)
        return start

    for step in range(start, cfg.steps):
        for net in nets.values():
            net.train()
        for opt in optims.values():  # each group keeps its configured rate as base_lr (saved in checkpoints)
            for group in opt.param_groups:
                group["lr"] = group.setdefault("base_lr", group["lr"]) * lr_scale(cfg, step)
        losses = step_fn(step)
        for k, v in losses.items():
            running[k] = running.get(k, 0.0) + v
        done = step + 1
        if progress:
            progress(1, losses)
        if done % cfg.log_every == 0 or done == cfg.steps:
            n = (done - start) % cfg.log_every or cfg.log_every
            log.info("step %d %s", done, " ".join(f"{k}={v / n:.5f}" for k, v in running.items()))
            running = {}
        out_of_time = cfg.max_minutes and (time.monotonic() - t0) > 60 * cfg.max_minutes
        if done % cfg.ckpt_every == 0 or done == cfg.steps or out_of_time:
            save(done)
        if out_of_time:
            log.info("stopped at step %d: max_minutes=%s reached", done, cfg.max_minutes)
            return done
    if start >= cfg.steps:
        log.info("nothing to do: already at step %d of %d", start, cfg.steps)
    return max(start, step + 1 if cfg.steps > start else start)


def autocast(device: str | torch.device = "cpu"):
    """Mixed precision for training passes on `device`: bf16 autocast where bf16 is fast
    (precision.preferred_dtype: CPUs with AMX / AVX512-BF16, CUDA GPUs with bf16), float32 elsewhere.
    Measured: on an AMX Xeon a DiT training step (dim 192, 4 layers, batch 4, 256x256) ran 0.60 s in
    bf16 vs 0.95 s in float32; on an AVX2-only EPYC bf16 was 7-10x SLOWER, which is why it is not
    used there."""
    import contextlib

    from ..model_zoo.precision import preferred_dtype

    device = torch.device(device)
    if preferred_dtype(device) == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


TRAINING_DEVICES = ("cpu", "cuda")


def check_device(stage: str, device: str) -> None:
    """A stage's `device` is cpu or cuda, and cuda only where torch sees a GPU."""
    if device not in TRAINING_DEVICES:
        raise AlayaError(f"{stage}: device {device!r} is unknown; choose {' or '.join(TRAINING_DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise AlayaError(f"{stage}: device 'cuda' asked for, but this torch sees no CUDA GPU "
                         f"(torch {torch.__version__}); use device cpu")
