"""Headless G-buffer rasterizer: moderngl on EGL (Mesa llvmpipe on a CPU), one geometry pass.

All geoms live in one vertex buffer (local-frame triangles with their geom index); per frame only
a small float texture of model-view matrices (computed in float64 on the CPU) is uploaded, then a
single draw writes three RGBA32F targets:
  0: linear albedo rgb, metallic      1: camera-space normal xyz, roughness
  2: linear depth, object id, sun visibility, unused
Spheres, ellipsoids and capsules get analytic normals from their local position; planes, boxes,
cylinders and meshes use their (exact, flat) face normals. Albedo's checker texture is evaluated
in the geom's local frame exactly as the ray caster does (raycast.py).

Sun visibility (optional shadows): one orthographic shadow map per sun direction, sampled with a
3x3 PCF in the same geometry pass.

Pitfalls handled (research/gbuffer-source.md): the EGL backend is named explicitly; every GL call
runs inside `with self.ctx:` so a second EGL context in the process (MuJoCo's) cannot leave ours
non-current; GL rows are bottom-up and are flipped on readback.
"""
from __future__ import annotations

import logging

import numpy as np

from ...model_zoo.errors import AlayaError
from .camera import Camera
from .geometry import geom_triangles
from .scene import BOX, CAPSULE, CYLINDER, ELLIPSOID, MESH, PLANE, SPHERE, Scene

log = logging.getLogger(__name__)

MAX_SIZE = 4096

_VERTEX = """
#version 330
uniform sampler2D modelview;  // 3 texels per geom: rows of [R | t], world->camera applied
uniform mat4 proj;
in vec3 in_pos;
in vec3 in_normal;
in float in_geom;
out vec3 v_local;
out vec3 v_view;
out vec3 v_normal;
flat out int v_geom;
flat out mat3 v_rot;
void main() {
    int g = int(in_geom + 0.5);
    vec4 r0 = texelFetch(modelview, ivec2(0, g), 0);
    vec4 r1 = texelFetch(modelview, ivec2(1, g), 0);
    vec4 r2 = texelFetch(modelview, ivec2(2, g), 0);
    mat3 rot = transpose(mat3(r0.xyz, r1.xyz, r2.xyz));
    v_view = rot * in_pos + vec3(r0.w, r1.w, r2.w);
    v_normal = rot * in_normal;
    v_local = in_pos;
    v_geom = g;
    v_rot = rot;
    gl_Position = proj * vec4(v_view, 1.0);
}
"""

_FRAGMENT = """
#version 330
uniform sampler2D materials;  // 4 texels per geom: (albedo, metallic) (albedo2, roughness)
                              // (checker, kind, 0, 0) (size xyz, 0)
uniform int num_suns;
uniform sampler2DShadow shadow0;
uniform mat4 sun_matrix0;  // camera space -> shadow map clip space
uniform vec3 sun_dir0;  // camera space, towards the sun
uniform float depth_texel;  // one shadow-map texel's width in the map's [0, 1] depth units
in vec3 v_local;
in vec3 v_view;
in vec3 v_normal;
flat in int v_geom;
flat in mat3 v_rot;
layout(location = 0) out vec4 out_albedo;
layout(location = 1) out vec4 out_normal;
layout(location = 2) out vec4 out_depth;

float sun_visibility(vec3 n) {
    if (num_suns == 0) return 1.0;
    float n_l = dot(n, sun_dir0);
    if (n_l <= 0.0) return 0.0;  // faces away from the sun: in its own shadow
    vec4 p = sun_matrix0 * vec4(v_view, 1.0);
    vec3 uvz = p.xyz / p.w * 0.5 + 0.5;
    // Slope-scaled depth bias (no lateral normal offset, which would move grazing shadows).
    float tan_t = sqrt(max(1.0 - n_l * n_l, 0.0)) / n_l;
    float bias = depth_texel * (1.0 + 2.5 * min(tan_t, 20.0));
    float texel = 1.0 / float(textureSize(shadow0, 0).x);
    float sum = 0.0;
    for (int dx = -1; dx <= 1; dx++)
        for (int dy = -1; dy <= 1; dy++)
            sum += texture(shadow0, vec3(uvz.xy + vec2(dx, dy) * texel, uvz.z - bias));
    return sum / 9.0;
}

void main() {
    vec4 m0 = texelFetch(materials, ivec2(0, v_geom), 0);
    vec4 m1 = texelFetch(materials, ivec2(1, v_geom), 0);
    vec4 m2 = texelFetch(materials, ivec2(2, v_geom), 0);
    vec4 m3 = texelFetch(materials, ivec2(3, v_geom), 0);
    int kind = int(m2.y + 0.5);
    vec3 n = v_normal;
    if (kind == KIND_SPHERE) n = v_rot * v_local;
    else if (kind == KIND_ELLIPSOID) n = v_rot * (v_local / (m3.xyz * m3.xyz));
    else if (kind == KIND_CAPSULE) n = v_rot * (v_local - vec3(0.0, 0.0, clamp(v_local.z, -m3.y, m3.y)));
    n = normalize(n);
    vec3 albedo = m0.rgb;
    if (m2.x > 0.0) {
        vec3 c = floor(v_local * m2.x);
        if (kind == KIND_PLANE) c.z = 0.0;
        if (mod(c.x + c.y + c.z, 2.0) >= 1.0) albedo = m1.rgb;
    }
    out_albedo = vec4(albedo, m0.a);
    out_normal = vec4(n, m1.a);
    out_depth = vec4(-v_view.z, float(v_geom + 1), sun_visibility(n), 0.0);
}
"""

_SHADE_VERTEX = """
#version 330
in vec2 in_xy;
void main() { gl_Position = vec4(in_xy, 0.0, 1.0); }
"""

# A line-by-line port of shading.shade() (numpy float32), the definition of the ground truth;
# tests hold the two within 1/255.
_SHADE_FRAGMENT = """
#version 330
uniform sampler2D t_albedo;  // rgb albedo, a metallic
uniform sampler2D t_normal;  // xyz normal, a roughness
uniform sampler2D t_depth;   // x depth, y object id, z sun visibility
uniform vec2 size;
uniform float focal;
uniform vec3 up;
uniform vec3 sun_dir;
uniform vec3 sun_color;
uniform vec3 sky_zenith;
uniform vec3 sky_horizon;
uniform vec3 ground;
uniform float ambient;
uniform int num_fills;
uniform vec3 fill_dir[4];
uniform vec3 fill_color[4];
uniform vec3 fog_color;
uniform float fog_density;
uniform float exposure;
uniform int use_visibility;
out vec4 out_rgb;
const float PI = 3.14159265358979;

vec3 sky(vec3 d) {
    float u = dot(d, up);
    if (u >= 0.0) return sky_horizon + (sky_zenith - sky_horizon) * sqrt(max(u, 0.0));
    return sky_horizon + (ground - sky_horizon) * sqrt(clamp(-u, 0.0, 1.0));
}

vec3 ggx(vec3 n, vec3 v, vec3 l, vec3 albedo, float metallic, float roughness, vec3 radiance) {
    vec3 h = l + v;
    h = h / max(sqrt(dot(h, h)), 1e-8);
    float n_l = max(dot(n, l), 0.0);
    float n_v = max(dot(n, v), 1e-4);
    float n_h = max(dot(n, h), 0.0);
    float v_h = max(dot(v, h), 0.0);
    float a = max(roughness * roughness, 2e-3);
    float a2 = a * a;
    float q = n_h * n_h * (a2 - 1.0) + 1.0;
    float d = a2 / (PI * q * q);
    float k = (roughness + 1.0) * (roughness + 1.0) / 8.0;
    float g = n_v / (n_v * (1.0 - k) + k) * n_l / (n_l * (1.0 - k) + k);
    vec3 f0 = 0.04 * (1.0 - metallic) + albedo * metallic;
    float w = 1.0 - v_h;
    vec3 f = f0 + (1.0 - f0) * (w * w * w * w * w);
    vec3 spec = d * g * f / (4.0 * n_v * n_l + 1e-4);
    vec3 diffuse = (1.0 - f) * (1.0 - metallic) * albedo / PI;
    return (diffuse + spec) * radiance * n_l;
}

void main() {
    ivec2 px = ivec2(gl_FragCoord.xy);
    vec4 t0 = texelFetch(t_albedo, px, 0);
    vec4 t1 = texelFetch(t_normal, px, 0);
    vec4 t2 = texelFetch(t_depth, px, 0);
    vec3 view = vec3((gl_FragCoord.x - size.x * 0.5) / focal, (gl_FragCoord.y - size.y * 0.5) / focal, -1.0);
    view = view / max(sqrt(dot(view, view)), 1e-8);
    vec3 color;
    if (t2.y < 0.5) {  // background
        color = sky(view) + sun_color * pow(max(dot(view, sun_dir), 0.0), 2000.0);
        if (fog_density > 0.0) color = color + (fog_color - color) * 0.6;
    } else {
        vec3 albedo = t0.rgb, n = t1.xyz, v = -view;
        float metallic = t0.a, roughness = t1.a;
        vec3 radiance = use_visibility == 1 ? sun_color * t2.z : sun_color;
        color = ggx(n, v, sun_dir, albedo, metallic, roughness, radiance);
        for (int i = 0; i < num_fills; i++)
            color += ggx(n, v, fill_dir[i], albedo, metallic, roughness, fill_color[i]);
        float t = dot(n, up) * 0.5 + 0.5;
        vec3 irradiance = (ground + (sky_zenith * 0.5 + sky_horizon * 0.5 - ground) * t) * ambient;
        float n_v = max(dot(n, v), 0.0);
        vec3 f0 = 0.04 * (1.0 - metallic) + albedo * metallic;
        float w = 1.0 - n_v;
        vec3 f_amb = f0 + max(max(1.0 - roughness, 0.0) - f0, 0.0) * (w * w * w * w * w);
        vec3 mirror = 2.0 * dot(n, v) * n - v;
        vec3 spec_amb = sky(mirror) * ambient * f_amb * (1.0 - 0.7 * roughness);
        color = color + irradiance * albedo * (1.0 - metallic) * (1.0 - f_amb) + spec_amb;
        float fog = 1.0 - exp(-fog_density * t2.x);
        color = color + (fog_color - color) * fog;
    }
    vec3 x = color * exposure;
    vec3 ldr = clamp(x * (2.51 * x + 0.03) / (x * (2.43 * x + 0.59) + 0.14), 0.0, 1.0);
    vec3 srgb = mix(1.055 * pow(max(ldr, vec3(0.0031308)), vec3(1.0 / 2.4)) - 0.055, ldr * 12.92,
                    lessThanEqual(ldr, vec3(0.0031308)));
    out_rgb = vec4(floor(clamp(srgb, 0.0, 1.0) * 255.0 + 0.5) / 255.0, 1.0);
}
"""

_SHADOW_VERTEX = """
#version 330
uniform sampler2D modelview;  // here: geom -> sun view
uniform mat4 proj;
in vec3 in_pos;
in vec3 in_normal;
in float in_geom;
void main() {
    int g = int(in_geom + 0.5);
    vec4 r0 = texelFetch(modelview, ivec2(0, g), 0);
    vec4 r1 = texelFetch(modelview, ivec2(1, g), 0);
    vec4 r2 = texelFetch(modelview, ivec2(2, g), 0);
    vec3 p = transpose(mat3(r0.xyz, r1.xyz, r2.xyz)) * in_pos + vec3(r0.w, r1.w, r2.w);
    gl_Position = proj * vec4(p, 1.0);
}
"""

_SHADOW_FRAGMENT = """
#version 330
void main() {}
"""


def check_size(width: int, height: int) -> None:
    for name, v in (("width", width), ("height", height)):
        if not isinstance(v, (int, np.integer)) or not 8 <= v <= MAX_SIZE:
            raise AlayaError(f"world: {name}={v} is out of range 8..{MAX_SIZE} pixels")


def sun_view(sun_dir_world: np.ndarray, arena: float) -> tuple[np.ndarray, np.ndarray]:
    """World->sun-view rotation/translation (4x4) and an orthographic projection covering the arena."""
    d = np.asarray(sun_dir_world, dtype=np.float64)
    d = d / np.linalg.norm(d)  # direction towards the sun
    reach = 2.0 * arena + 4.0
    cam = Camera.look_at(d * reach, np.zeros(3), 8, 8, 60.0,
                         up=(0.0, 1.0, 0.0) if abs(d[2]) > 0.99 else (0.0, 0.0, 1.0))
    s = 1.0 / (arena * 1.5 + 1.0)
    near, far = 0.1, 2 * reach + 4.0
    proj = np.array([[s, 0, 0, 0], [0, s, 0, 0], [0, 0, -2 / (far - near), -(far + near) / (far - near)],
                     [0, 0, 0, 1.0]])
    return cam.world_to_camera, proj


class GLRenderer:
    """G-buffers of a Scene from a Camera. render() returns a dict of canonical float32 passes."""

    SHADOW_SIZE = 1024

    def __init__(self, scene: Scene, width: int, height: int):
        import moderngl

        check_size(width, height)
        bad = scene.unsupported_geoms({PLANE, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH})
        if bad:
            raise AlayaError(f"world: the rasterizer cannot draw {', '.join(bad)}")
        self.scene, self.width, self.height = scene, width, height
        try:
            self.ctx = moderngl.create_standalone_context(backend="egl", require=330)
        except Exception as err:  # glcontext raises plain Exceptions with the EGL reason
            raise GLUnavailable(f"no OpenGL 3.3 context through EGL: {err}") from None
        with self.ctx:
            self._build()

    def _build(self) -> None:
        import moderngl

        ctx, scene = self.ctx, self.scene
        defines = "\n".join(f"#define KIND_{n} {k}" for n, k in
                            (("PLANE", PLANE), ("SPHERE", SPHERE), ("ELLIPSOID", ELLIPSOID), ("CAPSULE", CAPSULE)))
        frag = _FRAGMENT.replace("#version 330", "#version 330\n" + defines)
        self.prog = ctx.program(vertex_shader=_VERTEX, fragment_shader=frag)
        self.shadow_prog = ctx.program(vertex_shader=_SHADOW_VERTEX, fragment_shader=_SHADOW_FRAGMENT)

        chunks = []
        for g in range(scene.ngeom):
            pos, nrm = geom_triangles(scene, g)
            chunks.append(np.concatenate([pos, nrm, np.full((len(pos), 1), g)], 1))
        self.vbo = ctx.buffer(np.concatenate(chunks).astype("f4").tobytes())
        self.vao = ctx.vertex_array(self.prog, [(self.vbo, "3f 3f 1f", "in_pos", "in_normal", "in_geom")])
        self.shadow_vao = ctx.vertex_array(self.shadow_prog, [(self.vbo, "3f 12x 1f", "in_pos", "in_geom")])

        m = scene.materials
        size = scene.model.geom_size.astype(np.float64)
        mat = np.zeros((scene.ngeom, 4, 4), np.float32)
        mat[:, 0, :3], mat[:, 0, 3] = m.albedo, m.metallic
        mat[:, 1, :3], mat[:, 1, 3] = m.albedo2, m.roughness
        mat[:, 2, 0], mat[:, 2, 1] = m.checker, scene.model.geom_type
        mat[:, 3, :3] = size
        self.materials = ctx.texture((4, scene.ngeom), 4, mat.tobytes(), dtype="f4")
        self.modelview = ctx.texture((3, scene.ngeom), 4, dtype="f4")
        for tex in (self.materials, self.modelview):
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)

        self.targets = [ctx.texture((self.width, self.height), 4, dtype="f4") for _ in range(3)]
        self.depth = ctx.depth_renderbuffer((self.width, self.height))
        self.fbo = ctx.framebuffer(color_attachments=self.targets, depth_attachment=self.depth)
        self.shadow_map = ctx.depth_texture((self.SHADOW_SIZE, self.SHADOW_SIZE))
        self.shadow_map.compare_func = "<="
        self.shadow_map.repeat_x = self.shadow_map.repeat_y = False
        self.shadow_fbo = ctx.framebuffer(depth_attachment=self.shadow_map)
        self.shade_prog = ctx.program(vertex_shader=_SHADE_VERTEX, fragment_shader=_SHADE_FRAGMENT)
        quad = np.array([-1, -1, 1, -1, -1, 1, 1, 1], dtype="f4")
        self.quad = ctx.vertex_array(self.shade_prog, [(ctx.buffer(quad.tobytes()), "2f", "in_xy")])
        self.rgb_target = ctx.texture((self.width, self.height), 4, dtype="f1")
        self.rgb_fbo = ctx.framebuffer(color_attachments=[self.rgb_target])
        for k, name in enumerate(("t_albedo", "t_normal", "t_depth")):
            self.shade_prog[name].value = 3 + k
        self.prog["modelview"].value = 0
        self.prog["materials"].value = 1
        self.prog["shadow0"].value = 2
        self.shadow_prog["modelview"].value = 0

    def _upload_modelview(self, world_to_view: np.ndarray) -> None:
        pos, rot = self.scene.geom_poses()
        mv = np.zeros((self.scene.ngeom, 3, 4))
        mv[:, :, :3] = world_to_view[:3, :3] @ rot
        mv[:, :, 3] = pos @ world_to_view[:3, :3].T + world_to_view[:3, 3]
        self.modelview.write(mv.astype("f4").tobytes())

    def render(self, camera: Camera, sun_dirs: tuple = (), presets: tuple = ()) -> dict[str, np.ndarray]:
        """G-buffer passes for the scene's current state.

        sun_dirs (world directions towards each sun) add "sun_visibility" (S, H, W) float32 in
        [0, 1] (1 = lit). presets (shading.LightingPreset) add "rgb" (P, H, W, 3) uint8: ground
        truth shaded on the GL side from the float targets, equal to shading.shade() of the
        returned passes within 1/255; with sun_dirs, preset k is lit by sun k's visibility.
        """
        import moderngl

        if (camera.width, camera.height) != (self.width, self.height):
            raise AlayaError(f"world: camera is {camera.width}x{camera.height}, renderer is {self.width}x{self.height}")
        if sun_dirs and presets and len(sun_dirs) != len(presets):
            raise AlayaError(f"world: {len(sun_dirs)} sun directions for {len(presets)} presets")
        visibility, rgbs, outs = [], [], None
        with self.ctx:
            for s in range(max(1, len(sun_dirs))):
                self.ctx.enable(moderngl.DEPTH_TEST)
                self.ctx.disable(moderngl.CULL_FACE)
                if sun_dirs:
                    self._shadow_pass(np.asarray(sun_dirs[s]), camera)
                self.prog["num_suns"].value = 1 if sun_dirs else 0
                self._upload_modelview(camera.world_to_camera)
                self.prog["proj"].write(camera.projection().T.astype("f4").tobytes())
                self.fbo.use()
                self.fbo.clear(0.0, 0.0, 0.0, 0.0, depth=1.0)
                self.modelview.use(0)
                self.materials.use(1)
                self.shadow_map.use(2)
                self.vao.render(moderngl.TRIANGLES)
                if outs is None:
                    outs = [self._read(k) for k in range(3)]
                    if sun_dirs:
                        visibility.append(outs[2][..., 2].copy())
                else:
                    visibility.append(self._read(2)[..., 2].copy())
                if sun_dirs and presets:
                    rgbs.append(self._shade(camera, presets[s], True))
            if presets and not sun_dirs:
                rgbs = [self._shade(camera, p, False) for p in presets]
        passes = _finish(outs[0], outs[1], outs[2])
        if sun_dirs:
            hit = passes["object_id"] > 0
            passes["sun_visibility"] = np.stack([np.where(hit, v, 1.0) for v in visibility]).astype(np.float32)
        if presets:
            passes["rgb"] = np.stack(rgbs)
        return passes

    def _read(self, attachment: int) -> np.ndarray:
        data = self.fbo.read(attachment=attachment, components=4, dtype="f4")
        return np.frombuffer(data, np.float32).reshape(self.height, self.width, 4)[::-1]

    def _shade(self, camera: Camera, preset, use_visibility: bool) -> np.ndarray:
        """Deferred PBR of the current G-buffer targets under one preset -> uint8 (H, W, 3)."""
        import moderngl

        from .shading import _direction

        rot = camera.rotation
        prog = self.shade_prog
        values = {"size": (float(self.width), float(self.height)), "focal": float(camera.focal),
                  "up": tuple(rot[:, 2]), "sun_dir": tuple(rot @ preset.sun_direction),
                  "sun_color": preset.sun_color, "sky_zenith": preset.sky_zenith, "sky_horizon": preset.sky_horizon,
                  "ground": preset.ground, "ambient": float(preset.ambient), "num_fills": len(preset.fills),
                  "fog_color": preset.fog_color, "fog_density": float(preset.fog_density),
                  "exposure": float(preset.exposure), "use_visibility": int(use_visibility)}
        for name, value in values.items():
            if name in prog:
                prog[name].value = value
        fills = list(preset.fills)
        if len(fills) > 4:
            raise AlayaError(f"lighting preset {preset.name}: at most 4 fill lights, got {len(fills)}")
        if fills:
            pad = 4 - len(fills)
            prog["fill_dir"].value = [tuple(rot @ _direction(e, a)) for e, a, _ in fills] + [(0.0, 0.0, 1.0)] * pad
            prog["fill_color"].value = [tuple(map(float, c)) for _, _, c in fills] + [(0.0, 0.0, 0.0)] * pad
        self.ctx.disable(moderngl.DEPTH_TEST)
        for k, target in enumerate(self.targets):
            target.use(3 + k)
        self.rgb_fbo.use()
        self.quad.render(moderngl.TRIANGLE_STRIP)
        data = self.rgb_fbo.read(components=3, dtype="f1")
        return np.frombuffer(data, np.uint8).reshape(self.height, self.width, 3)[::-1].copy()

    def _shadow_pass(self, sun_dir: np.ndarray, camera: Camera) -> None:
        import moderngl

        view, proj = sun_view(sun_dir, self.scene.config.arena)
        self._upload_modelview(view)
        self.shadow_prog["proj"].write(proj.T.astype("f4").tobytes())
        self.shadow_fbo.use()
        self.shadow_fbo.clear(depth=1.0)
        self.modelview.use(0)
        self.shadow_vao.render(moderngl.TRIANGLES)
        # Camera space -> shadow clip space, for the geometry pass.
        texel_m = 2.0 / proj[0, 0] / self.SHADOW_SIZE
        self.prog["depth_texel"].value = texel_m * proj[2, 2] / -2.0
        self.prog["sun_dir0"].value = tuple(camera.rotation @ (sun_dir / np.linalg.norm(sun_dir)))
        self.prog["sun_matrix0"].write((proj @ view @ camera.camera_to_world).T.astype("f4").tobytes())

    def release(self) -> None:
        self.ctx.release()


class GLUnavailable(AlayaError):
    """No OpenGL context could be made (no EGL, no driver)."""


def _finish(t0: np.ndarray, t1: np.ndarray, t2: np.ndarray) -> dict[str, np.ndarray]:
    """Split the three RGBA targets into canonical passes; background per streaming/gbuffer.py."""
    object_id = np.rint(t2[..., 1]).astype(np.int32)
    bg = object_id == 0
    depth = np.where(bg, np.float32(np.inf), t2[..., 0]).astype(np.float32)
    normal = np.where(bg[..., None], np.float32([0.0, 0.0, 1.0]), t1[..., :3])
    return {
        "albedo": np.ascontiguousarray(t0[..., :3]),
        "depth": depth,
        "metallic": np.ascontiguousarray(t0[..., 3]),
        "normal": normal,
        "roughness": np.ascontiguousarray(t1[..., 3]),
        "object_id": object_id,
    }


def make_renderer(scene: Scene, width: int, height: int, backend: str = "auto"):
    """A renderer with .render(camera, sun_dirs=()) -> passes. backend: "auto" | "gl" | "torch".

    "auto" tries the GL rasterizer and, when no GL context can be made, says so once and falls
    back to the PyTorch ray caster.
    """
    from .raycast import RayCaster

    if backend not in ("auto", "gl", "torch"):
        raise AlayaError(f"world: renderer backend {backend!r} is unknown; choose auto, gl or torch")
    check_size(width, height)
    if backend == "torch":
        return RayCaster(scene, width, height)
    try:
        return GLRenderer(scene, width, height)
    except GLUnavailable as err:
        if backend == "gl":
            raise
        _warn_once(f"world: {err}; falling back to the PyTorch ray caster (slower)")
        return RayCaster(scene, width, height)


_warned: set[str] = set()  # "say so once" per process: the fallback warning is not repeated per renderer


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)

