"""A Blender street beside its Cycles truth, rendered by the default model (issue #32, item 4).

    nice -n 5 .venv-bpy/bin/python integrations/blender/blender_comparison.py scene --out runs/blender-street
    nice -n 5 .venv/bin/python integrations/blender/blender_comparison.py compare --in runs/blender-street \\
        --out docs/images/blender-street.jpg --json docs/eval/blender-street.json
    nice -n 5 .venv-bpy/bin/python integrations/blender/blender_comparison.py sky-check --in runs/blender-street \\
        --json docs/eval/blender-sky-pass.json

`scene` (Blender's Python: the `bpy` wheel, .venv-bpy) builds a small street from nothing: a road
and two pavements, three building blocks on the right, a painted-metal car-like box (metallic
0.7), a chrome sphere (metallic 1, roughness 0.1), a lamp post, a Sun light (strength 4, 1 degree
wide) that throws the buildings' and the sphere's shadows across the road, and a plain blue sky;
a camera at eye height (1.6 m) dollies 4 m along the street, 17 frames at 16 fps, 256x256. Then:

  OUT/gbuffers/      the add-on (integrations/blender/alaya_flash_blender_addon.py), installed from
                     the file and enabled with Blender's own operators into a throw-away user folder, its
                     "Render G-Buffers (Fast)" operator pressed: multilayer EXRs + camera.json,
                     read by `alaya-flash gbuffers info` as they are
  OUT/truth/         the Cycles truth: CPU, 64 samples, OIDN denoiser, view transform Standard
                     (plain sRGB), 8-bit PNG, one per frame
  OUT/masks/         per frame: sun_NNNN.npy (H, W) float32, 1 where the sun reaches the surface
                     seen through the pixel's centre, 0 where it is shadowed (the add-on's shadow
                     pass: scene.ray_cast from the camera through the pixel centre, then from the hit
                     point towards the sun); sky_NNNN.npy (H, W) float32, the share of the sky that
                     surface sees (the add-on's sky pass, sky_pass); objects_NNNN.npy (H, W) int8,
                     the object first hit (index into scene.json's "objects", -1 sky);
                     ground_NNNN.npy (H, W) bool, road and pavements
  OUT/scene.json     the scene's numbers, the methods and the wall times (sky_s: the sky pass's,
                     all frames); OUT/street.blend

`compare` (the project's venv) renders OUT/gbuffers with the embedded default model (or --model's)
and bright_sunny's training caption (the one that names "a bright midday sun ... crisp shadows"),
given the scene's light with --light and the light passes from OUT/masks with --shadow-pass and
--sky-pass (written beside a copy of the G-buffers as the add-on writes them), and scores it against
the truth:

  PSNR            per frame and over the clip (alaya_flash.streaming.metrics.psnr); also over
                  the pixels that see a surface (not the sky)
  shadow ratio    metrics.shadow_ratio: shadowed over sunlit linear luminance, on the road (one
                  asphalt albedo, so the ratio is the lighting's alone) and on the whole ground
                  (road and pavements: the paving is 4x brighter than the asphalt and mostly in
                  shadow, so there a render without cast shadows is not near 1 either); pixels
                  whose 3x3 neighbourhood is all in the region and of one sun visibility (Cycles'
                  pixel filter blends the pixels along a shadow's edge)
  sphere contrast std / mean of linear luminance over the chrome sphere's pixels (those with the
                  exported metallic AOV >= 0.999)

It writes the JSON report and a figure: for frames 0 and 16 a row of albedo G-buffer | Cycles
truth | default model.

`sky-check` (Blender's Python) opens OUT/street.blend and times the add-on's sky pass on frame 1 at
several sample counts, denoised or not (SKY_CHECK), each against 1024 samples undenoised.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADDON = Path(__file__).resolve().parent / "alaya_flash_blender_addon.py"

SIZE = 256
FRAMES = 17
FPS = 16
LENS_MM, SENSOR_MM = 24.0, 36.0  # sensor fit AUTO on a square image: 73.7 degrees both ways
CAMERA_HEIGHT = 1.6
CAMERA_Y = (0.0, 4.0)  # dolly along +y, metres, frame 1 -> frame 17
CAMERA_PITCH_YAW = (86.0, -8.0)  # degrees: 4 down from level, 8 to the right (towards the buildings)
SUN = {"elevation": 40.0, "azimuth": -55.0, "strength": 4.0, "angle": 1.0}  # azimuth from +x towards +y
SKY = ((0.35, 0.52, 0.85), 0.45)  # world background colour (linear) and strength
CYCLES = {"samples": 64, "denoiser": "OPENIMAGEDENOISE"}
# name: (base colour linear RGB, metallic, roughness)
MATERIALS = {
    "asphalt": ((0.075, 0.075, 0.08), 0.0, 0.85),
    "paving": ((0.32, 0.31, 0.29), 0.0, 0.75),
    "verge": ((0.09, 0.2, 0.05), 0.0, 0.9),
    "plaster": ((0.72, 0.6, 0.42), 0.0, 0.8),
    "brick": ((0.42, 0.14, 0.08), 0.0, 0.85),
    "stone": ((0.55, 0.55, 0.58), 0.0, 0.7),
    "car_paint": ((0.6, 0.05, 0.04), 0.7, 0.3),
    "chrome": ((0.9, 0.9, 0.9), 1.0, 0.1),
    "lamp": ((0.05, 0.07, 0.06), 0.0, 0.5),
}
# boxes: name -> (min corner, max corner, material); the road runs along +y
BOXES = {
    "road": ((-5.0, -10.0, -0.05), (4.0, 90.0, 0.0), "asphalt"),
    "pavement_right": ((4.0, -10.0, -0.05), (6.5, 90.0, 0.12), "paving"),
    "pavement_left": ((-7.0, -10.0, -0.05), (-5.0, 90.0, 0.12), "paving"),
    "verge": ((-60.0, -10.0, -0.1), (-7.0, 90.0, 0.05), "verge"),
    "building_a": ((6.5, -6.0, 0.0), (13.0, 11.0, 7.0), "plaster"),
    "building_b": ((6.5, 13.5, 0.0), (12.0, 21.0, 6.0), "brick"),
    "building_c": ((6.5, 23.0, 0.0), (14.0, 34.0, 12.0), "stone"),
    "car": ((-4.0, 12.0, 0.25), (-2.2, 16.3, 1.5), "car_paint"),
    "lamp_head": ((4.35, 9.7, 4.3), (4.95, 10.3, 4.5), "lamp"),
}
SPHERE = ((-0.6, 8.5, 0.8), 0.8, "chrome")  # centre, radius
LAMP_POST = ((4.65, 10.0), 0.07, 4.4, "lamp")  # (x, y), radius, height
GROUND = ("road", "pavement_right", "pavement_left")

PROMPT_PRESET = "bright_sunny"
FIGURE_FRAMES = (0, 16)


def sun_direction() -> tuple[float, float, float]:
    """Unit vector from the ground towards the sun (world, z up)."""
    el, az = math.radians(SUN["elevation"]), math.radians(SUN["azimuth"])
    return (math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el))


# ---------------------------------------------------------------------------------------------
# scene: Blender's half


def _material(bpy, name: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from blender_fixtures import principled  # imports bpy: the scene half only

    return principled(name, *MATERIALS[name])


def build_scene(bpy):
    bpy.ops.wm.read_factory_settings(use_empty=True)
    scene = bpy.context.scene
    scene.render.engine = "CYCLES"
    scene.cycles.device = "CPU"
    scene.render.resolution_x = scene.render.resolution_y = SIZE
    scene.render.resolution_percentage = 100
    scene.frame_start, scene.frame_end = 1, FRAMES
    scene.render.fps = FPS
    mats = {name: _material(bpy, name) for name in MATERIALS}

    for name, (lo, hi, mat) in BOXES.items():
        centre = tuple((a + b) / 2 for a, b in zip(lo, hi))
        bpy.ops.mesh.primitive_cube_add(size=1.0, location=centre)
        obj = bpy.context.object
        obj.name, obj.scale = name, tuple(b - a for a, b in zip(lo, hi))
        obj.data.materials.append(mats[mat])
    centre, radius, mat = SPHERE
    bpy.ops.mesh.primitive_uv_sphere_add(segments=64, ring_count=32, radius=radius, location=centre)
    bpy.ops.object.shade_smooth()
    bpy.context.object.name = "sphere"
    bpy.context.object.data.materials.append(mats[mat])
    (x, y), radius, height, mat = LAMP_POST
    bpy.ops.mesh.primitive_cylinder_add(vertices=16, radius=radius, depth=height, location=(x, y, height / 2))
    bpy.context.object.name = "lamp_post"
    bpy.context.object.data.materials.append(mats[mat])

    sun = bpy.data.lights.new("sun", "SUN")
    sun.energy, sun.angle = SUN["strength"], math.radians(SUN["angle"])
    light = bpy.data.objects.new("sun", sun)
    # a sun shines down its local -z: turn +z onto the direction towards the sun
    light.rotation_euler = (0.0, math.radians(90.0 - SUN["elevation"]), math.radians(SUN["azimuth"]))
    scene.collection.objects.link(light)

    world = bpy.data.worlds.new("sky")
    if not world.node_tree:
        world.use_nodes = True
    bg = next(n for n in world.node_tree.nodes if n.type == "BACKGROUND")
    bg.inputs["Color"].default_value = (*SKY[0], 1.0)
    bg.inputs["Strength"].default_value = SKY[1]
    scene.world = world

    cam_data = bpy.data.cameras.new("cam")
    cam_data.lens, cam_data.sensor_width = LENS_MM, SENSOR_MM
    cam = bpy.data.objects.new("cam", cam_data)
    scene.collection.objects.link(cam)
    scene.camera = cam
    pitch, yaw = (math.radians(a) for a in CAMERA_PITCH_YAW)
    for f in range(1, FRAMES + 1):
        y = CAMERA_Y[0] + (CAMERA_Y[1] - CAMERA_Y[0]) * (f - 1) / (FRAMES - 1)
        cam.location = (0.0, y, CAMERA_HEIGHT)
        cam.rotation_euler = (pitch, 0.0, yaw)
        cam.keyframe_insert("location", frame=f)
        cam.keyframe_insert("rotation_euler", frame=f)
    scene.frame_set(1)
    return scene


def render_truth(bpy, scene, folder: Path) -> None:
    """The Cycles truth of the frame range: PNG, plain sRGB (view transform Standard)."""
    c = scene.cycles
    scene.render.engine = "CYCLES"
    c.device, c.samples = "CPU", CYCLES["samples"]
    c.use_denoising, c.denoiser = True, CYCLES["denoiser"]
    scene.view_settings.view_transform = "Standard"
    scene.view_settings.look = "None"
    scene.view_settings.exposure, scene.view_settings.gamma = 0.0, 1.0
    settings = scene.render.image_settings
    if hasattr(settings, "media_type"):  # Blender 5; the add-on's Set Up left it at multilayer
        settings.media_type = "IMAGE"
    settings.file_format, settings.color_mode, settings.color_depth = "PNG", "RGB", "8"
    scene.render.filepath = str(folder / "####")
    bpy.ops.render.render(animation=True)


def light_masks(bpy, scene, folder: Path, names: list[str]) -> float:
    """Per frame: which object each pixel centre sees, whether the sun reaches that point and the share of
    the sky it sees (the add-on's shadow_pass and sky_pass: the light passes it exports). Returns the
    seconds sky_pass took, all frames."""
    import numpy as np

    addon = sys.modules[ADDON.stem]  # installed and enabled by make_scene
    folder.mkdir(parents=True, exist_ok=True)
    index = {n: i for i, n in enumerate(names)}
    sky_s = 0.0
    for f in range(scene.frame_start, scene.frame_end + 1):
        scene.frame_set(f)
        depsgraph = bpy.context.evaluated_depsgraph_get()
        sun, seen = addon.shadow_pass(scene, depsgraph, sun_direction(), objects=True)
        t = time.perf_counter()
        sky = addon.sky_pass(scene, depsgraph)
        sky_s += time.perf_counter() - t
        obj_ids = np.array([[-1 if n is None else index[n] for n in row] for row in seen], np.int8)
        np.save(folder / f"sun_{f:04d}.npy", sun)
        np.save(folder / f"sky_{f:04d}.npy", sky)
        np.save(folder / f"objects_{f:04d}.npy", obj_ids)
        np.save(folder / f"ground_{f:04d}.npy", np.isin(obj_ids, [index[n] for n in GROUND]))
    return sky_s


def make_scene(out: Path) -> int:
    out = out.resolve()
    # the add-on is installed as a user installs it, into a throw-away user-resources folder (not ~)
    os.environ.setdefault("BLENDER_USER_RESOURCES", str(out / "blender-user"))
    import bpy

    times = {}
    t = time.perf_counter()
    scene = build_scene(bpy)  # first: factory settings unload add-ons
    if bpy.ops.preferences.addon_install(filepath=str(ADDON)) != {"FINISHED"}:
        raise RuntimeError(f"could not install {ADDON}")
    if bpy.ops.preferences.addon_enable(module=ADDON.stem) != {"FINISHED"}:
        raise RuntimeError(f"could not enable {ADDON.stem}")
    times["build_s"] = time.perf_counter() - t

    t = time.perf_counter()
    scene.render.filepath = str(out / "gbuffers" / "####")  # Output Properties > Output
    scene.alaya_flash_shadow_pass = False  # compare gives the light passes only with --shadow-pass,
    scene.alaya_flash_sky_pass = False     # --sky-pass (from masks/)
    if bpy.ops.alaya_flash.render_gbuffers() != {"FINISHED"}:  # the panel's "Render G-Buffers (Fast)"
        raise RuntimeError("Render G-Buffers (Fast) did not finish")
    times["gbuffers_s"] = time.perf_counter() - t

    t = time.perf_counter()
    render_truth(bpy, scene, out / "truth")
    times["truth_s"] = time.perf_counter() - t

    names = [o.name for o in scene.objects if o.type == "MESH"]
    t = time.perf_counter()
    times["sky_s"] = light_masks(bpy, scene, out / "masks", names)
    times["masks_s"] = time.perf_counter() - t
    scene.frame_set(1)
    bpy.ops.wm.save_as_mainfile(filepath=str(out / "street.blend"))

    info = {"blender": bpy.app.version_string, "size": SIZE, "frames": FRAMES, "fps": FPS,
            "objects": names, "ground": list(GROUND), "sphere": "sphere",
            "materials": {k: {"base_color": v[0], "metallic": v[1], "roughness": v[2]} for k, v in MATERIALS.items()},
            "sun": {**SUN, "direction_to_sun": sun_direction()}, "sky": {"color": SKY[0], "strength": SKY[1]},
            "camera": {"height": CAMERA_HEIGHT, "y": CAMERA_Y, "pitch_yaw_deg": CAMERA_PITCH_YAW, "lens_mm": LENS_MM,
                       "sensor_mm": SENSOR_MM},
            "truth": {"engine": "CYCLES", "device": "CPU", **CYCLES, "view_transform": "Standard"},
            "sun_visibility": "ray cast: camera ray through the pixel centre (scene.ray_cast), then a ray from "
                              "the hit point (+1 mm along the normal) towards the sun; 1 = not blocked",
            "sky_visibility": f"the add-on's sky_pass: Cycles, {sys.modules[ADDON.stem].SKY_SAMPLES} samples a pixel denoised, white "
                              "Lambert under a sky of 1 above the horizon, over (1 + n.z) / 2",
            "seconds": {k: round(v, 1) for k, v in times.items()}}
    (out / "scene.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info["seconds"]))
    return 0


SKY_CHECK = ((16, False), (32, False), (64, False), (8, True), (16, True))  # (samples, denoised) against 1024


def sky_check(src: Path, report: Path, frame: int = 1, reference: int = 1024) -> int:
    """The add-on's sky pass on OUT/street.blend's frame (Blender's Python): seconds and error of each
    SKY_CHECK setting against `reference` samples undenoised, over the pixels whose 3x3 all see a surface."""
    import bpy
    import numpy as np

    sys.path.insert(0, str(ADDON.parent))
    import alaya_flash_blender_addon as addon

    bpy.ops.wm.open_mainfile(filepath=str(src / "street.blend"))
    scene = bpy.context.scene
    scene.frame_set(frame)
    depsgraph = bpy.context.evaluated_depsgraph_get()
    surface = np.load(src / "masks" / f"objects_{frame:04d}.npy") >= 0
    inner = np.zeros_like(surface)
    inner[1:-1, 1:-1] = np.lib.stride_tricks.sliding_window_view(surface, (3, 3)).all((-2, -1))
    t = time.perf_counter()
    truth = addon.sky_pass(scene, depsgraph, samples=reference, denoise=False)
    rows = {"reference": {"samples": reference, "denoised": False, "seconds": round(time.perf_counter() - t, 1)}}
    for samples, denoise in SKY_CHECK:
        t = time.perf_counter()
        err = (addon.sky_pass(scene, depsgraph, samples=samples, denoise=denoise) - truth)[inner]
        rows[f"{samples}{' denoised' if denoise else ''}"] = {
            "seconds": round(time.perf_counter() - t, 2), "bias": round(float(err.mean()), 4),
            "rms": round(float(np.sqrt((err ** 2).mean())), 4), "mean_abs": round(float(abs(err).mean()), 4),
            "p95_abs": round(float(np.percentile(abs(err), 95)), 4)}
    result = {"scene": str(src), "frame": frame, "size": list(surface.shape), "pixels": int(inner.sum()),
              "threads": scene.render.threads, "default": f"{addon.SKY_SAMPLES} denoised", "settings": rows}
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(rows))
    return 0


# ---------------------------------------------------------------------------------------------
# compare: the project's half


def prompt() -> str:
    from alaya_flash.streaming.world.shading import PRESETS

    return PRESETS[PROMPT_PRESET].prompt


def score(render, truth, masks, regions: dict[str, list[int]]) -> dict:
    """render, truth: (T, H, W, 3) float in [0, 1]; masks: per frame {"sun", "objects", "sphere"};
    regions: name -> the object ids whose pixels the shadow ratio is measured on."""
    import numpy as np
    import torch

    from alaya_flash.streaming import metrics

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return float(np.mean(xs)) if xs else None

    per = []
    for k, m in enumerate(masks):
        row = {"frame": k, "psnr_db": metrics.psnr(torch.from_numpy(render[k]), torch.from_numpy(truth[k])),
               "psnr_db_surfaces": metrics.region_psnr(render[k], truth[k], m["objects"] >= 0),
               "shadow_ratio": {}, "shadowed_sunlit_pixels": {}}
        for name, ids in regions.items():
            region = metrics.edge_free(np.isin(m["objects"], ids), m["sun"])
            row["shadow_ratio"][name] = {"render": metrics.shadow_ratio(render[k], m["sun"], region=region),
                                         "truth": metrics.shadow_ratio(truth[k], m["sun"], region=region)}
            row["shadowed_sunlit_pixels"][name] = [int((region & (m["sun"] < 0.01)).sum()),
                                                   int((region & (m["sun"] > 0.99)).sum())]
        row["sphere_contrast"] = {"render": metrics.region_contrast(render[k], m["sphere"]),
                                  "truth": metrics.region_contrast(truth[k], m["sphere"])}
        row["sphere_pixels"] = int(m["sphere"].sum())
        per.append(row)
    return {
        "psnr_db": metrics.psnr(torch.from_numpy(render), torch.from_numpy(truth)),
        "psnr_db_mean_of_frames": mean([p["psnr_db"] for p in per]),
        "psnr_db_surfaces_mean_of_frames": mean([p["psnr_db_surfaces"] for p in per]),
        "shadow_ratio": {name: {k: mean([p["shadow_ratio"][name][k] for p in per]) for k in ("render", "truth")}
                         for name in regions},
        "sphere_contrast": {k: mean([p["sphere_contrast"][k] for p in per]) for k in ("render", "truth")},
        "frames": per,
    }


def figure(rows: list[list], labels: list[str], path: Path) -> None:
    """A grid of uint8 (H, W, 3) images with a label above each column; JPEG or PNG by suffix."""
    from PIL import Image, ImageDraw

    h, w = rows[0][0].shape[:2]
    pad, head = 4, 16
    img = Image.new("RGB", (len(labels) * (w + pad) + pad, head + len(rows) * (h + pad)), "white")
    draw = ImageDraw.Draw(img)
    for c, label in enumerate(labels):
        draw.text((pad + c * (w + pad) + 2, 2), label, fill="black")
    for r, row in enumerate(rows):
        for c, tile in enumerate(row):
            img.paste(Image.fromarray(tile), (pad + c * (w + pad), head + r * (h + pad)))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".jpg", ".jpeg"):
        img.save(path, quality=88)
    else:
        img.save(path, optimize=True)


def read_pngs(folder: Path):
    import numpy as np
    from PIL import Image

    files = sorted(folder.glob("*.png"))
    if not files:
        raise SystemExit(f"{folder}: no PNG frames")
    return files, np.stack([np.asarray(Image.open(p).convert("RGB")) for p in files])


def given_light(src: Path) -> str:
    """The scene's light as a `--light`, as an engine that knows it would send it: the sun's strength (its
    irradiance, white), elevation and azimuth relative to the camera's heading in camera.json's first frame,
    and the world's uniform sky (colour times strength) above and below the horizon."""
    import numpy as np

    info = json.loads((src / "scene.json").read_text())
    pose = np.asarray(json.loads((src / "gbuffers" / "camera.json").read_text())["camera_to_world"][0])
    forward = -pose[:3, 2]  # the camera looks down its -Z
    heading = math.degrees(math.atan2(forward[1], forward[0]))
    azimuth = (info["sun"]["azimuth"] - heading + 180.0) % 360.0 - 180.0
    sky = ":".join(f"{c * info['sky']['strength']:.4g}" for c in info["sky"]["color"])
    return (f"{PROMPT_PRESET},az={azimuth:.1f},el={info['sun']['elevation']:g},sun={info['sun']['strength']:g},"
            f"zenith={sky},horizon={sky},ground={sky},ambient=1")


def with_light_passes(src: Path, passes: list[str]) -> Path:
    """src/gbuffers, or a copy of it with light passes beside the frames from the masks, as the add-on
    writes them (docs/gbuffers.md): "shadow" the ray-cast sun masks (`shadow_NNNN.exr`), "sky" the sky
    masks (`sky_NNNN.exr`)."""
    import shutil

    import numpy as np

    from alaya_flash.streaming.files.image_files import write_exr

    if not passes:
        return src / "gbuffers"
    dst = src / "-".join(["gbuffers", *passes])
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src / "gbuffers", dst)
    for name, mask in (("shadow", "sun"), ("sky", "sky")):
        if name in passes:
            for f in sorted((src / "masks").glob(f"{mask}_*.npy")):
                write_exr(dst / f"{name}_{f.stem[len(mask) + 1:]}.exr", {"Y": np.load(f).astype(np.float32)})
    return dst


def compare(src: Path, out: Path, report: Path, render_dir: Path | None = None, model: Path | None = None,
            light: bool = False, shadow_pass: bool = False, sky_pass: bool = False) -> int:
    import numpy as np

    from alaya_flash.streaming.cli import main as cli
    from alaya_flash.streaming.files.readers import open_gbuffers
    from alaya_flash.streaming.gbuffer import linear_to_srgb

    info = json.loads((src / "scene.json").read_text())
    gb = with_light_passes(src, [name for name, on in (("shadow", shadow_pass), ("sky", sky_pass)) if on])
    frames = list(open_gbuffers(gb))
    render_dir = render_dir or src / "render"
    text = prompt()
    t = time.perf_counter()
    chosen = ["--model", str(model)] if model is not None else []
    lit = ["--light", given_light(src)] if light else []
    if cli(["render", str(gb), *chosen, *lit, "--prompt", text, "--out", str(render_dir), "--format", "png",
            "--overwrite"]) != 0:
        raise SystemExit("alaya-flash render failed")
    render_s = time.perf_counter() - t
    _, render = read_pngs(render_dir)
    truth_files, truth = read_pngs(src / "truth")
    if not (render.shape == truth.shape and len(frames) == len(truth)):
        raise SystemExit(f"shapes differ: render {render.shape}, truth {truth.shape}, {len(frames)} G-buffer frames")
    regions = {"road": [info["objects"].index("road")],
               "ground": [info["objects"].index(n) for n in info["ground"]]}
    masks = []
    for f, frame in zip(truth_files, frames):
        n = f.stem
        masks.append({"sun": np.load(src / "masks" / f"sun_{n}.npy"),
                      "objects": np.load(src / "masks" / f"objects_{n}.npy"),
                      "sphere": frame.metallic.reshape(truth.shape[1:3]) >= 0.999})
    result = score(render.astype(np.float32) / 255, truth.astype(np.float32) / 255, masks, regions)
    sphere_id = info["objects"].index(info["sphere"])
    agree = [float((m["sphere"] == (m["objects"] == sphere_id)).mean()) for m in masks]
    label = "embedded default" if model is None else str(model)
    result = {"scene": str(src), "prompt": text, "preset": PROMPT_PRESET, "model": label,
              "light": lit[1] if lit else "the prompt's", "shadows": "the ray-cast sun masks as the shadow pass"
              if shadow_pass else "screen-space",
              "sky_occlusion": "the add-on's sky pass" if sky_pass else "screen-space",
              "num_frames": len(truth), "size": list(truth.shape[1:3]), "truth": info["truth"],
              "sun_visibility": info["sun_visibility"],
              "shadow_region": {"road": "asphalt only: one albedo, so the ratio is the lighting's alone",
                                "ground": "road and both pavements (paving is 4x brighter than asphalt and its "
                                          "kerbs face away from the sun)",
                                "pixels": "3x3 neighbourhood all in the region and of one sun visibility"},
              "sphere_mask": "exported metallic AOV >= 0.999",
              "sphere_mask_agrees_with_ray_cast": min(agree),
              "render_seconds": round(render_s, 1), **result}
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(result, indent=1) + "\n")

    rows = []
    for k in FIGURE_FRAMES:
        albedo = (linear_to_srgb(np.clip(frames[k].albedo, 0, 1)) * 255 + 0.5).astype(np.uint8)
        rows.append([albedo, truth[k], render[k]])
    figure(rows, ["albedo G-buffer", "Cycles truth (64 spp, OIDN)", "default model" if model is None else model.name], out)
    print(json.dumps({k: result[k] for k in ("psnr_db", "psnr_db_mean_of_frames", "psnr_db_surfaces_mean_of_frames",
                                             "shadow_ratio", "sphere_contrast",
                                             "render_seconds")}))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("scene", help="build the street in Blender, export G-buffers, render the truth and masks")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("sky-check", help="the add-on's sky pass on OUT/street.blend: cost and noise per setting")
    p.add_argument("--in", dest="src", type=Path, required=True)
    p.add_argument("--json", type=Path, required=True, help="the report")
    p = sub.add_parser("compare", help="render the export with the default model and score it against the truth")
    p.add_argument("--in", dest="src", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="the figure (.png or .jpg)")
    p.add_argument("--json", type=Path, required=True, help="the report")
    p.add_argument("--render-dir", type=Path, default=None, help="where the model's PNG frames go (default IN/render)")
    p.add_argument("--model", type=Path, default=None, help="a Flash model folder (default: the embedded default)")
    p.add_argument("--light", action="store_true", help="give the model the scene's sun (else the prompt's light)")
    p.add_argument("--shadow-pass", action="store_true", help="give it the ray-cast sun masks as the shadow pass")
    p.add_argument("--sky-pass", action="store_true", help="give it the add-on's sky pass (the sky masks)")
    args = parser.parse_args(argv)
    if args.command == "scene":
        return make_scene(args.out)
    if args.command == "sky-check":
        return sky_check(args.src, args.json)
    return compare(args.src, args.out, args.json, args.render_dir, args.model, args.light, args.shadow_pass,
                   args.sky_pass)


if __name__ == "__main__":
    sys.exit(main())
