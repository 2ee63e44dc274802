"""Rendering nodes: Encode G-Buffers, Flash Sampler, Teacher Sampler, Decode, Refine.

All five are stream stages (docs/runner.md): the runner steps them chunk by chunk, ComfyUI calls
them once over the whole sequence (run_stage_whole). Each wraps one stage of
streaming/render/pipelines.py; inside ComfyUI they drive a progress bar per chunk (the Flash Sampler's
and Decode's carry a preview frame) and check for interruption every chunk.
"""
from __future__ import annotations

import math

from ..model_zoo.config_fields import SESSION
from . import comfy
from .base import MODEL, Piecewise, StageNode, refuse, settings_line

CATEGORY = "alaya-flash/render"
LIGHT = "ALAYA_LIGHT"  # a LightSchedule (streaming/render/lighting.py), from the Light nodes (nodes/light.py)
MOST_FRAMES = 8  # at most this many frames a piece inside one ComfyUI call (pieces are sized by time: base.Piecewise)
DECODE_PIECE = 3  # latent frames a decoded piece (bounded memory; fixed: the decoders' frames depend on it)
LATENTS = "ALAYA_LATENTS"


def _model_int(high: int, tip: str):
    return ("INT", {"default": MODEL, "min": MODEL, "max": high, "tooltip": f"{tip} -1: the model's trained value (shown on the node after a run)."})


def _model_float(high: float, tip: str):
    return ("FLOAT", {"default": float(MODEL), "min": float(MODEL), "max": high, "step": 0.1,
                      "tooltip": f"{tip} -1: the model's trained value (shown on the node after a run)."})


def _outside(bounds: dict[str, tuple[float, float]], values: dict) -> list[str]:
    """Widget values that are neither -1 (the model's) nor in [low, high]. (ComfyUI leaves the range
    check of an input that VALIDATE_INPUTS takes to the node.)"""
    return [f"{name} is {values[name]}: use -1 for the model's value or a value in [{low}, {high}]"
            for name, (low, high) in bounds.items()
            if name in values and values[name] != MODEL and not low <= values[name] <= high]


def _own(value):
    """A widget value, or None (the model's setting) for -1."""
    return None if value == MODEL else value


FLASH, TEACHER = SESSION["flash"], SESSION["teacher"]  # a model's own settings and these widgets share one table


def _range(table, *names) -> dict[str, tuple[float, float]]:
    return {n: (table[n].low, table[n].high) for n in names}


SEED = ("INT", {"default": 0, "min": 0, "max": 2**63 - 1, "tooltip": "Noise seed: the same seed gives the same frames in ComfyUI and in the runner."})


class EncodeGBuffers(StageNode):
    DESCRIPTION = ("G-buffers -> conditioning latents (80 channels: 16 per pass). With a Flash model: the streaming "
                   "G-buffer encoder; with the teacher: the Wan VAE on each pass, one window at a time.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("gbuffers",)
    RETURN_TYPES = (LATENTS,)
    RETURN_NAMES = ("cond",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "gbuffer_encoder": ("ALAYA_GBUFFER_ENCODER", {"tooltip": "From Load Flash Model (streaming encoder) or Load Teacher Model (Wan VAE)."}),
            "gbuffers": ("ALAYA_GBUFFERS", {"tooltip": "G-buffer frames (sides multiples of 8)."}),
        }, "optional": {
            "prompt": ("ALAYA_PROMPT", {"tooltip": "The prompt the sampler reads (Encode Prompt): its light, as the light head "
                                                   "reads it, for an encoder that reads the light; ignored otherwise."}),
            "light": (LIGHT, {"tooltip": "The light, frame by frame (Light, Light From Prompt), for an encoder that reads "
                                         "the light (it shades the G-buffers under it); unconnected: the prompt's. An "
                                         "encoder that does not read it leaves it to Refine with G-Buffers."}),
        }}

    def start_stream(self, gbuffer_encoder, prompt=None, light=None):
        from ..streaming.render.pipelines import GBufferEncode, TeacherEncode

        if gbuffer_encoder.kind == "flash":
            lights = encoder_lights("Encode G-Buffers", gbuffer_encoder, prompt, light)
            inner = GBufferEncode(gbuffer_encoder.module, lights=lights)
        else:
            inner = TeacherEncode(gbuffer_encoder.module, gbuffer_encoder.window_frames)
        return Piecewise(_Single(inner), MOST_FRAMES, _last_albedo)


class _Single:
    """A pipelines stage (one value in, one out) as a node stage; to_image: its frames are an IMAGE output."""

    def __init__(self, inner, to_image: bool = False):
        self.inner, self.to_image = inner, to_image

    def step(self, **inputs):
        (value,) = inputs.values()
        out = self.inner.step(value)
        return (comfy.intermediate(out) if self.to_image and out is not None else out,)

    def flush(self):
        return (self.inner.flush(),)


def _last_frame(outputs, _inputs):
    """The newest output frame, for a progress bar's preview."""
    frames = outputs[0] if outputs else None
    return frames[-1] if frames is not None and len(frames) else None


def _last_albedo(_outputs, inputs):
    """The albedo pass of the newest input frame (IMAGE [H, W, 3]), for a progress bar's preview."""
    return inputs["gbuffers"].images[-1, 0].float().div(255)


class _SamplerNode(StageNode):
    """Flash Sampler and Teacher Sampler: conditioning latents in, clean latents out."""

    CATEGORY = CATEGORY
    STREAM_INPUTS = ("cond",)
    RETURN_TYPES = (LATENTS,)
    RETURN_NAMES = ("latents",)

    @staticmethod
    def _inputs(model: str, model_tip: str, cond_tip: str, prompt_tip: str) -> dict:
        return {"model": (model, {"tooltip": model_tip}), "cond": (LATENTS, {"tooltip": cond_tip}),
                "prompt": ("ALAYA_PROMPT", {"tooltip": prompt_tip})}


class FlashSampler(_SamplerNode):
    DESCRIPTION = ("Few-step autoregressive sampling with a rolling KV cache, chunk by chunk; the prompt schedule "
                   "is applied by pixel frame (a change keeps the cache).")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            **cls._inputs("ALAYA_FLASH", "From Load Flash Model.", "Conditioning latents from Encode G-Buffers (Flash encoder).",
                          "From Encode Prompt (a prompt or a schedule keyed by frame)."),
            "seed": SEED,
            "steps": _model_int(FLASH["steps"].high, "Denoising passes per chunk (the models are distilled for 4)."),
            "chunk_frames": _model_int(FLASH["chunk_frames"].high, "Latent frames per autoregressive chunk (1 latent = 4 pixel frames)."),
            "window_frames": _model_int(FLASH["window_frames"].high, "Latent frames the KV cache attends to, current chunk included (memory is fixed by this)."),
            "sink_frames": _model_int(FLASH["sink_frames"].high, "First latent frames of the stream kept in the cache forever (attention sink); 0: none."),
        }}

    @staticmethod
    def check_values(steps=MODEL, chunk_frames=MODEL, window_frames=MODEL, sink_frames=MODEL) -> list[str]:
        """The widgets' values that no model takes: checked when the node starts (ComfyUI would repeat a
        queue-time message on each of the four inputs) and by the runner's validation."""
        values = dict(steps=steps, chunk_frames=chunk_frames, window_frames=window_frames, sink_frames=sink_frames)
        problems = _outside(_range(FLASH, "steps", "chunk_frames", "window_frames", "sink_frames"), values)
        if MODEL not in (chunk_frames, window_frames) and window_frames < chunk_frames:
            problems.append(f"window_frames ({window_frames}) must be at least chunk_frames ({chunk_frames})")
        return problems

    def start_stream(self, model, prompt, seed, steps, chunk_frames, window_frames, sink_frames):
        from ..streaming.render.pipelines import FlashSample

        refuse("Flash Sampler", self.check_values(steps, chunk_frames, window_frames, sink_frames))

        inner = FlashSample(model, prompt, seed=seed, steps=_own(steps), chunk_frames=_own(chunk_frames),
                            window_frames=_own(window_frames), sink_frames=_own(sink_frames))
        self.status = flash_settings(model, inner, steps, chunk_frames, window_frames, sink_frames)
        return _Sampling(inner, lambda cond: math.ceil(len(cond) / inner.chunk_frames), preview_decoder=model.decoder)


def flash_settings(model, sample, steps, chunk_frames, window_frames, sink_frames) -> str:
    """The settings a Flash sampling stage runs with (the widgets' -1 resolved), for the node's text."""
    s = model.settings
    ran = {"steps": _own(steps) or s.steps, "chunk": sample.chunk_frames}
    if getattr(model.dit, "sampler_kind", "kv-cache") != "history":  # a release keeps a compressed history instead
        ran.update(window=_own(window_frames) or s.window_frames, sink=s.sink_frames if sink_frames == MODEL else sink_frames)
    return settings_line(ran, dict(steps=steps, chunk=chunk_frames, window=window_frames, sink=sink_frames))


class _Sampling:
    """A sampler stage with a ComfyUI progress bar per step call (ComfyUI makes one call over
    everything): one tick per AR chunk (Flash) or per Euler step of each window (teacher).

    Inside ComfyUI each Flash chunk's progress update carries a preview: the chunk's last frame from
    the model's own tiny decoder (a fresh decoder memory per chunk: cheap, approximate at the chunk's
    first frames, which is fine for a preview). Outside ComfyUI nothing extra is decoded.
    """

    def __init__(self, inner, ticks, preview_decoder=None):
        self.inner, self.ticks, self.preview_decoder = inner, ticks, preview_decoder

    def _preview(self, latents):
        from ..streaming.render.pipelines import TinyDecoder

        decoder = TinyDecoder(self.preview_decoder)
        frames = decoder.decode(latents.to(next(self.preview_decoder.parameters()).dtype))
        return None if frames is None or not len(frames) else frames[-1]

    def step(self, cond):
        if cond is None:
            return (None,)
        bar = comfy.Progress(self.ticks(cond))
        if hasattr(self.inner, "on_chunk"):  # Flash: a tick per AR chunk
            preview = bar.bar is not None and self.preview_decoder is not None
            self.inner.on_chunk = lambda latents: bar.update(1, preview=self._preview(latents) if preview else None)
        else:
            self.inner.callback = lambda _i, _n: bar.update(1)
        return (self.inner.step(cond),)

    def flush(self):
        if hasattr(self.inner, "on_chunk"):
            self.inner.on_chunk = None
        return (self.inner.flush(),)


class TeacherSampler(_SamplerNode):
    DESCRIPTION = ("The teacher: bidirectional flow-matching Euler over each window with classifier-free guidance "
                   "(negative prompt) and time shift. Slow (50 steps x 2 passes); the reference for Flash.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            **cls._inputs("ALAYA_TEACHER", "From Load Teacher Model.", "Conditioning latents from Encode G-Buffers (teacher VAE).",
                          "From Encode Prompt; a schedule switches per window."),
            "negative_prompt": ("STRING", {"default": "", "multiline": True, "tooltip": "What to steer away from (the unconditional branch of CFG); empty: the model's own negative prompt."}),
            "seed": SEED,
            "steps": _model_int(TEACHER["steps"].high, "Euler steps per window (Wan: 50)."),
            "cfg": _model_float(TEACHER["cfg"].high, "Guidance scale; 1 disables CFG (one pass per step)."),
            "shift": _model_float(TEACHER["shift"].high, "Time shift of the sigma schedule (Wan: 5)."),
        }}

    @staticmethod
    def check_values(steps=MODEL, cfg=MODEL, shift=MODEL) -> list[str]:
        """Values no model takes (checked when the node starts, as the Flash Sampler's)."""
        return _outside(_range(TEACHER, "steps", "cfg", "shift"), dict(steps=steps, cfg=cfg, shift=shift))

    def start_stream(self, model, prompt, negative_prompt, seed, steps, cfg, shift):
        refuse("Teacher Sampler", self.check_values(steps, cfg, shift))
        s = model.settings
        widget_cfg, cfg = cfg, s.cfg if cfg == MODEL else cfg
        negative_prompt = negative_prompt or s.negative_prompt
        from ..streaming.render.pipelines import TeacherSample

        text = model.text_encoder()
        # loading umT5 takes long and has no loop to check for cancel in (comfy.interruptible)
        negative = comfy.interruptible(text, [negative_prompt]) if cfg != 1.0 else None
        if hasattr(text, "release"):  # umT5-XXL holds ~11 GB; every prompt is encoded by now (a later call reloads)
            text.release()
        inner = TeacherSample(model, prompt, negative, seed=seed, steps=_own(steps), cfg=cfg, shift=_own(shift))
        self.status = settings_line({"steps": inner.steps, "CFG": float(inner.cfg), "shift": float(inner.shift)},
                                    {"steps": steps, "CFG": widget_cfg, "shift": shift})
        return _Sampling(inner, lambda cond: inner.steps * max(1, len(cond.split())))


class Decode(StageNode):
    DESCRIPTION = ("Latents -> RGB frames (IMAGE [T, H, W, 3] in [0, 1]): the tiny streaming decoder (fast) or the "
                   "full Wan VAE (final quality). N G-buffer frames in give N frames out.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("latents",)
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "decoder": ("ALAYA_DECODER", {"tooltip": "Tiny decoder (Load Flash Model) or full Wan VAE (Load Teacher Model)."}),
            "latents": (LATENTS, {"tooltip": "From Flash Sampler or Teacher Sampler."}),
        }}

    def start_stream(self, decoder):
        from ..streaming.render.pipelines import Decode as DecodeStage, TinyDecoder, VAEDecoder

        inner = TinyDecoder(decoder.module) if decoder.kind == "tiny" else VAEDecoder(decoder.module)
        return Piecewise(_Single(DecodeStage(inner), to_image=True), DECODE_PIECE, _last_frame, fixed=True)


class Refine(StageNode):
    DESCRIPTION = ("Decoded frames + their G-buffers -> refined frames: the Flash model's G-buffer refiner restores "
                   "detail and colour the 8x-smaller latents lost, frame by frame (and, for a refiner that reads the "
                   "prompt, the prompted lighting; for one that reads the light, the shading prior under each frame's "
                   "light). Frames pass through unchanged when the model has no refiner. Connect the same G-buffers "
                   "that fed Encode G-Buffers and the prompt that fed the sampler.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("images", "gbuffers")
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "refiner": ("ALAYA_REFINER", {"tooltip": "From Load Flash Model."}),
            "images": ("IMAGE", {"tooltip": "Frames from Decode (the Flash model's tiny decoder)."}),
            "gbuffers": ("ALAYA_GBUFFERS", {"tooltip": "The G-buffers these frames were rendered from."}),
        }, "optional": {
            "prompt": ("ALAYA_PROMPT", {"tooltip": "The prompt the frames were sampled with (Encode Prompt); needed by a "
                                                   "refiner that reads the prompt, ignored otherwise."}),
            "light": (LIGHT, {"tooltip": "The light, frame by frame (Light, Light From Prompt), for a refiner that reads "
                                         "the light; unconnected: the prompt's, as the light head reads it. A model whose "
                                         "refiner does not read the light refuses one."}),
        }}

    def start_stream(self, refiner, prompt=None, light=None):
        from ..model_zoo.errors import AlayaError
        from ..streaming.render.pipelines import Refine as RefineStage

        where = "Refine with G-Buffers"
        lights = refiner_lights(where, refiner, prompt, light)
        if refiner.module is None:  # frames pass through, with the bar and preview every node shows
            return Piecewise(_Refining(None), MOST_FRAMES, _last_frame)
        if refiner.module.text_dim and prompt is None:
            raise AlayaError(f"{where}: this model's refiner reads the prompt; connect the 'prompt' "
                             "input to the Encode Prompt node that feeds the sampler")
        return Piecewise(_Refining(RefineStage(refiner.module, prompt if refiner.module.text_dim else None, lights)),
                         MOST_FRAMES, _last_frame)


def encoder_lights(where: str, encoder, prompt, light):
    """The LightSchedule an encoder that reads the light gets: the connected light, else the prompt's (the light
    head's reading); None for an encoder that reads none. One Light node feeds the encoder and the refiner, so
    an encoder that does not read the light leaves it to the refiner (which refuses a light no part reads)."""
    from ..streaming.render.lighting import LightNotRead, LightSchedule, prompt_lights
    from ..streaming.render.pipelines import encoder_reads_light

    if light is not None:
        refuse(where, [None if isinstance(light, LightSchedule) else
                       f"light must come from a Light node, got {type(light).__name__}"])
        if encoder.kind != "flash":
            raise LightNotRead(f"{where}: light", "the teacher does not read a light")
    if not (encoder.kind == "flash" and encoder_reads_light(encoder.module)):
        return None
    if light is not None:
        return light
    if prompt is None or encoder.model is None:
        refuse(where, ["this model's encoder reads the light: connect a 'light' (or the 'prompt', whose light the "
                       "light head reads)"])
    return prompt_lights(encoder.model, prompt)


def refiner_lights(where: str, refiner, prompt, light):
    """The LightSchedule a refiner gets: the connected light, or for a refiner that reads the light the prompt's
    (the light head's reading); None when it reads none. A light connected to a model that does not read
    one is refused (LightNotRead, naming the model), never ignored."""
    from ..streaming.render.lighting import LightNotRead, LightSchedule, prompt_lights, unread_light

    if light is not None:
        refuse(where, [None if isinstance(light, LightSchedule) else
                       f"light must come from a Light node, got {type(light).__name__}"])
        why = unread_light(refiner.module, refiner.name)
        if why:
            raise LightNotRead(f"{where}: light", why)
        return light
    if refiner.module is None or not getattr(refiner.module, "reads_light", False):
        return None
    if prompt is None or refiner.model is None:
        refuse(where, ["this model's refiner reads the light: connect a 'light' (or the 'prompt', whose light the "
                       "light head reads)"])
    return prompt_lights(refiner.model, prompt)


class _Refining:
    """Pairs frames with G-buffers in stream order (the decoder lags the input); None: pass frames through."""

    def __init__(self, inner):
        self.inner = inner

    def step(self, images=None, gbuffers=None):
        if self.inner is None:
            return (images,)
        out = self.inner.step(images, gbuffers)
        return (comfy.intermediate(out) if out is not None else None,)

    def flush(self):
        if self.inner is not None:
            self.inner.flush()
        return (None,)


NODES = {
    "AlayaFlash_EncodeGBuffers": (EncodeGBuffers, "Encode G-Buffers (Alaya Flash)"),
    "AlayaFlash_FlashSampler": (FlashSampler, "Flash Sampler (Alaya Flash)"),
    "AlayaFlash_TeacherSampler": (TeacherSampler, "Teacher Sampler (Alaya Flash)"),
    "AlayaFlash_Decode": (Decode, "Decode (Alaya Flash)"),
    "AlayaFlash_Refine": (Refine, "Refine with G-Buffers (Alaya Flash)"),
}
