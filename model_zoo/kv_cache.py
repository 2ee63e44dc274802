"""Rolling self-attention KV cache for streaming the DiT one chunk at a time.

One preallocated pair of tensors holds, for every block, the keys and values of the latent
frames the current chunk may attend to: `sink_frames` first frames of the stream (kept forever)
plus the most recent `window_frames` frames, the current chunk included. Layout of `k` and `v`:
(num_layers, B, heads, (sink_frames + window_frames) * tokens_per_frame, head_dim). Memory is
fixed at construction, whatever the stream length.

Semantics (after guandeh17/Self-Forcing wan/modules/causal_model.py, written afresh):
- `begin(start_frame, n)` once per DiT pass, before the blocks run. A chunk that starts at the
  stream's end is new: it is appended, and only then are the oldest non-sink frames evicted to
  make room. The same chunk again (re-denoising, or the clean pass at t=0) overwrites its slot,
  so the cache length does not change.
- `update(layer, k, v)` in each block writes the chunk's keys/values into its slot and returns
  the keys/values to attend to (all frames held, the chunk's own last).
- RoPE "absolute": keys are stored rotated at their absolute latent frame (checkpoint-faithful;
  a stream ends at `rope_positions` frames, 1024 in Wan). RoPE "relative": keys are stored
  un-rotated and rotated on read with positions 0.. over the frames held (sink first), so
  positions stay below sink + window and a stream can run forever. Before the first eviction
  both modes give the same positions.
"""
from __future__ import annotations

import torch

from .errors import AlayaError

ROPE_MODES = ("absolute", "relative")


class KVCache:
    """Per-block keys and values of the frames a streaming chunk attends to (see module docstring)."""

    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        num_heads: int,
        head_dim: int,
        tokens_per_frame: int,
        window_frames: int,
        sink_frames: int = 0,
        rope: str = "relative",
        rope_positions: int = 1024,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        if rope not in ROPE_MODES:
            raise AlayaError(f"KV cache: rope {rope!r} is not one of {', '.join(ROPE_MODES)}")
        if window_frames < 1 or sink_frames < 0:
            raise AlayaError(f"KV cache: window_frames {window_frames} must be >= 1 and sink_frames {sink_frames} >= 0")
        self.rope = rope
        self.rope_positions = rope_positions
        self.tokens_per_frame = tokens_per_frame
        self.window_frames = window_frames
        self.sink_frames = sink_frames
        self.batch = batch
        shape = (num_layers, batch, num_heads, (sink_frames + window_frames) * tokens_per_frame, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.k_rotated: torch.Tensor | None = None  # relative mode: the held keys rotated (rotated_keys)
        self.reset()

    @property
    def capacity_frames(self) -> int:
        return self.sink_frames + self.window_frames

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def reset(self) -> None:
        """Forget everything held (the tensors are kept; nothing is reallocated)."""
        self.frames = 0  # latent frames held, sink included
        self.end_frame = 0  # absolute stream position one past the last frame written
        self.chunk: tuple[int, int] | None = None  # (start_frame, n_frames) of the chunk in its slot
        self.evicted = 0  # frames dropped so far (for inspection)
        self.rotated_upto = [0] * self.k.shape[0]  # per layer: tokens of k_rotated still valid

    def begin(self, start_frame: int, n_frames: int, *, tokens_per_frame: int, batch: int) -> int:
        """Place a chunk; returns the RoPE frame position of its first frame.

        Absolute mode: start_frame. Relative mode: the chunk's first slot in the cache.
        """
        if tokens_per_frame != self.tokens_per_frame or batch != self.batch:
            raise AlayaError(
                f"KV cache sized for batch {self.batch} x {self.tokens_per_frame} tokens per frame, "
                f"got batch {batch} x {tokens_per_frame} (the latent size changed mid-stream; reset the stream)"
            )
        if self.chunk == (start_frame, n_frames):  # re-denoise: same slot, no growth, no eviction
            pass
        elif start_frame == self.end_frame:  # a new chunk: append, evicting only now
            if n_frames > self.window_frames:
                raise AlayaError(f"KV cache: chunk of {n_frames} latent frames does not fit the window of {self.window_frames}")
            if self.rope == "absolute" and start_frame + n_frames > self.rope_positions:
                raise AlayaError(
                    f"KV cache: latent frame {start_frame + n_frames} is past the {self.rope_positions} absolute RoPE "
                    "positions; use rope='relative' for longer streams"
                )
            overflow = self.frames + n_frames - self.capacity_frames
            if overflow > 0:
                self._evict(overflow)
            self.frames += n_frames
            self.end_frame = start_frame + n_frames
            self.chunk = (start_frame, n_frames)
        else:
            expected = f"{self.end_frame}" + (f" (next) or {self.chunk[0]} (again)" if self.chunk else "")
            raise AlayaError(f"KV cache: a chunk starting at latent frame {start_frame}, expected {expected}")
        first_slot = self.frames - n_frames
        return start_frame if self.rope == "absolute" else first_slot

    def resume_at(self, end_frame: int) -> None:
        """After re-encoding the held frames from position 0 (a prompt re-cache), continue the
        stream at absolute latent frame end_frame. Relative RoPE only: absolute keys would sit
        at the wrong positions."""
        if self.rope != "relative":
            raise AlayaError("KV cache: re-encoding the held frames needs rope='relative'")
        self.end_frame = end_frame
        self.chunk = None

    def _evict(self, n: int) -> None:
        """Drop the n oldest frames after the sink, shifting the rest left (one copy for all layers)."""
        tpf, sink = self.tokens_per_frame, self.sink_frames
        keep = (self.frames - sink - n) * tpf
        src, dst = (sink + n) * tpf, sink * tpf
        for buf in (self.k, self.v):
            buf[:, :, :, dst : dst + keep] = buf[:, :, :, src : src + keep].clone()
        self.frames -= n
        self.evicted += n
        self.rotated_upto = [0] * self.k.shape[0]  # every moved frame sits at a new position

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the current chunk's k, v (B, heads, n_tokens, head_dim) into its slot.

        Returns keys and values (B, heads, frames_held * tokens_per_frame, head_dim) to attend to.
        Stored values are detached; when k needs gradients the chunk's own live k/v are returned
        in its slot, so a training step through the cached path still reaches them.
        """
        end = self.frames * self.tokens_per_frame
        start = end - k.shape[2]
        self.k[layer, :, :, start:end] = k.detach().to(self.k.dtype)
        self.v[layer, :, :, start:end] = v.detach().to(self.v.dtype)
        if k.requires_grad or v.requires_grad:
            return (
                torch.cat([self.k[layer, :, :, :start], k.to(self.k.dtype)], dim=2),
                torch.cat([self.v[layer, :, :, :start], v.to(self.v.dtype)], dim=2),
            )
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def rotated_keys(self, layer: int, rotate) -> torch.Tensor:
        """Relative mode: the held keys (after `update`) rotated at their slots, as rotate(keys, first
        token) gives them. The frames before the current chunk keep their rotation between passes
        (their keys and slots change only when frames are evicted), so a chunk's denoising passes
        rotate only its own keys: the same values as rotating every held key on every pass."""
        end = self.frames * self.tokens_per_frame
        start = end - self.chunk[1] * self.tokens_per_frame if self.chunk else end
        if self.k_rotated is None:
            self.k_rotated = torch.empty_like(self.k)
        done = self.rotated_upto[layer]
        if done < start:
            self.k_rotated[layer, :, :, done:start] = rotate(self.k[layer, :, :, done:start], done)
        self.k_rotated[layer, :, :, start:end] = rotate(self.k[layer, :, :, start:end], start)
        self.rotated_upto[layer] = start
        return self.k_rotated[layer, :, :, :end]
