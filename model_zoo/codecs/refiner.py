"""G-buffer refiner: a decoded frame and its own G-buffers -> a corrected frame (this project's addition).

The tiny decoder rebuilds each frame from latents 8x smaller than the frame, so what the latents
cannot carry is lost: edges and texture detail finer than 8 pixels, and part of the colour (the
codecs' colour loss, docs/model-card.md). The renderer has that frame's G-buffers at full
resolution anyway. The refiner reads the decoded frame beside them and predicts a residual:

    x    = [rgb (3), albedo (3), depth, metallic, normal (3), roughness] in [-1, 1]   12 x H x W
    head = ReLU(conv(x)), ReLU(conv(.))                                      full resolution, width c
    down = 2 x (ReLU(conv stride 2), ReLU(conv))                            1/4 resolution, width 2c
    out  = rgb + tail([head, upsample(down)])                                tail: ReLU(conv), conv

A config with `text_dim` also reads the prompt: its pooled embedding goes through a small MLP to a
per-channel scale and shift (FiLM) of the head's features (before the quarter-resolution path
reads them) and of that path's output. The student DiT learned to light by the prompt on its
training scenes and falls back towards one look on new ones (docs/model-card.md); a refiner
trained on the student's renders of scenes it never saw learns to put the prompted lighting back,
from the normals and albedo it has at full resolution.

A config with `context` adds a coarse path for what lies beyond that path's reach (about 40
pixels): where a building's shadow falls, how bright the sky is, the frame's overall light.

    ctx  = 2 x ReLU(conv stride 2), ReLU(conv dilation 1, 2, 4)           1/16 resolution, width `context`
    down = down + upsample(conv1x1(ctx))                                  the 1x1 starts at zero

With a prompt its features get a FiLM of their own (a second small MLP), so the prompt (the sun's
side the caption names, docs/world.md) can steer where the coarse light goes. At 256x256 the
path is 16x16 and costs a fraction of the full-resolution layers.

A config with `prior` also reads the light: the shading prior (model_zoo/shading_prior.py) shades
the frame's G-buffers under the frame's `Light` (from the user, an engine, or the prompt's light
head) and its five planes (shaded sRGB, sun visibility, ambient occlusion) join the head's input.
The cast shadows, the metals' reflections and the sky are then computed rather than learnt; the
network learns what the prior gets wrong (indirect light, soft shadows, texture, style).

    x    = [rgb (3), G-buffers (9), prior (5)] in [-1, 1]                    17 x H x W

A config with `blend` also predicts a per-pixel weight a (a fourth output channel) that moves the
frame towards the prior's shaded image where the prior holds (direct sun, cast shadows, sky):

    out  = rgb + a * (prior_rgb - rgb) + residual

Copying the prior is one weight for it to learn, not a function of 17 inputs through ReLU layers.

A config with `given` also reads how far the prior can be trusted, as two constant planes: whether
the frame's light was given (by the user or an engine: 1) or read from the prompt by the light head
(0), and whether its shadows come from the engine's shadow pass (1) or were marched in screen space
(0). One network then trusts a given light and a shadow pass fully and the prompt's guess with care.

    x    = [rgb (3), G-buffers (9), prior (5), given (2)] in [-1, 1]         19 x H x W

It works frame by frame (no memory), so it streams with any chunking and adds no latency. The
last conv (and the prompt MLP's last layer) start at zero: an untrained refiner returns its input
unchanged. Not in the seed paper, whose frames come straight out of its distilled decoder; a model
folder without refiner.safetensors renders exactly as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import AlayaError
from .. import fused
from ..shading_prior import PRIOR_CHANNELS, PriorConfig, ShadingPrior
from .tiny import channels_last, conv

GBUFFER_CHANNELS = 9  # albedo 3, depth 1, metallic 1, normal 3, roughness 1 (single-channel passes: channel 0)


@dataclass(frozen=True)
class RefinerConfig:
    width: int = 16  # channels at full resolution (2x at quarter resolution)
    image_channels: int = 3
    text_dim: int = 0  # width of the prompt embedding it reads (0: no prompt)
    text_hidden: int = 64  # the prompt MLP's hidden width
    context: int = 0  # channels of the 1/16-resolution context path (0: none)
    prior: bool = False  # reads the shading prior's planes under each frame's light
    blend: bool = False  # and mixes the prior's shaded image in by a weight it predicts per pixel (needs prior)
    given: bool = False  # and reads whether the light was given and the shadows came from a pass (needs prior)
    reflections: bool = False  # its prior's metals show what their mirror rays meet in the frame (needs prior)
    # its prior takes an engine's sky pass as its ambient occlusion (trained beside it); else a sky pass is left
    # out and the prior keeps its screen-space AO: a network reads the prior it was trained beside (needs prior)
    sky: bool = False

    def __post_init__(self):
        if self.blend and not self.prior:
            raise AlayaError("refiner config: blend needs prior (it mixes the prior's shaded image in)")
        if self.given and not self.prior:
            raise AlayaError("refiner config: given needs prior (it says how far the prior's light can be trusted)")
        if self.reflections and not self.prior:
            raise AlayaError("refiner config: reflections needs prior (they are the prior's)")
        if self.sky and not self.prior:
            raise AlayaError("refiner config: sky needs prior (the sky pass is the prior's ambient occlusion)")

    @property
    def prior_config(self) -> PriorConfig:
        """How its shading prior shades (what it was trained beside)."""
        return PriorConfig(reflections=self.reflections)


CONFIGS: dict[str, RefinerConfig] = {
    "gbuffer-refiner-16": RefinerConfig(),
    "gbuffer-refiner-16-prompt": RefinerConfig(text_dim=384),  # all-MiniLM-L6-v2's pooled embedding
    "gbuffer-refiner-16-context": RefinerConfig(text_dim=384, context=64),
    "gbuffer-refiner-16-light": RefinerConfig(text_dim=384, context=64, prior=True),
    "gbuffer-refiner-16-blend": RefinerConfig(text_dim=384, context=64, prior=True, blend=True),
    "gbuffer-refiner-16-given": RefinerConfig(text_dim=384, context=64, prior=True, blend=True, given=True),
    # the prior with screen-space reflections (model_zoo/shading_prior.py, PriorConfig.reflections)
    "gbuffer-refiner-16-mirror": RefinerConfig(text_dim=384, context=64, prior=True, blend=True, given=True,
                                               reflections=True),
    # and the engine's sky pass as its prior's ambient occlusion where the G-buffers carry one
    "gbuffer-refiner-16-sky": RefinerConfig(text_dim=384, context=64, prior=True, blend=True, given=True,
                                            reflections=True, sky=True),
}
GIVEN_CHANNELS = 2  # light given (1) or the prompt's (0); shadows from a pass (1) or screen space (0)


def gbuffer_planes(images: Tensor) -> Tensor:
    """Teacher-form G-buffers uint8 (..., 5, H, W, 3) -> float planes (..., 9, H, W) in [0, 1]."""
    if images.dtype != torch.uint8 or images.ndim < 4 or images.shape[-4] != 5 or images.shape[-1] != 3:
        raise AlayaError(f"G-buffer refiner: expected uint8 G-buffers (..., 5, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    albedo, depth, metallic, normal, roughness = images.unbind(-4)
    planes = torch.cat([albedo, depth[..., :1], metallic[..., :1], normal, roughness[..., :1]], -1)
    return planes.movedim(-1, -3).float().div(255)


def _film(x: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    """x * scale + shift, per channel. One frame in inference: a depthwise 1x1 convolution, one pass
    over x (8x faster than the broadcast ops on channels-last bf16 at 256x256: 0.19 against 1.6 ms)."""
    if fused.fusable(x) and x.shape[0] == 1:
        c = x.shape[1]
        return F.conv2d(x, scale.reshape(c, 1, 1, 1).to(x.dtype), shift.reshape(c).to(x.dtype), groups=c)
    return x * scale + shift


class GBufferRefiner(nn.Module):
    def __init__(self, cfg: RefinerConfig):
        super().__init__()
        self.config = cfg
        c, rgb = cfg.width, cfg.image_channels
        inputs = rgb + GBUFFER_CHANNELS + (PRIOR_CHANNELS if cfg.prior else 0) + (GIVEN_CHANNELS if cfg.given else 0)
        self.head = nn.Sequential(conv(inputs, c), nn.ReLU(), conv(c, c), nn.ReLU())
        self.down = nn.Sequential(conv(c, 2 * c, stride=2), nn.ReLU(), conv(2 * c, 2 * c), nn.ReLU(),
                                  conv(2 * c, 2 * c, stride=2), nn.ReLU(), conv(2 * c, 2 * c), nn.ReLU())
        self.tail = nn.Sequential(conv(3 * c, c), nn.ReLU(), conv(c, rgb + (1 if cfg.blend else 0)))
        nn.init.zeros_(self.tail[-1].weight)
        nn.init.zeros_(self.tail[-1].bias)
        if cfg.text_dim:
            # FiLM: scale and shift of the head's c channels and the quarter-resolution path's 2c
            self.text = self._film_mlp(6 * c)
        if cfg.context:
            k = cfg.context
            # dilations 1, 2, 4 at 1/16: each output sees +-7 cells, +-112 pixels (most of a 256x256 frame)
            self.context = nn.Sequential(conv(2 * c, k, stride=2), nn.ReLU(), conv(k, k, stride=2), nn.ReLU(),
                                         conv(k, k), nn.ReLU(), nn.Conv2d(k, k, 3, padding=2, dilation=2), nn.ReLU(),
                                         nn.Conv2d(k, k, 3, padding=4, dilation=4), nn.ReLU())
            self.context_out = nn.Conv2d(k, 2 * c, 1)
            nn.init.zeros_(self.context_out.weight)
            nn.init.zeros_(self.context_out.bias)
            if cfg.text_dim:
                self.context_text = self._film_mlp(2 * k)
        if cfg.prior:  # no parameters: the checkpoint's keys are the network's alone
            self.shading_prior = ShadingPrior(cfg.prior_config)

    def _film_mlp(self, n: int) -> nn.Sequential:
        """Prompt embedding -> n FiLM values; the last layer starts at zero (scale 1, shift 0)."""
        cfg = self.config
        mlp = nn.Sequential(nn.Linear(cfg.text_dim, cfg.text_hidden), nn.SiLU(), nn.Linear(cfg.text_hidden, n))
        nn.init.zeros_(mlp[-1].weight)
        nn.init.zeros_(mlp[-1].bias)
        return mlp

    @property
    def text_dim(self) -> int:
        return self.config.text_dim

    @property
    def reads_light(self) -> bool:
        return self.config.prior

    @property
    def reads_sky(self) -> bool:
        """Whether its prior takes an engine's sky pass (config `sky`)."""
        return self.config.sky

    @property
    def reads_given(self) -> bool:
        """Whether it reads if the light was given and the shadows came from a pass (config `given`)."""
        return self.config.given

    def forward(self, rgb: Tensor, planes: Tensor, text: Tensor | None = None, prior: Tensor | None = None,
                given: Tensor | None = None) -> Tensor:
        """rgb (M, 3, H, W) in [0, 1], planes (M, 9, H, W) in [0, 1], when the config reads prompts text
        (M, text_dim) pooled prompt embeddings, when it reads the light the shading prior's planes
        (M, 5, H, W) in [0, 1], and with `given` the flags (M, 2) in {0, 1} (light given, shadows from a
        pass) -> refined rgb (M, 3, H, W), unclamped."""
        p = self.tail[-1].weight
        inputs = [rgb, planes]
        if self.reads_light:
            if prior is None or prior.shape[0] != rgb.shape[0] or prior.shape[1] != PRIOR_CHANNELS:
                got = None if prior is None else tuple(prior.shape)
                raise AlayaError(f"G-buffer refiner: reads the shading prior ({rgb.shape[0]}, {PRIOR_CHANNELS}, H, W), got {got}")
            inputs.append(prior.to(rgb.dtype))
        if self.config.given:
            if given is None or tuple(given.shape) != (rgb.shape[0], GIVEN_CHANNELS):
                got = None if given is None else tuple(given.shape)
                raise AlayaError(f"G-buffer refiner: reads whether the light and shadows were given ({rgb.shape[0]}, "
                                 f"{GIVEN_CHANNELS}), got {got}")
            inputs.append(given.to(rgb.dtype)[:, :, None, None].expand(-1, -1, *rgb.shape[-2:]))
        x = channels_last(torch.cat(inputs, 1).to(p.dtype) * 2 - 1)
        f = fused.sequential(self.head, x)
        film = None
        c = self.config.width
        if self.text_dim:
            if text is None or text.shape != (rgb.shape[0], self.text_dim):
                got = None if text is None else tuple(text.shape)
                raise AlayaError(f"G-buffer refiner: reads a prompt embedding ({rgb.shape[0]}, {self.text_dim}), got {got}")
            film = self.text(text.to(p.dtype))[:, :, None, None]  # (M, 6c, 1, 1)
            f = _film(f, 1 + film[:, :c], film[:, c:2 * c])
        d = fused.sequential(self.down, f)
        if film is not None:
            d = _film(d, 1 + film[:, 2 * c:4 * c], film[:, 4 * c:])
        if self.config.context:
            d = d + self._context(d, text)
        # (upsampled in float32: faster than bf16 on the CPU, 1.06 against 1.37 ms at 256x256, and rounded once)
        d = F.interpolate(d.float(), size=f.shape[-2:], mode="bilinear", align_corners=False).to(f.dtype)
        first, _, last = self.tail
        if fused.fusable(f):  # tail conv over [f, d] as two convolutions, the second adding onto the first:
            # no concatenated copy of 3c channels at full resolution
            h = fused.conv2d(d, first.weight[:, c:], first.bias, 1, 1)
            h = fused.conv2d(f, first.weight[:, :c], None, 1, 1, relu=True, add=h)
        else:
            h = torch.relu(first(torch.cat([f, d], 1)))
        out = fused.conv(last, h).float()
        if self.config.blend:  # the weight's channel starts at zero like the residual's: no blend untrained
            return rgb + out[:, :3] + out[:, 3:] * (prior[:, :3].float() - rgb)
        return rgb + out

    def _context(self, d: Tensor, text: Tensor | None) -> Tensor:
        """The coarse path's contribution to the quarter-resolution features d (M, 2c, H/4, W/4)."""
        e = fused.sequential(self.context, d)
        if self.text_dim:
            k = self.config.context
            film = self.context_text(text.to(e.dtype))[:, :, None, None]  # (M, 2k, 1, 1)
            e = _film(e, 1 + film[:, :k], film[:, k:])
        e = fused.conv(self.context_out, e)
        # (upsampled in float32, as the quarter-resolution path below)
        return F.interpolate(e.float(), size=d.shape[-2:], mode="bilinear", align_corners=False).to(d.dtype)

    @torch.no_grad()
    def refine(self, frames: Tensor, gbuffers: Tensor, text: Tensor | None = None, light: Tensor | None = None,
               depth_near: float = 0.5, up: Tensor | None = None, sun_visibility: Tensor | None = None,
               light_given: Tensor | bool = True, prior: Tensor | None = None,
               sky_visibility: Tensor | None = None) -> Tensor:
        """IMAGE frames (T, H, W, 3) float [0, 1] and their G-buffers uint8 (T, 5, H, W, 3) -> IMAGE frames.

        text: each frame's prompt embedding (T, text_dim), for a config that reads prompts (else ignored).
        light: each frame's packed light (T, PACKED) (model_zoo/light.py), for a config that reads the light
        (else ignored), with the G-buffers' depth_near and camera-space up (T, 3) (None: from the normals).
        sun_visibility: (T, H, W) in [0, 1], an engine's shadow pass: the prior's shadows (None: screen-space).
        sky_visibility: (T, H, W) in [0, 1], an engine's sky pass: the prior's ambient occlusion, for a config that
        reads it (`sky`; else ignored: the prior's screen-space AO, as it was trained).
        light_given: whether each frame's light was given (bool, or (T,) bool) rather than read from the prompt,
        for a config that reads it (else ignored).
        prior: the shading prior's planes of these frames under `light` (T, 5, H, W), already computed (a
        light-reading encoder's, streaming/render/pipelines.py); None: computed here.
        """
        if frames.shape[0] != gbuffers.shape[0] or tuple(frames.shape[1:3]) != tuple(gbuffers.shape[2:4]):
            raise AlayaError(f"G-buffer refiner: frames {tuple(frames.shape)} and G-buffers {tuple(gbuffers.shape)} "
                             "differ in count or size")
        if self.text_dim and (text is None or len(text) != len(frames)):
            raise AlayaError(f"G-buffer refiner: this refiner reads the prompt: it needs one embedding per frame "
                             f"({len(frames)}), got {None if text is None else len(text)}")
        if self.reads_light and (light is None or len(light) != len(frames)):
            raise AlayaError(f"G-buffer refiner: this refiner reads the light: it needs one light per frame "
                             f"({len(frames)}), got {None if light is None else len(light)}")
        device = self.tail[-1].weight.device
        outs = []
        for t in range(frames.shape[0]):  # one frame per call: its result never depends on how the stream was cut
            rgb = frames[t:t + 1].to(device).permute(0, 3, 1, 2).float()
            emb = text[t:t + 1].to(device) if self.text_dim else None
            planes = None
            if self.reads_light and prior is not None:
                planes = prior[t:t + 1].to(device)
            elif self.reads_light:
                planes = self.shading_prior(gbuffers[t:t + 1], light[t:t + 1], depth_near,
                                            None if up is None else up[t:t + 1],
                                            None if sun_visibility is None else sun_visibility[t:t + 1],
                                            sky_visibility=None if sky_visibility is None or not self.config.sky
                                            else sky_visibility[t:t + 1]).to(device)
            given = None
            if self.config.given:
                lit = light_given if isinstance(light_given, bool) else bool(light_given[t])
                given = torch.tensor([[float(lit), float(sun_visibility is not None)]], device=device)
            out = self(rgb, gbuffer_planes(gbuffers[t:t + 1].to(device)), emb, planes, given)
            outs.append(out.clamp(0, 1).permute(0, 2, 3, 1).contiguous().cpu())
        return torch.cat(outs) if outs else frames


def build(cfg: RefinerConfig) -> GBufferRefiner:
    return GBufferRefiner(cfg)
