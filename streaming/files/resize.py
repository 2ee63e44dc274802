"""Resizing G-buffers to a model size, in teacher form or in canonical form.

Two modes, chosen by one flag:
  "stretch"  the teacher's way: the whole image, PIL LANCZOS, no crop; aspect ratio not kept
             (720p 16:9 -> 832x480 as the teacher does).
  "crop"     aspect-preserving: the largest centred box with the target's aspect ratio (whole
             pixels), cut out, then LANCZOS to the target size.

Teacher form (uint8 (5, H, W, 3)): every pass is LANCZOSed as an 8-bit RGB image, exactly as the
teacher's data loader does, so 8-bit sources see what the teacher saw.

Canonical form (float passes) keeps each pass meaningful:
  albedo, metallic, roughness  LANCZOS on float32, clipped back to [0, 1]
  normal                       LANCZOS per axis, then renormalised to unit length
                               (background and degenerate pixels become (0, 0, 1))
  depth                        NEAREST: LANCZOS would ring across silhouettes and blend
                               foreground with background into depths that exist nowhere
                               ("flying pixels"), and +inf cannot be filtered; nearest keeps every
                               value a real surface depth (at the cost of some aliasing).
  extras                       uint8 images (e.g. "rgb") LANCZOS; other arrays NEAREST.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import GBufferFrame

RESIZE_MODES = ("stretch", "crop")


def crop_box(src_hw: tuple[int, int], dst_hw: tuple[int, int], mode: str) -> tuple[int, int, int, int]:
    """Source region (left, top, right, bottom), whole pixels, that is scaled to the target.

    "crop" takes the largest centred box with the target's aspect ratio (rounded to whole pixels,
    so the filter never reads pixels outside it); "stretch" takes the whole image.
    """
    if mode not in RESIZE_MODES:
        raise AlayaError(f"resize mode {mode!r} is not one of {', '.join(RESIZE_MODES)}")
    (sh, sw), (dh, dw) = src_hw, dst_hw
    if mode == "stretch":
        return (0, 0, sw, sh)
    scale = min(sw / dw, sh / dh)  # source pixels per target pixel in the kept box
    cw, ch = min(sw, max(1, round(dw * scale))), min(sh, max(1, round(dh * scale)))
    left, top = (sw - cw) // 2, (sh - ch) // 2
    return (left, top, left + cw, top + ch)


def _resize_plane(arr: np.ndarray, dst_hw, box, resample) -> np.ndarray:
    """(H, W) uint8/float32/int or (H, W, 3) -> the box of it resized to dst_hw, same dtype."""
    from PIL import Image

    dh, dw = dst_hw
    left, top, right, bottom = box
    arr = arr[top:bottom, left:right]  # hard crop first: PIL's box= would filter across its edges
    if arr.dtype == np.uint8:
        return np.asarray(Image.fromarray(np.ascontiguousarray(arr)).resize((dw, dh), resample))
    if arr.ndim == 3:
        full = (0, 0, arr.shape[1], arr.shape[0])
        return np.stack([_resize_plane(arr[..., c], dst_hw, full, resample) for c in range(arr.shape[2])], -1)
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.int32)  # PIL "I" mode; only used with NEAREST
        return np.asarray(Image.fromarray(arr, mode="I").resize((dw, dh), resample))
    return np.asarray(Image.fromarray(np.ascontiguousarray(arr, dtype=np.float32), mode="F").resize((dw, dh), resample))


def resize_teacher(images: np.ndarray, size: tuple[int, int], mode: str = "stretch") -> np.ndarray:
    """Teacher form uint8 (5, H, W, 3) -> (5, h, w, 3) with PIL LANCZOS per pass; size is (h, w)."""
    from PIL import Image

    if images.shape[1:3] == tuple(size):
        return images
    box = crop_box(images.shape[1:3], size, mode)
    return np.stack([_resize_plane(img, size, box, Image.LANCZOS) for img in images])


def resize_rgb(image: np.ndarray, size: tuple[int, int], mode: str = "stretch") -> np.ndarray:
    """uint8 (H, W, 3) or (H, W) (a light pass) -> (h, w[, 3]), LANCZOS (same geometry as the G-buffer passes)."""
    from PIL import Image

    if image.shape[:2] == tuple(size):
        return image
    return _resize_plane(image, size, crop_box(image.shape[:2], size, mode), Image.LANCZOS)


def resize_frame(frame: GBufferFrame, size: tuple[int, int], mode: str = "stretch") -> GBufferFrame:
    """Canonical frame -> same frame at size (h, w), each pass resampled as the module docstring says."""
    from PIL import Image

    if frame.size == tuple(size):
        return frame
    box = crop_box(frame.size, size, mode)
    lanczos = lambda a: _resize_plane(a.astype(np.float32), size, box, Image.LANCZOS)  # noqa: E731
    normal = lanczos(frame.normal)
    norm = np.linalg.norm(normal, axis=-1, keepdims=True)
    normal = np.where(norm > 1e-3, normal / np.maximum(norm, 1e-3), np.float32([0, 0, 1])).astype(np.float32)
    extras = {}
    for name, arr in frame.extras.items():
        resample = Image.LANCZOS if arr.dtype == np.uint8 else Image.NEAREST
        extras[name] = _resize_plane(arr, size, box, resample)
    return dataclasses.replace(
        frame,
        albedo=np.clip(lanczos(frame.albedo), 0, 1),
        depth=_resize_plane(frame.depth, size, box, Image.NEAREST),
        metallic=np.clip(lanczos(frame.metallic), 0, 1),
        normal=normal,
        roughness=np.clip(lanczos(frame.roughness), 0, 1),
        extras=extras,
    )
