"""Blender add-on: set a scene up to export G-buffers alaya-flash reads (docs/gbuffers.md, Blender).

Install: Edit > Preferences > Add-ons > Install from Disk > this file (Blender 4.2+ and 5.x).
Then Render Properties > "Alaya Flash G-buffers" panel:

  Set Up G-Buffer Export  enables the Depth and Normal passes, adds the Shader AOVs albedo (colour),
                          metallic and roughness (values), adds to every node material an AOV Output
                          per AOV fed from its Principled BSDF's Base Color, Metallic and Roughness
                          (the same link, or the constant), and sets the output to 32-bit ZIP
                          multilayer OpenEXR, one file per frame.
  Shadow pass (Sun)       on (the default) and the scene has a Sun light: the fast render also writes
                          shadow_NNNN.exr beside each frame, the first Sun's visibility per pixel
                          (1 lit, 0 in shadow; ray cast: shadow_pass() below).
  Sky Pass                on (the default): the fast render also writes sky_NNNN.exr, the share of the
                          sky each pixel's surface sees (world v2's sky visibility: 1 open, 0 in a
                          closed room, 1 on the background), from a second Cycles render of 16 samples,
                          denoised: sky_pass() below. 3.3 s a 256x256 frame on 2 shared CPU cores,
                          rms error 0.011 (blender_comparison.py scene, sky-check; docs/gbuffers.md).
  Write camera.json       writes the active camera's matrix_world for every frame of the range
                          into camera.json beside the output (also done after each animation
                          render while the add-on is enabled).
  Render G-Buffers (Fast) sets up as above, then renders the frame range with Cycles at 1 sample,
                          no bounces, a pixel-centre filter, no denoising, motion blur or depth of
                          field (the G-buffer passes are exact first-hit values; the Combined image
                          is a noisy direct-light preview), writes camera.json, and puts the scene's
                          settings back. One frame per step: the UI stays live, Esc stops it.

The same functions run headless with the `bpy` wheel:

    import alaya_flash_blender_addon as addon
    addon.render_gbuffers(bpy.context.scene, "out/shot")   # setup + fast render + camera.json
    # then: alaya-flash render out/shot --prompt "..." --out shot.mp4

(integrations/blender/blender_fixtures.py and tests/blender_addon_scene.py use them). Materials without a
Principled BSDF get no AOV Output: their pixels read albedo/metallic/roughness 0, which
`alaya-flash gbuffers info` shows.
"""
from __future__ import annotations

import json
import math
import os

import bpy

bl_info = {
    "name": "Alaya Flash G-buffers",
    "author": "alaya-flash",
    "version": (0, 2, 0),
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
        out.label = NODE_LABEL
        setattr(out, "aov_name" if hasattr(out, "aov_name") else "name", name)  # 3.x: name
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
    # Blender 5: multilayer is a media type (written one part per pass)
    _image_format(scene.render.image_settings, media_type="MULTI_LAYER_IMAGE", file_format="OPEN_EXR_MULTILAYER",
                  color_depth="32", exr_codec="ZIP")


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


def sun_light(scene):
    """The scene's first Sun light object (in scene.objects order), or None."""
    return next((o for o in scene.objects if o.type == "LIGHT" and o.data.type == "SUN"), None)


def camera_hits(scene, depsgraph):
    """The image's (height, width) and, for each pixel centre whose camera ray hits a surface, (row,
    column, ray direction, hit point, normal turned towards the camera, object): one scene.ray_cast a
    pixel, through the centres the fast render's passes hold. Row 0 at the top."""
    from mathutils import Vector

    cam = scene.camera
    if cam is None:
        raise RuntimeError("the scene has no active camera")
    pct = scene.render.resolution_percentage / 100
    w, h = max(1, round(scene.render.resolution_x * pct)), max(1, round(scene.render.resolution_y * pct))
    corners = list(cam.data.view_frame(scene=scene))  # camera-space image corners at z = -d
    xs, ys, z = [v.x for v in corners], [v.y for v in corners], corners[0].z
    left, right, bottom, top = min(xs), max(xs), min(ys), max(ys)
    rot, origin = cam.matrix_world.to_3x3(), cam.matrix_world.translation.copy()

    def hits():
        for i in range(h):
            py = top - (i + 0.5) / h * (top - bottom)
            for j in range(w):
                d = (rot @ Vector((left + (j + 0.5) / w * (right - left), py, z))).normalized()
                hit, loc, normal, _, obj, _ = scene.ray_cast(depsgraph, origin, d)
                if hit:
                    yield i, j, d, loc, (-normal if normal.dot(d) > 0 else normal), obj

    return (h, w), hits()


def shadow_pass(scene, depsgraph, to_sun=None, objects: bool = False):
    """The sun's visibility at the surface each pixel centre sees: float32 (H, W), row 0 at the top, 1 where
    a ray from the hit point (1 mm off the surface) towards the sun hits nothing, 0 in shadow, on faces
    turned from the sun and on the sky. to_sun: world direction towards the sun (default: the first Sun
    light's +Z). Hard shadows (the sun's angle is ignored); one scene.ray_cast pair per pixel, in Python.
    With objects=True also returns the name of the object each pixel sees (None: sky), (H, W) lists."""
    import numpy as np
    from mathutils import Vector

    if to_sun is None:
        sun = sun_light(scene)
        if sun is None:
            raise RuntimeError("the scene has no Sun light")
        to_sun = sun.matrix_world.to_3x3() @ Vector((0.0, 0.0, 1.0))  # a sun shines down its local -Z
    to_sun = Vector(to_sun).normalized()
    (h, w), hits = camera_hits(scene, depsgraph)
    vis = np.zeros((h, w), np.float32)
    names = [[None] * w for _ in range(h)]
    for i, j, _, loc, normal, obj in hits:
        names[i][j] = obj.name
        if normal.dot(to_sun) > 0 and not scene.ray_cast(depsgraph, loc + normal * 1e-3, to_sun)[0]:
            vis[i, j] = 1.0
    return (vis, names) if objects else vis


SKY_SAMPLES = 16  # Cycles samples a pixel for the sky pass, then denoised (docs/gbuffers.md: its noise and cost)


def sky_pass(scene, depsgraph, samples: int = SKY_SAMPLES, denoise: bool = True):
    """The share of the sky the surface at each pixel centre sees: float32 (H, W) in [0, 1], row 0 at the
    top; world v2's sky visibility (streaming/world/traced/render.py), 1 on the background.

    Cycles renders the view layer with every material a white Lambert (its material override), the
    lights hidden and a world of radiance 1 above the horizon (world +Z) and 0 below, direct light only,
    `samples` a pixel through the pixel centre (FAST_SETTINGS), denoised by OpenImageDenoise: per pixel the
    cosine-weighted share of rays from the surface that leave above the horizon and hit nothing. That is
    divided by what an unblocked surface of the same normal sees, (1 + n.z) / 2, at least 1/4 (surfaces
    facing down), with the normal of one scene.ray_cast per pixel centre, and clipped to [0, 1]. The
    render goes to a temporary single-layer EXR; every setting it changes is put back."""
    import tempfile

    import numpy as np

    layer = scene.view_layers[depsgraph.view_layer.name]
    world, white = _horizon_world(), _white_material()
    settings = scene.render.image_settings
    with tempfile.TemporaryDirectory(prefix="alaya-flash-sky-") as tmp:
        path = os.path.join(tmp, "sky.exr")
        changes = [(_owner(scene, o), a, v) for o, a, v in FAST_SETTINGS]
        changes += [(scene.cycles, "samples", int(samples)), (scene.cycles, "use_denoising", bool(denoise)),
                    (scene.cycles, "film_exposure", 1.0), (scene.cycles, "sample_clamp_direct", 0.0),
                    (scene.render, "use_compositing", False), (scene.render, "use_sequencer", False),
                    (scene.render, "filepath", path), (scene, "world", world), (layer, "material_override", white)]
        if denoise:
            changes += [(scene.cycles, "denoiser", "OPENIMAGEDENOISE"),
                        (scene.cycles, "denoising_input_passes", "RGB_ALBEDO_NORMAL"),
                        (scene.cycles, "denoising_prefilter", "ACCURATE")]
        if hasattr(settings, "color_management"):  # the file in the scene's linear space, as rendered
            changes.append((settings, "color_management", "FOLLOW_SCENE"))
        changes += [(o, "hide_render", True) for o in scene.objects if o.type == "LIGHT"]
        saved, image = [], {}
        try:
            image = _image_format(settings, media_type="IMAGE", file_format="OPEN_EXR", color_depth="32",
                                  color_mode="RGB")
            _switch([c for c in changes if c[0] is not None], saved)
            bpy.ops.render.render(write_still=True, layer=layer.name)
            img = bpy.data.images.load(path, check_existing=False)
            try:
                w, h = img.size
                rgba = np.empty(w * h * 4, np.float32)
                img.pixels.foreach_get(rgba)
            finally:
                bpy.data.images.remove(img)
        finally:
            _put_back(saved)
            _image_format(settings, **image)  # the media type first
            bpy.data.worlds.remove(world)
            bpy.data.materials.remove(white)
    seen = rgba.reshape(h, w, 4)[::-1, :, :3].mean(-1)  # Blender images start at the bottom row
    (rows, cols), hits = camera_hits(scene, depsgraph)
    if (rows, cols) != (h, w):
        raise RuntimeError(f"the sky render is {w}x{h}, the camera's image {cols}x{rows}")
    vis = np.ones((h, w), np.float32)
    for i, j, _, _, normal, _ in hits:
        vis[i, j] = seen[i, j] / max((1.0 + normal.z) / 2, 0.25)
    return np.clip(vis, 0.0, 1.0)


def _horizon_world():
    """A new world: radiance 1 where the direction points above the horizon (world +Z), 0 below."""
    world = bpy.data.worlds.new("alaya-flash sky pass")
    if world.node_tree is None:  # Blender 4.x
        world.use_nodes = True
    nodes, links = world.node_tree.nodes, world.node_tree.links
    background = next(n for n in nodes if n.type == "BACKGROUND")
    background.inputs["Color"].default_value = (1.0, 1.0, 1.0, 1.0)
    coords, xyz, above = nodes.new("ShaderNodeTexCoord"), nodes.new("ShaderNodeSeparateXYZ"), nodes.new("ShaderNodeMath")
    above.operation, above.inputs[1].default_value = "GREATER_THAN", 0.0
    links.new(coords.outputs["Generated"], xyz.inputs[0])  # a world's Generated: the direction
    links.new(xyz.outputs["Z"], above.inputs[0])
    links.new(above.outputs[0], background.inputs["Strength"])
    return world


def _white_material():
    """A new material: a white Diffuse BSDF alone."""
    mat = bpy.data.materials.new("alaya-flash sky pass")
    if mat.node_tree is None:  # Blender 4.x
        mat.use_nodes = True
    nodes = mat.node_tree.nodes
    for n in [n for n in nodes if n.type != "OUTPUT_MATERIAL"]:
        nodes.remove(n)
    diffuse = nodes.new("ShaderNodeBsdfDiffuse")
    diffuse.inputs["Color"].default_value = (1.0, 1.0, 1.0, 1.0)
    mat.node_tree.links.new(diffuse.outputs[0], next(n for n in nodes if n.type == "OUTPUT_MATERIAL").inputs["Surface"])
    return mat


def write_pass_exr(path: str, plane) -> None:
    """A one-channel pass (shadow, sky) as a float32 ZIP EXR (R = G = B = plane), through a temporary Blender image."""
    import numpy as np

    h, w = plane.shape
    img = bpy.data.images.new("alaya-flash pass", w, h, alpha=False, float_buffer=True)
    try:
        img.colorspace_settings.name = "Non-Color"  # written as is
        rgba = np.ones((h, w, 4), np.float32)
        rgba[..., :3] = plane[::-1, :, None]  # Blender images start at the bottom row
        img.pixels.foreach_set(rgba.ravel())
        img.filepath_raw, img.file_format = path, "OPEN_EXR"
        if hasattr(img, "use_half_precision"):
            img.use_half_precision = False
        img.save()
    finally:
        bpy.data.images.remove(img)


def output_folder(scene) -> str:
    return os.path.dirname(bpy.path.abspath(scene.render.frame_path(frame=scene.frame_start)))


def write_camera_json(scene, folder: str | None = None) -> str:
    folder = folder or output_folder(scene)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "camera.json")
    with open(path, "w") as f:
        json.dump(camera_json(scene), f)
    return path


# Fast G-buffer render: what changes for the render, put back afterwards. (owner, attribute, value);
# owner "cycles" = scene.cycles, "render" = scene.render, "dof" = the active camera's depth of field.
FAST_SETTINGS = (
    ("render", "engine", "CYCLES"),
    ("cycles", "samples", 1),
    ("cycles", "use_adaptive_sampling", False),
    ("cycles", "use_denoising", False),
    ("cycles", "max_bounces", 0),
    ("cycles", "diffuse_bounces", 0),
    ("cycles", "glossy_bounces", 0),
    ("cycles", "transmission_bounces", 0),
    ("cycles", "volume_bounces", 0),
    ("cycles", "transparent_max_bounces", 0),
    ("cycles", "pixel_filter_type", "BOX"),  # with the narrowest width: one ray through each pixel's centre,
    ("cycles", "filter_width", 0.01),        # so passes hold one surface's values (no blending at edges)
    ("render", "use_motion_blur", False),
    ("render", "use_persistent_data", True),  # keep the scene in memory between frames
    ("dof", "use_dof", False),
)

IMAGE_FORMAT = ("media_type", "file_format", "color_depth", "color_mode", "exr_codec")  # the order they are set in

_rendering = False  # while a fast render runs, the render-complete handler leaves camera.json alone


def _owner(scene, name):
    """What FAST_SETTINGS' owner names: "dof" the active camera's depth of field (None without a camera)."""
    if name == "dof":
        cam = scene.camera
        return cam.data.dof if cam is not None and cam.type == "CAMERA" else None
    return getattr(scene, name)


def _switch(changes, saved: list) -> None:
    """Set each (object, attribute, value) in order, the old value appended to saved first (for _put_back,
    also after a failed set)."""
    for obj, attr, value in changes:
        saved.append((obj, attr, getattr(obj, attr)))
        setattr(obj, attr, value)


def _put_back(saved) -> None:
    for obj, attr, value in reversed(saved):
        setattr(obj, attr, value)


def _image_format(settings, **values) -> dict:
    """Set the output's image format (IMAGE_FORMAT order: Blender 5's media type first, which its file
    formats depend on; attributes Blender does not have are left out); returns the old values."""
    old = {k: getattr(settings, k) for k in IMAGE_FORMAT if hasattr(settings, k)}
    for k in IMAGE_FORMAT:
        if k in values and k in old:
            setattr(settings, k, values[k])
    return old


class FastRender:
    """The fast G-buffer render of a scene's frame range, one frame per step(): set up (setup_scene),
    switch to FAST_SETTINGS, render each frame to the output path as multilayer EXR, with the light passes
    beside it; finish() writes camera.json and puts every setting back (also after an error or a cancel)."""

    def __init__(self, scene, folder: str | None = None, shadow: bool | None = None, sky: bool | None = None):
        self.scene, self.folder = scene, folder
        if shadow is None:  # the panel's option, which only counts when there is a Sun light
            shadow = getattr(scene, "alaya_flash_shadow_pass", True)
        if sky is None:
            sky = getattr(scene, "alaya_flash_sky_pass", False)
        self.shadow = bool(shadow) and sun_light(scene) is not None
        self.sky = bool(sky)
        self.shadows: list[str] = []
        self.skies: list[str] = []
        self.frames = list(range(scene.frame_start, scene.frame_end + 1, scene.frame_step))
        self.done: list[str] = []
        self.skipped: list[str] = []
        self._saved: list = []
        self._frame = None
        self._started = False

    def start(self) -> None:
        global _rendering
        scene = self.scene
        if scene.camera is None:
            raise RuntimeError("the scene has no active camera")
        if not self.frames:
            raise RuntimeError(f"the frame range {scene.frame_start}-{scene.frame_end} is empty")
        self._saved, self._frame = [(scene.render, "filepath", scene.render.filepath)], scene.frame_current
        self._started, _rendering = True, True
        if self.folder:
            os.makedirs(self.folder, exist_ok=True)
            scene.render.filepath = os.path.join(os.path.abspath(self.folder), "####")
        self.skipped = setup_scene(scene)
        owned = [(_owner(scene, o), a, v) for o, a, v in FAST_SETTINGS]  # engine first: the Cycles settings apply to it
        _switch([c for c in owned if c[0] is not None], self._saved)
        self.paths = [bpy.path.abspath(scene.render.frame_path(frame=f)) for f in self.frames]
        self.folder = os.path.dirname(self.paths[0])
        os.makedirs(self.folder, exist_ok=True)

    def step(self) -> bool:
        """Render the next frame; False once every frame is written."""
        k = len(self.done)
        if k == len(self.frames):
            return False
        self.scene.frame_set(self.frames[k])
        self.scene.render.filepath = self.paths[k]  # a still's path is used as is (no #### substitution)
        bpy.ops.render.render(write_still=True)
        self.done.append(self.paths[k])
        stem = os.path.splitext(os.path.basename(self.paths[k]))[0]
        for on, name, make, written in ((self.shadow, "shadow", shadow_pass, self.shadows),
                                        (self.sky, "sky", sky_pass, self.skies)):
            if on:  # shadow_0001.exr, sky_0001.exr beside 0001.exr: the readers' side-file light passes
                path = os.path.join(self.folder, f"{name}_{stem}.exr")
                write_pass_exr(path, make(self.scene, bpy.context.evaluated_depsgraph_get()))
                written.append(path)
        return k + 1 < len(self.frames)

    def finish(self, complete: bool = True) -> str | None:
        """Put the scene back; write camera.json when every frame was rendered. Returns its path."""
        global _rendering
        path = None
        try:
            _put_back(self._saved)
            if self._frame is not None:
                self.scene.frame_set(self._frame)
            if complete and self._started:
                path = write_camera_json(self.scene, self.folder)
        finally:
            _rendering = False
        return path


def render_gbuffers(scene, folder: str | None = None, shadow: bool | None = None, sky: bool | None = None) -> dict:
    """Set the scene up and render its frame range's G-buffers fast (FastRender) into folder (default:
    the scene's output path), with camera.json, the sky pass and, with a Sun light, the shadow pass
    (shadow, sky: None = the panel's options). Blocks until done; for scripts and `blender -b`. Returns
    {"frames": [EXR paths], "camera": camera.json path, "skipped": materials without AOVs,
    "shadows": [shadow EXR paths], "skies": [sky EXR paths]}."""
    job = FastRender(scene, folder, shadow, sky)
    ok = False
    try:
        job.start()
        while job.step():
            pass
        ok = True
    finally:
        camera = job.finish(complete=ok)
    return {"frames": job.done, "camera": camera, "skipped": job.skipped, "shadows": job.shadows,
            "skies": job.skies}


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


class ALAYA_OT_render(bpy.types.Operator):
    bl_idname = "alaya_flash.render_gbuffers"
    bl_label = "Render G-Buffers (Fast)"
    bl_description = ("Set up, then render the frame range's G-buffer passes with Cycles at 1 sample and no "
                      "bounces (exact passes, noisy image) and write camera.json; the scene's settings are put back")

    _job = None
    _timer = None

    def execute(self, context):  # scripts and background mode: the whole range, blocking
        try:
            result = render_gbuffers(context.scene)
        except (RuntimeError, OSError) as err:
            self.report({"ERROR"}, str(err))
            return {"CANCELLED"}
        self._report_done(result["frames"], result["camera"], result["skipped"])
        return {"FINISHED"}

    def invoke(self, context, event):  # the UI: one frame per timer tick, so Blender stays live; Esc stops
        self._job = FastRender(context.scene)
        try:
            self._job.start()
        except (RuntimeError, OSError) as err:
            self._job.finish(complete=False)
            self.report({"ERROR"}, str(err))
            return {"CANCELLED"}
        wm = context.window_manager
        self._timer = wm.event_timer_add(0.001, window=context.window)
        wm.modal_handler_add(self)
        wm.progress_begin(0, len(self._job.frames))
        return {"RUNNING_MODAL"}

    def modal(self, context, event):
        if event.type == "ESC":
            return self._end(context, complete=False)
        if event.type != "TIMER":
            return {"PASS_THROUGH"}
        try:
            more = self._job.step()
        except (RuntimeError, OSError) as err:
            self.report({"ERROR"}, str(err))
            return self._end(context, complete=False)
        context.window_manager.progress_update(len(self._job.done))
        return {"RUNNING_MODAL"} if more else self._end(context, complete=True)

    def _end(self, context, complete: bool):
        wm = context.window_manager
        wm.event_timer_remove(self._timer)
        wm.progress_end()
        camera = self._job.finish(complete=complete)
        if complete:
            self._report_done(self._job.done, camera, self._job.skipped)
            return {"FINISHED"}
        self.report({"WARNING"}, f"stopped after {len(self._job.done)} of {len(self._job.frames)} frames; "
                                 "no camera.json written")
        return {"CANCELLED"}

    def _report_done(self, frames, camera, skipped):
        msg = f"wrote {len(frames)} frames and {camera}"
        if skipped:
            self.report({"WARNING"}, f"{msg}; no Principled BSDF (no AOVs): {', '.join(skipped)}")
        else:
            self.report({"INFO"}, msg)


class ALAYA_PT_panel(bpy.types.Panel):
    bl_label = "Alaya Flash G-buffers"
    bl_space_type, bl_region_type, bl_context = "PROPERTIES", "WINDOW", "render"

    def draw(self, context):
        self.layout.operator(ALAYA_OT_setup.bl_idname)
        self.layout.operator(ALAYA_OT_render.bl_idname, icon="RENDER_ANIMATION")
        row = self.layout.row()
        row.enabled = sun_light(context.scene) is not None  # greyed out (and not written) without a Sun
        row.prop(context.scene, "alaya_flash_shadow_pass")
        self.layout.prop(context.scene, "alaya_flash_sky_pass")
        self.layout.operator(ALAYA_OT_camera.bl_idname)


@bpy.app.handlers.persistent
def _after_render(scene, *_):
    if _rendering:  # a fast render writes camera.json once, at its end
        return
    if scene.render.image_settings.file_format == "OPEN_EXR_MULTILAYER" and scene.camera is not None:
        write_camera_json(scene)


CLASSES = (ALAYA_OT_setup, ALAYA_OT_render, ALAYA_OT_camera, ALAYA_PT_panel)


def register():
    for c in CLASSES:
        bpy.utils.register_class(c)
    bpy.types.Scene.alaya_flash_shadow_pass = bpy.props.BoolProperty(
        name="Shadow Pass (Sun)", default=True,
        description="With a Sun light, Render G-Buffers also writes shadow_NNNN.exr: the first Sun's "
                    "visibility per pixel, ray cast (slow on large images: two rays per pixel in Python)")
    bpy.types.Scene.alaya_flash_sky_pass = bpy.props.BoolProperty(
        name="Sky Pass", default=False,  # the shipped model leaves a sky pass out: no cost unasked
        description="Render G-Buffers also writes sky_NNNN.exr: the share of the sky each pixel's surface "
                    f"sees (a second Cycles render, {SKY_SAMPLES} samples denoised, a white sky above the horizon)")
    bpy.app.handlers.render_complete.append(_after_render)


def unregister():
    if _after_render in bpy.app.handlers.render_complete:
        bpy.app.handlers.render_complete.remove(_after_render)
    del bpy.types.Scene.alaya_flash_shadow_pass
    del bpy.types.Scene.alaya_flash_sky_pass
    for c in reversed(CLASSES):
        bpy.utils.unregister_class(c)
