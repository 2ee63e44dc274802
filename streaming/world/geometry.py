"""Triangle meshes of MuJoCo geoms in their local frames (sizes baked in), for the rasterizer.

Each builder returns positions (V, 3) and normals (V, 3) float64 as a triangle list (V = 3 x faces).
Smooth primitives are finely tessellated; the rasterizer replaces their interpolated normals with
analytic ones, so only silhouettes and depths carry (tiny) tessellation error.
"""
from __future__ import annotations

import numpy as np

from .scene import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, PLANE, SPHERE

SEGMENTS = 32  # around the axis
RINGS = 16  # pole to pole
PLANE_INFINITE = 200.0  # half-extent drawn for MuJoCo's "infinite" planes (size 0)


def _grid_triangles(rows: int, cols: int) -> np.ndarray:
    """Triangle indices (2 * (rows-1) * (cols-1), 3) of a rows x cols vertex grid."""
    r, c = np.meshgrid(np.arange(rows - 1), np.arange(cols - 1), indexing="ij")
    a = (r * cols + c).ravel()
    b, d, e = a + 1, a + cols, a + cols + 1
    return np.concatenate([np.stack([a, d, b], 1), np.stack([b, d, e], 1)])


def _expand(verts: np.ndarray, normals: np.ndarray, tris: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return verts[tris].reshape(-1, 3), normals[tris].reshape(-1, 3)


def _sphere(radii, z_split: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """UV sphere with radii (rx, ry, rz); with z_split > 0 the halves move apart by +-z_split (capsule)."""
    theta = np.linspace(0, np.pi, RINGS + 1)  # from +z down
    phi = np.linspace(0, 2 * np.pi, SEGMENTS + 1)
    n_upper = len(theta)
    if z_split > 0:  # duplicate the equator so the cylinder part gets its own ring of vertices
        upper = theta[theta <= np.pi / 2]
        n_upper = len(upper)
        theta = np.concatenate([upper, [np.pi / 2], theta[theta > np.pi / 2]])
    t, p = np.meshgrid(theta, phi, indexing="ij")
    unit = np.stack([np.sin(t) * np.cos(p), np.sin(t) * np.sin(p), np.cos(t)], -1).reshape(-1, 3)
    verts = unit * np.asarray(radii, dtype=np.float64)
    if z_split > 0:
        row = np.repeat(np.arange(len(theta)), SEGMENTS + 1)
        verts[:, 2] += np.where(row < n_upper, z_split, -z_split)
    normals = unit
    return _expand(verts, normals, _grid_triangles(len(theta), SEGMENTS + 1))


def _cylinder(r: float, h: float) -> tuple[np.ndarray, np.ndarray]:
    phi = np.linspace(0, 2 * np.pi, SEGMENTS + 1)
    ring = np.stack([np.cos(phi), np.sin(phi), np.zeros_like(phi)], -1)
    side_v = np.concatenate([ring * r + [0, 0, h], ring * r - [0, 0, h]])
    side = _expand(side_v, np.concatenate([ring, ring]), _grid_triangles(2, SEGMENTS + 1))
    parts = [side]
    for sign in (1.0, -1.0):
        centre = np.array([[0, 0, sign * h]])
        rim = ring[:-1] * r + [0, 0, sign * h]
        k = np.arange(SEGMENTS)
        tri = np.stack([np.zeros(SEGMENTS, int), 1 + k, 1 + (k + 1) % SEGMENTS], 1)
        v = np.concatenate([centre, rim])
        parts.append(_expand(v, np.tile([0.0, 0.0, sign], (len(v), 1)), tri))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _box(size) -> tuple[np.ndarray, np.ndarray]:
    verts, normals = [], []
    for axis in range(3):
        for sign in (1.0, -1.0):
            u, v = [a for a in range(3) if a != axis]
            corners = []
            for cu, cv in [(-1, -1), (1, -1), (1, 1), (-1, 1)]:
                p = np.zeros(3)
                p[axis], p[u], p[v] = sign * size[axis], cu * size[u], cv * size[v]
                corners.append(p)
            c = np.array(corners)
            n = np.zeros(3)
            n[axis] = sign
            for tri in ([0, 1, 2], [0, 2, 3]):
                verts.append(c[tri])
                normals.append(np.tile(n, (3, 1)))
    return np.concatenate(verts), np.concatenate(normals)


def _plane(size) -> tuple[np.ndarray, np.ndarray]:
    sx = size[0] if size[0] > 0 else PLANE_INFINITE
    sy = size[1] if size[1] > 0 else PLANE_INFINITE
    c = np.array([[-sx, -sy, 0], [sx, -sy, 0], [sx, sy, 0], [-sx, sy, 0]], dtype=np.float64)
    v = c[[0, 1, 2, 0, 2, 3]]
    return v, np.tile([0.0, 0.0, 1.0], (6, 1))


def mesh_face_normals(verts: np.ndarray, faces: np.ndarray) -> np.ndarray:
    """Outward unit normals (F, 3) of a closed convex mesh's triangles."""
    tri = verts[faces]
    n = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    n /= np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)
    outward = np.sign(np.einsum("fi,fi->f", n, tri.mean(1) - verts.mean(0)))
    return n * np.where(outward < 0, -1.0, 1.0)[:, None]


def geom_triangles(scene, geom: int) -> tuple[np.ndarray, np.ndarray]:
    """Local-frame triangle list (positions, normals) of one geom."""
    kind = int(scene.model.geom_type[geom])
    size = scene.model.geom_size[geom].astype(np.float64)
    if kind == PLANE:
        return _plane(size)
    if kind == SPHERE:
        return _sphere([size[0]] * 3)
    if kind == ELLIPSOID:
        return _sphere(size)
    if kind == CAPSULE:
        return _sphere([size[0]] * 3, z_split=size[1])
    if kind == CYLINDER:
        return _cylinder(size[0], size[1])
    if kind == BOX:
        return _box(size)
    if kind == MESH:
        verts, faces = scene.mesh(geom)
        n = mesh_face_normals(verts, faces)
        return verts[faces].reshape(-1, 3), np.repeat(n, 3, axis=0)
    raise ValueError(f"geom {geom}: type {kind} has no mesh builder")
