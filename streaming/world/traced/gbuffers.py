"""Exact G-buffers of a world v2 scene: a float64 numpy ray caster over the scene description.

One ray per pixel through the pixel centre (camera.py's convention), intersected analytically
with every shape of the `SceneDesc`: boxes (slabs in the box's frame), spheres, capped cylinders.
These are the shapes render.py hands to Mitsuba (boxes as exact triangle meshes, spheres and
cylinders as Mitsuba's analytic shapes, caps as disks), so both see the same surfaces; the tests
hold this caster to Mitsuba's own `aov` pass (ray distance, shading normal, albedo, shape).
Mitsuba's aov integrator is not used here because in its CPU scalar variant it is ~70x slower
than a path-traced sample per pixel on these scenes.

Per primitive, only the pixels inside the screen rectangle of its bounding box are tested (the
whole image when the box straddles the camera plane), which keeps a street of ~500 shapes at a
fraction of a second per 256x256 frame on one core.

Albedo of textured materials is the bitmap read the way Mitsuba's `bitmap` texture reads it
(bilinear, repeat wrap, texel centres at (i + 0.5) / size) at the uv render.py gives the mesh:
world (x, y) on horizontal faces, (position along the face, z) on vertical ones, over `tile`.
"""
from __future__ import annotations

import math

import numpy as np

from ....model_zoo.errors import AlayaError
from ...gbuffer import GBufferFrame
from ..camera import Camera
from .scene import Box, Cylinder, SceneDesc, Sphere
from .textures import make_texture

EPS = 1e-6  # smallest accepted ray parameter (t is in units of the camera-space z = -1 direction)


def bake_textures(desc: SceneDesc) -> dict[int, np.ndarray]:
    """Material index -> its texture bitmap (float32 linear RGB), for every textured material."""
    return {k: make_texture(m.texture, m.albedo, m.albedo2, m.texture_seed)
            for k, m in enumerate(desc.materials) if m.texture}


def check_scene(desc: SceneDesc) -> SceneDesc:
    """Refuse what the two renderers would not agree on: a texture on a sphere or cylinder (their
    uv parametrisations differ) and degenerate sizes."""
    for k, s in enumerate(desc.shapes):
        m = desc.materials[s.material]
        if not isinstance(s, Box) and m.texture:
            raise AlayaError(f"world v2 scene {desc.kind} seed {desc.seed}: shape {k} ({type(s).__name__}) has the "
                             f"textured material {m.name!r}; only boxes take textures")
        size = s.size if isinstance(s, Box) else (s.radius,)
        if min(size) <= 0:
            raise AlayaError(f"world v2 scene {desc.kind} seed {desc.seed}: shape {k} has a size <= 0: {size}")
    return desc


def sample_texture(bitmap: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Bilinear, repeat-wrapped lookup of (H, W, 3) at uv in texture units -> (..., 3) float64."""
    h, w = bitmap.shape[:2]
    x, y = u * w - 0.5, v * h - 0.5
    x0, y0 = np.floor(x), np.floor(y)
    fx, fy = (x - x0)[..., None], (y - y0)[..., None]
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    x1, y1 = (x0 + 1) % w, (y0 + 1) % h
    x0, y0 = x0 % w, y0 % h
    b = bitmap.astype(np.float64)
    top = b[y0, x0] * (1 - fx) + b[y0, x1] * fx
    bottom = b[y1, x0] * (1 - fx) + b[y1, x1] * fx
    return top * (1 - fy) + bottom * fy


def box_uv(position: np.ndarray, normal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The uv (metres) render.py gives a box face at these world points with this face normal."""
    horizontal = np.abs(normal[..., 2]) > 0.5
    along = position[..., 0] * -normal[..., 1] + position[..., 1] * normal[..., 0]
    u = np.where(horizontal, position[..., 0], along)
    v = np.where(horizontal, position[..., 1], position[..., 2])
    return u, v


def _yaw(deg: float) -> np.ndarray:
    c, s = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _frame(axis: np.ndarray) -> np.ndarray:
    """Rows: an orthonormal frame whose third row is `axis`."""
    helper = np.array([1.0, 0, 0]) if abs(axis[0]) < 0.9 else np.array([0, 1.0, 0])
    e1 = np.cross(helper, axis)
    e1 /= np.linalg.norm(e1)
    return np.stack([e1, np.cross(axis, e1), axis])


def _corners(shape) -> np.ndarray:
    """Eight world-space corners of a box bounding the shape."""
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=np.float64)
    if isinstance(shape, Box):
        return (signs * np.asarray(shape.size) / 2) @ _yaw(shape.yaw).T + np.asarray(shape.center)
    if isinstance(shape, Sphere):
        return signs * shape.radius + np.asarray(shape.center)
    lo = np.minimum(shape.p0, shape.p1) - shape.radius
    hi = np.maximum(shape.p0, shape.p1) + shape.radius
    return (lo + hi) / 2 + signs * (hi - lo) / 2


def _finite(t: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(t), t, 0.0)


def _hit_box(o, d, shape):
    rot = _yaw(shape.yaw)
    ol = rot.T @ (o - np.asarray(shape.center))
    dl = d @ rot  # rot.T applied to every ray
    half = np.asarray(shape.size) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / np.where(dl == 0, 1e-300, dl)
        t1, t2 = (-half - ol) * inv, (half - ol) * inv
    near = np.minimum(t1, t2)
    axis = near.argmax(-1)
    tmin = np.take_along_axis(near, axis[..., None], -1)[..., 0]
    tmax = np.maximum(t1, t2).min(-1)
    t = np.where((tmax >= tmin) & (tmin > EPS), tmin, np.inf)
    nl = np.zeros_like(dl)
    np.put_along_axis(nl, axis[..., None], -np.sign(np.take_along_axis(dl, axis[..., None], -1)), -1)
    return t, nl @ rot.T


def _hit_sphere(o, d, shape):
    oc = o - np.asarray(shape.center)
    a = np.einsum("...i,...i->...", d, d)
    b = d @ oc
    c = oc @ oc - shape.radius ** 2
    disc = b * b - a * c
    t = (-b - np.sqrt(np.maximum(disc, 0))) / a
    t = np.where((disc >= 0) & (t > EPS), t, np.inf)
    p = oc + _finite(t)[..., None] * d
    return t, p / shape.radius


def _hit_cylinder(o, d, shape):
    p0, p1 = np.asarray(shape.p0, float), np.asarray(shape.p1, float)
    length = float(np.linalg.norm(p1 - p0))
    frame = _frame((p1 - p0) / length)
    ol, dl = frame @ (o - p0), d @ frame.T
    r = shape.radius
    a = dl[..., 0] ** 2 + dl[..., 1] ** 2
    b = ol[0] * dl[..., 0] + ol[1] * dl[..., 1]
    c = ol[0] ** 2 + ol[1] ** 2 - r * r
    disc = b * b - a * c
    with np.errstate(divide="ignore", invalid="ignore"):
        t_side = (-b - np.sqrt(np.maximum(disc, 0))) / np.where(a > 0, a, 1.0)
    z = ol[2] + t_side * dl[..., 2]
    t_side = np.where((a > 0) & (disc >= 0) & (t_side > EPS) & (z >= 0) & (z <= length), t_side, np.inf)
    p = ol + _finite(t_side)[..., None] * dl
    n_side = np.stack([p[..., 0] / r, p[..., 1] / r, np.zeros_like(a)], -1)
    best_t, best_n = t_side, n_side
    for zc, nz in ((0.0, -1.0), (length, 1.0)):
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (zc - ol[2]) / np.where(dl[..., 2] == 0, 1e-300, dl[..., 2])
        q = ol + _finite(t)[..., None] * dl
        t = np.where((t > EPS) & (q[..., 0] ** 2 + q[..., 1] ** 2 <= r * r), t, np.inf)
        closer = t < best_t
        best_t = np.where(closer, t, best_t)
        best_n = np.where(closer[..., None], np.array([0.0, 0.0, nz]), best_n)
    return best_t, best_n @ frame


_HIT = {Box: _hit_box, Sphere: _hit_sphere, Cylinder: _hit_cylinder}


class GBufferCaster:
    """`caster.render(camera)` -> canonical GBufferFrame (+ extras "object_id" int32) of the scene."""

    def __init__(self, desc: SceneDesc, textures: dict | None = None):
        self.desc = check_scene(desc)
        self.textures = bake_textures(desc) if textures is None else textures
        self.corners = [_corners(s) for s in desc.shapes]

    def _rect(self, camera: Camera, corners: np.ndarray):
        """(r0, r1, c0, c1) pixel rectangle that holds the corners' projection, or None when behind."""
        cam = (corners - camera.eye) @ camera.rotation.T
        z = -cam[:, 2]
        if np.all(z <= camera.near):
            return None
        if np.any(z <= camera.near):
            return 0, camera.height, 0, camera.width
        f = camera.focal
        x = f * cam[:, 0] / z + camera.width / 2
        y = camera.height / 2 - f * cam[:, 1] / z
        r0, r1 = max(int(math.floor(y.min())) - 1, 0), min(int(math.ceil(y.max())) + 1, camera.height)
        c0, c1 = max(int(math.floor(x.min())) - 1, 0), min(int(math.ceil(x.max())) + 1, camera.width)
        return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else None

    def render(self, camera: Camera, index: int = 0, timestamp: float = 0.0) -> GBufferFrame:
        h, w = camera.height, camera.width
        o = camera.eye.astype(np.float64)
        d = camera.view_dirs() @ camera.rotation  # world directions with camera-space z = -1: t is depth
        t_best = np.full((h, w), np.inf)
        n_best = np.zeros((h, w, 3))
        shape_best = np.full((h, w), -1, dtype=np.int64)
        for k, shape in enumerate(self.desc.shapes):
            rect = self._rect(camera, self.corners[k])
            if rect is None:
                continue
            r0, r1, c0, c1 = rect
            t, n = _HIT[type(shape)](o, d[r0:r1, c0:c1], shape)
            closer = t < t_best[r0:r1, c0:c1]
            if closer.any():
                t_best[r0:r1, c0:c1][closer] = t[closer]
                n_best[r0:r1, c0:c1][closer] = n[closer]
                shape_best[r0:r1, c0:c1][closer] = k
        hit = shape_best >= 0
        desc = self.desc
        mat_of = np.array([s.material for s in desc.shapes] + [0])
        obj_of = np.array([s.object for s in desc.shapes] + [0])
        mat = np.where(hit, mat_of[shape_best], -1)
        albedo_tab = np.array([m.albedo for m in desc.materials] + [(0.0, 0.0, 0.0)])
        albedo = albedo_tab[mat]
        position = o + np.where(hit, t_best, 0.0)[..., None] * d
        for k, bitmap in self.textures.items():
            sel = mat == k
            if sel.any():
                u, v = box_uv(position[sel], n_best[sel])
                tile = desc.materials[k].tile
                albedo[sel] = sample_texture(bitmap, u / tile, v / tile)
        normal = n_best @ camera.rotation.T
        normal /= np.maximum(np.linalg.norm(normal, axis=-1, keepdims=True), 1e-12)
        normal[~hit] = (0.0, 0.0, 1.0)
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        metallic = np.array([m.metallic for m in desc.materials] + [0.0])[mat]
        roughness = np.array([m.roughness for m in desc.materials] + [0.0])[mat]
        return GBufferFrame(index=index, timestamp=timestamp, albedo=f32(np.clip(albedo, 0, 1)), depth=f32(t_best),
                            metallic=f32(metallic), normal=f32(normal), roughness=f32(roughness),
                            extras={"object_id": np.where(hit, obj_of[shape_best], 0).astype(np.int32)})
