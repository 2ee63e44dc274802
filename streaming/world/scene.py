"""Procedural, seeded MuJoCo scenes: a ground plane, walls and many falling objects.

`build_scene(SceneConfig(seed=3, num_objects=24))` writes an MJCF document from the seed, has MuJoCo
compile it, gives the free objects random velocities, and returns a `Scene`: the MuJoCo model and
data plus a per-geom material table that both renderers read. MuJoCo is the source of truth for
geometry (types, sizes, meshes, poses) and for rgba / metallic / roughness (MJCF `<material>`);
the table adds what MJCF has no slot for: a second colour and scale for a solid checker texture
evaluated in the geom's local frame (so rolling objects visibly roll).

Conventions: world is z-up, metres. MJCF rgba colours are sRGB-encoded; the table holds linear
albedo. Object id of geom g is g + 1 (0 is background). The geom named "player" (a ball on a
free joint) is what the playable loop drives.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import srgb_to_linear

# MuJoCo geom type codes (mjtGeom).
PLANE, HFIELD, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH = range(8)
GEOM_NAMES = {PLANE: "plane", HFIELD: "hfield", SPHERE: "sphere", CAPSULE: "capsule",
              ELLIPSOID: "ellipsoid", CYLINDER: "cylinder", BOX: "box", MESH: "mesh"}

MAX_OBJECTS = 200


@dataclass(frozen=True)
class SceneConfig:
    """What a procedural scene contains. Defaults give a lively 4 m x 4 m arena."""

    seed: int = 0
    num_objects: int = 16  # dynamic objects besides the player ("scene density")
    arena: float = 3.0  # half-extent of the walled floor, metres
    walls: bool = True
    meshes: bool = True  # include convex mesh "rocks" among the objects
    player: bool = True  # a controllable ball named "player"
    timestep: float = 1.0 / 240.0  # physics step, seconds

    def validate(self) -> "SceneConfig":
        if not 0 <= self.num_objects <= MAX_OBJECTS:
            raise AlayaError(f"scene: num_objects={self.num_objects} is out of range 0..{MAX_OBJECTS}")
        if not 1.0 <= self.arena <= 50.0:
            raise AlayaError(f"scene: arena={self.arena} is out of range 1..50 metres")
        if not 1e-4 <= self.timestep <= 0.05:
            raise AlayaError(f"scene: timestep={self.timestep} is out of range 1e-4..0.05 s")
        return self


@dataclass
class Materials:
    """Per-geom material table, index = MuJoCo geom id (arrays of length ngeom)."""

    albedo: np.ndarray  # (G, 3) float32 linear, first checker colour (or the only colour)
    albedo2: np.ndarray  # (G, 3) float32 linear, second checker colour
    checker: np.ndarray  # (G,) float32 checker cells per metre; 0 = plain colour
    metallic: np.ndarray  # (G,) float32
    roughness: np.ndarray  # (G,) float32


@dataclass
class Scene:
    """A compiled scene: MuJoCo model + data, materials, and the config it came from."""

    config: SceneConfig
    model: object  # mujoco.MjModel
    data: object  # mujoco.MjData
    materials: Materials
    xml: str
    dynamic_bodies: list[int] = field(default_factory=list)  # body ids of free objects

    @property
    def ngeom(self) -> int:
        return int(self.model.ngeom)

    @property
    def time(self) -> float:
        return float(self.data.time)

    def body_id(self, name: str) -> int:
        import mujoco

        bid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)
        if bid < 0:
            raise AlayaError(f"scene: no body named {name!r}")
        return bid

    def step(self, seconds: float) -> None:
        """Advance physics by `seconds` (rounded to whole steps, at least one)."""
        import mujoco

        n = max(1, int(round(seconds / self.model.opt.timestep)))
        mujoco.mj_step(self.model, self.data, nstep=n)

    def geom_poses(self) -> tuple[np.ndarray, np.ndarray]:
        """World poses of all geoms: positions (G, 3) and rotation matrices (G, 3, 3), float64."""
        return self.data.geom_xpos.copy(), self.data.geom_xmat.reshape(-1, 3, 3).copy()

    def mesh(self, geom: int) -> tuple[np.ndarray, np.ndarray]:
        """Vertices (V, 3) float64 and triangles (F, 3) int of a mesh geom, in its local frame."""
        m = self.model
        mid = int(m.geom_dataid[geom])
        va, vn = int(m.mesh_vertadr[mid]), int(m.mesh_vertnum[mid])
        fa, fn = int(m.mesh_faceadr[mid]), int(m.mesh_facenum[mid])
        return m.mesh_vert[va:va + vn].astype(np.float64), m.mesh_face[fa:fa + fn].astype(np.int64)

    def unsupported_geoms(self, supported: set[int]) -> list[str]:
        """Names ('geom 3 (hfield)') of geoms whose type is not in `supported`."""
        return [f"geom {g} ({GEOM_NAMES.get(int(t), t)})" for g, t in enumerate(self.model.geom_type)
                if int(t) not in supported]


def _fmt(values) -> str:
    return " ".join(f"{float(v):.6g}" for v in np.atleast_1d(values))


def _rock_vertices(rng: np.random.Generator, radius: float) -> np.ndarray:
    """Points on a jittered sphere; MuJoCo takes their convex hull as the mesh."""
    n = int(rng.integers(10, 18))
    v = rng.normal(size=(n, 3))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v * radius * rng.uniform(0.7, 1.0, size=(n, 1)) * np.array([1.0, 1.0, rng.uniform(0.6, 1.0)])


def _random_material(rng: np.random.Generator) -> dict:
    """One object's material: sRGB rgba, metallic, roughness, maybe a checker texture."""
    hue = rng.uniform(0, 1)
    sat = rng.uniform(0.35, 0.95)
    val = rng.uniform(0.45, 0.95)
    rgb = _hsv_to_rgb(hue, sat, val)
    metallic = float(rng.choice([0.0, 0.0, 0.0, 1.0])) if rng.uniform() < 0.7 else float(rng.uniform(0, 1))
    checker = float(rng.choice([0.0, 0.0, 6.0, 10.0]))
    rgb2 = _hsv_to_rgb((hue + 0.5) % 1.0, sat * 0.6, min(1.0, val * 1.1)) if checker else rgb
    return {"rgb": rgb, "rgb2": rgb2, "checker": checker, "metallic": metallic,
            "roughness": float(rng.uniform(0.08, 0.9))}


def _hsv_to_rgb(h: float, s: float, v: float) -> np.ndarray:
    i = int(h * 6) % 6
    f = h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    return np.array([(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i])


def build_scene(config: SceneConfig = SceneConfig()) -> Scene:
    """Compile a procedural scene from `config` (same config -> same scene, bit for bit)."""
    import mujoco

    config.validate()
    rng = np.random.default_rng(config.seed)
    a = config.arena
    mats: list[dict] = []  # in geom order; each geom gets its own material
    assets: list[str] = []
    bodies: list[str] = []

    def material(spec: dict) -> str:
        name = f"mat{len(mats)}"
        mats.append(spec)
        r, g, b = spec["rgb"]
        assets.append(f'<material name="{name}" rgba="{_fmt([r, g, b, 1.0])}" '
                      f'metallic="{spec["metallic"]:.6g}" roughness="{spec["roughness"]:.6g}"/>')
        return name

    # 1. Static world: floor (checkered, rough) and four walls.
    floor = {"rgb": np.array([0.62, 0.6, 0.56]), "rgb2": np.array([0.38, 0.37, 0.35]), "checker": 1.0,
             "metallic": 0.0, "roughness": 0.85}
    statics = [f'<geom name="floor" type="plane" size="{a:.6g} {a:.6g} 0.1" material="{material(floor)}"/>']
    if config.walls:
        t, h = 0.1, 0.25
        wall = {"rgb": _hsv_to_rgb(rng.uniform(0, 1), 0.25, 0.8), "checker": 0.0, "metallic": 0.0, "roughness": 0.7}
        wall["rgb2"] = wall["rgb"]
        for name, pos, size in [("wall_n", (0, a + t, h), (a + 2 * t, t, h)), ("wall_s", (0, -a - t, h), (a + 2 * t, t, h)),
                                ("wall_e", (a + t, 0, h), (t, a, h)), ("wall_w", (-a - t, 0, h), (t, a, h))]:
            statics.append(f'<geom name="{name}" type="box" pos="{_fmt(pos)}" size="{_fmt(size)}" '
                           f'material="{material(wall)}"/>')

    # 2. Dynamic objects dropped from random heights, plus the player ball.
    kinds = ["sphere", "box", "capsule", "cylinder", "ellipsoid"] + (["mesh"] if config.meshes else [])
    specs = []
    if config.player:
        specs.append(("player", "sphere"))
    specs += [(f"obj{i}", kinds[int(rng.integers(len(kinds)))]) for i in range(config.num_objects)]
    for name, kind in specs:
        s = rng.uniform(0.12, 0.3)
        pos = (rng.uniform(-a + 0.4, a - 0.4), rng.uniform(-a + 0.4, a - 0.4), rng.uniform(0.3, 2.5))
        euler = rng.uniform(-180, 180, size=3)
        mat = _random_material(rng)
        if name == "player":
            s, pos, euler = 0.25, (0.0, 0.0, 0.25), np.zeros(3)
            mat = {"rgb": np.array([0.95, 0.55, 0.1]), "rgb2": np.array([0.15, 0.1, 0.05]), "checker": 8.0,
                   "metallic": 0.0, "roughness": 0.4}
        if kind == "sphere":
            geom = f'type="sphere" size="{s:.6g}"'
        elif kind == "box":
            geom = f'type="box" size="{_fmt(s * rng.uniform(0.5, 1.0, 3))}"'
        elif kind in ("capsule", "cylinder"):
            geom = f'type="{kind}" size="{s * 0.6:.6g} {s * rng.uniform(0.6, 1.4):.6g}"'
        elif kind == "ellipsoid":
            geom = f'type="ellipsoid" size="{_fmt(s * rng.uniform(0.5, 1.0, 3))}"'
        else:
            mesh_name = f"rock_{name}"
            assets.append(f'<mesh name="{mesh_name}" vertex="{_fmt(_rock_vertices(rng, s).ravel())}"/>')
            geom = f'type="mesh" mesh="{mesh_name}"'
        bodies.append(f'<body name="{name}" pos="{_fmt(pos)}" euler="{_fmt(euler)}"><freejoint/>'
                      f'<geom name="{name}" {geom} material="{material(mat)}" density="600"/></body>')

    xml = f"""<mujoco model="alaya-world-{config.seed}">
  <compiler angle="degree"/>
  <option timestep="{config.timestep:.9g}" integrator="implicitfast"/>
  <visual><quality offsamples="0"/></visual>
  <default><geom friction="0.8 0.02 0.001" condim="4"/></default>
  <asset>
    {chr(10).join('    ' + x for x in assets).strip()}
  </asset>
  <worldbody>
    {chr(10).join('    ' + x for x in statics + bodies).strip()}
  </worldbody>
</mujoco>
"""
    try:
        model = mujoco.MjModel.from_xml_string(xml)
    except ValueError as err:  # MuJoCo's compile errors
        raise AlayaError(f"scene seed {config.seed}: MuJoCo could not compile the scene: {err}") from None
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)

    # 3. Random initial velocities for the free objects (not the player).
    dynamic = [b for b in range(1, model.nbody) if model.body_jntnum[b] == 1]
    for b in dynamic:
        if mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b) == "player":
            continue
        dof = int(model.jnt_dofadr[model.body_jntadr[b]])
        data.qvel[dof:dof + 3] = rng.uniform(-1.5, 1.5, 3) * np.array([1, 1, 0.3])
        data.qvel[dof + 3:dof + 6] = rng.uniform(-3, 3, 3)
    mujoco.mj_forward(model, data)

    # 4. Material table in geom order, read back from MuJoCo where MJCF has the field.
    matid = model.geom_matid
    if (matid < 0).any():
        raise AlayaError("scene: every geom needs a material")
    table = Materials(
        albedo=srgb_to_linear(model.mat_rgba[matid, :3]).astype(np.float32),
        albedo2=srgb_to_linear(np.array([mats[i]["rgb2"] for i in matid])).astype(np.float32),
        checker=np.array([mats[i]["checker"] for i in matid], dtype=np.float32),
        metallic=model.mat_metallic[matid].astype(np.float32),
        roughness=model.mat_roughness[matid].astype(np.float32),
    )
    return Scene(config=config, model=model, data=data, materials=table, xml=xml, dynamic_bodies=dynamic)
