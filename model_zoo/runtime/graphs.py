"""Each network's streaming step as a pure function of tensors, for an inference runtime to compile.

A runtime compiles a graph with static shapes, so every step here takes its state as inputs and
returns the new state as outputs, with no Python branching on values (only on shapes and settings,
fixed when the graph is built). Each module runs in float32 on the CPU as plain torch ops, the
numerics of the torch path before its fused reduced-precision kernels; the runtime picks its own
precision (bf16 where the CPU has it).

    EncoderGroup(encoder)   4 G-buffer frames + memory -> 1 latent (80 ch) + memory
    DecoderLatent(codec)    1 latent + memory -> 4 frames + memory
    RefinerFrame(refiner)   1 frame + its G-buffers (+ prompt) -> 1 refined frame
    DiTStep(dit, ...)       one cached pass of a chunk: latents, timestep embedding, prompt K/V,
                            the cache's earlier keys/values -> velocity + the chunk's keys/values

The codecs' stateful layers only ever meet whole groups: a latent is 4 frames (after a stream's
first, which is frame 0 four times: the torch stream's 3 leading copies and frame 0), and at a
group's edges the temporal pools hold nothing, so the only memory is each MemBlock's last input.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..codecs.gbuffer_encoder import GBufferEncoder, split_branches
from ..codecs.refiner import GBufferRefiner
from ..codecs.tiny import Clamp, MemBlock, TGrow, TinyCodec, TinyCodecConfig, TPool, build_decoder, build_encoder, fold_pools
from ..dit import WanDiT
from ..latents import TIME_COMPRESSION


def _memblock(block: MemBlock, x: Tensor, past: Tensor) -> Tensor:
    """One MemBlock on one frame (1, C, H, W) and its past frame, in plain ops. The first convolution
    over [x, past] runs as two over halves of its weight, summed: no concatenated copy of the inputs
    (a runtime fuses the sum into the second convolution)."""
    c1, _, c2, _, c3 = block.conv
    n = x.shape[1]
    h = F.conv2d(x, c1.weight[:, :n], c1.bias, 1, 1) + F.conv2d(past, c1.weight[:, n:], None, 1, 1)
    h = torch.relu(c2(torch.relu(h)))
    return torch.relu(c3(h) + block.skip(x))


def _run_stack(layers: list[nn.Module], frames: list[Tensor], memory: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """A causal TAEHV stack over consecutive frames (each (1, C, H, W)) from a group's start, with each
    MemBlock's past frame in `memory` (in order): (output frames, the MemBlocks' new memory). Frame by
    frame, as the torch stream runs a stream in reduced precision: a runtime then needs no copies that
    batch, interleave or split frames."""
    new_memory, m = [], 0
    for layer in layers:
        if isinstance(layer, nn.Identity):
            continue
        if isinstance(layer, MemBlock):
            pasts = [memory[m], *frames[:-1]]
            new_memory.append(frames[-1])
            frames = [_memblock(layer, x, p) for x, p in zip(frames, pasts)]
            m += 1
        elif isinstance(layer, TPool):  # (also a PooledConv: the pool folded into the conv after it)
            # frame k of each pooled run reads weight columns [kC, (k+1)C): a sum of one convolution per frame
            conv, s, c = layer.conv, layer.stride, frames[0].shape[1]
            pooled = []
            for j in range(0, len(frames), s):
                y = F.conv2d(frames[j], conv.weight[:, :c], conv.bias, conv.stride, conv.padding)
                for k in range(1, s):
                    y = y + F.conv2d(frames[j + k], conv.weight[:, k * c:(k + 1) * c], None, conv.stride, conv.padding)
                pooled.append(y)
            frames = pooled
        elif isinstance(layer, TGrow):  # frame k: output channels [kC, (k+1)C)
            c = frames[0].shape[1]
            frames = [F.conv2d(x, layer.conv.weight[k * c:(k + 1) * c]) for x in frames for k in range(layer.stride)]
        elif isinstance(layer, nn.Upsample):  # nearest: the same as after the TGrow that follows it
            frames = [F.interpolate(x, scale_factor=2, mode="nearest") for x in frames]
        elif isinstance(layer, Clamp):
            frames = [torch.tanh(x / 3) * 3 for x in frames]
        else:  # Conv2d, ReLU
            frames = [layer(x) for x in frames]
    return frames, new_memory


def _probe(layers: list[nn.Module], frame: tuple[int, int, int], frames: int) -> list[tuple[int, int, int]]:
    """(C, H, W) of each MemBlock's memory in a stack fed `frames` zero frames of shape `frame` (one run)."""
    shapes: list[tuple[int, int, int]] = []
    xs = [torch.zeros(1, *frame) for _ in range(frames)]  # (on the caller's default device)
    with torch.no_grad():
        for layer in layers:
            if isinstance(layer, MemBlock):
                shapes.append(tuple(xs[0].shape[1:]))
            xs, _ = _run_stack([layer], xs, [xs[0]])
    return shapes


class EncoderGroup(nn.Module):
    """G-buffer encoder, one latent: images uint8 (4, 5, H, W, 3) teacher form, memory (one tensor
    per MemBlock position, the five branches stacked: (5, C, h, w)) -> latent (1, 80, h/8, w/8) float32
    in the normalized Wan space, and the new memory."""

    def __init__(self, encoder: GBufferEncoder):
        super().__init__()
        cfg = encoder.config
        self.branches = nn.ModuleList()
        state = {k: v.detach().float().cpu() for k, v in encoder.state_dict().items()}
        for part in split_branches(state, cfg.branches):
            stack = build_encoder(TinyCodecConfig(encoder_width=cfg.hidden, latent_channels=cfg.latent_channels,
                                                  image_channels=cfg.image_channels))
            stack.load_state_dict({k.removeprefix("encoder."): v for k, v in part.items()}, strict=True)
            self.branches.append(fold_pools(stack.eval()).to(memory_format=torch.contiguous_format))
        self.requires_grad_(False)

    @staticmethod
    def memory_shapes_for(encoder: GBufferEncoder, height: int, width: int) -> list[tuple[int, ...]]:
        """Shapes of the memory inputs (and outputs) for frames of height x width (found on the meta device)."""
        cfg = encoder.config
        with torch.device("meta"):
            stack = build_encoder(TinyCodecConfig(encoder_width=cfg.hidden, latent_channels=cfg.latent_channels,
                                                  image_channels=cfg.image_channels))
            one = _probe(list(stack), (cfg.image_channels, height, width), TIME_COMPRESSION)
        return [(cfg.branches, *s) for s in one]

    def forward(self, images: Tensor, *memory: Tensor) -> tuple[Tensor, ...]:
        x = images.float() * (2.0 / 255.0) - 1.0  # (4, 5, H, W, 3) -> [-1, 1]
        latents, new = [], [[] for _ in memory]
        for g, stack in enumerate(self.branches):
            frames = x[:, g].permute(0, 3, 1, 2)  # (4, 3, H, W)
            z, mem = _run_stack(list(stack), list(frames.split(1)), [m[g:g + 1] for m in memory])
            latents.append(z[0])
            for k, t in enumerate(mem):
                new[k].append(t)
        return (torch.cat(latents, 1), *(torch.cat(n) for n in new))


class DecoderLatent(nn.Module):
    """Tiny decoder, one latent: z (1, 16, h, w) normalized, memory (one (1, C, H', W') per MemBlock)
    -> frames (4, 3, 8h, 8w) in [0, 1] and the new memory. A stream's first latent gives 4 frames
    of which the torch stream keeps the last one (TinyStream trims 3)."""

    def __init__(self, codec: TinyCodec):
        super().__init__()
        layers = list(codec.decoder)
        for i in range(len(layers) - 1):  # TGrow before the nearest upsampling: the same values on 4x fewer pixels
            if isinstance(layers[i], nn.Upsample) and isinstance(layers[i + 1], TGrow):
                layers[i], layers[i + 1] = layers[i + 1], layers[i]
        self.layers = copy.deepcopy(nn.ModuleList(layers)).float().cpu()  # (a copy: the codec keeps its dtype)
        self.requires_grad_(False)

    @staticmethod
    def memory_shapes_for(codec: TinyCodec, height: int, width: int) -> list[tuple[int, ...]]:
        """Shapes of the memory inputs (and outputs) for latents of height x width (found on the meta device)."""
        with torch.device("meta"):
            layers = list(build_decoder(codec.config))
            return [(1, *s) for s in _probe(layers, (codec.config.latent_channels, height, width), 1)]

    def forward(self, z: Tensor, *memory: Tensor) -> tuple[Tensor, ...]:
        frames, mem = _run_stack(list(self.layers), [z], list(memory))
        return (torch.cat(frames).clamp(0, 1), *mem)


class RefinerFrame(nn.Module):
    """G-buffer refiner, one frame: rgb (1, H, W, 3) float [0, 1], G-buffers uint8 (1, 5, H, W, 3) and,
    for a refiner that reads the prompt, text (1, text_dim) -> refined (1, H, W, 3) in [0, 1]."""

    def __init__(self, refiner: GBufferRefiner):
        super().__init__()
        self.refiner = refiner
        self.requires_grad_(False)

    def forward(self, rgb: Tensor, gbuffers: Tensor, text: Tensor | None = None) -> Tensor:
        from ..codecs.refiner import gbuffer_planes

        out = self.refiner(rgb.permute(0, 3, 1, 2), gbuffer_planes(gbuffers), text)
        return out.clamp(0, 1).permute(0, 2, 3, 1)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on interleaved (even, odd) pairs of x (B, heads, N, D) by angles given as cos, sin (N, D/2)."""
    pairs = x.unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


class DiTStep(nn.Module):
    """One cached DiT pass of a chunk (WanDiT's cached mode), state passed in and out:

    inputs   x (B, in_dim, f, h, w): noisy latents then conditioning, channel-concatenated
             t_emb (B, 1, dim), t_mod (B, 1, 6, dim): WanDiT.time_embed of the pass's timestep
             text: per block, the prompt's cross-attention keys and values (L, B, heads, n_text, hd)
                   (for a one-token prompt, only the cross-attention's output o(v) (L, B, 1, dim))
             rope_cos, rope_sin (f*h*w/4, hd/2): the chunk's rotations (its slot, or its absolute frames)
             past_k, past_v (L, B, heads, P, hd): the cache's earlier tokens, keys rotated; past_bias (P,)
                   0 where held, -inf where empty (absent when P == 0)
    outputs  velocity (B, out_dim, f, h, w), k, v (L, B, heads, f*h*w/4, hd): the chunk's keys as
             the cache stores them (rotated with absolute RoPE, raw with relative) and values.
    """

    def __init__(self, dit: WanDiT, *, single_token: bool, has_past: bool, rotated_keys: bool):
        super().__init__()
        self.dit = dit
        self.single_token, self.has_past, self.rotated_keys = single_token, has_past, rotated_keys
        self.requires_grad_(False)

    @property
    def input_names(self) -> list[str]:
        """The inputs of this variant, in forward's order (text_a: the prompt's keys, absent for one
        token; past_*: absent when the cache holds no earlier tokens)."""
        text = ["text_b"] if self.single_token else ["text_a", "text_b"]
        past = ["past_k", "past_v", "past_bias"] if self.has_past else []
        return ["x", "t_emb", "t_mod", *text, "rope_cos", "rope_sin", *past]

    def forward(self, *inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        named = dict(zip(self.input_names, inputs))
        return self.step(**named)

    def step(self, x, t_emb, t_mod, text_b, rope_cos, rope_sin, text_a=None, past_k=None, past_v=None, past_bias=None):
        dit, cfg = self.dit, self.dit.config
        b, _, f, hh, ww = x.shape
        h, w = hh // cfg.patch_size[1], ww // cfg.patch_size[2]
        tokens = dit.patchify(x).float()
        n = tokens.shape[1]
        ks, vs = [], []
        for i, block in enumerate(dit.blocks):
            shift_sa, scale_sa, gate_sa, shift_ff, scale_ff, gate_ff = (block.modulation.float() + t_mod[:, 0]).unbind(1)
            attn = block.self_attn
            hdn = F.layer_norm(tokens, (cfg.dim,), eps=cfg.eps) * (1 + scale_sa[:, None]) + shift_sa[:, None]
            q = _rotate(attn._heads(attn.norm_q(attn.q(hdn))), rope_cos, rope_sin)
            k = attn._heads(attn.norm_k(attn.k(hdn)))
            v = attn._heads(attn.v(hdn))
            k_rot = _rotate(k, rope_cos, rope_sin)
            ks.append(k_rot if self.rotated_keys else k)
            vs.append(v)
            if self.has_past:
                keys, values = torch.cat([past_k[i], k_rot], 2), torch.cat([past_v[i], v], 2)
                bias = torch.cat([past_bias, torch.zeros(n, dtype=past_bias.dtype)])[None]  # (1, P + n): every query alike
                out = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
            else:
                out = F.scaled_dot_product_attention(q, k_rot, v)
            tokens = tokens + attn.o(out.transpose(1, 2).flatten(2)) * gate_sa[:, None]
            if self.single_token:  # softmax over one key is 1: every query reads o(v)
                tokens = tokens + text_b[i]
            else:
                cross = block.cross_attn
                hc = F.layer_norm(tokens, (cfg.dim,), block.norm3.weight, block.norm3.bias, cfg.eps)
                qc = cross._heads(cross.norm_q(cross.q(hc)))
                tokens = tokens + cross.o(F.scaled_dot_product_attention(qc, text_a[i], text_b[i]).transpose(1, 2).flatten(2))
            hf = F.layer_norm(tokens, (cfg.dim,), eps=cfg.eps) * (1 + scale_ff[:, None]) + shift_ff[:, None]
            tokens = tokens + block.ffn(hf) * gate_ff[:, None]
        head = dit.head
        shift, scale = (head.modulation.float() + t_emb).unbind(1)
        hd = F.layer_norm(tokens, (cfg.dim,), eps=cfg.eps) * (1 + scale[:, None]) + shift[:, None]
        out = dit.unpatchify(head.head(hd), f, h, w)
        return out, torch.stack(ks), torch.stack(vs)
