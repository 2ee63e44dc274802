"""Wan2.1 DiT in plain PyTorch, with Wan-native parameter names, in three attention modes.

Layouts: latents BCTHW (T = latent frames); tokens are flattened in (frame, row, column) order,
so a latent frame is a contiguous run of `tokens_per_frame` tokens. Timesteps t are in [0, 1000]
(t = 1000 * sigma), either one per sample (B,) or one per latent frame (B, T). The network
predicts flow velocity v = noise - x0 for the first `out_dim` channels.

Modes, one module set:
- bidirectional (teacher): full attention over the window: `model(x, t, prompt)`.
- block-causal (student, whole sequence): full attention inside a chunk of `chunk_frames`
  latent frames, causal across chunks: `model(x, t, prompt, chunk_frames=3)`.
- cached (student, streaming): one chunk at a time against a rolling KV cache
  (model_zoo/kv_cache.py): `model(x, t, prompt, cache=cache, start_frame=f)`.

Numerics follow Wan2.1 (Wan-Video/Wan2.1 wan/modules/model.py): the residual stream,
normalisations, time embedding, modulation and head run in float32; the large linears and the
attention run in the weights' dtype (bf16 by default on CPU).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .convert import to_wan
from .errors import AlayaError
from .fused import linear_gelu
from .kv_cache import KVCache
from .loading import load_strict, read_metadata, read_shapes, save_safetensors
from .precision import preferred_dtype


UMT5_DIM, WAN_TEXT_LEN = 4096, 512  # Wan2.1's prompt: umT5-XXL output, zero-padded to 512 tokens


@dataclass(frozen=True)
class DiTConfig:
    """Size of a Wan2.1 DiT. Defaults are the AlayaRenderer teacher (Wan2.1-T2V-1.3B, 96 in)."""

    in_dim: int = 96  # 16 noisy-latent + 5 x 16 G-buffer latent channels (albedo..roughness)
    out_dim: int = 16  # predicted velocity channels (the RGB latent)
    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256  # width of the sinusoidal timestep embedding
    text_dim: int = 4096  # width of the text encoder's output (umT5-XXL: 4096)
    # Context length the prompt is zero-padded to before text_embedding (Wan: umT5's 512 tokens,
    # padding attended to, no mask); 0: the tokens as given (the MiniLM models' one pooled token).
    text_len: int = 0
    num_heads: int = 12
    num_layers: int = 30
    patch_size: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    rope_positions: int = 1024  # RoPE table length per axis in Wan; absolute positions stop here
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def cond_dim(self) -> int:
        """Conditioning channels concatenated after the noisy latent (80 for the G-buffers)."""
        return self.in_dim - self.out_dim

    def validate(self) -> "DiTConfig":
        if self.dim % self.num_heads:
            raise AlayaError(f"DiTConfig: dim {self.dim} is not divisible by num_heads {self.num_heads}")
        d = self.head_dim
        if d % 2 or (d - 4 * (d // 6)) % 2:
            raise AlayaError(f"DiTConfig: head dim {d} cannot be split into 3 even RoPE axes")
        if self.text_len < 0:
            raise AlayaError(f"DiTConfig: text_len {self.text_len} must be >= 0 (0: the tokens as given)")
        return self


CONFIGS: dict[str, DiTConfig] = {
    # The released AlayaRenderer checkpoint (model.md §1.5): 825 tensors, 1,419,488,320 params.
    "alayarenderer-teacher": DiTConfig(text_len=512),
    # Stock Wan2.1-T2V-1.3B (text-to-video, no conditioning channels).
    "wan2.1-t2v-1.3b": DiTConfig(in_dim=16, text_len=512),
    # Small enough to run 256x256 (256 tokens per latent frame) on a 2-core CPU; MiniLM-sized text.
    "dit-small": DiTConfig(dim=384, ffn_dim=1536, freq_dim=256, text_dim=384, num_heads=6, num_layers=6),
    # For tests: every code path, milliseconds per pass.
    "dit-tiny": DiTConfig(dim=32, ffn_dim=64, freq_dim=32, text_dim=16, num_heads=2, num_layers=2),
}


def build(config: DiTConfig) -> "WanDiT":
    return WanDiT(config)


# Other namings -> Wan-native, applied on load and by `model identify` (state dicts or shape dicts).
convert_names = to_wan


def infer_config(shapes: Mapping[str, tuple[int, ...]]) -> DiTConfig:
    """The DiTConfig implied by Wan-native key shapes (as ComfyUI's model_detection does).

    num_heads is not visible in shapes: taken from a named config of the same width, else
    dim // 128 (Wan's head size).
    """
    try:
        dim = shapes["head.modulation"][-1]
        patch = tuple(shapes["patch_embedding.weight"][2:])
        cfg = dict(
            in_dim=shapes["patch_embedding.weight"][1],
            out_dim=shapes["head.head.weight"][0] // math.prod(patch),
            dim=dim,
            ffn_dim=shapes["blocks.0.ffn.0.weight"][0],
            freq_dim=shapes["time_embedding.0.weight"][1],
            text_dim=shapes["text_embedding.0.weight"][1],
            num_layers=len({k.split(".")[1] for k in shapes if k.startswith("blocks.")}),
            patch_size=patch,
        )
    except (KeyError, IndexError) as err:
        raise AlayaError(f"not a Wan DiT state dict: key {err} is missing or mis-shaped") from None
    heads = [c.num_heads for c in CONFIGS.values() if c.dim == dim]
    text_len = WAN_TEXT_LEN if cfg["text_dim"] == UMT5_DIM else 0  # umT5 context: Wan pads it to 512
    return DiTConfig(num_heads=heads[0] if heads else max(1, dim // 128), text_len=text_len, **cfg)


def save(model: "WanDiT", path, name: str | None = None) -> Path:
    """Save Wan-native weights with the config in the metadata (atomic)."""
    meta = {"family": "dit", "config": asdict(model.config)}
    if name:
        meta["config_name"] = name
    return save_safetensors(model.state_dict(), path, meta)


def config_of_file(path) -> DiTConfig:
    """The config stored in a file's metadata, else the one its shapes imply."""
    meta = read_metadata(path)
    if "config" in meta:
        try:
            raw = json.loads(meta["config"])
            raw["patch_size"] = tuple(raw.get("patch_size", (1, 2, 2)))
            return DiTConfig(**raw)
        except (ValueError, TypeError) as err:
            raise AlayaError(f"{path}: metadata 'config' is not a DiT config ({err})") from None
    return infer_config(convert_names(read_shapes(path)))


def load(path, config: DiTConfig | None = None, *, device="cpu", dtype: torch.dtype | None = None) -> "WanDiT":
    """Load a DiT from a safetensors file (Wan-native or diffusers names), strictly.

    Built on the meta device in the target dtype (default: precision.preferred_dtype(device),
    bf16 where the hardware runs it fast), so weights are read once and never held twice.
    The config comes from `config`, else the file's metadata, else its shapes.
    """
    config = config or config_of_file(path)
    dtype = dtype or preferred_dtype(device)
    with torch.device("meta"):
        model = WanDiT(config).to(dtype)
    load_strict(model, path, convert=convert_names)
    return model.to(device)


# ---------------------------------------------------------------- small pieces


class RMSNorm(nn.Module):
    """RMS norm over the last dim, computed in float32 (Wan's WanRMSNorm); `weight` is the key."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype) * self.weight


def _linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Run a linear layer in its weights' dtype (the float32 residual stream is cast down)."""
    return F.linear(x.to(layer.weight.dtype), layer.weight, layer.bias)


def _linear_f32(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Run a (small) linear layer in float32, as Wan does under autocast(float32)."""
    bias = layer.bias.float() if layer.bias is not None else None
    return F.linear(x.float(), layer.weight.float(), bias)


def sinusoidal_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's timestep embedding: [cos, sin] of t * 10000^(-i/half), in float64. (...,) -> (..., dim)."""
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    angles = t.to(torch.float64)[..., None] * freqs
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def rope_axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Real dims per RoPE axis (frame, row, column); 128 -> (44, 42, 42) as in Wan."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def rope_angles(
    frames: torch.Tensor, rows: int, cols: int, head_dim: int, theta: float, device=None
) -> torch.Tensor:
    """Rotation angles (N, head_dim/2) for tokens in (frame, row, column) order, in float32.

    frames: (F,) integer latent-frame positions. Each axis i has its own frequencies
    theta^(-2j/d_i) (Wan's rope_params); the angle pairs act on interleaved (even, odd) dims.
    """
    dims = rope_axis_dims(head_dim)

    def axis(pos: torch.Tensor, d: int) -> torch.Tensor:
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
        return (pos.to(torch.float64, copy=False)[:, None].to(device) * inv).float()

    a_f = axis(frames, dims[0])  # (F, d0/2)
    a_h = axis(torch.arange(rows), dims[1])  # (H, d1/2)
    a_w = axis(torch.arange(cols), dims[2])  # (W, d2/2)
    n_f = a_f.shape[0]
    return torch.cat(
        [
            a_f[:, None, None].expand(n_f, rows, cols, -1),
            a_h[None, :, None].expand(n_f, rows, cols, -1),
            a_w[None, None, :].expand(n_f, rows, cols, -1),
        ],
        dim=-1,
    ).reshape(n_f * rows * cols, head_dim // 2)


@functools.lru_cache(maxsize=32)
def rope_freqs(first: int, frames: int, rows: int, cols: int, head_dim: int, theta: float, device: str) -> torch.Tensor:
    """Unit complex rotations (N, head_dim/2) for frames first..first+frames-1; memoised (a stream repeats them)."""
    angles = rope_angles(torch.arange(first, first + frames), rows, cols, head_dim, theta, device=device)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x (B, heads, N, D) by complex freqs (N, D/2).

    In float32 (Wan rotates in float64; the difference is far below bf16 resolution).
    """
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * freqs).flatten(-2).to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention on (B, heads, N, D) tensors: xformers on CUDA when installed, else SDPA.

    mask: boolean (Nq, Nk), True where a query may attend.
    """
    if mask is None and q.is_cuda:
        try:
            import xformers.ops as xops
        except ImportError:
            xops = None
        if xops is not None:  # xformers takes (B, N, heads, D)
            out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ---------------------------------------------------------------- prompt context


@dataclass
class PromptContext:
    """A prompt, prepared once: per-block cross-attention keys and values.

    Made by `WanDiT.prepare_prompt(prompt_emb)`. Everything that depends on the prompt lives
    here, so a prompt change recomputes exactly this (see docs/model.md).
    """

    keys: list[torch.Tensor] = field(default_factory=list)  # per block (B, heads, L_text, head_dim)
    values: list[torch.Tensor] = field(default_factory=list)

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]


# ---------------------------------------------------------------- attention and blocks


class _Attention(nn.Module):
    """The projections both attentions have, RMS-normed q/k over the full dim. Keys: q k v o norm_q norm_k."""

    def __init__(self, dim: int, num_heads: int, eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, dim) -> (B, heads, N, head_dim)
        return x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)


class SelfAttention(_Attention):
    """Self-attention with RMS-normed q/k (over the full dim) and 3-axis RoPE. Keys: q k v o norm_q norm_k."""

    def forward(self, x: torch.Tensor, rope, mask=None, cache: KVCache | None = None, layer: int = 0, key_rope=None):
        """x (B, N, dim) float32 -> (B, N, dim).

        rope: complex rotations for the tokens' own positions. With a cache in absolute mode keys are
        stored rotated; in relative mode they are stored raw and rotated on read by key_rope
        (positions 0.. over the cache contents, so they stay bounded however long the stream).
        """
        q = apply_rope(self._heads(self.norm_q(_linear(self.q, x))), rope)
        k = self._heads(self.norm_k(_linear(self.k, x)))
        v = self._heads(_linear(self.v, x))
        if cache is None:
            out = attention(q, apply_rope(k, rope), v, mask)
        elif cache.rope == "absolute":
            out = attention(q, *cache.update(layer, apply_rope(k, rope), v))
        else:
            k_all, v_all = cache.update(layer, k, v)
            if k_all.requires_grad:  # training through the cache: rotate the live keys
                k_all = apply_rope(k_all, key_rope)
            else:
                k_all = cache.rotated_keys(layer, lambda keys, first: apply_rope(keys, key_rope[first:first + keys.shape[2]]))
            out = attention(q, k_all, v_all)
        return _linear(self.o, out.transpose(1, 2).flatten(2))


class CrossAttention(_Attention):
    """Attention from the tokens to the prompt's tokens (no mask, as Wan T2V). Keys as SelfAttention."""

    def prompt_kv(self, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedded text (B, L, dim) -> keys, values (B, heads, L, head_dim)."""
        return self._heads(self.norm_k(_linear(self.k, text))), self._heads(_linear(self.v, text))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = self._heads(self.norm_q(_linear(self.q, x)))
        return _linear(self.o, attention(q, k, v).transpose(1, 2).flatten(2))

    def single_key(self, v: torch.Tensor) -> torch.Tensor:
        """The output for a prompt of one token (a pooled embedding, text_len 1): softmax over one key
        is exactly 1, so every query reads v and the output is o(v) for all of them, (B, 1, dim)."""
        return _linear(self.o, v.transpose(1, 2).flatten(2))


def _modulation(rows: int, dim: int) -> nn.Parameter:
    """A (1, rows, dim) modulation table, random / sqrt(dim). Built on the meta device (to receive
    loaded weights) it is only allocated: a random or divided meta tensor runs torch's Python meta
    kernels, whose first use imports sympy and torch._dynamo (about 1 s of CPU in every process that
    loads a model)."""
    if torch.get_default_device().type == "meta":
        return nn.Parameter(torch.empty(1, rows, dim))
    return nn.Parameter(torch.randn(1, rows, dim) / dim**0.5)


class Block(nn.Module):
    """One Wan block: modulated self-attention, cross-attention (affine norm3, no gate), modulated FFN."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.eps = cfg.eps
        self.self_attn = SelfAttention(cfg.dim, cfg.num_heads, cfg.eps)
        self.cross_attn = CrossAttention(cfg.dim, cfg.num_heads, cfg.eps)
        self.norm3 = nn.LayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=True)
        self.ffn = nn.Sequential(nn.Linear(cfg.dim, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, cfg.dim))
        self.modulation = _modulation(6, cfg.dim)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:  # norm1 / norm2: no affine parameters
        return F.layer_norm(x, x.shape[-1:], eps=self.eps)

    def forward(self, x, t_mod, frames: int, rope, prompt_kv, mask=None, cache=None, layer=0, key_rope=None):
        """x (B, N, dim) float32; t_mod (B, F or 1, 6, dim) float32 per latent frame."""
        shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = (self.modulation.float()[:, None] + t_mod).unbind(2)

        def modulate(h, shift, scale):  # per-frame modulation: view tokens as (B, F, tokens/frame, dim)
            return (h.unflatten(1, (frames, -1)) * (1 + scale[:, :, None]) + shift[:, :, None]).flatten(1, 2)

        def gated(h, gate):
            return (h.float().unflatten(1, (frames, -1)) * gate[:, :, None]).flatten(1, 2)

        y = self.self_attn(modulate(self._norm(x), shift_sa, scale_sa), rope, mask, cache, layer, key_rope)
        x = x + gated(y, gate_sa)
        if prompt_kv[0].shape[2] == 1 and not torch.is_grad_enabled():  # one prompt token: no query needed
            x = x + self.cross_attn.single_key(prompt_kv[1]).float()
        else:
            x = x + self.cross_attn(F.layer_norm(x, x.shape[-1:], self.norm3.weight.float(), self.norm3.bias.float(),
                                                 self.eps), *prompt_kv).float()
        h = modulate(self._norm(x), shift_ff, scale_ff)
        y = _linear(self.ffn[2], linear_gelu(h.to(self.ffn[0].weight.dtype), self.ffn[0]))
        return x + gated(y, gate_ff)


class Head(nn.Module):
    """Output head: modulated LayerNorm then a linear to prod(patch) * out_dim. Keys: head, modulation."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.eps = cfg.eps
        self.head = nn.Linear(cfg.dim, math.prod(cfg.patch_size) * cfg.out_dim)
        self.modulation = _modulation(2, cfg.dim)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor, frames: int) -> torch.Tensor:
        """x (B, N, dim); t_emb (B, F or 1, dim) -> (B, N, prod(patch) * out_dim), float32."""
        shift, scale = (self.modulation.float()[:, None] + t_emb[:, :, None]).unbind(2)
        h = F.layer_norm(x, x.shape[-1:], eps=self.eps).unflatten(1, (frames, -1))
        h = (h * (1 + scale[:, :, None]) + shift[:, :, None]).flatten(1, 2)
        return _linear_f32(self.head, h)


# ---------------------------------------------------------------- the model


class WanDiT(nn.Module):
    """The Wan2.1 video DiT. Parameter names and shapes equal the Wan-native checkpoint keys."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        cfg = self.config = config.validate()
        self.patch_embedding = nn.Conv3d(cfg.in_dim, cfg.dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, cfg.dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.dim, cfg.dim))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, cfg.dim), nn.SiLU(), nn.Linear(cfg.dim, cfg.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(cfg.dim, 6 * cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = Head(cfg)

    # -- pieces the sampler and trainer use directly

    def tokens_per_frame(self, height: int, width: int) -> int:
        """Tokens per latent frame of a latent of height x width."""
        _, ph, pw = self.config.patch_size
        return (height // ph) * (width // pw)

    def new_cache(self, batch: int, height: int, width: int, *, window_frames: int, sink_frames: int = 0,
                  rope: str = "relative") -> KVCache:
        """A rolling self-attention cache sized for this model and latent size (see kv_cache.py)."""
        cfg = self.config
        p = next(self.parameters())
        return KVCache(
            num_layers=cfg.num_layers, batch=batch, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
            tokens_per_frame=self.tokens_per_frame(height, width), window_frames=window_frames,
            sink_frames=sink_frames, rope=rope, rope_positions=cfg.rope_positions,
            dtype=p.dtype, device=p.device,
        )

    def prepare_prompt(self, prompt_emb: torch.Tensor) -> PromptContext:
        """Text-encoder output (B, L, text_dim) -> per-block cross-attention K/V (computed once per prompt).

        With config.text_len the tokens are zero-padded to that length first, as Wan does."""
        if prompt_emb.ndim != 3 or prompt_emb.shape[-1] != self.config.text_dim:
            raise AlayaError(
                f"prompt embedding has shape {tuple(prompt_emb.shape)}, expected (batch, tokens, {self.config.text_dim})"
            )
        n, limit = prompt_emb.shape[1], self.config.text_len
        if limit and n > limit:
            raise AlayaError(f"prompt embedding has {n} tokens; this model reads at most {limit} (text_len)")
        if limit and n < limit:  # Wan zero-pads the context and attends to the padding (no mask)
            prompt_emb = F.pad(prompt_emb, (0, 0, 0, limit - n))
        p = next(self.parameters())
        text = prompt_emb.to(p.device)
        text = _linear(self.text_embedding[2], self.text_embedding[1](_linear(self.text_embedding[0], text)))
        ctx = PromptContext()
        for block in self.blocks:
            k, v = block.cross_attn.prompt_kv(text)
            ctx.keys.append(k)
            ctx.values.append(v)
        return ctx

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in_dim, T, H, W) -> tokens (B, N, dim): patch_embedding as one matmul (== its Conv3d)."""
        pt, ph, pw = self.config.patch_size
        b, c, t, h, w = x.shape
        patches = x.reshape(b, c, t // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        weight = self.patch_embedding.weight
        return F.linear(patches.reshape(b, -1, c * pt * ph * pw).to(weight.dtype), weight.flatten(1), self.patch_embedding.bias)

    def unpatchify(self, tokens: torch.Tensor, t: int, h: int, w: int) -> torch.Tensor:
        """(B, N, pt*ph*pw*out_dim) in Wan's (pt, ph, pw, c) order -> (B, out_dim, T, H, W)."""
        pt, ph, pw = self.config.patch_size
        b = tokens.shape[0]
        u = tokens.reshape(b, t, h, w, pt, ph, pw, self.config.out_dim)
        return u.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(b, self.config.out_dim, t * pt, h * ph, w * pw)

    def time_embed(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """t (B,) or (B, F) in [0, 1000] -> t_emb (B, F|1, dim), t_mod (B, F|1, 6, dim), float32."""
        if t.ndim == 1:
            t = t[:, None]
        emb = sinusoidal_embedding(t, self.config.freq_dim).float()
        emb = _linear_f32(self.time_embedding[2], F.silu(_linear_f32(self.time_embedding[0], emb)))
        mod = _linear_f32(self.time_projection[1], F.silu(emb)).unflatten(-1, (6, self.config.dim))
        return emb, mod

    # -- forward

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        prompt: PromptContext | torch.Tensor,
        *,
        chunk_frames: int | None = None,
        cache: KVCache | None = None,
        start_frame: int = 0,
    ) -> torch.Tensor:
        """Predict flow velocity.

        x: (B, in_dim, T, H, W) noisy latent then conditioning latents, channel-concatenated.
        t: (B,) or (B, T) timesteps in [0, 1000] (per latent frame allows mixed noise levels).
        prompt: a PromptContext, or a text embedding (B, L, text_dim) prepared on the fly.
        chunk_frames: block-causal attention with chunks of this many latent frames (None: full).
        cache, start_frame: cached mode; x is the chunk that starts at absolute latent frame
          start_frame. Re-running the same chunk overwrites its slot; a new chunk appends.
        Returns (B, out_dim, T, H, W) velocity, float32.
        """
        cfg = self.config
        if x.ndim != 5 or x.shape[1] != cfg.in_dim:
            raise AlayaError(f"DiT input has shape {tuple(x.shape)}, expected (batch, {cfg.in_dim}, frames, height, width)")
        b, _, frames, height, width = x.shape
        pt, ph, pw = cfg.patch_size
        if frames % pt or height % ph or width % pw:
            raise AlayaError(f"DiT input {frames}x{height}x{width} (frames x height x width) is not divisible by the patch {cfg.patch_size}")
        if cache is not None and chunk_frames is not None:
            raise AlayaError("DiT: give either cache (streaming) or chunk_frames (whole sequence), not both")
        if not isinstance(prompt, PromptContext):
            prompt = self.prepare_prompt(prompt)
        f, h, w = frames // pt, height // ph, width // pw
        t = torch.as_tensor(t, device=x.device)
        if t.ndim == 0:
            t = t.expand(b)
        if t.ndim == 2 and t.shape[1] != frames:
            raise AlayaError(f"DiT timesteps have shape {tuple(t.shape)}, expected ({b},) or ({b}, {frames})")
        t_emb, t_mod = self.time_embed(t[:, ::pt] if t.ndim == 2 else t)

        # 1. positions: absolute latent frames, or (relative cache) the chunk's slot in the cache
        mask, key_rope = None, None
        if cache is not None:
            first = cache.begin(start_frame, f, tokens_per_frame=h * w, batch=b)
            if cache.rope == "relative":
                key_rope = rope_freqs(0, cache.frames, h, w, cfg.head_dim, cfg.rope_theta, str(x.device))
        else:
            first = start_frame
            if first + f > cfg.rope_positions:
                raise AlayaError(f"DiT: latent frame positions up to {first + f} exceed the RoPE table ({cfg.rope_positions})")
            if chunk_frames is not None:
                chunk_of_token = (torch.arange(f, device=x.device) // chunk_frames).repeat_interleave(h * w)
                mask = chunk_of_token[:, None] >= chunk_of_token[None, :]
        rope = rope_freqs(first, f, h, w, cfg.head_dim, cfg.rope_theta, str(x.device))

        # 2. blocks over a float32 residual stream; modulation per latent frame (or one for all)
        tokens = self.patchify(x).float()
        frames_mod = t_emb.shape[1]
        for i, block in enumerate(self.blocks):
            tokens = block(tokens, t_mod, frames_mod, rope, (prompt.keys[i], prompt.values[i]), mask, cache, i, key_rope)
        return self.unpatchify(self.head(tokens, t_emb, frames_mod), f, h, w)
