"""Live G-buffer sources: the playable physics world and a looped G-buffer file stream.

Both give one teacher-form frame per call, uint8 (5, H, W, 3) in MODALITIES order, so the
renderer sees the same thing from either:

    source = WorldLiveSource(seed=0, width=256, height=256, fps=30)
    frame = source.next(Controls(move=(0.0, 1.0)))   # LiveFrame(teacher, player)
    source.reset()                                   # same seed: the same frames again

Sources are made, used and closed on the render thread (the world's GL context lives there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import LIGHT_PASSES, frame_to_teacher
from ..world.play import Controls


@dataclass
class LiveFrame:
    teacher: np.ndarray  # uint8 (5, H, W, 3), MODALITIES order
    player: tuple[float, float, float] | None = None  # world position of the player ball (metres), world only
    light: dict = field(default_factory=dict)  # the file's light passes by name, uint8 (H, W) (docs/gbuffers.md)


class WorldLiveSource:
    """The playable physics world: every next() applies the controls and steps physics one frame."""

    name = "world"
    playable = True

    def __init__(self, seed: int, width: int, height: int, fps: float):
        from ..world.play import PlayableWorld
        from ..world.world import WorldConfig

        self.game = PlayableWorld(WorldConfig(seed=seed, width=width, height=height, fps=fps, presets=()))
        self.description = self.game.info.source

    def next(self, controls: Controls) -> LiveFrame:
        frame = self.game.step(controls)
        data, body = self.game.world.scene.data, self.game._player
        player = tuple(round(float(v), 4) for v in data.xpos[body])
        return LiveFrame(frame_to_teacher(frame, self.game.info.depth_near), player)

    def reset(self) -> None:
        self.game.reset()

    def close(self) -> None:
        self.game.close()


class FileLiveSource:
    """A G-buffer file stream (any layout open_gbuffers reads), looped forever, with the light passes it has;
    controls are ignored."""

    name = "file"
    playable = False

    def __init__(self, path: Path, width: int, height: int):
        from ..files.readers import open_gbuffers

        self.stream = open_gbuffers(path, size=(height, width))
        self.description = str(path)
        self._frames = None

    def next(self, controls: Controls | None = None) -> LiveFrame:
        for _attempt in range(2):
            if self._frames is None:
                self._frames = self.stream.teacher_frames(extras=True)
            item = next(self._frames, None)
            if item is not None:
                images, extras = item
                return LiveFrame(np.asarray(images), light={n: extras[n] for n in LIGHT_PASSES if n in extras})
            self._frames = None  # end of the file: loop
        raise AlayaError(f"{self.description}: the G-buffer stream yielded no frames")

    def reset(self) -> None:
        self._frames = None

    def close(self) -> None:
        self._frames = None
        self.stream.close()
