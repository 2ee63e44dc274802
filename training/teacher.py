"""Stage b: the bidirectional teacher DiT, flow matching on cached latents.

x_sigma = (1 - sigma) x0 + sigma * noise, target velocity noise - x0 (streaming/render/sampler.py's
convention), sigma = shift(u) with u ~ U(0, 1). The DiT input is the noisy RGB latent followed
by the 80 G-buffer latent channels; the text slot gets the MiniLM prompt embedding, replaced by
the empty prompt's with probability `prompt_dropout` (so CFG has an unconditional branch).
Temporal RoPE positions start at a random frame in [0, rope_offset_max], so the model does not
tie content to absolute positions (the streaming cache shifts them).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model_zoo import dit
from ..model_zoo.errors import AlayaError
from ..model_zoo.latents import TIME_COMPRESSION
from ..streaming.render import sampler
from .common import StageConfig, autocast, check_caption_rate, check_device, descend, step_generator, train_loop
from .latent_data import LatentSet, encode_split


@dataclass(frozen=True)
class TeacherStageConfig(StageConfig):
    out: str = "runs/teacher"
    vae_run: str = "runs/vae"
    codecs_run: str = "runs/codecs"
    cond_encoder: str = "distilled"  # "distilled" (the streaming encoder) or "vae"
    frames: int = 13  # pixel frames per training window (4k+1)
    dit: str = "dit-small"  # a named DiTConfig ...
    dim: int = 0  # ... with these overrides (0 = keep)
    ffn_dim: int = 0
    num_heads: int = 0
    num_layers: int = 0
    lr: float = 3e-4
    warmup: int = 100
    prompt_dropout: float = 0.1
    shift: float = 3.0  # training sigma shift (more samples at high noise)
    rope_offset_max: int = 8
    max_windows: int = 0  # encode at most this many training windows (0 = all)
    size: int = 0  # train on frames resized to size x size (0 = the dataset's size)
    train_wordings: int = 0  # prompts from the first N training wordings of each preset (0 = all; see prompts.py)
    text_noise: float = 0.0  # prompt embedding noise (latent_data.perturb_prompts)
    caption_rate: float = 0.0  # share of prompts that are the clip's caption (world v2: names the sun's side)
    device: str = "cpu"  # or "cuda": where the DiT trains (the latent cache is encoded on the CPU)

    def validate(self):
        check_device("teacher stage", self.device)
        if (self.frames - 1) % TIME_COMPRESSION:
            raise AlayaError(f"teacher stage: frames {self.frames} must be 4k+1")
        if self.dit not in dit.CONFIGS:
            raise AlayaError(f"teacher stage: dit {self.dit!r} is unknown; choose from {', '.join(dit.CONFIGS)}")
        if self.cond_encoder not in ("distilled", "vae"):
            raise AlayaError(f"teacher stage: cond_encoder {self.cond_encoder!r} is not 'distilled' or 'vae'")
        if self.train_wordings < 0:
            raise AlayaError(f"teacher stage: train_wordings {self.train_wordings} must be >= 0 (0 = all)")
        if self.text_noise < 0:
            raise AlayaError(f"teacher stage: text_noise {self.text_noise} must be >= 0")
        check_caption_rate("teacher stage", self.caption_rate)


def dit_config(cfg: TeacherStageConfig) -> dit.DiTConfig:
    over = {k: getattr(cfg, k) for k in ("dim", "ffn_dim", "num_heads", "num_layers") if getattr(cfg, k)}
    return replace(dit.CONFIGS[cfg.dit], **over).validate()


def latents_path(cfg: TeacherStageConfig, split: str = "train") -> Path:
    return Path(cfg.out) / f"latents-{split}.safetensors"


def prepare_latents(cfg: TeacherStageConfig, split: str, log=None) -> LatentSet:
    path = encode_split(cfg.data, split, cfg.frames, cfg.vae_run, cfg.codecs_run if cfg.cond_encoder == "distilled" else None,
                        cfg.cond_encoder, latents_path(cfg, split), log, cfg.max_windows, cfg.size)
    return LatentSet(path)


def flow_loss(model: dit.WanDiT, x0: torch.Tensor, cond: torch.Tensor, prompt: torch.Tensor, g: torch.Generator,
              shift: float, chunk_frames: int | None = None, start_frame: int = 0, per_frame: bool = False) -> torch.Tensor:
    """Flow-matching MSE of one batch. per_frame: an independent sigma per latent frame (diffusion forcing).
    Sigmas and noise are drawn on the CPU (the same samples on any device), the pass runs on the model's device."""
    b, _, t = x0.shape[:3]
    u = torch.rand((b, t) if per_frame else (b,), generator=g)
    sigma = sampler.shift_sigma(u, shift).clamp(1e-3, 1.0)
    s = sigma.view(b, 1, t, 1, 1) if per_frame else sigma.view(b, 1, 1, 1, 1)
    noise = torch.randn(x0.shape, generator=g)
    xt = (1 - s) * x0 + s * noise
    dev = next(model.parameters()).device
    with autocast(dev):
        v = model(torch.cat([xt, cond], 1).to(dev), 1000 * sigma.to(dev), prompt.to(dev), chunk_frames=chunk_frames,
                  start_frame=start_frame)
    return F.mse_loss(v.float(), (noise - x0).to(dev))


def run_teacher(cfg: TeacherStageConfig, log, progress=None) -> int:
    data = prepare_latents(cfg, "train", log)
    dcfg = replace(dit_config(cfg), text_dim=data.negative.shape[-1])  # the text encoder's width (MiniLM: 384)
    if data.cond.shape[1] != dcfg.cond_dim:
        raise AlayaError(f"teacher stage: latents have {data.cond.shape[1]} conditioning channels, the DiT takes {dcfg.cond_dim}")
    torch.manual_seed(cfg.seed)
    model = dit.build(dcfg).to(cfg.device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.99))
    log.info("teacher DiT %s: %.2fM parameters; %d windows x %d presets; on %s", dcfg,
             sum(p.numel() for p in model.parameters()) / 1e6, len(data), len(data.presets), cfg.device)

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        x0, cond, prompt, _ = data.sample(g, cfg.batch, cfg.prompt_dropout, cfg.train_wordings, cfg.text_noise,
                                          cfg.caption_rate)
        offset = int(torch.randint(cfg.rope_offset_max + 1, (1,), generator=g))
        loss = flow_loss(model, x0, cond, prompt, g, cfg.shift, start_frame=offset)
        descend(opt, loss, model.parameters())
        return {"flow": loss.item()}

    from dataclasses import asdict

    return train_loop(cfg, {"dit": model}, {"opt_dit": opt}, step, log, progress, extra={"dit_config": asdict(dcfg)})


def load_dit(run_dir: str | Path, name: str = "dit") -> dit.WanDiT:
    """A DiT from a teacher/student output folder (its config from the checkpoint's metadata)."""
    import json

    from ..model_zoo.loading import load_strict, read_metadata
    from .common import final_weights, latest_checkpoint

    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        raise AlayaError(f"{run_dir}: no checkpoint here; run that stage first")
    raw = json.loads(read_metadata(ckpt)["extra"])["dit_config"]
    raw["patch_size"] = tuple(raw["patch_size"])
    model = dit.build(dit.DiTConfig(**raw))
    load_strict(model, final_weights(Path(run_dir), name))
    return model
