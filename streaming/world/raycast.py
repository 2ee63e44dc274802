"""Pure-PyTorch analytic ray caster: the rasterizer's fallback (no GL needed) and its test oracle.

One primary ray per pixel through the pixel centre (camera.py's convention), intersected in
float64 with every geom in that geom's local frame: planes (finite, as drawn), spheres,
ellipsoids, boxes, cylinders, capsules exactly, and convex meshes triangle by triangle
(Moller-Trumbore). Produces the same passes as raster.GLRenderer.render; sun visibility is hard
(shadow rays), where the rasterizer's is a 3x3-filtered shadow map.
"""
from __future__ import annotations

import numpy as np
import torch

from ...model_zoo.errors import AlayaError
from .camera import Camera
from .geometry import PLANE_INFINITE, mesh_face_normals
from .shading import shade
from .scene import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, PLANE, SPHERE, Scene

SUPPORTED = {PLANE, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH}
INF = float("inf")
RAY_CHUNK = 1 << 16  # rays per mesh batch, bounds the (rays x triangles) temporaries


def _dot(a, b):
    # Explicit components: a reduction over a size-3 last axis is several times slower in torch.
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def _cross(a, b):
    return torch.stack([a[..., 1] * b[..., 2] - a[..., 2] * b[..., 1],
                        a[..., 2] * b[..., 0] - a[..., 0] * b[..., 2],
                        a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0]], -1)


def _sphere(o, d, r, centre=None):
    if centre is not None:
        o = o - centre
    b = _dot(o, d)
    c = _dot(o, o) - r * r
    disc = b * b - c
    t = -b - torch.sqrt(disc.clamp(min=0))
    t = torch.where((disc >= 0) & (t > 0), t, INF)
    return t, (o + t[:, None] * d) / r


def _ellipsoid(o, d, radii):
    r = torch.as_tensor(radii, dtype=o.dtype)
    os_, ds = o / r, d / r
    a, b, c = _dot(ds, ds), _dot(os_, ds), _dot(os_, os_) - 1
    disc = b * b - a * c
    t = (-b - torch.sqrt(disc.clamp(min=0))) / a
    t = torch.where((disc >= 0) & (t > 0), t, INF)
    p = o + torch.nan_to_num(t[:, None] * d)
    return t, p / (r * r)


def _box(o, d, half):
    h = torch.as_tensor(half, dtype=o.dtype)
    inv = 1.0 / torch.where(d == 0, torch.full_like(d, 1e-300), d)
    t1, t2 = (-h - o) * inv, (h - o) * inv
    near = torch.minimum(t1, t2)
    tmin, axis = near.max(-1)
    tmax = torch.maximum(t1, t2).min(-1).values
    t = torch.where((tmax >= tmin) & (tmin > 0), tmin, INF)
    n = torch.zeros_like(o)
    n.scatter_(1, axis[:, None], -torch.sign(d.gather(1, axis[:, None])))
    return t, n


def _plane(o, d, size):
    sx = size[0] if size[0] > 0 else PLANE_INFINITE
    sy = size[1] if size[1] > 0 else PLANE_INFINITE
    dz = torch.where(d[:, 2] == 0, torch.full_like(d[:, 2], 1e-300), d[:, 2])
    t = -o[:, 2] / dz
    p = o + t[:, None] * d
    ok = (t > 0) & (p[:, 0].abs() <= sx) & (p[:, 1].abs() <= sy)
    n = torch.zeros_like(o)
    n[:, 2] = 1.0
    return torch.where(ok, t, INF), n


def _tube(o, d, r, h):
    """Open cylinder side of radius r between z = -h and h."""
    a = d[:, 0] ** 2 + d[:, 1] ** 2
    b = o[:, 0] * d[:, 0] + o[:, 1] * d[:, 1]
    c = o[:, 0] ** 2 + o[:, 1] ** 2 - r * r
    disc = b * b - a * c
    t = (-b - torch.sqrt(disc.clamp(min=0))) / torch.where(a > 0, a, torch.ones_like(a))
    z = o[:, 2] + t * d[:, 2]
    t = torch.where((a > 0) & (disc >= 0) & (t > 0) & (z.abs() <= h), t, INF)
    p = o + torch.nan_to_num(t[:, None] * d, posinf=0.0)
    n = torch.stack([p[:, 0] / r, p[:, 1] / r, torch.zeros_like(t)], -1)
    return t, n


def _closest(*hits):
    t = torch.stack([h[0] for h in hits])
    n = torch.stack([h[1] for h in hits])
    best = t.argmin(0)
    idx = torch.arange(t.shape[1])
    return t[best, idx], n[best, idx]


def _cylinder(o, d, r, h):
    hits = [_tube(o, d, r, h)]
    for s in (1.0, -1.0):
        dz = torch.where(d[:, 2] == 0, torch.full_like(d[:, 2], 1e-300), d[:, 2])
        t = (s * h - o[:, 2]) / dz
        p = o + t[:, None] * d
        ok = (t > 0) & (p[:, 0] ** 2 + p[:, 1] ** 2 <= r * r)
        n = torch.zeros_like(o)
        n[:, 2] = s
        hits.append((torch.where(ok, t, INF), n))
    return _closest(*hits)


def _capsule(o, d, r, h):
    hits = [_tube(o, d, r, h)]
    for s in (1.0, -1.0):
        c = torch.tensor([0.0, 0.0, s * h], dtype=o.dtype)
        t, _ = _sphere(o, d, r, centre=c)
        hits.append((t, torch.zeros_like(o)))
    t, _ = _closest(*hits)
    p = o + torch.nan_to_num(t[:, None] * d, posinf=0.0)
    axis = torch.zeros_like(p)
    axis[:, 2] = p[:, 2].clamp(-h, h)
    return t, (p - axis) / r


def _mesh(o, d, verts, faces, normals):
    tri = torch.as_tensor(verts[faces], dtype=o.dtype)  # (F, 3, 3)
    fn = torch.as_tensor(normals, dtype=o.dtype)
    v0, e1, e2 = tri[:, 0], tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]
    ts, ns = [], []
    for s in range(0, len(o), RAY_CHUNK):
        oc, dc = o[s:s + RAY_CHUNK, None], d[s:s + RAY_CHUNK, None]  # (N, 1, 3)
        pvec = _cross(dc, e2[None])
        det = _dot(e1[None], pvec)
        inv = 1.0 / torch.where(det.abs() < 1e-300, torch.full_like(det, 1e-300), det)
        tvec = oc - v0[None]
        u = _dot(tvec, pvec) * inv
        qvec = _cross(tvec, e1[None])
        v = _dot(dc, qvec) * inv
        t = _dot(e2[None], qvec) * inv
        ok = (det.abs() > 1e-300) & (u >= 0) & (v >= 0) & (u + v <= 1) & (t > 0)
        t = torch.where(ok, t, INF)
        tbest, fbest = t.min(1)
        ts.append(tbest)
        ns.append(fn[fbest])
    return torch.cat(ts), torch.cat(ns)


class RayCaster:
    """Same interface as raster.GLRenderer: render(camera, sun_dirs=()) -> canonical passes."""

    def __init__(self, scene: Scene, width: int, height: int):
        bad = scene.unsupported_geoms(SUPPORTED)
        if bad:
            raise AlayaError(f"world: the PyTorch ray caster cannot trace {', '.join(bad)}")
        self.scene, self.width, self.height = scene, width, height
        self._meshes = {}
        for g in range(scene.ngeom):
            if int(scene.model.geom_type[g]) == MESH:
                verts, faces = scene.mesh(g)
                self._meshes[g] = (verts, faces, mesh_face_normals(verts, faces))

    def _intersect(self, g: int, o: torch.Tensor, d: torch.Tensor):
        """Nearest hit of rays (local frame) with geom g: t (N,) (inf = miss), local normal (N, 3)."""
        kind = int(self.scene.model.geom_type[g])
        size = [float(v) for v in self.scene.model.geom_size[g]]
        if kind == PLANE:
            return _plane(o, d, size)
        if kind == SPHERE:
            return _sphere(o, d, size[0])
        if kind == ELLIPSOID:
            return _ellipsoid(o, d, size)
        if kind == BOX:
            return _box(o, d, size)
        if kind == CYLINDER:
            return _cylinder(o, d, size[0], size[1])
        if kind == CAPSULE:
            return _capsule(o, d, size[0], size[1])
        return _mesh(o, d, *self._meshes[g])

    def _trace(self, origins: torch.Tensor, dirs: torch.Tensor, t_min: float = 0.0):
        """Nearest hit over all geoms for world rays: t, geom (-1 = miss), local point, local normal."""
        pos, rot = (torch.from_numpy(a) for a in self.scene.geom_poses())
        n_rays = len(dirs)
        t_best = torch.full((n_rays,), INF, dtype=torch.float64)
        g_best = torch.full((n_rays,), -1, dtype=torch.long)
        p_best = torch.zeros(n_rays, 3, dtype=torch.float64)
        n_best = torch.zeros(n_rays, 3, dtype=torch.float64)
        rbound = self.scene.model.geom_rbound
        for g in range(self.scene.ngeom):
            # Only rays that pass within the geom's bounding sphere (MuJoCo's geom_rbound; 0 for
            # planes, which take every ray) are intersected exactly.
            if rbound[g] > 0:
                v = pos[g] - origins
                tc = _dot(v, dirs)
                near = (_dot(v, v) - tc * tc <= rbound[g] ** 2) & (tc > t_min - rbound[g])
                idx = near.nonzero().squeeze(1)
                if len(idx) == 0:
                    continue
            else:
                idx = torch.arange(n_rays)
            o_l = (origins[idx] - pos[g]) @ rot[g]  # R^T (o - p) with row vectors
            d_l = dirs[idx] @ rot[g]
            t, n_l = self._intersect(g, o_l, d_l)
            better = (t > t_min) & (t < t_best[idx])
            sel = idx[better]
            t, o_l, d_l, n_l = t[better], o_l[better], d_l[better], n_l[better]
            t_best[sel] = t
            g_best[sel] = g
            p_best[sel] = o_l + t[:, None] * d_l
            n_best[sel] = n_l @ rot[g].T  # world-space normal
        return t_best, g_best, p_best, n_best

    def render(self, camera: Camera, sun_dirs: tuple = (), presets: tuple = ()) -> dict[str, np.ndarray]:
        """Same passes as GLRenderer.render; "rgb" comes from shading.shade() (the definition)."""
        if (camera.width, camera.height) != (self.width, self.height):
            raise AlayaError(f"world: camera is {camera.width}x{camera.height}, renderer is {self.width}x{self.height}")
        h, w = self.height, self.width
        d_cam = torch.from_numpy(camera.view_dirs().reshape(-1, 3))
        d_cam = d_cam / d_cam.norm(dim=-1, keepdim=True)
        rot_cam = torch.from_numpy(camera.rotation.copy())
        d_world = d_cam @ rot_cam  # R^T d
        eye = torch.from_numpy(camera.eye.copy()).expand_as(d_world)
        t, g, p_local, n_world = self._trace(eye, d_world)

        depth = t * (-d_cam[:, 2])
        hit = (g >= 0) & (depth >= camera.near) & (depth <= camera.far)
        g = torch.where(hit, g, -1)
        n_cam = n_world @ rot_cam.T
        n_cam = n_cam / n_cam.norm(dim=-1, keepdim=True).clamp(min=1e-12)

        m = self.scene.materials
        gi = g.clamp(min=0).numpy()
        albedo = torch.from_numpy(m.albedo[gi])
        checker = torch.from_numpy(m.checker[gi]).double()
        cells = torch.floor(p_local * checker[:, None])
        is_plane = torch.from_numpy(self.scene.model.geom_type[gi] == PLANE)
        cells[:, 2] = torch.where(is_plane, 0.0, cells[:, 2])
        odd = (checker > 0) & (torch.remainder(cells.sum(-1), 2.0) >= 1.0)
        albedo = torch.where(odd[:, None], torch.from_numpy(m.albedo2[gi]), albedo)

        bg = ~hit
        out = {
            "albedo": torch.where(bg[:, None], 0.0, albedo.float()),
            "depth": torch.where(bg, INF, depth).float(),
            "metallic": torch.where(bg, 0.0, torch.from_numpy(m.metallic[gi])),
            "normal": torch.where(bg[:, None], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), n_cam).float(),
            "roughness": torch.where(bg, 0.0, torch.from_numpy(m.roughness[gi])),
            "object_id": (g + 1).int(),
        }
        passes = {k: np.ascontiguousarray(v.numpy().reshape((h, w) + v.shape[1:])) for k, v in out.items()}
        if sun_dirs:
            passes["sun_visibility"] = self._sun_visibility(eye + t.nan_to_num(posinf=0)[:, None] * d_world,
                                                            n_world, hit, sun_dirs)
        if presets:
            if sun_dirs and len(sun_dirs) != len(presets):
                raise AlayaError(f"world: {len(sun_dirs)} sun directions for {len(presets)} presets")
            vis = passes.get("sun_visibility")
            passes["rgb"] = np.stack([shade(passes, camera, p, None if vis is None else vis[k])
                                      for k, p in enumerate(presets)])
        return passes

    def _sun_visibility(self, points, normals, hit, sun_dirs) -> np.ndarray:
        vis = []
        origins = points + 1e-4 * normals
        for sun in sun_dirs:
            s = torch.as_tensor(np.asarray(sun, dtype=np.float64) / np.linalg.norm(sun)).expand_as(points)
            t, _, _, _ = self._trace(origins, s.contiguous(), t_min=1e-5)
            vis.append(torch.where(hit & torch.isfinite(t), 0.0, 1.0))
        return torch.stack(vis).float().numpy().reshape(len(sun_dirs), self.height, self.width)
