"""Write one world v2 clip folder: the physics world's layout (streaming/world/clip.py), with the
scene description as scene.json and the captions (scene, lighting, the sun's side) in clip.json."""
from __future__ import annotations

import json
from pathlib import Path

from ...gbuffer import DEFAULT_DEPTH_NEAR, MODALITIES
from ..clip import CLIP_FORMAT, write_frames
from .source import TracedConfig, TracedWorld


def write_traced_clip(config: TracedConfig, out, overwrite: bool = False, window: int = 16, exr: bool = False,
                      progress=None) -> Path:
    """Render `config` into the clip folder `out`; returns its path. progress(1) is called per frame."""
    world = TracedWorld(config)
    # blocks of `window` frames, preset by preset (TracedWorld.frames): each preset's scenes made once a block
    frames = (f for start in range(0, config.num_frames, window)
              for f in world.frames(range(start, min(start + window, config.num_frames))))

    def finish(cameras, camera) -> dict:
        meta = _metadata(world, camera, cameras, window, exr)
        return {"clip.json": json.dumps(meta, indent=1), "scene.json": json.dumps(world.desc.to_json(), indent=1)}

    return write_frames(out, frames, config.presets, config.fps, finish, overwrite=overwrite, window=window,
                        exr=exr, progress=progress)


def _metadata(world: TracedWorld, camera, frames, window, exr) -> dict:
    c = world.config
    cam = camera.to_json()
    presets = [{"name": p.name, "prompt": world.captions[p.name], "video": f"presets/{p.name}.mp4",
                "sun_direction_world": light.sun_direction.tolist(), "lamps": p.lamps, "wet": p.wet}
               for p, light in zip(world.presets, world.lighting)]
    return {
        "format": CLIP_FORMAT,
        **world.metadata(),
        "seed": c.seed,
        "frames": len(frames),
        "fps": c.fps,
        "width": c.width,
        "height": c.height,
        "camera_path": c.camera,
        "shadows": True,
        "depth_near": DEFAULT_DEPTH_NEAR,
        "preset": presets[0]["name"] if presets else None,
        "prompt": presets[0]["prompt"] if presets else None,
        "presets": presets,
        "files": {
            "gbuffers": [f"{m}.mp4" for m in MODALITIES],
            "rgb": "rgb.mp4 (first preset, lossless)" if presets else None,
            "shadow": "shadow.mp4 the shadow pass: the first preset's sun visibility (lossless)" if presets else None,
            "npy_windows": f"windows/window-NNNN.npy uint8 (T<={window}, 5, H, W, 3)",
            "exr": "exr/NNNNNN.exr canonical float passes" if exr else None,
            "scene": "scene.json (world v2 scene description)",
            "object_id": f"extras/object_id-NNNN.npy uint16 (T<={window}, H, W), 0 = background",
            "sun_visibility": (f"extras/sun_visibility[_<preset>]-NNNN.npy float16 (T<={window}, H, W)"
                               if presets else None),
            "sky": "sky.mp4 the sky pass: the share of the sky each pixel's surface sees (lossless)" if c.sky_samples else None,
            "sky_visibility": f"extras/sky_visibility-NNNN.npy float16 (T<={window}, H, W)" if c.sky_samples else None,
        },
        "intrinsics": {"K": cam["K"], "fov_y_deg": cam["fov_y_deg"], "near": cam["near"], "far": cam["far"],
                       "width": cam["width"], "height": cam["height"]},
        "convention": cam["convention"],
        "cameras": frames,
    }
