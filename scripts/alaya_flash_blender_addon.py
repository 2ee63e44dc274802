"""Blender add-on: set a scene up to export G-buffers alaya-flash reads (docs/gbuffers.md, Blender).

Install: Edit > Preferences > Add-ons > Install from Disk > this file (Blender 4.2+ and 5.x).
Then Render Properties > "Alaya Flash G-buffers" panel:

  Set Up G-Buffer Export  enables the Depth and Normal passes, adds the Shader AOVs albedo (colour),
                          metallic and roughness (values), adds to every node material an AOV Output
                          per AOV fed from its Principled BSDF's Base Color, Metallic and Roughness
                          (the same link, or the constant), and sets the output to 32-bit ZIP
                          multilayer OpenEXR, one file per frame.
  Write camera.json       writes the active camera's matrix_world for every frame of the range
                          into camera.json beside the output (also done after each animation
                          render while the add-on is enabled).

The same functions run headless with the `bpy` wheel (scripts/blender_fixtures.py uses them to
render tests/data/engines/). Materials without a Principled BSDF get no AOV Output: their pixels
read albedo/metallic/roughness 0, which `alaya-flash gbuffers info` shows.
"""
from __future__ import annotations

import json
import math
import os

import bpy

bl_info = {
    "name": "Alaya Flash G-buffers",
    "author": "alaya-flash",
    "version": (0, 1, 0),
    "blender": (4, 2, 0),
    "location": "Properties > Render > Alaya Flash G-buffers",
    "description": "Export depth, normals, albedo, metallic and roughness as multilayer EXR + camera.json for alaya-flash",
    "category": "Render",
}

AOVS = (("albedo", "COLOR", "Base Color", "Color"), ("metallic", "VALUE", "Metallic", "Value"),
        ("roughness", "VALUE", "Roughness", "Value"))
NODE_LABEL = "alaya-flash AOV"


def setup_view_layer(layer) -> None:
    layer.use_pass_z = True
    layer.use_pass_normal = True
    have = {a.name for a in layer.aovs}
    for name, kind, _, _ in AOVS:
        if name not in have:
            aov = layer.aovs.add()
            aov.name, aov.type = name, kind


def setup_material(mat) -> bool:
    """Add (or refresh) the AOV Output nodes of one material; False if it has no Principled BSDF."""
    if mat.node_tree is None:
        if bpy.app.version >= (5, 0, 0):
            return False
        mat.use_nodes = True
    nodes, links = mat.node_tree.nodes, mat.node_tree.links
    bsdf = next((n for n in nodes if n.type == "BSDF_PRINCIPLED"), None)
    if bsdf is None:
        return False
    for n in [n for n in nodes if n.type == "OUTPUT_AOV" and n.label == NODE_LABEL]:
        nodes.remove(n)
    for k, (name, _, socket, aov_input) in enumerate(AOVS):
        out = nodes.new("ShaderNodeOutputAOV")
        out.aov_name, out.label = name, NODE_LABEL
        out.location = (bsdf.location.x + 300, bsdf.location.y - 120 * (k + 1))
        src = bsdf.inputs[socket]
        if src.is_linked:
            links.new(src.links[0].from_socket, out.inputs[aov_input])
        elif aov_input == "Color":
            out.inputs["Color"].default_value = src.default_value
        else:
            out.inputs["Value"].default_value = src.default_value
    return True


def setup_output(scene) -> None:
    settings = scene.render.image_settings
    if hasattr(settings, "media_type"):  # Blender 5: multilayer is a media type (written one part per pass)
        settings.media_type = "MULTI_LAYER_IMAGE"
    settings.file_format = "OPEN_EXR_MULTILAYER"
    settings.color_depth = "32"
    settings.exr_codec = "ZIP"


def setup_scene(scene) -> list[str]:
    """Everything Set Up does; returns the names of materials left without AOVs."""
    for layer in scene.view_layers:
        setup_view_layer(layer)
    skipped = [m.name for m in bpy.data.materials if not setup_material(m)]
    setup_output(scene)
    return skipped


def camera_json(scene) -> dict:
    cam = scene.camera
    if cam is None:
        raise RuntimeError("the scene has no active camera")
    current = scene.frame_current
    mats = []
    try:
        for f in range(scene.frame_start, scene.frame_end + 1, scene.frame_step):
            scene.frame_set(f)
            mats.append([list(row) for row in cam.matrix_world])
    finally:
        scene.frame_set(current)
    data = {"camera_to_world": mats, "camera_axes": "opengl", "blender": bpy.app.version_string,
            "frames": [scene.frame_start, scene.frame_end, scene.frame_step]}
    if cam.type == "CAMERA" and cam.data.type == "PERSP":
        data["fov_y_deg"] = math.degrees(_fov_y(scene, cam.data))
    return data


def _fov_y(scene, cam) -> float:
    """Vertical field of view of the rendered image (sensor fit and aspect ratio applied)."""
    w = scene.render.resolution_x * scene.render.pixel_aspect_x
    h = scene.render.resolution_y * scene.render.pixel_aspect_y
    fit = cam.sensor_fit if cam.sensor_fit != "AUTO" else ("HORIZONTAL" if w >= h else "VERTICAL")
    if fit == "VERTICAL":
        sensor_h = cam.sensor_height if cam.sensor_fit == "VERTICAL" else cam.sensor_width
    else:
        sensor_w = cam.sensor_width
        sensor_h = sensor_w * h / w
    return 2 * math.atan(sensor_h / 2 / cam.lens)


def output_folder(scene) -> str:
    return os.path.dirname(bpy.path.abspath(scene.render.frame_path(frame=scene.frame_start)))


def write_camera_json(scene, folder: str | None = None) -> str:
    folder = folder or output_folder(scene)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "camera.json")
    with open(path, "w") as f:
        json.dump(camera_json(scene), f)
    return path


class ALAYA_OT_setup(bpy.types.Operator):
    bl_idname = "alaya_flash.setup_export"
    bl_label = "Set Up G-Buffer Export"
    bl_description = "Enable Depth/Normal passes, albedo/metallic/roughness AOVs and multilayer EXR output"

    def execute(self, context):
        skipped = setup_scene(context.scene)
        if skipped:
            self.report({"WARNING"}, f"no Principled BSDF (no AOVs): {', '.join(skipped)}")
        else:
            self.report({"INFO"}, "G-buffer export set up")
        return {"FINISHED"}


class ALAYA_OT_camera(bpy.types.Operator):
    bl_idname = "alaya_flash.write_camera"
    bl_label = "Write camera.json"
    bl_description = "Write the active camera's matrix_world per frame beside the render output"

    def execute(self, context):
        try:
            path = write_camera_json(context.scene)
        except (RuntimeError, OSError) as err:
            self.report({"ERROR"}, str(err))
            return {"CANCELLED"}
        self.report({"INFO"}, f"wrote {path}")
        return {"FINISHED"}


class ALAYA_PT_panel(bpy.types.Panel):
    bl_label = "Alaya Flash G-buffers"
    bl_space_type, bl_region_type, bl_context = "PROPERTIES", "WINDOW", "render"

    def draw(self, context):
        self.layout.operator(ALAYA_OT_setup.bl_idname)
        self.layout.operator(ALAYA_OT_camera.bl_idname)


@bpy.app.handlers.persistent
def _after_render(scene, *_):
    if scene.render.image_settings.file_format == "OPEN_EXR_MULTILAYER" and scene.camera is not None:
        write_camera_json(scene)


CLASSES = (ALAYA_OT_setup, ALAYA_OT_camera, ALAYA_PT_panel)


def register():
    for c in CLASSES:
        bpy.utils.register_class(c)
    bpy.app.handlers.render_complete.append(_after_render)


def unregister():
    if _after_render in bpy.app.handlers.render_complete:
        bpy.app.handlers.render_complete.remove(_after_render)
    for c in reversed(CLASSES):
        bpy.utils.unregister_class(c)
