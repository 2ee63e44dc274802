"""The Flash and teacher pipelines as chunk-level stages with explicit state.

Nodes, the workflow runner, `alaya-flash bench`, evaluation and the live page all call these.
Every stage has the same shape as a runner stage: `step(chunk) -> output or None` (None: nothing
ready yet), `flush() -> output or None` at the end of the stream. State (codec memory, KV cache,
frame counters, the current prompt) lives in the stage object, never in the model.

Flash (one continuous causal stream):

    enc = GBufferEncode(model.gbuffer_encoder)         # teacher-form uint8 -> cond latents
    smp = FlashSample(model, prompts, seed=0)          # cond latents -> clean latents (AR chunks)
    dec = Decode(TinyDecoder(model.decoder))           # clean latents -> RGB frames
    ref = Refine(model.refiner, prompts)               # frames + their G-buffers (+ prompt) -> frames (optional)
    for gbuffers in chunks:                            # GBuffers (T, 5, H, W, 3) uint8
        rgb = ref.step(dec.step(smp.step(enc.step(gbuffers))), gbuffers)  # (t, H, W, 3) float [0, 1], or None
    ... then the same with flush() at the end. `flash_steps` puts exactly this on the one chunk loop
    (streaming/engine/driver.py); FlashPipeline is that stage list with step/flush/run.

Teacher (bidirectional windows of `window_frames` pixel frames, independent clips):

    enc = TeacherEncode(teacher.vae, window_frames=81) # Wan VAE per modality, one window at a time
    smp = TeacherSample(teacher, prompts, negative, steps=50, cfg=5, shift=5, seed=0)
    dec = Decode(vae_decoder(teacher))                 # full Wan VAE

Frame arithmetic (Wan's: latent 0 = pixel frame 0 alone, latent i >= 1 = pixel frames 4i-3..4i;
the tiny decoder and the Wan VAE both turn T' latents into 4T'-3 frames, the tiny one by
trimming 3 frames at the start of a stream). A stream of N frames is padded at its end with
copies of its last frame up to 4k+1 frames (pad = (1 - N) mod 4, at most 3), so k+1 latents
carry every frame; `Latents.pad` carries that count through the sampler, and the decoder drops
the pad frames after decoding, so N input frames give exactly N output frames. Padding happens
only at flush, so the result does not depend on how the stream was cut into chunks.

Chunk values (what flows between nodes; both join with `concat` along time):
    GBuffers  images uint8 (T, 5, H, W, 3), teacher form, MODALITIES order; fps; depth_near
    Latents   tensor (B, C, T', h, w) float32, normalized Wan space; starts (latent indices that
              begin an independent clip: decoders reset there); pad (pixel frames to drop at the end)
RGB frames are ComfyUI IMAGE: float32 (T, H, W, 3) in [0, 1] on the CPU.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ...model_zoo.errors import AlayaError
from ...model_zoo.styles import ORIGINAL, styled
from ...model_zoo.latents import TIME_COMPRESSION
from ...model_zoo.text_encoder import sentence_embedding
from .driver import Lanes, StageGraph, Step, concat_chunks, ticks
from ..gbuffer import DEFAULT_DEPTH_NEAR, MODALITIES
from .history_session import HistoryConfig, HistorySession
from .session import FlashSession, SessionConfig, StreamState, teacher_sample

# ---------------------------------------------------------------------------------------------
# Chunk values.


@dataclass
class GBuffers:
    """A run of G-buffer frames in teacher form: images uint8 (T, 5, H, W, 3), MODALITIES order."""

    images: torch.Tensor
    fps: float = 16.0
    depth_near: float = DEFAULT_DEPTH_NEAR

    def __post_init__(self):
        if isinstance(self.images, np.ndarray):
            self.images = torch.from_numpy(np.ascontiguousarray(self.images))
        x = self.images
        if x.dtype != torch.uint8 or x.ndim != 5 or x.shape[1] != len(MODALITIES) or x.shape[-1] != 3:
            raise AlayaError(f"G-buffers: expected uint8 (T, 5, H, W, 3) teacher form, got {x.dtype} {tuple(x.shape)}")

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        return tuple(self.images.shape[2:4])

    @classmethod
    def concat(cls, chunks: list["GBuffers"]) -> "GBuffers":
        return cls(torch.cat([c.images for c in chunks]), chunks[0].fps, chunks[0].depth_near)

    def pieces(self, n: int) -> list["GBuffers"]:
        """Consecutive pieces of at most n frames."""
        return [GBuffers(self.images[a:a + n], self.fps, self.depth_near) for a in range(0, len(self), n)] or [self]


@dataclass
class Latents:
    """Latent frames (B, C, T', h, w) float32, normalized Wan space (see module docstring)."""

    tensor: torch.Tensor
    starts: tuple[int, ...] = ()
    pad: int = 0
    fps: float = 16.0

    def __len__(self) -> int:
        return self.tensor.shape[2]

    @classmethod
    def concat(cls, chunks: list["Latents"]) -> "Latents":
        starts, offset = [], 0
        for c in chunks:
            starts += [offset + s for s in c.starts]
            offset += len(c)
        return cls(torch.cat([c.tensor for c in chunks], 2), tuple(starts), sum(c.pad for c in chunks), chunks[0].fps)

    def pieces(self, n: int) -> list["Latents"]:
        """Consecutive pieces of at most n latent frames (starts and pad kept where they fall)."""
        out = []
        for a in range(0, len(self), n):
            b = min(a + n, len(self))
            starts = tuple(s - a for s in self.starts if a <= s < b)
            out.append(Latents(self.tensor[:, :, a:b], starts, self.pad if b == len(self) else 0, self.fps))
        return out

    def split(self) -> list["Latents"]:
        """Pieces that each lie within one clip (a piece starting a clip has starts == (0,))."""
        cuts = sorted(set([0, *self.starts, len(self)]))
        out = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            out.append(Latents(self.tensor[:, :, a:b], (0,) if a in self.starts else (), self.pad if b == len(self) else 0, self.fps))
        return out


# ---------------------------------------------------------------------------------------------
# Prompts: a schedule keyed by pixel frame.

_SCHEDULE_LINE = re.compile(r"^\s*(\d+)\s*:\s*(.*)$")


def parse_schedule(text: str) -> list[tuple[int, str]]:
    """'a sunny street' -> [(0, text)]; lines 'FRAME: prompt' -> a schedule keyed by pixel frame.

    Lines without a 'FRAME:' prefix continue the previous entry. The first entry must start at 0.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:  # lone surrogates: undecodable bytes from a shell, or "\ud800" in JSON
        raise AlayaError(f"prompt: character {err.start + 1} ({text[err.start]!r}) is not valid Unicode text; "
                         "write the prompt in UTF-8") from None
    entries: list[tuple[int, str]] = []
    for line in text.strip().splitlines():
        m = _SCHEDULE_LINE.match(line)
        if m:
            entries.append((int(m.group(1)), m.group(2).strip()))
        elif entries:
            entries[-1] = (entries[-1][0], (entries[-1][1] + " " + line.strip()).strip())
        elif line.strip():
            entries.append((0, line.strip()))
    if not entries:
        entries = [(0, "")]
    frames = [f for f, _ in entries]
    if frames[0] != 0:
        raise AlayaError(f"prompt schedule: the first entry must be at frame 0, got frame {frames[0]}")
    if frames != sorted(set(frames)):
        raise AlayaError(f"prompt schedule: frames must increase, got {frames}")
    return entries


@dataclass
class PromptSchedule:
    """Prompt embeddings keyed by the pixel frame they start at: [(frame, text, emb (1, L, D))]."""

    entries: list[tuple[int, str, torch.Tensor]]

    @classmethod
    def encode(cls, text_encoder: Callable[[list[str]], torch.Tensor], text: str, style: str = ORIGINAL) -> "PromptSchedule":
        """Each entry's prompt encoded; `style` (AlayaRenderer's, model_zoo/styles.py) swaps each one's lighting part."""
        entries = [(f, styled(t, style)) for f, t in parse_schedule(text)]
        embs = text_encoder([t for _, t in entries])
        return cls([(f, t, embs[i : i + 1]) for i, (f, t) in enumerate(entries)])

    @classmethod
    def constant(cls, emb: torch.Tensor, text: str = "") -> "PromptSchedule":
        return cls([(0, text, emb)])

    def at(self, frame: int) -> tuple[int, torch.Tensor]:
        """(entry index, embedding) in effect at pixel frame `frame`."""
        k = 0
        for i, (f, _, _) in enumerate(self.entries):
            if f <= frame:
                k = i
        return k, self.entries[k][2]

    @property
    def text_dim(self) -> int:
        return self.entries[0][2].shape[-1]


def latent_start_pixel(latent_index: int) -> int:
    """First pixel frame covered by a latent frame (0 -> 0, i -> 4i - 3)."""
    return 0 if latent_index == 0 else TIME_COMPRESSION * latent_index - (TIME_COMPRESSION - 1)


def end_pad(frames: int) -> int:
    """Copies of the last frame that make a clip of `frames` frames 4k+1 long."""
    return (1 - frames) % TIME_COMPRESSION


# ---------------------------------------------------------------------------------------------
# Flash stages.


class GBufferEncode:
    """Streaming G-buffer encoder with Wan alignment and end padding (see module docstring)."""

    def __init__(self, encoder, fps: float = 16.0):
        self.stream = encoder.new_stream()  # torch or a compiled runtime (model_zoo/runtime)
        self.frames = 0
        self.last: torch.Tensor | None = None
        self.fps = fps

    def step(self, gbuffers: GBuffers | None) -> Latents | None:
        if gbuffers is None or len(gbuffers) == 0:
            return None
        self.fps = gbuffers.fps
        starts = (0,) if self.frames == 0 else ()
        self.frames += len(gbuffers)
        self.last = gbuffers.images[-1:]
        z = self.stream.encode(gbuffers.images)
        return None if z is None else Latents(z.float(), starts, 0, self.fps)

    def flush(self) -> Latents | None:
        if self.last is None:
            return None
        pad = end_pad(self.frames)
        if pad == 0:
            return None
        z = self.stream.encode(self.last.expand(pad, -1, -1, -1, -1))
        # frames == 1 and pad == 0 cannot reach here; z is never None after padding to 4k+1
        return Latents(z.float(), (), pad, self.fps)


def nominal_steps(steps: int) -> tuple[float, ...]:
    """Self-Forcing's evenly spaced nominal timesteps: 4 -> (1000, 750, 500, 250)."""
    if steps < 1:
        raise AlayaError(f"steps must be >= 1, got {steps}")
    return tuple(1000.0 * (1 - k / steps) for k in range(steps))


class FlashSample:
    """Few-step autoregressive sampling in chunks of `chunk_frames` latent frames.

    Cond latents are buffered until a whole chunk is in (the last chunk of a stream may be
    shorter), so chunk boundaries are the same however the input was cut. The prompt in effect
    at a chunk's first pixel frame conditions the chunk; a change mid-stream recomputes the text
    keys/values and keeps the KV cache (FlashSession.set_prompt). A latent input that starts a
    new clip (starts == (0,)) resets the stream (same seed, frame 0).
    """

    def __init__(self, model, prompts: PromptSchedule, seed: int = 0, steps: int | None = None,
                 chunk_frames: int | None = None, window_frames: int | None = None, sink_frames: int | None = None,
                 shift: float | None = None):
        s = model.settings
        self.chunk_frames = chunk_frames or s.chunk_frames
        if prompts.text_dim != model.text_dim:
            raise AlayaError(f"prompt embeddings are {prompts.text_dim} wide, the model's text input is {model.text_dim}")
        steps_, shift_ = nominal_steps(steps or s.steps), s.shift if shift is None else shift
        if getattr(model.dit, "session_kind", "kv-cache") == "history":  # a Flash release: compressed history, no KV cache
            for name, value, own in (("window", window_frames, s.window_frames), ("sink", sink_frames, s.sink_frames)):
                if value is not None and value != own:
                    raise AlayaError(f"{name} {value}: this model keeps a compressed history (long/mid/short windows, "
                                     f"first frame as anchor), not a KV cache; leave {name} on the model's value")
            self.session = HistorySession(model.dit, HistoryConfig(nominal_steps=steps_, shift=shift_))
        else:
            window = window_frames or s.window_frames
            sink = s.sink_frames if sink_frames is None else sink_frames
            if window < self.chunk_frames:
                raise AlayaError(f"KV window ({window} latent frames) must hold at least one chunk ({self.chunk_frames})")
            cfg = SessionConfig(nominal_steps=steps_, shift=shift_, window_frames=window, sink_frames=sink, rope=s.rope)
            self.session = FlashSession(model.dit, cfg)
        self.prompts = prompts
        self.prompt_index, emb = prompts.at(0)
        self.state: StreamState = self.session.new_state(emb, seed=seed)
        self.buffer: list[torch.Tensor] = []
        self.pad = 0
        self.fps = 16.0
        self.new_clip = True
        self.on_chunk: Callable[[torch.Tensor], None] | None = None  # called after each AR chunk

    def set_prompts(self, prompts: PromptSchedule) -> None:
        """A new schedule from the next chunk on (the KV cache is kept: no cut); also what a reset uses."""
        if prompts.text_dim != self.prompts.text_dim:
            raise AlayaError(f"prompt embeddings are {prompts.text_dim} wide, the stream's are {self.prompts.text_dim}")
        self.prompts = prompts
        self.prompt_index, emb = prompts.at(latent_start_pixel(self.state.frame))
        self.session.set_prompt(self.state, emb)

    def _sample(self, cond: torch.Tensor) -> torch.Tensor:
        k, emb = self.prompts.at(latent_start_pixel(self.state.frame))
        if k != self.prompt_index:
            self.session.set_prompt(self.state, emb)
            self.prompt_index = k
        latents, _ = self.session.step(self.state, cond)
        if self.on_chunk is not None:
            self.on_chunk(latents)
        return latents

    def _run(self, final: bool) -> Latents | None:
        if not self.buffer:
            return None
        cond = torch.cat(self.buffer, 2)
        n = cond.shape[2] if final else cond.shape[2] - cond.shape[2] % self.chunk_frames
        if n == 0:
            return None
        starts = (0,) if self.new_clip else ()
        self.new_clip = False
        outs = [self._sample(cond[:, :, i : min(i + self.chunk_frames, n)]) for i in range(0, n, self.chunk_frames)]
        rest = cond[:, :, n:]
        self.buffer = [rest] if rest.shape[2] else []
        pad = self.pad if not self.buffer else 0
        return Latents(torch.cat(outs, 2).float(), starts, pad, self.fps)

    def step(self, cond: Latents | None) -> Latents | None:
        if cond is None:
            return None
        out = []
        for piece in cond.split():
            if piece.starts and self.state.chunks:  # a new clip: finish the old one, then start over
                out.append(self._run(final=True))
                self.session.reset(self.state)
                self.prompt_index, emb = self.prompts.at(0)
                self.session.set_prompt(self.state, emb)
                self.new_clip = True
            self.fps = piece.fps
            self.pad += piece.pad
            self.buffer.append(piece.tensor)
            out.append(self._run(final=False))
        return concat_chunks(out)

    def flush(self) -> Latents | None:
        return self._run(final=True)


# ---------------------------------------------------------------------------------------------
# Decoders (tiny streaming decoder or the full Wan VAE), one interface.


class TinyDecoder:
    """Streaming TAEHV-style decoder: latents (B, 16, t, h, w) -> frames (t', H, W, 3) in [0, 1]."""

    name = "tiny"

    def __init__(self, codec):
        self.stream = codec.new_stream()  # torch or a compiled runtime (model_zoo/runtime)

    def reset(self) -> None:
        self.stream.reset()

    def decode(self, z: torch.Tensor) -> torch.Tensor | None:
        frames = self.stream.decode(z)  # (B, t, 3, H, W) in [0, 1]
        return None if frames is None else frames[0].permute(0, 2, 3, 1).float().cpu()


class VAEDecoder:
    """Streaming Wan VAE decode with an explicit causal cache: latents -> frames (t', H, W, 3) in [0, 1]."""

    name = "vae"

    def __init__(self, vae):
        self.vae = vae
        self.reset()

    def reset(self) -> None:
        self.cache: dict = {}

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor | None:
        from ...model_zoo.latents import denormalize

        p = next(self.vae.parameters())
        x = self.vae.conv2(denormalize(z.to(p.device, p.dtype)))
        video = self.vae.decoder(x, self.cache).clamp(-1, 1)  # (B, 3, t', H, W) in [-1, 1]
        return video[0].permute(1, 2, 3, 0).float().add(1).mul(0.5).cpu()


class Decode:
    """Latents -> RGB frames (IMAGE: float32 (T, H, W, 3) in [0, 1]); drops end padding, resets per clip."""

    def __init__(self, decoder):
        self.decoder = decoder

    def step(self, latents: Latents | None) -> torch.Tensor | None:
        if latents is None:
            return None
        outs = []
        for piece in latents.split():
            if piece.starts:
                self.decoder.reset()
            frames = self.decoder.decode(piece.tensor)
            if frames is not None and piece.pad:
                frames = frames[: frames.shape[0] - piece.pad]
            outs.append(frames)
        outs = [o for o in outs if o is not None and o.shape[0]]
        return torch.cat(outs) if outs else None

    def flush(self) -> None:
        return None


class Refine:
    """Decoded frames -> refined frames, each with its own G-buffers (model_zoo/codecs/refiner.py).

    The decoder lags its input, so G-buffers wait here (step's `gbuffers`) until their frames arrive;
    frames and G-buffers pair in stream order, and the stream must end with none left over. A
    refiner that reads the prompt gets each frame's embedding from `prompts` by its pixel frame.
    """

    def __init__(self, refiner, prompts: PromptSchedule | None = None, lights=None):
        if getattr(refiner, "text_dim", 0):
            if prompts is None:
                raise AlayaError("Refine: this G-buffer refiner reads the prompt; connect the prompt")
            if prompts.text_dim != refiner.text_dim:
                raise AlayaError(f"Refine: prompt embeddings are {prompts.text_dim} wide, the refiner reads {refiner.text_dim}")
        if getattr(refiner, "reads_light", False) and lights is None:
            raise AlayaError("Refine: this G-buffer refiner reads the light; connect a light (or the prompt's)")
        self.refiner, self.prompts = refiner, prompts
        self.lights = lights  # a LightSchedule (engine/lighting.py) for a refiner that reads the light
        self.frame = 0  # pixel frames refined so far
        self.frames: torch.Tensor | None = None
        self.gbuffers: torch.Tensor | None = None
        self.depth_near = DEFAULT_DEPTH_NEAR

    def add_gbuffers(self, gbuffers: GBuffers | None) -> None:
        if gbuffers is not None:
            self.gbuffers = _append(self.gbuffers, gbuffers.images)
            self.depth_near = gbuffers.depth_near

    def _text(self, n: int) -> torch.Tensor | None:
        if not getattr(self.refiner, "text_dim", 0):
            return None
        return torch.cat([sentence_embedding(self.prompts.at(self.frame + i)[1]) for i in range(n)])

    def step(self, frames: torch.Tensor | None, gbuffers: GBuffers | None = None) -> torch.Tensor | None:
        self.add_gbuffers(gbuffers)
        if frames is not None:
            self.frames = _append(self.frames, frames)
        n = min(_count(self.frames), _count(self.gbuffers))
        if n == 0:
            return None
        light = None
        if getattr(self.refiner, "reads_light", False):
            light = self.lights.at(torch.arange(self.frame, self.frame + n))
        out = self.refiner.refine(self.frames[:n], self.gbuffers[:n], self._text(n), light, self.depth_near)
        self.frames, self.gbuffers = self.frames[n:], self.gbuffers[n:]
        self.frame += n
        return out

    def flush(self) -> None:
        if _count(self.frames) or _count(self.gbuffers):
            raise AlayaError(f"Refine: {_count(self.frames)} frame(s) and {_count(self.gbuffers)} G-buffer frame(s) "
                             "left unpaired at the end of the stream: the frames must come from these G-buffers")
        return None


def _append(buffer: torch.Tensor | None, more: torch.Tensor) -> torch.Tensor:
    return more if buffer is None or not len(buffer) else torch.cat([buffer, more])


def _count(buffer: torch.Tensor | None) -> int:
    return 0 if buffer is None else len(buffer)


# ---------------------------------------------------------------------------------------------
# Teacher stages.


class TeacherEncode:
    """Wan VAE encoding of each modality, one bidirectional window of `window_frames` frames at a time.

    Windows are independent clips (the teacher renders 81-frame clips): each one starts a clip in
    the latents (starts), and the last, shorter window is padded to 4k+1 frames (pad).
    """

    def __init__(self, vae, window_frames: int = 81):
        if window_frames < 1 or (window_frames - 1) % TIME_COMPRESSION:
            raise AlayaError(f"teacher window must be 4k+1 frames (e.g. 81), got {window_frames}")
        self.vae, self.window = vae, window_frames
        self.buffer: list[torch.Tensor] = []
        self.held = 0
        self.fps = 16.0

    @torch.no_grad()
    def _encode(self, images: torch.Tensor, pad: int) -> Latents:
        if pad:
            images = torch.cat([images, images[-1:].expand(pad, -1, -1, -1, -1)])
        p = next(self.vae.parameters())
        # (T, 5, H, W, 3) uint8 -> (5, 3, T, H, W) in [-1, 1]: the five modalities as a batch of 5
        video = images.to(p.device).permute(1, 4, 0, 2, 3).float().mul(2 / 255).sub(1)
        z = self.vae.encode(video, chunk=TIME_COMPRESSION)  # (5, 16, T', h, w)
        cond = z.flatten(0, 1).unsqueeze(0).float()  # (1, 80, T', h, w), branch g = channels 16g..16g+15
        return Latents(cond, (0,), pad, self.fps)

    def step(self, gbuffers: GBuffers | None) -> Latents | None:
        if gbuffers is None or len(gbuffers) == 0:
            return None
        self.fps = gbuffers.fps
        self.buffer.append(gbuffers.images)
        self.held += len(gbuffers)
        outs = []
        while self.held >= self.window:
            images = torch.cat(self.buffer)
            outs.append(self._encode(images[: self.window], 0))
            rest = images[self.window :]
            self.buffer, self.held = ([rest] if len(rest) else []), len(rest)
        return concat_chunks(outs)

    def flush(self) -> Latents | None:
        if not self.held:
            return None
        images = torch.cat(self.buffer)
        self.buffer, self.held = [], 0
        return self._encode(images, end_pad(len(images)))


class TeacherSample:
    """Bidirectional teacher sampling of each clip (window) in the latents, with CFG and shift.

    Noise: one CPU generator seeded once, drawn window after window, so the frames do not depend
    on how the stream was cut.
    """

    def __init__(self, teacher, prompts: PromptSchedule, negative: torch.Tensor | None = None, seed: int = 0,
                 steps: int | None = None, cfg: float | None = None, shift: float | None = None,
                 callback: Callable[[int, int], None] | None = None):
        s = teacher.settings
        self.model = teacher.dit
        self.prompts, self.negative = prompts, negative
        self.steps = steps or s.steps
        self.cfg = s.cfg if cfg is None else cfg
        self.shift = s.shift if shift is None else shift
        self.generator = torch.Generator("cpu").manual_seed(seed)
        self.callback = callback
        self.clips = 0
        self.pixel_frame = 0

    def _sample(self, clip: Latents) -> Latents:
        _, emb = self.prompts.at(self.pixel_frame)
        z = clip.tensor
        noise = torch.randn((z.shape[0], self.model.config.out_dim, *z.shape[2:]), generator=self.generator)
        out = teacher_sample(self.model, z, emb, self.negative, steps=self.steps, shift=self.shift, cfg=self.cfg,
                             noise=noise, callback=self.callback)
        self.clips += 1
        self.pixel_frame += 4 * len(clip) - 3 - clip.pad
        return Latents(out.float(), (0,), clip.pad, clip.fps)

    def step(self, latents: Latents | None) -> Latents | None:
        """Latents from TeacherEncode arrive as whole windows (clips); each is sampled at once."""
        if latents is None:
            return None
        outs = []
        for piece in latents.split():
            if not piece.starts:
                raise AlayaError("teacher sampler: latents must come in whole clips (from Encode G-Buffers with a teacher)")
            outs.append(self._sample(piece))
        return concat_chunks(outs)

    def flush(self) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# Whole pipelines (bench, eval, live page, training renders): a fixed stage list on the one driver.


def flash_steps(model, prompts: PromptSchedule, seed: int = 0, refine: bool = True, feed: str = "gbuffers",
                lights=None, **sample_options) -> list[Step]:
    """The Flash stage list over G-buffer chunks fed as `feed`: encode, sample, decode, and refine
    (the model's G-buffer refiner, with the same G-buffers) when the model has one and `refine` is on.
    lights: the LightSchedule (engine/lighting.py) of a refiner that reads the light; None: the
    prompt's, as the light head reads it."""
    steps = [Step("encode", GBufferEncode(model.gbuffer_encoder), {"gbuffers": (feed, 0)}, single=True),
             Step("sample", FlashSample(model, prompts, seed, **sample_options), {"cond": ("encode", 0)}, single=True),
             Step("decode", Decode(TinyDecoder(model.decoder)), {"latents": ("sample", 0)}, single=True)]
    if refine and model.refiner is not None:
        if getattr(model.refiner, "reads_light", False) and lights is None:
            from .lighting import prompt_lights

            lights = prompt_lights(model, prompts)
        steps.append(Step("refine", Refine(model.refiner, prompts, lights), {"frames": ("decode", 0), "gbuffers": (feed, 0)},
                          single=True))
    return steps


def teacher_steps(teacher, prompts: PromptSchedule, negative: torch.Tensor | None = None, seed: int = 0,
                  window_frames: int | None = None, feed: str = "gbuffers", **sample_options) -> list[Step]:
    """The teacher's stage list: Wan VAE encode per window, 50-step CFG sampling, Wan VAE decode."""
    return [Step("encode", TeacherEncode(teacher.vae, window_frames or teacher.settings.window_frames),
                 {"gbuffers": (feed, 0)}, single=True),
            Step("sample", TeacherSample(teacher, prompts, negative, seed, **sample_options), {"latents": ("encode", 0)},
                 single=True),
            Step("decode", Decode(VAEDecoder(teacher.vae)), {"latents": ("sample", 0)}, single=True)]


class Pipeline:
    """A fixed stage list over one G-buffer feed, driven by driver.StageGraph: push chunks with
    step(), end with flush(), or iterate run(chunks). seconds: time per stage over the stream."""

    def __init__(self, steps: list[Step]):
        self.graph = StageGraph(["gbuffers"], steps)
        self.last = steps[-1].name

    @property
    def seconds(self) -> dict[str, float]:
        return self.graph.seconds

    def stage(self, name: str):
        """The stage object of a step (encode, sample, decode, refine), or None when it is not in the list."""
        return next((s.stage for s in self.graph.steps if s.name == name), None)

    def step(self, gbuffers: GBuffers) -> torch.Tensor | None:
        """G-buffer chunk -> RGB frames ready so far (T, H, W, 3) float [0, 1], or None."""
        out = self.graph.tick({"gbuffers": (gbuffers,)})[self.last]
        return None if out is None else out[0]

    def flush(self) -> torch.Tensor | None:
        out = self.graph.finish()[self.last]
        return None if out is None else out[0]

    def run(self, chunks: Iterable[GBuffers], lanes: Lanes | None = None) -> Iterator[torch.Tensor]:
        """Frames as they are ready, chunk by chunk, to the end of `chunks` (driver.ticks). lanes: the
        stages as a pipeline on worker threads (default: the process's configured plan, engine/cpu.py)."""
        from .cpu import configured_lanes

        lanes = lanes if lanes is not None else configured_lanes()
        for values, _, _ in ticks(self.graph, {"gbuffers": ((c,) for c in chunks)}, lanes=lanes):
            out = values[self.last]
            if out is not None and out[0] is not None:
                yield out[0]


class FlashPipeline(Pipeline):
    """G-buffers -> RGB with a Flash model, chunk by chunk (flash_steps)."""

    def __init__(self, model, prompts: PromptSchedule, seed: int = 0, refine: bool = True, lights=None,
                 **sample_options):
        super().__init__(flash_steps(model, prompts, seed, refine, lights=lights, **sample_options))
        self.model = model
        self.explicit_lights = lights is not None  # an explicit light wins over the prompt's

    @property
    def refine(self) -> Refine | None:
        return self.stage("refine")

    def set_prompts(self, prompts: PromptSchedule) -> None:
        """Change the prompt mid-stream: the sampler from its next chunk (KV cache kept), a refiner
        that reads the prompt from its next frame."""
        self.stage("sample").set_prompts(prompts)
        if self.refine is not None and self.refine.prompts is not None:
            self.refine.prompts = prompts
        if self.refine is not None and self.refine.lights is not None and not self.explicit_lights:
            from .lighting import prompt_lights

            self.refine.lights = prompt_lights(self.model, prompts)


class TeacherPipeline(Pipeline):
    """G-buffers -> RGB with the teacher (teacher_steps)."""

    def __init__(self, teacher, prompts: PromptSchedule, negative: torch.Tensor | None = None, seed: int = 0,
                 window_frames: int | None = None, **sample_options):
        super().__init__(teacher_steps(teacher, prompts, negative, seed, window_frames, **sample_options))


def gbuffer_chunks(stream, length: int) -> Iterator[GBuffers]:
    """GBuffers chunks from a GBufferStream (streaming/files/readers.py): the first frame alone, then
    `length` frames at a time. Latent 0 covers frame 0 alone and latent i frames 4i-3..4i, so the
    first frame leaves the renderer as soon as it can, and with `length` a multiple of 4 every later
    chunk completes its latents instead of leaving frames waiting for the next chunk."""
    for images in stream.teacher_chunks(length, first=1):
        yield GBuffers(images, stream.info.fps, stream.info.depth_near)


def gbuffers_from_images(parts: dict[str, torch.Tensor], encoding: str = "teacher",
                         depth_near: float = DEFAULT_DEPTH_NEAR) -> torch.Tensor:
    """Five IMAGE batches (T, H, W, C) float -> teacher form uint8 (T, 5, H, W, 3).

    encoding "teacher": the images already hold the teacher's 8-bit encoding (v / 255);
    "float": canonical values (albedo linear RGB, depth in scene units, normals in [-1, 1] camera
    space, metallic and roughness in [0, 1]), encoded as streaming/gbuffer.py does. Single-channel
    passes read channel 0.
    """
    from ..gbuffer import encode_depth, encode_normal, linear_to_srgb

    if encoding not in ("teacher", "float"):
        raise AlayaError(f"G-buffer image encoding {encoding!r} is not one of teacher, float")
    shapes = {m: tuple(parts[m].shape) for m in MODALITIES}
    t, h, w = shapes["albedo"][:3]
    for m, shape in shapes.items():
        if len(shape) != 4 or shape[:3] != (t, h, w):
            raise AlayaError(f"G-buffer images: {m} is {shape}, expected ({t}, {h}, {w}, C) like albedo")
        if m in ("albedo", "normal") and shape[3] < 3:
            raise AlayaError(f"G-buffer images: {m} needs 3 channels, got {shape[3]}")
    x = {m: parts[m].detach().float().cpu().numpy() for m in MODALITIES}

    def u8(v):
        return np.clip(np.rint(v * 255.0), 0, 255).astype(np.uint8)

    def gray3(v):
        return np.repeat(v[..., None], 3, axis=-1)

    if encoding == "teacher":
        planes = [u8(x["albedo"][..., :3]), gray3(u8(x["depth"][..., 0])), gray3(u8(x["metallic"][..., 0])),
                  u8(x["normal"][..., :3]), gray3(u8(x["roughness"][..., 0]))]
    else:
        planes = [u8(linear_to_srgb(x["albedo"][..., :3])), gray3(encode_depth(x["depth"][..., 0], depth_near)),
                  gray3(u8(np.clip(x["metallic"][..., 0], 0, 1))), encode_normal(x["normal"][..., :3]),
                  gray3(u8(np.clip(x["roughness"][..., 0], 0, 1)))]
    return torch.from_numpy(np.stack(planes, axis=1))
