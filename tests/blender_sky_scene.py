"""The Blender half of tests/test_blender_addon.py's sky-pass tests: run with a Python that has `bpy`.

    .venv-bpy/bin/python tests/blender_sky_scene.py OUT_FOLDER

Installs the add-on as tests/blender_addon_scene.py does and builds, from the constants below (imported
by the test, which works out every pixel's sky from them): a ground plane with a flat roof over part
of it, open along one edge; a closed box room well below the ground; 100 m away, a long wall standing
on a ground of its own; a Sun. Frame 1 looks along the roof's open edge (the ground under the roof and
in the open, the roof's underside, the sky), frame 2 stands inside the closed room, frame 3 faces the
wall. The add-on's "Render G-Buffers (Fast)" writes OUT_FOLDER/on (the sky pass on, the option's
default), render_gbuffers(..., sky=False) OUT_FOLDER/off. Writes OUT_FOLDER/report.json (the option's
default, what each wrote, and the settings the sky pass switches for its own render, after it).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from blender_addon_scene import ADDON, empty_scene, install_addon, keyframed_camera

SIZE, FRAMES = 48, 3
LENS_MM, SENSOR_MM = 20.0, 24.0  # sensor fit VERTICAL: tan(fov_y / 2) = 12 / 20
GROUND_HALF = 20.0  # the ground spans [-20, 20]^2 at z = 0
ROOF = ((-40.0, -40.0), (0.0, 40.0))  # the roof's (x, y) extent: open along x = 0, closed far beyond the ground
ROOF_HEIGHT, ROOF_THICKNESS = 1.5, 0.1  # its underside and its top at 1.6
ROOM = ((0.0, 0.0, -50.0), 4.0)  # centre and edge of a closed cube, under the ground (nothing else sees it)
WALL = ((100.0, 5.0), (40.0, 1.0), 4.0)  # (x, y) centre, (x, y) size, height; its own ground, 40 m square, around it
# (location, rotation_euler XYZ in degrees) at frames 1, 2, 3
CAMERA = [((2.0, 12.0, 0.9), (75.0, 0.0, 180.0)),  # 2 m off the roof's edge, looking along it (-y), 15 degrees down
          ((0.0, 0.0, -49.0), (0.0, 0.0, 0.0)),  # inside the room, looking at its floor
          ((100.0, -3.0, 1.0), (90.0, 0.0, 0.0))]  # 7.5 m from the wall's face, looking at it (+y)


def main(out: Path) -> int:
    import bpy

    scene = empty_scene(bpy, SIZE, FRAMES)
    bpy.ops.mesh.primitive_plane_add(size=2 * GROUND_HALF, location=(0, 0, 0))
    (x0, y0), (x1, y1) = ROOF
    bpy.ops.mesh.primitive_cube_add(size=1.0, location=((x0 + x1) / 2, (y0 + y1) / 2, ROOF_HEIGHT + ROOF_THICKNESS / 2))
    bpy.context.object.scale = (x1 - x0, y1 - y0, ROOF_THICKNESS)
    bpy.ops.mesh.primitive_cube_add(size=ROOM[1], location=ROOM[0])
    (wx, wy), size, height = WALL
    bpy.ops.mesh.primitive_plane_add(size=2 * GROUND_HALF, location=(wx, 0, 0))
    bpy.ops.mesh.primitive_cube_add(size=1.0, location=(wx, wy, height / 2))
    bpy.context.object.scale = (*size, height)
    sun = bpy.data.objects.new("sun", bpy.data.lights.new("sun", "SUN"))  # hidden from the sky pass's render
    scene.collection.objects.link(sun)
    keyframed_camera(bpy, scene, CAMERA, SENSOR_MM, LENS_MM)
    install_addon(bpy)
    world = scene.world
    report = {"option_default": scene.alaya_flash_sky_pass}
    scene.alaya_flash_sky_pass = True  # the panel's checkbox ticked
    scene.render.filepath = str(out / "on" / "####")
    report["on"] = sorted(bpy.ops.alaya_flash.render_gbuffers())  # the panel's button, the option ticked
    report["after"] = {"world": scene.world == world, "override": scene.view_layers[0].material_override is None,
                       "sun_hidden": sun.hide_render, "samples": scene.cycles.samples,
                       "file_format": scene.render.image_settings.file_format,
                       "worlds": len(bpy.data.worlds), "materials": len(bpy.data.materials)}
    addon = sys.modules[ADDON.stem]
    report["off"] = addon.render_gbuffers(scene, str(out / "off"), sky=False)["skies"]
    (out / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
