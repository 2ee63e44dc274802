"""Pinhole cameras and camera paths for the physics world.

Camera space is OpenGL's (as in streaming/gbuffer.py): +x right, +y up, the camera looks along -z.
World space is MuJoCo's: z-up, metres. Pixel (row i, column j) looks through the point
((j + 0.5 - cx) / fx, -(i + 0.5 - cy) / fy, -1) in camera space; both renderers use exactly this.

A path maps (time, scene) -> eye and target; `Camera.look_at` turns them into extrinsics.
Paths: "orbit" (circle around the arena), "fly" (seeded smooth flight through the arena),
"follow" (chases the player or a named body), "controls" (third-person, yaw/pitch from input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...model_zoo.errors import AlayaError

CAMERA_PATHS = ("orbit", "fly", "follow", "controls")


@dataclass(frozen=True, eq=False)
class Camera:
    """A pinhole camera: intrinsics from size and vertical field of view, extrinsics as a 4x4."""

    width: int
    height: int
    fov_y: float  # vertical field of view, degrees
    world_to_camera: np.ndarray  # (4, 4) float64, OpenGL camera convention
    near: float = 0.05
    far: float = 200.0

    @classmethod
    def look_at(cls, eye, target, width: int, height: int, fov_y: float = 60.0, up=(0.0, 0.0, 1.0)) -> "Camera":
        eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
        back = eye - target
        n = np.linalg.norm(back)
        if n < 1e-9:
            raise AlayaError(f"camera: eye {eye.tolist()} equals target")
        back /= n
        right = np.cross(up, back)
        if np.linalg.norm(right) < 1e-9:  # looking straight up or down: any right vector will do
            right = np.cross((0.0, 1.0, 0.0), back)
        right /= np.linalg.norm(right)
        cam_up = np.cross(back, right)
        rot = np.stack([right, cam_up, back])  # rows: camera axes in world coordinates
        m = np.eye(4)
        m[:3, :3] = rot
        m[:3, 3] = -rot @ eye
        return cls(width=width, height=height, fov_y=float(fov_y), world_to_camera=m)

    @property
    def camera_to_world(self) -> np.ndarray:
        return np.linalg.inv(self.world_to_camera)

    @property
    def rotation(self) -> np.ndarray:
        """World -> camera rotation (3, 3)."""
        return self.world_to_camera[:3, :3]

    @property
    def eye(self) -> np.ndarray:
        return self.camera_to_world[:3, 3]

    @property
    def focal(self) -> float:
        """fx = fy in pixels."""
        return 0.5 * self.height / math.tan(math.radians(self.fov_y) / 2)

    @property
    def intrinsics(self) -> np.ndarray:
        """K (3, 3): fx, fy, cx, cy in pixels, principal point at the image centre."""
        f = self.focal
        return np.array([[f, 0, self.width / 2], [0, f, self.height / 2], [0, 0, 1.0]])

    def projection(self) -> np.ndarray:
        """OpenGL projection matrix (4, 4) matching `intrinsics`."""
        f = 1.0 / math.tan(math.radians(self.fov_y) / 2)
        n, fa = self.near, self.far
        return np.array([[f * self.height / self.width, 0, 0, 0], [0, f, 0, 0],
                         [0, 0, (fa + n) / (n - fa), 2 * fa * n / (n - fa)], [0, 0, -1, 0]])

    def view_dirs(self) -> np.ndarray:
        """Unnormalised camera-space ray directions (H, W, 3) float64 with z = -1."""
        f = self.focal
        j = (np.arange(self.width) + 0.5 - self.width / 2) / f
        i = -(np.arange(self.height) + 0.5 - self.height / 2) / f
        d = np.empty((self.height, self.width, 3))
        d[..., 0], d[..., 1], d[..., 2] = j[None, :], i[:, None], -1.0
        return d

    def to_json(self) -> dict:
        return {"width": self.width, "height": self.height, "fov_y_deg": self.fov_y,
                "K": self.intrinsics.tolist(), "world_to_camera": self.world_to_camera.tolist(),
                "camera_to_world": self.camera_to_world.tolist(), "near": self.near, "far": self.far,
                "convention": "OpenGL camera (+x right, +y up, looks along -z); world z-up, metres"}


@dataclass
class CameraControls:
    """Third-person camera state driven by input: yaw/pitch in degrees, distance in metres."""

    yaw: float = -90.0
    pitch: float = 25.0
    distance: float = 3.5

    def apply(self, d_yaw: float = 0.0, d_pitch: float = 0.0, d_zoom: float = 0.0) -> None:
        self.yaw = (self.yaw + d_yaw) % 360.0
        self.pitch = float(np.clip(self.pitch + d_pitch, 5.0, 80.0))
        self.distance = float(np.clip(self.distance * (1.0 + d_zoom), 1.0, 12.0))

    def forward(self) -> np.ndarray:
        """Unit vector on the ground the camera faces (used to map move input to world)."""
        y = math.radians(self.yaw)
        return np.array([-math.cos(y), -math.sin(y), 0.0])


@dataclass
class CameraPath:
    """Eye and target as a function of time and scene state. `kind` is one of CAMERA_PATHS."""

    kind: str = "orbit"
    seed: int = 0
    arena: float = 3.0
    body: str = "player"  # what "follow" and "controls" look at
    controls: CameraControls = field(default_factory=CameraControls)
    _smoothed: np.ndarray | None = None  # follow-camera eye, smoothed between frames

    def __post_init__(self):
        if self.kind not in CAMERA_PATHS:
            raise AlayaError(f"camera path {self.kind!r} is unknown; choose one of {', '.join(CAMERA_PATHS)}")
        rng = np.random.default_rng(self.seed + 7919)
        self._phase = rng.uniform(0, 2 * math.pi, size=4)

    def pose(self, t: float, scene) -> tuple[np.ndarray, np.ndarray]:
        a = self.arena
        if self.kind == "orbit":
            ang = 0.35 * t + self._phase[0]
            r = 1.55 * a
            return np.array([r * math.cos(ang), r * math.sin(ang), 0.75 * a]), np.array([0.0, 0.0, 0.0])
        if self.kind == "fly":
            # Lissajous flight inside the walls, looking a little ahead along the path.
            def at(s):
                return np.array([0.8 * a * math.sin(0.31 * s + self._phase[1]),
                                 0.8 * a * math.sin(0.23 * s + self._phase[2]),
                                 1.2 + 0.5 * math.sin(0.17 * s + self._phase[3])])
            eye = at(t)
            ahead = at(t + 1.5)
            return eye, ahead + np.array([0.0, 0.0, -0.8])
        target = scene.data.xpos[scene.body_id(self.body)].copy()
        if self.kind == "follow":
            vel = scene.data.cvel[scene.body_id(self.body)][3:].copy()
            vel[2] = 0.0
            speed = np.linalg.norm(vel)
            back = -vel / speed if speed > 0.2 else np.array([0.0, -1.0, 0.0])
            want = target + 3.0 * back + np.array([0.0, 0.0, 1.6])
            prev = self._smoothed if self._smoothed is not None else want
            self._smoothed = prev + 0.15 * (want - prev)
            return self._smoothed.copy(), target
        c = self.controls
        y, p = math.radians(c.yaw), math.radians(c.pitch)
        offset = np.array([math.cos(y) * math.cos(p), math.sin(y) * math.cos(p), math.sin(p)]) * c.distance
        return target + offset, target
