"""An analytic synthetic G-buffer source: a few moving spheres over a checkered ground plane.

Ray-cast in numpy (whole image at once, no per-pixel loops), so every pass is exact in the
canonical conventions of streaming/gbuffer.py: linear albedo, view-space depth in metres (+inf for
sky), camera-space OpenGL normals. Seeded, any length and size. Used by `alaya-flash demo` and by
the tests; the physics world (streaming/world/) is the richer source.
"""
from __future__ import annotations

import numpy as np

from ..gbuffer import GBufferFrame, StreamInfo

_CAMERA_POS = np.array([0.0, 1.6, 6.0], dtype=np.float32)
_CAMERA_PITCH = np.radians(-12.0)
_FOV_Y = np.radians(50.0)


def _camera_rotation(pitch: float) -> np.ndarray:
    """Camera-to-world rotation (columns: camera right, up, back) for a camera pitched about x."""
    c, s = np.cos(pitch), np.sin(pitch)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=np.float32)


class SyntheticScene:
    """Spheres bouncing over a plane; frame(i) is deterministic for a given seed and size."""

    def __init__(self, width: int = 256, height: int = 144, fps: float = 16.0, num_spheres: int = 4, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.width, self.height, self.fps = width, height, fps
        self.centers = rng.uniform([-2.5, 0, -3.0], [2.5, 0, 1.0], (num_spheres, 3)).astype(np.float32)
        self.radii = rng.uniform(0.4, 0.9, num_spheres).astype(np.float32)
        self.phases = rng.uniform(0, 2 * np.pi, num_spheres).astype(np.float32)
        self.speeds = rng.uniform(0.5, 1.5, num_spheres).astype(np.float32)
        self.albedos = rng.uniform(0.05, 0.9, (num_spheres, 3)).astype(np.float32)
        self.metallic = rng.choice([0.0, 1.0], num_spheres).astype(np.float32)
        self.roughness = rng.uniform(0.1, 0.9, num_spheres).astype(np.float32)
        self.rot = _camera_rotation(_CAMERA_PITCH)
        # Camera-space ray directions (-z forward), one per pixel centre.
        aspect = width / height
        ys = (1 - 2 * (np.arange(height, dtype=np.float32) + 0.5) / height) * np.tan(_FOV_Y / 2)
        xs = (2 * (np.arange(width, dtype=np.float32) + 0.5) / width - 1) * np.tan(_FOV_Y / 2) * aspect
        d = np.stack(np.broadcast_arrays(xs[None, :], ys[:, None], np.float32(-1.0)), axis=-1)
        self.dirs_cam = (d / np.linalg.norm(d, axis=-1, keepdims=True)).astype(np.float32)
        self.dirs_world = self.dirs_cam @ self.rot.T

    def info(self, num_frames: int | None = None) -> StreamInfo:
        return StreamInfo(self.width, self.height, self.fps, num_frames, layout="synthetic", source="synthetic")

    def frame(self, index: int) -> GBufferFrame:
        t = index / self.fps
        h, w = self.height, self.width
        dirs, origin = self.dirs_world, _CAMERA_POS
        # Ground plane y = 0, hit where the ray goes down.
        with np.errstate(divide="ignore", invalid="ignore"):
            t_best = np.where(dirs[..., 1] < -1e-6, -origin[1] / dirs[..., 1], np.inf).astype(np.float32)
        obj = np.full((h, w), -1, dtype=np.int32)  # -1 ground, -2 sky, k sphere k
        obj[~np.isfinite(t_best)] = -2
        centers = self.centers.copy()
        bounce = np.abs(np.sin(self.speeds * t * 2.0 + self.phases))
        centers[:, 0] += 0.8 * np.sin(self.speeds * t + self.phases)
        centers[:, 1] = self.radii + 1.2 * bounce
        for k, (c, r) in enumerate(zip(centers, self.radii)):
            oc = origin - c
            b = dirs @ oc
            disc = b * b - (oc @ oc - r * r)
            with np.errstate(invalid="ignore"):
                tk = -b - np.sqrt(disc)
            hit = (disc > 0) & (tk > 0) & (tk < t_best)
            t_best = np.where(hit, tk, t_best)
            obj[hit] = k
        points = origin + dirs * np.where(np.isfinite(t_best), t_best, 0)[..., None]
        normal_w = np.zeros((h, w, 3), dtype=np.float32)
        normal_w[obj == -1] = (0, 1, 0)
        albedo = np.zeros((h, w, 3), dtype=np.float32)
        checker = (np.floor(points[..., 0]) + np.floor(points[..., 2])) % 2
        albedo[obj == -1] = np.where(checker[obj == -1, None] > 0, 0.7, 0.2) * np.float32([1.0, 0.95, 0.85])
        metallic = np.zeros((h, w), dtype=np.float32)
        roughness = np.where(obj == -1, 0.8, 0.0).astype(np.float32)
        for k in range(len(self.radii)):
            m = obj == k
            normal_w[m] = (points[m] - centers[k]) / self.radii[k]
            albedo[m], metallic[m], roughness[m] = self.albedos[k], self.metallic[k], self.roughness[k]
        sky = obj == -2
        normal = normal_w @ self.rot  # world -> camera (rot is orthonormal)
        normal[sky] = (0, 0, 1)
        normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
        depth = (t_best * -self.dirs_cam[..., 2]).astype(np.float32)  # distance along camera -z
        depth[sky] = np.inf
        return GBufferFrame(
            index=index,
            timestamp=t,
            albedo=np.ascontiguousarray(albedo, dtype=np.float32),
            depth=depth,
            metallic=metallic,
            normal=np.ascontiguousarray(normal, dtype=np.float32),
            roughness=roughness,
        )


def synthetic_stream(width: int = 256, height: int = 144, num_frames: int = 48, fps: float = 16.0,
                     seed: int = 0, **stream_kwargs):
    """A GBufferStream (streaming/files/readers.py) over SyntheticScene frames 0 .. num_frames-1."""
    from .readers import GBufferStream

    scene = SyntheticScene(width, height, fps, seed=seed)
    return GBufferStream.from_frames(
        scene.info(num_frames), lambda: (scene.frame(i) for i in range(num_frames)), **stream_kwargs
    )
