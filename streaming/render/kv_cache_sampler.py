"""The KV-cache sampler: few-step autoregressive streaming over a DiT with a rolling KV cache.

Chunk by chunk (after guandeh17/Self-Forcing pipeline/causal_inference.py):

    sampler = KVCacheSampler(model)                         # model: model_zoo.dit.WanDiT
    state = sampler.new_state(prompt_emb, seed=0)           # prompt_emb (B, L, text_dim)
    for cond in chunks:                                     # cond (B, 80, T_chunk, h, w) G-buffer latents
        latents, state = sampler.step(state, cond)          # latents (B, 16, T_chunk, h, w), clean
    sampler.set_prompt(state, other_emb)                    # mid-stream prompt change
    sampler.reset(state)                                    # same seed, same prompt, from frame 0

Each chunk: 1. fresh noise from the state's generator; 2. the few-step x0 loop at the warped
timesteps, re-noising between steps, every pass against the rolling KV cache (re-denoising
overwrites the chunk's slot); 3. one clean pass of the result at t = context_t (0) writes the
chunk's keys/values for later chunks. The state is updated in place and also returned.

The teacher's sampler is teacher_sampler.py; the Flash release's compressed history, history_sampler.py.
Latents are Wan-normalised (the DiT's space), layout BCTHW, float32 on the model's device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...model_zoo.dit import PromptContext, WanDiT
from ...model_zoo.errors import AlayaError
from ...model_zoo.kv_cache import ROPE_MODES, KVCache
from . import sampler


@dataclass(frozen=True)
class KVCacheConfig:
    """How a Flash stream samples. Defaults: Self-Forcing's 4 warped steps, LongLive's window + sink."""

    nominal_steps: tuple[float, ...] = sampler.FEW_STEP_NOMINAL  # warped with `shift` -> 1000, 937.5, 833.3, 625
    shift: float = sampler.FEW_STEP_SHIFT
    window_frames: int = 12  # latent frames attended besides the sink, the current chunk included
    sink_frames: int = 3  # first latent frames of the stream, kept in the cache forever
    rope: str = "relative"  # "absolute": checkpoint-faithful, ends at 1024 latent frames
    context_t: float = 0.0  # timestep of the pass that writes a finished chunk into the cache
    # On a prompt change, re-encode the held frames under the new prompt (LongLive's KV re-cache).
    # Keeps the clean inputs of the held frames: B x in_dim x (sink + window) x h x w floats.
    recache_on_prompt: bool = False

    def __post_init__(self):
        if self.rope not in ROPE_MODES:
            raise AlayaError(f"KVCacheConfig: rope {self.rope!r} is not one of {', '.join(ROPE_MODES)}")
        if self.recache_on_prompt and self.rope != "relative":
            raise AlayaError("KVCacheConfig: recache_on_prompt needs rope='relative'")
        if not self.nominal_steps:
            raise AlayaError("KVCacheConfig: nominal_steps is empty")

    @property
    def timesteps(self) -> torch.Tensor:
        return sampler.warped_timesteps(self.nominal_steps, self.shift)


class InputHistory:
    """Clean DiT inputs (latents + conditioning, B x in_dim x frames x h x w) of exactly the frames
    the KV cache holds, in the same slots: the sink, then the window; evicted as the cache evicts."""

    def __init__(self, batch: int, channels: int, capacity: int, height: int, width: int, sink: int, device):
        self.x = torch.zeros(batch, channels, capacity, height, width, device=device)
        self.sink = sink
        self.frames = 0
        self.last_chunk = 0

    def append(self, chunk: torch.Tensor, evicted: int) -> None:
        """Add a chunk's inputs after dropping the `evicted` oldest non-sink frames (as the cache did)."""
        if evicted:
            s, n = self.sink, self.frames
            self.x[:, :, s : n - evicted] = self.x[:, :, s + evicted : n].clone()
            self.frames -= evicted
        n = chunk.shape[2]
        self.x[:, :, self.frames : self.frames + n] = chunk
        self.frames += n
        self.last_chunk = n

    def groups(self) -> list[tuple[int, int]]:
        """(start, size) runs of the held frames, cut like the chunks from the newest backwards."""
        out, end = [], self.frames
        while end > 0:
            size = min(self.last_chunk, end)
            out.append((end - size, size))
            end -= size
        return out[::-1]


@dataclass
class StreamState:
    """Everything one stream carries between chunks; sized from the model config, bounded."""

    seed: int
    generator: torch.Generator  # CPU generator: the only source of this stream's noise
    prompt: PromptContext  # cross-attention K/V of the current prompt
    cache: KVCache | None = None  # allocated on the first chunk (its size needs the latent size)
    frame: int = 0  # absolute latent-frame index of the next chunk
    chunks: int = 0
    history: InputHistory | None = None  # only with KVCacheConfig.recache_on_prompt


class KVCacheSampler:
    """Few-step autoregressive sampler over a DiT with a rolling KV cache. Holds no stream state."""

    def __init__(self, model: WanDiT, config: KVCacheConfig = KVCacheConfig()):
        self.model = model
        self.config = config
        self.sigmas = [float(t) / 1000 for t in config.timesteps]

    def new_state(self, prompt_emb: torch.Tensor, seed: int = 0) -> StreamState:
        """A fresh stream for a prompt embedding (B, L, text_dim)."""
        with torch.no_grad():
            prompt = self.model.prepare_prompt(prompt_emb)
        return StreamState(seed=seed, generator=torch.Generator("cpu").manual_seed(seed), prompt=prompt)

    def reset(self, state: StreamState) -> StreamState:
        """Back to frame 0 with the same seed and prompt; the cache is emptied, not reallocated."""
        state.generator.manual_seed(state.seed)
        if state.cache is not None:
            state.cache.reset()
        if state.history is not None:
            state.history.frames = 0
        state.frame = state.chunks = 0
        return state

    def set_prompt(self, state: StreamState, prompt_emb: torch.Tensor) -> StreamState:
        """Change the prompt mid-stream: recompute the cross-attention K/V of the text.

        By default the self-attention cache is kept: the frames it holds were made under the old
        prompt and keep steering continuity; non-sink frames roll out of the window within
        window_frames latent frames. With KVCacheConfig.recache_on_prompt the held frames are
        re-encoded under the new prompt (one clean pass per held chunk). docs/model.md,
        "Prompt change". Call reset() for a hard cut.
        """
        with torch.no_grad():
            prompt = self.model.prepare_prompt(prompt_emb)
        if prompt.batch != state.prompt.batch:
            raise AlayaError(f"new prompt has batch {prompt.batch}, the stream has batch {state.prompt.batch}")
        state.prompt = prompt
        if self.config.recache_on_prompt and state.history is not None and state.history.frames:
            self._recache(state)
        return state

    def _recache(self, state: StreamState) -> None:
        """Re-run the held frames' clean inputs through an emptied cache under the current prompt."""
        cache, history = state.cache, state.history
        t = torch.full((history.x.shape[0],), float(self.config.context_t), device=history.x.device)
        cache.reset()
        with torch.no_grad():
            for start, size in history.groups():
                self.model(history.x[:, :, start : start + size], t, state.prompt, cache=cache, start_frame=start)
        cache.resume_at(state.frame)

    def _check(self, state: StreamState, cond: torch.Tensor) -> None:
        cfg = self.model.config
        want = (state.prompt.batch, cfg.cond_dim)
        if cond.ndim != 5 or tuple(cond.shape[:2]) != want:
            raise AlayaError(
                f"conditioning latents have shape {tuple(cond.shape)}, expected ({want[0]}, {want[1]}, frames, height, width)"
            )

    def step(self, state: StreamState, cond_latents: torch.Tensor) -> tuple[torch.Tensor, StreamState]:
        """Render one chunk: cond_latents (B, cond_dim, T, h, w) -> clean latents (B, out_dim, T, h, w)."""
        self._check(state, cond_latents)
        model, cfg = self.model, self.config
        b, _, frames, h, w = cond_latents.shape
        device = next(model.parameters()).device
        cond = cond_latents.to(device=device, dtype=torch.float32)
        if state.cache is None:
            state.cache = model.new_cache(b, h, w, window_frames=cfg.window_frames, sink_frames=cfg.sink_frames, rope=cfg.rope)
            if cfg.recache_on_prompt:
                capacity = cfg.sink_frames + cfg.window_frames
                state.history = InputHistory(b, model.config.in_dim, capacity, h, w, cfg.sink_frames, device)
        evicted_before = state.cache.evicted
        shape = (b, model.config.out_dim, frames, h, w)

        def draw() -> torch.Tensor:  # Wan's recipe: float32 noise on the CPU
            return torch.randn(shape, generator=state.generator, dtype=torch.float32).to(device)

        with torch.no_grad():
            velocity = chunk_velocity(model, cond, state.prompt, state.cache, state.frame)
            latents = sample_chunk(velocity, draw, self.sigmas, cfg.context_t)
        if state.history is not None:
            state.history.append(torch.cat([latents, cond], 1), state.cache.evicted - evicted_before)
        state.frame += frames
        state.chunks += 1
        return latents, state


def chunk_velocity(model: WanDiT, cond: torch.Tensor, prompt: PromptContext | torch.Tensor, cache: KVCache,
                   start_frame: int) -> Callable[..., torch.Tensor]:
    """v(x, sigma, prompt=prompt) of one AR chunk against the rolling cache: each pass writes the
    chunk's keys/values into its slot (the next pass overwrites them)."""
    b = cond.shape[0]

    def velocity(x: torch.Tensor, sigma: float, prompt=prompt) -> torch.Tensor:
        t = torch.full((b,), 1000 * sigma, device=cond.device)
        return model(torch.cat([x, cond], 1), t, prompt, cache=cache, start_frame=start_frame)

    return velocity


def sample_chunk(velocity: Callable[..., torch.Tensor], noise: Callable[[], torch.Tensor], sigmas: list[float],
                 context_t: float = 0.0, denoise: Callable[[torch.Tensor, float], torch.Tensor] | None = None) -> torch.Tensor:
    """One AR chunk (Self-Forcing's causal inference): 1. the few-step x0 loop from noise(), re-noised
    with noise() between steps, every pass against the cache; 2. one clean pass of the result at
    t = context_t (without gradients), which leaves the chunk's final keys/values for later chunks.

    denoise(x, sigma) -> x0 defaults to x0 from `velocity`; training passes its own (gradients at
    one exit step, fewer steps). KVCacheSampler.step and the training rollout both run this."""
    denoise = denoise or (lambda x, s: sampler.x0_from_velocity(x, velocity(x, s), s))
    x0 = sampler.sample_x0(denoise, noise(), sigmas, lambda _step: noise())
    with torch.no_grad():
        velocity(x0.detach(), context_t / 1000)
    return x0
