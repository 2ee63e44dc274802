"""Screenshot the Blender add-on's panel for docs/gbuffers.md (docs/images/blender-addon-panel*.png).

    apt-get install -y blender xvfb xauth python3-pil   # Debian 12: Blender 3.4.1, drawn by Mesa llvmpipe
    xvfb-run -a -s "-screen 0 2400x1800x24" blender --factory-startup \
        --python-exit-code 1 --python integrations/blender/blender_panel_screenshot.py -- docs/images

A real Blender window on a virtual X display: factory settings, no splash; the add-on
(integrations/blender/alaya_flash_blender_addon.py) installed and enabled with Blender's own operators (Install
from Disk into a throw-away scripts folder, nothing lands in ~); a small scene (a floor, a cube,
two Principled materials, a sun, a camera); the panel's "Set Up G-Buffer Export" button pressed
(its operator, with the Properties editor as context). Then one window screenshot per Properties
tab, cropped with Pillow (Debian's python3-pil, which Blender's system Python sees) to the
Properties editor, empty space below the panels trimmed:

  blender-addon-panel.png         Render tab: the add-on's panel and its three buttons
  blender-addon-panel-passes.png  View Layer tab: the Z and Normal passes and the three Shader AOVs set up
  blender-addon-panel-output.png  Output tab: OpenEXR MultiLayer, Float (Full), ZIP set up
"""
from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

ADDON = Path(__file__).resolve().parent / "alaya_flash_blender_addon.py"
SHOTS = (("RENDER", "blender-addon-panel.png"), ("VIEW_LAYER", "blender-addon-panel-passes.png"),
         ("OUTPUT", "blender-addon-panel-output.png"))


def build_scene(bpy) -> None:
    for obj in list(bpy.data.objects):  # the factory cube, light and camera: start from nothing
        bpy.data.objects.remove(obj)
    bpy.ops.mesh.primitive_plane_add(size=10, location=(0, 0, 0))
    floor = bpy.context.object
    bpy.ops.mesh.primitive_cube_add(size=1, location=(0, 0, 0.5))
    cube = bpy.context.object
    for obj, name, colour in ((floor, "floor", (0.6, 0.6, 0.6, 1)), (cube, "cube", (0.8, 0.2, 0.1, 1))):
        mat = bpy.data.materials.new(name)
        mat.use_nodes = True
        bsdf = next(n for n in mat.node_tree.nodes if n.type == "BSDF_PRINCIPLED")
        bsdf.inputs["Base Color"].default_value = colour
        bsdf.inputs["Roughness"].default_value = 0.4
        obj.data.materials.append(mat)
    bpy.ops.object.light_add(type="SUN", location=(3, -3, 6))
    bpy.ops.object.camera_add(location=(4, -4, 3), rotation=(1.1, 0, 0.785))
    bpy.context.scene.camera = bpy.context.object
    bpy.context.scene.render.engine = "CYCLES"  # the engine the add-on's fast render uses
    bpy.context.scene.render.filepath = "//shot/####"  # one EXR per frame, as docs/gbuffers.md says


def crop(raw: Path, area: tuple[int, int, int, int], dest: Path) -> None:
    """Cut the Properties editor (x, y, width, height; y from the window's bottom, as Blender gives it)
    out of the window screenshot and trim the empty rows under its last panel."""
    from PIL import Image

    im = Image.open(raw).convert("RGB")
    x, y, w, h = area
    top, bottom = im.height - (y + h), im.height - y
    box = im.crop((x, top, x + w, bottom))
    px = box.load()
    bg = px[w // 2, box.height - 6]  # the region's background, below the panels
    last = box.height - 6
    while last > 0 and all(px[i, last] == bg for i in range(40, w - 20)):  # skip the tab column, scrollbar
        last -= 1
    box.crop((0, 0, w, min(box.height, last + 14))).save(dest, optimize=True)


def _override(bpy, window, area=None):
    region = next((r for r in area.regions if r.type == "WINDOW"), None) if area else None
    return bpy.context.temp_override(window=window, screen=window.screen, area=area, region=region)


def main(out: Path) -> None:
    import bpy

    tmp = Path(tempfile.mkdtemp(prefix="alaya-blender-"))
    atexit.register(shutil.rmtree, tmp, True)
    prefs = bpy.context.preferences  # --factory-startup: none of this is saved
    prefs.view.show_splash = False
    prefs.filepaths.temporary_directory = str(tmp)  # quit.blend goes here
    prefs.filepaths.script_directory = str(tmp)  # Install from Disk copies the add-on into tmp/addons
    assert bpy.ops.preferences.addon_install(filepath=str(ADDON), target="PREFS") == {"FINISHED"}
    assert bpy.ops.preferences.addon_enable(module=ADDON.stem) == {"FINISHED"}
    build_scene(bpy)
    window = bpy.context.window_manager.windows[0]
    props = next(a for a in window.screen.areas if a.type == "PROPERTIES")

    def set_up():
        with _override(bpy, window, props):
            assert bpy.ops.alaya_flash.setup_export() == {"FINISHED"}  # the panel's first button

    def show(tab):
        return lambda: setattr(props.spaces.active, "context", tab)

    def shot(name):
        def run():
            raw = tmp / "window.png"
            with _override(bpy, window):
                bpy.ops.screen.screenshot(filepath=str(raw), check_existing=False)
            crop(raw, (props.x, props.y, props.width, props.height), out / name)
            print("wrote", out / name)
        return run

    plan = [set_up]
    for tab, name in SHOTS:  # switch tab, let the window redraw a few times, screenshot
        plan += [show(tab), None, None, shot(name)]

    def tick():
        try:
            step = plan.pop(0)
            if step is not None:
                step()
            for a in window.screen.areas:
                a.tag_redraw()
            if plan:
                return 0.3
        except Exception:
            import traceback
            traceback.print_exc()
            sys.exit(1)
        bpy.ops.wm.quit_blender()
        return None

    bpy.app.timers.register(tick, first_interval=1.0)


if __name__ == "__main__":
    args = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    main(Path(args[0] if args else Path(__file__).resolve().parents[2] / "docs" / "images").resolve())
