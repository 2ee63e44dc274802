"""Ground-truth shading: deferred physically based lighting of canonical G-buffer passes.

`shade(passes, camera, preset)` is a pure function of the five canonical passes (plus an optional
sun-visibility pass) and the camera (intrinsics for view directions, rotation for where "up" and
the sun are), so the ground truth of any frame can be recomputed from its G-buffers alone.

Model: Cook-Torrance specular (GGX distribution, Smith-Schlick geometry with k = (r + 1)^2 / 8,
Schlick Fresnel, F0 = mix(0.04, albedo, metallic)) plus Lambert diffuse, for a sun and optional
fill lights (directional); hemisphere sky/ground ambient with a split-sum-like specular term;
exponential fog by linear depth; background shows the sky gradient and sun disc. Then exposure,
the ACES filmic fit of K. Narkowicz (2015), sRGB encoding, rounding to 8 bits.
All math is float32 numpy (single-threaded); world is z-up (camera.py), sun directions point to the sun.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...model_zoo.errors import AlayaError
from ...model_zoo.light import Light

CONTENT = "colourful toy objects tumbling and rolling across a walled courtyard"


@dataclass(frozen=True)
class LightingPreset:
    """A named lighting setup and the text prompt describing it (teacher caption style)."""

    name: str
    prompt: str
    sun_elevation: float  # degrees above the horizon
    sun_azimuth: float  # degrees, from +x towards +y
    sun_color: tuple  # linear RGB radiance (intensity folded in)
    sky_zenith: tuple  # linear RGB
    sky_horizon: tuple
    ground: tuple  # light bounced from below
    ambient: float = 1.0
    fills: tuple = ()  # extra directional lights: ((elevation, azimuth, (r, g, b)), ...)
    fog_color: tuple = (0.0, 0.0, 0.0)
    fog_density: float = 0.0  # per metre
    exposure: float = 1.0

    @property
    def sun_direction(self) -> np.ndarray:
        """World unit vector pointing towards the sun."""
        return _direction(self.sun_elevation, self.sun_azimuth)


def _direction(elevation: float, azimuth: float) -> np.ndarray:
    e, a = math.radians(elevation), math.radians(azimuth)
    return np.array([math.cos(e) * math.cos(a), math.cos(e) * math.sin(a), math.sin(e)])


def _prompt(lighting: str, mood: str) -> str:
    return f"{CONTENT}; the scene is {lighting}, creating a {mood} atmosphere."


PRESETS: dict[str, LightingPreset] = {p.name: p for p in [
    LightingPreset("bright_sunny", _prompt("lit by a bright midday sun under a clear blue sky with crisp shadows",
                                           "cheerful, vivid"),
                   55, 35, (3.2, 3.0, 2.8), (0.22, 0.42, 0.9), (0.65, 0.78, 0.95), (0.3, 0.27, 0.22), 0.9),
    LightingPreset("overcast", _prompt("under a flat grey overcast sky with soft diffuse light and no hard shadows",
                                       "calm, muted"),
                   70, 60, (0.5, 0.5, 0.52), (0.55, 0.57, 0.6), (0.7, 0.71, 0.72), (0.25, 0.25, 0.25), 1.7),
    LightingPreset("sunset_dramatic", _prompt("lit by a low golden sun at sunset under an orange and purple sky "
                                              "with long shadows", "dramatic, cinematic"),
                   8, 200, (3.4, 1.6, 0.6), (0.12, 0.14, 0.4), (1.0, 0.45, 0.22), (0.18, 0.1, 0.08), 0.6,
                   exposure=1.1),
    LightingPreset("moonlit_night", _prompt("lit by cold blue moonlight under a dark night sky", "mysterious, quiet"),
                   40, 120, (0.35, 0.45, 0.8), (0.01, 0.015, 0.045), (0.03, 0.045, 0.09), (0.01, 0.01, 0.015), 0.6,
                   exposure=2.2),
    LightingPreset("cyberpunk_neon", _prompt("a night street lit by magenta and cyan neon lights in a purple haze",
                                             "futuristic, electric"),
                   60, 0, (0.15, 0.1, 0.25), (0.04, 0.01, 0.08), (0.3, 0.05, 0.3), (0.05, 0.02, 0.08), 0.6,
                   fills=((15, 120, (0.2, 1.6, 2.0)), (20, -60, (2.2, 0.2, 1.6))),
                   fog_color=(0.1, 0.02, 0.14), fog_density=0.03, exposure=1.3),
    LightingPreset("snowy_winter", _prompt("a snowy winter day with cold bright light, a pale sky and light mist",
                                           "crisp, serene"),
                   20, 150, (2.2, 2.15, 2.05), (0.55, 0.65, 0.82), (0.85, 0.88, 0.92), (0.8, 0.82, 0.86), 1.1,
                   fog_color=(0.8, 0.84, 0.9), fog_density=0.015, exposure=0.85),
    LightingPreset("autumn_warm", _prompt("lit by warm late-afternoon autumn sunlight with amber tones",
                                          "cosy, nostalgic"),
                   25, 240, (2.8, 1.9, 1.1), (0.35, 0.45, 0.7), (0.9, 0.7, 0.45), (0.3, 0.2, 0.1), 0.8),
    LightingPreset("underwater", _prompt("underwater, with blue-green light filtering down from the surface",
                                         "dreamy, submerged"),
                   75, 0, (0.8, 1.4, 1.5), (0.05, 0.35, 0.45), (0.02, 0.2, 0.3), (0.02, 0.08, 0.1), 0.9,
                   fog_color=(0.02, 0.22, 0.3), fog_density=0.12),
]}


def turned(preset: LightingPreset, degrees: float) -> LightingPreset:
    """The preset with the world turned by `degrees` about the vertical: the sun and the fill lights
    move in azimuth, the sky (a function of height alone) stays."""
    import dataclasses

    fills = tuple((e, a + degrees, rgb) for e, a, rgb in preset.fills)
    return dataclasses.replace(preset, sun_azimuth=preset.sun_azimuth + degrees, fills=fills)


def heading(camera) -> float:
    """Degrees (world azimuth, from +x towards +y) of the camera's view direction seen from above."""
    forward = -camera.rotation[2]
    return math.degrees(math.atan2(forward[1], forward[0]))


def light_of(preset: LightingPreset | str, camera_heading: float = 0.0) -> Light:
    """The preset as a camera-relative `Light` (model_zoo/light.py) for a camera heading `camera_heading`
    degrees: the sun's and the fills' azimuths become relative to where the camera looks."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    fills = tuple((e, a - camera_heading, tuple(rgb)) for e, a, rgb in p.fills)
    return Light(sun_azimuth=(p.sun_azimuth - camera_heading + 180) % 360 - 180, sun_elevation=p.sun_elevation,
                 sun_color=tuple(p.sun_color), sky_zenith=tuple(p.sky_zenith), sky_horizon=tuple(p.sky_horizon),
                 ground=tuple(p.ground), ambient=p.ambient, fills=tuple((e, (a + 180) % 360 - 180, rgb) for e, a, rgb in fills),
                 fog_color=tuple(p.fog_color), fog_density=p.fog_density, exposure=p.exposure).validate(f"preset {p.name}")


def get_preset(name: str) -> LightingPreset:
    if name not in PRESETS:
        raise AlayaError(f"lighting preset {name!r} is unknown; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def _t(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a[..., 0:1] * b[..., 0:1] + a[..., 1:2] * b[..., 1:2] + a[..., 2:3] * b[..., 2:3]


def _normalize(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.sqrt(_dot(a, a)), np.float32(1e-8))


def _sky(dirs: np.ndarray, up: np.ndarray, p: LightingPreset) -> np.ndarray:
    """Sky radiance (..., 3) seen along unit directions `dirs` (camera space)."""
    u = _dot(dirs, up)
    zen, hor, gnd = _t(p.sky_zenith), _t(p.sky_horizon), _t(p.ground)
    above = hor + (zen - hor) * np.sqrt(np.maximum(u, 0))
    below = hor + (gnd - hor) * np.sqrt(np.clip(-u, 0, 1))
    return np.where(u >= 0, above, below)


def _ggx(n, v, l, albedo, metallic, roughness, radiance):
    """Cook-Torrance GGX + Lambert for one directional light; returns outgoing radiance (..., 3)."""
    h = _normalize(l + v)
    n_l = np.maximum(_dot(n, l), 0)
    n_v = np.maximum(_dot(n, v), 1e-4)
    n_h = np.maximum(_dot(n, h), 0)
    v_h = np.maximum(_dot(v, h), 0)
    a2 = np.maximum(roughness * roughness, 2e-3) ** 2
    d = a2 / (np.float32(math.pi) * (n_h * n_h * (a2 - 1) + 1) ** 2)
    k = (roughness + 1) ** 2 / 8
    g = n_v / (n_v * (1 - k) + k) * n_l / (n_l * (1 - k) + k)
    f0 = 0.04 * (1 - metallic) + albedo * metallic
    f = f0 + (1 - f0) * (1 - v_h) ** 5
    spec = d * g * f / (4 * n_v * n_l + 1e-4)
    diffuse = (1 - f) * (1 - metallic) * albedo / np.float32(math.pi)
    return (diffuse + spec) * radiance * n_l


def aces(x: np.ndarray) -> np.ndarray:
    """ACES filmic tone curve (Narkowicz 2015 fit), linear HDR -> [0, 1]."""
    return np.clip(x * (2.51 * x + 0.03) / (x * (2.43 * x + 0.59) + 0.14), 0, 1)


def shade(passes: dict, camera, preset: LightingPreset | str, sun_visibility: np.ndarray | None = None) -> np.ndarray:
    """Ground-truth RGB (H, W, 3) uint8 sRGB from canonical passes and a camera.

    passes: "albedo" (H,W,3) linear, "depth" (H,W) metres (+inf background), "metallic" (H,W),
    "normal" (H,W,3) camera space, "roughness" (H,W) (a GBufferFrame's .passes() works).
    camera: a camera.Camera (only size, fov and rotation are used). sun_visibility: (H,W) in
    [0, 1] scaling the sun (shadows); None means fully lit. Single-threaded numpy float32, so it
    neither fights the rasterizer's threads nor depends on a thread count.
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    h, w = passes["depth"].shape
    if (camera.height, camera.width) != (h, w):
        raise AlayaError(f"shade: passes are {w}x{h} but the camera is {camera.width}x{camera.height}")
    albedo = _t(passes["albedo"])
    depth = _t(passes["depth"])[..., None]
    metallic = _t(passes["metallic"])[..., None]
    roughness = _t(passes["roughness"])[..., None]
    n = _t(passes["normal"])

    rot = camera.rotation  # world -> camera
    up = _t(rot @ np.array([0.0, 0.0, 1.0]))
    view = _normalize(_t(camera.view_dirs()))
    v = -view  # towards the viewer

    sun = _t(rot @ p.sun_direction)
    sun_radiance = _t(p.sun_color)
    if sun_visibility is not None:
        sun_radiance = sun_radiance * _t(sun_visibility)[..., None]
    color = _ggx(n, v, sun, albedo, metallic, roughness, sun_radiance)
    for elevation, azimuth, rgb in p.fills:
        color = color + _ggx(n, v, _t(rot @ _direction(elevation, azimuth)), albedo, metallic, roughness, _t(rgb))

    # Ambient: hemisphere irradiance (diffuse) and the sky seen in the mirror direction (specular).
    t = _dot(n, up) * 0.5 + 0.5
    sky_mean = _t(p.sky_zenith) * 0.5 + _t(p.sky_horizon) * 0.5
    irradiance = (_t(p.ground) + (sky_mean - _t(p.ground)) * t) * np.float32(p.ambient)
    n_v = np.maximum(_dot(n, v), 0)
    f0 = 0.04 * (1 - metallic) + albedo * metallic
    f_amb = f0 + np.maximum(np.maximum(1 - roughness, 0) - f0, 0) * (1 - n_v) ** 5
    mirror = 2 * _dot(n, v) * n - v
    spec_amb = _sky(mirror, up, p) * np.float32(p.ambient) * f_amb * (1 - 0.7 * roughness)
    color = color + irradiance * albedo * (1 - metallic) * (1 - f_amb) + spec_amb

    # Fog by distance on geometry; background: sky gradient plus a sun disc, partly fogged.
    fog_color = _t(p.fog_color)
    fog = 1 - np.exp(np.float32(-p.fog_density) * np.nan_to_num(depth, posinf=0.0))
    color = color + (fog_color - color) * fog
    sky = _sky(view, up, p) + _t(p.sun_color) * np.maximum(_dot(view, sun), 0) ** 2000
    if p.fog_density > 0:
        sky = sky + (fog_color - sky) * np.float32(0.6)
    color = np.where(np.isinf(depth), sky, color)

    ldr = aces(color * np.float32(p.exposure))
    srgb = np.where(ldr <= 0.0031308, ldr * 12.92, 1.055 * np.maximum(ldr, 0.0031308) ** (1 / 2.4) - 0.055)
    return np.clip(np.rint(srgb * 255), 0, 255).astype(np.uint8)
