"""The light a frame is rendered under: what G-buffers do not carry.

A `Light` is a sun (a directional light), a two-colour sky with a ground colour below the horizon,
an ambient scale, optional fill lights, exponential depth fog and an exposure: the same terms as
the physics world's lighting presets (streaming/world/shading.py), so a preset converts exactly.

Directions are relative to the camera, as a user and a caption say them ("the sun on the left"):
`sun_azimuth` is degrees about the up axis from straight ahead (0, the camera faces the sun),
towards the left (+90), behind the camera (180) and the right (-90); `sun_elevation` is degrees
above the horizon. The shading prior (model_zoo/shading_prior.py) turns them into camera space
with the camera's up vector (from camera.json, or estimated from the normals).

`Light.parse` reads what users type: a JSON object or a short form `az=90,el=30,sun=3:2.9:2.7`
(colours as r:g:b or one grey value), optionally after a named base light (`bright_sunny,az=-90`)
from a table the caller passes (the world's presets live above this layer).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from .errors import AlayaError
from . import jsonfile

MAX_FILLS = 2  # fill lights a packed light vector carries (the presets use at most two)

_COLOURS = ("sun_color", "sky_zenith", "sky_horizon", "ground", "fog_color")
_SHORT = {"az": "sun_azimuth", "el": "sun_elevation", "sun": "sun_color", "zenith": "sky_zenith",
          "horizon": "sky_horizon", "fog": "fog_color"}
_MAX_RADIANCE = 1000.0  # a colour above this is a typo, not a sun


@dataclass(frozen=True)
class Light:
    sun_azimuth: float = 135.0  # degrees about up: 0 ahead, +90 left, 180 behind, -90 right
    sun_elevation: float = 45.0  # degrees above the horizon, [-90, 90]
    sun_color: tuple = (3.0, 2.9, 2.7)  # linear RGB radiance, intensity folded in
    sky_zenith: tuple = (0.22, 0.42, 0.9)  # linear RGB
    sky_horizon: tuple = (0.65, 0.78, 0.95)
    ground: tuple = (0.3, 0.27, 0.22)  # light bounced from below the horizon
    ambient: float = 1.0  # scales the sky and ground light
    fills: tuple = ()  # extra directional lights: ((elevation, azimuth, (r, g, b)), ...), camera-relative
    fog_color: tuple = (0.0, 0.0, 0.0)
    fog_density: float = 0.0  # per scene unit (metre) of depth
    exposure: float = 1.0

    def validate(self, where: str = "light") -> "Light":
        """self, or one AlayaError line naming the field and what is wrong with it."""
        def number(name, value, lo=-math.inf, hi=math.inf):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise AlayaError(f"{where}: {name} must be a finite number, got {value!r}")
            if not lo <= value <= hi:
                raise AlayaError(f"{where}: {name} {value!r} is outside [{lo:g}, {hi:g}]")

        def colour(name, value):
            if not isinstance(value, (tuple, list)) or len(value) != 3:
                raise AlayaError(f"{where}: {name} must be 3 numbers (linear r, g, b), got {value!r}")
            for c in value:
                number(name, c, 0.0, _MAX_RADIANCE)

        number("sun_azimuth", self.sun_azimuth, -360.0, 360.0)
        number("sun_elevation", self.sun_elevation, -90.0, 90.0)
        for name in _COLOURS:
            colour(name, getattr(self, name))
        number("ambient", self.ambient, 0.0, 100.0)
        number("fog_density", self.fog_density, 0.0, 100.0)
        number("exposure", self.exposure, 1e-3, 1000.0)
        if not isinstance(self.fills, (tuple, list)) or len(self.fills) > MAX_FILLS:
            raise AlayaError(f"{where}: fills must be a list of at most {MAX_FILLS} [elevation, azimuth, [r, g, b]]")
        for fill in self.fills:
            if not isinstance(fill, (tuple, list)) or len(fill) != 3:
                raise AlayaError(f"{where}: a fill light must be [elevation, azimuth, [r, g, b]], got {fill!r}")
            number("fill elevation", fill[0], -90.0, 90.0)
            number("fill azimuth", fill[1], -360.0, 360.0)
            colour("fill colour", fill[2])
        return self

    def replace(self, **changes) -> "Light":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fills"] = [[e, a, list(rgb)] for e, a, rgb in self.fills]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, data, where: str = "light", base: "Light | None" = None) -> "Light":
        """A light from a JSON object; keys it lacks keep `base`'s (default: Light()); unknown keys are refused."""
        if not isinstance(data, dict):
            raise AlayaError(f"{where}: a light is a JSON object of {', '.join(FIELDS)}; got {type(data).__name__}")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise AlayaError(f"{where}: unknown light key {unknown[0]!r}; the keys are {', '.join(FIELDS)}")
        values = {}
        for k, v in data.items():
            if k in _COLOURS and isinstance(v, list):
                v = tuple(v)
            if k == "fills" and isinstance(v, list):
                v = tuple((f[0], f[1], tuple(f[2])) if isinstance(f, list) and len(f) == 3 and isinstance(f[2], list)
                          else f for f in v)
            values[k] = v
        return (base or cls()).replace(**values).validate(where)

    @classmethod
    def parse(cls, text: str, where: str = "--light", named: dict | None = None) -> "Light":
        """A JSON object, or `[NAME,]key=value,...` (keys: FIELDS or az, el, sun, zenith, horizon, fog);
        NAME picks a base light from `named`."""
        text = (text or "").strip()
        if not text:
            raise AlayaError(f"{where}: empty; give a JSON object or key=value pairs such as az=90,el=30")
        if text.startswith("{"):
            try:
                data = jsonfile.loads(text)
            except ValueError as err:
                raise AlayaError(f"{where}: malformed JSON ({err})") from None
            return cls.from_dict(data, where)
        base, values = None, {}
        for i, part in enumerate(p.strip() for p in text.split(",")):
            if "=" not in part:
                if i == 0 and named is not None and part in named:
                    base = named[part]
                    continue
                names = f"; named lights: {', '.join(named)}" if named else ""
                raise AlayaError(f"{where}: {part!r} is neither key=value nor a named light{names}")
            key, _, value = (s.strip() for s in part.partition("="))
            key = _SHORT.get(key, key)
            if key not in FIELDS or key == "fills":
                raise AlayaError(f"{where}: unknown light key {key!r}; the keys are "
                                 f"{', '.join(k for k in FIELDS if k != 'fills')} (or az, el, sun, zenith, horizon, fog)")
            values[key] = _short_value(key, value, where)
        return cls.from_dict(values, where, base=base)


FIELDS = tuple(f.name for f in dataclasses.fields(Light))


def _short_value(key: str, value: str, where: str):
    try:
        numbers = tuple(float(v) for v in value.split(":"))
    except ValueError:
        raise AlayaError(f"{where}: {key}={value!r} is not a number{' or r:g:b' if key in _COLOURS else ''}") from None
    if key in _COLOURS:
        if len(numbers) == 1:
            numbers = numbers * 3
        return numbers
    if len(numbers) != 1:
        raise AlayaError(f"{where}: {key}={value!r} takes one number")
    return numbers[0]


# The packed form: one float vector per light, what the shading prior and the prompt head read.
# Slices of it by name; a fill that is absent has zero colour, so it adds no light.
SLICES = {"sun_azimuth": slice(0, 1), "sun_elevation": slice(1, 2), "sun_color": slice(2, 5),
          "sky_zenith": slice(5, 8), "sky_horizon": slice(8, 11), "ground": slice(11, 14),
          "fog_color": slice(14, 17), "ambient": slice(17, 18), "fog_density": slice(18, 19),
          "exposure": slice(19, 20), "fills": slice(20, 20 + 5 * MAX_FILLS)}
PACKED = 20 + 5 * MAX_FILLS


def pack(lights) -> torch.Tensor:
    """Light or [Light] -> float32 (B, PACKED)."""
    lights = [lights] if isinstance(lights, Light) else list(lights)
    rows = []
    for light in lights:
        row = [light.sun_azimuth, light.sun_elevation]
        for name in _COLOURS:
            row += list(getattr(light, name))
        row += [light.ambient, light.fog_density, light.exposure]
        for k in range(MAX_FILLS):
            e, a, rgb = light.fills[k] if k < len(light.fills) else (0.0, 0.0, (0.0, 0.0, 0.0))
            row += [e, a, *rgb]
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32)


def unpack(packed: torch.Tensor) -> list[Light]:
    """float (B, PACKED) -> [Light] (fills with no colour are dropped)."""
    out = []
    for row in packed.detach().float().cpu().tolist():
        v = {name: row[s] for name, s in SLICES.items()}
        fills = tuple((f[0], f[1], tuple(f[2:5])) for f in (v["fills"][5 * k:5 * k + 5] for k in range(MAX_FILLS))
                      if any(c != 0 for c in f[2:5]))
        out.append(Light(sun_azimuth=v["sun_azimuth"][0], sun_elevation=v["sun_elevation"][0],
                         **{name: tuple(v[name]) for name in _COLOURS}, ambient=v["ambient"][0],
                         fog_density=v["fog_density"][0], exposure=v["exposure"][0], fills=fills))
    return out
