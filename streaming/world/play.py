"""The playable loop: control inputs in, one physics step, the next G-buffer frame out.

    game = PlayableWorld(WorldConfig(seed=1, width=256, height=256, fps=30, presets=()))
    frame = game.step(Controls(move=(0.0, 1.0), yaw=2.0))   # ball rolls away from the camera
    frame = game.step(Controls(jump=True))

The player is the scene's orange ball ("player"). move = (right, forward) in [-1, 1] relative to
where the camera faces; jump works when the ball touches the ground; push shoves every object
within PUSH_RADIUS away from the ball; yaw / pitch (degrees per tick) and zoom (relative) steer
the third-person camera. Same seed and same inputs give the same frames.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import GBufferFrame, StreamInfo
from .camera import Camera
from .world import World, WorldConfig

MOVE_ACCEL = 9.0  # m/s^2 at full stick
JUMP_SPEED = 4.0  # m/s
PUSH_RADIUS = 1.5  # m
PUSH_SPEED = 3.5  # m/s


@dataclass(frozen=True)
class Controls:
    """One tick of input."""

    move: tuple[float, float] = (0.0, 0.0)  # (right, forward), each in [-1, 1]
    jump: bool = False
    push: bool = False
    yaw: float = 0.0  # degrees this tick
    pitch: float = 0.0  # degrees this tick
    zoom: float = 0.0  # relative distance change this tick, e.g. -0.05 zooms in 5 %

    def validate(self) -> "Controls":
        values = [*self.move, self.yaw, self.pitch, self.zoom]
        if len(self.move) != 2 or not all(math.isfinite(float(v)) for v in values):
            raise AlayaError(f"controls: move must be two finite numbers and yaw/pitch/zoom finite, got {self}")
        if max(abs(float(v)) for v in self.move) > 1.0:
            raise AlayaError(f"controls: move={self.move} is outside [-1, 1]")
        if not -0.5 <= self.zoom <= 0.5:
            raise AlayaError(f"controls: zoom={self.zoom} is outside [-0.5, 0.5]")
        return self


class PlayableWorld:
    """A world whose camera and player ball follow control inputs; one frame per `step`."""

    def __init__(self, config: WorldConfig = WorldConfig(fps=30.0, presets=())):
        self.config = dataclasses.replace(config, camera="controls", num_frames=None).validate()
        self.info = StreamInfo(width=self.config.width, height=self.config.height, fps=self.config.fps,
                               layout="physics-world", source=f"playable world seed {self.config.seed}")
        self.reset()

    def reset(self) -> None:
        if getattr(self, "world", None) is not None:
            self.world.close()
        self.world = World(self.config)
        scene = self.world.scene
        self._player = scene.body_id("player")
        self._radius = float(scene.model.geom_size[scene.model.body_geomadr[self._player]][0])
        self._mass = float(scene.model.body_mass[self._player])
        self.camera: Camera | None = None

    @property
    def player_position(self) -> np.ndarray:
        """World position (3,) of the player ball, metres (a copy)."""
        return self.world.scene.data.xpos[self._player].copy()

    def _free_dofs(self, body: int) -> int:
        m = self.world.scene.model
        return int(m.jnt_dofadr[m.body_jntadr[body]])

    def _apply(self, c: Controls) -> None:
        scene = self.world.scene
        data = scene.data
        cam = self.world.path.controls
        cam.apply(c.yaw, c.pitch, c.zoom)
        forward = cam.forward()
        right = np.array([forward[1], -forward[0], 0.0])
        accel = MOVE_ACCEL * (c.move[0] * right + c.move[1] * forward)
        data.xfrc_applied[:] = 0.0
        data.xfrc_applied[self._player, :3] = self._mass * accel
        dof = self._free_dofs(self._player)
        pos = data.xpos[self._player]
        if c.jump and pos[2] <= self._radius + 0.03:
            data.qvel[dof + 2] = JUMP_SPEED
        if c.push:
            for body in scene.dynamic_bodies:
                if body == self._player:
                    continue
                offset = data.xpos[body] - pos
                dist = float(np.linalg.norm(offset))
                if 1e-6 < dist <= PUSH_RADIUS:
                    d = self._free_dofs(body)
                    data.qvel[d:d + 3] += PUSH_SPEED * (offset / dist + np.array([0.0, 0.0, 0.5]))

    def step(self, controls: Controls = Controls()) -> GBufferFrame:
        """Apply inputs, advance physics one frame interval, return the new frame."""
        self._apply(controls.validate())
        self.world.advance()
        frame, self.camera = self.world.frame()
        return frame

    def close(self) -> None:
        self.world.close()
