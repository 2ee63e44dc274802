"""The physics world: MuJoCo scenes rendered to exact G-buffers, ground-truth PBR, a playable loop.

scene.py (procedural MuJoCo scenes) -> raster.py (moderngl/EGL G-buffer pass) or raycast.py
(PyTorch ray caster: fallback and oracle) -> shading.py (ground truth from G-buffers alone) ->
world.py (WorldSource: a stream of canonical GBufferFrames) and play.py (PlayableWorld).
Heavy dependencies (mujoco, moderngl, torch) load only when these modules are imported.
"""
from .camera import CAMERA_PATHS, Camera, CameraPath
from .play import Controls, PlayableWorld
from .scene import Scene, SceneConfig, build_scene
from .shading import PRESETS, LightingPreset, get_preset, shade
from .world import World, WorldConfig, WorldSource, world_stream

__all__ = ["CAMERA_PATHS", "Camera", "CameraPath", "Controls", "PlayableWorld", "Scene", "SceneConfig",
           "build_scene", "PRESETS", "LightingPreset", "get_preset", "shade", "World", "WorldConfig", "WorldSource",
           "world_stream"]
