"""The shading prior against analytic scenes and the physics world's own truth (model_zoo/shading_prior.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alaya_flash.model_zoo.light import PACKED, SLICES, Light, pack
from alaya_flash.model_zoo.shading_prior import PRIOR_CHANNELS, PriorConfig, ShadingPrior, _block_min, direction
from alaya_flash.streaming import metrics
from alaya_flash.streaming.gbuffer import GBufferFrame, frame_to_teacher

FOV = 60.0
DARK = dict(sky_zenith=(0.0, 0.0, 0.0), sky_horizon=(0.0, 0.0, 0.0), ground=(0.0, 0.0, 0.0))


def _rays(h, w):
    f = 0.5 * h / math.tan(math.radians(FOV) / 2)
    j, i = np.meshgrid(np.arange(w) + 0.5 - w / 2, np.arange(h) + 0.5 - h / 2)
    return np.stack([j / f, -i / f, -np.ones((h, w))], -1), f


def _box_hits(rays, lo, hi):
    """Ray (from the origin) parameters t at which each ray enters an axis-aligned box, inf where it misses,
    and the entry face's normal."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t1, t2 = (np.asarray(lo) / rays), (np.asarray(hi) / rays)
    near, far = np.minimum(t1, t2), np.maximum(t1, t2)
    t_in, t_out = near.max(-1), far.min(-1)
    hit = (t_in <= t_out) & (t_out > 0)
    axis = near.argmax(-1)
    normal = np.zeros(rays.shape)
    side = -np.sign(np.take_along_axis(rays, axis[..., None], -1))[..., 0]
    np.put_along_axis(normal, axis[..., None], side[..., None], -1)
    return np.where(hit, t_in, np.inf), normal


def _sphere(h, w, centre, radius):
    """A sphere in front of the camera: unit view rays, which pixels hit it, its normals and depth."""
    rays, _ = _rays(h, w)
    d = rays / np.linalg.norm(rays, axis=-1, keepdims=True)
    b = (d * centre).sum(-1)
    disc = b * b - (centre * centre).sum() + radius * radius
    t = np.where(disc > 0, b - np.sqrt(np.maximum(disc, 0)), np.inf)
    points = d * t[..., None]
    hit = np.isfinite(t)
    normal = np.where(hit[..., None], (points - centre) / radius, np.array([0.0, 0.0, 1.0]))
    return d, hit, normal, np.where(hit, -points[..., 2], np.inf)


def _frame(depth, normal, albedo=0.5, metallic=0.0, roughness=1.0, depth_near=0.5):
    h, w = depth.shape
    full = lambda v: np.full((h, w), v, np.float32)  # noqa: E731
    frame = GBufferFrame(index=0, timestamp=0.0, albedo=np.full((h, w, 3), albedo, np.float32),
                         depth=depth.astype(np.float32), metallic=full(metallic),
                         normal=normal.astype(np.float32), roughness=full(roughness))
    return torch.from_numpy(frame_to_teacher(frame, depth_near))


def _top_down_box(h=128, w=128, height=10.0, box=2.0):
    """A camera `height` above the ground looking straight down at a cube of side `box` standing on it."""
    rays, f = _rays(h, w)
    t_ground = np.full((h, w), height)
    t_box, n_box = _box_hits(rays, (-box / 2, -box / 2, -height), (box / 2, box / 2, -height + box))
    on_box = t_box < t_ground
    depth = np.where(on_box, t_box, t_ground)  # rays have z = -1, so t is the depth
    normal = np.where(on_box[..., None], n_box, np.array([0.0, 0.0, 1.0]))
    return depth, normal, f


def test_a_plane_is_lit_by_the_cosine_of_the_sun_angle():
    """A rough white wall facing the camera: its radiance follows N.L as the sun goes round behind the camera."""
    h = w = 32
    depth, normal = np.full((h, w), 4.0), np.broadcast_to(np.array([0.0, 0.0, 1.0]), (h, w, 3))
    images = _frame(depth, normal, albedo=1.0, roughness=1.0)
    prior = ShadingPrior()
    up = torch.tensor([0.0, 1.0, 0.0])
    lit = {}
    for elevation in (0.0, 30.0, 60.0):
        light = pack(Light(sun_azimuth=180.0, sun_elevation=elevation, sun_color=(1.0, 1.0, 1.0), **DARK))
        color, shadow, _, _ = prior.radiance(images, light[0], up=up, ao=False)
        assert shadow.min() == 1.0  # nothing stands between the wall and the sun
        lit[elevation] = color[0, 1].mean().item()
    # N.L = cos(elevation) for a sun behind the camera; GGX on a rough dielectric adds about 1%.
    for elevation in (30.0, 60.0):
        assert lit[elevation] / lit[0.0] == pytest.approx(math.cos(math.radians(elevation)), rel=0.02)


@pytest.mark.parametrize("stride, pixels", [(1, 1.0), (PriorConfig.shadow_stride, PriorConfig.shadow_stride)])
def test_a_box_casts_a_shadow_of_its_height_over_the_tangent_of_the_sun_elevation(stride, pixels):
    """Seen from 10 units above, a 2-unit cube under a sun at 45 degrees throws a 2-unit shadow; its tip
    on the screen is within a pixel of where that lands (marching every pixel), within one marched
    block at the shipped stride."""
    h = w = 128
    height, box = 10.0, 2.0
    depth, normal, f = _top_down_box(h, w, height, box)
    images = _frame(depth, normal, depth_near=2.0)  # 8-bit inverse depth: the ground at 10 exactly
    up = torch.tensor([0.0, 0.0, 1.0])  # looking straight down: up is toward the camera
    for elevation in (45.0, 30.0):
        light = pack(Light(sun_azimuth=0.0, sun_elevation=elevation))
        out = ShadingPrior(PriorConfig(shadow_stride=stride))(images, light[0], depth_near=2.0, up=up)
        shadow = out[3].numpy()
        # azimuth 0 with up along the view axis is the screen's up: the shadow falls down the screen
        sun = direction(torch.tensor(elevation), torch.tensor(0.0), up)
        assert sun[1] > 0.5 and abs(sun[0]) < 1e-6
        length = box / math.tan(math.radians(elevation))
        tip = h / 2 + f * (box / 2 + length) / height  # the shadow's far edge, in pixel rows
        column = shadow[:, w // 2]
        dark = np.nonzero(column[h // 2:] < 0.5)[0] + h // 2
        assert len(dark) > 0
        assert abs((dark.max() + 1) - tip) <= pixels, (elevation, dark.max() + 1, tip)
        # and nothing is dark on the sun's side of the box
        assert column[: int(h / 2 - f * box / 2 / (height - box)) - 1].min() == 1.0


def test_a_mirror_sphere_shows_the_sun_where_its_normal_halves_view_and_light():
    h = w = 96
    d, hit, normal, depth = _sphere(h, w, np.array([0.0, 0.0, -5.0]), 1.5)
    images = _frame(depth, normal, albedo=0.9, metallic=1.0, roughness=0.08)
    up = torch.tensor([0.0, 1.0, 0.0])
    light = Light(sun_azimuth=150.0, sun_elevation=35.0, sun_color=(5.0, 5.0, 5.0), **DARK)
    out = ShadingPrior(PriorConfig(ao_samples=0))(images, pack(light)[0], up=up)
    lum = out[:3].mean(0).numpy()
    lum[~hit] = -1
    got = np.unravel_index(lum.argmax(), lum.shape)
    sun = direction(torch.tensor(35.0), torch.tensor(150.0), up).numpy()
    half = -d + sun
    half /= np.linalg.norm(half, axis=-1, keepdims=True)
    angle = np.where(hit, (normal * half).sum(-1), -2)
    want = np.unravel_index(angle.argmax(), angle.shape)
    assert abs(got[0] - want[0]) <= 1 and abs(got[1] - want[1]) <= 1, (got, want)
    assert want[1] < w / 2 - 5 and want[0] < h / 2 - 3  # the sun is up and to the left: so is its highlight


def test_a_metal_reflects_the_sky_and_a_dielectric_does_not():
    """Under a blue zenith and an orange horizon with no sun, a mirror sphere's top is bluer than its
    middle; a rough dielectric's is not, by far."""
    h = w = 64
    _, _, normal, depth = _sphere(h, w, np.array([0.0, 0.0, -4.0]), 1.2)
    light = pack(Light(sun_color=(0.0, 0.0, 0.0), sky_zenith=(0.1, 0.3, 1.0), sky_horizon=(1.0, 0.5, 0.1),
                       ground=(0.0, 0.0, 0.0)))[0]
    up = torch.tensor([0.0, 1.0, 0.0])

    def blue_minus_red(metallic, roughness, rows):
        images = _frame(depth, normal, albedo=0.95, metallic=metallic, roughness=roughness)
        rgb = ShadingPrior(PriorConfig(ao_samples=0))(images, light, up=up)[:3]
        patch = rgb[:, rows, w // 2 - 2:w // 2 + 2]
        return (patch[2] - patch[0]).mean().item()

    top, middle = slice(h // 2 - 16, h // 2 - 12), slice(h // 2 - 2, h // 2 + 2)
    assert blue_minus_red(1.0, 0.05, top) - blue_minus_red(1.0, 0.05, middle) > 0.2
    assert abs(blue_minus_red(0.0, 1.0, top) - blue_minus_red(0.0, 1.0, middle)) < 0.1


def test_a_sky_pass_scales_the_sky_light_a_surface_gets_and_its_metals_mirror():
    """No sun: all the light is the sky's (the hemisphere and, on metals, the mirrored sky). An engine's sky
    pass replaces the ambient occlusion: seeing the whole sky equals no occlusion, seeing a share v of it
    gives v times that light, on a rough dielectric and a mirror alike; the background keeps its sky."""
    h = w = 32
    rays, _ = _rays(h, w)
    depth = np.where(np.arange(h)[:, None] < 8, np.inf, np.full((h, w), 4.0))  # the top rows: background
    normal = np.broadcast_to(np.array([0.0, 0.6, 0.8]), (h, w, 3))
    up = torch.tensor([0.0, 1.0, 0.0])
    light = pack(Light(sun_color=(0.0, 0.0, 0.0), sky_zenith=(0.2, 0.4, 1.0), sky_horizon=(0.9, 0.6, 0.3),
                       ground=(0.1, 0.1, 0.1)))[0]
    share = torch.linspace(0.0, 1.0, w).expand(h, w)
    prior = ShadingPrior()
    for metallic, roughness in ((0.0, 1.0), (1.0, 0.05)):
        images = _frame(depth, normal, albedo=0.8, metallic=metallic, roughness=roughness)
        open_, _, occ_open, _ = prior.radiance(images, light, up=up, ao=False)
        whole, _, occ_whole, _ = prior.radiance(images, light, up=up, sky_visibility=torch.ones(h, w))
        part, _, occ_part, _ = prior.radiance(images, light, up=up, sky_visibility=share)
        torch.testing.assert_close(whole, open_)
        assert torch.equal(occ_part[0, 0], share) and occ_open.min() == 1
        surface = torch.from_numpy(np.isfinite(depth))
        torch.testing.assert_close(part[0][:, surface], (open_[0] * share)[:, surface], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(part[0][:, ~surface], open_[0][:, ~surface])
        assert open_[0][:, surface].min() > 0.01  # the sky lights it: the test scales something


def test_fog_at_a_known_depth():
    """A black wall at depth D in fog of density k shows fog colour times 1 - exp(-k D)."""
    h = w = 16
    for depth_value in (2.55, 10.2):  # 8-bit inverse depths 100 and 25 with depth_near 1: exact
        images = _frame(np.full((h, w), depth_value), np.broadcast_to(np.array([0.0, 0.0, 1.0]), (h, w, 3)),
                        albedo=0.0, roughness=1.0, depth_near=1.0)
        light = pack(Light(sun_color=(0.0, 0.0, 0.0), ambient=0.0, fog_color=(0.5, 0.6, 0.7), fog_density=0.1))[0]
        color, _, _, _ = ShadingPrior().radiance(images, light, depth_near=1.0)
        want = torch.tensor([0.5, 0.6, 0.7]) * (1 - math.exp(-0.1 * depth_value))
        assert torch.allclose(color[0, :, h // 2, w // 2], want, atol=2e-3)


def test_background_is_the_sky_and_the_output_has_its_channels():
    h = w = 16
    images = _frame(np.full((h, w), np.inf), np.broadcast_to(np.array([0.0, 0.0, 1.0]), (h, w, 3)))
    light = Light(sun_color=(0.0, 0.0, 0.0), sky_zenith=(0.1, 0.2, 0.9), sky_horizon=(0.9, 0.6, 0.2))
    out = ShadingPrior()(images[None].expand(3, -1, -1, -1, -1), pack(light)[0], up=torch.tensor([0.0, 1.0, 0.0]))
    assert out.shape == (3, PRIOR_CHANNELS, h, w)
    top, bottom = out[0, :3, 0].mean(-1), out[0, :3, -1].mean(-1)  # looking up is nearer the zenith
    assert top[2] > bottom[2] and top[0] < bottom[0]
    assert (out[:, 3:] == 1).all()  # no shadow, no occlusion on the sky


@pytest.mark.parametrize("preset", ["bright_sunny", "sunset_dramatic", "cyberpunk_neon"])
def test_given_the_truth_sun_visibility_the_prior_is_the_physics_world_truth(preset):
    """The physics world's truth is the same shading model: from its 8-bit G-buffers and the preset as a
    camera-relative Light, the prior lands within 8-bit rounding of it (>= 45 dB)."""
    from alaya_flash.streaming.world import WorldConfig, WorldSource
    from alaya_flash.streaming.world.shading import heading, light_of

    source = WorldSource(WorldConfig(seed=2, width=64, height=64, num_frames=2, presets=(preset,), shadows=True))
    for frame, camera in source.frames_with_cameras():
        images = torch.from_numpy(frame_to_teacher(frame))
        up = torch.tensor(camera.rotation @ np.array([0.0, 0.0, 1.0]), dtype=torch.float32)
        light = pack(light_of(preset, heading(camera)))[0]
        vis = torch.from_numpy(frame.extras["sun_visibility"])
        out = ShadingPrior()(images, light, up=up, sun_visibility=vis, ao=False)
        truth = torch.from_numpy(frame.extras["rgb"]).permute(2, 0, 1).float() / 255
        assert metrics.psnr(out[:3], truth) >= 45.0
        # without the truth's visibility it casts shadows of its own, and loses the exactness
        own = ShadingPrior()(images, light, up=up)
        assert metrics.psnr(own[:3], truth) < metrics.psnr(out[:3], truth)


def test_the_prior_is_differentiable_in_the_light():
    """Gradients reach the light, and the graph-building pass renders what inference renders (it keeps the fog
    term that inference skips at zero density)."""
    h = w = 16
    images = _frame(np.full((h, w), 3.0), np.broadcast_to(np.array([0.0, 0.6, 0.8]), (h, w, 3)))
    light = pack(Light())[0].requires_grad_(True)
    out = ShadingPrior()(images, light)
    out[:3].mean().backward()
    assert light.grad.shape == (PACKED,)
    assert light.grad.abs().sum() > 0 and torch.isfinite(light.grad).all()
    assert light.grad[SLICES["fog_density"]].abs().sum() > 0  # fog is still a function of its density at 0
    with torch.inference_mode():
        assert torch.equal(ShadingPrior()(images, light.detach()), out.detach())


def test_block_minima_by_strided_views_are_min_pooling():
    """The shadows' s x s block minima (a minimum of strided views where s divides the frame) are min-pooling's."""
    g = torch.rand(48, 40) * 10
    g[torch.rand(48, 40) < 0.2] = math.inf  # the background
    for stride in (2, 4):
        want = -torch.nn.functional.max_pool2d(-g[None, None], stride, ceil_mode=True)[0, 0]
        assert torch.equal(_block_min(g, stride), want)


def _grow(mask: np.ndarray, px: int) -> np.ndarray:
    """mask dilated by px pixels (a square)."""
    out = mask.copy()
    for dy in range(-px, px + 1):
        for dx in range(-px, px + 1):
            out |= np.roll(np.roll(mask, dy, 0), dx, 1)
    return out


def test_a_mirror_floor_reflects_the_box_standing_on_it_where_the_mirrored_box_lies():
    """Screen-space reflections (PriorConfig.reflections): a mirror floor one unit below the camera in front of a
    red box lit by a sun behind the camera. A floor pixel reflects the box iff its view ray, continued below
    the floor, enters the box mirrored in it; those pixels (2 pixels off the outline) turn red, the others keep
    the blue sky, as they all do without reflections. The box's front face is what the mirror rays meet."""
    h = w = 96
    rays, _ = _rays(h, w)
    box_lo, box_hi = np.array([-1.0, -1.0, -8.0]), np.array([1.0, 1.0, -6.0])
    t_box, box_normal = _box_hits(rays, box_lo, box_hi)
    with np.errstate(divide="ignore"):
        t_floor = np.where(rays[..., 1] < 0, -1.0 / rays[..., 1], np.inf)
    floor = t_floor < t_box
    depth = np.minimum(t_floor, t_box)
    normal = np.where(floor[..., None], np.array([0.0, 1.0, 0.0]), box_normal)
    normal = np.where(np.isfinite(depth)[..., None], normal, np.array([0.0, 0.0, 1.0]))
    on_box = np.isfinite(t_box) & ~floor
    albedo = np.where(on_box[..., None], np.array([0.9, 0.05, 0.05]), np.array([1.0, 1.0, 1.0])).astype(np.float32)
    frame = GBufferFrame(index=0, timestamp=0.0, albedo=albedo, depth=depth.astype(np.float32),
                         metallic=floor.astype(np.float32), normal=normal.astype(np.float32),
                         roughness=np.where(floor, 0.0, 1.0).astype(np.float32))
    images = torch.from_numpy(frame_to_teacher(frame, 2.0))
    light = pack(Light(sun_azimuth=180.0, sun_elevation=30.0, sky_zenith=(0.1, 0.2, 1.0), sky_horizon=(0.1, 0.2, 1.0),
                       ground=(0.1, 0.2, 1.0)))[0]
    up = torch.tensor([0.0, 1.0, 0.0])

    def red_minus_blue(reflections):
        rgb = ShadingPrior(PriorConfig(ao_samples=0, reflections=reflections))(images, light, depth_near=2.0, up=up)[:3]
        return (rgb[0] - rgb[2]).numpy()

    t_mirror, entry = _box_hits(rays, box_lo - [0, 2, 0], box_hi - [0, 2, 0])  # the box mirrored in y = -1
    mirrored = np.isfinite(t_mirror) & (entry[..., 2] > 0.5)  # through its front face, the one the camera sees
    # floor pixels 2 off the box's outline and the horizon, and beyond depth_near (nearer, 8-bit depth clamps)
    away = floor & ~_grow(~floor, 2) & (depth > 2.2)
    reflects, keeps = away & ~_grow(~mirrored, 2), away & ~_grow(mirrored, 2)
    assert reflects.sum() > 100 and keeps.sum() > 100
    with_reflections, without = red_minus_blue(True), red_minus_blue(False)
    assert (with_reflections[reflects] > 0).mean() >= 0.9
    assert (with_reflections[keeps] < 0).mean() >= 0.95
    assert (without[away] < 0).all()  # without them every floor pixel shows the sky


def _random_gbuffers(frames, h, w, seed):
    """Teacher-form uint8 G-buffers of random surfaces: metals among them (some mirror rays meet something),
    a band of background rows (the sky shows), depth codes that vary smoothly."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (frames, 5, h, w, 3), dtype=torch.uint8, generator=g)
    ramp = torch.linspace(40, 250, w).round().to(torch.uint8)
    images[:, 1] = (ramp[None, None, :, None] + torch.randint(0, 3, (frames, h, w, 1), generator=g).to(torch.uint8))
    images[:, 1, : h // 4] = 0  # background
    images[:, 2] = torch.where(torch.rand(frames, h, w, 1, generator=g) < 0.5, 255, 0).to(torch.uint8)  # metallic
    images[:, 4] //= 4  # smooth
    return images


def test_buffers_kept_between_frames_render_what_fresh_tensors_render():
    """Inference computes a frame's planes into buffers it keeps from frame to frame (and shares between terms);
    a pass building a graph uses fresh tensors for the same operations. Frame after frame, sizes alternating,
    with reflections, a fill light and fog, both render the same bits; radiance's frames are copies."""
    cfg = PriorConfig(reflections=True)
    light = pack(Light(fills=((20.0, -60.0, (0.4, 0.5, 0.6)),), fog_color=(0.5, 0.5, 0.6), fog_density=0.02))[0]
    kept, fresh = ShadingPrior(cfg), ShadingPrior(cfg)
    for seed, (h, w) in enumerate([(48, 64), (32, 40), (48, 64)]):
        images = _random_gbuffers(3, h, w, seed)
        with torch.inference_mode():
            out = kept(images, light)
            color, shadow, occlusion, _ = kept.radiance(images, light)
        graph = light.clone().requires_grad_(True)
        want = fresh(images, graph)
        assert torch.equal(out, want.detach())
        assert want.grad_fn is not None  # it did build a graph
        for k in range(3):  # radiance's frames are each frame's own, not the last one's buffers
            one = fresh.radiance(images[k], graph)
            assert torch.equal(color[k], one[0][0].detach()) and torch.equal(shadow[k], one[1][0])
            assert torch.equal(occlusion[k], one[2][0])
        assert not torch.equal(color[0], color[1])


def test_priors_sharing_a_threads_buffers_render_as_each_alone():
    """A thread's kept buffers are shared by every prior it runs (a stream's encoder and refiner priors): two
    configs alternating frame by frame render what each renders alone, in another thread."""
    import threading

    light = pack(Light())[0]
    images = _random_gbuffers(4, 32, 40, 7)
    plain, mirror = ShadingPrior(), ShadingPrior(PriorConfig(reflections=True))
    alone = {}

    def each_alone():
        with torch.inference_mode():
            alone["plain"], alone["mirror"] = plain(images, light), mirror(images, light)

    worker = threading.Thread(target=each_alone)
    worker.start()
    worker.join()
    with torch.inference_mode():
        mixed = [(plain(images[k], light), mirror(images[k], light)) for k in range(4)]
    assert not torch.equal(alone["plain"], alone["mirror"])  # the metals reflect: the two differ
    for k, (a, b) in enumerate(mixed):
        assert torch.equal(a, alone["plain"][k]) and torch.equal(b, alone["mirror"][k])


def test_srgb_is_the_piecewise_curve():
    """to_srgb (the power as exp2(log2(x) / 2.4), the lesser of the two segments) against the sRGB curve in double."""
    from alaya_flash.model_zoo.shading_prior import to_srgb
    x = torch.cat([torch.linspace(0, 1, 1_000_001), torch.logspace(-8, 0, 10_001)])
    xd = x.double()
    want = torch.where(xd <= 0.0031308, 12.92 * xd, 1.055 * xd ** (1 / 2.4) - 0.055)
    assert (to_srgb(x).double() - want).abs().max() < 2e-7
