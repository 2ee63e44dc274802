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
    (streaming/render/driver.py); FlashPipeline is that stage list with step/flush/run.

Teacher (bidirectional windows of `window_frames` pixel frames, independent clips):

    enc = TeacherEncode(teacher.vae, window_frames=81) # Wan VAE per modality, one window at a time
    smp = TeacherSample(teacher, prompts, negative, steps=50, cfg=5, shift=5, seed=0)
    dec = Decode(vae_decoder(teacher))                 # full Wan VAE

Frame arithmetic, padding and the chunk values (GBuffers, Latents, PromptSchedule): streaming/values.py.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from ...model_zoo.errors import AlayaError
from ...model_zoo.latents import TIME_COMPRESSION
from ...model_zoo.text_encoder import sentence_embedding
from ..values import GBuffers, Latents, PromptSchedule, end_pad, latent_start_pixel
from .driver import Lanes, StageGraph, Step, concat_chunks, ticks
from .history_sampler import HistoryConfig, HistorySampler
from .kv_cache_sampler import KVCacheConfig, KVCacheSampler, StreamState
from .teacher_sampler import teacher_sample

# ---------------------------------------------------------------------------------------------
# Flash stages.


class GBufferEncode:
    """Streaming G-buffer encoder with Wan alignment and end padding (see module docstring).

    A light-reading encoder (config `reads_light`) also reads the shading prior's image of each frame
    under `lights` (a LightSchedule, render/lighting.py), with the chunk's light passes when it has them."""

    def __init__(self, encoder, fps: float = 16.0, lights=None, share: "SharedPrior | None" = None):
        self.stream = encoder.new_stream()  # torch or a compiled runtime (model_zoo/runtime)
        self.reads_light = encoder_reads_light(encoder)
        if self.reads_light and lights is None:
            raise AlayaError("G-buffer encoder: this encoder reads the light; connect a light (or the prompt's)")
        self.lights, self.prior, self.share = lights, None, share
        self.frames = 0
        self.last: torch.Tensor | None = None
        self.fps = fps

    def _planes(self, gbuffers: GBuffers) -> torch.Tensor:
        """The encoder's input planes of a chunk: the passes, and for a light-reading encoder the prior's image."""
        if not self.reads_light:
            return gbuffers.images
        from ...model_zoo.codecs.gbuffer_encoder import LIT_PRIOR, with_prior
        from ...model_zoo.shading_prior import ShadingPrior

        if self.prior is None:
            self.prior = ShadingPrior(LIT_PRIOR)
        light = self.lights.at(torch.arange(self.frames, self.frames + len(gbuffers)))
        passes = gbuffers.visibilities()
        passes.pop("sky_visibility", None)  # the light-reading encoder was trained beside the prior's own AO
        planes = self.prior(gbuffers.images, light, gbuffers.depth_near, **passes)
        if self.share is not None:
            self.share.put(self.frames, planes, light, passes)
        return with_prior(self.prior, gbuffers.images, light, planes=planes)

    def step(self, gbuffers: GBuffers | None) -> Latents | None:
        if gbuffers is None or len(gbuffers) == 0:
            return None
        self.fps = gbuffers.fps
        starts = (0,) if self.frames == 0 else ()
        planes = self._planes(gbuffers)
        self.frames += len(gbuffers)
        self.last = planes[-1:]
        z = self.stream.encode(planes)
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


class SharedPrior:
    """The shading prior's planes a light-reading encoder computed, kept for the light-reading refiner of the
    same stream, so the prior runs once a frame: from the refiner's next frame to the encoder's last (the
    decoder's delay), each with the light and light passes it was shaded under. A frame whose light differs
    when the refiner reaches it is shaded again there."""

    def __init__(self):
        self.start = 0  # the pixel frame of planes[0]
        self.planes: torch.Tensor | None = None  # (n, 5, H, W)
        self.lights: torch.Tensor | None = None  # (n, PACKED)
        self.passes: list[dict[str, torch.Tensor]] = []  # per frame: GBuffers.visibilities(), (H, W) each

    def put(self, start: int, planes: torch.Tensor, lights: torch.Tensor, passes: dict[str, torch.Tensor]) -> None:
        if self.planes is None or start != self.start + len(self.planes):
            self.start, self.planes, self.lights, self.passes = start, planes[:0], lights[:0], []
        self.planes, self.lights = torch.cat([self.planes, planes]), torch.cat([self.lights, lights])
        self.passes += [{k: v[t] for k, v in passes.items()} for t in range(len(planes))]

    def take(self, start: int, lights: torch.Tensor, passes: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The planes of frames start .. start + len(lights) - 1 if all were shaded under these lights and
        passes (dropped either way), else None."""
        n = len(lights)
        if self.planes is None or start != self.start or len(self.planes) < n:
            return None
        planes, kept_lights, kept = self.planes[:n], self.lights[:n], self.passes[:n]
        self.start, self.planes, self.lights, self.passes = start + n, self.planes[n:], self.lights[n:], self.passes[n:]
        same = torch.equal(kept_lights, lights) and all(
            a.keys() == passes.keys() and all(torch.equal(a[k], passes[k][t]) for k in a) for t, a in enumerate(kept))
        return planes if same else None


def encoder_reads_light(encoder) -> bool:
    """Whether a G-buffer encoder (torch or compiled) has the shading prior's branch."""
    return bool(getattr(getattr(encoder, "config", None), "reads_light", False))


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
    keys/values and keeps the KV cache (KVCacheSampler.set_prompt). A latent input that starts a
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
        if getattr(model.dit, "sampler_kind", "kv-cache") == "history":  # a Flash release: compressed history, no KV cache
            for name, value, own in (("window", window_frames, s.window_frames), ("sink", sink_frames, s.sink_frames)):
                if value is not None and value != own:
                    raise AlayaError(f"{name} {value}: this model keeps a compressed history (long/mid/short windows, "
                                     f"first frame as anchor), not a KV cache; leave {name} on the model's value")
            self.sampler = HistorySampler(model.dit, HistoryConfig(nominal_steps=steps_, shift=shift_))
        else:
            window = window_frames or s.window_frames
            sink = s.sink_frames if sink_frames is None else sink_frames
            if window < self.chunk_frames:
                raise AlayaError(f"KV window ({window} latent frames) must hold at least one chunk ({self.chunk_frames})")
            cfg = KVCacheConfig(nominal_steps=steps_, shift=shift_, window_frames=window, sink_frames=sink, rope=s.rope)
            self.sampler = KVCacheSampler(model.dit, cfg)
        self.prompts = prompts
        self.prompt_index, emb = prompts.at(0)
        self.state: StreamState = self.sampler.new_state(emb, seed=seed)
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
        self.sampler.set_prompt(self.state, emb)

    def _sample(self, cond: torch.Tensor) -> torch.Tensor:
        k, emb = self.prompts.at(latent_start_pixel(self.state.frame))
        if k != self.prompt_index:
            self.sampler.set_prompt(self.state, emb)
            self.prompt_index = k
        latents, _ = self.sampler.step(self.state, cond)
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
                self.sampler.reset(self.state)
                self.prompt_index, emb = self.prompts.at(0)
                self.sampler.set_prompt(self.state, emb)
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

    def __init__(self, refiner, prompts: PromptSchedule | None = None, lights=None, share: SharedPrior | None = None):
        if getattr(refiner, "text_dim", 0):
            if prompts is None:
                raise AlayaError("Refine: this G-buffer refiner reads the prompt; connect the prompt")
            if prompts.text_dim != refiner.text_dim:
                raise AlayaError(f"Refine: prompt embeddings are {prompts.text_dim} wide, the refiner reads {refiner.text_dim}")
        if getattr(refiner, "reads_light", False) and lights is None:
            raise AlayaError("Refine: this G-buffer refiner reads the light; connect a light (or the prompt's)")
        self.refiner, self.prompts = refiner, prompts
        self.lights = lights  # a LightSchedule (engine/lighting.py) for a refiner that reads the light
        self.share = share  # the prior's planes a light-reading encoder computed for these frames
        self.frame = 0  # pixel frames refined so far
        self.frames: torch.Tensor | None = None
        self.gbuffers: GBuffers | None = None  # those waiting for their frames (with their light passes, if any)

    def add_gbuffers(self, gbuffers: GBuffers | None) -> None:
        if gbuffers is not None:  # (concat refuses a light pass in some chunks and not in others)
            self.gbuffers = gbuffers if not _count(self.gbuffers) else GBuffers.concat([self.gbuffers, gbuffers])

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
        now, self.gbuffers = self.gbuffers[:n], self.gbuffers[n:]
        passes = now.visibilities()
        if not getattr(self.refiner, "reads_sky", False):  # a refiner reads the prior it was trained beside
            passes.pop("sky_visibility", None)
        more = dict(passes)
        if getattr(self.refiner, "reads_given", False):  # whether each frame's light was given or the prompt's
            more["light_given"] = self.lights.given_at(torch.arange(self.frame, self.frame + n))
        if self.share is not None and light is not None:
            more["prior"] = self.share.take(self.frame, light, passes)
        out = self.refiner.refine(self.frames[:n], now.images, self._text(n), light, now.depth_near, **more)
        self.frames = self.frames[n:]
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
    lights: the LightSchedule (render/lighting.py) of an encoder or refiner that reads the light; None: the
    prompt's, as the light head reads it."""
    encoder_reads = encoder_reads_light(model.gbuffer_encoder)
    refiner_reads = refine and getattr(model.refiner, "reads_light", False)
    if (encoder_reads or refiner_reads) and lights is None:
        from .lighting import prompt_lights

        lights = prompt_lights(model, prompts)
    # the prior once a frame, where the refiner's shades as the encoder's does
    from ...model_zoo.codecs.gbuffer_encoder import LIT_PRIOR

    same_prior = refiner_reads and getattr(getattr(model.refiner, "shading_prior", None), "config", None) == LIT_PRIOR
    share = SharedPrior() if encoder_reads and same_prior else None
    steps = [Step("encode", GBufferEncode(model.gbuffer_encoder, lights=lights, share=share), {"gbuffers": (feed, 0)},
                  single=True),
             Step("sample", FlashSample(model, prompts, seed, **sample_options), {"cond": ("encode", 0)}, single=True),
             Step("decode", Decode(TinyDecoder(model.decoder)), {"latents": ("sample", 0)}, single=True)]
    if refine and model.refiner is not None:
        steps.append(Step("refine", Refine(model.refiner, prompts, lights, share), {"frames": ("decode", 0), "gbuffers": (feed, 0)},
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
        stages on lanes (worker threads) (default: the process's configured plan, render/cpu.py)."""
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
        that reads the prompt from its next frame (and the light it names, unless a light was given)."""
        self.stage("sample").set_prompts(prompts)
        if self.refine is not None and self.refine.prompts is not None:
            self.refine.prompts = prompts
        if self._lights() is not None and not self.explicit_lights:
            from .lighting import prompt_lights

            self._share_lights(prompt_lights(self.model, prompts))

    def _lights(self):
        """The stream's LightSchedule (the encoder's and the refiner's are one), None when neither reads it."""
        encode = self.stage("encode")
        if encode.reads_light:
            return encode.lights
        return self.refine.lights if self.refine is not None else None

    def _share_lights(self, lights) -> None:
        if self.stage("encode").reads_light:
            self.stage("encode").lights = lights
        if self.refine is not None and getattr(self.refine.refiner, "reads_light", False):
            self.refine.lights = lights

    def set_light(self, light, frame: int) -> None:
        """Change the light from pixel frame `frame` on (the frames before keep theirs): a Light, or None for
        the prompt's light again. LightNotRead when neither the model's encoder nor its refiner reads the light."""
        from ...model_zoo.light import pack
        from .lighting import LightNotRead, prompt_lights, unread_light

        why = unread_light(None if self.refine is None else self.refine.refiner, self.model.describe(),
                           self.model.gbuffer_encoder)
        if why:
            raise LightNotRead("light", why)
        if light is None:
            packed = prompt_lights(self.model, self.stage("sample").prompts).at(torch.tensor([frame]))[0]
        else:
            packed = pack(light)[0]
        # the frames a stage has taken keep their light; the refiner lags the encoder (the decoder's delay)
        encode = self.stage("encode")
        taken = [encode.frames] if encode.reads_light else []
        if self.refine is not None and getattr(self.refine.refiner, "reads_light", False):
            taken.append(self.refine.frame)
        done = min(taken)
        self._share_lights(self._lights().changed(frame, packed, since=done, given=light is not None))
        self.explicit_lights = light is not None


class TeacherPipeline(Pipeline):
    """G-buffers -> RGB with the teacher (teacher_steps)."""

    def __init__(self, teacher, prompts: PromptSchedule, negative: torch.Tensor | None = None, seed: int = 0,
                 window_frames: int | None = None, **sample_options):
        super().__init__(teacher_steps(teacher, prompts, negative, seed, window_frames, **sample_options))
