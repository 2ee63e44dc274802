"""The canonical G-buffer frame and its conversions to and from the teacher's 8-bit form.

Every runtime (nodes, CLI, runner, live preview, physics world) passes G-buffers around as
`GBufferFrame` objects (one frame, float passes in physical units) or as teacher-form uint8
arrays (T, 5, H, W, 3) once they are ready for a model. docs/gbuffers.md is the prose version
of the conventions below; keep the two in step.

Canonical passes (numpy, H x W, float32, C-contiguous):
  albedo    (H, W, 3) linear RGB reflectance in [0, 1]
  depth     (H, W)    linear view-space depth (distance along the camera's -z axis), scene
                      units (metres), > 0; +inf marks background (sky, nothing hit)
  metallic  (H, W)    [0, 1]
  normal    (H, W, 3) unit vectors in camera space, OpenGL convention: +x right, +y up,
                      +z towards the viewer (a surface facing the camera is (0, 0, 1));
                      right-handed. Background pixels hold (0, 0, 1).
  roughness (H, W)    perceptual roughness in [0, 1] (GGX alpha = roughness ** 2)

Teacher form (what the models read): five 3-channel 8-bit images per frame, in MODALITIES
order, mapped to [-1, 1] by v * 2 / 255 - 1 at the model boundary:
  albedo    sRGB-encoded (IEC 61966-2-1) 8-bit RGB
  depth     inverse depth, brighter = closer: round(255 * clip(depth_near / depth, 0, 1)),
            replicated to 3 channels; 0 (black) is background or beyond 255 * depth_near
  metallic  round(255 * m), replicated to 3 channels
  normal    round(255 * (n * 0.5 + 0.5)) per axis, XYZ in RGB
  roughness round(255 * r), replicated to 3 channels
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..model_zoo.errors import AlayaError

MODALITIES = ("albedo", "depth", "metallic", "normal", "roughness")
"""The one modality order used everywhere: teacher latents, npy windows, encoder branches."""

PASS_CHANNELS = {"albedo": 3, "depth": 1, "metallic": 1, "normal": 3, "roughness": 1}

LIGHT_PASSES = ("shadow", "sky")
"""Optional one-channel passes an engine may add, uint8 255 = seen: "shadow" the sun's visibility (its
shadow maps'), "sky" the share of the sky a pixel's surface sees (its sky occlusion; docs/gbuffers.md)."""

LIGHT_PASS_WORLD_KEYS = {"shadow": "sun_visibility", "sky": "sky_visibility"}
"""The extras key of a world's float visibility (1 = seen) that each light pass is made from."""

LIGHT_PASS_MEANING = {"shadow": "the sun's visibility", "sky": "the share of the sky seen"}
"""What each light pass measures, 0 to 1, for error lines."""

DEFAULT_DEPTH_NEAR = 0.5
"""Scene units mapped to full brightness in the 8-bit inverse-depth encoding."""


@dataclass(frozen=True)
class StreamInfo:
    """Per-stream metadata. num_frames is None for unbounded or not-yet-known streams."""

    width: int
    height: int
    fps: float = 16.0
    num_frames: int | None = None
    depth_near: float = DEFAULT_DEPTH_NEAR
    albedo_space: str = "linear"  # in canonical frames always linear; records the source's
    normal_space: str = "camera-opengl"
    layout: str = "memory"  # which reader produced the stream (teacher-mp4, image-sequence, npy-windows, ...)
    source: str = ""  # path or description, used in error messages

    def replace(self, **changes) -> "StreamInfo":
        return dataclasses.replace(self, **changes)

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        return (self.height, self.width)


@dataclass
class GBufferFrame:
    """One G-buffer frame in canonical form (see module docstring for units and ranges).

    extras holds optional aligned passes keyed by name, e.g. "object_id" (H, W) int32,
    "sun_visibility" (H, W) float32, "rgb" (H, W, 3) uint8 ground truth.
    """

    index: int
    timestamp: float
    albedo: np.ndarray
    depth: np.ndarray
    metallic: np.ndarray
    normal: np.ndarray
    roughness: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def size(self) -> tuple[int, int]:
        """(height, width)."""
        return self.depth.shape[:2]

    def passes(self) -> dict[str, np.ndarray]:
        return {m: getattr(self, m) for m in MODALITIES}

    def validate(self, where: str = "frame") -> "GBufferFrame":
        """Check shapes and dtypes; raise AlayaError naming `where`, the frame and the pass."""
        h, w = self.depth.shape[:2] if self.depth.ndim >= 2 else (None, None)
        for name in MODALITIES:
            arr = getattr(self, name)
            c = PASS_CHANNELS[name]
            want = (h, w, c) if c > 1 else (h, w)
            if not isinstance(arr, np.ndarray) or arr.shape != want:
                got = getattr(arr, "shape", type(arr).__name__)
                raise AlayaError(f"{where}: frame {self.index}: {name} has shape {got}, expected {want}")
            if arr.dtype != np.float32:
                raise AlayaError(f"{where}: frame {self.index}: {name} has dtype {arr.dtype}, expected float32")
        return self


# ---------------------------------------------------------------------------------------------
# sRGB transfer functions (IEC 61966-2-1), float in [0, 1].


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


def linear_to_srgb(x: np.ndarray) -> np.ndarray:
    x = np.clip(np.asarray(x, dtype=np.float32), 0.0, 1.0)
    return np.where(x <= 0.0031308, x * 12.92, 1.055 * np.power(x, 1 / 2.4) - 0.055).astype(np.float32)


def _to_u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8)


def _gray3(x: np.ndarray) -> np.ndarray:
    return np.repeat(x[..., None], 3, axis=-1)


# ---------------------------------------------------------------------------------------------
# Canonical <-> teacher form.


def encode_depth(depth: np.ndarray, depth_near: float = DEFAULT_DEPTH_NEAR) -> np.ndarray:
    """Linear depth (H, W) -> 8-bit inverse depth (H, W) uint8; +inf -> 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(depth > 0, depth_near / depth, 1.0)
    return _to_u8(np.clip(np.nan_to_num(inv, nan=0.0), 0.0, 1.0))


def decode_depth(encoded: np.ndarray, depth_near: float = DEFAULT_DEPTH_NEAR) -> np.ndarray:
    """8-bit inverse depth (H, W) uint8 -> linear depth (H, W) float32; 0 -> +inf."""
    v = encoded.astype(np.float32) / 255.0
    with np.errstate(divide="ignore"):
        return np.where(v > 0, depth_near / v, np.inf).astype(np.float32)


def encode_normal(normal: np.ndarray) -> np.ndarray:
    return _to_u8(np.clip(normal, -1.0, 1.0) * 0.5 + 0.5)


def decode_normal(encoded: np.ndarray) -> np.ndarray:
    n = encoded.astype(np.float32) / 255.0 * 2.0 - 1.0
    norm = np.linalg.norm(n, axis=-1, keepdims=True)
    return np.where(norm > 1e-6, n / np.maximum(norm, 1e-6), np.float32([0, 0, 1])).astype(np.float32)


def frame_to_teacher(frame: GBufferFrame, depth_near: float = DEFAULT_DEPTH_NEAR) -> np.ndarray:
    """Canonical frame -> teacher form (5, H, W, 3) uint8 in MODALITIES order."""
    return np.stack(
        [
            _to_u8(linear_to_srgb(frame.albedo)),
            _gray3(encode_depth(frame.depth, depth_near)),
            _gray3(_to_u8(np.clip(frame.metallic, 0, 1))),
            encode_normal(frame.normal),
            _gray3(_to_u8(np.clip(frame.roughness, 0, 1))),
        ]
    )


def teacher_to_frame(
    images: np.ndarray, index: int = 0, timestamp: float = 0.0, depth_near: float = DEFAULT_DEPTH_NEAR
) -> GBufferFrame:
    """Teacher form (5, H, W, 3) uint8 -> canonical frame. Single-channel passes read channel 0."""
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[0] != 5 or images.shape[-1] != 3:
        raise AlayaError(
            f"teacher-form frame {index}: expected uint8 (5, H, W, 3), got {images.dtype} {tuple(images.shape)}"
        )
    albedo, depth, metallic, normal, roughness = images
    return GBufferFrame(
        index=index,
        timestamp=timestamp,
        albedo=srgb_to_linear(albedo.astype(np.float32) / 255.0),
        depth=decode_depth(depth[..., 0], depth_near),
        metallic=metallic[..., 0].astype(np.float32) / 255.0,
        normal=decode_normal(normal),
        roughness=roughness[..., 0].astype(np.float32) / 255.0,
    )


def teacher_to_model(images: np.ndarray):
    """Teacher form uint8 (..., 5, H, W, 3) -> torch float32 in [-1, 1], same layout (v * 2/255 - 1)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(images)).float().mul_(2.0 / 255.0).sub_(1.0)
