"""The live server's binary messages: G-buffer frames an engine sends, frames the server sends back.

Shared by the server (server.py, ingest.py, engine.py) and the engine's client
(`alaya_flash.client`), so both sides pack and check the same bytes; stdlib + numpy only (the
client imports it without torch). docs/live.md, "Engine ingest", is the prose version.

Engine -> server (`/engine`), one binary WebSocket message per G-buffer frame: a 32-byte header,
little-endian, then the passes.

    offset size type    field
    0      4    bytes   magic b"AFGB"
    4      1    uint8   version, 1
    5      1    uint8   form: 1 = uint8 teacher form, 2 = float32 canonical passes
    6      2    uint16  flags: bit 0 (FLAG_SHADOW) = a shadow plane follows the passes, bit 1 (FLAG_SKY)
                        = a sky plane (after the shadow plane when both); other bits 0
    8      2    uint16  width  } multiples of 16 in 16..MAX_SIDE, width * height <= MAX_PIXELS
    10     2    uint16  height }
    12     4    float32 depth_near: form 2's inverse-depth scale (scene units shown at full
                        brightness; 0 = the default 0.5); 0 for form 1, whose depth is encoded
    16     8    uint64  frame number, < 2**53 (exact in any JSON reader); echoed with its frame
    24     8    float64 send time, seconds on any clock of the engine's, finite; echoed untouched
    32     ...          the passes, exactly FORM_BYTES_PER_PIXEL[form] * width * height bytes:
      form 1: uint8 (5, H, W, 3), MODALITIES order, teacher form (streaming/gbuffer.py)
      form 2: float32 little-endian planes in MODALITIES order, canonical units
              (streaming/gbuffer.py): albedo (H, W, 3) linear RGB in [0, 1], depth (H, W)
              view depth in scene units > 0 (+inf: background), metallic (H, W) in [0, 1],
              normal (H, W, 3) camera space, OpenGL axes, roughness (H, W) in [0, 1]; no NaN,
              no depth below 0 (-inf included), no other pass infinite
    ...    W*H          with FLAG_SHADOW: the shadow pass, uint8 (H, W), the sun's visibility (255 where
                        the sun reaches, 0 in its shadow; the engine's shadow map), either form
    ...    W*H          with FLAG_SKY: the sky pass, uint8 (H, W), the share of the sky each pixel's
                        surface sees (255 all of it; the engine's sky occlusion), either form; a
                        session sends each light plane with every frame or never (ingest.py)

Server -> client, binary: a frame message, the same for page viewers and engines: a 4-byte
big-endian header length, a JSON header, then the pixels. Viewers get a JPEG; engines get raw
uint8 (H, W, 3) RGB rows (header "format": "raw", "width", "height") with "frame" and "sent"
echoed and the server's "timings".
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from ..gbuffer import LIGHT_PASS_MEANING, LIGHT_PASSES
from .protocol import ProtocolError

class FrameError(ProtocolError):
    """A refused engine frame; `frame` is its number once the header could be read (else None)."""

    def __init__(self, message: str, frame: int | None = None):
        super().__init__(message)
        self.frame = frame


MAGIC = b"AFGB"
VERSION = 1
HEADER = struct.Struct("<4sBBHHHfQd")
HEADER_BYTES = HEADER.size  # 32
FORM_UINT8, FORM_FLOAT32 = 1, 2
FORMS = {FORM_UINT8: "uint8 teacher form", FORM_FLOAT32: "float32 canonical passes"}
FORM_BYTES_PER_PIXEL = {FORM_UINT8: 5 * 3, FORM_FLOAT32: 9 * 4}
FLAG_SHADOW, FLAG_SKY = 1, 2  # header flags: a shadow plane, a sky plane, uint8 (H, W) each, follow the passes
LIGHT_FLAGS = {"shadow": FLAG_SHADOW, "sky": FLAG_SKY}  # the planes follow in LIGHT_PASSES order
FLAG_RULE = "bit 0 = a shadow plane follows the passes, bit 1 = a sky plane"
MAX_SIDE = 2048  # the live server's size limit (page_session.LiveConfig)
MAX_PIXELS = 1024 * 1024
"""Largest frame an engine may send (1024x1024, or 2048x512): bounds one message to 38 MiB (float
form and both light planes) and a session's queued frames to MAX_INFLIGHT of them."""
MAX_FRAME_NUMBER = 2 ** 53
MAX_MESSAGE_BYTES = HEADER_BYTES + (FORM_BYTES_PER_PIXEL[FORM_FLOAT32] + len(LIGHT_PASSES)) * MAX_PIXELS
"""The engine socket's receive limit: a larger message closes it (1009) before it is read."""
FLOAT_PASSES = (("albedo", 3), ("depth", 1), ("metallic", 1), ("normal", 3), ("roughness", 1))  # MODALITIES order


@dataclass(frozen=True)
class GBufferMessage:
    """One checked engine frame: header fields, the raw pass bytes (not yet converted) and its light planes'
    bytes by name (LIGHT_PASSES order; the ones the frame has)."""

    number: int
    sent: float
    width: int
    height: int
    form: int
    depth_near: float
    payload: memoryview
    light: dict = field(default_factory=dict)

    def light_u8(self) -> dict[str, np.ndarray]:
        """The light planes by name, uint8 (H, W), 255 = seen (read-only views)."""
        return {name: np.frombuffer(plane, np.uint8).reshape(self.height, self.width)
                for name, plane in self.light.items()}

    def teacher_u8(self) -> np.ndarray:
        """Form 1's payload as uint8 (5, H, W, 3) (a read-only view of the message)."""
        return np.frombuffer(self.payload, np.uint8).reshape(5, self.height, self.width, 3)

    def float_passes(self) -> dict[str, np.ndarray]:
        """Form 2's payload as canonical float32 passes, name -> (H, W) or (H, W, 3)."""
        flat = np.frombuffer(self.payload, "<f4")
        out, at, hw = {}, 0, self.height * self.width
        for name, c in FLOAT_PASSES:
            arr = flat[at:at + hw * c].astype(np.float32)
            out[name] = arr.reshape(self.height, self.width, c) if c > 1 else arr.reshape(self.height, self.width)
            at += hw * c
        return out


def float_pass_problem(number: int, passes) -> str | None:
    """What is wrong with form 2's values, or None: NaN anywhere; depth below 0 (-inf included; +inf
    is background), any other pass infinite. Names the pass, the count and the first pixel."""
    for name, _ in FLOAT_PASSES:
        arr = np.asarray(passes[name])
        bad = np.isnan(arr) | (arr < 0) if name == "depth" else ~np.isfinite(arr)
        if bad.ndim == 3:
            bad = bad.any(-1)
        if bad.any():
            y, x = (int(v) for v in np.argwhere(bad)[0])
            value = arr[y, x] if arr.ndim == 2 else arr[y, x].tolist()
            rule = ("depth is a distance along the view axis, >= 0 (+inf: background)" if name == "depth"
                    else "NaN or infinite")
            return (f"frame {number}: {name} has {int(bad.sum())} bad pixel(s), first at (x={x}, y={y}), "
                    f"value {value}: {rule}")
    return None


def check_size(width: int, height: int, where: str = "frame") -> None:
    for name, v in (("width", width), ("height", height)):
        if v % 16 or not 16 <= v <= MAX_SIDE:
            raise ProtocolError(f"{where}: {name} {v} must be a multiple of 16 in 16..{MAX_SIDE}")
    if width * height > MAX_PIXELS:
        raise ProtocolError(f"{where}: {width}x{height} is {width * height} pixels, over the limit of {MAX_PIXELS}")


def unpack_gbuffers(message: bytes) -> GBufferMessage:
    """Check one engine frame message; raises ProtocolError with one line naming the field (and the
    frame number once the header is readable), nothing else, whatever the bytes."""
    if not isinstance(message, (bytes, bytearray, memoryview)):
        raise ProtocolError("G-buffer frames are binary messages (docs/live.md, Engine ingest)")
    data = memoryview(message).cast("B")
    if len(data) < HEADER_BYTES:
        raise ProtocolError(f"frame message of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, form, flags, width, height, near, number, sent = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"frame header: magic {magic!r} is not {MAGIC!r} (not an alaya-flash G-buffer frame)")
    if version != VERSION:
        raise ProtocolError(f"frame header: version {version} is not supported; this server speaks version {VERSION}")
    if number >= MAX_FRAME_NUMBER:
        raise ProtocolError(f"frame header: frame number {number} is not below 2**53")
    where = f"frame {number}"
    try:
        _check_fields(where, form, flags, width, height, near, sent, len(data) - HEADER_BYTES)
    except ProtocolError as err:
        raise FrameError(str(err), number) from None
    passes = at = HEADER_BYTES + FORM_BYTES_PER_PIXEL[form] * width * height
    light = {}
    for name in _flagged(flags):
        light[name], at = data[at:at + width * height], at + width * height
    return GBufferMessage(number, sent, width, height, form, near, data[HEADER_BYTES:passes], light)


def _flagged(flags: int) -> list[str]:
    """The light planes the header flags say follow the passes, in LIGHT_PASSES order."""
    return [name for name in LIGHT_PASSES if flags & LIGHT_FLAGS[name]]


def _check_fields(where: str, form: int, flags: int, width: int, height: int, near: float, sent: float,
                  got: int) -> None:
    if form not in FORMS:
        raise ProtocolError(f"{where}: form {form} is unknown; 1 = {FORMS[1]}, 2 = {FORMS[2]}")
    if flags & ~sum(LIGHT_FLAGS.values()):
        raise ProtocolError(f"{where}: header flags (bytes 6..7) {flags:#06x} set unknown bits; {FLAG_RULE}, the "
                            "others must be 0")
    check_size(width, height, where)
    if not math.isfinite(sent):
        raise ProtocolError(f"{where}: send time {sent!r} is not a finite number")
    if form == FORM_UINT8 and near != 0.0:
        raise ProtocolError(f"{where}: depth_near must be 0 for the uint8 form (its depth is encoded already), got {near:g}")
    if form == FORM_FLOAT32 and not (math.isfinite(near) and 0.0 <= near <= 1e6):
        raise ProtocolError(f"{where}: depth_near {near!r} must be 0 (default) or a positive scene distance up to 1e6")
    passes, plane = FORM_BYTES_PER_PIXEL[form] * width * height, width * height
    named = _flagged(flags)
    what = " and ".join(f"a {n} plane" for n in named)
    want = passes + plane * len(named)
    held = (got - passes) // plane if got >= passes and (got - passes) % plane == 0 else None
    if held is not None and held < len(named):
        raise ProtocolError(f"{where}: header flags say {what} follow{'s' * (len(named) == 1)}, but the payload holds "
                            + ("only the passes" if held == 0 else f"the passes and {held} plane")
                            + f" ({got} bytes for {width}x{height} {FORMS[form]}); "
                            + (f"the plane is {plane} more bytes" if len(named) == 1 else f"a plane is {plane} bytes"))
    if held is not None and len(named) < held <= len(LIGHT_PASSES):
        unnamed = [f"a {n} plane" for n in LIGHT_PASSES if n not in named]
        raise ProtocolError(f"{where}: payload of {got} bytes is the passes{' and ' + what if named else ''} and "
                            f"{got - want} bytes more ({' or '.join(unnamed)}?): set the header flags' bits ({FLAG_RULE})")
    if got != want:
        raise ProtocolError(f"{where}: payload of {got} bytes, expected {want} for {width}x{height} {FORMS[form]}"
                            + "".join(f" and a {width}x{height} uint8 {n} plane" for n in named))


def pack_gbuffers(number: int, sent: float, gbuffers, depth_near: float = 0.0, shadow=None, sky=None) -> bytes:
    """An engine frame message. gbuffers: uint8 (5, H, W, 3) teacher form, or float passes (a
    mapping or an object with albedo, depth, metallic, normal, roughness, e.g. GBufferFrame).
    shadow, sky: the frame's light passes, uint8 (H, W) (255 = seen: where the sun reaches, the whole
    sky) or float (H, W) in [0, 1] (rounded to 8 bits), or None. Raises ValueError naming the problem."""
    light = {name: plane for name, plane in (("shadow", shadow), ("sky", sky)) if plane is not None}
    if isinstance(gbuffers, np.ndarray):
        if gbuffers.dtype != np.uint8 or gbuffers.ndim != 4 or gbuffers.shape[0] != 5 or gbuffers.shape[-1] != 3:
            raise ValueError(f"frame {number}: teacher form must be uint8 (5, H, W, 3), got {gbuffers.dtype} "
                             f"{gbuffers.shape}; float passes go as a mapping of albedo, depth, ...")
        form, (height, width), near = FORM_UINT8, gbuffers.shape[1:3], 0.0
        if depth_near:
            raise ValueError(f"frame {number}: depth_near applies to float passes only (teacher depth is encoded)")
        body = [np.ascontiguousarray(gbuffers)]
    else:
        get = gbuffers.__getitem__ if hasattr(gbuffers, "keys") else (lambda k: getattr(gbuffers, k))
        body, form, near = [], FORM_FLOAT32, float(depth_near)
        height = width = None
        for name, c in FLOAT_PASSES:
            try:
                arr = np.asarray(get(name), dtype="<f4")
            except (KeyError, AttributeError):
                raise ValueError(f"frame {number}: float passes need {name!r}") from None
            if height is None:
                height, width = arr.shape[:2] if arr.ndim >= 2 else (None, None)
            want = (height, width, c) if c > 1 else (height, width)
            if arr.shape != want and not (c == 1 and arr.shape == (height, width, 1)):
                raise ValueError(f"frame {number}: {name} has shape {arr.shape}, expected {want}")
            body.append(np.ascontiguousarray(arr))
        problem = float_pass_problem(number, dict(zip((n for n, _ in FLOAT_PASSES), body)))
        if problem:
            raise ValueError(problem)
    if not 0 <= number < MAX_FRAME_NUMBER:
        raise ValueError(f"frame number {number} must be in 0..2**53-1")
    try:
        check_size(int(width), int(height), f"frame {number}")
    except ProtocolError as err:
        raise ValueError(str(err)) from None
    for name in LIGHT_PASSES:
        if name in light:
            body.append(light_plane(number, name, light[name], (int(height), int(width))))
    head = HEADER.pack(MAGIC, VERSION, form, sum(LIGHT_FLAGS[n] for n in light), width, height, near, number,
                       float(sent))
    return b"".join([head] + [a.tobytes() for a in body])


def light_plane(number: int, name: str, plane, size: tuple[int, int]) -> np.ndarray:
    """A frame's light pass `name` as the wire carries it, uint8 (H, W): uint8 as is, float in [0, 1] rounded;
    ValueError naming the frame when its shape is not the G-buffers' (H, W) or a float holds NaN."""
    arr = np.asarray(plane)
    if arr.dtype != np.uint8 and arr.dtype.kind != "f":
        raise ValueError(f"frame {number}: {name} must be uint8 (255 = seen) or float in [0, 1], got {arr.dtype}")
    if arr.shape != size:
        raise ValueError(f"frame {number}: {name} has shape {arr.shape}, expected {size} (H, W) like the G-buffers")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError(f"frame {number}: {name} has NaN or infinite values; it is {LIGHT_PASS_MEANING[name]}, "
                             "0 to 1")
        arr = np.rint(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)
    return np.ascontiguousarray(arr)


def pack_frame(header: dict, pixels: bytes) -> bytes:
    """A server frame message: uint32 big-endian header length, JSON header, pixel bytes."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack(">I", len(head)) + head + pixels


def unpack_frame(message: bytes) -> tuple[dict, bytes]:
    """A server frame message -> (header, pixel bytes). Raises ValueError on a malformed one."""
    if len(message) < 4:
        raise ValueError(f"frame message of {len(message)} bytes has no header")
    (n,) = struct.unpack(">I", message[:4])
    if 4 + n > len(message):
        raise ValueError(f"frame message: header of {n} bytes runs past the message ({len(message)} bytes)")
    return json.loads(message[4:4 + n]), message[4 + n:]
