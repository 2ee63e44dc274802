"""The Wan2.1 video VAE: causal 3D-conv autoencoder with Wan's checkpoint key names, any width.

Architecture and key names follow Wan-Video/Wan2.1 wan/modules/vae.py (independent implementation):
`encoder.conv1`, `encoder.downsamples.{i}`, `encoder.middle.{0,1,2}`, `encoder.head.{0,2}`, `conv1`,
`conv2`, `decoder.conv1`, `decoder.middle.*`, `decoder.upsamples.{i}`, `decoder.head.*`; residual
blocks `residual.{0,2,3,6}` (+ `shortcut`), RMS norms with a learned `gamma` and no bias, one
single-head spatial attention block in each middle (`norm`, `to_qkv`, `proj`), resamples with
`resample.1` and, when temporal, `time_conv`. Full size (`wan2.1-vae`): base dim 96,
dim_mult (1, 2, 4, 4), 2 residual blocks per stage, temporal downsampling (False, True, True).

Layouts and ranges:
    video    BCTHW RGB in [-1, 1] (decode output clamped to it)
    latents  BCTHW, 16 channels, NORMALIZED Wan space: encode() returns (mu - mean) / std and
             decode() takes normalized latents (model_zoo/latents.py); mu is used, nothing sampled.
Frames: T frames -> (T - 1) // 4 + 1 latents (frames past 4k+1 are not encoded, as in Wan);
T' latents -> 4T' - 3 frames.

Causality and memory: every temporal op is causal and keeps an explicit cache (a dict owned by
the caller, one entry per causal module): a CausalConv3d keeps its last 2 input frames, a
temporal downsample keeps < 3 pending frames, a temporal upsample remembers that frame 0 has
passed (frame 0 is never mixed in time, as in Wan). So whole-clip, Wan's schedule (frame 0
alone, then chunks of 4 frames; decode one latent at a time) and any other chunking give the
same output, and memory is bounded by the chunk, not the clip. Optional spatial tiling with
linear blending bounds memory for large frames.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import AlayaError
from ..latents import denormalize, latent_frames, normalize
from .tiny import channels_last

Cache = dict  # nn.Module -> its causal memory (a tensor, or True for "frame 0 has passed")


@dataclass(frozen=True)
class WanVAEConfig:
    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temporal_downsample: tuple[bool, ...] = (False, True, True)


CONFIGS: dict[str, WanVAEConfig] = {
    "wan2.1-vae": WanVAEConfig(),
    # Same structure, 6x narrower: for training and tests on a CPU.
    "wan2.1-vae-small": WanVAEConfig(base_dim=16),
}


class CausalConv3d(nn.Conv3d):
    """Conv3d that pads 2*p_t frames in front only: zeros at a stream's start, cached frames after."""

    def __init__(self, n_in: int, n_out: int, kernel, stride=1, padding=0):
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else padding
        super().__init__(n_in, n_out, kernel, stride=stride, padding=0)
        self.time_pad = 2 * pt
        self.space_pad = (pw, pw, ph, ph)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        if self.time_pad:
            past = cache.get(self) if cache is not None else None
            if past is None:
                past = x.new_zeros(*x.shape[:2], self.time_pad, *x.shape[3:])
            x = torch.cat([past, x], 2)
            if cache is not None:
                cache[self] = x[:, :, -self.time_pad :].clone()
        if any(self.space_pad):
            x = F.pad(x, self.space_pad)
        if x.dtype in (torch.bfloat16, torch.float16):  # the fast oneDNN path on CPU, as in tiny.channels_last
            x = x.contiguous(memory_format=torch.channels_last_3d)
        return super().forward(x)


class RMSNorm(nn.Module):
    """x / ||x||_channels * sqrt(C) * gamma (Wan's RMS_norm, no bias). images=True: 4-D input."""

    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones((dim, 1, 1) if images else (dim, 1, 1, 1)))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1) * self.scale * self.gamma


def _frames(fn, x: Tensor) -> Tensor:
    """Apply a 2-D op to every frame of BCTHW x."""
    b, t = x.shape[0], x.shape[2]
    y = fn(channels_last(x.transpose(1, 2).flatten(0, 1)))
    return y.unflatten(0, (b, t)).transpose(1, 2)


def _call(layer: nn.Module, x: Tensor, cache: Cache) -> Tensor:
    return layer(x, cache) if isinstance(layer, (CausalConv3d, ResidualBlock, Resample, AttentionBlock)) else layer(x)


class ResidualBlock(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.residual = nn.Sequential(
            RMSNorm(n_in, images=False), nn.SiLU(), CausalConv3d(n_in, n_out, 3, padding=1),
            RMSNorm(n_out, images=False), nn.SiLU(), nn.Dropout(0.0), CausalConv3d(n_out, n_out, 3, padding=1),
        )  # fmt: skip
        self.shortcut = CausalConv3d(n_in, n_out, 1) if n_in != n_out else nn.Identity()

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        h = self.shortcut(x)
        for layer in self.residual:
            x = _call(layer, x, cache)
        return x + h


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (no mixing in time)."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def _frame(self, x: Tensor) -> Tensor:  # (M, C, H, W)
        m, c, h, w = x.shape
        qkv = self.to_qkv(self.norm(x)).reshape(m, 1, 3 * c, h * w).transpose(2, 3)  # (M, 1, HW, 3C)
        q, k, v = qkv.contiguous().chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)  # (M, 1, HW, C)
        return x + self.proj(y.squeeze(1).transpose(1, 2).reshape(m, c, h, w))

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        return _frames(self._frame, x)


class Upsample(nn.Upsample):
    """Nearest-exact x2 computed in float32 (bf16 nearest interpolation is not supported everywhere)."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.float()).type_as(x)


class Resample(nn.Module):
    """Spatial x2 up/down (`resample`), optionally temporal x2 (`time_conv`), causal in time.

    upsample3d: frame 0 passes alone; every later frame becomes 2 (time_conv to 2C channels, first
    C channels = earlier frame), so T -> 2T - 1. downsample3d: frame 0 passes alone; frames
    (2j-2, 2j-1, 2j) make output j (stride-2 kernel-3 conv), so 2k+1 -> k+1.
    """

    def __init__(self, dim: int, mode: str):
        super().__init__()
        self.mode = mode
        if mode.startswith("upsample"):
            self.resample = nn.Sequential(Upsample(scale_factor=(2.0, 2.0), mode="nearest-exact"), nn.Conv2d(dim, dim // 2, 3, padding=1))
        elif mode.startswith("downsample"):
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        else:
            raise ValueError(f"unknown resample mode {mode!r}")
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=0)

    def _time_up(self, x: Tensor, cache: Cache) -> Tensor:
        first = None
        if self not in cache:  # frame 0 of the stream: no temporal mixing, one frame out
            cache[self] = True
            first, x = x[:, :, :1], x[:, :, 1:]
        if x.shape[2]:
            y = self.time_conv(x, cache)  # (B, 2C, t, H, W), causal over frames 1..
            b, c2, t, h, w = y.shape
            y = y.reshape(b, 2, c2 // 2, t, h, w).permute(0, 2, 3, 1, 4, 5).reshape(b, c2 // 2, 2 * t, h, w)
            x = y
        return x if first is None else torch.cat([first, x], 2)

    def _time_down(self, x: Tensor, cache: Cache) -> Tensor:
        pending = cache.get(self)
        first = None
        if pending is None:  # stream start: frame 0 passes alone and anchors the first window
            first = x[:, :, :1]
        else:
            x = torch.cat([pending, x], 2)
        windows = (x.shape[2] - 1) // 2
        cache[self] = x[:, :, 2 * windows :].clone()  # 1 or 2 frames, the next window's start
        parts = [first] if first is not None else []
        if windows:
            parts.append(self.time_conv(x[:, :, : 2 * windows + 1]))
        return torch.cat(parts, 2) if parts else x[:, :, :0]

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        if self.mode == "upsample3d":
            x = self._time_up(x, cache)
        if x.shape[2]:
            x = _frames(self.resample, x)
        if self.mode == "downsample3d" and x.shape[2]:
            x = self._time_down(x, cache)
        return x


class Encoder3d(nn.Module):
    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv1 = CausalConv3d(3, dims[0], 3, padding=1)
        blocks: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                blocks.append(ResidualBlock(n_in, n_out))
                n_in = n_out
            if i != len(cfg.dim_mult) - 1:
                blocks.append(Resample(n_out, "downsample3d" if cfg.temporal_downsample[i] else "downsample2d"))
        self.downsamples = nn.Sequential(*blocks)
        self.middle = nn.Sequential(ResidualBlock(n_out, n_out), AttentionBlock(n_out), ResidualBlock(n_out, n_out))
        self.head = nn.Sequential(RMSNorm(n_out, images=False), nn.SiLU(), CausalConv3d(n_out, 2 * cfg.z_dim, 3, padding=1))

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        x = self.conv1(x, cache)
        for layer in (*self.downsamples, *self.middle, *self.head):
            x = _call(layer, x, cache)
            if x.shape[2] == 0:  # a temporal downsample is waiting for more frames
                return x
        return x


class Decoder3d(nn.Module):
    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        mult = cfg.dim_mult
        dims = [cfg.base_dim * m for m in (mult[-1], *mult[::-1])]
        temporal_upsample = cfg.temporal_downsample[::-1]
        self.conv1 = CausalConv3d(cfg.z_dim, dims[0], 3, padding=1)
        self.middle = nn.Sequential(ResidualBlock(dims[0], dims[0]), AttentionBlock(dims[0]), ResidualBlock(dims[0], dims[0]))
        blocks: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(dims[:-1], dims[1:])):
            if i > 0:
                n_in //= 2  # the previous upsample's conv halves the channels
            for _ in range(cfg.num_res_blocks + 1):
                blocks.append(ResidualBlock(n_in, n_out))
                n_in = n_out
            if i != len(mult) - 1:
                blocks.append(Resample(n_out, "upsample3d" if temporal_upsample[i] else "upsample2d"))
        self.upsamples = nn.Sequential(*blocks)
        self.head = nn.Sequential(RMSNorm(n_out, images=False), nn.SiLU(), CausalConv3d(n_out, 3, 3, padding=1))

    def forward(self, x: Tensor, cache: Cache) -> Tensor:
        x = self.conv1(x, cache)
        for layer in (*self.middle, *self.upsamples, *self.head):
            x = _call(layer, x, cache)
        return x


def _ramp(n_out: int, overlap: int, left: bool, right: bool) -> Tensor:
    """1-D blending weights: linear ramps over `overlap` samples at interior tile edges, 1 elsewhere."""
    w = torch.ones(n_out)
    if overlap > 0:
        r = torch.arange(1, overlap + 1, dtype=torch.float32) / (overlap + 1)
        if left:
            w[:overlap] = r
        if right:
            w[-overlap:] = r.flip(0)
    return w


def _starts(size: int, tile: int, stride: int) -> list[int]:
    if size <= tile:
        return [0]
    starts = list(range(0, size - tile + 1, stride))
    return starts if starts[-1] + tile >= size else starts + [size - tile]


def tiled(fn, x: Tensor, tile: tuple[int, int], stride: tuple[int, int], scale: float) -> Tensor:
    """Apply fn to overlapping spatial tiles of BCTHW x and blend (weights sum to 1 everywhere).

    tile and stride are (h, w) in x's units; fn maps a tile of size (h, w) to (h*scale, w*scale).
    """
    (th, tw), (sh, sw) = tile, stride
    if sh > th or sw > tw or sh < 1 or sw < 1:
        raise AlayaError(f"tiling: stride {stride} must be between 1 and the tile size {tile}")
    H, W = x.shape[-2:]
    ys, xs = _starts(H, th, sh), _starts(W, tw, sw)
    out = weight = None
    for y0 in ys:
        for x0 in xs:
            y = fn(x[..., y0 : y0 + th, x0 : x0 + tw])
            oh, ow = y.shape[-2:]
            oy, ox = round(y0 * scale), round(x0 * scale)
            ov_h, ov_w = round((th - sh) * scale), round((tw - sw) * scale)
            wy = _ramp(oh, min(ov_h, oh), y0 > 0, y0 + th < H)
            wx = _ramp(ow, min(ov_w, ow), x0 > 0, x0 + tw < W)
            wgt = (wy[:, None] * wx[None, :]).to(y.device, torch.float32)
            if out is None:
                shape = (*y.shape[:-2], round(H * scale), round(W * scale))
                out = torch.zeros(shape, dtype=torch.float32, device=y.device)
                weight = torch.zeros(shape[-2:], dtype=torch.float32, device=y.device)
            out[..., oy : oy + oh, ox : ox + ow] += y.float() * wgt
            weight[oy : oy + oh, ox : ox + ow] += wgt
    return (out / weight).to(x.dtype if x.is_floating_point() else torch.float32)


class WanVAE(nn.Module):
    """Wan2.1 VAE. encode: video BCTHW [-1,1] -> normalized latents; decode: the inverse, clamped.

    chunk (frames for encode, latents for decode) bounds memory; None = whole clip at once.
    tile = ((h, w), (stride_h, stride_w)) in latent units enables spatial tiling (DiffSynth's
    defaults for 480x832 are ((30, 52), (15, 26))).
    """

    def __init__(self, cfg: WanVAEConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder3d(cfg)
        self.conv1 = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1)
        self.conv2 = CausalConv3d(cfg.z_dim, cfg.z_dim, 1)
        self.decoder = Decoder3d(cfg)

    @property
    def _param(self) -> Tensor:
        return next(self.parameters())

    def _encode(self, video: Tensor, chunk: int | None) -> Tensor:
        cache: Cache = {}
        t = video.shape[2]
        spans = [(0, t)] if chunk is None else [(0, 1)] + [(a, min(a + chunk, t)) for a in range(1, t, chunk)]
        outs = [self.encoder(video[:, :, a:b], cache) for a, b in spans]
        mu = self.conv1(torch.cat([o for o in outs if o.shape[2]], 2))[:, : self.config.z_dim]
        return normalize(mu)

    def _decode(self, z: Tensor, chunk: int | None) -> Tensor:
        x = self.conv2(denormalize(z))
        cache: Cache = {}
        step = x.shape[2] if chunk is None else chunk
        outs = [self.decoder(x[:, :, a : a + step], cache) for a in range(0, x.shape[2], step)]
        return torch.cat(outs, 2).clamp(-1, 1)

    @torch.no_grad()
    def encode(self, video: Tensor, chunk: int | None = 4, tile=None) -> Tensor:
        """video (B, 3, T, H, W) in [-1, 1], H, W multiples of 8 -> latents (B, 16, (T-1)//4+1, H/8, W/8)."""
        if video.ndim != 5 or video.shape[1] != 3:
            raise AlayaError(f"Wan VAE encode: expected video (B, 3, T, H, W), got {tuple(video.shape)}")
        if video.shape[-2] % 8 or video.shape[-1] % 8:
            raise AlayaError(f"Wan VAE encode: frame size {tuple(video.shape[-2:])} must be a multiple of 8")
        usable = 4 * (latent_frames(video.shape[2]) - 1) + 1  # Wan encodes frames 0 .. 4k only
        video = video[:, :, :usable].to(self._param.device, self._param.dtype)
        if tile is None:
            return self._encode(video, chunk)
        (th, tw), (sh, sw) = tile
        return tiled(lambda v: self._encode(v, chunk), video, (8 * th, 8 * tw), (8 * sh, 8 * sw), 1 / 8)

    @torch.no_grad()
    def decode(self, latents: Tensor, chunk: int | None = 1, tile=None) -> Tensor:
        """latents (B, 16, T', h, w), normalized -> video (B, 3, 4T'-3, 8h, 8w) in [-1, 1]."""
        if latents.ndim != 5 or latents.shape[1] != self.config.z_dim:
            raise AlayaError(
                f"Wan VAE decode: expected latents (B, {self.config.z_dim}, T, h, w), got {tuple(latents.shape)}"
            )
        z = latents.to(self._param.device, self._param.dtype)
        if tile is None:
            return self._decode(z, chunk)
        return tiled(lambda t: self._decode(t, chunk), z, tile[0], tile[1], 8)


def build(cfg: WanVAEConfig) -> WanVAE:
    return WanVAE(cfg)


def parameter_count(cfg: WanVAEConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in WanVAE(cfg).parameters())

