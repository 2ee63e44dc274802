"""The light a stream renders under, frame by frame, and the stage that shades G-buffers with it.

A `LightSchedule` is keyframes of `Light`s (model_zoo/light.py) keyed by pixel frame; between two
keyframes the light moves linearly (the sun's azimuth the short way round), so the sun can travel
mid-stream. It comes from the user (`--light`: one light, or lines 'FRAME: light'; the Light node),
or from the prompt schedule through the light head (model_zoo/light_head.py): each prompt entry's
light holds from its frame. An explicit light wins over the prompt's.

`user_lights(text)` reads what users type (`--light`, the Light node's text, the live page and
engines' light messages) with every named preset; `LightNotRead` refuses a light given to a model
that would ignore it (its refiner does not read the light). `changed()` switches a stream's light
from a given frame on (a live session's sliders, an engine's per-frame light).

`Shade` is a stage of the chunk loop: G-buffers -> the shading prior's frames (IMAGE, float
(T, H, W, 3) in [0, 1]) under the schedule's light. `alaya-flash shade` renders with it alone (a
lighting preview, and eval's prior-only baseline).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import torch

from ...model_zoo.errors import AlayaError
from ...model_zoo.light import SLICES, Light, pack, unpack
from ..values import GBuffers, PromptSchedule, parse_schedule

_KEYFRAME = re.compile(r"^\s*(\d+)\s*:\s*(.*)$")


@dataclass
class LightSchedule:
    """[(pixel frame, packed light (PACKED,))], frames increasing from 0. given: [(pixel frame, bool)] from
    frame 0, whether the light from that frame on was given (by the user or an engine) or read from the
    prompt (False), which a refiner config with `given` reads."""

    keys: list[tuple[int, torch.Tensor]]
    given: list[tuple[int, bool]] = field(default_factory=lambda: [(0, True)])

    @classmethod
    def constant(cls, light: Light) -> "LightSchedule":
        return cls([(0, pack(light)[0])])

    @classmethod
    def parse(cls, text: str, where: str = "--light", named: dict | None = None) -> "LightSchedule":
        """One light (JSON or the short form), or lines 'FRAME: light' (the first at frame 0)."""
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if not any(_KEYFRAME.match(line) for line in lines):
            return cls.constant(Light.parse(text, where, named))
        keys = []
        for line in lines:
            m = _KEYFRAME.match(line)
            if not m:
                raise AlayaError(f"{where}: {line.strip()!r} is not 'FRAME: light' (every line of a light schedule is)")
            frame = int(m.group(1))
            keys.append((frame, pack(Light.parse(m.group(2), f"{where} (frame {frame})", named))[0]))
        frames = [f for f, _ in keys]
        if frames[0] != 0:
            raise AlayaError(f"{where}: the first keyframe must be at frame 0, got frame {frames[0]}")
        if frames != sorted(set(frames)):
            raise AlayaError(f"{where}: keyframe frames must increase, got {frames}")
        return cls(keys)

    @classmethod
    def from_prompts(cls, prompts: PromptSchedule | str, head, text_encoder) -> "LightSchedule":
        """Each prompt entry's light as the light head reads it, held from the entry's frame (no blending:
        a prompt switch is a cut)."""
        entries = parse_schedule(prompts) if isinstance(prompts, str) else [(f, t) for f, t, _ in prompts.entries]
        keys = []
        with torch.no_grad():
            for k, (frame, text) in enumerate(entries):
                light = head.packed(*text_encoder.states([text]))[0]
                keys.append((frame, light))
                following = entries[k + 1][0] if k + 1 < len(entries) else None
                if following is not None and following - 1 > frame:  # held up to the next entry's frame
                    keys.append((following - 1, light))
        return cls(keys, given=[(0, False)])

    def at(self, frames: torch.Tensor) -> torch.Tensor:
        """Packed lights (T, PACKED) at pixel frames (T,), interpolated between keyframes."""
        key_frames = torch.tensor([f for f, _ in self.keys], dtype=torch.float32)
        values = torch.stack([v for _, v in self.keys])
        t = frames.float().clamp(0, float(key_frames[-1]))
        hi = torch.searchsorted(key_frames, t, right=True).clamp(1, len(self.keys) - 1) if len(self.keys) > 1 else None
        if hi is None:
            return values[0].expand(len(frames), -1).clone()
        lo = hi - 1
        span = (key_frames[hi] - key_frames[lo]).clamp_min(1.0)
        w = ((t - key_frames[lo]) / span).clamp(0, 1)[:, None]
        out = values[lo] + (values[hi] - values[lo]) * w
        a0, a1 = values[lo][:, SLICES["sun_azimuth"]], values[hi][:, SLICES["sun_azimuth"]]
        turn = (a1 - a0 + 180) % 360 - 180  # the sun moves the short way round
        out[:, SLICES["sun_azimuth"]] = (a0 + turn * w + 180) % 360 - 180
        return out

    def given_at(self, frames: torch.Tensor) -> torch.Tensor:
        """Whether the light at each pixel frame (T,) was given, bool (T,)."""
        starts = torch.tensor([f for f, _ in self.given])
        flags = torch.tensor([g for _, g in self.given])
        return flags[(torch.searchsorted(starts, frames.long(), right=True) - 1).clamp_min(0)]

    def lights(self) -> list[Light]:
        return unpack(torch.stack([v for _, v in self.keys]))

    def changed(self, frame: int, light: torch.Tensor, since: int = 0, given: bool = True) -> "LightSchedule":
        """This schedule up to pixel frame `frame` - 1, then the packed `light` (PACKED,) held from `frame` on
        (a step, no blending; `given`: by the user or an engine, else the prompt's). Keys before `since`
        (frames already rendered) are dropped, so a stream whose light changes every frame keeps only the
        keys still ahead of it."""
        since = max(0, min(since, frame))
        keys = [(since, self.at(torch.tensor([since]))[0])] if frame > since else []
        keys += [(f, v) for f, v in self.keys if since < f < frame - 1]
        if frame - 1 > since:
            keys.append((frame - 1, self.at(torch.tensor([frame - 1]))[0]))
        # the flag in effect at `since` (earlier frames are rendered), the switches after it, then this one
        held = [g for f, g in self.given if f <= since][-1]
        flags = [(0, held)] + [(f, g) for f, g in self.given if since < f < frame] + [(frame, given)]
        return LightSchedule(keys + [(frame, light.detach().float().reshape(-1).clone())], flags)


def named() -> dict[str, Light]:
    """Every lighting preset of both worlds as a Light, by name (what a light's text may start from)."""
    from ..world.traced.presets import named_lights

    return named_lights()


def user_lights(text: str, where: str = "--light") -> LightSchedule:
    """A light as users type it (one light: JSON, key=value pairs, a preset name; or 'FRAME: light' lines),
    with every named preset; one AlayaError line naming `where` when it is wrong."""
    return LightSchedule.parse(text, where, named=named())


class LightNotRead(AlayaError):
    """A light given to a model that ignores it; `what` is the reason without the place, so a command can
    name its own flag (`--light: model ... does not read a light ...`)."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.what = what


def unread_light(refiner, name: str, encoder=None) -> str | None:
    """Why a light given to a model with this refiner (None: none) and G-buffer encoder would go unread, as one
    line naming the model (`name`), or None when the refiner or the encoder reads the light."""
    from .pipelines import encoder_reads_light

    if refiner is not None and getattr(refiner, "reads_light", False) or encoder_reads_light(encoder):
        return None
    why = "it has no G-buffer refiner" if refiner is None else "its refiner is not light-reading"
    return f"{name} does not read a light ({why})"


def recorded(lights) -> LightSchedule:
    """A light per frame (T, PACKED) (a dataset clip's, an engine's) as a schedule keyed at every frame."""
    lights = torch.as_tensor(lights, dtype=torch.float32)
    return LightSchedule([(t, lights[t]) for t in range(len(lights))])


@functools.cache
def _shipped_light_head():
    """The shipped light head, read once per process (every pipeline and every prompt change asks for it)."""
    from ...model_zoo import light_head

    return light_head.load()


def prompt_lights(model, prompts: PromptSchedule) -> LightSchedule:
    """The light each prompt entry names, as the shipped light head reads it with the model's text encoder."""
    return LightSchedule.from_prompts(prompts, _shipped_light_head(), model.text_encoder())


def model_prior(model):
    """The shading prior a model reads: its refiner's (with the reflections of a `-mirror` refiner), else
    the light-reading encoder's, else the plain one: what eval's prior-only baseline and bench's `shade` run."""
    from ...model_zoo.codecs.gbuffer_encoder import LIT_PRIOR
    from ...model_zoo.shading_prior import ShadingPrior

    prior = getattr(getattr(model, "refiner", None), "shading_prior", None)
    return prior if prior is not None else ShadingPrior(LIT_PRIOR)


class Shade:
    """G-buffers -> the shading prior's frames under a LightSchedule (one chunk in, the same frames out); the
    shadows and ambient occlusion are the G-buffers' shadow and sky passes when they carry them."""

    def __init__(self, lights: LightSchedule, prior=None, up: torch.Tensor | None = None):
        from ...model_zoo.shading_prior import ShadingPrior

        self.lights, self.prior, self.up = lights, prior or ShadingPrior(), up
        self.frame = 0  # pixel frames shaded so far

    def step(self, gbuffers: GBuffers | None) -> torch.Tensor | None:
        if gbuffers is None:
            return None
        n = len(gbuffers)
        light = self.lights.at(torch.arange(self.frame, self.frame + n))
        with torch.inference_mode():
            out = self.prior(gbuffers.images, light, depth_near=gbuffers.depth_near, up=self.up,
                             **gbuffers.visibilities())
        self.frame += n
        return out[:, :3].movedim(1, -1).contiguous()

    def flush(self) -> None:
        return None
