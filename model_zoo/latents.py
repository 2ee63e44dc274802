"""The Wan latent space: per-channel normalization and the pixel-frame <-> latent-frame arithmetic.

This is the one place for these constants; every codec, the DiT pipelines and the tests import them.

Normalization (Wan2.1 VAE, 16 channels; source: Wan-Video/Wan2.1 wan/modules/vae.py, the same
values as diffusers' AutoencoderKLWan latents_mean / latents_std):
    z_norm = (z_raw - mean) / std        (what the DiT and TAEHV's taew2_1 see)
    z_raw  = z_norm * std + mean         (what the Wan VAE's conv2 + decoder see)
Latents are BCTHW (channels on dim 1) unless a `dim` argument says otherwise.

Frame arithmetic (4x temporal compression, causal, first frame alone):
    T pixel frames      -> (T - 1) // 4 + 1 latent frames   (81 -> 21; frames past 4k+1 add nothing)
    T' latent frames    -> 4 * T' - 3 pixel frames          (21 -> 81)
Latent 0 covers pixel frame 0; latent i >= 1 covers pixel frames 4i-3 .. 4i.
"""
from __future__ import annotations

import torch

from .errors import AlayaError

LATENT_CHANNELS = 16
TIME_COMPRESSION = 4
SPACE_COMPRESSION = 8

WAN21_LATENT_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENT_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


def _channel_view(values, like: torch.Tensor, dim: int) -> torch.Tensor:
    if like.shape[dim] != len(values):
        raise AlayaError(
            f"latents have {like.shape[dim]} channels on dim {dim}, expected {len(values)} (Wan2.1 latent space)"
        )
    shape = [1] * like.ndim
    shape[dim] = len(values)
    # computed in float32 whatever the latent dtype, then cast back, so bf16 latents keep precision
    return torch.tensor(values, dtype=torch.float32, device=like.device).view(shape)


def normalize(z_raw: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Raw Wan VAE latents -> normalized latents, (z - mean) / std per channel (channels on `dim`)."""
    mean, std = _channel_view(WAN21_LATENT_MEAN, z_raw, dim), _channel_view(WAN21_LATENT_STD, z_raw, dim)
    return ((z_raw.float() - mean) / std).to(z_raw.dtype)


def denormalize(z_norm: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Normalized latents -> raw Wan VAE latents, z * std + mean per channel (channels on `dim`)."""
    mean, std = _channel_view(WAN21_LATENT_MEAN, z_norm, dim), _channel_view(WAN21_LATENT_STD, z_norm, dim)
    return (z_norm.float() * std + mean).to(z_norm.dtype)


def latent_frames(pixel_frames: int) -> int:
    """Number of latent frames for T pixel frames: (T - 1) // 4 + 1 (81 -> 21, 16 -> 4)."""
    if pixel_frames < 1:
        raise AlayaError(f"need at least 1 pixel frame, got {pixel_frames}")
    return (pixel_frames - 1) // TIME_COMPRESSION + 1


def pixel_frames(latent_frames: int) -> int:
    """Number of pixel frames decoded from T' latent frames: 4T' - 3 (21 -> 81)."""
    if latent_frames < 1:
        raise AlayaError(f"need at least 1 latent frame, got {latent_frames}")
    return TIME_COMPRESSION * latent_frames - (TIME_COMPRESSION - 1)


def latent_size(height: int, width: int) -> tuple[int, int]:
    """Latent (h, w) for a (height, width) frame; both must be multiples of 8."""
    if height % SPACE_COMPRESSION or width % SPACE_COMPRESSION:
        raise AlayaError(f"frame size {height}x{width} (HxW) must be a multiple of {SPACE_COMPRESSION} on both sides")
    return height // SPACE_COMPRESSION, width // SPACE_COMPRESSION
