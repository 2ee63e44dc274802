"""World v2 lighting presets, the sun-side convention and the captions that carry both.

A `TracedPreset` is a lighting setup for the path tracer. The physics world's presets
(streaming/world/shading.py PRESETS) keep their names, parameters and prompts: the sun is a
directional light of irradiance `sun_color`; the sky an environment map whose radiance runs from
`sky_horizon` to `sky_zenith` (times `ambient`), `ground` below the horizon; `fills` are more
directional lights; fog is exponential in the G-buffer depth; then `exposure`, ACES and sRGB as
in shade(). World v2 adds presets the path tracer can show: wet streets after rain (glossy,
darker porous materials), fog, and lamps switched on at night.

Convention for what G-buffers cannot say, the sun's side. Camera-space G-buffers do not tell
where north is, so the sun's azimuth is set relative to the camera: its heading in the clip's
first frame (the horizontal part of the view direction). The sun is placed in one of four sides,
each 90 degrees wide, at a seeded angle within 30 degrees of the side's centre:

    ahead   0 deg    facing the sun (backlit, shadows run towards the camera)
    left    +90 deg  (counter-clockwise seen from above)
    behind  180 deg  the sun at the camera's back (front-lit, shadows run away)
    right   -90 deg

and the caption says it ("..., with the sun on the left, creating a ... atmosphere."), so a
prompt can choose it. Presets whose light casts no clear shadow (overcast, rain, fog, lamps)
name no side; their sun still follows the convention. Moonlight is named "the moon".
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ....model_zoo.errors import AlayaError
from ....model_zoo.light import Light
from ....model_zoo.light_head import NO_SIDE_AZIMUTH
from ..shading import CONTENT as PHYSICS_CONTENT
from ..shading import PRESETS, LightingPreset, _prompt, light_of
from .scene import CONTENT

SIDES = {"ahead": 0.0, "left": 90.0, "behind": 180.0, "right": -90.0}
SIDE_JITTER = 30.0  # degrees either side of a side's centre
OPPOSITE_SIDE = {"ahead": "behind", "behind": "ahead", "left": "right", "right": "left"}
PHRASES = {"ahead": "with the {light} ahead, shining towards the camera", "left": "with the {light} on the left",
           "right": "with the {light} on the right", "behind": "with the {light} behind the camera"}


@dataclass(frozen=True)
class TracedPreset:
    base: LightingPreset  # sun, sky, fills, fog, exposure and the caption
    light: str | None = "sun"  # what the caption calls the directional light; None: no side named
    lamps: bool = False  # emissive lamp materials glow
    lamp_color: tuple | None = None  # replaces the lamps' own emission colour
    wet: bool = False  # porous materials darken and turn glossy (rain)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def prompt(self) -> str:
        return self.base.prompt


_NEW = [
    TracedPreset(LightingPreset("rainy_wet", _prompt("wet after the rain under a heavy grey sky, the ground glossy "
                                                     "with puddles reflecting the light", "damp, moody"),
                                60, 0, (0.35, 0.36, 0.4), (0.4, 0.43, 0.48), (0.55, 0.57, 0.6), (0.12, 0.12, 0.13),
                                1.5, fog_color=(0.5, 0.52, 0.56), fog_density=0.012, exposure=1.2),
                 light=None, wet=True),
    TracedPreset(LightingPreset("foggy", _prompt("wrapped in thick fog, distant shapes fading into a pale grey "
                                                 "haze", "hushed, mysterious"),
                                20, 0, (0.6, 0.58, 0.52), (0.62, 0.64, 0.68), (0.75, 0.76, 0.78), (0.3, 0.3, 0.3),
                                1.3, fog_color=(0.68, 0.7, 0.73), fog_density=0.07, exposure=1.0),
                 light=None),
    TracedPreset(LightingPreset("night_lamps", _prompt("at night, lit by warm yellow lamps glowing under a dark "
                                                       "sky", "warm, nocturnal"),
                                35, 0, (0.04, 0.05, 0.09), (0.006, 0.008, 0.02), (0.02, 0.025, 0.045),
                                (0.01, 0.01, 0.01), 1.0, exposure=1.6),
                 light=None, lamps=True),
]

TRACED_PRESETS: dict[str, TracedPreset] = {p.name: p for p in [
    TracedPreset(PRESETS["bright_sunny"]),
    TracedPreset(PRESETS["overcast"], light=None),
    TracedPreset(PRESETS["sunset_dramatic"]),
    TracedPreset(PRESETS["moonlit_night"], light="moon"),
    TracedPreset(PRESETS["cyberpunk_neon"], light=None, lamps=True, lamp_color=(5.0, 1.2, 7.0)),
    TracedPreset(PRESETS["snowy_winter"]),
    TracedPreset(PRESETS["autumn_warm"]),
    *_NEW,
]}
"""Every world v2 preset: the physics world's (less `underwater`, which a street cannot show) and the new ones."""


def named_lights(azimuth: float = NO_SIDE_AZIMUTH) -> dict[str, Light]:
    """Every lighting preset of both worlds as a camera-relative Light (model_zoo/light.py) with the sun
    at `azimuth` (default: behind the camera to the left): what `--light NAME` and the light head's
    table start from."""
    bases = {**PRESETS, **{n: p.base for n, p in TRACED_PRESETS.items()}}
    return {n: light_of(p, camera_heading=p.sun_azimuth - azimuth) for n, p in bases.items()}


def get_traced_preset(name: str) -> TracedPreset:
    if name not in TRACED_PRESETS:
        raise AlayaError(f"world v2: lighting preset {name!r} is unknown; choose one of {', '.join(TRACED_PRESETS)}")
    return TRACED_PRESETS[name]


def check_side(side: str) -> str:
    if side not in SIDES:
        raise AlayaError(f"world v2: sun side {side!r} is unknown; choose one of {', '.join(SIDES)}")
    return side


def sun_azimuth(first_heading: float, side: str, jitter: float = 0.0) -> float:
    """World azimuth (degrees) of the sun on `side` of a camera whose first-frame heading is given;
    jitter in [-1, 1] moves it within SIDE_JITTER of the side's centre."""
    return first_heading + SIDES[check_side(side)] + SIDE_JITTER * max(-1.0, min(1.0, jitter))


def side_of(relative_azimuth: float) -> str:
    """The side (SIDES) nearest to a sun azimuth relative to the first-frame heading, degrees."""
    a = (relative_azimuth + 180.0) % 360.0 - 180.0
    return min(SIDES, key=lambda s: abs((a - SIDES[s] + 180.0) % 360.0 - 180.0))


def placed(preset: TracedPreset, azimuth: float) -> LightingPreset:
    """The preset's lighting with the sun at `azimuth` (degrees); fill lights keep their offsets to it."""
    base = preset.base
    turn = azimuth - base.sun_azimuth
    fills = tuple((e, a + turn, rgb) for e, a, rgb in base.fills)
    return dataclasses.replace(base, sun_azimuth=azimuth, fills=fills)


def mirrored_caption(text: str) -> str:
    """The caption of the scene mirrored left-right: a light on the left is then on the right (ahead,
    behind and captions without a side stay as they are)."""
    for light in sorted({p.light for p in TRACED_PRESETS.values() if p.light}):
        left, right = (PHRASES[s].format(light=light) for s in ("left", "right"))
        if left in text:
            return text.replace(left, right, 1)
        if right in text:
            return text.replace(right, left, 1)
    return text


def caption(preset: TracedPreset, kind: str, side: str | None) -> str:
    """The preset's prompt about a scene of `kind`, naming the sun's side when the preset has one:
    "<scene>; the scene is <lighting>, with the sun on the left, creating a <mood> atmosphere."."""
    text = preset.prompt.replace(PHYSICS_CONTENT, CONTENT[kind], 1)
    if side is not None and preset.light is not None:
        text = text.replace(", creating a", ", " + PHRASES[check_side(side)].format(light=preset.light) + ", creating a", 1)
    return text
