"""The Blender half of tests/test_blender_addon.py: run with a Python that has the `bpy` wheel.

    .venv-bpy/bin/python tests/blender_addon_scene.py OUT_FOLDER

Installs and enables integrations/blender/alaya_flash_blender_addon.py with Blender's own operators (into a
throw-away user-resources folder, BLENDER_USER_RESOURCES, set by the caller), builds the scene
below (a floor, two boxes, three Principled materials with linked and constant inputs, one
emission-only material, a camera that moves and turns over 4 frames), points the render output at
OUT_FOLDER and runs the add-on's "Render G-Buffers (Fast)" operator: multilayer EXRs and
camera.json, nothing converted by hand.

The constants are imported by the test (this module imports bpy only in main()), which computes
every pixel's depth, normal and material from them by ray casting and checks what Blender wrote.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ADDON = Path(__file__).resolve().parents[1] / "integrations" / "blender" / "alaya_flash_blender_addon.py"
SIZE = 32  # width = height, pixels
FRAMES = 4
LENS_MM, SENSOR_MM = 20.0, 24.0  # sensor fit VERTICAL: fov_y = 2 atan(12 / 20) = 61.9 degrees
FLOOR_HALF = 20.0  # the floor plane spans [-20, 20]^2 at z = 0
# (location, rotation_euler XYZ in degrees) at frames 1..4, one keyframe per frame: moving and turning
CAMERA = [((0.0, -6.0, 3.0), (65.0, 0.0, 0.0)),  # 25 degrees down: the sky in the top rows
          ((1.5, -5.5, 3.2), (62.0, 0.0, 15.0)),
          ((3.0, -4.5, 3.5), (58.0, 5.0, 35.0)),  # a little roll too
          ((4.0, -3.0, 4.0), (55.0, 0.0, 55.0))]
# name: (base colour linear RGB, metallic, roughness, how the inputs are fed)
MATERIALS = {
    "floor": ((0.8, 0.2, 0.1), 0.0, 0.7, "linked"),  # Base Color from an RGB node, Roughness from a Value node
    "metal": ((0.9, 0.9, 0.9), 1.0, 0.2, "constant"),
    "plastic": ((0.1, 0.3, 0.8), 0.25, 0.45, "constant"),
}
# boxes: name -> (centre, half extents, rotation about Z in degrees, material)
BOXES = {
    "metal": ((0.0, 0.0, 0.5), (0.5, 0.5, 0.5), 0.0, "metal"),
    "plastic": ((-1.6, 0.8, 0.6), (0.6, 0.6, 0.6), 35.0, "plastic"),
    "lamp": ((2.5, 3.0, 0.25), (0.25, 0.25, 0.25), 0.0, "glow"),  # emission only: no Principled BSDF, no AOVs
}


def _material(bpy, name: str):
    mat = bpy.data.materials.new(name)
    if not mat.node_tree:  # Blender 5 materials always have nodes; 4.x needs use_nodes
        mat.use_nodes = True
    nodes, links = mat.node_tree.nodes, mat.node_tree.links
    if name == "glow":
        for n in list(nodes):
            if n.type == "BSDF_PRINCIPLED":
                nodes.remove(n)
        emit = nodes.new("ShaderNodeEmission")
        out = next(n for n in nodes if n.type == "OUTPUT_MATERIAL")
        links.new(emit.outputs[0], out.inputs["Surface"])
        return mat
    color, metallic, roughness, feed = MATERIALS[name]
    bsdf = next(n for n in nodes if n.type == "BSDF_PRINCIPLED")
    bsdf.inputs["Metallic"].default_value = metallic
    if feed == "linked":  # the add-on's AOVs must follow the links, not the sockets' default values
        rgb = nodes.new("ShaderNodeRGB")
        rgb.outputs[0].default_value = (*color, 1.0)
        links.new(rgb.outputs[0], bsdf.inputs["Base Color"])
        value = nodes.new("ShaderNodeValue")
        value.outputs[0].default_value = roughness
        links.new(value.outputs[0], bsdf.inputs["Roughness"])
        bsdf.inputs["Base Color"].default_value = (0.0, 1.0, 0.0, 1.0)
        bsdf.inputs["Roughness"].default_value = 0.0
    else:
        bsdf.inputs["Base Color"].default_value = (*color, 1.0)
        bsdf.inputs["Roughness"].default_value = roughness
    return mat


def keyframed_camera(bpy, scene, frames, sensor_mm: float, lens_mm: float):
    """The scene's camera "cam" (vertical sensor fit), keyframed at frames 1, 2, ... to `frames`' (location,
    rotation in degrees)."""
    data = bpy.data.cameras.new("cam")
    data.sensor_fit, data.sensor_height, data.lens = "VERTICAL", sensor_mm, lens_mm
    cam = bpy.data.objects.new("cam", data)
    scene.collection.objects.link(cam)
    scene.camera = cam
    for f, (loc, rot) in enumerate(frames, start=1):
        cam.location = loc
        cam.rotation_euler = tuple(math.radians(a) for a in rot)
        cam.keyframe_insert("location", frame=f)
        cam.keyframe_insert("rotation_euler", frame=f)
    return cam


def empty_scene(bpy, size: int, frames: int):
    """Blender's factory settings with nothing in them (which unloads add-ons): a size x size scene of
    frames 1..frames on the CPU, with an empty world."""
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.cycles.device = "CPU"
    scene.render.resolution_x = scene.render.resolution_y = size
    scene.render.resolution_percentage = 100
    scene.frame_start, scene.frame_end = 1, frames
    scene.world = bpy.data.worlds.new("sky")
    return scene


def install_addon(bpy) -> None:
    """Install from Disk + enable, as a user does (Edit > Preferences > Add-ons)."""
    assert bpy.ops.preferences.addon_install(filepath=str(ADDON)) == {"FINISHED"}
    assert bpy.ops.preferences.addon_enable(module=ADDON.stem) == {"FINISHED"}


def build_scene(bpy):
    scene = empty_scene(bpy, SIZE, FRAMES)
    bpy.ops.mesh.primitive_plane_add(size=2 * FLOOR_HALF, location=(0, 0, 0))
    bpy.context.object.data.materials.append(_material(bpy, "floor"))
    for centre, half, rot_z, mat in BOXES.values():
        bpy.ops.mesh.primitive_cube_add(size=1.0, location=centre, rotation=(0, 0, math.radians(rot_z)))
        bpy.context.object.scale = tuple(2 * h for h in half)
        bpy.context.object.data.materials.append(_material(bpy, mat))
    light = bpy.data.objects.new("sun", bpy.data.lights.new("sun", "SUN"))
    scene.collection.objects.link(light)
    cam = keyframed_camera(bpy, scene, CAMERA, SENSOR_MM, LENS_MM)
    cam.data.dof.use_dof, cam.data.dof.focus_distance, cam.data.dof.aperture_fstop = True, 2.0, 0.5  # off, then on
    # as a user might have it: the fast render switches to Cycles, 1 sample, no motion blur, then back
    scene.render.use_motion_blur = True
    scene.cycles.samples = 64
    scene.render.engine = "BLENDER_WORKBENCH"
    return scene


def main(out: Path) -> int:
    import bpy

    scene = build_scene(bpy)  # first: factory settings unload add-ons
    install_addon(bpy)
    scene.render.filepath = str(out / "####")  # Output Properties > Output
    result = bpy.ops.alaya_flash.render_gbuffers()  # the panel's "Render G-Buffers (Fast)" button
    report = {"result": sorted(result), "blender": bpy.app.version_string,
              "after": {"engine": scene.render.engine, "samples": scene.cycles.samples,
                        "motion_blur": scene.render.use_motion_blur, "dof": scene.camera.data.dof.use_dof,
                        "filter_width": scene.cycles.filter_width,
                        "filepath": scene.render.filepath, "frame": scene.frame_current,
                        "file_format": scene.render.image_settings.file_format},
              "aovs": sorted(a.name for a in scene.view_layers[0].aovs),
              "operators": sorted(dir(bpy.ops.alaya_flash)), "panel": hasattr(bpy.types, "ALAYA_PT_panel")}
    addon = sys.modules[ADDON.stem]  # the installed copy; its function, as a headless script calls it
    direct = addon.render_gbuffers(scene, str(out.parent / "direct"))
    report["direct"] = {"frames": [Path(f).name for f in direct["frames"]], "camera": direct["camera"],
                        "skipped": direct["skipped"], "filepath": scene.render.filepath,
                        "samples": scene.cycles.samples}
    cam, scene.camera = scene.camera, None
    try:
        addon.render_gbuffers(scene, str(out.parent / "no-camera"))
    except RuntimeError as err:
        report["no_camera"] = {"error": str(err), "samples": scene.cycles.samples, "engine": scene.render.engine}
    scene.camera = cam
    (out.parent / f"{out.name}.report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
