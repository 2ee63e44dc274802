"""A world v2 scene description rendered by Mitsuba 3: exact G-buffers, path-traced truth, sun visibility.

The only module that imports Mitsuba (lazily: `pip install 'alaya-flash[pathtrace]'`). One
`SceneDesc` becomes Mitsuba scenes that share every shape and texture:

- G-buffers come from gbuffers.py's caster; `aov()` is Mitsuba's own view of the same shapes
  (its `aov` integrator: distance, shading normal, albedo, shape index, one sample at each pixel
  centre through a `stratified` sampler without jitter), which the tests hold the caster to.
- Truth: the `path` integrator (max_depth >= 3: at least one indirect bounce), every material a
  `principled` BSDF (base colour, metallic, roughness: GGX alpha = roughness², as the G-buffer
  convention), a directional sun with hard cast shadows, a sky environment map (presets.py),
  lamps as area emitters on their globes. Fog is applied afterwards along each pixel's centre ray
  from the G-buffer depth; then exposure, ACES, sRGB (shading.py's tone curve).
- Variant: `scalar_rgb` or the vectorised `llvm_ad_rgb`; "auto" picks llvm when a libLLVM >= 16
  is installed (resolve_variant). The two draw different noise, both unbiased.
- Sun visibility: the sun alone on white Lambert surfaces, one centred sample per pixel (a
  delta light needs no more), divided by the unshadowed cosine: 1 lit, 0 in shadow or facing away.
- Sky visibility (the sky pass): white Lambert surfaces under a sky of radiance 1 above the horizon
  and 0 below, cosine-sampled, divided by what an unblocked surface of that normal sees of it
  ((1 + n.up) / 2): 1 open, 0 enclosed (a room's walls and ceiling, an arcade).

Mitsuba's camera is the canonical one turned to Mitsuba's axes (+x left, +z forward); its rays
start on the near plane (NEAR_CLIP). Tests hold it to camera.py's pixel convention.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

from ....model_zoo.errors import AlayaError
from ..camera import Camera
from ..shading import LightingPreset, aces
from .presets import TracedPreset
from .scene import Box, Cylinder, SceneDesc, Sphere
from .gbuffers import bake_textures

VARIANTS = ("scalar_rgb", "llvm_ad_rgb")
LLVM_MIN_VERSION = 16  # Dr.Jit's LLVM backend aborts the process with Debian bookworm's libLLVM 15
LLVM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
SKY_ROWS = 256  # the sky pass's lat-long sky: its horizon blurred over half a row (0.35 degrees)
NEAR_CLIP = 0.01  # metres along the optical axis
_TO_MITSUBA = np.diag([-1.0, 1.0, -1.0, 1.0])  # OpenGL camera axes -> Mitsuba's (+x left, +y up, +z forward)


def llvm_library() -> str | None:
    """The libLLVM that Mitsuba's `llvm_ad_rgb` variant can use: $DRJIT_LIBLLVM_PATH when set, else
    the newest libLLVM-N.so (N >= LLVM_MIN_VERSION) in the system library folders (Debian:
    `apt-get install libllvm19`); None when there is none."""
    if os.environ.get("DRJIT_LIBLLVM_PATH"):
        return os.environ["DRJIT_LIBLLVM_PATH"]
    found = []
    for folder in LLVM_DIRS:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"libLLVM-(\d+)\.so(\.1)?", name)
            if m and int(m.group(1)) >= LLVM_MIN_VERSION:
                found.append((int(m.group(1)), os.path.join(folder, name)))
    return max(found)[1] if found else None


def check_variant(variant: str) -> str:
    """`variant` when it is "auto" or one of VARIANTS; else a one-line error naming it."""
    if variant not in ("auto", *VARIANTS):
        raise AlayaError(f"world v2: Mitsuba variant {variant!r} is unknown; choose auto, {', '.join(VARIANTS)}")
    return variant


def resolve_variant(variant: str) -> str:
    """"auto": `llvm_ad_rgb` (vectorised, JIT-compiled; about twice scalar's speed on a street frame)
    when a usable libLLVM is installed, else `scalar_rgb`. Other names pass through unchanged."""
    if variant != "auto":
        return variant
    return "llvm_ad_rgb" if llvm_library() is not None else "scalar_rgb"


def mitsuba(variant: str = "scalar_rgb"):
    """The mitsuba module with `variant` set ("auto": resolve_variant); a clear error when it is missing."""
    variant = resolve_variant(check_variant(variant))
    if variant == "llvm_ad_rgb":
        library = llvm_library()
        if library is None:
            raise AlayaError(f"world v2: Mitsuba's llvm_ad_rgb needs libLLVM {LLVM_MIN_VERSION} or newer, and none "
                             "was found (apt-get install libllvm19, or set DRJIT_LIBLLVM_PATH); use scalar_rgb")
        os.environ.setdefault("DRJIT_LIBLLVM_PATH", library)  # read when Dr.Jit starts its LLVM backend
    try:
        import mitsuba as mi
    except ImportError as err:
        raise AlayaError("world v2 renders with Mitsuba 3, which is not installed: "
                         "pip install 'alaya-flash[pathtrace]'") from err
    if variant not in mi.variants():
        raise AlayaError(f"world v2: this Mitsuba build has no variant {variant!r} (has {', '.join(mi.variants())})")
    mi.set_variant(variant)
    return mi


def wet(material):
    """A porous material after rain: darker and glossy (what the rainy presets render)."""
    import dataclasses

    if not material.porous or material.metallic > 0.5:
        return material
    return dataclasses.replace(material, albedo=tuple(0.55 * v for v in material.albedo),
                               albedo2=tuple(0.55 * v for v in material.albedo2),
                               roughness=max(0.06, 0.25 * material.roughness))


def sky_bitmap(p: LightingPreset, height: int = 64) -> np.ndarray:
    """Lat-long sky radiance (height, 2 * height, 3) float32, rows from the zenith down: the
    gradient of shading._sky (horizon to zenith by sqrt(sin elevation), ground below) times ambient."""
    theta = (np.arange(height) + 0.5) / height * math.pi
    u = np.cos(theta)[:, None]  # sin(elevation)
    zen, hor, gnd = (np.asarray(c, np.float64) for c in (p.sky_zenith, p.sky_horizon, p.ground))
    above = hor + (zen - hor) * np.sqrt(np.maximum(u, 0))[..., None]
    below = hor + (gnd - hor) * np.sqrt(np.clip(-u, 0, 1))[..., None]
    rows = np.where(u[..., None] >= 0, above, below) * p.ambient
    return np.ascontiguousarray(np.repeat(rows, 2 * height, axis=1), dtype=np.float32)


def _box_mesh(boxes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vertices (V, 3), faces (F, 3) and uv (V, 2) in metres of a list of boxes (4 vertices a face,
    outward winding); uv: world x, y on horizontal faces, (along the face, z) on vertical ones."""
    verts, faces, uvs = [], [], []
    for box in boxes:
        c, s = math.cos(math.radians(box.yaw)), math.sin(math.radians(box.yaw))
        rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1.0]])
        half = np.asarray(box.size) / 2
        for axis in range(3):
            for sign in (1.0, -1.0):
                u_ax, v_ax = [a for a in range(3) if a != axis]
                local = []
                for cu, cv in ((-1, -1), (1, -1), (1, 1), (-1, 1)):
                    p = np.zeros(3)
                    p[axis], p[u_ax], p[v_ax] = sign * half[axis], cu * half[u_ax], cv * half[v_ax]
                    local.append(p)
                world = np.asarray(local) @ rot.T + np.asarray(box.center)
                normal = rot[:, axis] * sign
                if abs(normal[2]) > 0.5:
                    uv = world[:, :2]
                else:
                    t = np.array([-normal[1], normal[0]])
                    uv = np.stack([world[:, :2] @ t, world[:, 2]], 1)
                k = sum(len(v) for v in verts)
                tri = np.array([[0, 1, 2], [0, 2, 3]]) + k
                # wind both triangles counter-clockwise seen from outside
                e = np.cross(world[1] - world[0], world[2] - world[0])
                if np.dot(e, normal) < 0:
                    tri = tri[:, ::-1]
                verts.append(world)
                faces.append(tri)
                uvs.append(uv)
    return np.concatenate(verts), np.concatenate(faces), np.concatenate(uvs)


class MitsubaScene:
    """One SceneDesc as Mitsuba scenes: `gbuffer_scene()`, `truth_scene(preset, azimuth)`, `sun_scene(direction)`."""

    def __init__(self, desc: SceneDesc, variant: str = "auto", textures: dict | None = None):
        self.variant = resolve_variant(variant)
        self._mitsuba = mitsuba(self.variant)
        self.desc = desc
        self._textures = {k: self.mi.Bitmap(b) for k, b in (textures if textures is not None
                                                             else bake_textures(desc)).items()}
        # Groups of shapes that become one Mitsuba shape each: boxes merge per (object, material).
        groups: dict = {}
        self.entries = []  # (kind, payload, object id, material)
        for shape in desc.shapes:
            if isinstance(shape, Box):
                key = (shape.object, shape.material)
                if key not in groups:
                    groups[key] = len(self.entries)
                    self.entries.append(("boxes", [], shape.object, shape.material))
                self.entries[groups[key]][1].append(shape)
            else:
                self.entries.append(("shape", shape, shape.object, shape.material))
        self._meshes = {i: _box_mesh(e[1]) for i, e in enumerate(self.entries) if e[0] == "boxes"}

    @property
    def mi(self):
        """The mitsuba module, set to this scene's variant (scenes of two variants may share a process)."""
        if self._mitsuba.variant() != self.variant:
            self._mitsuba.set_variant(self.variant)
        return self._mitsuba

    # -- pieces ------------------------------------------------------------------------------------
    def _bsdf(self, k: int, wet_: bool = False):
        m = self.desc.materials[k]
        if wet_:
            m = wet(m)
        if m.texture:
            base = {"type": "bitmap", "bitmap": self._textures[k], "raw": True, "filter_type": "bilinear",
                    "to_uv": self.mi.ScalarTransform4f().scale([1 / m.tile, 1 / m.tile, 1])}
            if wet_ and m.porous and m.metallic <= 0.5:
                base = {"type": "bitmap", "bitmap": self.mi.Bitmap(np.asarray(self._textures[k]) * np.float32(0.55)),
                        "raw": True, "filter_type": "bilinear", "to_uv": base["to_uv"]}
        else:
            base = {"type": "rgb", "value": list(m.albedo)}
        return self.mi.load_dict({"type": "principled", "base_color": base, "metallic": float(m.metallic),
                                  "roughness": float(m.roughness)})

    def _shapes(self, bsdfs, emit=None) -> dict:
        """Scene dict entries "s00000"...: one per entry, in entry order (so shape index k + 1 = entry k)."""
        mi = self.mi
        out = {}
        for i, (kind, payload, _obj, mat) in enumerate(self.entries):
            bsdf = bsdfs[mat]
            emitter = emit(mat) if emit else None
            if kind == "boxes":
                v, f, uv = self._meshes[i]
                props = mi.Properties()
                props["bsdf"] = bsdf
                if emitter is not None:
                    props["emitter"] = emitter
                mesh = mi.Mesh(f"s{i:05d}", len(v), len(f), props, False, True)
                params = mi.traverse(mesh)
                params["vertex_positions"] = v.astype(np.float32).ravel().tolist()
                params["faces"] = f.astype(np.uint32).ravel().tolist()
                params["vertex_texcoords"] = uv.astype(np.float32).ravel().tolist()
                params.update()
                out[f"s{i:05d}"] = mesh
                continue
            entry = {"bsdf": bsdf}
            if emitter is not None:
                entry["emitter"] = emitter
            if isinstance(payload, Sphere):
                out[f"s{i:05d}"] = {"type": "sphere", "center": list(payload.center), "radius": payload.radius, **entry}
            elif isinstance(payload, Cylinder):
                out[f"s{i:05d}"] = {"type": "cylinder", "p0": list(payload.p0), "p1": list(payload.p1),
                                    "radius": payload.radius, **entry}
                axis = np.subtract(payload.p1, payload.p0)
                axis = axis / np.linalg.norm(axis)
                for cap, (centre, normal) in enumerate(((payload.p0, -axis), (payload.p1, axis))):
                    out[f"s{i:05d}c{cap}"] = {"type": "disk", "to_world": self._disk(centre, normal, payload.radius),
                                              **entry}
        return out

    def _disk(self, centre, normal, radius):
        n = np.asarray(normal, float)
        helper = np.array([1.0, 0, 0]) if abs(n[0]) < 0.9 else np.array([0, 1.0, 0])
        x = np.cross(helper, n)
        x /= np.linalg.norm(x)
        y = np.cross(n, x)
        m = np.eye(4)
        m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = x * radius, y * radius, n, centre
        return self.mi.ScalarTransform4f(m.tolist())

    def _load(self, shapes: dict, emitters: dict):
        scene = self.mi.load_dict({"type": "scene", **shapes, **emitters})
        # shape index k + 1 -> entry: caps ("s00012c0") belong to their cylinder's entry
        ids = [s.id() for s in scene.shapes()]
        self.shape_entry = np.array([-1] + [int(i[1:6]) for i in ids], dtype=np.int64)
        return scene

    # -- scenes ------------------------------------------------------------------------------------
    def gbuffer_scene(self):
        bsdfs = [self._bsdf(k) for k in range(len(self.desc.materials))]
        return self._load(self._shapes(bsdfs), {})

    def truth_scene(self, preset: TracedPreset, lighting: LightingPreset):
        """The scene lit by `lighting` (the preset with its sun placed, presets.placed)."""
        mi = self.mi
        wet_ = preset.wet and self.desc.kind != "interior"  # rain wets what is outdoors; rooms stay dry
        bsdfs = [self._bsdf(k, wet_) for k in range(len(self.desc.materials))]

        def emit(k):
            e = self.desc.materials[k].emission
            if e is None or not (preset.lamps or self.desc.lamps_on):
                return None
            return mi.load_dict({"type": "area", "radiance": {"type": "rgb", "value": list((preset.lamp_color if preset.lamps else None) or e)}})

        emitters = {"sky": {"type": "envmap", "bitmap": mi.Bitmap(sky_bitmap(lighting)),
                            "to_world": mi.ScalarTransform4f().rotate([1, 0, 0], 90)},
                    "sun": _directional(lighting.sun_direction, lighting.sun_color)}
        for k, (elevation, azimuth, rgb) in enumerate(lighting.fills):
            emitters[f"fill{k}"] = _directional(_direction(elevation, azimuth), rgb)
        return self._load(self._shapes(bsdfs, emit), emitters)

    def sun_scene(self, sun_direction):
        white = self.mi.load_dict({"type": "diffuse", "reflectance": {"type": "rgb", "value": [1.0, 1.0, 1.0]}})
        bsdfs = [white] * len(self.desc.materials)
        return self._load(self._shapes(bsdfs), {"sun": _directional(sun_direction, (1.0, 1.0, 1.0))})

    def sky_scene(self):
        """White Lambert surfaces under a sky of radiance 1 above the horizon, none below (sky_visibility)."""
        mi = self.mi
        white = mi.load_dict({"type": "diffuse", "reflectance": {"type": "rgb", "value": [1.0, 1.0, 1.0]}})
        above = np.zeros((SKY_ROWS, 2 * SKY_ROWS, 3), np.float32)
        above[:SKY_ROWS // 2] = 1.0  # rows from the zenith down: the upper half is the sky
        sky = {"type": "envmap", "bitmap": mi.Bitmap(above), "to_world": mi.ScalarTransform4f().rotate([1, 0, 0], 90)}
        return self._load(self._shapes([white] * len(self.desc.materials)), {"sky": sky})

    # -- rendering ---------------------------------------------------------------------------------
    def sensor(self, camera: Camera, spp: int = 1, centre: bool = False):
        mi = self.mi
        to_world = camera.camera_to_world @ _TO_MITSUBA
        sampler = ({"type": "stratified", "sample_count": 1, "jitter": False} if centre
                   else {"type": "independent", "sample_count": int(spp)})
        return mi.load_dict({"type": "perspective", "fov": float(camera.fov_y), "fov_axis": "y",
                             "near_clip": NEAR_CLIP, "far_clip": 10000.0,
                             "to_world": mi.ScalarTransform4f(to_world.tolist()),
                             "film": {"type": "hdrfilm", "width": camera.width, "height": camera.height,
                                      "rfilter": {"type": "box"}, "pixel_format": "rgb"},
                             "sampler": sampler})

    def aov(self, scene, camera: Camera) -> dict[str, np.ndarray]:
        """Mitsuba's own view of a gbuffer_scene() (the latest loaded) at the pixel centres, for
        holding the caster to it: "depth" (canonical, +inf background), "normal" (camera space),
        "albedo", "object_id". Slow in the scalar variant (see gbuffers.py); tests use small frames.
        scalar_rgb only: llvm_ad_rgb's shape indices do not follow scene.shapes() and its normals move by ~3e-3."""
        if self.variant != "scalar_rgb":
            raise AlayaError(f"world v2: aov() needs a scalar_rgb scene, this one is {self.variant}")
        mi = self.mi
        integrator = mi.load_dict({"type": "aov", "aovs": "dd:depth,nn:sh_normal,ab:albedo,si:shape_index"})
        img = np.asarray(mi.render(scene, sensor=self.sensor(camera, centre=True), integrator=integrator, spp=1),
                         dtype=np.float64)[..., -8:]  # the aovs in order (after R, G, B when present)
        dist, normal_w, albedo, shape = img[..., 0], img[..., 1:4], img[..., 4:7], np.rint(img[..., 7]).astype(np.int64)
        entry = np.where((dist > 0) & (shape > 0), self.shape_entry[np.clip(shape, 0, len(self.shape_entry) - 1)], -1)
        hit = entry >= 0
        objects = np.array([e[2] for e in self.entries] + [0])
        normal = normal_w @ camera.rotation.T
        # Mitsuba's camera rays start on the near plane, so its distances stop NEAR_CLIP short along z
        return {"depth": np.where(hit, dist / np.linalg.norm(camera.view_dirs(), axis=-1) + NEAR_CLIP, np.inf),
                "normal": np.where(hit[..., None], normal, (0.0, 0.0, 1.0)),
                "albedo": np.where(hit[..., None], albedo, 0.0), "object_id": objects[entry]}

    def radiance(self, scene, camera: Camera, spp: int, max_depth: int, seed: int = 0) -> np.ndarray:
        """Path-traced linear radiance (H, W, 3) float32 of a truth_scene()."""
        mi = self.mi
        integrator = mi.load_dict({"type": "path", "max_depth": int(max_depth)})
        img = mi.render(scene, sensor=self.sensor(camera, spp=spp), integrator=integrator, spp=int(spp), seed=int(seed))
        return np.asarray(img, dtype=np.float32)[..., :3]

    def sun_visibility(self, scene, camera: Camera, sun_direction, normal: np.ndarray, hit: np.ndarray) -> np.ndarray:
        """(H, W) float32 in [0, 1]: the sun's visibility at each pixel's surface, 0 for background
        and faces turned from the sun. `normal` is the frame's camera-space normal pass."""
        mi = self.mi
        integrator = mi.load_dict({"type": "direct", "emitter_samples": 1, "bsdf_samples": 0, "hide_emitters": True})
        lit = np.asarray(mi.render(scene, sensor=self.sensor(camera, centre=True), integrator=integrator, spp=1),
                         dtype=np.float64)[..., 0]
        cos = normal.astype(np.float64) @ (camera.rotation @ np.asarray(sun_direction, float))
        with np.errstate(divide="ignore", invalid="ignore"):
            vis = np.where(cos > 1e-3, lit * math.pi / cos, 0.0)
        return np.clip(np.where(hit, vis, 0.0), 0, 1).astype(np.float32)

    def sky_visibility(self, scene, camera: Camera, normal: np.ndarray, hit: np.ndarray, samples: int,
                       seed: int = 0) -> np.ndarray:
        """(H, W) float32 in [0, 1] of a sky_scene(): the share of the sky (the hemisphere above the
        horizon, cosine-weighted) each pixel's surface sees, over what an unblocked surface of its
        normal sees ((1 + n.up) / 2, at least 1/4 for surfaces facing down); 1 on the background.
        `samples` cosine-weighted rays a pixel (spread over its footprint)."""
        mi = self.mi
        integrator = mi.load_dict({"type": "direct", "emitter_samples": 0, "bsdf_samples": 1, "hide_emitters": True})
        seen = np.asarray(mi.render(scene, sensor=self.sensor(camera, spp=samples), integrator=integrator,
                                    spp=int(samples), seed=int(seed)), dtype=np.float64)[..., 0]
        up = normal.astype(np.float64) @ (camera.rotation @ np.array([0.0, 0.0, 1.0]))
        vis = seen / np.maximum((1 + up) / 2, 0.25)
        return np.clip(np.where(hit, vis, 1.0), 0, 1).astype(np.float32)


def _direction(elevation: float, azimuth: float) -> np.ndarray:
    e, a = math.radians(elevation), math.radians(azimuth)
    return np.array([math.cos(e) * math.cos(a), math.cos(e) * math.sin(a), math.sin(e)])


def _directional(to_light, irradiance) -> dict:
    d = -np.asarray(to_light, float)
    return {"type": "directional", "direction": d.tolist(), "irradiance": {"type": "rgb", "value": list(irradiance)}}


def tone_map(radiance: np.ndarray, depth: np.ndarray, lighting: LightingPreset, exposure: float = 1.0) -> np.ndarray:
    """Linear radiance (H, W, 3) -> uint8 sRGB: fog by the G-buffer depth (background: 60% fog, as
    shade()), exposure (the preset's times the scene's), ACES, sRGB encoding."""
    color = radiance.astype(np.float32)
    if lighting.fog_density > 0:
        fog_color = np.asarray(lighting.fog_color, np.float32)
        finite = np.isfinite(depth)
        fog = np.where(finite, 1 - np.exp(-lighting.fog_density * np.where(finite, depth, 0.0)), 0.6)
        color = color + (fog_color - color) * fog[..., None].astype(np.float32)
    ldr = aces(color * np.float32(lighting.exposure * exposure))
    srgb = np.where(ldr <= 0.0031308, ldr * 12.92, 1.055 * np.maximum(ldr, 0.0031308) ** (1 / 2.4) - 0.055)
    return np.clip(np.rint(srgb * 255), 0, 255).astype(np.uint8)
