"""Camera paths through a world v2 scene: walk, drive, orbit, at eye height.

`camera_path(scene, kind, seed, fps)` returns `pose(t) -> (eye, target)` in world coordinates
(z-up, metres); `Camera.look_at` (streaming/world/camera.py) turns a pose into a canonical camera.
Paths follow the scene's `CameraAnchors`, which the generators keep clear of props:

- walk: 1.4 m/s along the walking corridor, eye at 1.6 m with a 2 cm step bob, the head turning
  slowly left and right (up to 20 degrees); past the corridor's end it walks back.
- drive: 8 m/s along the right lane at 1.3 m (streets only), small steering sway.
- orbit: around the scene's orbit centre at 0.25 rad/s, eye at 1.7 m, looking at the centre.
"""
from __future__ import annotations

import math

import numpy as np

from ....model_zoo.errors import AlayaError
from .scene import SceneDesc

PATHS = ("walk", "drive", "orbit")


def available_paths(scene: SceneDesc) -> tuple[str, ...]:
    return tuple(p for p in PATHS if p != "drive" or scene.anchors.drive is not None)


def _along(a, b, s: float) -> tuple[np.ndarray, np.ndarray]:
    """Point at arc length s along segment a->b walked back and forth; and the unit heading there."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    length = float(np.linalg.norm(b - a))
    u = (b - a) / length
    period = s % (2 * length)
    if period <= length:
        return a + u * period, u
    return b - u * (period - length), -u


def camera_path(scene: SceneDesc, kind: str, seed: int):
    """pose(t) -> (eye, target) for path `kind` (PATHS) through `scene`; seeded start and turns."""
    if kind not in available_paths(scene):
        raise AlayaError(f"world v2: camera path {kind!r} is not available in a {scene.kind}; choose one of "
                         f"{', '.join(available_paths(scene))}")
    rng = np.random.default_rng(seed + 104729)
    phase = float(rng.uniform(0, 2 * math.pi))
    anchors = scene.anchors
    if kind == "orbit":
        cx, cy, r, target_z = anchors.orbit
        start = float(rng.uniform(0, 2 * math.pi))
        direction = float(rng.choice([-1.0, 1.0]))

        def pose(t: float):
            a = start + direction * 0.25 * t
            eye = np.array([cx + r * math.cos(a), cy + r * math.sin(a), 1.7])
            return eye, np.array([cx, cy, target_z])
        return pose

    if kind == "drive":
        a, b = anchors.drive
        speed, height, sway = 8.0, 1.3, 5.0
        s0 = float(rng.uniform(0, 0.3)) * float(np.linalg.norm(np.subtract(b, a)))
    else:
        a, b = anchors.walk
        if rng.random() < 0.5:
            a, b = b, a
        speed, height, sway = 1.4, anchors.eye, 20.0
        s0 = float(rng.uniform(0, 0.5)) * float(np.linalg.norm(np.subtract(b, a)))

    def pose(t: float):
        xy, u = _along(a, b, s0 + speed * t)
        yaw = math.radians(sway * math.sin(0.4 * t + phase))
        c, s = math.cos(yaw), math.sin(yaw)
        look = np.array([u[0] * c - u[1] * s, u[0] * s + u[1] * c])
        bob = 0.02 * math.sin(2 * math.pi * 1.8 * t) if kind == "walk" else 0.0
        eye = np.array([xy[0], xy[1], height + bob])
        return eye, eye + np.array([10 * look[0], 10 * look[1], -0.5])
    return pose


def heading(eye, target) -> float:
    """Azimuth (degrees, from +x towards +y) of the horizontal part of the view direction."""
    d = np.asarray(target, float) - np.asarray(eye, float)
    return math.degrees(math.atan2(d[1], d[0]))
