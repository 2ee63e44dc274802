"""Render the Blender fixtures under tests/data/engines/ with real Blender (the `bpy` wheel).

    python -m venv /tmp/bpyenv && /tmp/bpyenv/bin/pip install bpy==5.0.1
    /tmp/bpyenv/bin/python integrations/blender/blender_fixtures.py     # -> tests/data/engines/blender5 (Blender 5.x)
    python -m venv /tmp/bpy4env && /tmp/bpy4env/bin/pip install bpy==4.5.4
    /tmp/bpy4env/bin/python integrations/blender/blender_fixtures.py    # -> tests/data/engines/blender4 (Blender 4.x)

A 16x16, 3-frame Cycles render of a known scene, set up by the add-on
(integrations/blender/alaya_flash_blender_addon.py) the way docs/gbuffers.md tells users to export from
Blender: multilayer EXR (Blender 5 writes one part per pass) with the Depth, Normal and
Diffuse Color passes, the Combined image, and three shader AOVs (albedo, metallic, roughness)
fed from each material's base colour, metallic and roughness; plus camera.json with the camera's
matrix_world per frame. tests/test_engines_blender.py reads it and checks the values against
the scene below (depth of the floor seen straight down, normals, the materials' constants).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import bpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import alaya_flash_blender_addon as addon  # noqa: E402  (the add-on's setup is what users run)

ROOT = Path(__file__).resolve().parents[2]
SIZE = 16
CAMERA_HEIGHT = 5.0
# (location, rotation_euler in degrees) per frame: straight down, then tilted and turned
CAMERA_FRAMES = [((0.0, 0.0, CAMERA_HEIGHT), (0.0, 0.0, 0.0)),
                 ((0.0, -2.0, 4.0), (30.0, 0.0, 0.0)),
                 ((1.5, -2.0, 3.5), (75.0, 0.0, 30.0))]  # the horizon: sky in the top rows
MATERIALS = {  # name: (base colour linear RGB, metallic, roughness)
    "floor": ((0.8, 0.2, 0.1), 0.0, 0.7),
    "metal": ((0.9, 0.9, 0.9), 1.0, 0.2),
}


def principled(name: str, color, metallic: float, roughness: float):
    """A new material whose Principled BSDF has these constants (also integrations/blender/blender_comparison.py's)."""
    mat = bpy.data.materials.new(name)
    if not mat.node_tree:  # Blender 5 materials always have nodes; 4.x needs use_nodes
        mat.use_nodes = True
    bsdf = next(n for n in mat.node_tree.nodes if n.type == "BSDF_PRINCIPLED")
    bsdf.inputs["Base Color"].default_value = (*color, 1.0)
    bsdf.inputs["Metallic"].default_value = metallic
    bsdf.inputs["Roughness"].default_value = roughness
    return mat


def material(name: str):
    color, metallic, roughness = MATERIALS[name]
    mat = principled(name, color, metallic, roughness)
    bsdf = next(n for n in mat.node_tree.nodes if n.type == "BSDF_PRINCIPLED")
    if name == "floor":  # a linked input: the add-on's AOV must follow the link, not the default value
        value = mat.node_tree.nodes.new("ShaderNodeValue")
        value.outputs[0].default_value = roughness
        bsdf.inputs["Roughness"].default_value = 0.0
        mat.node_tree.links.new(value.outputs[0], bsdf.inputs["Roughness"])
    return mat


def main(out: Path) -> int:
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.cycles.device = "CPU"
    scene.cycles.samples = 4
    scene.cycles.use_denoising = False
    scene.render.resolution_x = scene.render.resolution_y = SIZE
    scene.render.resolution_percentage = 100
    scene.render.fps = 24
    scene.frame_start, scene.frame_end = 1, len(CAMERA_FRAMES)
    scene.world = bpy.data.worlds.new("sky")

    bpy.ops.mesh.primitive_plane_add(size=40.0, location=(0, 0, 0))
    bpy.context.object.data.materials.append(material("floor"))
    bpy.ops.mesh.primitive_cube_add(size=1.0, location=(0.0, 0.0, 0.5))
    bpy.context.object.data.materials.append(material("metal"))
    cam_data = bpy.data.cameras.new("cam")
    cam_data.sensor_fit = "VERTICAL"  # so angle_y is the image's vertical field of view
    cam = bpy.data.objects.new("cam", cam_data)
    scene.collection.objects.link(cam)
    scene.camera = cam
    for f, (loc, rot) in enumerate(CAMERA_FRAMES, start=1):
        cam.location = loc
        cam.rotation_euler = tuple(math.radians(a) for a in rot)
        cam.keyframe_insert("location", frame=f)
        cam.keyframe_insert("rotation_euler", frame=f)

    layer = scene.view_layers[0]
    layer.use_pass_diffuse_color = True  # to show what Diffuse Color holds on metals (zero)
    assert not addon.setup_scene(scene)  # the add-on: passes, AOVs and their nodes, multilayer EXR
    out.mkdir(parents=True, exist_ok=True)
    scene.render.filepath = str(out / "####")
    bpy.ops.render.render(animation=True)
    addon.write_camera_json(scene, str(out))
    print(f"wrote {len(CAMERA_FRAMES)} frames and camera.json to {out} (Blender {bpy.app.version_string})")
    return 0


if __name__ == "__main__":
    default = ROOT / "tests" / "data" / "engines" / f"blender{bpy.app.version[0]}"
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
