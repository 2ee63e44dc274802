"""The teacher sampler: bidirectional flow-matching Euler over a whole window, with shift and CFG.

    latents = teacher_sample(model, cond, prompt_emb, negative_emb)   # 50 steps, shift 5, CFG 5 (model.md §1.6)

`guided_velocity` is the teacher's v(x, sigma) with classifier-free guidance; training's distillation
uses it batched. Latents are Wan-normalised (the DiT's space), layout BCTHW, float32 on the model's device.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...model_zoo.dit import WanDiT
from ...model_zoo.errors import AlayaError
from . import sampler


def guided_velocity(model: WanDiT, cond: torch.Tensor, prompt_emb: torch.Tensor, negative_emb: torch.Tensor | None = None,
                    cfg: float = sampler.TEACHER_CFG, batched: bool = False) -> Callable[[torch.Tensor, float], torch.Tensor]:
    """The teacher's v(x, sigma) over a whole window with classifier-free guidance:
    uncond + cfg * (cond - uncond), the negative prompt as uncond (none when cfg == 1 or no
    negative). batched (training): both branches in one pass of twice the batch, returned in float32."""
    b, device = cond.shape[0], cond.device
    use_cfg = negative_emb is not None and cfg != 1.0
    if batched:
        ctx = torch.cat([prompt_emb, negative_emb.expand(b, -1, -1)]) if use_cfg else prompt_emb
    else:
        pos = model.prepare_prompt(prompt_emb)
        neg = model.prepare_prompt(negative_emb) if use_cfg else None

    def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
        inp, t = torch.cat([x, cond], 1), torch.full((b,), 1000 * sigma, device=device)
        if batched:
            v = model(torch.cat([inp, inp]) if use_cfg else inp, torch.cat([t, t]) if use_cfg else t, ctx).float()
            return sampler.cfg_combine(v[:b], v[b:], cfg) if use_cfg else v
        v = model(inp, t, pos)
        return sampler.cfg_combine(v, model(inp, t, neg), cfg) if use_cfg else v

    return velocity


def teacher_sample(
    model: WanDiT,
    cond_latents: torch.Tensor,
    prompt_emb: torch.Tensor,
    negative_emb: torch.Tensor | None = None,
    *,
    steps: int = sampler.TEACHER_STEPS,
    shift: float = sampler.TEACHER_SHIFT,
    cfg: float = sampler.TEACHER_CFG,
    seed: int = 0,
    noise: torch.Tensor | None = None,
    callback: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Teacher rendering of one window: bidirectional flow-matching Euler with shift and CFG.

    cond_latents (B, cond_dim, T, h, w); prompt_emb / negative_emb (B, L, text_dim). CFG is
    uncond + cfg * (cond - uncond) with the negative prompt as uncond (skipped when cfg == 1 or
    no negative is given). noise (B, out_dim, T, h, w) defaults to a CPU float32 draw from seed.
    Returns clean latents (B, out_dim, T, h, w) float32.
    """
    b, c, frames, h, w = cond_latents.shape
    if c != model.config.cond_dim:
        raise AlayaError(f"conditioning latents have {c} channels, the model takes {model.config.cond_dim}")
    device = next(model.parameters()).device
    cond = cond_latents.to(device=device, dtype=torch.float32)
    shape = (b, model.config.out_dim, frames, h, w)
    if noise is None:
        noise = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)
    elif tuple(noise.shape) != shape:
        raise AlayaError(f"teacher noise has shape {tuple(noise.shape)}, expected {shape}")
    with torch.no_grad():
        velocity = guided_velocity(model, cond, prompt_emb, negative_emb, cfg)
        return sampler.sample_euler(velocity, noise.to(device), sampler.teacher_sigmas(steps, shift), callback)
