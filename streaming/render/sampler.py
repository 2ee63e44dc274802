"""Flow-matching schedules and samplers: small pure functions over a denoiser callable.

Conventions (rectified flow, as Wan): sigma in [0, 1], timestep t = 1000 * sigma,
x_sigma = (1 - sigma) * x0 + sigma * noise, the network predicts velocity v = noise - x0, so
x0 = x_sigma - sigma * v. Samplers keep no state and draw no random numbers: noise comes in as
an argument (a callable step -> tensor), so the caller's generator makes a run reproducible.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

# Self-Forcing / LongLive's few-step list: nominal timesteps warped through the shift-5 table.
FEW_STEP_NOMINAL = (1000, 750, 500, 250)
FEW_STEP_SHIFT = 5.0
TEACHER_STEPS = 50
TEACHER_SHIFT = 5.0
TEACHER_CFG = 5.0


def shift_sigma(sigma: torch.Tensor, shift: float) -> torch.Tensor:
    """Wan's time shift: sigma' = shift * sigma / (1 + (shift - 1) * sigma)."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def warped_timesteps(nominal: Sequence[float] = FEW_STEP_NOMINAL, shift: float = FEW_STEP_SHIFT) -> torch.Tensor:
    """Nominal timesteps warped by the shift table, float64: [1000, 750, 500, 250] -> [1000, 937.5, 833.33.., 625].

    Self-Forcing's FlowMatchScheduler table at 1000 steps holds 1000 * shift_sigma(1 - k/1000);
    picking index 1000 - t is shift_sigma(t / 1000), computed here directly (and exactly).
    """
    s = torch.tensor([float(t) for t in nominal], dtype=torch.float64) / 1000
    return 1000 * shift * s / (1 + (shift - 1) * s)


def teacher_sigmas(steps: int = TEACHER_STEPS, shift: float = TEACHER_SHIFT) -> torch.Tensor:
    """The teacher's Euler schedule: linspace(1, 0, steps + 1)[:-1] shifted, then a final 0. (steps + 1,) float64."""
    s = torch.linspace(1, 0, steps + 1, dtype=torch.float64)[:-1]
    return torch.cat([shift_sigma(s, shift), torch.zeros(1, dtype=torch.float64)])


def x0_from_velocity(x: torch.Tensor, v: torch.Tensor, sigma) -> torch.Tensor:
    """Clean estimate from a velocity prediction, computed in float64 and returned in x's dtype."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64, device=x.device)
    return (x.double() - sigma * v.double()).to(x.dtype)


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma) -> torch.Tensor:
    """x_sigma = (1 - sigma) * x0 + sigma * noise; sigma a number or a tensor broadcasting against x0."""
    if not isinstance(sigma, torch.Tensor):
        sigma = float(sigma)
    return (1 - sigma) * x0 + sigma * noise


def sample_x0(
    denoise: Callable[[torch.Tensor, float], torch.Tensor],
    x: torch.Tensor,
    sigmas: Sequence[float] | torch.Tensor,
    noise: Callable[[int], torch.Tensor],
) -> torch.Tensor:
    """Few-step x0 sampler (consistency style, as Self-Forcing's causal inference).

    denoise(x, sigma) -> x0 estimate; x is pure noise at sigmas[0]. After each step but the last,
    the estimate is re-noised to the next sigma with fresh noise(i) (shaped like x). Returns the
    last x0 estimate (no step down to sigma 0).
    """
    sigmas = [float(s) for s in sigmas]
    x0 = x
    for i, sigma in enumerate(sigmas):
        x0 = denoise(x, sigma)
        if i + 1 < len(sigmas):
            x = add_noise(x0.detach(), noise(i), sigmas[i + 1])  # training: gradients stop at each step
    return x0


def sample_euler(
    velocity: Callable[[torch.Tensor, float], torch.Tensor],
    x: torch.Tensor,
    sigmas: Sequence[float] | torch.Tensor,
    callback: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Flow-matching Euler: x <- x + v * (sigma_next - sigma) over consecutive sigmas (last is 0).

    callback(step, total) after each step (progress bars belong to the caller).
    """
    sigmas = [float(s) for s in sigmas]
    for i in range(len(sigmas) - 1):
        v = velocity(x, sigmas[i])
        x = (x.double() + v.double() * (sigmas[i + 1] - sigmas[i])).to(x.dtype)
        if callback is not None:
            callback(i + 1, len(sigmas) - 1)
    return x


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)
