"""The physics world as a G-buffer stream source.

    source = WorldSource(WorldConfig(seed=3, width=256, height=256, num_frames=64))
    source.info                      # StreamInfo
    for frame in source:             # canonical GBufferFrame, one at a time
        frame.extras["rgb"]          # ground truth (H, W, 3) uint8 under the first preset
    for chunk in source.teacher_chunks(16):   # uint8 (T, 5, H, W, 3), what the models eat
        ...
    stream = world_stream(config, size=(448, 832))   # the same as a readers.GBufferStream

`world_stream` wraps the source in the readers' GBufferStream, so the world is a drop-in for
`open_gbuffers(path)`: same .info, iteration, teacher_frames / teacher_chunks, start / stop /
stride and resizing.

Each iteration rebuilds the scene from the seed, so iterating twice gives the same frames bit
for bit. Extras per frame: "object_id" (H, W) int32 (geom id + 1, 0 = background); with presets,
"rgb" (first preset) and, when several, "rgb_<preset>" for each; with shadows, "sun_visibility"
(first preset's sun) and "sun_visibility_<preset>" likewise. `frames_with_cameras()` also yields
each frame's Camera (intrinsics and extrinsics), which the `world` command stores per clip.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from ...model_zoo.errors import AlayaError
from ..gbuffer import GBufferFrame, StreamInfo
from ..files.readers import GBufferStream
from .camera import CAMERA_PATHS, Camera, CameraPath
from .raster import check_size, make_renderer
from .scene import MAX_OBJECTS, Scene, SceneConfig, build_scene
from .shading import get_preset

MAX_FRAMES = 1_000_000


@dataclass(frozen=True)
class WorldConfig:
    """Everything that determines a world stream; same config -> same frames."""

    seed: int = 0
    width: int = 256
    height: int = 256
    fps: float = 16.0
    num_frames: int | None = 64  # None: endless
    num_objects: int = 16
    camera: str = "orbit"  # one of camera.CAMERA_PATHS
    fov_y: float = 60.0
    presets: tuple[str, ...] = ("bright_sunny",)  # ground truth per preset; () for G-buffers only
    shadows: bool = False
    backend: str = "auto"  # "auto" | "gl" | "torch"
    arena: float = 3.0
    physics_substeps: int = 0  # 0: derived from fps and the scene's timestep

    def validate(self) -> "WorldConfig":
        check_size(self.width, self.height)
        if not 1.0 <= self.fps <= 240.0:
            raise AlayaError(f"world: fps={self.fps} is out of range 1..240")
        if self.num_frames is not None and not 1 <= self.num_frames <= MAX_FRAMES:
            raise AlayaError(f"world: frames={self.num_frames} is out of range 1..{MAX_FRAMES}")
        if not 0 <= self.num_objects <= MAX_OBJECTS:
            raise AlayaError(f"world: objects={self.num_objects} is out of range 0..{MAX_OBJECTS}")
        if self.camera not in CAMERA_PATHS:
            raise AlayaError(f"world: camera path {self.camera!r} is unknown; choose one of {', '.join(CAMERA_PATHS)}")
        if not 10.0 <= self.fov_y <= 150.0:
            raise AlayaError(f"world: fov={self.fov_y} is out of range 10..150 degrees")
        for name in self.presets:
            get_preset(name)
        if len(set(self.presets)) != len(self.presets):
            raise AlayaError(f"world: presets {', '.join(self.presets)} repeat a name")
        if self.shadows and not self.presets:
            raise AlayaError("world: shadows need at least one lighting preset (they follow its sun)")
        return self

    def scene_config(self) -> SceneConfig:
        return SceneConfig(seed=self.seed, num_objects=self.num_objects, arena=self.arena)


@dataclass
class World:
    """One running world: scene, renderer and camera path. `frame()` renders the current state."""

    config: WorldConfig
    scene: Scene = field(init=False)
    path: CameraPath = field(init=False)
    index: int = 0

    def __post_init__(self):
        self.config.validate()
        self.scene = build_scene(self.config.scene_config())
        self.renderer = make_renderer(self.scene, self.config.width, self.config.height, self.config.backend)
        self.path = CameraPath(self.config.camera, seed=self.config.seed, arena=self.config.arena)
        self.presets = [get_preset(n) for n in self.config.presets]

    def camera(self) -> Camera:
        eye, target = self.path.pose(self.scene.time, self.scene)
        c = self.config
        return Camera.look_at(eye, target, c.width, c.height, c.fov_y)

    @property
    def backend(self) -> str:
        """"gl" (rasterizer) or "torch" (ray caster): what actually renders."""
        return "torch" if type(self.renderer).__name__ == "RayCaster" else "gl"

    def frame(self, camera: Camera | None = None) -> tuple[GBufferFrame, Camera]:
        """Render the current physics state into a canonical frame (+ extras); does not step."""
        camera = camera or self.camera()
        sun_dirs = tuple(p.sun_direction for p in self.presets) if self.config.shadows else ()
        passes = self.renderer.render(camera, sun_dirs=sun_dirs, presets=tuple(self.presets))
        visibility = passes.pop("sun_visibility", None)
        rgbs = passes.pop("rgb", None)
        extras = {"object_id": passes.pop("object_id")}
        for k, preset in enumerate(self.presets):
            vis = visibility[k] if visibility is not None else None
            if k == 0:
                extras["rgb"] = rgbs[0]
                if vis is not None:
                    extras["sun_visibility"] = vis
            if len(self.presets) > 1:
                extras[f"rgb_{preset.name}"] = rgbs[k]
                if vis is not None:
                    extras[f"sun_visibility_{preset.name}"] = vis
        frame = GBufferFrame(index=self.index, timestamp=self.index / self.config.fps, extras=extras, **passes)
        return frame, camera

    def close(self) -> None:
        """Free the renderer's GL context (if any)."""
        release = getattr(self.renderer, "release", None)
        if release is not None:
            release()

    def advance(self) -> None:
        """Step physics by one frame interval."""
        c = self.config
        if c.physics_substeps:
            self.scene.step(c.physics_substeps * self.scene.model.opt.timestep)
        else:
            self.scene.step(1.0 / c.fps)
        self.index += 1


class WorldSource:
    """The physics world as a stream source: `.info`, iteration over canonical frames, teacher chunks."""

    def __init__(self, config: WorldConfig = WorldConfig()):
        self.config = config.validate()
        c = config
        self.info = StreamInfo(width=c.width, height=c.height, fps=c.fps, num_frames=c.num_frames,
                               layout="physics-world", source=f"physics world seed {c.seed}")

    def __len__(self) -> int:
        if self.config.num_frames is None:
            raise TypeError("an endless world stream has no length")
        return self.config.num_frames

    def frames_with_cameras(self) -> Iterator[tuple[GBufferFrame, Camera]]:
        world = World(self.config)
        n = self.config.num_frames
        try:
            while n is None or world.index < n:
                yield world.frame()
                world.advance()
        finally:
            world.close()

    def __iter__(self) -> Iterator[GBufferFrame]:
        for frame, _ in self.frames_with_cameras():
            yield frame

    def stream(self, **reader_options) -> GBufferStream:
        """This source as a readers.GBufferStream (options: start, stop, stride, size, resize)."""
        return GBufferStream.from_frames(self.info, self.__iter__, **reader_options)

    def teacher_chunks(self, length: int, drop_last: bool = False, first: int = 0, extras: bool = False) -> Iterator:
        """uint8 (T, 5, H, W, 3) chunks in MODALITIES order; the last may be shorter unless drop_last
        (first, extras: as GBufferStream.teacher_chunks)."""
        return self.stream().teacher_chunks(length, drop_last=drop_last, first=first, extras=extras)


def world_stream(config: WorldConfig = WorldConfig(), **reader_options) -> GBufferStream:
    """The physics world as a GBufferStream, the readers' stream type (see module docstring)."""
    return WorldSource(config).stream(**reader_options)
