"""World v2 scene descriptions: streets, courtyards and interiors from a seed, in plain dataclasses.

A `SceneDesc` is the one description both renderers read (render.py): materials, shapes (boxes,
capped cylinders, spheres) and where cameras may go. Nothing here imports Mitsuba, so a scene can
be made, inspected, saved as JSON and tested without it.

Conventions: world z-up, metres (as streaming/world/camera.py). Object ids start at 1 (0 is the
background); an object may be several shapes (a car: body, cabin, wheels), all with its id.
A material's `albedo` is its linear base colour (the G-buffer's albedo for an untextured
material); a textured one bakes `textures.make_texture(texture, albedo, albedo2, texture_seed)`,
repeated every `tile` metres. `metallic` and `roughness` are constant per material, so the
G-buffer's metallic and roughness are exact. `emission` is the linear radiance of a lamp when a
preset switches lamps on.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ....model_zoo.errors import AlayaError
from ...gbuffer import srgb_to_linear

KINDS = ("street", "courtyard", "interior")

# What each kind of scene shows, in prompt words (presets.py composes captions with it).
CONTENT = {
    "street": "a city street lined with buildings, parked cars and lamp posts",
    "courtyard": "a paved courtyard surrounded by buildings, with tables, pillars and lamps",
    "interior": "a furnished room with plaster walls, wooden floor and windows",
}


@dataclass(frozen=True)
class Material:
    name: str  # what it is: brick, plaster, paint, asphalt, stone, wood, metal, painted_metal, rubber, lamp...
    albedo: tuple  # linear RGB base colour
    metallic: float = 0.0
    roughness: float = 0.5
    texture: str | None = None  # a textures.PATTERNS name; None: plain albedo
    albedo2: tuple = (0.0, 0.0, 0.0)  # the pattern's second colour (mortar, grout, grain, chips)
    tile: float = 2.0  # metres per texture repeat
    texture_seed: int = 0
    emission: tuple | None = None  # linear radiance when lamps are on
    porous: bool = True  # darkens and turns glossy when wet (rainy presets)


@dataclass(frozen=True)
class Box:
    center: tuple
    size: tuple  # full extents along the box's own x, y, z
    material: int
    object: int
    yaw: float = 0.0  # degrees about +z


@dataclass(frozen=True)
class Cylinder:
    p0: tuple  # centre of one cap
    p1: tuple  # centre of the other cap
    radius: float
    material: int
    object: int


@dataclass(frozen=True)
class Sphere:
    center: tuple
    radius: float
    material: int
    object: int


@dataclass(frozen=True)
class CameraAnchors:
    """Where camera paths may go without passing through anything."""

    walk: tuple  # polyline of (x, y) waypoints at eye height
    drive: tuple | None  # ((x0, y), (x1, y)) along a road, or None
    orbit: tuple  # (cx, cy, radius, target height)
    eye: float = 1.6  # walking eye height, metres


@dataclass(frozen=True)
class SceneDesc:
    kind: str
    seed: int
    materials: tuple
    shapes: tuple
    objects: tuple  # object names, id - 1
    anchors: CameraAnchors
    exposure: float = 1.0  # a camera's exposure for this kind of place (interiors are darker)
    ground_objects: tuple = ()  # ids of the ground (road, pavement, floor), for shadow metrics
    lamps_on: bool = False  # lamps glow under every preset (rooms keep their lights on)

    @property
    def content(self) -> str:
        return CONTENT[self.kind]

    def to_json(self) -> dict:
        def shape(s):
            return {"type": type(s).__name__.lower(), **asdict(s)}

        return {"kind": self.kind, "seed": self.seed, "content": self.content, "exposure": self.exposure,
                "materials": [asdict(m) for m in self.materials], "shapes": [shape(s) for s in self.shapes],
                "objects": list(self.objects), "ground_objects": list(self.ground_objects), "lamps_on": self.lamps_on,
                "anchors": asdict(self.anchors), "convention": "world z-up, metres; object id 0 = background"}


def _srgb(*rgb) -> tuple:
    return tuple(float(v) for v in srgb_to_linear(np.asarray(rgb, np.float32) / 255.0))


class _Builder:
    """Collects materials, shapes and objects; keeps props out of camera corridors and each other."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.materials: list[Material] = []
        self.shapes: list = []
        self.objects: list[str] = []
        self.keep_out: list = []  # ("seg", a, b, half_width) | ("ring", c, r, half_width) | ("disc", c, r)

    def material(self, name, albedo, **kw) -> int:
        seed = int(self.rng.integers(1 << 31)) if kw.get("texture") else 0
        self.materials.append(Material(name, tuple(float(v) for v in albedo), texture_seed=seed, **kw))
        return len(self.materials) - 1

    def object(self, name: str) -> int:
        self.objects.append(name)
        return len(self.objects)

    def box(self, obj, material, center, size, yaw=0.0):
        self.shapes.append(Box(tuple(map(float, center)), tuple(map(float, size)), material, obj, float(yaw)))

    def cylinder(self, obj, material, p0, p1, radius):
        self.shapes.append(Cylinder(tuple(map(float, p0)), tuple(map(float, p1)), float(radius), material, obj))

    def sphere(self, obj, material, center, radius):
        self.shapes.append(Sphere(tuple(map(float, center)), float(radius), material, obj))

    def free(self, xy, radius) -> bool:
        """Is a footprint circle clear of every corridor, ring and earlier prop?"""
        p = np.asarray(xy, float)
        for zone in self.keep_out:
            if zone[0] == "seg":
                a, b, hw = np.asarray(zone[1]), np.asarray(zone[2]), zone[3]
                t = np.clip(np.dot(p - a, b - a) / max(np.dot(b - a, b - a), 1e-9), 0, 1)
                if np.linalg.norm(p - (a + t * (b - a))) < hw + radius:
                    return False
            elif zone[0] == "ring":
                if abs(np.linalg.norm(p - np.asarray(zone[1])) - zone[2]) < zone[3] + radius:
                    return False
            elif np.linalg.norm(p - np.asarray(zone[1])) < zone[2] + radius:
                return False
        return True

    def claim(self, xy, radius) -> None:
        self.keep_out.append(("disc", tuple(map(float, xy)), float(radius)))

    def place(self, sample, radius, tries=30):
        """A free (x, y) from sample() or None; claims it."""
        for _ in range(tries):
            xy = sample()
            if self.free(xy, radius):
                self.claim(xy, radius)
                return xy
        return None

    # -- materials -------------------------------------------------------------------------------
    def wall_material(self) -> int:
        rng = self.rng
        k = rng.choice(["brick", "plaster", "paint"], p=[0.4, 0.35, 0.25])
        if k == "brick":
            c = _srgb(*rng.uniform([140, 60, 40], [190, 100, 75]))
            return self.material("brick", c, roughness=float(rng.uniform(0.75, 0.9)), texture="brick",
                                 albedo2=_srgb(*rng.uniform([170, 165, 155], [210, 205, 195])), tile=2.0)
        if k == "plaster":
            c = _srgb(*rng.uniform([180, 170, 150], [235, 225, 205]))
            return self.material("plaster", c, roughness=float(rng.uniform(0.8, 0.95)), texture="plaster",
                                 albedo2=tuple(v * 0.8 for v in c), tile=3.0)
        c = _srgb(*rng.uniform(60, 230, size=3))
        return self.material("paint", c, roughness=float(rng.uniform(0.45, 0.7)))

    def car_paint(self) -> int:
        c = _srgb(*self.rng.choice([[170, 20, 20], [20, 50, 140], [220, 220, 215], [25, 25, 28],
                                    [120, 125, 130], [30, 100, 60], [200, 150, 30]]))
        return self.material("painted_metal", c, metallic=float(self.rng.uniform(0.5, 0.9)),
                             roughness=float(self.rng.uniform(0.2, 0.4)), porous=False)

    def bare_metal(self) -> int:
        c = _srgb(*self.rng.uniform([150, 150, 150], [215, 210, 205]))
        return self.material("metal", c, metallic=1.0, roughness=float(self.rng.uniform(0.15, 0.45)), porous=False)

    # -- props -----------------------------------------------------------------------------------
    def building(self, x0, x1, y0, y1, height, facade_dir, window_mat, name="building"):
        """A block from (x0, y0) to (x1, y1) with a grid of dark window slabs on the side facing
        facade_dir ('+y', '-y', '+x' or '-x')."""
        obj = self.object(name)
        wall = self.wall_material()
        self.box(obj, wall, ((x0 + x1) / 2, (y0 + y1) / 2, height / 2), (x1 - x0, y1 - y0, height))
        along = (x0, x1) if facade_dir in ("+y", "-y") else (y0, y1)
        length = along[1] - along[0]
        n = max(1, int(length // 2.6))
        pitch = length / n
        for floor in range(int((height - 1.0) // 3.0)):
            z = 1.2 + floor * 3.0 + 0.8
            if z + 0.8 > height - 0.3:
                break
            for k in range(n):
                c = along[0] + (k + 0.5) * pitch
                if facade_dir == "+y":
                    self.box(obj, window_mat, (c, y1 + 0.02, z), (1.2, 0.04, 1.5))
                elif facade_dir == "-y":
                    self.box(obj, window_mat, (c, y0 - 0.02, z), (1.2, 0.04, 1.5))
                elif facade_dir == "+x":
                    self.box(obj, window_mat, (x1 + 0.02, c, z), (0.04, 1.2, 1.5))
                else:
                    self.box(obj, window_mat, (x0 - 0.02, c, z), (0.04, 1.2, 1.5))

    def car(self, x, y, heading, rubber):
        obj = self.object("car")
        paint = self.car_paint()
        c, s = math.cos(math.radians(heading)), math.sin(math.radians(heading))
        self.box(obj, paint, (x, y, 0.65), (4.2, 1.8, 0.75), heading)
        self.box(obj, paint, (x - 0.3 * c, y - 0.3 * s, 1.3), (2.2, 1.6, 0.6), heading)
        for fx in (-1.35, 1.35):
            for fy in (-0.9, 0.9):
                wx, wy = x + fx * c - fy * s, y + fx * s + fy * c
                # a wheel's axis is the car's y axis
                ax, ay = -s * 0.12, c * 0.12
                self.cylinder(obj, rubber, (wx - ax, wy - ay, 0.33), (wx + ax, wy + ay, 0.33), 0.33)

    def lamp_post(self, x, y, pole_mat, lamp_mat, height=4.5):
        obj = self.object("lamp post")
        self.cylinder(obj, pole_mat, (x, y, 0.0), (x, y, height), 0.07)
        self.sphere(obj, lamp_mat, (x, y, height + 0.2), 0.25)

    def table(self, x, y, top_mat, leg_mat, size=(1.4, 0.8), yaw=0.0):
        obj = self.object("table")
        self.box(obj, top_mat, (x, y, 0.74), (size[0], size[1], 0.05), yaw)
        c, s = math.cos(math.radians(yaw)), math.sin(math.radians(yaw))
        for fx in (-1, 1):
            for fy in (-1, 1):
                lx, ly = fx * (size[0] / 2 - 0.08), fy * (size[1] / 2 - 0.08)
                px, py = x + lx * c - ly * s, y + lx * s + ly * c
                self.cylinder(obj, leg_mat, (px, py, 0.0), (px, py, 0.715), 0.03)

    def crate(self, x, y, wood, size=None):
        obj = self.object("crate")
        s = size or float(self.rng.uniform(0.5, 1.0))
        self.box(obj, wood, (x, y, s / 2), (s, s, s), float(self.rng.uniform(0, 90)))

    def ball(self, x, y, z_base, radius, material):
        obj = self.object("sphere")
        self.sphere(obj, material, (x, y, z_base + radius), radius)

    def finish(self, kind, anchors, exposure=1.0, ground=(), lamps_on=False) -> SceneDesc:
        return SceneDesc(kind=kind, seed=self.seed, materials=tuple(self.materials), shapes=tuple(self.shapes),
                         objects=tuple(self.objects), anchors=anchors, exposure=exposure,
                         ground_objects=tuple(ground), lamps_on=lamps_on)


def _common_materials(b: _Builder) -> dict:
    return {"window": b.material("window", _srgb(28, 32, 38), roughness=0.15, porous=False),
            "rubber": b.material("rubber", _srgb(22, 22, 24), roughness=0.9),
            "pole": b.bare_metal(),
            "lamp": b.material("lamp", _srgb(235, 230, 215), roughness=0.3, porous=False,
                               emission=(9.0, 6.5, 3.6)),
            "wood": b.material("wood", _srgb(*b.rng.uniform([120, 80, 45], [170, 120, 75])), roughness=0.6,
                               texture="wood", albedo2=_srgb(70, 45, 25), tile=1.5)}


def street(seed: int) -> SceneDesc:
    """A straight street along x: asphalt road, kerbs and pavements, building blocks on both sides
    (gaps between blocks show the sky), parked cars, lamp posts, crates, spheres."""
    b = _Builder(seed)
    rng = b.rng
    m = _common_materials(b)
    half_len, road, walk_w = 60.0, float(rng.uniform(3.0, 4.0)), float(rng.uniform(2.5, 3.5))
    asphalt = b.material("asphalt", _srgb(*[rng.uniform(70, 95)] * 3), roughness=float(rng.uniform(0.8, 0.95)),
                         texture="asphalt", albedo2=_srgb(150, 150, 145), tile=2.0)
    paving = b.material("stone", _srgb(*rng.uniform([140, 135, 125], [185, 180, 170])), roughness=0.85,
                        texture="tiles", albedo2=_srgb(90, 88, 85), tile=2.0)
    marking = b.material("paint", _srgb(230, 230, 225), roughness=0.5)
    ground = b.object("road")
    b.box(ground, asphalt, (0, 0, -0.1), (2 * half_len, 2 * (road + walk_w) + 40, 0.2))
    pavement = b.object("pavement")
    for side in (-1, 1):
        b.box(pavement, paving, (0, side * (road + walk_w / 2), 0.075), (2 * half_len, walk_w, 0.15))
    lines = b.object("road marking")
    for x in np.arange(-half_len + 2, half_len - 2, 6.0):
        b.box(lines, marking, (x + 1.5, 0.0, 0.003), (3.0, 0.12, 0.006))
    # camera corridors: the right lane (drive), the right pavement's middle (walk), an orbit ring
    eye_y = -(road + walk_w * 0.45)
    drive = ((-45.0, -road / 2), (45.0, -road / 2))
    walk = ((-45.0, eye_y), (45.0, eye_y))
    ox = float(rng.uniform(-20, 20))
    orbit = (ox, 0.0, float(min(road, 3.2)), 1.0)
    b.keep_out += [("seg", *drive, 1.4), ("seg", *walk, 0.5), ("ring", (ox, 0.0), orbit[2], 0.6)]
    # buildings: blocks along both sides, a gap here and there
    for side in (-1, 1):
        x = -half_len
        while x < half_len:
            length = float(rng.uniform(8, 22))
            depth, height = float(rng.uniform(8, 14)), float(rng.uniform(6, 22))
            y0 = road + walk_w if side > 0 else -(road + walk_w) - depth
            b.building(x, min(x + length, half_len), y0, y0 + depth, height, "-y" if side > 0 else "+y", m["window"])
            x += length + (float(rng.uniform(2, 6)) if rng.random() < 0.3 else 0.0)
    # parked cars by the kerbs, lamp posts and bollard spheres on the pavements, crates
    for side in (-1, 1):
        for x in np.arange(-half_len + 5, half_len - 5, 7.5):
            if rng.random() < 0.55:
                xy = (float(x + rng.uniform(-1, 1)), side * (road - 1.05))
                if b.free(xy, 2.1):
                    b.claim(xy, 2.1)
                    b.car(*xy, float(rng.choice([0.0, 180.0]) + rng.uniform(-3, 3)), m["rubber"])
        for x in np.arange(-half_len + 3, half_len, float(rng.uniform(12, 18))):
            xy = (float(x), side * (road + 0.25))
            if b.free(xy, 0.2):
                b.claim(xy, 0.2)
                b.lamp_post(*xy, m["pole"], m["lamp"])
    for _ in range(int(rng.integers(6, 14))):
        side = rng.choice([-1, 1])
        xy = b.place(lambda: (float(rng.uniform(-half_len + 2, half_len - 2)),
                              float(side * (road + rng.uniform(0.3, walk_w - 0.4)))), 0.5)
        if xy is None:
            continue
        if rng.random() < 0.5:
            b.crate(*xy, m["wood"], size=float(rng.uniform(0.4, 0.8)))
        else:
            mat = b.bare_metal() if rng.random() < 0.5 else b.material("stone", _srgb(*[rng.uniform(120, 200)] * 3),
                                                                       roughness=0.7)
            b.ball(*xy, 0.15, float(rng.uniform(0.2, 0.4)), mat)
    return b.finish("street", CameraAnchors(walk=walk, drive=drive, orbit=orbit), ground=(ground, pavement))


def courtyard(seed: int) -> SceneDesc:
    """A square paved yard closed by buildings on three sides and a low wall with a gap on the
    fourth; a colonnade of pillars, tables, a fountain, lamps, spheres and crates."""
    b = _Builder(seed)
    rng = b.rng
    m = _common_materials(b)
    half = float(rng.uniform(10, 15))
    paving = b.material("stone", _srgb(*rng.uniform([150, 140, 125], [200, 190, 175])), roughness=0.8,
                        texture="tiles", albedo2=_srgb(95, 90, 85), tile=float(rng.uniform(1.5, 3.0)))
    ground = b.object("paving")
    b.box(ground, paving, (0, 0, -0.1), (2 * half + 60, 2 * half + 60, 0.2))
    r_orbit = float(rng.uniform(5.0, 0.6 * half))
    orbit = (0.0, 0.0, r_orbit, 1.0)
    walk = ((-half + 2.5, -half + 3.0), (half - 2.5, half - 4.0))
    b.keep_out += [("ring", (0.0, 0.0), r_orbit, 0.7), ("seg", *walk, 0.7)]
    for facade, (x0, x1, y0, y1) in {"-y": (-half - 12, half + 12, half, half + 10),
                                     "+x": (-half - 10, -half, -half, half),
                                     "-x": (half, half + 10, -half, half)}.items():
        b.building(x0, x1, y0, y1, float(rng.uniform(8, 16)), facade, m["window"])
    wall = b.object("wall")
    wmat = b.wall_material()
    gap = float(rng.uniform(-half / 2, half / 2))
    for a, c in ((-half, gap - 2.0), (gap + 2.0, half)):
        b.box(wall, wmat, ((a + c) / 2, -half - 0.2, 1.2), (c - a, 0.4, 2.4))
    # fountain in the middle: a basin and a sphere
    fountain = b.object("fountain")
    basin = b.material("stone", _srgb(*[rng.uniform(160, 210)] * 3), roughness=0.6)
    b.cylinder(fountain, basin, (0, 0, 0), (0, 0, 0.5), 1.4)
    b.sphere(fountain, b.bare_metal(), (0, 0, 1.1), 0.6)
    b.claim((0.0, 0.0), 1.5)
    # colonnade along one building
    pillar = b.material("plaster", _srgb(*rng.uniform([200, 190, 170], [235, 228, 210])), roughness=0.85)
    for y in np.arange(-half + 2, half - 1, 3.0):
        xy = (half - 1.5, float(y))
        if b.free(xy, 0.35):
            b.claim(xy, 0.35)
            b.cylinder(b.object("pillar"), pillar, (*xy, 0), (*xy, 4.0), 0.3)
    for _ in range(int(rng.integers(3, 7))):
        xy = b.place(lambda: tuple(rng.uniform(-half + 2, half - 2, size=2)), 1.0)
        if xy is not None:
            b.table(*map(float, xy), m["wood"], b.bare_metal(), yaw=float(rng.uniform(0, 90)))
    for _ in range(int(rng.integers(2, 5))):
        xy = b.place(lambda: tuple(rng.uniform(-half + 1, half - 1, size=2)), 0.25)
        if xy is not None:
            b.lamp_post(*map(float, xy), m["pole"], m["lamp"], height=3.5)
    for _ in range(int(rng.integers(4, 10))):
        xy = b.place(lambda: tuple(rng.uniform(-half + 1, half - 1, size=2)), 0.6)
        if xy is None:
            continue
        if rng.random() < 0.5:
            b.crate(*map(float, xy), m["wood"])
        else:
            mat = b.bare_metal() if rng.random() < 0.4 else b.material(
                "paint", _srgb(*rng.uniform(40, 230, size=3)), roughness=float(rng.uniform(0.2, 0.7)))
            b.ball(*map(float, xy), 0.0, float(rng.uniform(0.25, 0.6)), mat)
    if rng.random() < 0.6:
        xy = b.place(lambda: tuple(rng.uniform(-half + 4, half - 4, size=2)), 2.3)
        if xy is not None:
            b.car(*map(float, xy), float(rng.uniform(0, 360)), m["rubber"])
    return b.finish("courtyard", CameraAnchors(walk=walk, drive=None, orbit=orbit), ground=(ground,))


def interior(seed: int) -> SceneDesc:
    """A room with thick plaster walls, a ceiling and windows in one or two walls (sky and a
    building across the street beyond), wooden floor, furniture, ceiling and floor lamps."""
    b = _Builder(seed)
    rng = b.rng
    m = _common_materials(b)
    hx, hy, h, t = float(rng.uniform(4, 6)), float(rng.uniform(3, 4.5)), 3.0, 0.25
    floor_mat = b.material("wood", _srgb(*rng.uniform([130, 85, 50], [185, 135, 90])), roughness=0.45,
                           texture="wood", albedo2=_srgb(80, 50, 30), tile=2.0)
    outside = b.material("stone", _srgb(150, 148, 140), roughness=0.85, texture="tiles",
                         albedo2=_srgb(90, 88, 85), tile=2.0)
    floor = b.object("floor")
    b.box(floor, floor_mat, (0, 0, -0.1), (2 * hx, 2 * hy, 0.2))
    yard = b.object("outside ground")
    b.box(yard, outside, (0, 0, -0.3), (80, 80, 0.2))  # below the floor, seen through windows
    walls = b.object("walls")
    wall_mat = b.wall_material() if rng.random() < 0.3 else b.material(
        "plaster", _srgb(*rng.uniform([190, 180, 160], [240, 235, 225])), roughness=0.9, texture="plaster",
        albedo2=_srgb(*rng.uniform([170, 160, 140], [215, 205, 190])), tile=3.0)
    b.box(walls, wall_mat, (0, 0, h + 0.1), (2 * hx + 2 * t, 2 * hy + 2 * t, 0.2))  # ceiling
    ends = ["-x", "+x"] if rng.random() < 0.5 else [str(rng.choice(["-x", "+x"]))]
    window_sides = ["+y"] + ends
    for side in ("+y", "-y", "+x", "-x"):
        along = hx if side in ("+y", "-y") else hy
        sign = 1 if side[0] == "+" else -1

        def wall_box(a0, a1, z0, z1):
            if side in ("+y", "-y"):
                b.box(walls, wall_mat, ((a0 + a1) / 2, sign * (hy + t / 2), (z0 + z1) / 2), (a1 - a0, t, z1 - z0))
            else:
                b.box(walls, wall_mat, (sign * (hx + t / 2), (a0 + a1) / 2, (z0 + z1) / 2), (t, a1 - a0, z1 - z0))

        lo, hi = -along - t, along + t
        if side not in window_sides:
            wall_box(lo, hi, 0.0, h)
            continue
        n = max(1, int(2 * along // 2.6))
        sill, lintel, width = 0.6, 2.6, float(rng.uniform(1.4, 2.0))
        centres = [-along + (k + 0.5) * 2 * along / n for k in range(n)]
        wall_box(lo, hi, 0.0, sill)
        wall_box(lo, hi, lintel, h)
        edges = [lo] + [e for c in centres for e in (c - width / 2, c + width / 2)] + [hi]
        for a0, a1 in zip(edges[0::2], edges[1::2]):
            wall_box(a0, a1, sill, lintel)
    # a building across the street beyond the windows
    b.building(-30, 30, hy + 14, hy + 24, float(rng.uniform(10, 20)), "-y", m["window"], name="building")
    # camera: walk along the long axis, orbit around the middle
    walk = ((-hx + 1.0, -0.3 * hy), (hx - 1.0, 0.3 * hy))
    orbit = (0.0, 0.0, float(min(hx, hy) * 0.55), 1.0)
    b.keep_out += [("seg", *walk, 0.6), ("ring", (0.0, 0.0), orbit[2], 0.5)]
    # furniture
    fabric = b.material("fabric", _srgb(*rng.uniform(50, 200, size=3)), roughness=0.95)
    for _ in range(int(rng.integers(1, 3))):
        xy = b.place(lambda: (float(rng.uniform(-hx + 1, hx - 1)), float(rng.uniform(-hy + 0.8, hy - 0.8))), 0.9)
        if xy is not None:
            b.table(*xy, m["wood"], b.bare_metal(), size=(1.2, 0.8), yaw=float(rng.choice([0, 90])))
    for side in (-1, 1):  # a sofa or shelf against the windowless walls
        xy = (float(rng.uniform(-hx + 1.5, hx - 1.5)), side * (hy - 0.45))
        if side < 0 and b.free(xy, 0.8):
            b.claim(xy, 0.8)
            sofa = b.object("sofa")
            b.box(sofa, fabric, (xy[0], xy[1], 0.22), (2.0, 0.85, 0.44))
            b.box(sofa, fabric, (xy[0], xy[1] - 0.32, 0.6), (2.0, 0.2, 0.7))
    shelf_xy = (-hx + 0.25, float(rng.uniform(-hy + 1, hy - 1)))
    if b.free(shelf_xy, 0.5):
        b.claim(shelf_xy, 0.5)
        shelf = b.object("shelf")
        b.box(shelf, m["wood"], (shelf_xy[0], shelf_xy[1], 1.0), (0.4, 1.2, 2.0))
    for _ in range(int(rng.integers(2, 6))):
        xy = b.place(lambda: (float(rng.uniform(-hx + 0.6, hx - 0.6)), float(rng.uniform(-hy + 0.6, hy - 0.6))), 0.4)
        if xy is None:
            continue
        mat = b.bare_metal() if rng.random() < 0.4 else b.material(
            "paint", _srgb(*rng.uniform(40, 230, size=3)), roughness=float(rng.uniform(0.2, 0.7)))
        if rng.random() < 0.5:
            b.ball(*xy, 0.0, float(rng.uniform(0.15, 0.35)), mat)
        else:
            b.crate(*xy, m["wood"], size=float(rng.uniform(0.35, 0.6)))
    # lamps: one or two hanging from the ceiling, a floor lamp
    for _ in range(int(rng.integers(1, 3))):
        x, y = float(rng.uniform(-hx + 1.5, hx - 1.5)), float(rng.uniform(-hy + 1.2, hy - 1.2))
        lamp = b.object("ceiling lamp")
        b.cylinder(lamp, m["pole"], (x, y, 2.45), (x, y, h), 0.015)
        b.sphere(lamp, m["lamp"], (x, y, 2.3), 0.18)
    xy = b.place(lambda: (float(rng.uniform(-hx + 0.5, hx - 0.5)), float(rng.uniform(-hy + 0.5, hy - 0.5))), 0.3)
    if xy is not None:
        b.lamp_post(*xy, m["pole"], m["lamp"], height=1.5)
    return b.finish("interior", CameraAnchors(walk=walk, drive=None, orbit=orbit, eye=1.6), exposure=2.0,
                    ground=(floor,), lamps_on=True)


GENERATORS = {"street": street, "courtyard": courtyard, "interior": interior}


def make_scene(kind: str, seed: int) -> SceneDesc:
    """The scene of `kind` for `seed`; the same arguments give the same description."""
    if kind not in GENERATORS:
        raise AlayaError(f"world v2: scene kind {kind!r} is unknown; choose one of {', '.join(KINDS)}")
    return GENERATORS[kind](int(seed))
