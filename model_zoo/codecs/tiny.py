"""TAEHV-compatible tiny video codec for Wan2.1 latents (taew2_1 layout), with streaming.

Layer order and nn.Sequential indices follow madebyollin/taehv taehv.py (architecture only; this is
an independent implementation), so a taew2_1 checkpoint loads strictly: keys are `encoder.{i}...`
and `decoder.{i}...` (tests/data/taew2_1.keys.txt lists all 128 of them, 11,315,539 parameters).

Layouts and ranges:
    frames   NTCHW RGB (C=3) in [0, 1]           (encoder input, decoder output)
    latents  BCTHW, 16 channels, normalized Wan space (model_zoo/latents.py), 8x smaller in H and W

Time: the encoder pools 4 frames into 1 latent (two TPool(2)); the decoder grows 1 latent into 4
frames (two TGrow(2)) and drops the first 3 frames of a stream, so T' latents -> 4T'-3 frames.
The encoder pads the end of a clip with copies of its last frame up to a multiple of 4 (81 -> 84
frames -> 21 latents), as TAEHV does.

Every layer is causal in time: MemBlocks see their own input one step earlier (zeros at t=0),
TPool waits for `stride` frames, TGrow emits `stride` frames at once. `run_causal` runs a layer
stack over a chunk of any length with an explicit per-layer state, so a whole clip (one chunk),
fixed-size chunks and one frame at a time give the same frames; `TinyStream` owns that state.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import AlayaError
from .. import fused
from ..fused import REDUCED_PRECISION


@dataclass(frozen=True)
class TinyCodecConfig:
    """Widths of a TAEHV-style codec. Defaults are taew2_1."""

    latent_channels: int = 16
    encoder_width: int = 64
    decoder_widths: tuple[int, int, int, int] = (256, 128, 64, 64)
    image_channels: int = 3

    @property
    def frames_to_trim(self) -> int:
        """Frames dropped at the start of a decoded stream (TGrow strides 1*2*2, minus one)."""
        return 3


CONFIGS: dict[str, TinyCodecConfig] = {
    "taew2_1": TinyCodecConfig(),
    # A narrow decoder for fast CPU previews and tests-at-scale: ~16x fewer MACs than taew2_1.
    "taew-slim": TinyCodecConfig(encoder_width=32, decoder_widths=(64, 32, 16, 16)),
}



def channels_last(x: Tensor) -> Tensor:
    """(M, C, H, W) in channels-last memory when reduced-precision: the fast oneDNN path on CPU (NCHW
    bf16 convolutions measured ~7x slower than channels-last here). float32 stays NCHW, whose
    results do not depend on how many frames share a call (chunked == whole clip, bit for bit)."""
    return x.contiguous(memory_format=torch.channels_last) if x.dtype in REDUCED_PRECISION else x


def reduced_inference(x: Tensor) -> bool:
    """bf16/fp16 without autograd: activations stay channels-last and layers may reorder sums (float32
    keeps one order, so chunked streams equal whole clips bit for bit; training keeps autograd-safe ops)."""
    return x.dtype in REDUCED_PRECISION and not x.requires_grad


def cat_channels_last(tensors: list[Tensor], dim: int) -> Tensor:
    """torch.cat of 4-D tensors into a channels-last result (cat infers NCHW from one-frame inputs)."""
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = torch.empty(shape, dtype=tensors[0].dtype, device=tensors[0].device, memory_format=torch.channels_last)
    return torch.cat(tensors, dim, out=out)


# From this many pixels a frame, a MemBlock's first convolution runs as two (one per input) instead of
# over a concatenated copy: measured in bf16, one thread, 32 channels: at 128x128 1.35 ms against
# 1.56-1.66 ms; at 64x64 0.24 ms against 0.22-0.24 ms (the concatenation is cheap there).
SPLIT_CONV_PIXELS = 128 * 128


def conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    """Soft clamp to (-3, 3): tanh(x / 3) * 3."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """ReLU(conv3(ReLU(conv2(ReLU(conv1([x, past]))))) + skip(x)); past = this block's input one step back.

    groups > 1 runs that many independent blocks as one grouped op: channels are group-major
    (group g owns channels [g*n, (g+1)*n)), and weight rows [g*n_out, (g+1)*n_out) are group g's
    block, the same tensors an ungrouped block of width n would hold.
    """

    def __init__(self, n_in: int, n_out: int, groups: int = 1):
        super().__init__()
        self.groups = groups
        g = groups
        self.conv = nn.Sequential(
            conv(g * n_in * 2, g * n_out, groups=g), nn.ReLU(),
            conv(g * n_out, g * n_out, groups=g), nn.ReLU(),
            conv(g * n_out, g * n_out, groups=g),
        )  # fmt: skip
        self.skip = nn.Conv2d(g * n_in, g * n_out, 1, bias=False, groups=g) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU()

    def join(self, x: Tensor, past: Tensor) -> Tensor:
        """(M, G*C, H, W) x2 -> (M, G*2C, H, W), the input of conv1: [x_g, past_g] per group g."""
        if self.groups == 1:
            return cat_channels_last([x, past], 1) if reduced_inference(x) else torch.cat([x, past], 1)
        return torch.cat([x.unflatten(1, (self.groups, -1)), past.unflatten(1, (self.groups, -1))], 2).flatten(1, 2)

    def forward(self, x: Tensor, past: Tensor) -> Tensor:
        if fused.fusable(x) and self.groups == 1:  # each ReLU and the residual add inside its convolution
            c1, _, c2, _, c3 = self.conv
            if x.shape[-2] * x.shape[-1] >= SPLIT_CONV_PIXELS:
                # conv1 over [x, past] as two convolutions over halves of its weight, the second adding
                # onto the first: no concatenated copy of both inputs (the largest copy left at full size)
                n = x.shape[1]
                h = fused.conv2d(past, c1.weight[:, n:], c1.bias, 1, 1)
                h = fused.conv2d(x, c1.weight[:, :n], None, 1, 1, relu=True, add=h)
            else:
                h = fused.conv(c1, self.join(x, past), relu=True)
            h = fused.conv(c2, h, relu=True)
            return fused.conv(c3, h, relu=True, add=self.skip(x))
        return self.act(self.conv(self.join(x, past)) + self.skip(x))

    def forward_seq(self, x: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor]:
        """x (N, T, C, H, W) -> (y, state); state is the last input frame (N, 1, C, H, W)."""
        n, t = x.shape[:2]
        past = torch.zeros_like(x[:, :1]) if state is None else state
        if t > 1 and n == 1 and reduced_inference(x):
            past = cat_channels_last([past[0], x[0, :-1]], 0).unsqueeze(0)
        elif t > 1:  # (one frame, the stream's usual call, needs no cat)
            past = torch.cat([past, x[:, :-1]], 1)
        y = self(channels_last(x.flatten(0, 1)), channels_last(past.flatten(0, 1))).unflatten(0, (n, t))
        return y, x if t == 1 else x[:, -1:].clone()  # clone: a view would keep the whole chunk alive


class TPool(nn.Module):
    """Merge `stride` consecutive frames: channel-concatenate them (earliest first), then a 1x1 conv.

    groups > 1: independent pools per channel group (group-major channels, as in MemBlock).
    """

    def __init__(self, n_f: int, stride: int, groups: int = 1):
        super().__init__()
        self.stride = stride
        self.groups = groups
        self.conv = nn.Conv2d(groups * n_f * stride, groups * n_f, 1, bias=False, groups=groups)

    def fold(self, x: Tensor) -> Tensor:
        """(N, T, G*C, H, W) with T % stride == 0 -> (N * T / stride, G * stride * C, H, W)."""
        n, t, gc, h, w = x.shape
        x = x.reshape(n * t // self.stride, self.stride, self.groups, gc // self.groups, h, w)
        return x.transpose(1, 2).reshape(n * t // self.stride, self.stride * gc, h, w)

    def forward_seq(self, x: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """x (N, T, C, H, W) -> (y (N, T_out, C, H, W), pending frames (< stride of them) or None)."""
        if x.shape[0] == 1 and reduced_inference(x):
            return self._by_frame(x, state)
        if state is not None:
            x = torch.cat([state, x], 1)
        n, t = x.shape[:2]
        usable = t - t % self.stride
        pending = x[:, usable:].clone() if usable < t else None
        if pending is not None and pending.shape[1] >= self.stride:  # cannot happen; a broken bound must say so
            raise AlayaError(f"TPool memory overflow: {pending.shape[1]} frames for stride {self.stride}")
        if usable == 0:
            return x[:, :0], pending
        y = self.conv(channels_last(self.fold(x[:, :usable])))
        return y.unflatten(0, (n, usable // self.stride)), pending

    def _by_frame(self, x: Tensor, state: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """One stream in reduced precision, frame by frame: the 1x1 conv over `stride` folded frames is
        the sum of one 1x1 conv per frame (weight columns [k*C, (k+1)*C) per group read frame k), so
        no frames are concatenated and folded; at full resolution those copies cost more than the conv
        (G-buffer encoder, bf16). The frames are views of x (channels-last), not copies."""
        frames = ([] if state is None else list(state.unbind(1))) + list(x.unbind(1))
        usable = len(frames) - len(frames) % self.stride
        c = x.shape[2] // self.groups
        w = self.conv.weight
        outs = []
        for j in range(0, usable, self.stride):
            y = None
            for k in range(self.stride):  # the sum rides on each next convolution (fused add)
                y = fused.conv2d(channels_last(frames[j + k]), w[:, k * c:(k + 1) * c],
                                 self.conv.bias if k == 0 else None, self.conv.stride, self.conv.padding,
                                 self.groups, add=y)
            outs.append(y)
        left = frames[usable:]
        # pending frames: x itself when it is the one frame left, else a copy (a view would keep x alive)
        pending = None if not left else x if len(left) == x.shape[1] == 1 else torch.stack(left, 1)
        if not outs:
            return x[:, :0], pending
        return cat_channels_last(outs, 0).unsqueeze(0), pending


class PooledConv(TPool):
    """A TPool and the convolution after it, as one convolution over the pooled frames (inference
    copies of an encoder, `fold_pools`). Both are linear and the pool has no bias, so
    conv(pool(x_1..x_s)) = conv'(x_1..x_s) with conv' = conv o pool: a 3x3 (strided) kernel over
    stride * C channels, zero padding included. The full-resolution 1x1 pool, a pass over the
    encoder's largest activations that took 28% of the G-buffer encoder's time (bf16, 256x256, one
    thread), disappears into the strided convolution. Results equal the two layers' up to rounding."""

    def __init__(self, pool: TPool, after: nn.Conv2d):
        nn.Module.__init__(self)
        if pool.groups != 1 or after.groups != 1:
            raise AlayaError("PooledConv: grouped layers are not folded")
        self.stride, self.groups = pool.stride, 1
        wp = pool.conv.weight.detach().float()[:, :, 0, 0]  # (C, stride * C): pooled channel <- frames' channels
        wa = after.weight.detach().float()  # (O, C, kh, kw)
        self.conv = nn.Conv2d(wp.shape[1], wa.shape[0], wa.shape[2:], stride=after.stride, padding=after.padding,
                              bias=after.bias is not None, device=wa.device)
        with torch.no_grad():
            self.conv.weight.copy_(torch.einsum("ojhw,ji->oihw", wa, wp))
            if after.bias is not None:
                self.conv.bias.copy_(after.bias)
        self.conv.to(dtype=after.weight.dtype, memory_format=torch.channels_last)
        self.requires_grad_(False)


def fold_pools(stack: nn.Sequential) -> nn.Sequential:
    """An inference copy of a causal stack with every (TPool, Conv2d) pair folded into a PooledConv
    (the conv's place keeps an Identity, so layer indices, and the stream state keyed by them, stay)."""
    layers = list(stack)
    for i in range(len(layers) - 1):
        pool, after = layers[i], layers[i + 1]
        if type(pool) is TPool and isinstance(after, nn.Conv2d) and pool.groups == 1 and after.groups == 1:
            layers[i], layers[i + 1] = PooledConv(pool, after), nn.Identity()
    return nn.Sequential(*layers)


class TGrow(nn.Module):
    """Split each frame into `stride` frames: a 1x1 conv to stride * C channels, earliest frame first."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward_seq(self, x: Tensor, state: None) -> tuple[Tensor, None]:
        n, t, c, h, w = x.shape
        if reduced_inference(x) and self.stride > 1:
            # one 1x1 conv per output frame (weight rows [kC, (k+1)C)), each written channels-last and
            # joined once in frame order: splitting one channels-last output's channels into frames
            # would copy it twice (the frames' channels are interleaved pixel by pixel)
            xs = channels_last(x.flatten(0, 1))
            outs = [fused.conv2d(xs, self.conv.weight[k * c:(k + 1) * c]) for k in range(self.stride)]
            frames = [o[m:m + 1] for m in range(n * t) for o in outs]
            return cat_channels_last(frames, 0).unflatten(0, (n, t * self.stride)), None
        y = self.conv(channels_last(x.flatten(0, 1)))  # (M, s*C, H, W): frame k = channels [kC, (k+1)C)
        return y.unflatten(1, (self.stride, c)).flatten(0, 1).unflatten(0, (n, t * self.stride)), None


def run_causal(layers: nn.Sequential, x: Tensor, state: dict[int, Tensor | None], start: int = 0,
               stop: int | None = None) -> Tensor:
    """Run a causal layer stack over a chunk x (N, T, C, H, W), updating `state` (layer index -> memory).

    An empty dict is a fresh stream. Returns (N, T_out, C', H', W'); T_out may be 0 while a TPool
    waits for more frames. Per-frame layers run on all frames of the chunk at once.
    start, stop: run only layers[start:stop] (a stateless head can be run once for repeated frames).
    """
    applied = False  # the next layer was already applied with this one
    for i, layer in enumerate(layers):
        if i < start or (stop is not None and i >= stop):
            continue
        if x.shape[1] == 0:
            break
        if applied:  # a ReLU fused into the convolution before it, or a TGrow run before its upsampling
            applied = False
            continue
        if isinstance(layer, nn.Upsample) and i + 1 < len(layers) and isinstance(layers[i + 1], TGrow) \
                and layer.mode == "nearest" and reduced_inference(x):
            # TGrow (a 1x1 conv) first, on 4x fewer pixels: nearest upsampling repeats pixels, and a
            # per-pixel conv of repeated pixels is the repeated conv (the same values, in any order)
            x, _ = layers[i + 1].forward_seq(x, None)
            x = layer(channels_last(x.flatten(0, 1))).unflatten(0, x.shape[:2])
            applied = True
        elif hasattr(layer, "forward_seq"):
            x, state[i] = layer.forward_seq(x, state.get(i))
        elif isinstance(layer, nn.Conv2d):
            applied = i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU)
            x = fused.conv(layer, channels_last(x.flatten(0, 1)), relu=applied).unflatten(0, x.shape[:2])
        else:
            x = layer(channels_last(x.flatten(0, 1))).unflatten(0, x.shape[:2])
    return x


def build_encoder(cfg: TinyCodecConfig) -> nn.Sequential:
    """TAEHV encoder: frames (N, T, 3, H, W) in [0, 1] -> latents (N, T/4, 16, H/8, W/8)."""
    w = cfg.encoder_width
    return nn.Sequential(
        conv(cfg.image_channels, w), nn.ReLU(),
        TPool(w, 2), conv(w, w, stride=2, bias=False), MemBlock(w, w), MemBlock(w, w), MemBlock(w, w),
        TPool(w, 2), conv(w, w, stride=2, bias=False), MemBlock(w, w), MemBlock(w, w), MemBlock(w, w),
        TPool(w, 1), conv(w, w, stride=2, bias=False), MemBlock(w, w), MemBlock(w, w), MemBlock(w, w),
        conv(w, cfg.latent_channels),
    )  # fmt: skip


def build_decoder(cfg: TinyCodecConfig) -> nn.Sequential:
    """TAEHV decoder: latents (N, T', 16, h, w) -> frames (N, 4T', 3, 8h, 8w), before clamp and trim."""
    w0, w1, w2, w3 = cfg.decoder_widths
    return nn.Sequential(
        Clamp(), conv(cfg.latent_channels, w0), nn.ReLU(),
        MemBlock(w0, w0), MemBlock(w0, w0), MemBlock(w0, w0),
        nn.Upsample(scale_factor=2), TGrow(w0, 1), conv(w0, w1, bias=False),
        MemBlock(w1, w1), MemBlock(w1, w1), MemBlock(w1, w1),
        nn.Upsample(scale_factor=2), TGrow(w1, 2), conv(w1, w2, bias=False),
        MemBlock(w2, w2), MemBlock(w2, w2), MemBlock(w2, w2),
        nn.Upsample(scale_factor=2), TGrow(w2, 2), conv(w2, w3, bias=False),
        nn.ReLU(), conv(w3, cfg.image_channels),
    )  # fmt: skip


class TinyCodec(nn.Module):
    """TAEHV-style encoder + decoder. Whole-clip methods here; streaming in TinyStream.

    encode(frames NTCHW [0,1]) -> latents BCTHW (normalized Wan space)
    decode(latents BCTHW)      -> frames NTCHW [0,1], 4T'-3 of them
    chunk=k runs the same causal stack k latents (decode) or 4k frames (encode) at a time, with
    memory bounded by the chunk instead of the clip; the frames are the same.
    """

    def __init__(self, cfg: TinyCodecConfig):
        super().__init__()
        self.config = cfg
        self.encoder = build_encoder(cfg)
        self.decoder = build_decoder(cfg)

    def _check(self, x: Tensor, what: str, dim: int, channels: int) -> None:
        if x.ndim != 5 or x.shape[dim] != channels:
            raise AlayaError(
                f"tiny codec {what}: expected a 5-D tensor with {channels} channels on dim {dim}, got {tuple(x.shape)}"
            )

    def new_stream(self) -> "TinyStream":
        """A stream over this codec (a compiled decoder, model_zoo/runtime, offers the same method)."""
        return TinyStream(self)

    def encode(self, frames: Tensor, chunk: int | None = None) -> Tensor:
        """frames (N, T, 3, H, W) in [0, 1], H and W multiples of 8 -> latents (N, 16, ceil(T/4), H/8, W/8)."""
        self._check(frames, "encode input (NTCHW frames)", 2, self.config.image_channels)
        stream = TinyStream(self)
        step = frames.shape[1] if chunk is None else 4 * chunk
        outs = [stream.encode(frames[:, i : i + step]) for i in range(0, frames.shape[1], step)]
        outs.append(stream.flush())
        return torch.cat([o for o in outs if o is not None], 2)

    def decode(self, latents: Tensor, chunk: int | None = None) -> Tensor:
        """latents (N, 16, T', h, w) -> frames (N, 4T' - 3, 3, 8h, 8w) in [0, 1]."""
        self._check(latents, "decode input (BCTHW latents)", 1, self.config.latent_channels)
        stream = TinyStream(self)
        step = latents.shape[2] if chunk is None else chunk
        outs = [stream.decode(latents[:, :, i : i + step]) for i in range(0, latents.shape[2], step)]
        return torch.cat([o for o in outs if o is not None], 1)


class TinyStream:
    """All per-stream memory of a TinyCodec: decode one latent (or chunk) at a time, exactly.

        stream = TinyStream(codec)
        for z in latent_chunks:              # (N, 16, h, w) or (N, 16, t, h, w)
            frames = stream.decode(z)        # (N, k, 3, 8h, 8w) in [0, 1], or None (nothing ready)

        for f in frames:                     # (N, 3, H, W) or (N, t, 3, H, W)
            z = stream.encode(f)             # (N, 16, k, H/8, W/8) once 4 frames are in, else None
        z = stream.flush()                   # pads with the last frame, returns the rest or None

    Memory is bounded: one frame per MemBlock and < stride frames per TPool, whatever the length.
    """

    def __init__(self, codec: TinyCodec):
        self.codec = codec
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next call starts a new stream."""
        self.decoder_state: dict[int, Tensor | None] = {}
        self.encoder_state: dict[int, Tensor | None] = {}
        self.to_trim = self.codec.config.frames_to_trim
        self.pending_frames = 0  # frames fed to the encoder since the last full group of 4
        self.last_frame: Tensor | None = None

    @property
    def _param(self) -> Tensor:
        return next(self.codec.parameters())

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor | None:
        """latents (N, 16, h, w) or (N, 16, t, h, w), normalized -> new frames (N, k, 3, H, W) or None."""
        if latents.ndim == 4:
            latents = latents.unsqueeze(2)
        self.codec._check(latents, "stream decode input (BCHW or BCTHW latents)", 1, self.codec.config.latent_channels)
        p = self._param
        x = latents.to(p.device, p.dtype).permute(0, 2, 1, 3, 4)
        frames = run_causal(self.codec.decoder, x, self.decoder_state)
        trim = min(self.to_trim, frames.shape[1])
        self.to_trim -= trim
        frames = frames[:, trim:]
        return frames.clamp(0, 1) if frames.shape[1] else None

    @torch.no_grad()
    def encode(self, frames: Tensor) -> Tensor | None:
        """frames (N, 3, H, W) or (N, t, 3, H, W) in [0, 1] -> latents (N, 16, k, H/8, W/8) or None."""
        if frames.ndim == 4:
            frames = frames.unsqueeze(1)
        self.codec._check(frames, "stream encode input (NCHW or NTCHW frames)", 2, self.codec.config.image_channels)
        if frames.shape[-2] % 8 or frames.shape[-1] % 8:
            raise AlayaError(f"tiny codec encode: frame size {tuple(frames.shape[-2:])} must be a multiple of 8")
        if frames.shape[1] == 0:
            return None
        p = self._param
        x = frames.to(p.device, p.dtype)
        self.last_frame = x[:, -1:].clone()
        self.pending_frames = (self.pending_frames + x.shape[1]) % 4
        z = run_causal(self.codec.encoder, x, self.encoder_state)
        return z.permute(0, 2, 1, 3, 4) if z.shape[1] else None

    @torch.no_grad()
    def flush(self) -> Tensor | None:
        """Complete the encoder's last group of 4 with copies of the last frame; the decoder holds nothing."""
        if self.pending_frames == 0 or self.last_frame is None:
            return None
        pad = self.last_frame.expand(-1, 4 - self.pending_frames, -1, -1, -1)
        return self.encode(pad)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of every memory tensor (for checking that memory stays flat over a stream)."""
        out = {}
        for side, state in (("decoder", self.decoder_state), ("encoder", self.encoder_state)):
            for i, t in state.items():
                if t is not None:
                    out[f"{side}.{i}"] = tuple(t.shape)
        return out


def build(cfg: TinyCodecConfig) -> TinyCodec:
    return TinyCodec(cfg)
