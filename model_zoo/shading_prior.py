"""The shading prior: the five G-buffer passes lit by a `Light`, deterministic and differentiable.

G-buffers carry no light, and a small network trained on two cores does not learn to cast a
shadow from depth. So the light is computed, cheaply and in screen space, and the networks learn
what it gets wrong (indirect light, soft shadows, texture, style). Inputs are teacher-form
G-buffers (uint8 (..., 5, H, W, 3), streaming/gbuffer.py) and a packed light (model_zoo/light.py).

    positions   view space from the 8-bit inverse depth and a pinhole of vertical field of view
                `fov_y` (pixel (i, j) looks through ((j + .5 - W/2) / f, -(i + .5 - H/2) / f, -1))
    up          camera-space up: given (camera.json), else the mean of the upward-facing normals
    shadow      sun visibility, marched through the depth buffer along the exact screen lines that
                shadow rays follow (sun_visibility): every pixel near a caster, then windows of
                growing width; an occluder lies nearer the sun's axis than the pixel, by more than
                the 8-bit depth's rounding and less than `thickness`. Misses what is off the frame.
    ao          ambient occlusion: `ao_samples` depth-buffer taps on a spiral of radius `ao_radius`
                scene units around every `ao_stride`-th pixel, occlusion from the taps above its
                tangent plane, spread back bilinearly; an engine's sky pass (the share of the sky each
                surface sees, rooms' walls and casters off the frame included) replaces it when given,
                and dims the sky the metals mirror
    shading     as the physics world's ground truth (streaming/world/shading.py shade()): GGX
                (Smith-Schlick, Schlick Fresnel, F0 = mix(0.04, albedo, metallic)) + Lambert for the
                sun (times its visibility) and the fills; hemisphere sky/ground ambient (times AO) and
                the sky seen in the mirror direction; exponential depth fog; the sky and the sun's
                disc on background pixels; exposure, ACES (Narkowicz), sRGB

Given the truth's sun visibility and no AO it reproduces the physics world's truth from its
teacher-form G-buffers (tests/test_shading_prior.py), so what it misses on a path-traced scene is
what screen space and one bounce miss.

It runs beside the networks on every frame of a stream, so it is written for one CPU thread: frame
by frame (its planes stay in the cache), on flat (C, H*W) planes, dot products with a per-frame
vector as matrix-vector products, no `torch.where` on images (slow on CPU: blends and clamps
instead), and what depends only on the frame size (view rays, pixel grids) built once per size.
Inference computes each frame's planes in place (`out=`, `op_`) into buffers kept from frame to frame
(_Scratch, per frame size and thread, shared by the thread's priors; terms share buffers where their
lives do not overlap): fresh tensors cost more in page faults than in arithmetic, the allocator giving
freed memory back each frame. A pass that builds a graph (the light requiring grad) runs the same
operations on fresh tensors.
What no light changes (the surface's terms, the sky's weights) is computed once a frame.
Float32 throughout; its cost per frame on one thread is `alaya-flash bench`'s `shade` figure
(docs/lighting.md).
"""
from __future__ import annotations

import functools
import math
import threading
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
    ao_stride: int = 4  # ambient occlusion from every n-th pixel, spread back bilinearly (it is low-frequency)
    sun_disc: float = 2000.0  # exponent of the sun's disc on the sky (shade()'s)
    # screen-space reflections: a metal's mirror ray marched through the depth buffer shows the surface it meets
    # (else it shows the sky); off by default: a network reads the prior it was trained beside (the shipped
    # refiner's, gbuffer-refiner-16-mirror, has them; the light-reading encoder's has not)
    reflections: bool = False
    reflect_steps: int = 32  # samples along each mirror ray, spaced geometrically out to ~3.5 x the pixel's depth
    reflect_min: float = 0.1  # pixels whose metallic x (1 - roughness) is below this keep the sky (and cost nothing)
    # with a sky pass: where the surroundings hide the sky, they light the surface with what they reflect (_bounce)
    bounce: bool = True


class _Scratch:
    """Named buffers a frame's planes are computed into, kept from frame to frame (one set per frame size and
    thread): fresh tensors every frame cost more in page faults than in arithmetic, as the allocator hands
    the memory freed at the end of a frame back to the system. One that does not `keep` (a pass building a
    graph, whose saved tensors must outlive the frame) hands out fresh tensors, and None for `out`."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self._held: dict[str, Tensor] = {}
        self._views: dict[tuple, Tensor] = {}

    def __call__(self, name: str, *shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
        """A buffer of this shape, what it held before left in it."""
        if not self.keep:
            return torch.empty(shape, dtype=dtype)
        view = self._views.get((name, shape, dtype))
        if view is None:
            if len(self._views) > 512:  # sizes that vary by frame (the reflecting pixels) would pile up
                self._views.clear()
            need = math.prod(shape)
            held = self._held.get(name)
            with torch.inference_mode(False):  # a plain tensor: usable in and out of inference mode
                if held is None or held.numel() < need or held.dtype != dtype:  # grown by a quarter more: sizes vary
                    held = self._held[name] = torch.empty(max(need + need // 4 * (held is not None), 1), dtype=dtype)
                    self._views = {k: v for k, v in self._views.items() if k[0] != name}
                view = self._views[(name, shape, dtype)] = held[:need].view(shape)
        return view

    def out(self, name: str, *shape: int) -> Tensor | None:
        """A buffer for the `out=` of an op whose inputs may need gradients: None when building a graph."""
        return self(name, *shape) if self.keep else None


_FRESH = _Scratch(keep=False)
# Each thread's kept buffers by frame size, shared by every prior the thread runs (one frame is done before
# the next starts) and freed with the thread; module-level so a prior stays plain to copy.
_THREAD_SCRATCH = threading.local()


def _vecmat(v: Tensor, m: Tensor, out: Tensor | None = None) -> Tensor:
    """v (3,) @ m (3, P) -> (P,), into `out` if given (as a (1, P) view: the shape matmul writes)."""
    return torch.matmul(v, m, out=None if out is None else out[None])


def _dot(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """Per-pixel dot product of two (3, ...) planes (three multiply-adds: faster than a sum over channels)."""
    return torch.mul(a[0], b[0], out=out).addcmul_(a[1], b[1]).addcmul_(a[2], b[2])


def _srgb_to_linear(v: Tensor) -> Tensor:
    return torch.where(v <= 0.04045, v / 12.92, ((v + 0.055) / 1.055) ** 2.4)


_BYTES = torch.arange(256, dtype=torch.float32) / 255  # what an 8-bit code means, as the passes are written
_SRGB_TO_LINEAR = _srgb_to_linear(_BYTES)  # a table lookup: the same values as the formula, no pow


@functools.lru_cache(maxsize=8)
def _depth_table(depth_near: float) -> Tensor:
    """Depth by 8-bit inverse-depth code: depth_near / (code / 255), +inf for code 0 (background)."""
    return torch.where(_BYTES > 0, depth_near / _BYTES.clamp_min(1 / 255), torch.full_like(_BYTES, math.inf))


def decode(frame: Tensor, depth_near: float, scratch: _Scratch = _FRESH) -> dict[str, Tensor]:
    """One frame's teacher-form uint8 (5, H, W, 3) -> flat float planes (C, H*W): linear albedo (3),
    depth (+inf on background), metallic, unit normal (3), roughness."""
    _check(frame)
    p = frame.shape[1] * frame.shape[2]
    x = frame.reshape(5, p, 3)
    codes = scratch("codes", 4, p, dtype=torch.int32)  # albedo and inverse depth, channel-major, to look up
    codes[0:3] = x[0].t()
    codes[3] = x[1, :, 0]
    planes = scratch("planes", 5, p)  # metallic, normal (3), roughness
    planes[0], planes[1:4], planes[4] = x[2, :, 0], x[3].t(), x[4, :, 0]
    metallic, roughness = torch.div(planes[0::4], 255, out=scratch("metallic_roughness", 2, p))
    normal = planes[1:4].mul_(2).sub_(255)  # 255 (code / 255 * 2 - 1): odd integers, never all zero
    normal.mul_(_dot(normal, normal, out=scratch("normal_length", p)).rsqrt_())
    albedo = torch.index_select(_SRGB_TO_LINEAR, 0, codes[0:3].view(-1), out=scratch("rgb_b", 3 * p)).view(3, p)
    depth = torch.index_select(_depth_table(depth_near), 0, codes[3], out=scratch("depth", p))
    return {"albedo": albedo, "depth": depth, "metallic": metallic, "normal": normal, "roughness": roughness}


def view_rays(h: int, w: int, fov_y: float) -> Tensor:
    """(3, H, W) camera-space rays with z = -1 through each pixel's centre."""
    f = 0.5 * h / math.tan(math.radians(fov_y) / 2)
    j = (torch.arange(w, dtype=torch.float32) + 0.5 - w / 2) / f
    i = -(torch.arange(h, dtype=torch.float32) + 0.5 - h / 2) / f
    return torch.stack([j.expand(h, w), i[:, None].expand(h, w), torch.full((h, w), -1.0)])


class _Grid:
    """What depends only on the frame size and field of view, built once per size: the view rays and
    their unit directions (3, H*W), and the strided grids AO works on."""

    def __init__(self, h: int, w: int, fov_y: float):
        self.h, self.w = h, w
        self.focal = 0.5 * h / math.tan(math.radians(fov_y) / 2)
        rays = view_rays(h, w, fov_y)
        self.rays = rays.reshape(3, -1)
        self.ray_len2 = _dot(self.rays, self.rays)
        self.view = self.rays / self.ray_len2.sqrt()
        self.eye = -self.view  # toward the eye
        self._every: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def every(self, s: int) -> tuple[Tensor, Tensor, Tensor]:
        """The grid of every s-th pixel: its view rays (3, P_s) and its column and row numbers (P_s,), float."""
        if s not in self._every:
            rays = self.rays.view(3, self.h, self.w)[:, ::s, ::s]
            h, w = rays.shape[1:]
            self._every[s] = (rays.reshape(3, -1).clone(), torch.arange(w, dtype=torch.float32).repeat(h),
                              torch.arange(h, dtype=torch.float32).repeat_interleave(w))
        return self._every[s]


def estimate_up(normal: Tensor, finite: Tensor) -> Tensor:
    """Camera-space up (3,) from one frame's unit normals (3, P): the mean of those facing up-ish (y > 0.5)
    on geometry, the camera's own +y where fewer than 1% of the pixels do."""
    keep = ((normal[1] > 0.5) & finite).float()
    count = keep.sum()
    if count < 0.01 * normal.shape[-1]:
        return torch.tensor([0.0, 1.0, 0.0])
    up = normal @ keep
    return up / up.norm().clamp_min(1e-8)


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


def _block_min(g: Tensor, stride: int) -> Tensor:
    """The least value of each stride x stride block of an (H, W) plane (partial blocks at the edges)."""
    if stride == 1:
        return g
    h, w = g.shape
    if h % stride == 0 and w % stride == 0:  # the minimum of strided views: cheaper than pooling on CPU
        out = g[::stride, ::stride]
        for k in range(1, stride * stride):
            out = torch.minimum(out, g[k // stride::stride, k % stride::stride])
        return out
    return -F.max_pool2d(-g[None, None], stride, ceil_mode=True)[0, 0]


@torch.no_grad()
def sun_visibility(depth: Tensor, sun: Tensor, grid: _Grid, depth_near: float,
                   thickness: float = PriorConfig.thickness, stride: int = 1, geometry: Tensor | None = None,
                   scratch: _Scratch = _FRESH) -> Tensor:
    """One frame's sun visibility (H*W,) in [0, 1] ({0, 1} at stride 1): screen-space shadows marched
    along exact shadow lines. depth (H*W,), +inf on background; sun (3,) camera space, unit.

    Every shadow ray of a directional light runs along a screen line through the sun's vanishing
    point v (the projection of the sun's direction, or of its opposite when the sun is behind the
    camera). The depth buffer is resampled along those lines at one-pixel steps, so a march along
    them skips no pixel near the caster. On such a line, a point S shadows P iff S lies nearer the
    axis through the eye along the sun than P does (g(S) < g(P), g the distance from that axis:
    the view ray through S then meets P's shadow ray behind S), and not so much nearer that the ray
    passes behind S by more than `thickness` times S's distance (g(S) (1 + thickness) > g(P)).
    With `stride` s it marches s x s blocks, each as its least g (so an edge a pixel wide still
    casts, and a plane's blocks stay level with each other), and spreads the answer back bilinearly.
    geometry: (depth < inf).float(), if the caller has it."""
    full_h, full_w = grid.h, grid.w
    geometry = (depth < math.inf).float() if geometry is None else geometry
    # g = |pos x sun| = depth |ray x sun|; +inf on the background
    p = full_h * full_w
    along = _vecmat(sun, grid.rays, scratch("along", p))
    perp = torch.sub(grid.ray_len2, along.mul_(along), out=scratch("perp", p)).clamp_min_(1e-12).sqrt_()
    g_full = perp.mul_(depth).view(full_h, full_w)
    blocks = _block_min(g_full, stride)  # each block's least g: what it casts (and, below, what it receives as)
    h, w = blocks.shape
    depth_b = depth.view(full_h, full_w)[::stride, ::stride]
    # A receiver (block) with g = G is shadowed by an occluder with g in (G / (1 + thickness), G - tol), tol the
    # rounding of the 8-bit depth in g's units (it must not shadow its own surface): held as a centre and a
    # half-width, so a window tests |g - centre| < half. +inf depth (background) gives an empty interval.
    rel_tol = 0.3 * depth_b / (depth_near * 255) + 1e-3
    centre = blocks * ((1 + 1 / (1 + thickness) - rel_tol) * 0.5)
    half = blocks * ((1 - 1 / (1 + thickness) - rel_tol) * 0.5)
    # the three planes with a one-block border of +inf (off the frame: casts nothing, is never shadowed)
    table = F.pad(torch.stack([blocks, centre, half]), (1, 1, 1, 1), value=math.inf).reshape(3, -1)

    lx, ly, lz = sun.tolist()
    toward = lz < 0  # the sun ahead: shadow rays run toward v; behind the camera: away from it
    z = max(abs(lz), 1e-6)
    sx, sy = (lx, ly) if toward else (-lx, -ly)
    v = (grid.focal * sx / z + full_w / 2, -grid.focal * sy / z + full_h / 2)
    v = ((v[0] - 0.5) / stride + 0.5, (v[1] - 0.5) / stride + 0.5)  # in the strided grid's pixels
    phi0, span, r0, r_span = _polar_frame(v, h, w)
    lines = int(min(max(math.ceil(span * (r0 + r_span)), 16), 2 * (h + w)))
    steps = int(math.ceil(r_span)) + 2
    d_phi, d_r = span / lines, (r_span + 1) / steps
    phi = phi0 + (torch.arange(lines, dtype=torch.float32) + 0.5) * d_phi
    k = torch.arange(steps, dtype=torch.float32)
    # the march runs toward smaller indices: toward v when the sun is ahead, away from it when behind
    r = r0 + (k if toward else steps - 1 - k) * d_r
    px = torch.mul(r[None, :], phi.cos()[:, None], out=scratch("line_x", lines, steps)).add_(v[0]).floor_().clamp_(-1, w)
    py = torch.mul(r[None, :], phi.sin()[:, None], out=scratch("line_y", lines, steps)).add_(v[1]).floor_().clamp_(-1, h)
    idx = scratch("line_index", lines * steps, dtype=torch.long).copy_(py.add_(1).mul_(w + 2).add_(px.add_(1)).view(-1))
    occluder, centre_l, half_l = torch.index_select(table, 1, idx, out=scratch("lines", 3, lines * steps)).view(3, lines, steps)

    # the least |g - centre| over the windows before each receiver (window minima built by doubling)
    nearest = {1: occluder}
    closest = scratch("closest", lines, steps).fill_(math.inf)
    gaps = scratch("gaps", lines, steps)
    for shift, width in march_windows(int(math.hypot(h, w)) + 2):
        if shift >= steps:
            break
        while width not in nearest:
            last = max(nearest)
            nearest[2 * last] = torch.minimum(nearest[last][:, :-last], nearest[last][:, last:],
                                              out=scratch(f"nearest{2 * last}", lines, steps - 2 * last + 1))
        n = steps - shift
        gap = torch.sub(nearest[width][:, :n], centre_l[:, shift:], out=gaps[:, :n]).abs_()
        torch.minimum(closest[:, shift:], gap, out=closest[:, shift:])
    shadowed = (closest < half_l).float().view(-1)  # NaN (an off-frame receiver) compares False

    # each block's place on the lines
    dx = torch.arange(w, dtype=torch.float32) + 0.5 - v[0]
    dy = (torch.arange(h, dtype=torch.float32) + 0.5 - v[1])[:, None]
    a = ((torch.atan2(dy, dx) - phi0).remainder_(2 * math.pi).div_(d_phi)).long().clamp_(0, lines - 1)
    b = ((torch.sqrt(dx * dx + dy * dy) - r0).div_(d_r)).round_().long().clamp_(0, steps - 1)
    if not toward:
        b = steps - 1 - b
    receives = geometry.view(full_h, full_w)[::stride, ::stride]  # the background is never shadowed
    lit = 1 - shadowed.index_select(0, (a * steps + b).view(-1)).view(h, w) * receives
    if stride > 1:
        lit = F.interpolate(lit[None, None], size=(full_h, full_w), mode="bilinear", align_corners=False)[0, 0]
    return torch.lerp(torch.ones(()), lit.reshape(-1), geometry, out=scratch("shadow", p))  # 1 on the background


@functools.lru_cache(maxsize=4)
def _reflect_reach(steps: int) -> Tensor:
    """Where a mirror ray is sampled, as multiples of its pixel's depth: geometric from 0.02 to ~3.5."""
    return 0.02 * (3.5 / 0.02) ** (torch.arange(steps, dtype=torch.float32) / max(steps - 1, 1))


@torch.no_grad()
def screen_reflections(depth: Tensor, normal: Tensor, chosen: Tensor, grid: _Grid, depth_near: float,
                       thickness: float = PriorConfig.thickness, steps: int = PriorConfig.reflect_steps,
                       scratch: _Scratch = _FRESH) -> tuple[Tensor, Tensor]:
    """For the pixels `chosen` (K,) (indices into one frame's H*W): those whose mirror ray meets a surface in the
    depth buffer (indices, a subset of `chosen`), and the pixel each of them meets first.

    The ray leaves the pixel's point along the view direction mirrored about its normal and is sampled at
    `steps` distances (_reflect_reach); a sample meets a surface when it lies behind the surface its own
    pixel shows (another pixel than the ray's start), by more than the 8-bit depth's rounding and either
    less than `thickness` of that surface's distance or with the step to it starting in front. What the
    frame does not show (behind the camera, off the frame, the background) is met by no ray: those pixels
    keep the sky."""
    h, w = grid.h, grid.w
    k = len(chosen)
    d = depth.index_select(0, chosen)
    pos = grid.rays.index_select(1, chosen).mul_(d)  # view space
    n = normal.index_select(1, chosen)
    eye = grid.eye.index_select(1, chosen)
    mirror = n.mul_(_dot(n, eye).mul_(2)).sub_(eye)  # (3, K), unit
    reach = torch.mul(d[:, None], _reflect_reach(steps)[None], out=scratch("reach", k, steps))
    q = torch.mul(mirror[:, :, None], reach[None], out=scratch("reflect_q", 3, k, steps)).add_(pos[:, :, None])
    z = torch.neg(q[2], out=scratch("reflect_z", k, steps)).clamp_min_(1e-6)  # distance in front of the camera
    inside = torch.lt(q[2], -1e-3, out=scratch("inside", k, steps, dtype=torch.bool))  # behind it is dropped
    test = scratch("test", k, steps, dtype=torch.bool)
    px = q[0].div_(z).mul_(grid.focal).add_(w / 2)
    py = q[1].div_(z).mul_(-grid.focal).add_(h / 2)
    inside.logical_and_(torch.ge(px, 0, out=test)).logical_and_(torch.lt(px, w, out=test))
    inside.logical_and_(torch.ge(py, 0, out=test)).logical_and_(torch.lt(py, h, out=test))
    # the pixel each sample falls in, in float (exact: whole numbers below 2^24), then one conversion
    pixel = py.clamp_(0, h - 1).trunc_().mul_(w).add_(px.clamp_(0, w - 1).trunc_())
    pixel = scratch("reflect_pixel", k, steps, dtype=torch.long).copy_(pixel)
    shown = torch.index_select(depth, 0, pixel.view(-1), out=scratch("shown", k * steps)).view(k, steps)  # +inf: never met
    # behind by more than the 8-bit inverse depth's rounding (half a code: 0.5 d / (255 depth_near) of d), and
    # by less than `thickness`, or the step just taken started in front of it (it stepped through the surface)
    near = torch.mul(shown, 0.6, out=scratch("reflect_near", k, steps)).div_(depth_near * 255).add_(1e-3).add_(1).mul_(shown)
    meets = inside.logical_and_(torch.ne(pixel, chosen[:, None], out=test))  # not its own pixel (a grazing ray meets it)
    meets.logical_and_(torch.gt(z, near, out=test))
    thin = torch.lt(z, torch.mul(shown, 1 + thickness, out=near), out=scratch("thin", k, steps, dtype=torch.bool))
    torch.lt(d, shown[:, 0], out=test[:, 0])  # the step before each sample started in front: from the pixel,
    torch.lt(z[:, :-1], shown[:, 1:], out=test[:, 1:])  # then from the sample before
    meets.logical_and_(thin.logical_or_(test))
    hits = meets.any(1).nonzero()[:, 0]
    first = meets.index_select(0, hits).float().argmax(1)  # the first sample that meets a surface
    return chosen.index_select(0, hits), pixel.index_select(0, hits).gather(1, first[:, None])[:, 0]


@functools.lru_cache(maxsize=4)
def _spiral(samples: int) -> tuple[Tensor, Tensor, Tensor]:
    """The AO taps' radii (as fractions of the radius) and directions, (samples, 1) each: a golden-angle spiral."""
    golden = math.pi * (3 - math.sqrt(5))
    taps = range(samples)
    return tuple(torch.tensor([f(k) for k in taps])[:, None] for f in (
        lambda k: math.sqrt((k + 0.5) / samples), lambda k: math.cos(k * golden), lambda k: math.sin(k * golden)))


@torch.no_grad()
def ambient_occlusion(depth: Tensor, normal: Tensor, grid: _Grid, cfg: PriorConfig, geometry: Tensor | None = None,
                      scratch: _Scratch = _FRESH) -> Tensor:
    """One frame's ambient occlusion (H*W,) in [0, 1], 1 = open: `ao_samples` taps on a spiral around each
    pixel (of the `ao_stride` grid, spread back bilinearly), occluded by points above its tangent plane."""
    full_h, full_w, s = grid.h, grid.w, cfg.ao_stride
    if full_h < 2 * s or full_w < 2 * s:
        s = 1
    geometry = (depth < math.inf).float() if geometry is None else geometry
    d = depth.view(full_h, full_w)[::s, ::s]
    h, w = d.shape
    on = geometry.view(full_h, full_w)[::s, ::s]
    rays, xs, ys = grid.every(s)
    pos = rays * torch.nan_to_num(d, posinf=0.0).reshape(-1)  # the origin on the background
    n = normal.view(3, full_h, full_w)[:, ::s, ::s].reshape(3, -1)
    focal = grid.focal / s
    radius_px = (focal * cfg.ao_radius / torch.nan_to_num(d, posinf=1.0)).clamp_(1.0, 0.25 * max(h, w)).view(1, -1)
    reach, cos, sin = _spiral(cfg.ao_samples)
    ox = (radius_px * reach).mul_(cos).round_()
    oy = (radius_px * reach).mul_(sin).round_()
    px = ox.add_(xs).clamp_(0, w - 1)
    py = oy.add_(ys).clamp_(0, h - 1)
    taps = torch.index_select(pos, 1, py.mul_(w).add_(px).long().view(-1),
                              out=scratch("ao_taps", 3, cfg.ao_samples * h * w)).view(3, cfg.ao_samples, -1)
    v = taps.sub_(pos[:, None])
    dist = _dot(v, v).sqrt_().clamp_min_(1e-4)
    rise = _dot(v, n[:, None]).div_(dist).sub_(0.15).clamp_min_(0)
    near = dist.mul_(-1 / (2 * cfg.ao_radius)).add_(1).clamp_min_(0)
    occlusion = rise.mul_(near).sum(0)
    open_ = torch.lerp(torch.ones(()), (1 - occlusion / cfg.ao_samples).clamp_(0, 1).view(h, w), on)
    if s > 1:
        open_ = F.interpolate(open_[None, None], size=(full_h, full_w), mode="bilinear", align_corners=False)[0, 0]
    return torch.lerp(torch.ones(()), open_.reshape(-1), geometry, out=scratch("occlusion", full_h * full_w))  # 1 on the background


def _bounce(outgoing: Tensor, sky: Tensor, s: "_Surface", geometry: Tensor, scratch: _Scratch) -> Tensor:
    """The light that the surroundings hiding a pixel's sky bounce onto it: (1 - sky) x their radiance, taken as
    the frame's mean surface radiance L, itself lit the same way: L = D / (1 - albedo (1 - sky)) with D, albedo
    and sky the frame's surface means (D: what they send so far). Diffuse only, (3, P)."""
    count = geometry.sum().clamp_min(1.0)
    direct = outgoing @ geometry / count
    albedo = s.base @ geometry / count
    hidden = 1 - sky @ geometry / count
    radiance = direct / (1 - albedo * hidden).clamp_min(0.05)
    around = torch.mul(radiance[:, None], torch.neg(sky).add_(1), out=scratch.out("bounce", 3, sky.shape[0]))
    return around.mul_(s.base).mul_(s.f_amb_1)


def _pow5(x: Tensor, out: Tensor | None = None) -> Tensor:
    """x^5 as (x x)(x x) x (`out` may not be x)."""
    x2 = torch.mul(x, x, out=out)
    return torch.mul(x2, x2, out=out).mul_(x)


class _Surface:
    """One frame's per-pixel terms that no light changes (flat (C, P) planes): those of the GGX and Lambert
    terms, the ambient Fresnel, and the sky's weights in the mirror direction (_sky's, about `up`)."""

    def __init__(self, g: dict[str, Tensor], grid: _Grid, up: Tensor, scratch: _Scratch):
        p = grid.h * grid.w
        self.n, self.eye = g["normal"], grid.eye
        albedo, metallic, roughness = g["albedo"], g["metallic"], g["roughness"]
        self.n_v_raw = _dot(self.n, self.eye, out=scratch("n_v_raw", p))
        self.n_v = torch.clamp_min(self.n_v_raw, 1e-4, out=scratch("n_v", p))
        self.n_v4 = torch.mul(self.n_v, 4, out=scratch("n_v4", p))
        self.a2 = torch.square(roughness, out=scratch("a2", p)).clamp_min_(2e-3).square_()
        self.a2_1 = torch.sub(self.a2, 1, out=scratch("a2_1", p))
        self.k = torch.add(roughness, 1, out=scratch("k", p)).square_().div_(8)
        self.k_1 = torch.neg(self.k, out=scratch("k_1", p)).add_(1)  # 1 - k
        self.g_v = torch.div(self.n_v, torch.mul(self.n_v, self.k_1, out=scratch("g_v", p)).add_(self.k),
                             out=scratch("g_v", p))
        dielectric = torch.neg(metallic, out=scratch("dielectric", p)).add_(1)  # 1 - metallic
        self.f0 = torch.addcmul(torch.mul(dielectric, 0.04, out=scratch("f0_dielectric", p)), albedo, metallic, out=scratch("f0", 3, p))
        self.base = torch.mul(albedo, dielectric, out=scratch("base", 3, p))  # what the diffuse terms scatter
        self.lambert = torch.div(self.base, math.pi, out=scratch("lambert", 3, p))
        # the ambient Fresnel: F0 + (max(1 - roughness, F0) - F0) (1 - n.v)^5
        self.smooth = smooth = torch.neg(roughness, out=scratch("smooth", p)).add_(1).clamp_min_(0)  # roughness <= 1
        grazing = _pow5(torch.clamp_min(self.n_v_raw, 0, out=scratch("grazing", p)).neg_().add_(1), out=scratch("grazing5", p))
        self.f_amb = torch.sub(smooth, self.f0, out=scratch("f_amb", 3, p)).clamp_min_(0).mul_(grazing).add_(self.f0)
        self.f_amb_1 = torch.neg(self.f_amb, out=scratch("f_amb_1", 3, p)).add_(1)  # 1 - f_amb
        self.glossy = torch.mul(roughness, -0.7, out=scratch("glossy", p)).add_(1)  # 1 - 0.7 roughness
        # the hemisphere's blend by how far the normal turns up, and the sky in the mirror direction
        # m = 2 (n.v) n - v by its cosine with up
        self.n_up = _vecmat(up, self.n, scratch("n_up", p))
        self.up_t = torch.mul(self.n_up, 0.5, out=scratch("up_t", p)).add_(0.5)
        mirror_up = torch.mul(self.n_v_raw, 2, out=scratch("mirror_up", p)).mul_(self.n_up).sub_(up @ self.eye)
        self.mirror_sky = _sky_weights(mirror_up, scratch("mirror_sky", 2, p))


def _sky_weights(u: Tensor, out: Tensor) -> Tensor:
    """_sky's weights (2, P) of the zenith and the ground in directions whose cosine with up is u (P,):
    one of the two square roots is 0."""
    torch.clamp_min(u, 0, out=out[0]).sqrt_()
    torch.neg(u, out=out[1]).clamp_(0, 1).sqrt_()
    return out


def _sky(weights: Tensor, zenith: Tensor, horizon: Tensor, ground: Tensor, out: Tensor | None = None) -> Tensor:
    """The sky (3, P) from _sky_weights (2, P) (or 3, the third the sun disc's, its colour appended)."""
    colours = [zenith - horizon, ground - horizon]
    return torch.addmm(horizon[:, None], torch.stack(colours, 1), weights, out=out)


def _ggx(s: _Surface, l: Tensor, radiance: Tensor, visibility: Tensor | None, scratch: _Scratch, out: str) -> Tensor:
    """Cook-Torrance GGX + Lambert for one directional light l (3,) of radiance (3,): outgoing radiance (3, P),
    into scratch's `out`. The half vector enters only through n.h and v.h, from n.l, n.v and v.l
    (|l + v|^2 = 2 + 2 v.l). A plane's buffer takes the next term computed from it where nothing reads it
    again (the terms share a few buffers, so they stay in the cache)."""
    p = s.n.shape[1]
    n_l_raw = _vecmat(l, s.n, scratch.out("ggx_n_l", p))
    v_l = _vecmat(l, s.eye, scratch.out("ggx_v", p))
    length = torch.mul(v_l, 2, out=scratch.out("ggx_length", p)).add_(2).clamp_min_(0).sqrt_()
    length = torch.clamp_min(length, 1e-8, out=scratch.out("ggx_length", p))
    n_h = torch.add(n_l_raw, s.n_v_raw, out=scratch.out("ggx_d", p)).div_(length).clamp_min_(0)
    v_h = torch.add(v_l, 1, out=scratch.out("ggx_v", p)).div_(length).clamp_min_(0)
    n_l = torch.clamp_min(n_l_raw, 0, out=scratch.out("ggx_n_l", p))
    d = torch.mul(n_h, n_h, out=scratch.out("ggx_d", p)).mul_(s.a2_1).add_(1).square_().mul_(math.pi)
    d = torch.div(s.a2, d, out=scratch.out("ggx_d", p))
    g = torch.mul(s.g_v, n_l, out=scratch.out("ggx_g", p))
    g = g.div_(torch.mul(n_l, s.k_1, out=scratch.out("ggx_length", p)).add_(s.k))
    spec = d.mul_(g).div_(torch.mul(s.n_v4, n_l, out=scratch.out("ggx_g", p)).add_(1e-4))
    fresnel = _pow5(torch.neg(v_h, out=scratch.out("ggx_v", p)).add_(1), out=scratch.out("ggx_length", p))
    # F0 + (1 - F0) (1 - v.h)^5
    f = torch.addcmul(fresnel, s.f0, torch.neg(fresnel, out=scratch.out("ggx_v", p)).add_(1), out=scratch.out(out, 3, p))
    weight = n_l if visibility is None else torch.mul(n_l, visibility, out=scratch.out("ggx_n_l", p))
    # Lambert (1 - F) + specular F = lambert + F (spec - lambert)
    spread = torch.sub(spec, s.lambert, out=scratch.out("rgb_a", 3, p))
    f = torch.addcmul(s.lambert, f, spread, out=scratch.out(out, 3, p))
    return f.mul_(torch.mul(radiance[:, None], weight, out=scratch.out("rgb_a", 3, p)))


def aces(x: Tensor, scratch: _Scratch = _FRESH) -> Tensor:
    """Narkowicz's fit, x (2.51 x + 0.03) / (x (2.43 x + 0.59) + 0.14), as multiply-adds (into scratch's rgb_b)."""
    num = torch.mul(x, 0.03, out=scratch.out("rgb_b", *x.shape)).addcmul_(x, x, value=2.51)
    den = torch.mul(x, 0.59, out=scratch.out("rgb_c", *x.shape)).add_(0.14).addcmul_(x, x, value=2.43)
    return num.div_(den).clamp_(0, 1)


def to_srgb(x: Tensor, scratch: _Scratch = _FRESH, out: Tensor | None = None) -> Tensor:
    """Linear [0, 1] -> sRGB. The lesser of the two segments is the piecewise curve (they meet at 0.0031308,
    the power one 8e-6 below the line there), and costs no select. The power as exp2(log2(x) / 2.4): a
    third of the cost of pow on one thread, within 6e-8 of it (tests/test_shading_prior.py). Uses scratch's
    rgb_a and rgb_c."""
    curve = torch.clamp_min(x, 0.0031308, out=scratch.out("rgb_a", *x.shape)).log2_().mul_(1 / 2.4)
    curve = torch.exp2(curve, out=scratch.out("rgb_a", *x.shape))  # (a graph keeps exp2's result)
    curve = torch.mul(curve, 1.055, out=scratch.out("rgb_a", *x.shape)).sub_(0.055)
    return torch.minimum(torch.mul(x, 12.92, out=scratch.out("rgb_c", *x.shape)), curve, out=out)


def _check(images: Tensor) -> None:
    if images.dtype != torch.uint8 or images.ndim < 4 or images.shape[-4] != 5 or images.shape[-1] != 3:
        raise AlayaError(f"shading prior: expected uint8 G-buffers (..., 5, H, W, 3), got {images.dtype} {tuple(images.shape)}")


class ShadingPrior(torch.nn.Module):
    """G-buffers + light -> (..., PRIOR_CHANNELS, H, W): shaded sRGB, sun visibility, ambient occlusion."""

    def __init__(self, cfg: PriorConfig = PriorConfig()):
        super().__init__()
        self.config = cfg
        self._grids: dict[tuple[int, int], _Grid] = {}

    def forward(self, images: Tensor, light: Tensor, depth_near: float = 0.5, up: Tensor | None = None,
                sun_visibility: Tensor | None = None, ao: bool = True, sky_visibility: Tensor | None = None) -> Tensor:
        """images uint8 (..., 5, H, W, 3); light float (..., PACKED) (one per frame, or (PACKED,) for all);
        up (..., 3) camera-space up (default: estimated per frame); sun_visibility (..., H, W) replaces
        the screen-space shadows (an engine's shadow pass; the truth's in tests); sky_visibility (..., H, W)
        replaces the ambient occlusion and dims the sky the metals mirror (an engine's sky pass)."""
        _check(images)
        lead, (h, w) = images.shape[:-4], images.shape[-3:-1]
        out = torch.empty(math.prod(lead), PRIOR_CHANNELS, h * w)
        for k, (color, shadow, occlusion, light_k, scratch) in enumerate(
                self._frames(images, light, depth_near, up, sun_visibility, ao, sky_visibility)):
            exposed = torch.mul(color, light_k[SLICES["exposure"]], out=scratch.out("rgb_a", 3, h * w))
            srgb = to_srgb(aces(exposed, scratch), scratch, out=out[k, :3] if scratch.keep else None)
            if not scratch.keep:
                out[k, :3] = srgb
            out[k, 3], out[k, 4] = shadow, occlusion
        return out.view(*lead, PRIOR_CHANNELS, h, w)

    def radiance(self, images: Tensor, light: Tensor, depth_near: float = 0.5, up: Tensor | None = None,
                 sun_visibility: Tensor | None = None, ao: bool = True,
                 sky_visibility: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """forward's light before exposure and tone mapping: linear RGB (N, 3, H, W), sun visibility and
        ambient occlusion (N, 1, H, W), and the light per frame (N, PACKED); N frames of the leading dims."""
        _check(images)
        h, w = images.shape[-3:-1]
        # each frame's planes are the scratch's until the next frame: stacked as they come
        frames = [(c.clone(), s.clone(), o.clone(), lk)
                  for c, s, o, lk, _ in self._frames(images, light, depth_near, up, sun_visibility, ao, sky_visibility)]
        if not frames:
            return (torch.empty(0, 3, h, w), torch.empty(0, 1, h, w), torch.empty(0, 1, h, w),
                    torch.empty(0, light.shape[-1]))
        color, shadow, occlusion, light = (torch.stack(p) for p in zip(*frames))
        n = len(light)
        return color.view(n, 3, h, w), shadow.view(n, 1, h, w), occlusion.view(n, 1, h, w), light

    def _frames(self, images, light, depth_near, up, sun_visibility, ao, sky_visibility=None):
        """Per frame: linear RGB (3, P), sun visibility (P,), ambient occlusion (P,), its light (PACKED,), and the
        scratch they lie in (valid until the next frame)."""
        lead, (h, w) = images.shape[:-4], images.shape[-3:-1]
        images = images.reshape(-1, *images.shape[-4:])
        n = images.shape[0]
        light = light.float().expand(*lead, light.shape[-1]).reshape(n, light.shape[-1])
        ups = None if up is None else up.float().expand(*lead, 3).reshape(n, 3)
        visibility = None if sun_visibility is None else sun_visibility.float().reshape(n, h * w)
        skies = None if sky_visibility is None else sky_visibility.float().reshape(n, h * w)
        grid = self._grids.get((h, w))
        if grid is None:
            grid = self._grids[(h, w)] = _Grid(h, w, self.config.fov_y)
        if torch.is_grad_enabled() and light.requires_grad:
            scratch = _FRESH  # the graph keeps what it saved: fresh tensors
        else:
            by_size = _THREAD_SCRATCH.__dict__.setdefault("by_size", {})
            scratch = by_size.get((h, w))
            if scratch is None:
                scratch = by_size[(h, w)] = _Scratch()
        for k in range(n):
            vis = None if visibility is None else visibility[k]
            sky = None if skies is None else skies[k]
            yield self._frame(images[k], light[k], depth_near, None if ups is None else ups[k], vis, ao, grid,
                              scratch, sky) + (light[k], scratch)

    def _frame(self, images: Tensor, light: Tensor, depth_near: float, up: Tensor | None, visibility: Tensor | None,
               ao: bool, grid: _Grid, scratch: _Scratch, sky: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        cfg = self.config
        p = grid.h * grid.w
        g = decode(images, depth_near, scratch)
        depth, n = g["depth"], g["normal"]
        finite = torch.lt(depth, math.inf, out=scratch("finite", p, dtype=torch.bool))
        geometry = scratch("geometry", p).copy_(finite)
        up = estimate_up(n, finite) if up is None else up

        def col(name):
            return light[SLICES[name]]

        sun = direction(col("sun_elevation")[0], col("sun_azimuth")[0], up)
        if visibility is not None:
            shadow = visibility
        elif cfg.shadows:
            shadow = sun_visibility(depth, sun.detach(), grid, depth_near, cfg.thickness, cfg.shadow_stride, geometry,
                                    scratch)
        else:
            shadow = scratch("shadow", p).fill_(1)
        if sky is not None:
            occlusion = sky
        elif ao and cfg.ao_samples:
            occlusion = ambient_occlusion(depth, n, grid, cfg, geometry, scratch)
        else:
            occlusion = scratch("occlusion", p).fill_(1)

        s = _Surface(g, grid, up, scratch)
        color = _ggx(s, sun, col("sun_color"), shadow, scratch, "color")
        fills = light[SLICES["fills"]].reshape(MAX_FILLS, 5)
        for k in range(MAX_FILLS):
            if not fills[k, 2:5].any():  # an absent fill (no colour) adds nothing: skip its cost
                continue
            color = color.add_(_ggx(s, direction(fills[k, 0], fills[k, 1], up), fills[k, 2:5], None, scratch, "fill"))

        zenith, horizon, ground, ambient = col("sky_zenith"), col("sky_horizon"), col("ground"), col("ambient")
        # hemisphere light: ground below, the sky's mean above, by how far the normal turns up; times AO
        irradiance = torch.addmm(ground[:, None], ((zenith + horizon) * 0.5 - ground)[:, None], s.up_t[None],
                                 out=scratch.out("rgb_a", 3, p))
        irradiance = irradiance.mul_(torch.mul(occlusion, ambient, out=scratch.out("ambient", p)))
        # the sky in the mirror direction
        spec_amb = _sky(s.mirror_sky, zenith, horizon, ground, out=scratch.out("spec_amb", 3, p)).mul_(s.f_amb)
        spec_amb = spec_amb.mul_(torch.mul(s.glossy, ambient, out=scratch.out("glossy_ambient", p)))
        if sky is not None:  # the sky a surface cannot see, its mirror does not show either (specular occlusion)
            spec_amb = spec_amb.mul_(sky)
        diffuse = color.add_(irradiance.mul_(s.base).mul_(s.f_amb_1))
        if sky is not None and cfg.bounce:
            diffuse = diffuse.add_(_bounce(diffuse, sky, s, geometry, scratch))
        if cfg.reflections:  # where the mirror ray meets a surface in the frame, that surface's light, not the sky's
            chosen = (torch.mul(g["metallic"], s.smooth, out=scratch("reflects", p)).mul_(geometry)
                      >= cfg.reflect_min).nonzero()[:, 0]
            if len(chosen):
                hit, met = screen_reflections(depth, n, chosen, grid, depth_near, cfg.thickness, cfg.reflect_steps, scratch)
                if len(hit):  # those pixels show what they meet (the old lerp by a weight of 1: exactly that)
                    seen = diffuse.index_select(1, met).mul_(s.f_amb.index_select(1, hit).mul_(s.glossy.index_select(0, hit)))
                    spec_amb = spec_amb.index_copy_(1, hit, seen)
        color = diffuse.add_(spec_amb)

        fog_color, density = col("fog_color"), col("fog_density")
        foggy = bool(density > 0)
        if foggy or light.requires_grad:  # no fog leaves the colour as it is (its gradient in the density stays)
            depth0 = torch.nan_to_num(depth, posinf=0.0, out=scratch("depth0", p))
            fog = torch.exp(torch.mul(depth0, -density, out=scratch.out("fog_exp", p)), out=scratch.out("fog_exp", p))
            fog = torch.neg(fog, out=scratch.out("fog", p)).add_(1)
            color = color.add_(torch.sub(fog_color[:, None], color, out=scratch.out("fogged", 3, p)).mul_(fog))
        background = scratch("background", grid.h, dtype=torch.bool)
        rows = torch.all(finite.view(grid.h, grid.w), 1, out=background).logical_not_().nonzero()  # the sky shows there
        if len(rows):
            band = slice(int(rows[0]) * grid.w, (int(rows[-1]) + 1) * grid.w)
            view = grid.view[:, band]
            toward_sun = sun @ view
            # the sun's disc where it is above 1e-12 of the sun (within 9.5 degrees of it at the default exponent):
            # 0 elsewhere, which also keeps denormal floats (slow on CPU) out of the sky
            edge = math.exp(math.log(1e-12) / cfg.sun_disc)
            shows = bool(toward_sun.max() > edge)
            weights = _sky_weights(up @ view, scratch("band_sky", 2 + shows, band.stop - band.start))
            colours = torch.stack([zenith - horizon, ground - horizon] + [col("sun_color")] * shows, 1)
            if shows:
                weights[2] = F.threshold(toward_sun, edge, 0.0) ** cfg.sun_disc
            sky = torch.addmm(horizon[:, None], colours, weights, out=scratch.out("band", 3, band.stop - band.start))
            if foggy:
                sky = sky.add_(torch.sub(fog_color[:, None], sky, out=scratch.out("band_fog", *sky.shape)).mul_(0.6))
            # exactly one or the other (a weight of 0 or 1)
            if scratch.keep:
                torch.lerp(sky, color[:, band], geometry[band], out=color[:, band])
            else:
                color = torch.cat([color[:, :band.start], torch.lerp(sky, color[:, band], geometry[band]),
                                   color[:, band.stop:]], 1)
        return color, shadow, occlusion
