"""Real Blender to `alaya-flash render`, no manual conversion (issue #31).

tests/blender_addon_scene.py runs in a Python with the `bpy` wheel (Blender 5.0.1 as a module; its
own venv, .venv-bpy, because bpy pins numpy<2 and Python 3.11: see the Makefile): it installs the
add-on integrations/blender/alaya_flash_blender_addon.py with Blender's own operators, builds a small scene
(a floor, two boxes, a camera that moves and turns over 4 frames, 32x32) and presses the add-on's
"Render G-Buffers (Fast)" (Cycles, 1 sample, no bounces). This test then runs `alaya-flash gbuffers
info` and `alaya-flash render` on that folder as it is, and checks every pixel the reader gives
against the scene ray cast here from the scene's own numbers: planar depth in metres, normals in
camera space (the world normal seen from each frame's camera), albedo/metallic/roughness equal to
the materials' (one fed through node links).

The Python with bpy: $ALAYA_BPY_PYTHON, else .venv-bpy/bin/python (made by `make test`), else this
one if it has bpy; none: skipped, saying how to get it. A .venv-bpy that `make` finished
(.venv-bpy/.installed) but that fails is a failure, not a skip.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import blender_addon_scene as scene
import blender_shadow_scene as shadow_scene
import blender_sky_scene as sky_scene
from alaya_flash.streaming.cli import main
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.values import gbuffer_chunks
from test_engines_normals import _rot  # the same rotation helper

ROOT = Path(__file__).resolve().parents[1]
BPY_VENV = ROOT / ".venv-bpy"
INSTALL = "python3.11 -m venv .venv-bpy && .venv-bpy/bin/pip install bpy==5.0.1 (make test does it)"


def _bpy_python() -> tuple[str | None, bool]:
    """(a Python with bpy or None, whether a failure there must fail the test rather than skip it)."""
    if os.environ.get("ALAYA_BPY_PYTHON"):
        return os.environ["ALAYA_BPY_PYTHON"], True
    if (BPY_VENV / "bin" / "python").exists():
        return str(BPY_VENV / "bin" / "python"), (BPY_VENV / ".installed").exists()
    if importlib.util.find_spec("bpy") is not None:
        return sys.executable, True
    return None, False


def _run_in_blender(script: str, work: Path, out: Path) -> str:
    """Run tests/SCRIPT OUT with the Python that has bpy (skip without one); its stdout."""
    python, required = _bpy_python()
    if python is None:
        pytest.skip(f"no Python with bpy (Blender as a module): {INSTALL}, or set ALAYA_BPY_PYTHON")
    env = {**os.environ, "BLENDER_USER_RESOURCES": str(work / "user")}  # the add-on installs here, not in ~
    done = subprocess.run([python, str(ROOT / "tests" / script), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        msg = f"{python} tests/{script} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        if not required and "No module named 'bpy'" in done.stderr:
            pytest.skip(f"{python} has no bpy: {INSTALL}")
        pytest.fail(msg)
    return done.stdout


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    work = tmp_path_factory.mktemp("blender")
    out = work / "shot"
    stdout = _run_in_blender("blender_addon_scene.py", work, out)
    report = json.loads((work / "shot.report.json").read_text())
    return out, report, stdout


# ---------------------------------------------------------------------------------------------
# The scene's truth, from its own numbers (not from anything Blender wrote).


def camera_to_world(frame: int) -> np.ndarray:
    """Blender's matrix_world of the camera at frame index 0..3 (Euler XYZ: R = Rz Ry Rx)."""
    loc, (rx, ry, rz) = scene.CAMERA[frame]
    m = np.eye(4)
    m[:3, :3] = _rot(2, rz) @ _rot(1, ry) @ _rot(0, rx)
    m[:3, 3] = loc
    return m


FOV_Y = 2 * np.degrees(np.arctan(scene.SENSOR_MM / 2 / scene.LENS_MM))


def ray_cast(c2w: np.ndarray, offset=(0.0, 0.0)):
    """Per pixel centre (+ offset in pixels): planar depth (inf: sky), world normal, object name."""
    n = scene.SIZE
    f = (n / 2) / np.tan(np.radians(FOV_Y) / 2)
    x = (np.arange(n) + 0.5 + offset[0] - n / 2) / f
    y = -(np.arange(n) + 0.5 + offset[1] - n / 2) / f
    d = np.stack(np.broadcast_arrays(x[None, :], y[:, None], -np.ones((n, n))), -1)  # camera z = -1: t is planar depth
    d = d @ c2w[:3, :3].T
    o = c2w[:3, 3]
    depth = np.full((n, n), np.inf)
    normal = np.zeros((n, n, 3))
    name = np.full((n, n), "sky", dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -o[2] / d[..., 2]  # the floor z = 0
        p = o + t[..., None] * d
        hit = (t > 0) & (np.abs(p[..., 0]) <= scene.FLOOR_HALF) & (np.abs(p[..., 1]) <= scene.FLOOR_HALF)
        depth[hit], normal[hit], name[hit] = t[hit], (0, 0, 1), "floor"
        for box, (centre, half, rot_z, _) in scene.BOXES.items():
            r = _rot(2, rot_z)
            lo, ld = (o - centre) @ r, d @ r  # into the box's frame (r orthonormal: r.T v = v @ r)
            t1, t2 = (-np.array(half) - lo) / ld, (np.array(half) - lo) / ld
            near, far = np.minimum(t1, t2), np.maximum(t1, t2)
            t_in, axis = near.max(-1), near.argmax(-1)
            hit = (t_in > 0) & (t_in <= far.min(-1)) & (t_in < depth)
            local = np.zeros((n, n, 3))
            np.put_along_axis(local, axis[..., None], -np.sign(np.take_along_axis(ld, axis[..., None], -1)), -1)
            depth[hit], normal[hit], name[hit] = t_in[hit], (local @ r.T)[hit], box
    return depth, normal, name


def _away_from_edges(c2w: np.ndarray) -> np.ndarray:
    """Pixels whose centre and points 0.05 px around it see the same object: the fast render shoots
    one ray within 0.005 px of the centre, so these pixels are one surface's values."""
    _, _, name = ray_cast(c2w)
    ok = np.ones(name.shape, bool)
    for off in ((0.05, 0.05), (-0.05, 0.05), (0.05, -0.05), (-0.05, -0.05)):
        ok &= ray_cast(c2w, off)[2] == name
    return ok


# ---------------------------------------------------------------------------------------------


def test_addon_fast_render_puts_the_scene_back(export):
    out, report, stdout = export
    assert report["result"] == ["FINISHED"] and report["blender"].split(".")[0] in ("4", "5")  # 4.2+ and 5.x
    assert report["operators"] == ["render_gbuffers", "setup_export", "write_camera"] and report["panel"]
    frames = ["0001.exr", "0002.exr", "0003.exr", "0004.exr"]  # and the shadow pass beside them (a Sun; sky: off)
    assert sorted(p.name for p in out.iterdir()) == frames + ["camera.json"] + [f"shadow_{f}" for f in frames]
    after = report["after"]  # the scene's own settings again (Workbench, 64 samples, motion blur, depth of field)
    assert after["engine"] == "BLENDER_WORKBENCH"
    assert (after["samples"], after["motion_blur"], after["dof"], after["filter_width"]) == (64, True, True, 1.5)
    assert after["filepath"] == str(out / "####") and after["frame"] == 1
    assert after["file_format"] == "OPEN_EXR_MULTILAYER" and report["aovs"] == ["albedo", "metallic", "roughness"]
    assert "no Principled BSDF (no AOVs): glow" in stdout  # the operator names the material it could not feed
    direct = report["direct"]  # render_gbuffers(scene, folder), as a headless script calls it
    assert direct["frames"] == ["0001.exr", "0002.exr", "0003.exr", "0004.exr"] and direct["skipped"] == ["glow"]
    assert direct["camera"] == str(out.parent / "direct" / "camera.json")
    assert (direct["filepath"], direct["samples"]) == (str(out / "####"), 64)  # the output path is the scene's again
    assert report["no_camera"] == {"error": "the scene has no active camera", "samples": 64,
                                   "engine": "BLENDER_WORKBENCH"}  # refused before changing anything
    assert not (out.parent / "no-camera").exists()
    cam = json.loads((out / "camera.json").read_text())
    assert cam["camera_axes"] == "opengl" and cam["fov_y_deg"] == pytest.approx(FOV_Y, abs=1e-4)
    for i, m in enumerate(cam["camera_to_world"]):
        np.testing.assert_allclose(m, camera_to_world(i), atol=1e-5)


def test_gbuffers_info_reads_the_export_as_blender(export, capsys):
    out, _, _ = export
    assert main(["gbuffers", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "blender conventions" in text and "frames:  4" in text and "size:    32x32" in text
    assert "metallic   min 0  max 1" in text and "roughness  min 0  max 0.7" in text
    assert "background +inf" in text


def test_passes_match_the_scene(export, caplog):
    out, _, _ = export
    with caplog.at_level(logging.INFO):
        frames = list(open_gbuffers(out))
    assert "conventions auto: blender" in caplog.text and "WARNING" not in caplog.text
    assert len(frames) == scene.FRAMES
    seen = set()
    for i, frame in enumerate(frames):
        c2w = camera_to_world(i)
        depth, normal_world, name = ray_cast(c2w)
        ok = _away_from_edges(c2w)
        assert ok.mean() > 0.85
        sky = ok & (name == "sky")
        surf = ok & (name != "sky")
        # depth: planar, in metres (a radial depth would be up to 30% off in the corners, cm 100x)
        np.testing.assert_allclose(frame.depth[surf], depth[surf], rtol=2e-4)
        assert np.isposinf(frame.depth[sky]).all() and (frame.normal[sky] == (0, 0, 1)).all()
        # normals: camera space (OpenGL axes), i.e. the world normal seen from this frame's camera
        np.testing.assert_allclose(frame.normal[surf], normal_world[surf] @ c2w[:3, :3], atol=2e-4)
        for obj, (_, _, _, mat) in {**scene.BOXES, "floor": (0, 0, 0, "floor")}.items():
            px = ok & (name == obj)
            if not px.any():
                continue
            seen.add(obj)
            color, metallic, roughness, _ = scene.MATERIALS.get(mat, ((0, 0, 0), 0.0, 0.0, ""))  # glow: no AOVs
            np.testing.assert_allclose(frame.albedo[px], np.broadcast_to(color, frame.albedo[px].shape), atol=1e-6)
            np.testing.assert_allclose(frame.metallic[px], metallic, atol=1e-6)
            np.testing.assert_allclose(frame.roughness[px], roughness, atol=1e-6)
        assert frame.extras["rgb"].shape == (scene.SIZE, scene.SIZE, 3)
    assert frames[0].depth[0].tolist() == [np.inf] * scene.SIZE  # frame 1 sees the sky in its top row
    assert {"floor", "metal", "plastic"} <= seen


def test_render_cli_on_the_export_as_it_is(export, tmp_path):
    import av

    out, _, _ = export
    video = tmp_path / "shot.mp4"
    assert main(["--quiet", "render", str(out), "--prompt", "a red floor, a steel cube and a blue box",
                 "--out", str(video)]) == 0
    with av.open(str(video)) as f:
        images = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    assert len(images) == scene.FRAMES and images[0].shape == (scene.SIZE, scene.SIZE, 3)
    assert max(float(im.std()) for im in images) > 1.0  # a picture, not a flat fill


# ---------------------------------------------------------------------------------------------
# The shadow pass: a floor, a 1 m cube and a Sun at 45 degrees (tests/blender_shadow_scene.py).


@pytest.fixture(scope="module")
def shadow_export(tmp_path_factory):
    work = tmp_path_factory.mktemp("blender-shadow")
    _run_in_blender("blender_shadow_scene.py", work, work / "out")
    return work / "out", json.loads((work / "out" / "report.json").read_text())


def _shadow_of(folder: Path, name: str = "shadow") -> np.ndarray | None:
    """The light pass `name` as the readers give it, uint8 (T, H, W), or None."""
    chunks = list(gbuffer_chunks(open_gbuffers(folder), 4))
    if getattr(chunks[0], name) is None:
        assert all(getattr(c, name) is None for c in chunks)
        return None
    return np.concatenate([getattr(c, name).numpy() for c in chunks])


def test_shadow_pass_of_the_sun(shadow_export):
    out, report = shadow_export
    assert report["option_default"] is True and report["sun"] == ["FINISHED"]
    assert sorted(p.name for p in (out / "sun").glob("shadow_*")) == ["shadow_0001.exr", "shadow_0002.exr"]
    shadow = _shadow_of(out / "sun")
    assert shadow.shape == (shadow_scene.FRAMES, shadow_scene.SIZE, shadow_scene.SIZE) and shadow.dtype == np.uint8
    # each pixel centre's point on the floor (the camera looks straight down from CAMERA_HEIGHT)
    n, h = shadow_scene.SIZE, shadow_scene.CAMERA_HEIGHT
    f = (n / 2) / (shadow_scene.SENSOR_MM / 2 / shadow_scene.LENS_MM)
    x = np.broadcast_to((np.arange(n) + 0.5 - n / 2) / f * h, (n, n))
    y = np.broadcast_to(-(np.arange(n)[:, None] + 0.5 - n / 2) / f * h, (n, n))
    seen_at_top = np.maximum(abs(x), abs(y)) * (h - shadow_scene.CUBE) / h  # where the ray crosses the cube's top
    floor = seen_at_top > 0.5 + 0.1  # misses the cube by 10 cm
    top = seen_at_top < 0.5 - 0.1  # the cube's top face
    # the cube's shadow on the floor (sun at 45 degrees towards -x): x in [0.5, 1.5], |y| <= 0.5; 10 cm margins
    shaded = floor & (x > 0.6) & (x < 1.4) & (abs(y) < 0.4)
    near_edge = (x > 0.4) & (x < 1.6) & (abs(y) < 0.6)
    lit = (floor & ~near_edge) | top
    assert shaded.sum() >= 12 and lit.sum() > 0.8 * n * n
    for frame in shadow:
        assert (frame[shaded] == 0).all() and (frame[lit] == 255).all()
    assert set(np.unique(shadow)) == {0, 255}  # hard shadows, written exactly


def test_no_shadow_pass_without_a_sun_or_when_off(shadow_export):
    out, report = shadow_export
    assert report["no_sun"] == ["FINISHED"] and report["off"] == []
    for folder in ("no-sun", "off"):
        assert not list((out / folder).glob("shadow_*"))
        assert _shadow_of(out / folder) is None


# ---------------------------------------------------------------------------------------------
# The sky pass: a ground plane, a roof over part of it open along one edge, a closed room
# (tests/blender_sky_scene.py). Read with OpenEXR directly.


@pytest.fixture(scope="module")
def sky_export(tmp_path_factory):
    work = tmp_path_factory.mktemp("blender-sky")
    _run_in_blender("blender_sky_scene.py", work, work / "out")
    return work / "out", json.loads((work / "out" / "report.json").read_text())


def _read_pass(path: Path) -> np.ndarray:
    """A light pass the add-on wrote: float32 R = G = B; R."""
    import OpenEXR

    with OpenEXR.File(str(path), separate_channels=True) as f:
        channels = {k: np.asarray(v.pixels) for k, v in f.channels().items()}
    assert sorted(channels) == ["B", "G", "R"] and channels["R"].dtype == np.float32
    assert (channels["R"] == channels["G"]).all() and (channels["R"] == channels["B"]).all()
    return channels["R"]


def _sky_truth(frame: int):
    """Per pixel centre of sky_scene's camera at frame index 0, 1 or 2: what it sees ("ground", "under"
    the roof, "wall", "sky" or "room") and, on the ground, the share of the sky it sees. An edge at height
    H open on one side (the roof's, closed far beyond the ground; the wall's top, long): a ground point
    sees the sky above the plane through it and the edge, a cosine-weighted fraction (1 - s) / 2, s = d /
    sqrt(d^2 + H^2), d how far the point is under the edge (negative in front of it). Under the roof its
    underside bounds it (H = ROOF_HEIGHT), outside its top (+ ROOF_THICKNESS)."""
    n = sky_scene.SIZE
    loc, (rx, ry, rz) = sky_scene.CAMERA[frame]
    f = (n / 2) / (sky_scene.SENSOR_MM / 2 / sky_scene.LENS_MM)
    x = (np.arange(n) + 0.5 - n / 2) / f
    d = np.stack(np.broadcast_arrays(x[None, :], -x[:, None], -np.ones((n, n))), -1) @ (_rot(2, rz) @ _rot(1, ry) @ _rot(0, rx)).T
    o = np.asarray(loc)
    if frame == 1:
        return np.full((n, n), "room", dtype=object), None
    (x0, y0), (x1, y1) = sky_scene.ROOF
    (wx, wy), (sx, sy), wall_h = sky_scene.WALL
    with np.errstate(divide="ignore", invalid="ignore"):
        t = {"ground": -o[2] / d[..., 2], "under": (sky_scene.ROOF_HEIGHT - o[2]) / d[..., 2],
             "wall": (wy - sy / 2 - o[1]) / d[..., 1]}  # its face towards frame 3's camera
    p = {k: o + v[..., None] * d for k, v in t.items()}
    ground_x = o[0] if frame == 2 else 0.0
    inside = {"ground": (abs(p["ground"][..., 0] - ground_x) <= sky_scene.GROUND_HALF)
                        & (abs(p["ground"][..., 1]) <= sky_scene.GROUND_HALF),
              "under": (frame == 0) & (p["under"][..., 0] >= x0) & (p["under"][..., 0] <= x1)
                       & (abs(p["under"][..., 1]) <= y1),
              "wall": (frame == 2) & (abs(p["wall"][..., 0] - wx) <= sx / 2) & (p["wall"][..., 2] >= 0)
                      & (p["wall"][..., 2] <= wall_h)}
    what = np.full((n, n), "sky", dtype=object)
    nearest = np.full((n, n), np.inf)
    for k in t:
        hit = inside[k] & (t[k] > 0) & (t[k] < nearest)
        what[hit], nearest[hit] = k, t[k][hit]
    if frame == 0:
        dist = -p["ground"][..., 0]
        h = np.where(dist > 0, sky_scene.ROOF_HEIGHT, sky_scene.ROOF_HEIGHT + sky_scene.ROOF_THICKNESS)
    else:
        dist, h = p["ground"][..., 1] - (wy - sy / 2), wall_h
    sky = np.where(what == "ground", (1 - dist / np.hypot(dist, h)) / 2, np.nan)
    return what, sky


def _inner(what: np.ndarray) -> np.ndarray:
    """Pixels whose 8 neighbours see the same kind of thing as they do (the pass is denoised)."""
    same = np.zeros(what.shape, bool)
    same[1:-1, 1:-1] = True
    n = what.shape[0]
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            same[1:-1, 1:-1] &= what[1 + dy:n - 1 + dy, 1 + dx:n - 1 + dx] == what[1:-1, 1:-1]
    return same


def test_sky_pass_open_ground_overhang_room_and_sky(sky_export):
    out, report = sky_export
    assert report["option_default"] is False and report["on"] == ["FINISHED"]
    # the settings it switched for its own render are the scene's again, its world and material gone
    assert report["after"] == {"world": True, "override": True, "sun_hidden": False, "samples": 4096,
                               "file_format": "OPEN_EXR_MULTILAYER", "worlds": 1, "materials": 0}
    assert sorted(p.name for p in (out / "on").glob("sky_*")) == ["sky_0001.exr", "sky_0002.exr", "sky_0003.exr"]
    errors = []
    for frame in (0, 2):
        sky = _read_pass(out / "on" / f"sky_{frame + 1:04d}.exr")
        assert sky.shape == (sky_scene.SIZE, sky_scene.SIZE)
        what, truth = _sky_truth(frame)
        inner = _inner(what)
        ground = inner & (what == "ground")
        assert (inner & (what == "sky")).sum() > 100 and (sky[inner & (what == "sky")] == 1.0).all()  # background: 1
        errors.append(sky[ground] - truth[ground])
        window = np.lib.stride_tricks.sliding_window_view(np.nan_to_num(truth), (3, 3))
        steady = ground.copy()  # and whose 3x3's truth spans < 0.2 (not where the ground recedes to the horizon)
        steady[1:-1, 1:-1] &= np.ptp(window, axis=(-2, -1)) < 0.2
        assert abs(sky[steady] - truth[steady]).max() < 0.06
        if frame == 0:
            open_ground = ground & (truth > 0.97)
            assert open_ground.sum() > 50 and sky[open_ground].mean() > 0.97
            under = inner & (what == "under")  # the roof's underside faces down: no sky above the horizon
            assert under.sum() > 20 and (sky[under] < 0.02).all()
            overhang = ground & (truth > 0.1) & (truth < 0.5)  # the ground under the roof, near its open edge
            assert overhang.sum() > 30 and 0.1 < sky[overhang].min() and sky[overhang].max() < 0.55
        else:  # an open wall sees half the sky's rays, all it can (divided by (1 + n.z) / 2)
            wall = inner & (what == "wall")
            assert wall.sum() > 300 and sky[wall].mean() > 0.98 and sky[wall].min() > 0.9
    err = np.concatenate(errors)  # the ground against (1 - s) / 2: 16 samples a pixel, denoised
    assert abs(err).mean() < 0.015 and abs(err.mean()) < 0.005, (abs(err).mean(), err.mean())
    room = _read_pass(out / "on" / "sky_0002.exr")  # frame 2: inside the closed room, every wall blocks the sky
    assert room.max() < 0.02
    files = np.stack([_read_pass(out / "on" / f"sky_{k:04d}.exr") for k in (1, 2, 3)])
    np.testing.assert_array_equal(_shadow_of(out / "on", "sky"), np.rint(files * 255))  # the readers take it as written


def test_no_sky_pass_when_off(sky_export):
    out, report = sky_export
    assert report["off"] == [] and not list((out / "off").glob("sky_*")) and _shadow_of(out / "off", "sky") is None
    assert sorted(p.name for p in (out / "off").glob("*.exr")) == ["0001.exr", "0002.exr", "0003.exr",
                                                                   "shadow_0001.exr", "shadow_0002.exr",
                                                                   "shadow_0003.exr"]
