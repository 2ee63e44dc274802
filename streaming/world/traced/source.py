"""World v2 as a G-buffer stream source: exact G-buffers and path-traced truth per lighting preset.

    source = TracedSource(TracedConfig(scene="street", camera="drive", seed=3, num_frames=32,
                                       presets=("bright_sunny", "rainy_wet"), spp=64))
    for frame, camera in source.frames_with_cameras():
        frame.depth, frame.extras["rgb"], frame.extras["sun_visibility"]
    source.captions            # {preset: caption naming the scene and the sun's side}

Extras per frame, as the physics world's (world.py): "object_id" (H, W) int32; with presets
"rgb" (first preset) and, when several, "rgb_<preset>" each; "sun_visibility" (first preset's
sun) and "sun_visibility_<preset>" likewise; "sky_visibility" (the sky pass: the share of the sky
each pixel's surface sees, the same under every preset) unless sky_samples is 0; with passes > 1 also "truth_noise_mse" (and
"truth_noise_mse_<preset>"): the truth's own noise, estimated from the spread of its passes. The
scene is static; only the camera moves. The same config gives the same G-buffers bit for bit, and
the same truth for the same Mitsuba build and variant (`variant` "auto" takes llvm_ad_rgb where a
libLLVM >= 16 is installed: render.resolve_variant).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ....model_zoo.errors import AlayaError
from ...gbuffer import GBufferFrame, StreamInfo
from ..camera import Camera
from ..raster import check_size
from .gbuffers import GBufferCaster
from .paths import PATHS, available_paths, camera_path, heading
from .presets import SIDES, caption, check_side, get_traced_preset, placed, sun_azimuth
from .render import check_variant, resolve_variant
from .scene import KINDS, SceneDesc, make_scene

MAX_FRAMES = 100_000
MAX_SPP = 4096
MAX_PASSES = 16


@dataclass(frozen=True)
class TracedConfig:
    """Everything that determines a world v2 clip; same config -> same frames."""

    seed: int = 0
    scene: str = "street"  # scene.KINDS
    width: int = 256
    height: int = 256
    fps: float = 16.0
    num_frames: int = 64
    camera: str = "walk"  # paths.PATHS (drive: streets only)
    fov_y: float = 60.0
    presets: tuple[str, ...] = ("bright_sunny",)  # presets.TRACED_PRESETS names; () for G-buffers only
    sun: str = "auto"  # the sun's side relative to the first frame's heading (presets.SIDES), or auto: from the seed
    spp: int = 64  # path-traced samples per pixel
    max_depth: int = 4  # path length (3: one indirect bounce)
    variant: str = "auto"  # Mitsuba variant: scalar_rgb, llvm_ad_rgb, or auto (llvm when a libLLVM >= 16 is installed)
    passes: int = 1  # > 1: the truth averages this many independent renders of spp samples and estimates its noise
    sky_samples: int = 256  # rays a pixel for the sky pass (extras "sky_visibility"); 0: none

    def validate(self) -> "TracedConfig":
        check_size(self.width, self.height)
        if self.scene not in KINDS:
            raise AlayaError(f"world v2: scene {self.scene!r} is unknown; choose one of {', '.join(KINDS)}")
        if self.camera not in PATHS:
            raise AlayaError(f"world v2: camera path {self.camera!r} is unknown; choose one of {', '.join(PATHS)}")
        if self.camera == "drive" and self.scene != "street":
            raise AlayaError(f"world v2: camera path 'drive' needs a street (the scene is {self.scene})")
        if not 1.0 <= self.fps <= 240.0:
            raise AlayaError(f"world v2: fps={self.fps} is out of range 1..240")
        if not 1 <= self.num_frames <= MAX_FRAMES:
            raise AlayaError(f"world v2: frames={self.num_frames} is out of range 1..{MAX_FRAMES}")
        if not 10.0 <= self.fov_y <= 150.0:
            raise AlayaError(f"world v2: fov={self.fov_y} is out of range 10..150 degrees")
        if not 1 <= self.spp <= MAX_SPP:
            raise AlayaError(f"world v2: spp={self.spp} is out of range 1..{MAX_SPP}")
        if not 1 <= self.passes <= MAX_PASSES:
            raise AlayaError(f"world v2: passes={self.passes} is out of range 1..{MAX_PASSES}")
        if not 0 <= self.sky_samples <= MAX_SPP:
            raise AlayaError(f"world v2: sky_samples={self.sky_samples} is out of range 0..{MAX_SPP}")
        if not 3 <= self.max_depth <= 16:
            raise AlayaError(f"world v2: max_depth={self.max_depth} is out of range 3..16 (3: one indirect bounce)")
        for name in self.presets:
            get_traced_preset(name)
        if len(set(self.presets)) != len(self.presets):
            raise AlayaError(f"world v2: presets {', '.join(self.presets)} repeat a name")
        if self.sun != "auto":
            check_side(self.sun)
        check_variant(self.variant)
        return self

    def sun_side(self) -> str:
        if self.sun != "auto":
            return self.sun
        return list(SIDES)[int(np.random.default_rng(self.seed + 15485863).integers(len(SIDES)))]


def truth_noise_mse(passes: list[np.ndarray]) -> float:
    """The mean squared error, in 8-bit levels squared, of the average of independent renders (uint8
    images, the same frame) against the noise-free image: each pixel's sample variance across the
    renders, over their count. The tone map is taken as locally linear (its noise is small)."""
    x = np.stack(passes).astype(np.float64)
    return float(x.var(axis=0, ddof=1).mean() / len(passes))


class TracedWorld:
    """One clip's scene, camera path, G-buffer caster and (with presets) Mitsuba scenes."""

    def __init__(self, config: TracedConfig, desc: SceneDesc | None = None):
        self.config = c = config.validate()
        self.desc = desc or make_scene(c.scene, c.seed)
        if c.camera not in available_paths(self.desc):
            raise AlayaError(f"world v2: camera path {c.camera!r} is not available in this {self.desc.kind}")
        self.pose = camera_path(self.desc, c.camera, c.seed)
        self.caster = GBufferCaster(self.desc)
        first_heading = heading(*self.pose(0.0))
        self.side = c.sun_side()
        jitter = float(np.random.default_rng(c.seed + 32452843).uniform(-1, 1))
        self.azimuth = sun_azimuth(first_heading, self.side, jitter)
        self.presets = [get_traced_preset(n) for n in c.presets]
        self.lighting = [placed(p, self.azimuth) for p in self.presets]
        self.captions = {p.name: caption(p, self.desc.kind, self.side) for p in self.presets}
        self._mitsuba = None
        self._preset = None  # (k, truth scene, sun scene) of the preset rendered last

    def camera(self, index: int) -> Camera:
        eye, target = self.pose(index / self.config.fps)
        c = self.config
        return Camera.look_at(eye, target, c.width, c.height, c.fov_y)

    def mitsuba_scene(self):
        """The scene as Mitsuba shapes and textures (render.MitsubaScene), made on first use."""
        if self._mitsuba is None:
            from .render import MitsubaScene

            self._mitsuba = MitsubaScene(self.desc, self.config.variant, textures=self.caster.textures)
        return self._mitsuba

    def preset_scenes(self, k: int):
        """Preset k's Mitsuba scenes (truth, sun alone). Only one preset's are alive at a time: in the
        llvm variant every live BSDF and emitter joins each render's virtual calls, and ten presets'
        scenes made the truth 2x and the sun visibility 30x slower (making a scene takes ~0.15 s)."""
        if self._preset is None or self._preset[0] != k:
            self._preset = None  # the old scenes go before the new ones are made
            ms, light = self.mitsuba_scene(), self.lighting[k]
            self._preset = (k, ms.truth_scene(self.presets[k], light), ms.sun_scene(light.sun_direction))
        return self._preset[1:]

    def _gbuffers(self, index: int) -> tuple[GBufferFrame, Camera]:
        camera = self.camera(index)
        return self.caster.render(camera, index=index, timestamp=index / self.config.fps), camera

    def _light(self, k: int, index: int, frame: GBufferFrame, camera: Camera) -> None:
        """Preset k's truth and sun visibility of a frame, into its extras."""
        from .render import tone_map

        c, ms, light = self.config, self.mitsuba_scene(), self.lighting[k]
        truth, sun = self.preset_scenes(k)
        # pass 0 draws the seed a single-pass render draws, so passes=1 is the truth it always was
        seeds = [(c.seed * 7919 + index + 1_000_003 * j) % (1 << 31) for j in range(c.passes)]
        radiance = [ms.radiance(truth, camera, c.spp, c.max_depth, seed=seed) for seed in seeds]
        rgb = tone_map(np.mean(radiance, axis=0), frame.depth, light, self.desc.exposure)
        extras = {"rgb": rgb, "sun_visibility": ms.sun_visibility(sun, camera, light.sun_direction, frame.normal,
                                                                   np.isfinite(frame.depth))}
        if c.passes > 1:
            extras["truth_noise_mse"] = truth_noise_mse([tone_map(r, frame.depth, light, self.desc.exposure) for r in radiance])
        for key, value in extras.items():
            if k == 0:
                frame.extras[key] = value
            if len(self.presets) > 1:
                frame.extras[f"{key}_{self.presets[k].name}"] = value

    def _skies(self, frames: list[tuple[GBufferFrame, Camera]], indices) -> None:
        """Each frame's sky visibility into its extras; the sky scene is made for them and let go (no
        other scene is alive while it renders: preset_scenes)."""
        c = self.config
        if not c.sky_samples:
            return
        self._preset = None
        ms = self.mitsuba_scene()
        scene = ms.sky_scene()
        for i, (frame, camera) in zip(indices, frames):
            frame.extras["sky_visibility"] = ms.sky_visibility(scene, camera, frame.normal, np.isfinite(frame.depth),
                                                               c.sky_samples, seed=(c.seed * 7919 + i) % (1 << 31))

    def frame(self, index: int) -> tuple[GBufferFrame, Camera]:
        """G-buffers of frame `index`, its sky visibility and, per preset, its truth and sun visibility (extras)."""
        frame, camera = self._gbuffers(index)
        self._skies([(frame, camera)], [index])
        for k in range(len(self.presets)):
            self._light(k, index, frame, camera)
        return frame, camera

    def frames(self, indices) -> list[tuple[GBufferFrame, Camera]]:
        """frame() of each index, the same extras, rendered preset by preset over all of them (each
        preset's scenes made once): for blocks held in memory, such as a training clip."""
        out = [self._gbuffers(i) for i in indices]
        self._skies(out, indices)
        for k in range(len(self.presets)):
            for i, (frame, camera) in zip(indices, out):
                self._light(k, i, frame, camera)
        return out

    def metadata(self) -> dict:
        """What a clip records about the world beyond the camera: scene, sun convention, captions."""
        return {"world": "v2 (path traced)", "scene_kind": self.desc.kind, "renderer": f"mitsuba {resolve_variant(self.config.variant)}",
                "spp": self.config.spp, "passes": self.config.passes, "max_depth": self.config.max_depth,
                "sun_side": self.side,
                "sun_azimuth_world_deg": self.azimuth,
                "sun_convention": "side of the camera's first-frame heading: ahead 0, left +90, behind 180, "
                                  "right -90 degrees (counter-clockwise seen from above), within 30 degrees"}


class TracedSource:
    """World v2 as a stream source: `.info`, iteration over canonical frames, `.captions`."""

    def __init__(self, config: TracedConfig = TracedConfig()):
        self.config = config.validate()
        c = config
        self.info = StreamInfo(width=c.width, height=c.height, fps=c.fps, num_frames=c.num_frames,
                               layout="world-v2", source=f"world v2 {c.scene} seed {c.seed}")
        self.world = TracedWorld(config)
        self.captions = self.world.captions

    def __len__(self) -> int:
        return self.config.num_frames

    def frames_with_cameras(self) -> Iterator[tuple[GBufferFrame, Camera]]:
        for index in range(self.config.num_frames):
            yield self.world.frame(index)

    def __iter__(self) -> Iterator[GBufferFrame]:
        for frame, _ in self.frames_with_cameras():
            yield frame

    def stream(self, **reader_options):
        """This source as a readers.GBufferStream (options: start, stop, stride, size, resize)."""
        from ...files.readers import GBufferStream

        return GBufferStream.from_frames(self.info, self.__iter__, **reader_options)
