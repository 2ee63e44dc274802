"""Single-image files: PNG 8/16-bit and EXR float, read and written with one-line errors.

PNG 8-bit and 16-bit grayscale go through Pillow; 16-bit RGB PNG goes through PyAV's PNG codec
(Pillow has no 16-bit-per-channel RGB mode and would silently truncate to 8 bits). EXR goes
through the OpenEXR package (float32 or half channels, any compression it supports).

Arrays: PNG -> uint8 or uint16 (H, W) or (H, W, 3); EXR -> dict channel name -> float32 (H, W).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ...model_zoo.errors import AlayaError

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOR_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> channel count (3 = palette)


def png_header(path: Path) -> tuple[int, int, int, int]:
    """(width, height, bit_depth, channels) from a PNG's IHDR chunk, without decoding pixels."""
    try:
        with open(path, "rb") as f:
            head = f.read(33)
    except OSError as err:
        raise AlayaError(f"{path}: cannot read ({err.strerror})") from None
    if len(head) < 33 or head[:8] != _PNG_SIGNATURE or head[12:16] != b"IHDR":
        raise AlayaError(f"{path}: not a PNG file (bad signature or header)")
    width, height, bit_depth, color_type = struct.unpack(">IIBB", head[16:26])
    if color_type not in _PNG_COLOR_CHANNELS:
        raise AlayaError(f"{path}: corrupt PNG header (colour type {color_type})")
    return width, height, bit_depth, _PNG_COLOR_CHANNELS[color_type]


def read_png(path: Path) -> np.ndarray:
    """PNG -> uint8 or uint16 array, (H, W) for grayscale or (H, W, 3) for RGB.

    Palette images are expanded to RGB. Alpha channels are refused (a G-buffer pass has none),
    so a wrong export is reported instead of silently reinterpreted.
    """
    width, height, bit_depth, channels = png_header(path)
    if channels in (2, 4):
        raise AlayaError(
            f"{path}: PNG has {channels} channels (with alpha); G-buffer passes need 1 (gray) or 3 (RGB)"
        )
    try:
        if bit_depth == 16:
            arr = _decode_png16(path)
        else:
            from PIL import Image

            with Image.open(path) as im:
                if im.mode == "P":
                    im = im.convert("RGB")
                elif im.mode == "1":
                    im = im.convert("L")
                arr = np.asarray(im)
    except AlayaError:
        raise
    except Exception as err:  # Pillow and PyAV raise many types for damaged data
        raise AlayaError(f"{path}: corrupt or truncated PNG ({type(err).__name__}: {err})") from None
    if arr.shape[:2] != (height, width):
        raise AlayaError(f"{path}: corrupt PNG (decoded {arr.shape[1]}x{arr.shape[0]}, header says {width}x{height})")
    return arr


def _decode_png16(path: Path) -> np.ndarray:
    import av

    codec = av.CodecContext.create("png", "r")
    frames = codec.decode(av.Packet(Path(path).read_bytes()))
    if not frames:
        raise AlayaError(f"{path}: corrupt or truncated PNG (no image decoded)")
    frame = frames[0]
    if frame.format.name.startswith("gray"):
        return frame.to_ndarray(format="gray16le")
    return frame.to_ndarray(format="rgb48le")


def write_png(path: Path, arr: np.ndarray) -> None:
    """uint8 or uint16 (H, W) or (H, W, 3) -> PNG at path (the caller makes it atomic)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype == np.uint8:
        from PIL import Image

        Image.fromarray(arr).save(path, format="PNG", compress_level=1)
        return
    if arr.dtype != np.uint16:
        raise AlayaError(f"{path}: cannot write {arr.dtype} as PNG (uint8 or uint16 only)")
    import av

    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height = arr.shape[1], arr.shape[0]
    gray = arr.ndim == 2
    codec.pix_fmt = "gray16be" if gray else "rgb48be"
    frame = av.VideoFrame.from_ndarray(arr, format="gray16le" if gray else "rgb48le")
    packets = codec.encode(frame) + codec.encode(None)
    with open(path, "wb") as f:
        for p in packets:
            f.write(bytes(p))


_BEAUTY_PARTS = ("", "rgba", "rgb", "beauty", "combined")


def read_exr(path: Path) -> dict[str, np.ndarray]:
    """EXR -> {channel name: float32 (H, W)}, every part of a multi-part file merged.

    Multi-part files (Blender 5's multilayer EXR, Unreal's multi-part option) hold one part per
    pass. Channels that already carry a layer prefix (`ViewLayer.Depth.Z`) keep their names; a
    bare channel (`Z`) in a named part gets the part's name as prefix (`Depth.Z`), except in a
    beauty part (unnamed, `rgba`, `beauty`, `combined`), so names never collide between parts.
    All parts must have the same size.
    """
    import OpenEXR

    try:
        with OpenEXR.File(str(path), separate_channels=True) as f:
            parts = [(p.name() or "", {n: c.pixels for n, c in p.channels.items()}) for p in f.parts]
    except Exception as err:
        raise AlayaError(f"{path}: corrupt or truncated EXR ({type(err).__name__}: {err})") from None
    for k, (part, chans) in enumerate(parts):  # a damaged chunk leaves a part without pixels
        if not chans or any(px is None for px in chans.values()):
            raise AlayaError(f"{path}: corrupt or truncated EXR (no pixel data in part {k}"
                             f"{' ' + repr(part) if part else ''})")
    parts = [(part, {n: np.asarray(px) for n, px in chans.items()}) for part, chans in parts]
    out: dict[str, np.ndarray] = {}
    shape = None
    for k, (part, chans) in enumerate(parts):
        for name, px in chans.items():
            if px.ndim != 2 or px.dtype.kind not in "fu":
                raise AlayaError(f"{path}: EXR channel {name!r} has {px.dtype} {px.shape}, expected a float image")
            if len(parts) > 1 and "." not in name and part.lower() not in _BEAUTY_PARTS:
                name = f"{part}.{name}"
            if name in out:
                raise AlayaError(f"{path}: EXR channel {name!r} appears in more than one part")
            if shape is None:
                shape = px.shape
            elif px.shape != shape:
                raise AlayaError(f"{path}: EXR part {k} ({part or 'unnamed'}) is {px.shape[1]}x{px.shape[0]}, "
                                 f"part 0 is {shape[1]}x{shape[0]}; every pass must have the same size")
            out[name] = px.astype(np.float32, copy=False)
    if not out:
        raise AlayaError(f"{path}: corrupt or truncated EXR (no parts or channels read)")
    return out


def exr_software(path: Path) -> str | None:
    """Which program wrote an EXR, from its header: the `Software` attribute (Blender 5: 'Blender
    5.0.1'), or 'Blender' for Blender 4's multilayer marker `BlenderMultiChannel`; None if unsaid."""
    import OpenEXR

    try:
        with OpenEXR.File(str(path), header_only=True) as f:  # read inside: the header empties on close
            software, blender4 = f.header().get("Software"), "BlenderMultiChannel" in f.header()
    except Exception:  # a damaged file is reported by read_exr
        return None
    if isinstance(software, str) and software.strip():
        return software.strip()
    return "Blender" if blender4 else None


def write_exr_parts(path: Path, parts: dict[str, dict[str, np.ndarray]]) -> None:
    """{part name: {channel name: (H, W) array}} -> a multi-part float32 EXR (ZIP), as Blender 5 and
    Unreal's multi-part option write them (used by tests and fixtures)."""
    import OpenEXR

    out = []
    for part, chans in parts.items():
        header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage, "name": part}
        out.append(OpenEXR.Part(header, {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in chans.items()}))
    OpenEXR.File(out).write(str(path))


def write_exr(path: Path, channels: dict[str, np.ndarray]) -> None:
    """{channel name: (H, W) array} -> float32 EXR, ZIP compressed (lossless)."""
    import OpenEXR

    header = {"compression": OpenEXR.ZIP_COMPRESSION, "type": OpenEXR.scanlineimage}
    data = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in channels.items()}
    OpenEXR.File(header, data).write(str(path))


def replace_into(tmp: Path, final: Path) -> None:
    """os.replace with a clear error."""
    try:
        os.replace(tmp, final)
    except OSError as err:
        raise AlayaError(f"{final}: cannot move finished file into place ({err.strerror})") from None
