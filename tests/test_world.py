"""Physics world: rasterizer vs ray-caster oracle, ground truth from G-buffers alone, determinism,
the stream-source API, the playable loop and bad input. Small sizes keep it fast on 2 cores."""
import dataclasses
import logging

import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.gbuffer import MODALITIES, teacher_to_frame
from alaya_flash.streaming.world import (
    PRESETS, Camera, Controls, PlayableWorld, SceneConfig, WorldConfig, WorldSource, build_scene, shade,
)
from alaya_flash.streaming.world import raster
from alaya_flash.streaming.world.raster import GLRenderer, GLUnavailable, make_renderer
from alaya_flash.streaming.world.raycast import RayCaster
from alaya_flash.streaming.world.scene import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, PLANE, SPHERE

SIZE = 96


@pytest.fixture(scope="module")
def scene():
    sc = build_scene(SceneConfig(seed=5, num_objects=14))
    sc.step(0.6)  # mid-fall: objects in the air, some landed
    return sc


def _compare(a, b):
    ida, idb = a["object_id"], b["object_id"]
    both = (ida == idb) & (ida > 0)
    rel = np.abs(a["depth"][both] - b["depth"][both]) / b["depth"][both]
    cos = np.clip((a["normal"][both] * b["normal"][both]).sum(-1), -1, 1)
    return (ida == idb).mean(), np.median(rel), np.median(np.degrees(np.arccos(cos))), both


@pytest.mark.parametrize("eye", [(3.5, -3.0, 2.5), (-1.0, 4.0, 1.2)])
def test_rasterizer_matches_ray_caster_oracle(scene, eye):
    cam = Camera.look_at(eye, (0.0, 0.0, 0.3), SIZE, SIZE, fov_y=60.0)
    gl = GLRenderer(scene, SIZE, SIZE).render(cam)
    rc = RayCaster(scene, SIZE, SIZE).render(cam)
    agree, depth_err, normal_deg, both = _compare(gl, rc)
    assert len(np.unique(gl["object_id"])) >= 6  # the view really contains several objects
    assert agree >= 0.999
    assert depth_err < 1e-4
    assert normal_deg < 1.0
    np.testing.assert_array_equal(gl["metallic"][both], rc["metallic"][both])
    np.testing.assert_array_equal(gl["roughness"][both], rc["roughness"][both])
    # Checker albedo may flip only on the odd pixel that sits on a cell border.
    assert (np.abs(gl["albedo"][both] - rc["albedo"][both]).max(-1) < 1e-5).mean() > 0.995


def test_scene_has_every_kind_and_objects_fall():
    sc = build_scene(SceneConfig(seed=1, num_objects=40))
    kinds = set(sc.model.geom_type.tolist())
    assert {PLANE, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH} <= kinds
    z0 = sc.data.xpos[sc.dynamic_bodies, 2].copy()
    sc.step(1.0)
    z1 = sc.data.xpos[sc.dynamic_bodies, 2]
    assert np.median(z1 - z0) < -0.2  # things fell
    assert (z1 > -0.05).all()  # and landed on the floor, not through it
    m = sc.materials
    assert m.metallic.min() >= 0 and m.roughness.max() <= 1 and (m.checker > 0).any()


def test_ground_truth_is_reproducible_from_gbuffers_alone():
    # The world shades on the GL side; shade() (numpy) on the passes alone must agree within 1/255.
    names = ("sunset_dramatic",) + tuple(n for n in PRESETS if n != "sunset_dramatic")
    src = WorldSource(WorldConfig(seed=2, width=64, height=48, num_frames=3, num_objects=8, presets=names))
    for frame, cam in src.frames_with_cameras():
        frame.validate()
        # A copy of the passes and the camera rebuilt from its JSON: nothing else goes in.
        passes = {k: v.copy() for k, v in frame.passes().items()}
        meta = cam.to_json()
        cam2 = Camera(meta["width"], meta["height"], meta["fov_y_deg"], np.array(meta["world_to_camera"]))
        for name in ("sunset_dramatic", "cyberpunk_neon", "snowy_winter"):
            again = shade(passes, cam2, name)
            assert np.abs(again.astype(int) - frame.extras[f"rgb_{name}"].astype(int)).max() <= 1
        np.testing.assert_array_equal(frame.extras["rgb"], frame.extras["rgb_sunset_dramatic"])
    # The presets really differ.
    assert np.abs(frame.extras["rgb_cyberpunk_neon"].astype(int) - frame.extras["rgb_snowy_winter"]).mean() > 20


def test_shadows_export_sun_visibility_and_gt_follows_it():
    src = WorldSource(WorldConfig(seed=4, width=64, height=64, num_frames=2, num_objects=10,
                                  presets=("bright_sunny", "sunset_dramatic"), shadows=True))
    frame, cam = list(src.frames_with_cameras())[-1]
    vis = frame.extras["sun_visibility_sunset_dramatic"]
    again = shade(frame.passes(), cam, "sunset_dramatic", vis)
    assert np.abs(again.astype(int) - frame.extras["rgb_sunset_dramatic"].astype(int)).max() <= 1
    vis = frame.extras["sun_visibility"]
    assert vis.shape == (64, 64) and vis.min() >= 0 and vis.max() <= 1
    assert (vis < 0.5).mean() > 0.005  # some shadow is cast
    again = shade(frame.passes(), cam, "bright_sunny", vis)
    assert np.abs(again.astype(int) - frame.extras["rgb"].astype(int)).max() <= 1
    unshadowed = shade(frame.passes(), cam, "bright_sunny")
    shadowed_floor = (vis < 0.5) & (frame.extras["object_id"] == 1)  # geom 0 is the floor, facing the sun
    assert shadowed_floor.any()
    assert (unshadowed.astype(int).sum(-1) > again.astype(int).sum(-1) + 30)[shadowed_floor].mean() > 0.95


def test_same_seed_same_frames_bit_for_bit():
    cfg = WorldConfig(seed=7, width=48, height=40, num_frames=4, num_objects=10, camera="follow")
    runs = [list(WorldSource(cfg)) for _ in range(2)]
    for a, b in zip(*runs):
        for name in MODALITIES:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        for key in a.extras:
            np.testing.assert_array_equal(a.extras[key], b.extras[key])
    other = list(WorldSource(dataclasses.replace(cfg, seed=8)))
    assert not np.array_equal(other[-1].albedo, runs[0][-1].albedo)
    # Frames change over time: albedo, depth and normals vary across the clip.
    first, last = runs[0][0], runs[0][-1]
    assert not np.array_equal(first.depth, last.depth)
    assert not np.array_equal(first.normal, last.normal)


def test_stream_source_api_and_teacher_chunks():
    src = WorldSource(WorldConfig(seed=0, width=32, height=32, num_frames=5, num_objects=4, presets=()))
    assert (src.info.width, src.info.height, src.info.num_frames, len(src)) == (32, 32, 5, 5)
    frames = list(src)
    assert [f.index for f in frames] == list(range(5)) and "rgb" not in frames[0].extras
    chunks = list(src.teacher_chunks(2))
    assert [c.shape for c in chunks] == [(2, 5, 32, 32, 3)] * 2 + [(1, 5, 32, 32, 3)]
    assert chunks[0].dtype == np.uint8
    # Teacher form decodes back to the canonical frame within 8-bit precision.
    back = teacher_to_frame(chunks[1][1], index=3)
    np.testing.assert_allclose(back.metallic, frames[3].metallic, atol=1 / 255 + 1e-6)
    for path in ("orbit", "fly", "follow"):
        f = next(iter(WorldSource(WorldConfig(seed=0, width=32, height=32, num_frames=1, num_objects=3,
                                              camera=path, presets=()))))
        assert (f.extras["object_id"] > 0).mean() > 0.2, path  # every path looks at the scene


def test_no_gl_falls_back_once_or_fails_clearly(monkeypatch, caplog):
    def no_gl(*args, **kwargs):
        raise GLUnavailable("no OpenGL 3.3 context through EGL: test")

    monkeypatch.setattr(raster, "GLRenderer", no_gl)
    monkeypatch.setattr(raster, "_warned", set())
    sc = build_scene(SceneConfig(seed=0, num_objects=2))
    with caplog.at_level(logging.WARNING):
        r1 = make_renderer(sc, 32, 32)
        r2 = make_renderer(sc, 32, 32)
    assert isinstance(r1, RayCaster) and isinstance(r2, RayCaster)
    out = r1.render(Camera.look_at((3, -3, 2), (0, 0, 0), 32, 32), presets=(PRESETS["overcast"],))
    assert out["rgb"].shape == (1, 32, 32, 3) and (out["object_id"] > 0).any()
    assert sum("falling back to the PyTorch ray caster" in r.message for r in caplog.records) == 1
    with pytest.raises(GLUnavailable, match="EGL"):
        make_renderer(sc, 32, 32, backend="gl")


def test_playable_loop_follows_controls():
    game = PlayableWorld(WorldConfig(seed=3, width=32, height=32, fps=30, num_objects=6, presets=()))
    body = game.world.scene.data.xpos[game._player]
    for _ in range(12):
        game.step(Controls())  # settle
    start = body.copy()
    forward = game.world.path.controls.forward()
    for _ in range(20):
        frame = game.step(Controls(move=(0.0, 1.0)))
    moved = body - start
    np.testing.assert_array_equal(game.player_position, body)
    assert moved @ forward > 0.3 and abs(moved @ np.array([forward[1], -forward[0], 0])) < 0.2
    z = body[2]
    game.step(Controls(jump=True))
    game.step(Controls())
    assert body[2] > z + 0.05
    yaw = game.world.path.controls.yaw
    game.step(Controls(yaw=10.0))
    assert game.world.path.controls.yaw == pytest.approx((yaw + 10.0) % 360)
    assert frame.depth.shape == (32, 32) and (frame.extras["object_id"] == 1 + game.world.scene.model.body_geomadr[game._player]).any()
    # Same inputs, same frames.
    again = PlayableWorld(WorldConfig(seed=3, width=32, height=32, fps=30, num_objects=6, presets=()))
    for _ in range(12):
        again.step(Controls())
    for _ in range(20):
        frame2 = again.step(Controls(move=(0.0, 1.0)))
    np.testing.assert_array_equal(frame.depth, frame2.depth)


def test_push_shoves_nearby_objects():
    game = PlayableWorld(WorldConfig(seed=3, width=16, height=16, fps=30, num_objects=30, presets=()))
    for _ in range(20):
        game.step(Controls())
    data = game.world.scene.data
    near = [b for b in game.world.scene.dynamic_bodies if b != game._player
            and np.linalg.norm(data.xpos[b] - data.xpos[game._player]) < 1.4]
    assert near, "scene should have something near the player"
    before = {b: np.linalg.norm(data.xpos[b] - data.xpos[game._player]) for b in near}
    for _ in range(3):
        game.step(Controls(push=True))
    after = {b: np.linalg.norm(data.xpos[b] - data.xpos[game._player]) for b in near}
    assert np.mean([after[b] - before[b] for b in near]) > 0.1


@pytest.mark.parametrize("changes, message", [
    ({"presets": ("sunny_mars",)}, "lighting preset 'sunny_mars' is unknown; choose one of bright_sunny"),
    ({"width": 4}, "width=4 is out of range 8..4096"),
    ({"height": 10000}, "height=10000 is out of range"),
    ({"num_frames": 0}, "frames=0 is out of range"),
    ({"num_objects": 1000}, "objects=1000 is out of range"),
    ({"camera": "drone"}, "camera path 'drone' is unknown; choose one of orbit, fly, follow, controls"),
    ({"shadows": True, "presets": ()}, "shadows need at least one lighting preset"),
    ({"presets": ("overcast", "overcast")}, "repeat a name"),
    ({"backend": "vulkan"}, "backend 'vulkan' is unknown"),
])
def test_bad_world_config_gives_one_clear_line(changes, message):
    cfg = dataclasses.replace(WorldConfig(width=32, height=32, num_frames=1, num_objects=2), **changes)
    with pytest.raises(AlayaError) as err:
        WorldSource(cfg)
        list(WorldSource(cfg))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bad_controls():
    with pytest.raises(AlayaError, match=r"move=\(2.0, 0.0\) is outside"):
        Controls(move=(2.0, 0.0)).validate()
    with pytest.raises(AlayaError, match="finite"):
        Controls(yaw=float("nan")).validate()


def test_camera_projection_matches_intrinsics():
    cam = Camera.look_at((2.0, -3.0, 1.5), (0.1, 0.2, 0.3), 80, 60, fov_y=50.0)
    rot = cam.rotation
    np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-12)
    point = np.array([0.4, -0.2, 0.5, 1.0])
    p_cam = cam.world_to_camera @ point
    u, v, _ = cam.intrinsics @ np.array([p_cam[0], -p_cam[1], -p_cam[2]]) / -p_cam[2]
    clip = cam.projection() @ p_cam
    ndc = clip[:3] / clip[3]
    np.testing.assert_allclose([(ndc[0] + 1) / 2 * 80, (1 - ndc[1]) / 2 * 60], [u, v], atol=1e-9)


def test_shadow_map_agrees_with_shadow_rays(scene):
    cam = Camera.look_at((3.5, -3.0, 2.5), (0.0, 0.0, 0.3), 64, 64)
    sun = (np.array([0.4, 0.3, 0.85]),)
    gl = GLRenderer(scene, 64, 64).render(cam, sun_dirs=sun)["sun_visibility"][0]
    rc = RayCaster(scene, 64, 64).render(cam, sun_dirs=sun)["sun_visibility"][0]
    assert (rc == 0).mean() > 0.01  # there are shadows to compare
    assert (np.abs(gl - rc) < 0.5).mean() > 0.99  # PCF-softened edges may differ


def test_world_is_a_demo_source_and_a_reader_stream():
    from alaya_flash.streaming.cli.demo import DEMO_SOURCES
    from alaya_flash.streaming.files.readers import GBufferStream

    stream = DEMO_SOURCES["world"](width=32, height=24, num_frames=3, seed=1)
    assert isinstance(stream, GBufferStream) and stream.info.num_frames == 3
    chunks = list(stream.teacher_chunks(2))
    assert [c.shape for c in chunks] == [(2, 5, 24, 32, 3), (1, 5, 24, 32, 3)]
    resized = WorldSource(WorldConfig(seed=1, width=32, height=24, num_frames=3, presets=())).stream(size=(12, 16))
    assert next(iter(resized)).depth.shape == (12, 16)
