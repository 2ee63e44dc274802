"""The Blender half of tests/test_blender_addon.py's shadow-pass tests: run with a Python that has `bpy`.

    .venv-bpy/bin/python tests/blender_shadow_scene.py OUT_FOLDER

Installs the add-on as tests/blender_addon_scene.py does, builds a floor, a 1 m cube on it and a Sun
light at a known angle (constants below, imported by the test), looking straight down; the add-on's
"Render G-Buffers (Fast)" writes OUT_FOLDER/sun (with the shadow pass, the option's default); then,
the Sun removed, OUT_FOLDER/no-sun. Writes OUT_FOLDER/report.json.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from blender_addon_scene import ADDON, empty_scene, install_addon

SIZE, FRAMES = 32, 2
CAMERA_HEIGHT, LENS_MM, SENSOR_MM = 4.0, 20.0, 24.0  # straight down; fov_y = 2 atan(12 / 20)
CUBE = 1.0  # edge, metres, standing on the floor at the origin
SUN_ELEVATION_DEG = 45.0  # the sun in the -x direction: the cube's shadow lies on x in [0.5, 1.5], |y| <= 0.5


def main(out: Path) -> int:
    import bpy

    scene = empty_scene(bpy, SIZE, FRAMES)
    bpy.ops.mesh.primitive_plane_add(size=20.0, location=(0, 0, 0))
    bpy.ops.mesh.primitive_cube_add(size=CUBE, location=(0, 0, CUBE / 2))
    sun = bpy.data.objects.new("sun", bpy.data.lights.new("sun", "SUN"))
    sun.rotation_euler = (0.0, -math.radians(90.0 - SUN_ELEVATION_DEG), 0.0)  # +Z (towards the sun) tilted to -x
    scene.collection.objects.link(sun)
    cam_data = bpy.data.cameras.new("cam")
    cam_data.sensor_fit, cam_data.sensor_height, cam_data.lens = "VERTICAL", SENSOR_MM, LENS_MM
    cam = bpy.data.objects.new("cam", cam_data)
    cam.location = (0.0, 0.0, CAMERA_HEIGHT)
    scene.collection.objects.link(cam)
    scene.camera = cam
    install_addon(bpy)
    report = {"option_default": scene.alaya_flash_shadow_pass}
    scene.render.filepath = str(out / "sun" / "####")
    report["sun"] = sorted(bpy.ops.alaya_flash.render_gbuffers())  # the panel's button, the option as it is
    addon = sys.modules[ADDON.stem]
    report["off"] = addon.render_gbuffers(scene, str(out / "off"), shadow=False)["shadows"]
    bpy.data.objects.remove(sun)
    scene.render.filepath = str(out / "no-sun" / "####")
    report["no_sun"] = sorted(bpy.ops.alaya_flash.render_gbuffers())
    (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
