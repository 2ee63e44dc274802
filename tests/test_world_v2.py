"""World v2: seeded scene descriptions, G-buffers exact against analytic geometry and against
Mitsuba's own view of the same scene, path-traced truth with cast shadows, indirect light and
metal highlights, the sun-side convention and its captions, the clip folder, the shadow metric."""
import dataclasses
import json
import math

import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.gbuffer import frame_to_teacher
from alaya_flash.streaming.metrics import shadow_ratio
from alaya_flash.streaming.world.camera import Camera
from alaya_flash.streaming.world.traced import (KINDS, TRACED_PRESETS, GBufferCaster, TracedConfig, TracedWorld,
                                                caption, make_scene, write_traced_clip)
from alaya_flash.streaming.world.traced.paths import available_paths, camera_path, heading
from alaya_flash.streaming.world.traced.presets import mirrored_caption, placed, side_of, sun_azimuth
from alaya_flash.streaming.world.traced.scene import Box, CameraAnchors, Cylinder, Material, SceneDesc, Sphere
from training_helpers import TINY_VARIANT


def _toy_scene() -> SceneDesc:
    """Ground (top at z = 0), a yawed box, a sphere, a lying cylinder; one plain material each."""
    mats = (Material("stone", (0.5, 0.45, 0.4), roughness=0.8),
            Material("paint", (0.7, 0.1, 0.1), roughness=0.35),
            Material("metal", (0.9, 0.85, 0.8), metallic=1.0, roughness=0.1),
            Material("rubber", (0.05, 0.05, 0.06), roughness=0.9))
    shapes = (Box((0.0, 0.0, -0.1), (40.0, 40.0, 0.2), 0, 1),
              Box((1.0, 0.5, 0.5), (1.0, 1.4, 1.0), 1, 2, yaw=25.0),
              Sphere((-1.2, 0.2, 0.6), 0.6, 2, 3),
              Cylinder((0.2, -1.6, 0.3), (1.4, -1.2, 0.3), 0.3, 3, 4))
    return SceneDesc("street", 0, mats, shapes, ("ground", "box", "sphere", "cylinder"),
                     CameraAnchors(walk=((-5, -5), (5, -5)), drive=None, orbit=(0, 0, 5, 0.5)),
                     ground_objects=(1,))


def _toy_camera(size=48) -> Camera:
    return Camera.look_at((0.3, -5.0, 2.2), (0.0, 0.0, 0.4), size, size, 60.0)


def test_scenes_are_seeded_and_hold_together():
    for kind in KINDS:
        a, b, c = make_scene(kind, 3), make_scene(kind, 3), make_scene(kind, 4)
        assert a.to_json() == b.to_json() and a.to_json() != c.to_json()
        assert json.loads(json.dumps(a.to_json()))["kind"] == kind
        assert len(a.objects) >= 8 and set(a.ground_objects) <= set(range(1, len(a.objects) + 1))
        assert {s.object for s in a.shapes} == set(range(1, len(a.objects) + 1))
        assert all(0 <= s.material < len(a.materials) for s in a.shapes)
        names = {m.name for m in a.materials}
        assert {"metal", "wood"} <= names and names & {"brick", "plaster", "paint"}
        assert any(m.emission for m in a.materials)  # lamps
        assert "drive" in available_paths(a) if kind == "street" else "drive" not in available_paths(a)
        GBufferCaster(a)  # passes check_scene: textures only on boxes
    with pytest.raises(AlayaError, match="scene kind 'moon'"):
        make_scene("moon", 0)


def test_gbuffers_match_the_analytic_geometry():
    desc, camera = _toy_scene(), _toy_camera()
    frame = GBufferCaster(desc).render(camera)
    frame.validate()
    obj = frame.extras["object_id"]
    assert {1, 2, 3, 4} <= set(np.unique(obj).tolist())
    # every hit point, rebuilt from the depth along its pixel's ray, lies on its object's surface
    rot = camera.rotation
    rays = camera.view_dirs() @ rot  # camera-space z = -1, so depth is the ray parameter
    hit = obj > 0
    p = camera.eye + np.where(hit, frame.depth, 0)[..., None] * rays
    np.testing.assert_allclose((p - camera.eye) @ rot.T @ [0, 0, -1.0], np.where(hit, frame.depth, 0), rtol=1e-5)
    n_world = frame.normal.astype(np.float64) @ rot  # camera -> world
    ground = obj == 1
    np.testing.assert_allclose(p[ground][:, 2], 0.0, atol=1e-4)
    np.testing.assert_allclose(n_world[ground], np.broadcast_to([0, 0, 1.0], n_world[ground].shape), atol=1e-6)
    sphere = obj == 3
    radial = p[sphere] - (-1.2, 0.2, 0.6)
    np.testing.assert_allclose(np.linalg.norm(radial, axis=1), 0.6, atol=1e-4)
    np.testing.assert_allclose(n_world[sphere], radial / 0.6, atol=1e-4)
    box = obj == 2
    c, s = math.cos(math.radians(25)), math.sin(math.radians(25))
    local = (p[box] - (1.0, 0.5, 0.5)) @ np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    on_face = np.abs(np.abs(local) / (0.5, 0.7, 0.5) - 1).min(1)
    assert on_face.max() < 1e-4  # each point on one of the faces
    cyl = obj == 4
    axis = np.array([1.2, 0.4, 0.0]) / np.linalg.norm([1.2, 0.4, 0.0])
    q = p[cyl] - (0.2, -1.6, 0.3)
    along = q @ axis
    radial = np.linalg.norm(q - along[:, None] * axis, axis=1)
    side_or_cap = np.minimum(np.abs(radial - 0.3), np.minimum(np.abs(along), np.abs(along - np.linalg.norm([1.2, 0.4]))))
    assert side_or_cap.max() < 1e-4
    # materials: albedo, metallic and roughness are exactly the material's; background canonical
    for k, m in enumerate(desc.materials, start=1):
        sel = obj == k
        np.testing.assert_array_equal(frame.albedo[sel], np.float32(m.albedo)[None].repeat(sel.sum(), 0))
        assert np.all(frame.metallic[sel] == np.float32(m.metallic)) and np.all(frame.roughness[sel] == np.float32(m.roughness))
    sky = obj == 0
    assert sky.any() and np.all(np.isinf(frame.depth[sky])) and np.all(frame.normal[sky] == (0, 0, 1))
    assert np.all(frame.albedo[sky] == 0) and np.all(frame.metallic[sky] == 0)


def test_gbuffers_are_deterministic_and_follow_the_camera_path():
    config = TracedConfig(seed=5, scene="street", camera="drive", width=32, height=24, num_frames=3, presets=())
    a = [TracedWorld(config).frame(i)[0] for i in range(3)]
    b = [TracedWorld(config).frame(i)[0] for i in range(3)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(frame_to_teacher(x), frame_to_teacher(y))
    assert np.abs(np.nan_to_num(a[0].depth, posinf=0) - np.nan_to_num(a[2].depth, posinf=0)).mean() > 1e-2
    desc = make_scene("street", 5)
    for kind in ("walk", "drive", "orbit"):
        pose = camera_path(desc, kind, 5)
        eyes = np.array([pose(t)[0] for t in np.linspace(0, 4, 9)])
        assert 1.2 < eyes[:, 2].min() and eyes[:, 2].max() < 1.8  # eye height
        speed = np.linalg.norm(np.diff(eyes[:, :2], axis=0), axis=1).mean() / 0.5
        assert {"walk": 1.0 < speed < 1.8, "drive": 6 < speed < 10, "orbit": 0.3 < speed < 2.0}[kind], (kind, speed)


def test_sun_side_convention_and_captions():
    for side, centre in (("ahead", 0), ("left", 90), ("behind", 180), ("right", -90)):
        for jitter in (-1, 0, 1):
            assert side_of(sun_azimuth(37.0, side, jitter) - 37.0) == side
    # "left" puts the sun on the camera's left in the first frame, so the camera-space sun has x < 0
    for seed in range(3):
        world = TracedWorld(TracedConfig(seed=seed, scene="courtyard", camera="orbit", width=16, height=16,
                                         presets=("bright_sunny", "overcast", "moonlit_night"), sun="left"))
        sun_cam = world.camera(0).rotation @ world.lighting[0].sun_direction
        assert sun_cam[0] < -0.3, sun_cam
        rel = world.azimuth - heading(*world.pose(0.0))
        assert side_of(rel) == "left"
        assert world.captions["bright_sunny"].endswith(", with the sun on the left, creating a cheerful, vivid atmosphere.")
        assert world.captions["bright_sunny"].startswith("a paved courtyard")
        assert "with the sun" not in world.captions["overcast"]
        assert "with the moon on the left" in world.captions["moonlit_night"]
    auto = {TracedWorld(TracedConfig(seed=s, presets=())).side for s in range(12)}
    assert len(auto) >= 3  # the seed spreads the sun over the sides
    assert caption(TRACED_PRESETS["rainy_wet"], "interior", "behind").startswith("a furnished room")
    assert placed(TRACED_PRESETS["cyberpunk_neon"], 10.0).sun_azimuth == 10.0
    # the mirrored scene's caption: left and right swap, ahead and behind and sideless captions stay
    for preset, light in (("bright_sunny", "sun"), ("moonlit_night", "moon")):
        left, right = (caption(TRACED_PRESETS[preset], "street", s) for s in ("left", "right"))
        assert mirrored_caption(left) == right and mirrored_caption(right) == left and f"the {light} on" in left
        ahead = caption(TRACED_PRESETS[preset], "street", "ahead")
        assert mirrored_caption(ahead) == ahead
    assert mirrored_caption(caption(TRACED_PRESETS["overcast"], "street", "left")) == \
        caption(TRACED_PRESETS["overcast"], "street", "left")


def test_config_errors_name_the_value():
    for kw, match in (({"scene": "moon"}, "scene 'moon'"), ({"scene": "interior", "camera": "drive"}, "'drive' needs a street"),
                      ({"presets": ("underwater",)}, "preset 'underwater'"), ({"spp": 0}, "spp=0"),
                      ({"max_depth": 2}, "max_depth=2"), ({"sun": "north"}, "sun side 'north'"),
                      ({"width": 4}, "width=4"), ({"variant": "cuda_ad_rgb"}, "variant 'cuda_ad_rgb'"),
                      ({"passes": 0}, "passes=0 is out of range 1..16")):
        with pytest.raises(AlayaError, match=match):
            TracedConfig(**kw).validate()


def test_shadow_ratio():
    vis = np.zeros((8, 8), np.float32)
    vis[:, 4:] = 1
    rgb = np.full((8, 8, 3), 200, np.uint8)
    rgb[:, :4] = 60
    r = shadow_ratio(rgb, vis)
    assert 0.02 < r < 0.1  # (60/255)^2.2 / (200/255)^2.2 in linear light
    assert shadow_ratio(np.full((8, 8, 3), 0.5, np.float32), vis) == pytest.approx(1.0)
    assert shadow_ratio(rgb, vis, region=np.zeros((8, 8), bool)) is None


def test_variant_auto_takes_llvm_only_with_a_new_enough_libllvm(tmp_path, monkeypatch):
    from alaya_flash.streaming.world.traced import render

    monkeypatch.delenv("DRJIT_LIBLLVM_PATH", raising=False)
    for name in ("libLLVM-15.so.1", "libLLVM-14.so", "libLLVM-19.so.dbg"):
        (tmp_path / name).touch()
    monkeypatch.setattr(render, "LLVM_DIRS", (str(tmp_path), str(tmp_path / "missing")))
    assert render.llvm_library() is None and render.resolve_variant("auto") == "scalar_rgb"
    with pytest.raises(AlayaError, match="llvm_ad_rgb needs libLLVM 16 or newer"):
        render.mitsuba("llvm_ad_rgb")
    (tmp_path / "libLLVM-16.so").touch()
    (tmp_path / "libLLVM-19.so.1").touch()
    assert render.llvm_library() == str(tmp_path / "libLLVM-19.so.1")
    assert render.resolve_variant("auto") == "llvm_ad_rgb" and render.resolve_variant("scalar_rgb") == "scalar_rgb"
    monkeypatch.setenv("DRJIT_LIBLLVM_PATH", "/opt/llvm/lib/libLLVM.so")
    assert render.llvm_library() == "/opt/llvm/lib/libLLVM.so"
    with pytest.raises(AlayaError, match="variant 'vulkan' is unknown"):
        from alaya_flash.training.data import DataConfig

        DataConfig(world="pathtrace", variant="vulkan").validate()


# ----- with Mitsuba -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mi():
    return pytest.importorskip("mitsuba")


def test_gbuffers_match_mitsubas_view_of_the_same_scene(mi):
    from alaya_flash.streaming.world.traced.render import MitsubaScene

    for desc, camera in ((make_scene("street", 2), None), (make_scene("interior", 3), None), (_toy_scene(), _toy_camera(40))):
        if camera is None:
            pose = camera_path(desc, "walk", 2)
            camera = Camera.look_at(*pose(1.0), 40, 40, 60.0)
        caster = GBufferCaster(desc)
        frame = caster.render(camera)
        ms = MitsubaScene(desc, "scalar_rgb", textures=caster.textures)  # llvm's float path moves normals ~3e-3
        aov = ms.aov(ms.gbuffer_scene(), camera)
        same = aov["object_id"] == frame.extras["object_id"]
        assert same.mean() >= 0.999
        hit = same & np.isfinite(frame.depth)
        assert np.abs(aov["depth"][hit] / frame.depth[hit] - 1).max() < 1e-4
        assert np.abs(aov["normal"][hit] - frame.normal[hit]).max() < 2e-3
        err = np.abs(aov["albedo"][hit] - frame.albedo[hit]).max(-1)
        assert err.max() < 1e-2 and err.mean() < 1e-4
        assert np.all(np.isinf(aov["depth"][~np.isfinite(frame.depth) & same]))


def test_truth_has_cast_shadows_indirect_light_and_metal_highlights(mi):
    from alaya_flash.streaming.world.traced.render import MitsubaScene, tone_map

    desc, camera = _toy_scene(), _toy_camera(40)
    frame = GBufferCaster(desc).render(camera)
    preset = TRACED_PRESETS["bright_sunny"]
    light = placed(preset, 135.0)  # behind-left of the camera, which looks along +y
    ms = MitsubaScene(desc)
    truth = ms.truth_scene(preset, light)
    hit = np.isfinite(frame.depth)
    vis = ms.sun_visibility(ms.sun_scene(light.sun_direction), camera, light.sun_direction, frame.normal, hit)
    # sun visibility against an analytic shadow ray from each ground point to the sphere
    obj = frame.extras["object_id"]
    rays = camera.view_dirs() @ camera.rotation
    p = camera.eye + np.where(hit, frame.depth, 0)[..., None] * rays
    oc = p - (-1.2, 0.2, 0.6)
    b = oc @ light.sun_direction
    blocked = (b * b - (np.einsum("...i,...i", oc, oc) - 0.36) > 0) & (b < 0)
    ground = obj == 1
    shadow_of_sphere = ground & blocked
    assert shadow_of_sphere.sum() > 10 and np.all(vis[shadow_of_sphere] == 0)
    assert vis[ground].mean() > 0.5
    assert np.mean((vis[hit] < 1e-3) | (vis[hit] > 1 - 1e-3)) > 0.99  # a hard sun: lit or not
    radiance = ms.radiance(truth, camera, spp=32, max_depth=4, seed=1)
    rgb = tone_map(radiance, frame.depth, light)
    ratio = shadow_ratio(rgb, vis, region=ground)
    assert ratio is not None and ratio < 0.5  # shadows cast by the sun
    # one more bounce lights the shadowed ground more (indirect light from the sunlit box and ground)
    direct_only = ms.radiance(truth, camera, spp=32, max_depth=2, seed=1)
    shade = ground & (vis == 0)
    assert radiance[shade].mean() > 1.05 * direct_only[shade].mean()
    # the smooth metal sphere shows a highlight far above its median (a sub-pixel reflection of the sun:
    # at 32 spp its pixel is hit or missed by chance, at 128 it shows at 15-130x with either variant and seed)
    lum = ms.radiance(truth, camera, spp=128, max_depth=4, seed=1) @ [0.2126, 0.7152, 0.0722]
    assert lum[obj == 3].max() > 8 * np.median(lum[obj == 3])


def test_sky_visibility_is_whole_in_the_open_and_falls_under_a_roof(mi):
    """The sky pass: the ground and the box's top far from anything see the whole sky (1), the ground at the
    box's foot less; a roof over everything leaves the ground almost none; the background reads 1."""
    from alaya_flash.streaming.world.traced.render import MitsubaScene

    camera = _toy_camera(32)
    open_scene = _toy_scene()
    roofed = dataclasses.replace(open_scene, shapes=open_scene.shapes + (Box((0.0, 0.0, 3.0), (40.0, 40.0, 0.2), 0, 5),),
                                 objects=open_scene.objects + ("roof",))
    seen = {}
    for name, desc in (("open", open_scene), ("roofed", roofed)):
        caster = GBufferCaster(desc)
        frame = caster.render(camera)
        ms = MitsubaScene(desc, TINY_VARIANT, textures=caster.textures)
        hit = np.isfinite(frame.depth)
        vis = ms.sky_visibility(ms.sky_scene(), camera, frame.normal, hit, samples=64)
        assert vis.shape == frame.depth.shape and vis.min() >= 0 and vis.max() <= 1
        seen[name] = (vis, frame, hit)
    vis, frame, hit = seen["open"]
    assert np.all(vis[~hit] == 1) and (~hit).sum() > 20
    obj = frame.extras["object_id"]
    p = camera.eye + np.where(hit, frame.depth, 0)[..., None] * (camera.view_dirs() @ camera.rotation)
    far = np.hypot(p[..., 0] - 0.2, p[..., 1] + 0.3) > 3.2  # ground beyond every object's reach
    assert (obj == 1).sum() > 50 and vis[(obj == 1) & far].mean() > 0.97
    box_top = (obj == 2) & (np.abs(p[..., 2] - 1.0) < 0.02)
    assert box_top.sum() > 3 and vis[box_top].mean() > 0.97
    foot = (obj == 1) & (np.hypot(p[..., 0] - 1.0, p[..., 1] - 0.5) < 1.2)  # the ground by the box's sides
    assert foot.sum() > 3 and vis[foot].mean() < 0.9
    vis_roofed, frame_roofed, _ = seen["roofed"]
    assert vis_roofed[frame_roofed.extras["object_id"] == 1].mean() < 0.1


def test_llvm_and_scalar_variants_trace_the_same_scene(mi):
    """The vectorised variant (auto's choice where libLLVM >= 16 is installed) traces the same light as
    scalar_rgb, with other noise; scenes of both variants share one process."""
    from alaya_flash.streaming.world.traced.render import MitsubaScene, llvm_library

    if llvm_library() is None:
        pytest.skip("no libLLVM >= 16 for Mitsuba's llvm_ad_rgb (apt-get install libllvm19)")
    desc, camera = _toy_scene(), _toy_camera(32)
    frame = GBufferCaster(desc).render(camera)
    preset = TRACED_PRESETS["bright_sunny"]
    light = placed(preset, 135.0)
    scenes = {v: MitsubaScene(desc, v) for v in ("scalar_rgb", "llvm_ad_rgb")}  # both made before either renders
    truths = {v: ms.truth_scene(preset, light) for v, ms in scenes.items()}
    radiance = {v: ms.radiance(truths[v], camera, spp=256, max_depth=4, seed=1) for v, ms in scenes.items()}
    obj = frame.extras["object_id"]
    for k in (0, 1, 2, 4):  # sky, ground, box, dark cylinder (the metal sphere's fireflies need far more samples)
        a, b = (radiance[v][obj == k].mean(0) for v in scenes)
        np.testing.assert_allclose(b, a, rtol=0.06, err_msg=f"object {k}")
    assert not np.array_equal(radiance["scalar_rgb"], radiance["llvm_ad_rgb"])  # really two renderers


@pytest.mark.slow
def test_frames_preset_by_preset_equal_frame_by_frame(mi):
    """TracedWorld.frames (the data stage's order: one preset's scenes at a time over a block) gives
    frame()'s extras bit for bit, and keeps only one preset's Mitsuba scenes alive. (In scalar_rgb, a
    quarter of llvm_ad_rgb's CPU time here; llvm_ad_rgb's frames() = frame(): the clip folder test below.)"""
    config = TracedConfig(seed=2, scene="street", camera="walk", width=24, height=24, num_frames=3,
                          presets=("sunset_dramatic", "rainy_wet", "night_lamps"), spp=2, variant=TINY_VARIANT)
    block = TracedWorld(config).frames([2, 0])
    world = TracedWorld(config)
    for (got, _), index in zip(block, [2, 0]):
        want = world.frame(index)[0]
        assert got.index == index and sorted(got.extras) == sorted(want.extras)
        for key in want.extras:
            np.testing.assert_array_equal(got.extras[key], want.extras[key], err_msg=key)
    assert world._preset[0] == 2 and len(world._preset) == 3  # the last preset's (truth, sun) only


@pytest.mark.slow
def test_truth_passes_estimate_their_own_noise(mi):
    """With passes > 1 a truth averages independent renders, and its noise estimate (truth_noise_mse, from
    the passes' spread) matches its measured error against a 1,024 spp render of the same frame; the
    first pass is the single-pass truth (same seed), and a single pass estimates nothing."""
    from alaya_flash.streaming.world.traced.source import truth_noise_mse

    base = dict(seed=1, scene="street", camera="walk", width=32, height=32, num_frames=1,
                presets=("bright_sunny", "sunset_dramatic"))
    frame = TracedWorld(TracedConfig(**base, spp=4, passes=4)).frame(0)[0]
    single = TracedWorld(TracedConfig(**base, spp=4)).frame(0)[0]
    reference = TracedWorld(TracedConfig(**base, spp=1024)).frame(0)[0]
    assert "truth_noise_mse" in frame.extras and "truth_noise_mse" not in single.extras
    for name in base["presets"]:
        estimate = frame.extras[f"truth_noise_mse_{name}"]
        measured = np.mean((frame.extras[f"rgb_{name}"].astype(float) - reference.extras[f"rgb_{name}"]) ** 2)
        assert estimate > 1.0 and 0.6 < measured / estimate < 1.6, (name, measured, estimate)
        one = np.mean((single.extras[f"rgb_{name}"].astype(float) - reference.extras[f"rgb_{name}"]) ** 2)
        assert one > 2 * measured  # four passes: a quarter of the noise
    same = np.full((4, 4), 7, np.uint8)
    assert truth_noise_mse([same, same]) == 0.0 and truth_noise_mse([same, same + 2]) == pytest.approx(1.0)


@pytest.mark.slow
def test_clip_folder_reads_back_and_matches_the_source(mi, tmp_path):
    config = TracedConfig(seed=1, scene="courtyard", camera="walk", width=32, height=32, num_frames=4,
                          presets=("bright_sunny", "night_lamps"), spp=2)
    out = write_traced_clip(config, tmp_path / "clip")
    stream = open_gbuffers(out)
    assert stream.info.layout == "teacher-mp4" and stream.info.num_frames == 4
    world = TracedWorld(config)
    got = list(stream.teacher_frames(extras=True))
    for i, (images, extras) in enumerate(got):
        frame = world.frame(i)[0]
        np.testing.assert_array_equal(images, frame_to_teacher(frame))
        np.testing.assert_array_equal(extras["rgb"], frame.extras["rgb_bright_sunny"])  # lossless, deterministic
        # the shadow pass (shadow.mp4, lossless): the first preset's sun visibility in 8 bits
        np.testing.assert_array_equal(extras["shadow"], np.rint(frame.extras["sun_visibility"] * 255).astype(np.uint8))
        # the sky pass (sky.mp4, lossless): the share of the sky each surface sees, in 8 bits
        np.testing.assert_array_equal(extras["sky"], np.rint(frame.extras["sky_visibility"] * 255).astype(np.uint8))
    meta = json.loads((out / "clip.json").read_text())
    assert meta["files"]["sky"].startswith("sky.mp4") and np.load(out / "extras" / "sky_visibility-0000.npy").shape == (4, 32, 32)
    assert meta["scene_kind"] == "courtyard" and len(meta["cameras"]) == 4 and meta["sun_side"] in ("ahead", "left", "behind", "right")
    assert meta["presets"][0]["prompt"] == world.captions["bright_sunny"]
    assert json.loads((out / "scene.json").read_text())["kind"] == "courtyard"
    vis = np.load(out / "extras" / "sun_visibility_bright_sunny-0000.npy")
    assert vis.shape == (4, 32, 32) and (out / "presets" / "night_lamps.mp4").stat().st_size > 0


@pytest.mark.slow
def test_world_command_pathtrace(mi, tmp_path, capsys):
    from alaya_flash.streaming.cli import main

    out = tmp_path / "clip"
    assert main(["--quiet", "world", "--renderer", "pathtrace", "--scene", "interior", "--camera", "orbit",
                 "--size", "32x24", "--frames", "3", "--spp", "2", "--sun", "behind", "--presets", "all",
                 "--out", str(out)]) == 0
    stream = open_gbuffers(out)
    assert (stream.info.width, stream.info.height, stream.info.num_frames) == (32, 24, 3)
    assert (out / "sky.mp4").is_file() and "sky" in next(stream.teacher_frames(extras=True))[1]
    assert main(["--quiet", "world", "--renderer", "pathtrace", "--scene", "interior", "--camera", "orbit", "--size",
                 "32x24", "--frames", "1", "--spp", "1", "--sky-samples", "0", "--out", str(tmp_path / "skyless")]) == 0
    assert not (tmp_path / "skyless" / "sky.mp4").exists()
    assert json.loads((tmp_path / "skyless" / "clip.json").read_text())["files"]["sky"] is None
    meta = json.loads((out / "clip.json").read_text())
    assert meta["sun_side"] == "behind" and [p["name"] for p in meta["presets"]] == list(TRACED_PRESETS)
    assert main(["world", "--renderer", "pathtrace", "--camera", "fly", "--out", str(tmp_path / "bad")]) == 2
    assert main(["world", "--camera", "walk", "--out", str(tmp_path / "bad")]) == 2
    assert "--camera walk: a world v2 path" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_world_v2_presets_have_their_own_wordings():
    from alaya_flash.training.prompts import SPLITS, prompts

    seen = {w for name in TRACED_PRESETS if name in ("bright_sunny",) for s in SPLITS for w in prompts(name, s)}
    for name in ("rainy_wet", "foggy", "night_lamps"):
        words = {s: prompts(name, s) for s in SPLITS}
        assert words["train"][0] == TRACED_PRESETS[name].prompt and len(set(words["train"])) == 8
        assert [len(set(words[s])) for s in SPLITS[1:]] == [2, 6, 10]
        everything = set().union(*words.values())
        assert sum(len(v) for v in words.values()) == len(everything) and not everything & seen, name
        seen |= everything


@pytest.mark.slow
def test_dataset_builder_writes_world_v2_clips(mi, tmp_path):
    from alaya_flash.training.data import ClipSet, DataConfig, build_dataset, dataset_meta

    cfg = DataConfig(out=str(tmp_path / "data"), width=32, height=32, frames=5, fps=8.0, train_clips=2,
                     heldout_clips=1, heldout_seed=1000, world="pathtrace", scenes=("street", "interior"),
                     presets=("bright_sunny", "night_lamps"), spp=2, variant=TINY_VARIANT).validate()
    build_dataset(cfg)
    meta = dataset_meta(tmp_path / "data", "train")
    assert meta["world"] == "pathtrace" and meta["presets"] == ["bright_sunny", "night_lamps"]
    assert [meta["clip_info"][c]["scene"] for c in meta["clips"]["train"]] == ["street", "interior"]
    train = ClipSet(tmp_path / "data", "train")
    assert train.gbuffers.shape == (2, 5, 5, 32, 32, 3) and train.rgb.shape == (2, 2, 5, 32, 32, 3)
    assert train.captions[1][0] == meta["clip_info"]["train/clip-000001.npz"]["captions"]["bright_sunny"]
    assert train.captions[1][0].startswith("a furnished room") and "prompts" in meta
    with np.load(tmp_path / "data" / "train" / "clip-000000.npz") as z:
        assert z["sun_visibility"].shape == (2, 5, 32, 32) and z["sun_visibility"].dtype == np.uint8
        assert z["ground"].shape == (5, 32, 32) and z["ground"].any()
        sky = z["sky_visibility"]  # the sky pass of the street (clip 0): open somewhere, blocked somewhere
        assert sky.shape == (5, 32, 32) and sky.dtype == np.uint8 and sky.max() == 255 and sky.min() < 200
    assert train.sky_visibility.shape == (2, 5, 32, 32)
    assert train.sky_visibility[1].mean() < train.sky_visibility[0].mean()  # a room sees less sky than a street
    before = (tmp_path / "data" / "dataset.json").read_text()
    build_dataset(cfg)  # resumes: nothing rendered again, the same metadata
    assert (tmp_path / "data" / "dataset.json").read_text() == before
    # held-out truths of 2 passes: the held-out clip is rendered again with its noise, the training clips are kept
    trained = (tmp_path / "data" / "train" / "clip-000000.npz").stat().st_mtime_ns
    build_dataset(dataclasses.replace(cfg, heldout_passes=2))
    assert (tmp_path / "data" / "train" / "clip-000000.npz").stat().st_mtime_ns == trained
    with np.load(tmp_path / "data" / "heldout" / "clip-001000.npz") as z:
        assert int(z["passes"]) == 2 and z["truth_noise_mse"].shape == (2, 5) and (z["truth_noise_mse"] > 0).all()
    assert dataset_meta(tmp_path / "data", "heldout")["clip_info"]["heldout/clip-001000.npz"]["passes"] == 2
    with pytest.raises(AlayaError, match="heldout_passes applies to world v2"):
        DataConfig(heldout_passes=2).validate()
    with pytest.raises(AlayaError, match="preset 'underwater' is unknown"):
        DataConfig(world="pathtrace", presets=("underwater",)).validate()
    from pathlib import Path

    from alaya_flash.training.common import load_config

    v2 = load_config(Path(__file__).parents[1] / "training/configs/data-v2.json", DataConfig, {}).validate()
    assert v2.world == "pathtrace" and len(v2.preset_names) == len(TRACED_PRESETS)
    with pytest.raises(AlayaError, match="sun_turns applies to the physics world"):
        DataConfig(world="pathtrace", sun_turns=4).validate()
    with pytest.raises(AlayaError, match="sun 'left' is not 'auto'"):
        DataConfig(world="pathtrace", sun="left").validate()
    with pytest.raises(AlayaError, match="sun applies to world v2"):
        DataConfig(sun="opposite").validate()


def test_caption_sides_script_measures_the_side_apart_from_preset_and_scene():
    """benchmarks/caption_sides.py: an encoder that drops the side phrase puts sides 0 apart and keeps presets and
    scene kinds apart; one that reads only the side phrase does the reverse."""
    import re

    import torch
    from training_helpers import load_benchmark

    from alaya_flash.streaming.world.traced.presets import PHRASES

    script = load_benchmark("caption_sides")
    side = re.compile("|".join(re.escape(p.format(light=light)) for p in PHRASES.values() for light in ("sun", "moon")))

    vocabulary: dict[str, int] = {}

    def bag(texts):  # a stand-in for the prompt encoder: a bag of words (one dimension each), normalised
        out = torch.zeros(len(texts), 1, 1024)
        for i, t in enumerate(texts):
            for w in t.split():
                out[i, 0, vocabulary.setdefault(w, len(vocabulary))] += 1
        return torch.nn.functional.normalize(out, dim=-1)

    blind = script.distances(lambda texts: bag([side.sub("", t) for t in texts]))
    assert blind["sides"] == 0 and blind["presets"] > 0 and blind["scene_kinds"] > 0
    named = {p.format(light=light): name for name, p in PHRASES.items() for light in ("sun", "moon")}
    only = script.distances(lambda texts: bag([named[side.search(t).group(0)] for t in texts]))
    assert only["sides"] > 0 and only["presets"] == 0 and only["scene_kinds"] == 0
    assert len(only["by_side_pair"]) == 6 and all(v > 0 for v in only["by_side_pair"].values())
