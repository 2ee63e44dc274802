"""The shading prior: the five G-buffer passes lit by a `Light`, deterministic and differentiable.

G-buffers carry no light, and a small network trained on two cores does not learn to cast a
shadow from depth. So the light is computed, cheaply and in screen space, and the networks learn
what it gets wrong (indirect light, soft shadows, texture, style). Inputs are teacher-form
G-buffers (uint8 (..., 5, H, W, 3), streaming/gbuffer.py) and a packed light (model_zoo/light.py).

    positions   view space from the 8-bit inverse depth and a pinhole of vertical field of view
                `fov_y` (pixel (i, j) looks through ((j + .5 - W/2) / f, -(i + .5 - H/2) / f, -1))
    up          camera-space up: given (camera.json), else the mean of the upward-facing normals
    shadow      sun visibility, marched through the depth buffer along the exact screen lines that
                shadow rays follow (epipolar_shadow): every pixel near a caster, then windows of
                growing width; an occluder lies nearer the sun's axis than the pixel, by more than
                the 8-bit depth's rounding and less than `thickness`. Misses what is off the frame.
    ao          ambient occlusion: `ao_samples` depth-buffer taps on a spiral of radius `ao_radius`
                scene units around each pixel, occlusion from the taps above its tangent plane
    shading     as the physics world's ground truth (streaming/world/shading.py shade()): GGX
                (Smith-Schlick, Schlick Fresnel, F0 = mix(0.04, albedo, metallic)) + Lambert for the
                sun (times its visibility) and the fills; hemisphere sky/ground ambient (times AO) and
                the sky seen in the mirror direction; exponential depth fog; the sky and the sun's
                disc on background pixels; exposure, ACES (Narkowicz), sRGB

Given the truth's sun visibility and no AO it reproduces the physics world's truth from its
teacher-form G-buffers (tests/test_shading_prior.py), so what it misses on a path-traced scene is
what screen space and one bounce miss. Float32 throughout; its cost per frame on one thread is
`alaya-flash bench`'s `shade` figure (docs/lighting.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import AlayaError
from .light import MAX_FILLS, SLICES

PRIOR_CHANNELS = 5  # shaded RGB (sRGB, [0, 1]), sun visibility, ambient occlusion


@dataclass(frozen=True)
class PriorConfig:
    fov_y: float = 60.0  # degrees; both worlds' cameras, and the default when a source does not say
    shadows: bool = True  # screen-space cast shadows (else the sun reaches every pixel facing it)
    shadow_stride: int = 2  # shadows from every n-th pixel (a quarter of the cost at 2), spread back bilinearly
    thickness: float = 0.15  # how far behind a visible surface the solid goes, as a fraction of its distance
    ao_samples: int = 8
    ao_radius: float = 0.6  # scene units
    sun_disc: float = 2000.0  # exponent of the sun's disc on the sky (shade()'s)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-3, keepdim=True)


def _unit(a: Tensor) -> Tensor:
    return a / _dot(a, a).sqrt().clamp_min(1e-8)


def _srgb_to_linear(v: Tensor) -> Tensor:
    return torch.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


_SRGB_TO_LINEAR = _srgb_to_linear(torch.arange(256, dtype=torch.float32) / 255)


def decode(images: Tensor, depth_near: float) -> dict[str, Tensor]:
    """Teacher-form uint8 (..., 5, H, W, 3) -> float planes (..., C, H, W): linear albedo, depth
    (+inf on background), metallic, unit normal, roughness."""
    if images.dtype != torch.uint8 or images.ndim < 4 or images.shape[-4] != 5 or images.shape[-1] != 3:
        raise AlayaError(f"shading prior: expected uint8 G-buffers (..., 5, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    x = images.movedim(-1, -3)  # (..., 5, 3, H, W) uint8
    albedo = _SRGB_TO_LINEAR[x[..., 0, :, :, :].long()]  # a table lookup: the same values as the formula, no pow
    inv_depth, metallic, normal, roughness = (x[..., k, :, :, :].float() / 255 for k in range(1, 5))
    v = inv_depth[..., :1, :, :]
    depth = torch.where(v > 0, depth_near / v.clamp_min(1 / 255), torch.full_like(v, math.inf))
    return {"albedo": albedo, "depth": depth, "metallic": metallic[..., :1, :, :],
            "normal": _unit(normal * 2 - 1), "roughness": roughness[..., :1, :, :]}


def view_rays(h: int, w: int, fov_y: float) -> Tensor:
    """(3, H, W) camera-space rays with z = -1 through each pixel's centre."""
    f = 0.5 * h / math.tan(math.radians(fov_y) / 2)
    j = (torch.arange(w, dtype=torch.float32) + 0.5 - w / 2) / f
    i = -(torch.arange(h, dtype=torch.float32) + 0.5 - h / 2) / f
    return torch.stack([j.expand(h, w), i[:, None].expand(h, w), torch.full((h, w), -1.0)])


def estimate_up(normal: Tensor, depth: Tensor) -> Tensor:
    """Camera-space up (..., 3) from the normals: the mean of those facing up-ish (y > 0.5) on geometry,
    the camera's own +y where fewer than 1% of the pixels do."""
    keep = (normal[..., 1:2, :, :] > 0.5) & torch.isfinite(depth)
    total = (normal * keep).sum((-2, -1))
    count = keep.sum((-2, -1)).float()
    fallback = torch.tensor([0.0, 1.0, 0.0]).expand_as(total)
    enough = count >= 0.01 * normal.shape[-1] * normal.shape[-2]
    up = torch.where(enough, total, fallback)
    return up / up.norm(dim=-1, keepdim=True).clamp_min(1e-8)


def direction(elevation: Tensor, azimuth: Tensor, up: Tensor) -> Tensor:
    """Unit camera-space vectors (..., 3) toward a light at `elevation` above the horizon and `azimuth`
    (degrees: 0 the camera's heading, +90 left) about `up` (..., 3)."""
    ahead = torch.tensor([0.0, 0.0, -1.0]).expand_as(up)
    forward = ahead - (ahead * up).sum(-1, keepdim=True) * up
    flat = forward.norm(dim=-1, keepdim=True) < 1e-4  # looking straight up or down: any heading will do
    forward = torch.where(flat, torch.tensor([0.0, 1.0, 0.0]).expand_as(up), forward)
    forward = forward / forward.norm(dim=-1, keepdim=True)
    left = torch.linalg.cross(up, forward, dim=-1)
    e, a = torch.deg2rad(elevation)[..., None], torch.deg2rad(azimuth)[..., None]
    return e.cos() * (a.cos() * forward + a.sin() * left) + e.sin() * up


def _polar_frame(v: tuple[float, float], h: int, w: int) -> tuple[float, float, float, float]:
    """Angles and radii around screen point v that cover the frame: (phi0, phi_span, r0, r_span)."""
    vx, vy = v
    corners = [(0.0, 0.0), (w, 0.0), (0.0, h), (w, h)]
    r_max = max(math.hypot(x - vx, y - vy) for x, y in corners)
    if 0 <= vx <= w and 0 <= vy <= h:
        return -math.pi, 2 * math.pi, 0.0, r_max
    centre = math.atan2(h / 2 - vy, w / 2 - vx)  # angles relative to the frame's centre never wrap
    rel = [(math.atan2(y - vy, x - vx) - centre + math.pi) % (2 * math.pi) - math.pi for x, y in corners]
    r_min = math.hypot(max(0.0, -vx, vx - w), max(0.0, -vy, vy - h))
    return centre + min(rel), max(rel) - min(rel), r_min, r_max - r_min


def march_windows(longest: int) -> list[tuple[int, int]]:
    """(shift, width) windows of a shadow line the march looks at, nearest first: every pixel up to
    8, then windows of 2, 4, 8, ... pixels, four of each, tiling the line up to `longest` with no
    gap, so no occluder is skipped (far ones are tested by the nearest sample of their window)."""
    windows, s, width = [(k, 1) for k in range(1, 9)], 8, 2
    while s < longest:
        for _ in range(4):
            s += width
            windows.append((s, width))
        width *= 2
    return windows


def epipolar_shadow(pos: Tensor, depth: Tensor, sun: Tensor, focal: float, depth_near: float,
                    thickness: float = PriorConfig.thickness, stride: int = 1) -> Tensor:
    """Sun visibility (N, 1, H, W) in {0, 1}: screen-space shadows marched along exact shadow lines.

    Every shadow ray of a directional light runs along a screen line through the sun's vanishing
    point v (the projection of the sun's direction, or of its opposite when the sun is behind the
    camera). The depth buffer is resampled along those lines at one-pixel steps, so a march along
    them skips no pixel near the caster. On such a line, a point S shadows P iff S lies nearer the
    axis through the eye along the sun than P does (g(S) < g(P), g the distance from that axis:
    the view ray through S then meets P's shadow ray behind S), and not so much nearer that the ray
    passes behind S by more than `thickness` times S's distance (g(S) (1 + thickness) > g(P)).
    With `stride` s it marches s x s blocks, each as its least g (so an edge a pixel wide still
    casts, and a plane's blocks stay level with each other), and spreads the answer back bilinearly."""
    full_h, full_w = depth.shape[-2:]
    full_finite = torch.isfinite(depth)
    along = (pos * sun[:, :, None, None]).sum(1, keepdim=True)
    g_full = ((pos * pos).sum(1, keepdim=True) - along * along).clamp_min(0).sqrt()
    g_full = torch.where(full_finite, g_full, torch.full_like(g_full, math.inf))
    occluders = -F.max_pool2d(-g_full, stride, ceil_mode=True) if stride > 1 else g_full
    if stride > 1:
        pos, depth, g_full = pos[..., ::stride, ::stride], depth[..., ::stride, ::stride], occluders
    n, _, h, w = depth.shape
    finite = torch.isfinite(depth)
    out = torch.ones_like(depth)
    xs = torch.arange(w, dtype=torch.float32) + 0.5
    ys = torch.arange(h, dtype=torch.float32) + 0.5
    windows = march_windows(int(math.hypot(h, w)) + 2)
    for k in range(n):
        lx, ly, lz = sun[k].detach().tolist()
        toward = lz < 0  # the sun ahead: shadow rays run toward v; behind the camera: away from it
        z = max(abs(lz), 1e-6)
        sx, sy = (lx, ly) if toward else (-lx, -ly)
        v = (focal * sx / z + full_w / 2, -focal * sy / z + full_h / 2)
        v = ((v[0] - 0.5) / stride + 0.5, (v[1] - 0.5) / stride + 0.5)  # in the strided grid's pixels
        phi0, span, r0, r_span = _polar_frame(v, h, w)
        lines = int(min(max(math.ceil(span * (r0 + r_span)), 16), 2 * (h + w)))
        steps = int(math.ceil(r_span)) + 2
        d_phi, d_r = span / lines, (r_span + 1) / steps
        phi = phi0 + (torch.arange(lines, dtype=torch.float32) + 0.5) * d_phi
        r = r0 + torch.arange(steps, dtype=torch.float32) * d_r
        px = torch.floor(v[0] + r[None, :] * phi.cos()[:, None]).long()
        py = torch.floor(v[1] + r[None, :] * phi.sin()[:, None]).long()
        on = (px >= 0) & (px < w) & (py >= 0) & (py < h)
        idx = py.clamp(0, h - 1) * w + px.clamp(0, w - 1)
        # the rounding of the 8-bit depth in g's units (it must not shadow its own surface)
        g = g_full[k, 0]
        d = torch.where(finite[k, 0], depth[k, 0], torch.zeros_like(g))
        eps = (0.3 * d * d / (depth_near * 255) + 1e-3 * d) * torch.nan_to_num(g, posinf=0.0) / d.clamp_min(1e-6)
        inf = torch.full(idx.shape, math.inf)
        samples = torch.where(on, g.reshape(-1)[idx], inf)
        blocks = torch.where(on, occluders[k, 0].reshape(-1)[idx], inf)
        tol = eps.reshape(-1)[idx]
        if not toward:  # march toward larger radii: flip the lines so it always runs to smaller ones
            samples, blocks, tol = samples.flip(1), blocks.flip(1), tol.flip(1)
        shadowed = torch.zeros_like(samples, dtype=torch.bool)
        below, above = samples - tol, samples / (1 + thickness)  # an occluder's g lies between these
        nearest = {1: blocks}  # per window width: the least g in each window of the line
        for shift, width in windows:
            if shift >= steps:
                break
            if width not in nearest:
                nearest[width] = -F.max_pool1d(-blocks[None], width, stride=1)[0]
            theirs = nearest[width][:, :steps - shift]
            shadowed[:, shift:] |= (theirs < below[:, shift:]) & (theirs > above[:, shift:])
        if not toward:
            shadowed = shadowed.flip(1)
        # each pixel's place on the lines
        dx, dy = xs[None, :] - v[0], ys[:, None] - v[1]
        a = ((torch.atan2(dy, dx) - phi0) % (2 * math.pi) / d_phi).long().clamp(0, lines - 1)
        b = ((torch.sqrt(dx * dx + dy * dy) - r0) / d_r).round().long().clamp(0, steps - 1)
        out[k, 0] = torch.where(finite[k, 0] & shadowed[a, b], 0.0, 1.0)
    if stride > 1:
        out = F.interpolate(out, size=(full_h, full_w), mode="bilinear", align_corners=False)
    return torch.where(full_finite, out, torch.ones_like(out))


def ambient_occlusion(pos: Tensor, depth: Tensor, normal: Tensor, focal: float, cfg: PriorConfig) -> Tensor:
    """(N, 1, H, W) in [0, 1], 1 = open: taps on a spiral around each pixel, occluded by points above its tangent plane."""
    if cfg.ao_samples == 0:
        return torch.ones_like(depth)
    n, _, h, w = depth.shape
    finite = torch.isfinite(depth)
    d = torch.where(finite, depth, torch.ones_like(depth))
    radius_px = (focal * cfg.ao_radius / d).clamp(1.0, 0.25 * max(h, w))
    xs = torch.arange(w).expand(n, 1, h, w)
    ys = torch.arange(h)[:, None].expand(n, 1, h, w)
    occlusion = torch.zeros_like(depth)
    golden = math.pi * (3 - math.sqrt(5))
    flat = pos.reshape(n, 3, h * w)
    for k in range(cfg.ao_samples):
        r = radius_px * math.sqrt((k + 0.5) / cfg.ao_samples)
        a = k * golden
        px = (xs + torch.round(r * math.cos(a))).long().clamp(0, w - 1)
        py = (ys + torch.round(r * math.sin(a))).long().clamp(0, h - 1)
        idx = (py * w + px).reshape(n, 1, h * w).expand(n, 3, h * w)
        tap = flat.gather(2, idx).reshape(n, 3, h, w)
        v = tap - pos
        dist = _dot(v, v).sqrt().clamp_min(1e-4)
        rise = (_dot(v, normal) / dist - 0.15).clamp_min(0)
        near = (1 - dist / (2 * cfg.ao_radius)).clamp_min(0)
        occlusion = occlusion + torch.nan_to_num(rise * near)
    return torch.where(finite, 1 - occlusion / cfg.ao_samples, torch.ones_like(depth)).clamp(0, 1)


def half_resolution_ao(pos: Tensor, depth: Tensor, normal: Tensor, focal: float, cfg: PriorConfig) -> Tensor:
    """ambient_occlusion on every second pixel, spread back bilinearly: AO is low-frequency, and a
    quarter of the taps costs a quarter of the time."""
    h, w = depth.shape[-2:]
    if h < 4 or w < 4:
        return ambient_occlusion(pos, depth, normal, focal, cfg)
    half = ambient_occlusion(pos[..., ::2, ::2], depth[..., ::2, ::2], normal[..., ::2, ::2], focal / 2, cfg)
    full = F.interpolate(half, size=(h, w), mode="bilinear", align_corners=False)
    return torch.where(torch.isfinite(depth), full, torch.ones_like(full))


def _sky(dirs: Tensor, up: Tensor, zenith: Tensor, horizon: Tensor, ground: Tensor) -> Tensor:
    u = _dot(dirs, up)
    above = horizon + (zenith - horizon) * u.clamp_min(0).sqrt()
    below = horizon + (ground - horizon) * (-u).clamp(0, 1).sqrt()
    return torch.where(u >= 0, above, below)


def _pow5(x: Tensor) -> Tensor:
    x2 = x * x
    return x2 * x2 * x


def _ggx(n, v, l, albedo, metallic, roughness, radiance):
    """Cook-Torrance GGX + Lambert for one directional light: outgoing radiance (N, 3, H, W)."""
    h = _unit(l + v)
    n_l = _dot(n, l).clamp_min(0)
    n_v = _dot(n, v).clamp_min(1e-4)
    n_h = _dot(n, h).clamp_min(0)
    v_h = _dot(v, h).clamp_min(0)
    a2 = roughness.square().clamp_min(2e-3).square()
    d = a2 / (math.pi * (n_h * n_h * (a2 - 1) + 1).square())
    k = (roughness + 1).square() / 8
    g = n_v / (n_v * (1 - k) + k) * n_l / (n_l * (1 - k) + k)
    f0 = 0.04 * (1 - metallic) + albedo * metallic
    f = f0 + (1 - f0) * _pow5(1 - v_h)
    spec = d * g * f / (4 * n_v * n_l + 1e-4)
    diffuse = (1 - f) * (1 - metallic) * albedo / math.pi
    return (diffuse + spec) * radiance * n_l


def aces(x: Tensor) -> Tensor:
    return (x * (2.51 * x + 0.03) / (x * (2.43 * x + 0.59) + 0.14)).clamp(0, 1)


def to_srgb(x: Tensor) -> Tensor:
    return torch.where(x <= 0.0031308, x * 12.92, 1.055 * x.clamp_min(0.0031308) ** (1 / 2.4) - 0.055)


class ShadingPrior(torch.nn.Module):
    """G-buffers + light -> (..., PRIOR_CHANNELS, H, W): shaded sRGB, sun visibility, ambient occlusion."""

    def __init__(self, cfg: PriorConfig = PriorConfig()):
        super().__init__()
        self.config = cfg

    def forward(self, images: Tensor, light: Tensor, depth_near: float = 0.5, up: Tensor | None = None,
                sun_visibility: Tensor | None = None, ao: bool = True) -> Tensor:
        """images uint8 (..., 5, H, W, 3); light float (..., PACKED) (one per frame, or (PACKED,) for all);
        up (..., 3) camera-space up (default: estimated per frame); sun_visibility (..., H, W) replaces
        the screen-space shadows (the truth's, in tests and training targets)."""
        lead, (h, w) = images.shape[:-4], images.shape[-3:-1]
        color, shadow, occlusion, light = self.radiance(images, light, depth_near, up, sun_visibility, ao)
        shaded = to_srgb(aces(color * light[:, SLICES["exposure"]][:, :, None, None]))
        return torch.cat([shaded, shadow, occlusion], 1).reshape(*lead, PRIOR_CHANNELS, h, w)

    def radiance(self, images: Tensor, light: Tensor, depth_near: float = 0.5, up: Tensor | None = None,
                 sun_visibility: Tensor | None = None, ao: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """forward's light before exposure and tone mapping: linear RGB (N, 3, H, W), sun visibility and
        ambient occlusion (N, 1, H, W), and the light per frame (N, PACKED); N frames of the leading dims."""
        cfg = self.config
        lead, (h, w) = images.shape[:-4], images.shape[-3:-1]
        g = decode(images.reshape(-1, *images.shape[-4:]), depth_near)
        n_frames = g["depth"].shape[0]
        light = light.float().expand(*lead, light.shape[-1]).reshape(n_frames, -1)
        albedo, depth, metallic, n, roughness = g["albedo"], g["depth"], g["metallic"], g["normal"], g["roughness"]
        focal = 0.5 * h / math.tan(math.radians(cfg.fov_y) / 2)
        rays = view_rays(h, w, cfg.fov_y)[None]
        finite = torch.isfinite(depth)
        pos = rays * torch.where(finite, depth, torch.zeros_like(depth))
        view = _unit(rays)
        v = -view
        up = estimate_up(n, depth) if up is None else up.float().expand(*lead, 3).reshape(n_frames, 3)

        def col(name):
            return light[:, SLICES[name]][:, :, None, None]

        sun = direction(light[:, SLICES["sun_elevation"]][:, 0], light[:, SLICES["sun_azimuth"]][:, 0], up)
        if sun_visibility is not None:
            shadow = sun_visibility.float().reshape(n_frames, 1, h, w)
        elif cfg.shadows:
            shadow = epipolar_shadow(pos, depth, sun, focal, depth_near, cfg.thickness, cfg.shadow_stride)
        else:
            shadow = torch.ones_like(depth)
        occlusion = half_resolution_ao(pos, depth, n, focal, cfg) if ao else torch.ones_like(depth)
        up4, sun4 = up[:, :, None, None], sun[:, :, None, None]

        color = _ggx(n, v, sun4, albedo, metallic, roughness, col("sun_color") * shadow)
        fills = light[:, SLICES["fills"]].reshape(n_frames, MAX_FILLS, 5)
        for k in range(MAX_FILLS):
            if not fills[:, k, 2:5].any():  # an absent fill (no colour) adds nothing: skip its cost
                continue
            fill = direction(fills[:, k, 0], fills[:, k, 1], up)[:, :, None, None]
            color = color + _ggx(n, v, fill, albedo, metallic, roughness, fills[:, k, 2:5, None, None])

        zenith, horizon, ground, ambient = col("sky_zenith"), col("sky_horizon"), col("ground"), col("ambient")
        t = _dot(n, up4) * 0.5 + 0.5
        irradiance = (ground + ((zenith + horizon) * 0.5 - ground) * t) * ambient * occlusion
        n_v = _dot(n, v).clamp_min(0)
        f0 = 0.04 * (1 - metallic) + albedo * metallic
        f_amb = f0 + ((1 - roughness).clamp_min(0) - f0).clamp_min(0) * _pow5(1 - n_v)
        mirror = 2 * _dot(n, v) * n - v
        spec_amb = _sky(mirror, up4, zenith, horizon, ground) * ambient * f_amb * (1 - 0.7 * roughness)
        color = color + irradiance * albedo * (1 - metallic) * (1 - f_amb) + spec_amb

        fog_color, density = col("fog_color"), col("fog_density")
        fog = 1 - torch.exp(-density * torch.where(finite, depth, torch.zeros_like(depth)))
        color = color + (fog_color - color) * fog
        sky = _sky(view, up4, zenith, horizon, ground) + col("sun_color") * _dot(view, sun4).clamp_min(0) ** cfg.sun_disc
        sky = torch.where(density > 0, sky + (fog_color - sky) * 0.6, sky)
        return torch.where(finite, color, sky), shadow, occlusion, light
