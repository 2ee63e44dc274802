"""Engine conventions: what Blender, Unreal and Unity write, and how it becomes canonical.

A G-buffer exported from an engine differs from our canonical form (streaming/gbuffer.py) in
pass names, normal space and axes, depth kind and units, albedo encoding and background values.
A `Convention` names those choices for one engine; `to_canonical` converts one frame's passes.
docs/gbuffers.md ("Engines") has the export steps per engine and the same table in prose.

  convention  normals                          depth                               albedo   roughness
  alaya       camera space, OpenGL axes        planar, metres, +inf background     linear   roughness
  blender     world space, Z up (camera.json)  planar Z, metres, >= 1e9 background linear   AOV roughness
  unreal      world space, Z up, left-handed   planar SceneDepth, cm, >= 65504 bg  linear   roughness
  unity       world space, Y up, left-handed   planar eye depth, metres            linear   1 - smoothness

World-space normals need the camera's rotation per frame: `camera.json` beside the passes
(`load_camera`, format in docs/gbuffers.md). Without it they are an error naming the fix, or,
with world_normals="keep", a warning and the vectors unconverted.

Checks (`FrameChecks`) warn once per stream about passes that look like a wrong convention:
normals that face away from the camera, normals that disagree with the depth map's slopes (world-space
normals read as camera-space: the ground's normal stays put while the camera turns), depth that is
NDC-like, has a background marker the convention does not know (Blender's 1e10, Unreal's 65504) or a
whole view within 10 cm (a unit mistake), zero depth, black albedo on metals.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...model_zoo import jsonfile
from ...model_zoo.errors import AlayaError
from ..gbuffer import srgb_to_linear

log = logging.getLogger(__name__)

CONVENTION_CHOICES = ("auto", "alaya", "blender", "unreal", "unity")
WORLD_NORMAL_POLICIES = ("error", "keep")
CAMERA_FILE = "camera.json"
# The way to use world-space normals unconverted, from every surface: only `gbuffers convert` (and the
# readers' world_normals argument) take it; render, run, batch and Load G-Buffers read a converted copy.
KEEP_WORLD_NORMALS = ("to use them unconverted (the model expects camera-space normals), convert the folder once with "
                      "`alaya-flash gbuffers convert FOLDER OUT --to png --world-normals keep` and render OUT "
                      "(in Python: world_normals='keep')")

# Camera axes -> OpenGL camera axes (+x right, +y up, +z towards the viewer): v_gl = A @ v_engine.
CAMERA_AXES = {
    "opengl": np.eye(3, dtype=np.float64),  # Blender cameras too: look down -Z, +Y up
    "unreal": np.array([[0, 1, 0], [0, 0, 1], [-1, 0, 0]], np.float64),  # look +X, +Y right, +Z up
    "unity": np.diag([1.0, 1.0, -1.0]),  # look +Z, +Y up, +X right
}


@dataclass(frozen=True)
class Convention:
    name: str
    normal_space: str  # "camera" or "world"
    camera_axes: str  # key of CAMERA_AXES: the engine's camera frame (for camera.json and camera-space normals)
    depth_kind: str  # "planar" (along the view axis) or "radial" (distance to the eye; needs a field of view)
    depth_scale: float  # source depth units -> metres
    background_depth: float | None  # source depth >= this is background (+inf); None: only +inf
    albedo: str  # "linear" or "srgb" (float EXR values)
    normal_encoding: str  # "signed" ([-1, 1]), "unsigned" (n * 0.5 + 0.5) or "auto" (signed if any value < 0)
    summary: str

    def describe(self) -> str:
        return f"{self.name} ({self.summary})"


CONVENTIONS = {
    "alaya": Convention("alaya", "camera", "opengl", "planar", 1.0, None, "linear", "signed",
                        "camera-space OpenGL normals, planar depth in metres"),
    "blender": Convention("blender", "world", "opengl", "planar", 1.0, 1e9, "linear", "signed",
                          "world-space Z-up normals, Depth pass in metres, 1e10 background"),
    "unreal": Convention("unreal", "world", "unreal", "planar", 0.01, 65504.0, "linear", "auto",
                         "world-space Z-up left-handed normals, SceneDepth in centimetres"),
    "unity": Convention("unity", "world", "unity", "planar", 1.0, None, "linear", "auto",
                        "world-space Y-up left-handed normals, eye depth in metres, smoothness"),
}

# Pass names as engines write them (lower case, spaces/underscores/dashes removed) -> our pass.
# "smoothness" is roughness inverted (Unity). Used for EXR layers and for file/folder names.
PASS_ALIASES = {
    "albedo": "albedo", "diffcol": "albedo", "diffusecolor": "albedo", "basecolor": "albedo",
    "denoisingalbedo": "albedo", "diffusealbedo": "albedo",
    "depth": "depth", "z": "depth", "scenedepth": "depth", "worlddepth": "depth",
    "movierenderqueueworlddepth": "depth",
    "normal": "normal", "normals": "normal", "worldnormal": "normal",
    "metallic": "metallic", "metal": "metallic", "metalness": "metallic",
    "roughness": "roughness", "smoothness": "smoothness",
    "rgb": "rgb", "combined": "rgb", "finalimage": "rgb", "beauty": "rgb", "image": "rgb",
    "shadow": "shadow", "shadowmask": "shadow", "sunvisibility": "shadow", "sky": "sky", "skyvisibility": "sky",
}
_FILE_ONLY_EXCLUDED = {"z", "image"}  # too generic to trust in a file name
_PREFERENCE = {"albedo": ("albedo", "basecolor", "diffcol", "diffusecolor", "diffusealbedo", "denoisingalbedo")}

# Names that say which engine wrote the files (checked on normalised pass names / path components).
_MARKERS = {
    "blender": ("viewlayer", "diffcol", "diffusecolor", "denoisingalbedo", "combined", "filename"),
    "unreal": ("basecolor", "scenedepth", "worldnormal", "finalimage", "movierenderqueue", "worlddepth"),
    "unity": ("smoothness", "metal"),
}


_PREFIX_MARKERS = ("viewlayer", "movierenderqueue", "filename")  # also match as the start of a name
# ("filename": Blender 5's File Output node prefixes every file with its "file_name" field, by default literally)


def norm_name(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name).lower()


def pass_of(name: str, file_name: bool = False) -> str | None:
    """Our pass for an engine's pass name ('DiffCol' -> 'albedo', 'Smoothness' -> 'smoothness'), or None."""
    key = norm_name(name)
    if key.startswith("movierenderqueue") and key != "movierenderqueueworlddepth":
        key = key[len("movierenderqueue"):]
    if file_name and key in _FILE_ONLY_EXCLUDED:
        return None
    return PASS_ALIASES.get(key)


def pass_suffix_of(token: str) -> str | None:
    """A pass name glued to a prefix and frame number, as Blender 5's File Output node writes them
    (`<file name><item name><frame>`: 'file_namealbedo0001' -> token 'namealbedo0001' -> 'albedo').
    Only names of 5 letters or more, so short words are not matched inside others."""
    key = re.sub(r"\d+$", "", norm_name(token))
    for alias in sorted((a for a in PASS_ALIASES if len(a) >= 5 and a not in _FILE_ONLY_EXCLUDED), key=len, reverse=True):
        if key.endswith(alias):
            return PASS_ALIASES[alias]
    return None


def split_channel(name: str) -> tuple[str, str]:
    """'ViewLayer.Depth.Z' -> ('Depth', 'Z'); 'albedo.R' -> ('albedo', 'R'); 'R' -> ('', 'R')."""
    parts = name.split(".")
    if len(parts) == 1:
        return "", parts[0]
    return parts[-2], parts[-1]


def group_channels(chans: dict[str, np.ndarray]) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """EXR channels -> {our pass: (engine pass name, {channel: array})}, for every layer whose name is a
    known pass. Where several layers give one pass (Blender's DiffCol and an albedo AOV), the
    preferred one wins (our own name, then base colour, then diffuse colour)."""
    found: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for full, arr in chans.items():
        layer, chan = split_channel(full)
        mod = pass_of(layer) if layer else None
        if mod:
            found.setdefault(mod, {}).setdefault(layer, {})[chan] = arr
    out = {}
    for mod, layers in found.items():
        order = _PREFERENCE.get(mod, ())
        best = sorted(layers, key=lambda n: order.index(norm_name(n)) if norm_name(n) in order else len(order))[0]
        out[mod] = (best, layers[best])
    return out


def detect_convention(names: list[str]) -> tuple[str, str]:
    """(convention, reason) from channel, file and folder names; 'alaya' when nothing says an engine."""
    words = set()
    for n in names:
        for w in re.split(r"[./\\]", n) + re.split(r"[./\\_\-\s]+", n):
            words.add(norm_name(re.sub(r"\d+$", "", w)))
    for conv, marks in _MARKERS.items():
        hit = sorted(w for w in words if any(w == m or (m in _PREFIX_MARKERS and w.startswith(m)) for m in marks))
        if hit:
            return conv, f"names {', '.join(hit[:3])}"
    return "alaya", "no engine-specific pass names"


# ---------------------------------------------------------------------------------------------
# camera.json


@dataclass
class Camera:
    """Per-frame camera-to-world rotations (3x3, column vectors) in the engine's world and camera axes."""

    rotations: list[np.ndarray]  # camera-to-world linear part per frame (one entry: static camera)
    camera_axes: str
    fov_y_deg: float | None
    source: str

    def normal_matrix(self, i: int) -> np.ndarray:
        """World normal -> OpenGL camera-space normal for source frame i."""
        if len(self.rotations) == 1:
            r = self.rotations[0]
        elif i < len(self.rotations):
            r = self.rotations[i]
        else:
            raise AlayaError(f"{self.source}: has {len(self.rotations)} camera frames, frame {i} needs one")
        return CAMERA_AXES[self.camera_axes] @ r.T  # normals transform by inv(w2c)^T = c2w^T


def _matrix(value, where: str) -> np.ndarray:
    """A 4x4 or 3x3 matrix of finite numbers whose rotation part is invertible -> that 3x3 part."""
    want = "expected a 4x4 or 3x3 matrix of numbers (rows of numbers)"
    numbers = isinstance(value, list) and all(isinstance(row, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in row) for row in value)
    if not numbers:
        raise AlayaError(f"{where}: {want}, got {_brief(value)}")
    m = np.asarray(value, dtype=np.float64) if len({len(row) for row in value}) <= 1 else np.zeros(0)
    if m.shape not in ((4, 4), (3, 3)):
        raise AlayaError(f"{where}: {want}, got {len(value)} row(s) of {sorted({len(row) for row in value})} number(s)")
    if not np.isfinite(m).all():
        raise AlayaError(f"{where}: has a value that is not a finite number (NaN or infinity)")
    if abs(np.linalg.det(m[:3, :3])) < 1e-9:
        raise AlayaError(f"{where}: the rotation part (upper-left 3x3) is singular, so it rotates nothing into view")
    return m[:3, :3]


def _brief(value) -> str:
    text = json.dumps(value) if not isinstance(value, float) or np.isfinite(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_camera(path: Path, default_axes: str) -> Camera:
    """Read camera.json: {"camera_to_world" | "world_to_camera": 4x4 or [4x4 per frame],
    "camera_axes": "opengl"|"unreal"|"unity" (default: the convention's), "fov_y_deg": optional}."""
    try:
        data = jsonfile.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise AlayaError(f"{path}: not a readable camera JSON ({err})") from None
    if not isinstance(data, dict):
        raise AlayaError(f"{path}: camera JSON must be an object (see docs/gbuffers.md, camera.json)")
    axes = data.get("camera_axes", default_axes)
    if not isinstance(axes, str) or axes not in CAMERA_AXES:  # a list or an object is no name (and unhashable)
        raise AlayaError(f"{path}: camera_axes {_brief(axes)} is not one of {', '.join(CAMERA_AXES)}")
    keys = [k for k in ("camera_to_world", "world_to_camera") if k in data]
    if len(keys) != 1:
        raise AlayaError(f"{path}: needs exactly one of camera_to_world, world_to_camera (4x4, or a list per frame)")
    value = data[keys[0]]
    per_frame = isinstance(value, list) and value and isinstance(value[0], list) and value[0] \
        and isinstance(value[0][0], list)
    mats = [_matrix(v, f"{path}: {keys[0]}[{i}]") for i, v in enumerate(value)] if per_frame \
        else [_matrix(value, f"{path}: {keys[0]}")]
    if keys[0] == "world_to_camera":
        mats = [np.linalg.inv(m) for m in mats]
    fov = data.get("fov_y_deg")
    if fov is not None and not (isinstance(fov, (int, float)) and not isinstance(fov, bool) and 0 < fov < 180):
        raise AlayaError(f"{path}: fov_y_deg must be a number in (0, 180), got {fov!r}")
    return Camera(mats, axes, fov, str(path))


# ---------------------------------------------------------------------------------------------
# Conversion to canonical passes.


def convert_depth(depth: np.ndarray, conv: Convention, camera: Camera | None, where: str,
                  depth_far: float | None = None) -> np.ndarray:
    d = depth.astype(np.float32, copy=True)
    if conv.background_depth is not None:
        d[d >= conv.background_depth] = np.inf
    if conv.depth_scale != 1.0:
        d *= np.float32(conv.depth_scale)
    if conv.depth_kind == "radial":
        if camera is None or camera.fov_y_deg is None:
            raise AlayaError(f"{where}: {conv.name} depth is radial (distance to the eye); put fov_y_deg in "
                             f"{CAMERA_FILE} beside the passes so it can be made planar")
        h, w = d.shape
        f = (h / 2) / np.tan(np.radians(camera.fov_y_deg) / 2)
        x = (np.arange(w) + 0.5 - w / 2) / f
        y = (np.arange(h) + 0.5 - h / 2) / f
        scale = 1.0 / np.sqrt(1.0 + x[None, :] ** 2 + y[:, None] ** 2)
        d = (d * scale).astype(np.float32)
    if depth_far is not None:
        d[d > depth_far] = np.inf
    return d


def decode_normal_values(n: np.ndarray, conv: Convention) -> np.ndarray:
    enc = conv.normal_encoding
    if enc == "auto":
        finite = n[np.isfinite(n)]
        enc = "signed" if finite.size == 0 or finite.min() < -0.01 else "unsigned"
    return n * 2.0 - 1.0 if enc == "unsigned" else n


def to_camera_normals(n: np.ndarray, conv: Convention, camera: Camera | None, frame: int, where: str,
                      world_normals: str) -> np.ndarray:
    """Engine normals (H, W, 3) -> canonical camera-space OpenGL unit normals; background (0,0,1)."""
    n = decode_normal_values(n.astype(np.float64), conv)
    if conv.normal_space == "world":
        if camera is not None:
            n = n @ camera.normal_matrix(frame).T
        elif world_normals == "error":
            raise AlayaError(f"{where}: {conv.name} normals are in world space and no {CAMERA_FILE} gives the camera "
                             f"rotation; write {CAMERA_FILE} beside the passes (docs/gbuffers.md, camera.json), or "
                             f"{KEEP_WORLD_NORMALS}")
    else:
        n = n @ CAMERA_AXES[conv.camera_axes].T
    norm = np.linalg.norm(n, axis=-1, keepdims=True)
    ok = np.isfinite(norm) & (norm > 1e-6)
    return np.where(ok, n / np.where(ok, norm, 1.0), np.array([0.0, 0.0, 1.0])).astype(np.float32)


def convert_albedo(albedo: np.ndarray, conv: Convention) -> np.ndarray:
    return srgb_to_linear(np.clip(albedo, 0, 1)) if conv.albedo == "srgb" else albedo.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Checks that catch a wrong convention: warned once per stream, each naming the fix.


def normal_depth_agreement(depth: np.ndarray, normal: np.ndarray) -> tuple[int, int, int]:
    """(agree, disagree, sampled): sample pixels whose camera-space normal agrees / disagrees with the
    depth map, out of the pixels sampled.

    For any surface seen by a perspective (or orthographic) camera, the image gradient of inverse
    planar depth points along -(n_x, n_y) of the surface's camera-space normal (OpenGL axes, image
    y up), whatever the field of view: the tangent plane n.X = c (c < 0 for a visible surface) gives
    1/d = (n_x u + n_y v - n_z f) / (f c) at pixel (u, v). So with n from the passes:
      agree     the normal tilts (|n_xy| > 0.2), inverse depth slopes (relative change > 0.2 per
                image height) and the slope points where the normal says (cos > 0.5);
      disagree  it slopes the other way (cos < 0), or the normal faces the camera (|n_xy| < 0.05:
                a fronto-parallel surface, whose inverse depth is nearly flat: < 0.2 per image height
                for any field of view up to 120 degrees) while inverse depth slopes by > 0.4.
    World-space normals read as camera-space disagree on most surfaces (the ground's world up seen
    by a camera looking down at it at an angle); correct camera-space normals agree, on a static
    camera or a moving one. Sampled on a grid of at most ~128x128 points, with differences over a
    baseline of 1/64 of the image (noise of float16 depth stays small); only where the five depths are
    finite, the normals of the four neighbours are within 11 degrees of the centre's and inverse depth
    is nearly linear across them (one smooth surface, no silhouette)."""
    h, w = depth.shape
    k = max(1, round(min(h, w) / 64))
    step = max(1, -(-max(h, w) // 128))
    if h < 2 * k + 1 or w < 2 * k + 1:
        return 0, 0, 0
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(np.isfinite(depth) & (depth > 0), 1.0 / depth.astype(np.float64), np.nan)
    rows, cols = slice(k, h - k, step), slice(k, w - k, step)

    def at(dy, dx, arr):
        return arr[k + dy:h - k + dy:step, k + dx:w - k + dx:step]

    c, left, right, up, down = (at(dy, dx, inv) for dy, dx in ((0, 0), (0, -k), (0, k), (-k, 0), (k, 0)))
    n = normal[rows, cols].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        smooth = np.isfinite(c + left + right + up + down)
        for dy, dx in ((0, -k), (0, k), (-k, 0), (k, 0)):
            smooth &= (at(dy, dx, normal) * n).sum(-1) > 0.98
        for a, b in ((left, right), (down, up)):  # second difference small against the first
            smooth &= np.abs(a - 2 * c + b) <= 0.25 * np.abs(b - a) + 1e-6 * np.abs(c)
        gx, gy = (right - left) / (2 * k), (up - down) / (2 * k)  # image y up: the row above is +y
        slope = np.hypot(gx, gy) / c * h  # relative slope of inverse depth per image height
        tilt = np.hypot(n[..., 0], n[..., 1])
        cos = -(gx * n[..., 0] + gy * n[..., 1]) / (np.hypot(gx, gy) * tilt)
        agree = smooth & (tilt > 0.2) & (slope > 0.2) & (cos > 0.5)
        disagree = smooth & (((tilt > 0.2) & (slope > 0.2) & (cos < 0)) | ((tilt < 0.05) & (slope > 0.4)))
    return int(agree.sum()), int(disagree.sum()), c.size


class FrameChecks:
    """Run on raw and canonical passes of each frame; each warning is logged once per stream.
    camera: the camera.json the normals were converted with (None: none, or none used)."""

    def __init__(self, source: str, conv: Convention, camera: "Camera | None" = None):
        self.source, self.conv, self.camera = source, conv, camera
        self.warned: set[str] = set()

    def warn(self, key: str, msg: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning("%s: %s", self.source, msg)

    def raw_depth(self, depth: np.ndarray, where) -> None:
        finite = depth[np.isfinite(depth)]
        if self.conv.background_depth is None and finite.size and finite.max() >= 1e9:
            self.warn("huge-depth", f"{where}: depth holds values >= 1e9 ({finite.max():.3g}), a background marker "
                                    "(Blender writes 1e10): use --conventions blender, or write +inf for background")
        if not finite.size:
            return
        lo, hi = float(finite.min()), float(finite.max())
        at_max = int((finite == hi).sum())
        marker = (hi < self.conv.background_depth) if self.conv.background_depth is not None else hi < 1e9  # (>= 1e9: above)
        if marker and hi >= 1e4 and at_max >= max(16, 0.01 * depth.size) and hi > 10 * float(np.median(finite)):
            # a plateau at one far value is a background marker this convention does not know (Unreal's sky
            # is 65504, the float16 maximum): read as depth, the sky becomes a far wall
            who = " (the float16 maximum, Unreal's background)" if hi == 65504.0 else ""
            self.warn("marker-depth", f"{where}: depth is exactly {hi:g}{who} at {at_max} pixels: a background "
                                      f"marker, not a distance, that the {self.conv.name} convention reads as depth; "
                                      "pick the engine that wrote the files with --conventions (unreal: 65504, "
                                      "blender: >= 1e9), or write +inf for background")
        if 0 <= lo and hi <= 1.0 and finite.size > 16 and (hi - lo) < 0.1 * max(hi, 1e-6):
            self.warn("ndc-depth", f"{where}: depth spans only [{lo:.4g}, {hi:.4g}]: it looks like NDC, reverse-Z or "
                                   "normalised depth; export linear view depth in scene units (docs/gbuffers.md, Engines)")
        zero = int((depth == 0).sum())
        if zero:
            self.warn("zero-depth", f"{where}: depth is 0 at {zero} pixels: 0 is not a distance; background should be "
                                    "+inf (or set --depth-range NEAR:FAR to drop far values)")

    def canonical(self, albedo, depth, metallic, normal, where) -> None:
        fg = np.isfinite(depth) & (depth > 0)
        count = int(fg.sum())
        if count >= 16 and float(np.percentile(depth[fg], 99)) < 0.1:
            # a whole view within 10 cm of the camera: a unit mistake (centimetres read as metres is the
            # reverse, caught by Unreal's 65504 background above)
            unit = (f"the {self.conv.name} convention reads depth in units of {self.conv.depth_scale:g} m"
                    if self.conv.depth_scale != 1.0 else "depth is read in metres")
            self.warn("tiny-depth", f"{where}: 99% of the depth is nearer than 10 cm "
                                    f"({float(depth[fg].min()):.3g} to {float(np.percentile(depth[fg], 99)):.3g} m): "
                                    f"{unit}; if the files hold other units, pick the engine that wrote them with "
                                    "--conventions")
        if count >= 16:
            away = int((normal[..., 2][fg] < -0.3).sum())
            if away > 0.1 * count:
                self.warn("normals-away", f"{where}: {away / count:.0%} of surface normals face away from the camera "
                                          "(z < -0.3 in camera space): they look world-space or in other axes; pick "
                                          "the engine with --conventions and give camera.json (docs/gbuffers.md)")
            self.normals_vs_depth(depth, normal, where)
        metal = fg & (metallic > 0.5)
        m = int(metal.sum())
        if m >= 16 and m >= 0.01 * depth.size:
            black = int((albedo[metal].max(-1) < 0.01).sum())
            if black > 0.9 * m:
                self.warn("black-metal", f"{where}: albedo is black on {black / m:.0%} of metallic pixels: a diffuse-colour "
                                         "pass (Blender's DiffCol) is zero on metals; export the base colour instead "
                                         "(an AOV named albedo, docs/gbuffers.md, Blender)")

    def normals_vs_depth(self, depth, normal, where) -> None:
        """Warn when most normals checked disagree with the depth map (normal_depth_agreement): at
        least 16 samples and 2% of them disagree, and more than half of those that tell."""
        if "normals-depth" in self.warned or (self.conv.normal_space == "world" and self.camera is None):
            return  # warned already, or world normals kept unconverted (warned on open)
        agree, disagree, sampled = normal_depth_agreement(depth, normal)
        if disagree >= max(16, 0.02 * sampled) and disagree > agree:
            self.warn("normals-depth", _normals_vs_depth_message(self.conv, disagree / (agree + disagree), where))


def _normals_vs_depth_message(conv: Convention, share: float, where) -> str:
    head = f"{where}: {share:.0%} of the surface normals checked disagree with the depth map's slopes"
    if conv.normal_space == "world":
        return (f"{head} after conversion to camera space with {CAMERA_FILE}: check {CAMERA_FILE} "
                "(camera_to_world, not world_to_camera; camera_axes; one matrix per frame, docs/gbuffers.md)")
    return (f"{head}: they look world-space (e.g. the ground's normal fixed while the camera turns); if the "
            f"engine wrote world-space normals, pass --conventions blender|unreal|unity and put {CAMERA_FILE} "
            "beside the passes (docs/gbuffers.md, camera.json); if depth is radial (distance to the eye), "
            "export planar depth")


def parse_depth_range(text: str) -> tuple[float | str, float | None]:
    """'auto', 'NEAR', 'NEAR:FAR' or 'auto:FAR' -> (depth_near or 'auto', depth_far or None).

    NEAR (scene units, metres) is the depth shown at full brightness in the 8-bit inverse-depth
    encoding; FAR makes every farther pixel background."""
    text = str(text).strip()
    near_s, _, far_s = text.partition(":")
    try:
        near = "auto" if near_s.strip().lower() == "auto" else float(near_s)
        far = float(far_s) if far_s.strip() else None
    except ValueError:
        raise AlayaError(f"depth range {text!r}: expected auto, NEAR, NEAR:FAR or auto:FAR (numbers in scene "
                         "units), e.g. 0.5 or auto:200") from None
    if near != "auto" and not (np.isfinite(near) and near > 0):
        raise AlayaError(f"depth range {text!r}: NEAR must be a positive number or auto")
    if far is not None and not (np.isfinite(far) and far > 0 and (near == "auto" or far > near)):
        raise AlayaError(f"depth range {text!r}: FAR must be a positive number beyond NEAR")
    return near, far


def auto_depth_near(depths: list[np.ndarray]) -> float | None:
    """A depth_near from the data: the 1st percentile of finite depth (3 significant digits)."""
    vals = [d[np.isfinite(d) & (d > 0)] for d in depths]
    vals = np.concatenate(vals) if vals else np.zeros(0)
    if not vals.size:
        return None
    near = float(np.percentile(vals, 1))
    return float(f"{near:.3g}")

