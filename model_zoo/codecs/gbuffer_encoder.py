"""Five-branch G-buffer encoder: teacher-form G-buffer frames -> the DiT's 80 conditioning channels.

One small causal encoder per modality (branch g = streaming.gbuffer.MODALITIES[g]: albedo, depth,
metallic, normal, roughness), each mapping 3-channel frames to 16 latent channels in the
normalized Wan space; the five outputs are concatenated to 80 channels in that order (channels
16g..16g+15 are branch g), the layout of the teacher's patch-embedding input slices 16..95.

A light-reading config ("gbuffer-encoder-slim-lit", `reads_light`) has a sixth branch, channels 80..95:
the shading prior's image of the frame under the stream's light (`with_prior`; model_zoo/shading_prior.py),
so the DiT (in_dim 112) starts from a lit guess instead of learning the light from the passes alone.

Each branch has the TAEHV encoder's layer stack (model_zoo/codecs/tiny.py; conv + three
TPool/stride-2-conv/3xMemBlock stages + conv), with hidden width `hidden` (128 as in the Flash
release; the public card says "5 branches, hidden dim 128"; the layer stack is our guess). Weights
are stored grouped: rows [g*n, (g+1)*n) of every tensor are branch g, so `split_branches` gives five
TAEHV-encoder state dicts (at hidden=64, exactly taew2_1's `encoder.*` shapes) and `join_branches`
builds this encoder from five of them (e.g. to start distillation from taew2_1's encoder).

Training runs the five branches as ONE grouped op per layer (groups=5, `self.encoder`). Inference
in bf16/fp16 (`encode`, `GBufferEncoderStream`) runs them as five ungrouped stacks (`branch_stacks`): oneDNN's
grouped convolutions are the slow path on CPU, and with one frame in flight the grouped channel
interleave costs more copies than the convolutions. Measured in bf16 at 256x256, 1 thread, five
stacks alone took the slim encoder from 244 to 137 ms per frame; with tiny.py's copy-free TPool and
MemBlock paths, 67 ms (docs/codecs.md, performance notes). The two forms agree to float rounding
(tests/test_codecs_gbuffer_encoder.py).

Input: teacher form, (B, T, 5, H, W, 3) or (T, 5, H, W, 3), either uint8 or float already in
[-1, 1]; uint8 is mapped by v * 2/255 - 1 (the same [-1, 1] mapping as
streaming.gbuffer.teacher_to_model and the Wan VAE, which this encoder is distilled from).
H and W must be multiples of 8. Output: (B, 80, T', H/8, W/8), T' = (T - 1) // 4 + 1.

Time follows the Wan VAE, not TAEHV: the stream starts with 3 copies of frame 0 in front, so
latent 0 is frame 0 alone and latent i covers frames 4i-3 .. 4i (causal, as the tiny decoder
decodes latent i back to those frames). Frames after the last full group wait in the stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import AlayaError
from ..latents import TIME_COMPRESSION, latent_frames
from ..shading_prior import PriorConfig
from .tiny import REDUCED_PRECISION, MemBlock, TinyCodecConfig, TPool, build_encoder, conv, fold_pools, run_causal


@dataclass(frozen=True)
class GBufferEncoderConfig:
    hidden: int = 128
    branches: int = 5  # one per modality, in streaming.gbuffer.MODALITIES order
    latent_channels: int = 16  # per branch
    image_channels: int = 3  # per branch (teacher form: every pass as 8-bit RGB)
    # a sixth branch reads the shading prior's image of each frame under the stream's light (`with_prior`)
    reads_light: bool = False

    def __post_init__(self):
        if self.reads_light and self.branches != LIT_BRANCHES:
            raise AlayaError(f"G-buffer encoder config: reads_light needs {LIT_BRANCHES} branches (five passes and "
                             f"the shading prior's image), got {self.branches}")

    @property
    def out_channels(self) -> int:
        return self.branches * self.latent_channels


LIT_BRANCHES = 6  # the five passes, then the shading prior's shaded image
LIT_PRIOR = PriorConfig()  # how the prior shades the sixth plane: as the light-reading encoder was trained (no reflections)

CONFIGS: dict[str, GBufferEncoderConfig] = {
    "gbuffer-encoder": GBufferEncoderConfig(),
    "gbuffer-encoder-slim": GBufferEncoderConfig(hidden=32),
    "gbuffer-encoder-slim-lit": GBufferEncoderConfig(hidden=32, branches=LIT_BRANCHES, reads_light=True),
}


class GBufferEncoder(nn.Module):
    """Five grouped TAEHV-style encoders. encode(): whole clip; GBufferEncoderStream: frame by frame."""

    def __init__(self, cfg: GBufferEncoderConfig):
        super().__init__()
        self.config = cfg
        g, w = cfg.branches, cfg.hidden
        self.encoder = nn.Sequential(
            conv(g * cfg.image_channels, g * w, groups=g), nn.ReLU(),
            TPool(w, 2, g), conv(g * w, g * w, stride=2, bias=False, groups=g),
            MemBlock(w, w, g), MemBlock(w, w, g), MemBlock(w, w, g),
            TPool(w, 2, g), conv(g * w, g * w, stride=2, bias=False, groups=g),
            MemBlock(w, w, g), MemBlock(w, w, g), MemBlock(w, w, g),
            TPool(w, 1, g), conv(g * w, g * w, stride=2, bias=False, groups=g),
            MemBlock(w, w, g), MemBlock(w, w, g), MemBlock(w, w, g),
            conv(g * w, g * cfg.latent_channels, groups=g),
        )  # fmt: skip

    def to_input(self, images: Tensor) -> Tensor:
        """Teacher form (B, T, 5, H, W, 3) or (T, 5, H, W, 3), uint8 or [-1, 1] -> (B, T, 15, H, W) in [-1, 1]."""
        x = self._checked(images)
        p = next(self.parameters())
        x = x.float().mul(2.0 / 255.0).sub(1.0) if images.dtype == torch.uint8 else x
        b, t, g, h, w, c = x.shape
        return x.permute(0, 1, 2, 5, 3, 4).reshape(b, t, g * c, h, w).to(p.dtype)

    def branch_inputs(self, images: Tensor) -> list[Tensor]:
        """Teacher form as `to_input` -> per branch (B, T, 3, H, W) in [-1, 1], the same values, held
        channels-last (the teacher form's own pixel-major order), so no layout copy follows."""
        x = self._checked(images)
        p = next(self.parameters())
        out = []
        for g in range(self.config.branches):
            xg = x[:, :, g]  # (B, T, H, W, 3)
            xg = xg.float().mul_(2.0 / 255.0).sub_(1.0) if images.dtype == torch.uint8 else xg
            out.append(xg.to(p.dtype).contiguous().permute(0, 1, 4, 2, 3))
        return out

    def _checked(self, images: Tensor) -> Tensor:
        """Teacher form, 6-D, on the weights' device (refused with the shape when it is not)."""
        cfg = self.config
        if images.ndim == 5:
            images = images.unsqueeze(0)
        if images.ndim != 6 or images.shape[2] != cfg.branches or images.shape[-1] != cfg.image_channels:
            raise AlayaError(
                f"G-buffer encoder input: expected teacher form (B, T, {cfg.branches}, H, W, {cfg.image_channels}), "
                f"got {tuple(images.shape)}"
            )
        if images.shape[3] % 8 or images.shape[4] % 8:
            raise AlayaError(f"G-buffer encoder input: frame size {tuple(images.shape[3:5])} must be a multiple of 8")
        return images.to(next(self.parameters()).device)

    def branch_stacks(self) -> list[nn.Sequential]:
        """The five branches as ungrouped TAEHV-encoder stacks (weights copied, same device and dtype)."""
        cfg = self.config
        p = next(self.parameters())
        stacks = []
        for part in split_branches(self.state_dict(), cfg.branches):
            # Built on the meta device, with no random init, since every weight is loaded next: a stream's
            # start took 165 -> 63 ms at full width, 38 -> 45 ms slim (median of 25, one thread).
            with torch.device("meta"):
                stack = build_encoder(TinyCodecConfig(encoder_width=cfg.hidden, latent_channels=cfg.latent_channels,
                                                      image_channels=cfg.image_channels))
            stack.load_state_dict({k.removeprefix("encoder."): v for k, v in part.items()}, strict=True, assign=True)
            stack = stack.to(device=p.device, dtype=p.dtype).eval().requires_grad_(False)
            if p.dtype in REDUCED_PRECISION:  # keeps every activation channels-last (tiny.channels_last)
                stack = fold_pools(stack.to(memory_format=torch.channels_last))
            stacks.append(stack)
        return stacks

    def new_stream(self) -> "GBufferEncoderStream":
        """A stream over this encoder (a compiled encoder, model_zoo/runtime, offers the same method)."""
        return GBufferEncoderStream(self)

    def encode(self, images: Tensor) -> Tensor:
        """Teacher-form G-buffers of a clip (T frames) -> (B, 80, (T - 1) // 4 + 1, H/8, W/8)."""
        stream = GBufferEncoderStream(self)
        z = stream.encode(images)
        if z is None:  # cannot happen: frame 0 always yields latent 0
            raise AlayaError("G-buffer encoder: empty clip")
        if z.shape[2] != latent_frames(images.shape[-5]):
            raise AlayaError(f"G-buffer encoder: produced {z.shape[2]} latent frames, frame arithmetic broken")
        return z


class GBufferEncoderStream:
    """Per-branch memory of a GBufferEncoder, fed one frame (or a chunk) at a time.

        stream = GBufferEncoderStream(encoder)
        for images in gbuffer_chunks:        # teacher form (B, t, 5, H, W, 3) or one frame (5, H, W, 3)
            cond = stream.encode(images)     # (B, 80, k, H/8, W/8), or None until a latent is ready

    The first frame gives latent 0 at once; after that every 4th frame gives the next latent.
    Memory is bounded (one frame per MemBlock, < stride frames per TPool, per branch).
    In bf16/fp16 the stream runs a snapshot of the encoder's weights as five ungrouped stacks (module
    docstring), taken again if the encoder has since moved to another device or dtype.
    """

    def __init__(self, encoder: GBufferEncoder):
        self.encoder = encoder
        self._make_stacks()
        self.reset()

    def _make_stacks(self) -> None:
        """Five ungrouped stacks in reduced precision (fast); float32 keeps the one grouped stack, whose
        results do not depend on how many frames share a call (oneDNN's ungrouped float32 convolutions
        round differently per batch size, and chunked streams must equal whole clips bit for bit).
        `made_for` records the encoder's (device, dtype) they were made for."""
        p = next(self.encoder.parameters())
        self.made_for = (p.device, p.dtype)
        self.stacks = self.encoder.branch_stacks() if p.dtype in REDUCED_PRECISION else [self.encoder.encoder]

    def reset(self) -> None:
        self.states: list[dict[int, Tensor | None]] = [{} for _ in self.stacks]
        self.started = False

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor | None:
        if images.ndim == 4:  # one frame (5, H, W, 3)
            images = images.unsqueeze(0)
        p = next(self.encoder.parameters())
        if self.made_for != (p.device, p.dtype):  # the encoder moved since the stacks were made
            if self.started:
                raise AlayaError("G-buffer encoder stream: the encoder changed device or dtype mid-stream; reset() first")
            self._make_stacks()
            self.reset()
        # one input per stack: five branches (reduced precision) or all 15 channels (the grouped stack)
        xs = self.encoder.branch_inputs(images) if len(self.stacks) > 1 else [self.encoder.to_input(images)]
        if xs[0].shape[1] == 0:
            return None
        lead = 0 if self.started else TIME_COMPRESSION - 1  # Wan alignment: frame 0 alone makes latent 0
        self.started = True
        if len(self.stacks) > 1:
            return self._by_frame(xs, lead)
        if lead:
            xs = [torch.cat([x[:, :1].expand(-1, lead, -1, -1, -1), x], 1) for x in xs]
        z = run_causal(self.stacks[0], xs[0], self.states[0])
        return z.permute(0, 2, 1, 3, 4) if z.shape[1] else None

    def _by_frame(self, branches: list[Tensor], lead: int = 0) -> Tensor | None:
        """Run each branch's stack one frame at a time. Every causal layer then takes its one-frame
        path: a MemBlock's memory is its last input as it is, with no chunk of earlier frames to
        concatenate or copy, which at full resolution cost more than the batching saved (docs/codecs.md).
        branches: per branch (B, T, 3, H, W) -> (B, 80, T', H/8, W/8) or None. lead: copies of frame 0
        in front (a stream's start); the stateless head (the full-resolution conv and its ReLU) runs
        once for all of them, which shortens the stream's first frame."""
        head = next(i for i, layer in enumerate(self.stacks[0]) if hasattr(layer, "forward_seq"))
        order = [0] * lead + list(range(branches[0].shape[1]))
        zs, repeated = [], {}  # repeated: branch -> frame 0's head output, while frame 0 repeats
        for t in order:
            z = []
            for g, (stack, x, state) in enumerate(zip(self.stacks, branches, self.states)):
                h = repeated.get(g) if t == 0 else None
                if h is None:
                    h = run_causal(stack, x[:, t:t + 1], state, stop=head)
                    if t == 0 and lead:
                        repeated[g] = h
                z.append(run_causal(stack, h, state, start=head))
            if z[0].shape[1]:
                zs.append(torch.cat(z, 2))
        return torch.cat(zs, 1).permute(0, 2, 1, 3, 4) if zs else None

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """'branch.layer' -> shape of that layer's memory."""
        return {f"{g}.{i}": tuple(t.shape) for g, state in enumerate(self.states) for i, t in state.items()
                if t is not None}


def with_prior(prior, images: Tensor, light: Tensor, depth_near: float = 0.5,
               sun_visibility: Tensor | None = None, planes: Tensor | None = None) -> Tensor:
    """Teacher-form passes uint8 (T, 5, H, W, 3) -> the six planes a light-reading encoder reads: the passes,
    then the image `prior` (a model_zoo.shading_prior.ShadingPrior) shades of each frame under its packed light
    (T, PACKED), as 8-bit sRGB. Camera up from the normals, as the refiner's prior has it; sun_visibility
    (T, H, W) in [0, 1], an engine's shadow pass, replaces the screen-space shadows. planes: the prior's
    output for exactly these (T, 5, H, W), when already computed."""
    if images.dtype != torch.uint8 or images.ndim != 5 or images.shape[1] != LIT_BRANCHES - 1:
        raise AlayaError(f"G-buffer encoder: the prior is shaded from teacher-form passes uint8 (T, 5, H, W, 3), "
                         f"got {images.dtype} {tuple(images.shape)}")
    if light.ndim != 2 or len(light) != len(images):
        raise AlayaError(f"G-buffer encoder: {len(images)} frame(s) need one packed light each, got {tuple(light.shape)}")
    if planes is None:
        planes = prior(images, light, depth_near, sun_visibility=sun_visibility)
    plane = planes[:, :3].mul(255).round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return torch.cat([images, plane[:, None]], 1)


def split_branches(state: dict[str, Tensor], branches: int = 5) -> list[dict[str, Tensor]]:
    """Grouped encoder state dict -> one TAEHV-encoder state dict per branch (rows split in `branches`)."""
    out: list[dict[str, Tensor]] = [{} for _ in range(branches)]
    for key, t in state.items():
        for g, part in enumerate(t.chunk(branches, 0)):
            out[g][key] = part.clone()
    return out


def join_branches(per_branch: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Five TAEHV-encoder state dicts (keys `encoder.{i}...`) -> this encoder's grouped state dict."""
    keys = per_branch[0].keys()
    for g, sd in enumerate(per_branch):
        if sd.keys() != keys:
            raise AlayaError(f"branch {g}: keys differ from branch 0's ({sorted(set(sd) ^ set(keys))[:5]})")
    return {k: torch.cat([sd[k] for sd in per_branch], 0) for k in keys}


def build(cfg: GBufferEncoderConfig) -> GBufferEncoder:
    return GBufferEncoder(cfg)
