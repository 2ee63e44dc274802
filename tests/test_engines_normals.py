"""The check for normals declared camera-space that look world-space (issue #31).

A camera-space normal predicts which way the depth map slopes (conventions.normal_depth_agreement):
world-space normals read as camera-space disagree with it (the ground's normal stays (0, 0, 1)
while the camera turns and the ground's depth slopes); correct normals agree whether the camera
is static, dollies (normals fixed, depth changing) or turns. Small scenes ray cast here (a ground
plane and a ball, exact planar depth), then the real Blender fixtures with their normals converted
(camera.json) and not.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from alaya_flash.streaming.files import conventions as cv
from alaya_flash.streaming.files.image_files import write_exr
from alaya_flash.streaming.files.readers import open_gbuffers

H, W = 24, 32
FIXTURES = Path(__file__).parent / "data" / "engines"
WARNING = "disagree with the depth map's slopes"


def _rot(axis: int, deg: float) -> np.ndarray:
    c, s = np.cos(np.radians(deg)), np.sin(np.radians(deg))
    i, j = (axis + 1) % 3, (axis + 2) % 3
    m = np.eye(3)
    m[i, i], m[i, j], m[j, i], m[j, j] = c, -s, s, c
    return m


def look(pitch: float, yaw: float = 0.0, pos=(0.0, -6.0, 2.5)) -> np.ndarray:
    """Camera-to-world (OpenGL camera, Z-up world): pitch degrees from straight down, then yaw about Z."""
    m = np.eye(4)
    m[:3, :3] = _rot(2, yaw) @ _rot(0, pitch)
    m[:3, 3] = pos
    return m


def scene(c2w: np.ndarray, fov_y: float = 60.0, ball=((0.0, 0.0, 1.0), 1.0)):
    """Planar depth (+inf: sky), camera-space normals and world normals of a ground plane z=0 and a ball."""
    f = (H / 2) / np.tan(np.radians(fov_y) / 2)
    x = (np.arange(W) + 0.5 - W / 2) / f
    y = -(np.arange(H) + 0.5 - H / 2) / f
    d = np.stack(np.broadcast_arrays(x[None, :], y[:, None], -np.ones((H, W))), -1) @ c2w[:3, :3].T
    o = c2w[:3, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(-o[2] / d[..., 2] > 0, -o[2] / d[..., 2], np.inf)
    world = np.broadcast_to(np.float64([0, 0, 1]), (H, W, 3)).copy()
    centre, r = np.asarray(ball[0]), ball[1]
    oc = o - centre
    a = (d * d).sum(-1)
    b = (d @ oc)
    disc = b * b - a * (oc @ oc - r * r)
    with np.errstate(invalid="ignore"):
        tb = (-b - np.sqrt(disc)) / a
    hit = (disc > 0) & (tb > 0) & (tb < t)
    t = np.where(hit, tb, t)
    world[hit] = ((o + tb[..., None] * d) - centre)[hit] / r
    camera = world @ c2w[:3, :3]  # R^T n
    camera[np.isinf(t)] = world[np.isinf(t)] = (0, 0, 1)
    return t.astype(np.float32), camera.astype(np.float32), world.astype(np.float32)


def write_clip(folder: Path, cams, normals: str = "camera", edit=None) -> Path:
    """Float EXRs in our own channel names (conventions alaya: normals declared camera-space)."""
    folder.mkdir(parents=True)
    for i, c2w in enumerate(cams):
        depth, cam_n, world_n = scene(c2w)
        n = cam_n if normals == "camera" else world_n
        if edit:
            depth, n = edit(depth, n)
        chans = {f"albedo.{c}": np.full((H, W), 0.5, np.float32) for c in "RGB"}
        chans.update({"depth.Z": depth, "metallic.Y": np.zeros((H, W), np.float32),
                      "roughness.Y": np.full((H, W), 0.5, np.float32)})
        chans.update({f"normal.{c}": n[..., k] for k, c in enumerate("XYZ")})
        write_exr(folder / f"{i:04d}.exr", chans)
    return folder


TURNING = [look(70, 0), look(65, 20, (1, -5.5, 2.6)), look(60, 40, (2, -5, 2.8))]
STATIC = [look(65, 10)] * 3
DOLLY = [look(65, 0, (0, -6 + 1.0 * i, 3.0 - 0.6 * i)) for i in range(3)]  # forward and down, not turning: normals
# fixed, depth changing


@pytest.mark.parametrize("cams", [TURNING, STATIC, DOLLY], ids=["turning", "static", "dolly"])
def test_agreement_counts_on_exact_passes(cams):
    for c2w in cams:
        depth, cam_n, world_n = scene(c2w)
        agree, disagree, sampled = cv.normal_depth_agreement(depth, cam_n)
        assert disagree == 0 and agree > 0.3 * sampled  # ground and ball, camera-space: they agree
        agree, disagree, _ = cv.normal_depth_agreement(depth, world_n)
        assert disagree > 0.3 * sampled and agree < disagree / 4  # world-space read as camera-space


def test_dolly_keeps_normals_fixed_and_changes_depth():
    """The case a 'normals fixed while depth changes' rule would get wrong: it is a correct clip."""
    (d0, n0, _), (d2, n2, _) = scene(DOLLY[0]), scene(DOLLY[2])
    ground = np.isfinite(d0) & np.isfinite(d2) & (n0[..., 2] < 0.999) & (np.abs(n0 - n2).max(-1) < 1e-6)
    assert ground.sum() > 100 and (np.abs(d0[ground] - d2[ground]) / d0[ground] > 0.3).mean() > 0.9


@pytest.mark.parametrize("cams", [TURNING, STATIC, DOLLY], ids=["turning", "static", "dolly"])
def test_camera_space_normals_do_not_warn(tmp_path, caplog, cams):
    with caplog.at_level(logging.WARNING):
        frames = list(open_gbuffers(write_clip(tmp_path / "c", cams)))
    assert len(frames) == 3 and "WARNING" not in caplog.text


@pytest.mark.parametrize("cams", [TURNING, STATIC], ids=["turning", "static-tilted"])
def test_world_space_normals_declared_camera_space_warn_once(tmp_path, caplog, cams):
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(write_clip(tmp_path / "w", cams, normals="world")))
    assert caplog.text.count(WARNING) == 1  # once per stream
    assert "they look world-space" in caplog.text and "--conventions blender|unreal|unity" in caplog.text
    assert "camera.json" in caplog.text
    assert "face away" not in caplog.text  # Z-up world normals face 'the viewer': the old check saw nothing


def test_camera_straight_down_world_equals_camera_no_warning(tmp_path, caplog):
    """Looking straight down a Z-up world with +Y up in the image, world and camera normals coincide."""
    down = [look(0, 0, (0, 0, 6))] * 2
    for c2w in down:
        _, cam_n, world_n = scene(c2w)
        np.testing.assert_allclose(cam_n, world_n, atol=1e-6)
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(write_clip(tmp_path / "d", down, normals="world")))
    assert "WARNING" not in caplog.text


@pytest.mark.parametrize("edit", [
    lambda d, n: (d.astype(np.float16).astype(np.float32), n),  # half-float depth (Unreal)
    lambda d, n: (d, _jitter(n, 4.0)),  # normals a few degrees off (a normal map, filtering)
], ids=["half-depth", "jittered-normals"])
def test_imprecise_but_correct_passes_do_not_warn(tmp_path, caplog, edit):
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(write_clip(tmp_path / "j", TURNING, edit=edit)))
    assert WARNING not in caplog.text


def _jitter(n: np.ndarray, degrees: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    out = n + rng.normal(scale=np.radians(degrees), size=n.shape)
    return (out / np.linalg.norm(out, axis=-1, keepdims=True)).astype(np.float32)


def test_too_small_or_featureless_frames_do_not_warn():
    depth = np.full((H, W), 3.0, np.float32)  # a wall facing the camera: nothing to tell
    assert cv.normal_depth_agreement(depth, np.broadcast_to(np.float32([0, 0, 1]), (H, W, 3)))[:2] == (0, 0)
    assert cv.normal_depth_agreement(depth[:2, :2], np.zeros((2, 2, 3), np.float32)) == (0, 0, 0)


# ---------------------------------------------------------------------------------------------
# Real Blender exports (tests/data/engines): converted with camera.json, or read as our own form.


@pytest.mark.parametrize("version", ["blender4", "blender5"])
def test_real_blender_normals_converted_vs_not(version, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(FIXTURES / version))  # blender conventions + camera.json: camera space
    assert WARNING not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # the same files read as if their normals were camera-space
        list(open_gbuffers(FIXTURES / version, conventions="alaya"))
    assert caplog.text.count(WARNING) == 1 and "they look world-space" in caplog.text
    # camera.json with world_to_camera matrices under camera_to_world: converted wrongly, and said so
    d = tmp_path / version
    shutil.copytree(FIXTURES / version, d)
    cam = json.loads((d / "camera.json").read_text())
    cam["camera_to_world"] = [np.linalg.inv(np.array(m)).tolist() for m in cam["camera_to_world"]]
    (d / "camera.json").write_text(json.dumps(cam))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        list(open_gbuffers(d))
    assert caplog.text.count(WARNING) == 1 and "check camera.json" in caplog.text
