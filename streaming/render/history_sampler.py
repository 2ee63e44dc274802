"""The second sampler kind: few-step autoregressive chunks over a compressed history (Helios).

The KV-cache sampler (kv_cache_sampler.py) keeps every past frame's keys and values in a rolling window.
This one keeps past *latents* instead, in three windows that the backbone patchifies at three
rates (diffusers' Helios: long, mid and short memory patches), and re-reads them as tokens on
every pass:

    sampler = HistorySampler(dit)                        # dit: model_zoo.helios.HeliosDiT
    state = sampler.new_state(prompt_emb, seed=0)
    for cond in chunks:                                  # (B, 80, T_chunk, h, w) G-buffer latents
        latents, state = sampler.step(state, cond)       # (B, 16, T_chunk, h, w), clean

- History: the last sum(history_sizes) finished latent frames (Helios defaults long 16, mid 2,
  short 1), zeros before the stream has that many, and the stream's first latent frame kept apart
  as an anchor (zeros until the first chunk is done) in front of the short window. Each history
  frame carries what the memory patchifiers take: its latents, and its G-buffer latents too when
  they take every input channel.
- Positions are fixed: the anchor at 0, the long window at 1..16, mid 17..18, short 19, the chunk
  from 20, whatever the stream's length, so RoPE never grows; memory is the windows' fixed size.
- History tokens run at the zero timestep (the backbone's zero_history_timestep), so a chunk needs
  no separate clean pass: finishing a chunk only shifts the windows.
- The chunk's input is [noisy latents | G-buffer latents] on channels, the teacher's 96-channel
  patch embedding exactly.
- Sampling: "x0", the few-step x0 loop with re-noising between steps at the warped timesteps (the
  KV-cache sampler's); or "euler", flow-matching Euler over explicit sigmas (diffusers'
  HeliosScheduler with scheduler_type "euler"). Noise comes from the state's own CPU generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ...model_zoo.errors import AlayaError
from ...model_zoo.helios import HeliosDiT, HistoryWindows
from . import sampler

SAMPLERS = ("x0", "euler")


@dataclass(frozen=True)
class HistoryConfig:
    """How a compressed-history stream samples. Defaults: Helios's windows, the 4 warped steps."""

    nominal_steps: tuple[float, ...] = sampler.FEW_STEP_NOMINAL
    shift: float = sampler.FEW_STEP_SHIFT
    history_sizes: tuple[int, int, int] = (16, 2, 1)  # long, mid, short latent frames (sorted largest first)
    sampler: str = "x0"
    sigmas: tuple[float, ...] | None = None  # "euler": the schedule, ending at 0; "x0": overrides the warped steps

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise AlayaError(f"HistoryConfig: sampler {self.sampler!r} is not one of {', '.join(SAMPLERS)}")
        if len(self.history_sizes) != 3 or min(self.history_sizes) < 1:
            raise AlayaError(f"HistoryConfig: history_sizes must be three sizes >= 1 (long, mid, short), got {self.history_sizes}")
        # largest first, as diffusers' HeliosPipeline sorts them: (1, 2, 4) is long 4, mid 2, short 1
        object.__setattr__(self, "history_sizes", tuple(sorted(self.history_sizes, reverse=True)))
        if self.sampler == "euler" and not self.sigmas:
            raise AlayaError("HistoryConfig: the euler sampler needs its sigmas")

    def schedule(self) -> list[float]:
        if self.sigmas:
            return [float(s) for s in self.sigmas]
        return [float(t) / 1000 for t in sampler.warped_timesteps(self.nominal_steps, self.shift)]


@dataclass
class HistoryState:
    """Everything one stream carries between chunks: bounded by the windows, whatever its length."""

    seed: int
    generator: torch.Generator  # CPU generator: the only source of this stream's noise
    prompt: Tensor  # (B, L, text_dim)
    history: Tensor | None = None  # (B, history_channels, sum(history_sizes), h, w), oldest first
    anchor: Tensor | None = None  # (B, history_channels, 1, h, w): the stream's first latent frame
    frame: int = 0  # latent frames rendered so far
    chunks: int = 0

    def tensors(self) -> list[Tensor]:
        return [t for t in (self.history, self.anchor) if t is not None]


def positions(history_sizes: tuple[int, int, int], chunk: int) -> dict[str, Tensor]:
    """The fixed frame positions (1, n) of anchor + long | mid | short | chunk, as Helios numbers them."""
    long, mid, short = history_sizes
    idx = torch.arange(0, 1 + long + mid + short + chunk)
    anchor, p_long, p_mid, p_short, p_chunk = idx.split([1, long, mid, short, chunk])
    return {"long": p_long[None], "mid": p_mid[None], "short": torch.cat([anchor, p_short])[None], "chunk": p_chunk[None]}


class HistorySampler:
    """Few-step autoregressive sampler over a Helios backbone with compressed history. Holds no stream state."""

    kind = "history"

    def __init__(self, dit: HeliosDiT, config: HistoryConfig = HistoryConfig()):
        self.model = dit
        self.config = config
        self.sigmas = config.schedule()

    def new_state(self, prompt_emb: Tensor, seed: int = 0) -> HistoryState:
        self._check_prompt(prompt_emb)
        return HistoryState(seed=seed, generator=torch.Generator("cpu").manual_seed(seed), prompt=prompt_emb)

    def reset(self, state: HistoryState) -> HistoryState:
        """Back to frame 0 with the same seed and prompt: the windows are zeroed, not reallocated."""
        state.generator.manual_seed(state.seed)
        if state.history is not None:
            state.history.zero_()
        state.anchor = None
        state.frame = state.chunks = 0
        return state

    def set_prompt(self, state: HistoryState, prompt_emb: Tensor) -> HistoryState:
        """Change the prompt from the next chunk on; the history (rendered under the old one) is kept."""
        self._check_prompt(prompt_emb)
        if prompt_emb.shape[0] != state.prompt.shape[0]:
            raise AlayaError(f"new prompt has batch {prompt_emb.shape[0]}, the stream has batch {state.prompt.shape[0]}")
        state.prompt = prompt_emb
        return state

    def _check_prompt(self, prompt_emb: Tensor) -> None:
        want = self.model.config.text_dim
        if prompt_emb.ndim != 3 or prompt_emb.shape[-1] != want:
            raise AlayaError(f"prompt embedding has shape {tuple(prompt_emb.shape)}, expected (batch, tokens, {want})")

    def _check(self, state: HistoryState, cond: Tensor) -> None:
        cfg = self.model.config
        want = (state.prompt.shape[0], cfg.cond_dim)
        if cond.ndim != 5 or tuple(cond.shape[:2]) != want:
            raise AlayaError(f"conditioning latents have shape {tuple(cond.shape)}, expected ({want[0]}, {want[1]}, frames, height, width)")
        if state.history is not None and tuple(state.history.shape[-2:]) != tuple(cond.shape[-2:]):
            raise AlayaError(f"latent size changed mid-stream from {tuple(state.history.shape[-2:])} to "
                             f"{tuple(cond.shape[-2:])}; reset the stream for a new size")

    def windows(self, state: HistoryState, chunk: int) -> HistoryWindows:
        """The chunk's history as the backbone takes it (anchor in front of the short window)."""
        long, mid, short = state.history.split(list(self.config.history_sizes), dim=2)
        anchor = state.anchor if state.anchor is not None else torch.zeros_like(short[:, :, :1])
        pos = positions(self.config.history_sizes, chunk)
        return HistoryWindows(long=long, mid=mid, short=torch.cat([anchor, short], 2), positions_long=pos["long"],
                              positions_mid=pos["mid"], positions_short=pos["short"], positions_chunk=pos["chunk"])

    def step(self, state: HistoryState, cond_latents: Tensor) -> tuple[Tensor, HistoryState]:
        """Render one chunk: cond_latents (B, cond_dim, T, h, w) -> clean latents (B, out_dim, T, h, w)."""
        self._check(state, cond_latents)
        model, cfg = self.model, self.model.config
        b, _, frames, h, w = cond_latents.shape
        device = next(model.parameters()).device
        cond = cond_latents.to(device=device, dtype=torch.float32)
        if state.history is None:
            state.history = torch.zeros(b, cfg.history_channels, sum(self.config.history_sizes), h, w, device=device)
        history = self.windows(state, frames)
        shape = (b, cfg.out_dim, frames, h, w)

        def draw(*_) -> Tensor:  # Wan's and diffusers' recipe: float32 noise on the CPU
            return torch.randn(shape, generator=state.generator, dtype=torch.float32).to(device)

        def velocity(x: Tensor, sigma: float) -> Tensor:
            t = torch.full((b,), 1000 * sigma, device=device)
            return model(torch.cat([x, cond], 1), t, state.prompt.to(device), history)

        with torch.no_grad():
            if self.config.sampler == "euler":
                latents = sampler.sample_euler(velocity, draw(), self.sigmas)
            else:
                latents = sampler.sample_x0(lambda x, s: sampler.x0_from_velocity(x, velocity(x, s), s),
                                            draw(), self.sigmas, draw)
        finished = torch.cat([latents, cond], 1) if cfg.history_channels == cfg.in_dim else latents
        if state.anchor is None:
            state.anchor = finished[:, :, :1].clone()
        total = state.history.shape[2]
        state.history = torch.cat([state.history, finished], 2)[:, :, -total:].contiguous()
        state.frame += frames
        state.chunks += 1
        return latents, state
