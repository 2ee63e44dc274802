"""Image and video quality metrics for evaluation (the seed paper's five axes, computable on a CPU).

Frames are float tensors (T, H, W, 3) in [0, 1] (ComfyUI IMAGE layout, what the pipelines emit).

- psnr / ssim: content preservation (SSIM: Gaussian window 11, sigma 1.5, on luma-free RGB mean
  over channels, constants of Wang et al. 2004); psnr_by_latent: PSNR of each latent frame's pixel
  frames (frame 0, then 1-4, 5-8, ...), which shows drift along a stream.
- temporal: error of frame-to-frame differences against the reference's, and the ratio of their
  mean magnitudes (1.0 = as much change as the ground truth; > 1 = flicker).
- boundary_ratio: mean change across chunk boundaries over mean change inside chunks.
- nearest: which reference (e.g. ground truth under each lighting preset) a render is closest to,
  and the PSNR margin to the runner-up (prompt controllability).
- shadow_ratio: luminance of shadowed over sunlit pixels given the scene's sun visibility (do
  renders keep cast shadows?).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model_zoo.latents import TIME_COMPRESSION


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Peak signal-to-noise ratio in dB over the whole clip (peak 1.0); inf for identical inputs."""
    mse = F.mse_loss(x.float(), ref.float()).item()
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def latent_frame_groups(frames: int) -> list[slice]:
    """The pixel frames of each latent frame in Wan's alignment: [0], [1, 4], [5, 8], ... (the last may be short)."""
    starts = [0] + list(range(1, frames, TIME_COMPRESSION))
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [frames])]


def psnr_by_latent(x: torch.Tensor, ref: torch.Tensor) -> list[float]:
    """PSNR of the pixel frames of each latent frame (latent_frame_groups)."""
    return [psnr(x[g], ref[g]) for g in latent_frame_groups(x.shape[0])]


def _gauss(size: int = 11, sigma: float = 1.5) -> torch.Tensor:
    g = torch.exp(-((torch.arange(size) - size // 2) ** 2).float() / (2 * sigma**2))
    return (g / g.sum())[None, None]


def ssim(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean SSIM over frames and channels: x, ref (T, H, W, 3) in [0, 1]."""
    a = x.float().permute(0, 3, 1, 2).flatten(0, 1)[:, None]  # (T*3, 1, H, W)
    b = ref.float().permute(0, 3, 1, 2).flatten(0, 1)[:, None]
    size = min(11, a.shape[-1], a.shape[-2])
    size -= 1 - size % 2  # odd
    g = _gauss(size)

    def blur(v):  # separable Gaussian, valid region
        return F.conv2d(F.conv2d(v, g[..., None, :].reshape(1, 1, 1, -1)), g.reshape(1, 1, -1, 1))

    c1, c2 = 0.01**2, 0.03**2
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.mean().item()


def temporal(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Frame-difference error (mean |dx - dref|) and magnitude ratio (mean |dx| / mean |dref|)."""
    dx, dr = x[1:].float() - x[:-1].float(), ref[1:].float() - ref[:-1].float()
    return {"diff_error": (dx - dr).abs().mean().item(),
            "ratio": dx.abs().mean().item() / max(dr.abs().mean().item(), 1e-8)}


def boundary_ratio(x: torch.Tensor, boundaries: list[int]) -> float | None:
    """Mean |x[b] - x[b-1]| over boundary frames b, over the same inside chunks; None without both kinds."""
    d = (x[1:].float() - x[:-1].float()).abs().flatten(1).mean(1)  # d[i] = change from frame i to i+1
    at = [b - 1 for b in boundaries if 0 < b < x.shape[0]]
    inside = [i for i in range(d.shape[0]) if i not in at]
    if not at or not inside:
        return None
    return d[at].mean().item() / max(d[inside].mean().item(), 1e-8)


def nearest(x: torch.Tensor, refs: list[torch.Tensor], target: int) -> dict:
    """Is x nearest (by PSNR) to refs[target]? margin = PSNR to target - best PSNR to any other (dB);
    nearest = the index of the closest ref."""
    scores = [psnr(x, r) for r in refs]
    others = [s for i, s in enumerate(scores) if i != target]
    best = max(range(len(scores)), key=scores.__getitem__)
    return {"hit": best == target, "nearest": best, "margin_db": scores[target] - max(others) if others else math.inf}


def shadow_ratio(rgb, sun_visibility, region=None, min_pixels: int = 16) -> float | None:
    """How dark cast shadows are: mean luminance of shadowed pixels over that of sunlit ones.

    rgb: one frame (H, W, 3), uint8 sRGB or float in [0, 1] (numpy or torch); sun_visibility:
    (H, W) in [0, 1] from the scene (world v2 frames carry it as extras["sun_visibility"]);
    region: optional (H, W) bool mask, e.g. the ground's pixels. Shadowed means visibility < 0.01,
    lit > 0.99. Luminance is Rec. 709 on linear values (sRGB decoded). About 1.0: no visible
    shadows; ground truth on a sunny street is far below. None when either set has fewer than
    min_pixels pixels.
    """
    import numpy as np

    from .gbuffer import srgb_to_linear

    rgb = rgb.detach().cpu().numpy() if hasattr(rgb, "detach") else np.asarray(rgb)
    vis = sun_visibility.detach().cpu().numpy() if hasattr(sun_visibility, "detach") else np.asarray(sun_visibility)
    x = rgb.astype(np.float32) / 255.0 if rgb.dtype == np.uint8 else rgb.astype(np.float32)
    lum = srgb_to_linear(x) @ np.array([0.2126, 0.7152, 0.0722], dtype=np.float32)
    keep = np.ones(vis.shape, bool) if region is None else np.asarray(region, bool)
    shadowed, lit = keep & (vis < 0.01), keep & (vis > 0.99)
    if shadowed.sum() < min_pixels or lit.sum() < min_pixels:
        return None
    return float(lum[shadowed].mean() / max(lum[lit].mean(), 1e-8))
