"""Write one physics-world clip folder with the project's sinks (layout: commands/world.py).

The folder is assembled in OUT.tmp and moved into place at the end, so OUT appears whole or not
at all; on any error every sink is aborted and nothing is left behind.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import DEFAULT_DEPTH_NEAR, LIGHT_PASS_WORLD_KEYS, LIGHT_PASSES, MODALITIES
from ..files.sinks import AtomicOutput, ExrSequenceSink, Mp4Sink, NpyWindowSink, TeacherMp4Sink
from .shading import get_preset
from .world import World, WorldConfig

CLIP_FORMAT = "alaya-flash world clip v1"


def write_clip(config: WorldConfig, out, overwrite: bool = False, window: int = 16, exr: bool = False,
               progress=None) -> Path:
    """Render `config` into the clip folder `out`; returns its path. progress(1) is called per frame."""
    config.validate()
    if config.num_frames is None:
        raise AlayaError("world: a clip needs a frame count (num_frames is None)")
    world = None

    def frames():
        nonlocal world
        world = World(config)
        for _ in range(config.num_frames):
            frame, camera = world.frame()
            world.advance()
            yield frame, camera

    def finish(cameras, camera) -> dict:
        meta = _metadata(config, camera, cameras, window, exr, world.backend, DEFAULT_DEPTH_NEAR)
        return {"clip.json": json.dumps(meta, indent=1), "scene.xml": world.scene.xml}

    try:
        return write_frames(out, frames(), config.presets, config.fps, finish, overwrite=overwrite, window=window,
                            exr=exr, progress=progress)
    finally:
        if world is not None:
            world.close()


def write_frames(out, frames, presets, fps, finish, overwrite: bool = False, window: int = 16, exr: bool = False,
                 progress=None) -> Path:
    """The clip folder of any world: `frames` yields (GBufferFrame, Camera) with the extras of
    world.py ("rgb", "rgb_<preset>" when several presets, "object_id", "sun_visibility[_<preset>]": the
    first preset's becomes the shadow pass, shadow.mp4 and the EXRs' shadow layer; "sky_visibility" (world
    v2) the sky pass, sky.mp4 and a sky layer);
    `finish(cameras, last_camera)` returns the text files to add ({name: text}, e.g. clip.json).
    Assembled in OUT.tmp and moved into place at the end; on any error nothing is left behind."""
    depth_near = DEFAULT_DEPTH_NEAR
    dst = AtomicOutput(out, overwrite=overwrite, is_dir=True)
    tmp = dst.tmp
    sinks = {"teacher": TeacherMp4Sink(tmp / "_teacher", fps=fps, depth_near=depth_near),
             "windows": NpyWindowSink(tmp / "windows", window=window, depth_near=depth_near)}
    for name in presets:
        sinks[f"preset:{name}"] = Mp4Sink(tmp / "presets" / f"{name}.mp4", fps=fps)
    if exr:
        sinks["exr"] = ExrSequenceSink(tmp / "exr", depth_near=depth_near)
    frames_meta, camera = [], None
    extras = _ExtrasWindows(tmp / "extras", window)
    try:
        for frame, camera in frames:
            rgb = frame.extras.get("rgb")
            sinks["teacher"].write(rgb=rgb, gbuffer=frame)
            sinks["windows"].write(rgb=rgb, gbuffer=frame)
            for name in presets:
                key = f"rgb_{name}" if len(presets) > 1 else "rgb"
                sinks[f"preset:{name}"].write(rgb=frame.extras[key])
            if exr:
                sinks["exr"].write(gbuffer=frame)
            extras.add(frame.extras)
            frames_meta.append({"index": frame.index, "timestamp": frame.timestamp,
                                "world_to_camera": camera.world_to_camera.tolist(),
                                "camera_to_world": camera.camera_to_world.tolist()})
            if progress:
                progress(1)
        for sink in sinks.values():
            sink.close()
        extras.flush()
        for name in MODALITIES + ("rgb",) + LIGHT_PASSES:  # shadow.mp4: the first preset's sun visibility, with shadows
            if (tmp / "_teacher" / f"{name}.mp4").exists():
                os.replace(tmp / "_teacher" / f"{name}.mp4", tmp / f"{name}.mp4")
        os.rmdir(tmp / "_teacher")
        for name, text in finish(frames_meta, camera).items():
            (tmp / name).write_text(text)
    except BaseException:
        for sink in sinks.values():
            sink.abort()
        dst.abort()
        raise
    return dst.commit()


def _metadata(config: WorldConfig, camera, frames, window, exr, backend, depth_near) -> dict:
    presets = [get_preset(n) for n in config.presets]
    cam = camera.to_json()
    return {
        "format": CLIP_FORMAT,
        "seed": config.seed,
        "frames": len(frames),
        "fps": config.fps,
        "width": config.width,
        "height": config.height,
        "objects": config.num_objects,
        "camera_path": config.camera,
        "renderer": backend,
        "shadows": config.shadows,
        "depth_near": depth_near,
        "preset": presets[0].name if presets else None,
        "prompt": presets[0].prompt if presets else None,
        "presets": [{"name": p.name, "prompt": p.prompt, "video": f"presets/{p.name}.mp4",
                     "sun_direction_world": p.sun_direction.tolist()} for p in presets],
        "files": {
            "gbuffers": [f"{m}.mp4" for m in MODALITIES],
            "rgb": "rgb.mp4 (first preset, lossless)" if presets else None,
            "shadow": "shadow.mp4 the shadow pass: the first preset's sun visibility (lossless)" if config.shadows else None,
            "npy_windows": f"windows/window-NNNN.npy uint8 (T<={window}, 5, H, W, 3)",
            "exr": "exr/NNNNNN.exr canonical float passes" if exr else None,
            "scene": "scene.xml (MJCF)",
            "object_id": f"extras/object_id-NNNN.npy uint16 (T<={window}, H, W), geom id + 1, 0 = background",
            "sun_visibility": (f"extras/sun_visibility[_<preset>]-NNNN.npy float16 (T<={window}, H, W)"
                               if config.shadows else None),
        },
        "intrinsics": {"K": cam["K"], "fov_y_deg": cam["fov_y_deg"], "near": cam["near"], "far": cam["far"],
                       "width": cam["width"], "height": cam["height"]},
        "convention": cam["convention"],
        "cameras": frames,
    }


class _ExtrasWindows:
    """Per-pixel extras the sinks do not carry, saved beside the npy windows in the same windows:
    object_id-NNNN.npy uint16 (T, H, W) and, with shadows, sun_visibility[_<preset>]-NNNN.npy
    float16 (T, H, W) (a sky pass: sky_visibility-NNNN.npy, likewise). Written into the clip's temporary
    folder, so they commit with it."""

    def __init__(self, folder: Path, window: int):
        self.folder, self.window, self.k = folder, window, 0
        self.buf: dict[str, list] = {}

    def add(self, extras: dict) -> None:
        per_preset = any(k.startswith("sun_visibility_") for k in extras)
        for key, value in extras.items():
            if key == "sun_visibility" and per_preset:
                continue  # the same array as sun_visibility_<first preset>
            if key == "object_id":
                self.buf.setdefault(key, []).append(value.astype(np.uint16))
            elif key.startswith(tuple(LIGHT_PASS_WORLD_KEYS.values())):
                self.buf.setdefault(key, []).append(value.astype(np.float16))
        if self.buf and len(next(iter(self.buf.values()))) == self.window:
            self.flush()

    def flush(self) -> None:
        if not self.buf or not next(iter(self.buf.values())):
            return
        self.folder.mkdir(exist_ok=True)
        for key, frames in self.buf.items():
            np.save(self.folder / f"{key}-{self.k:04d}.npy", np.stack(frames))
        self.buf, self.k = {}, self.k + 1
