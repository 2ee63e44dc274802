"""Sinks: write RGB frames and/or G-buffer frames incrementally, atomically, never clobbering.

    with Mp4Sink("out/render.mp4", fps=16) as sink:      # RGB preview video (H.264, yuv420p)
        for rgb in frames:                                 # uint8 (H, W, 3), or float [0, 1]
            sink.write(rgb)

Every sink writes frame by frame (memory stays flat) into a temporary name next to the destination and
moves it into place with os.replace when closed, so the output appears whole or not at all. On an
exception inside the `with` block (or abort()), the temporary output is deleted. An existing
destination is an error unless overwrite=True (`--overwrite`).

write(rgb=None, gbuffer=None, shadow=None, sky=None):
  rgb      uint8 (H, W, 3) sRGB, or float (H, W, 3) display-referred values in [0, 1] (= uint8 / 255)
  gbuffer  a canonical GBufferFrame, or teacher form uint8 (5, H, W, 3)
  shadow   the G-buffers' light passes (gbuffer.py LIGHT_PASSES): shadow the sun's visibility, sky the share
  sky      of the sky seen; uint8 (H, W), 255 seen, or float (H, W) in [0, 1]; None takes a GBufferFrame's
           extras "shadow" / "sun_visibility" ("sky" / "sky_visibility") when it has one
Every frame must carry the same parts (rgb, gbuffer, each light pass) at the same size as the first.

Sinks and what they write (the G-buffer layouts are the ones streaming/files/readers.py reads back):
  Mp4Sink(path)             RGB video, H.264 yuv420p (even width and height), crf 18
  TeacherMp4Sink(folder)    G-buffers as the teacher's clip layout: {mod}.mp4 per modality
                            (+ rgb.mp4, shadow.mp4, sky.mp4), H.264 lossless RGB (libx264rgb, crf 0): bit-exact 8-bit
  PngSequenceSink(folder)   RGB as 000000.png ...; passes as {mod}/000000.png (shadow/, sky/ grey); 8-bit
                            (teacher encoding, exact) or bits=16 (same encoding at 16 bits, from float)
  ExrSequenceSink(folder)   one float32 EXR per frame: R, G, B (linear) and/or the passes as layers
                            albedo.R/G/B, depth.Z, metallic.Y, normal.X/Y/Z, roughness.Y (+ shadow.Y, sky.Y)
  NpyWindowSink(folder)     window-0000.npy ... uint8 (T, 5, H, W, 3), T = window (last may be
                            shorter); RGB as rgb-0000.npy (T, H, W, 3); no light passes (the layout has none)
"""
from __future__ import annotations

import logging
import os
import shutil
import uuid
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ...model_zoo.errors import AlayaError
from ..stops import raise_if_stopped
from ..gbuffer import (
    DEFAULT_DEPTH_NEAR,
    LIGHT_PASS_MEANING,
    LIGHT_PASS_WORLD_KEYS,
    LIGHT_PASSES,
    MODALITIES,
    GBufferFrame,
    frame_to_teacher,
    linear_to_srgb,
    srgb_to_linear,
    teacher_to_frame,
)
from .image_files import write_exr, write_png

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SINK_FORMATS = ("mp4", "png", "exr", "npy")
"""G-buffer stream formats for `gbuffers convert --to` (mp4 = the teacher's {mod}.mp4 layout)."""


# ---------------------------------------------------------------------------------------------
# Atomic destinations.


TEMP_MARK = "alaya-tmp"  # in every temporary name this program makes: `.NAME.PID-TOKEN.alaya-tmp.tmp`
# In every folder output this program writes (frame sequences, clips, shots): overwrite replaces a folder only
# when it has this file (or is empty), so `--out ~/Desktop --overwrite` refuses instead of deleting the desktop.
OUTPUT_MARK = ".alaya-flash-output"


def replace_refusal(dst: Path, is_dir: bool) -> str | None:
    """Why overwrite may not replace what is at dst (None: nothing there, or an output of ours). A file
    output never replaces a folder, a folder output never a file, and a folder only one this program wrote."""
    if dst.is_symlink() or not dst.exists():
        return None  # replacing a link loses only the link, never what it points to
    if not is_dir:
        return f"{dst}: is a folder, not a file; choose another path" if dst.is_dir() else None
    if not dst.is_dir():
        return f"{dst}: is a file; a frame sequence is written as a folder: choose another path"
    if not (dst / OUTPUT_MARK).is_file() and any(dst.iterdir()):
        return (f"{dst}: is a folder alaya-flash did not write (it has no {OUTPUT_MARK}); overwrite replaces only "
                f"folders it wrote: choose another folder, or empty this one")
    return None


def temp_name(dst: Path) -> Path:
    """A temporary path beside dst that no user file can be: hidden, with this process id and a
    random token (the pid lets a later run sweep what a killed run left, sweep_leftovers)."""
    return dst.with_name(f".{dst.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.{TEMP_MARK}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_leftovers(dst: Path) -> list[Path]:
    """Remove the temporary files of dst that a killed run (kill -9, power loss) left behind: only
    names this program makes (temp_name), only those of processes that no longer run."""
    removed = []
    parent = dst.parent
    if not parent.is_dir():
        return removed
    for path in parent.glob(f".{glob_escape(dst.name)}.*.{TEMP_MARK}.tmp"):
        pid = path.name[len(dst.name) + 2:].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            _remove(path)
            removed.append(path)
    if removed:
        log.warning("%s: removed %d temporary file(s) left by an interrupted run", dst, len(removed))
    return removed


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


_UNFINISHED: set = set()  # AtomicOutputs neither committed nor aborted yet (this process)


def abort_unfinished() -> int:
    """Abort every output still being written: the CLI's last word when it stops on an error or a
    signal that landed before a writer could catch it. Returns how many there were."""
    outs = list(_UNFINISHED)
    for out in outs:
        out.abort()
    return len(outs)


class AtomicOutput:
    """A destination path (file or folder) written to a temporary name beside it (temp_name) and
    moved into place on commit; abort removes only what this object created."""

    def __init__(self, dst, overwrite: bool = False, is_dir: bool = False):
        self.dst = Path(dst)
        if self.dst.name in ("", ".."):  # Path gives "." and "/" the name ""
            raise AlayaError(f"{self.dst}: names no file or folder to write; give the output's own name")
        if self.dst.exists() and not overwrite:
            raise AlayaError(f"{self.dst}: already exists; pass overwrite=True (--overwrite) to replace it")
        refusal = replace_refusal(self.dst, is_dir)
        if refusal:
            raise AlayaError(refusal)
        self.is_dir = is_dir
        self._created = []  # parent folders we made, removed again on abort
        for parent in reversed(self.dst.parents):
            if parent.exists() and not parent.is_dir():
                raise AlayaError(f"{self.dst}: cannot write here: {parent} is a file, not a folder")
            if not parent.exists():
                parent.mkdir()
                self._created.append(parent)
        sweep_leftovers(self.dst)
        self.tmp = temp_name(self.dst)
        _UNFINISHED.add(self)  # before the temporary exists: a signal from here on still finds it
        if is_dir:
            self.tmp.mkdir()
            if not any(TEMP_MARK in p.name for p in self.dst.parents):  # a part of another output: its mark covers it
                (self.tmp / OUTPUT_MARK).write_text("written by alaya-flash: --overwrite may replace this folder\n")

    def commit(self) -> Path:
        raise_if_stopped()  # a stopped command never puts its output in place
        if self.dst.exists() or self.dst.is_symlink():
            old = temp_name(self.dst)
            os.replace(self.dst, old)
            os.replace(self.tmp, self.dst)
            _remove(old)
        else:
            os.replace(self.tmp, self.dst)
        _UNFINISHED.discard(self)
        return self.dst

    def abort(self) -> None:
        _UNFINISHED.discard(self)
        _remove(self.tmp)
        for parent in reversed(self._created):
            try:
                parent.rmdir()
            except OSError:
                pass


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# ---------------------------------------------------------------------------------------------
# Frame normalisation.


def as_rgb_u8(rgb, where: str = "rgb") -> np.ndarray:
    """uint8 (H, W, 3) as is; float (H, W, 3) in [0, 1] -> uint8 (rounded, clipped)."""
    arr = np.asarray(rgb)
    if arr.ndim != 3 or arr.shape[-1] != 3:
        raise AlayaError(f"{where}: RGB frame has shape {arr.shape}, expected (H, W, 3)")
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype.kind != "f":
        raise AlayaError(f"{where}: RGB frame has dtype {arr.dtype}, expected uint8 or float in [0, 1]")
    return np.clip(np.rint(np.nan_to_num(arr) * 255.0), 0, 255).astype(np.uint8)


def to_uint8(frames: "torch.Tensor") -> np.ndarray:
    """IMAGE (T, H, W, 3) float [0, 1] (any device) -> uint8 numpy (T, H, W, 3)."""
    import torch

    return frames.detach().float().cpu().clamp(0, 1).mul(255).round().to(torch.uint8).numpy()


def _rgb_float(rgb, where: str) -> np.ndarray:
    """RGB frame -> float32 (H, W, 3) display values in [0, 1] (float input keeps full precision)."""
    arr = np.asarray(rgb)
    if arr.dtype == np.uint8 or arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype.kind != "f":
        return as_rgb_u8(arr, where).astype(np.float32) / 255.0  # checks shape and dtype
    return np.clip(arr.astype(np.float32), 0.0, 1.0)


def as_teacher(gbuffer, depth_near: float = DEFAULT_DEPTH_NEAR, where: str = "gbuffer") -> np.ndarray:
    """GBufferFrame or teacher form -> teacher form uint8 (5, H, W, 3)."""
    if isinstance(gbuffer, GBufferFrame):
        return frame_to_teacher(gbuffer, depth_near)
    arr = np.asarray(gbuffer)
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[0] != 5 or arr.shape[-1] != 3:
        raise AlayaError(f"{where}: G-buffer has {arr.dtype} {arr.shape}, expected a GBufferFrame or uint8 (5, H, W, 3)")
    return arr


def as_frame(gbuffer, depth_near: float = DEFAULT_DEPTH_NEAR, where: str = "gbuffer") -> GBufferFrame:
    """GBufferFrame or teacher form -> canonical GBufferFrame."""
    if isinstance(gbuffer, GBufferFrame):
        return gbuffer
    return teacher_to_frame(as_teacher(gbuffer, depth_near, where), depth_near=depth_near)


# ---------------------------------------------------------------------------------------------
# Base class.


class Sink:
    """Shared bookkeeping: atomic destination, parts/size consistency, context manager.

    prefers says which G-buffer form the sink stores natively ("teacher" 8-bit or "canonical"
    float), so callers can hand it that form and avoid a lossy round trip.
    """

    prefers = "teacher"
    accepts = ("rgb", "gbuffer")
    is_dir = True

    def __init__(self, dst, overwrite: bool = False, depth_near: float = DEFAULT_DEPTH_NEAR):
        self.out = AtomicOutput(dst, overwrite, is_dir=self.is_dir)
        self.path = self.out.dst
        self.depth_near = depth_near
        self.count = 0
        self._parts: tuple[bool, bool] | None = None
        self._size = None
        self._light: dict[str, bool] = {}  # whether the frames carry each light pass (fixed by the first G-buffer frame)
        self._done = False

    def write(self, rgb=None, gbuffer=None, shadow=None, sky=None) -> None:
        """Append one frame (see module docstring for the accepted forms)."""
        given = {"shadow": shadow, "sky": sky}
        if self._done:
            raise AlayaError(f"{self.path}: sink is closed")
        parts = (rgb is not None, gbuffer is not None)
        where = f"{self.path}: frame {self.count}"
        try:
            raise_if_stopped()
            if not any(parts):
                raise AlayaError(f"{where}: nothing to write (give rgb and/or gbuffer)")
            light = {n: p for n, p in given.items() if p is not None}
            if isinstance(gbuffer, GBufferFrame):
                light = {**frame_light_passes(gbuffer.extras), **light}
            if light and gbuffer is None:
                raise AlayaError(f"{where}: a {next(iter(light))} pass goes with G-buffer frames; this frame has none")
            for name, given in zip(("rgb", "gbuffer"), parts):
                if given and name not in self.accepts:
                    raise AlayaError(f"{self.path}: {type(self).__name__} does not write {name} frames")
            if self._parts is None:
                self._parts = parts
            elif parts != self._parts:
                raise AlayaError(f"{where}: has {_describe(parts)} but earlier frames have {_describe(self._parts)}")
            size = (gbuffer.size if isinstance(gbuffer, GBufferFrame) else np.shape(gbuffer)[1:3]) if parts[1] \
                else np.shape(rgb)[:2]
            if parts[0] and parts[1] and tuple(np.shape(rgb)[:2]) != tuple(size):
                raise AlayaError(f"{where}: rgb is {np.shape(rgb)[1]}x{np.shape(rgb)[0]}, G-buffer is {size[1]}x{size[0]}")
            if self._size is None:
                self._size = tuple(size)
            elif tuple(size) != self._size:
                raise AlayaError(f"{where}: size {size[1]}x{size[0]} differs from the first frame's "
                                 f"{self._size[1]}x{self._size[0]}")
            if parts[1]:
                light = self._check_light(light, tuple(size), where)
            if self.writes_light:
                for name, plane in light.items():
                    self._write_light(name, plane, where)
            self._write(rgb, gbuffer, where)
        except OSError as err:  # the disk refused (full, a file-size limit, no permission): name the output
            self.abort()
            raise AlayaError(f"{where}: cannot write ({err.strerror or err}); nothing was left at {self.path}") from err
        except BaseException:
            self.abort()
            raise
        self.count += 1

    writes_light = False  # sinks whose layout has the light passes write them (the others leave them out)

    def _check_light(self, light: dict, size: tuple, where: str) -> dict:
        """The frame's light passes checked against it, by name (LIGHT_PASSES order); a stream has each all along
        or never (the first G-buffer frame decides)."""
        out = {}
        for name in LIGHT_PASSES:
            plane = light.get(name)
            if name not in self._light:
                self._light[name] = plane is not None
            elif (plane is not None) != self._light[name]:
                raise AlayaError(f"{where}: " + (f"has a {name} pass but earlier frames have none" if plane is not None
                                                 else f"has no {name} pass but earlier frames have one")
                                 + "; a stream carries it with every frame or never")
            if plane is None:
                continue
            arr = np.asarray(plane)
            if arr.ndim != 2 or (arr.dtype != np.uint8 and arr.dtype.kind != "f"):
                raise AlayaError(f"{where}: {name} pass has {arr.dtype} {arr.shape}, expected uint8 (H, W) or float "
                                 "(H, W) in [0, 1]")
            if arr.shape != size:
                raise AlayaError(f"{where}: {name} pass is {arr.shape[1]}x{arr.shape[0]}, G-buffer is {size[1]}x{size[0]}")
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise AlayaError(f"{where}: {name} pass has NaN/Inf pixels; it is {LIGHT_PASS_MEANING[name]}, 0 to 1")
            out[name] = arr
        return out

    def _write_light(self, name: str, plane: np.ndarray, where: str) -> None:
        """Write this frame's light pass `name`, uint8 (H, W) or float (H, W) (checked: finite)."""

    def _write(self, rgb, gbuffer, where: str) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        """Flush anything buffered into the temporary output (before the commit)."""

    def _discard(self) -> None:
        """Release open writers without finishing them (before the temporary output is deleted)."""

    def close(self) -> Path | None:
        """Finish and move the output into place; returns its path. An empty sink writes nothing."""
        if self._done:
            return self.path if self.count else None
        if self.count == 0:
            self.abort()
            log.warning("%s: no frames written; nothing created", self.path)
            return None
        try:
            self._finish()
        except OSError as err:
            self.abort()
            raise AlayaError(f"{self.path}: cannot finish writing ({err.strerror or err}); nothing was left there") from err
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.out.commit()

    def abort(self) -> None:
        """Drop everything written so far; the destination is left as it was."""
        if self._done:
            return
        self._done = True
        try:
            self._discard()
        finally:
            self.out.abort()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def frame_light_passes(extras: dict) -> dict:
    """A frame's light passes by name from its extras: a file's "shadow", "sky" (uint8) or a world's
    "sun_visibility", "sky_visibility" (float, 1 = seen); the ones it has."""
    out = {}
    for name in LIGHT_PASSES:
        plane = extras.get(name, extras.get(LIGHT_PASS_WORLD_KEYS[name]))
        if plane is not None:
            out[name] = plane
    return out


def light_u8(plane: np.ndarray) -> np.ndarray:
    """A checked light pass as uint8 (H, W), 255 = seen (float rounded from [0, 1])."""
    if plane.dtype == np.uint8:
        return plane
    return np.rint(np.clip(plane, 0.0, 1.0) * 255.0).astype(np.uint8)


def light_float(plane: np.ndarray) -> np.ndarray:
    """A checked light pass as float32 (H, W) in [0, 1] (uint8 / 255)."""
    if plane.dtype == np.uint8:
        return plane.astype(np.float32) / 255.0
    return np.clip(plane, 0.0, 1.0).astype(np.float32)


def _describe(parts) -> str:
    return " and ".join(n for n, p in zip(("rgb", "gbuffer"), parts) if p) or "nothing"


# ---------------------------------------------------------------------------------------------
# MP4.


class _VideoWriter:
    """One H.264 MP4 written frame by frame with PyAV; opened on the first frame (size known then)."""

    def __init__(self, path: Path, fps: float, lossless: bool, crf: int = 18):
        self.path, self.fps, self.lossless, self.crf = path, fps, lossless, crf
        self.container = self.stream = None

    def write(self, rgb: np.ndarray, label: str) -> None:
        import av

        h, w = rgb.shape[:2]
        if self.container is None:
            if not self.lossless and (h % 2 or w % 2):
                raise AlayaError(f"{label}: H.264 yuv420p needs even width and height, got {w}x{h}; resize first")
            # PyAV creates the file only when the encoder's first packet is muxed, which H.264's
            # look-ahead delays by dozens of frames: create it now, so an output being written shows
            # from its first frame (and an interruption has a file to remove)
            self.path.touch()
            self.container = av.open(str(self.path), "w", format="mp4")
            rate = Fraction(self.fps).limit_denominator(1001)
            self.stream = self.container.add_stream("libx264rgb" if self.lossless else "libx264", rate=rate)
            self.stream.width, self.stream.height = w, h
            self.stream.pix_fmt = "rgb24" if self.lossless else "yuv420p"
            options = {"crf": "0" if self.lossless else str(self.crf), "preset": "veryfast"}
            if not self.lossless:
                # x264's macroblock-tree rate control reads memory it never wrote, so the same frames
                # encoded differently depending on what malloc handed it (every shot after a process's
                # first differed by up to 33/255 from its single-shot render). Off: deterministic
                # bytes, about 8% larger at crf 18 and 0.1 dB closer to the frames (256x256 world clip).
                options["x264-params"] = "mbtree=0"
            self.stream.options = options
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self) -> None:
        if self.container is not None:
            for packet in self.stream.encode():
                self.container.mux(packet)
            self.container.close()
            self.container = None

    def discard(self) -> None:
        if self.container is not None:
            try:
                self.container.close()
            except Exception:  # already failing; the file is deleted anyway
                pass
            self.container = None


class Mp4Sink(Sink):
    """RGB frames -> one H.264 MP4 (yuv420p, crf 18: plays everywhere)."""

    accepts = ("rgb",)
    is_dir = False

    def __init__(self, path, fps: float = 16.0, overwrite: bool = False, crf: int = 18):
        super().__init__(path, overwrite)
        self.video = _VideoWriter(self.out.tmp, fps, lossless=False, crf=crf)

    def _write(self, rgb, gbuffer, where):
        self.video.write(as_rgb_u8(rgb, where), str(self.path))

    def _finish(self):
        self.video.close()

    def _discard(self):
        self.video.discard()


class TeacherMp4Sink(Sink):
    """G-buffers -> the teacher's clip folder: {mod}.mp4 per modality (+ rgb.mp4, shadow.mp4 and sky.mp4 grey),
    lossless H.264 RGB."""

    writes_light = True

    def __init__(self, folder, fps: float = 16.0, overwrite: bool = False, depth_near: float = DEFAULT_DEPTH_NEAR):
        super().__init__(folder, overwrite, depth_near)
        self.videos = {n: _VideoWriter(self.out.tmp / f"{n}.mp4", fps, lossless=True)
                       for n in MODALITIES + ("rgb",) + LIGHT_PASSES}

    def _write_light(self, name, plane, where):
        self.videos[name].write(np.repeat(light_u8(plane)[..., None], 3, -1), str(self.path))

    def _write(self, rgb, gbuffer, where):
        if gbuffer is None:
            raise AlayaError(f"{where}: the teacher layout needs G-buffer frames")
        for name, img in zip(MODALITIES, as_teacher(gbuffer, self.depth_near, where)):
            self.videos[name].write(img, str(self.path))
        if rgb is not None:
            self.videos["rgb"].write(as_rgb_u8(rgb, where), str(self.path))

    def _finish(self):
        for v in self.videos.values():
            v.close()

    def _discard(self):
        for v in self.videos.values():
            v.discard()


# ---------------------------------------------------------------------------------------------
# Image sequences and npy windows.


class PngSequenceSink(Sink):
    """RGB -> folder/000000.png; G-buffers -> folder/{mod}/000000.png (8-bit teacher encoding or 16-bit)."""

    def __init__(self, folder, bits: int = 8, overwrite: bool = False, depth_near: float = DEFAULT_DEPTH_NEAR):
        if bits not in (8, 16):
            raise AlayaError(f"PNG bit depth must be 8 or 16, got {bits}")
        super().__init__(folder, overwrite, depth_near)
        self.bits = bits
        self.prefers = "teacher" if bits == 8 else "canonical"

    writes_light = True

    def _write_light(self, name, plane, where):
        folder = self.out.tmp / name
        folder.mkdir(exist_ok=True)
        write_png(folder / f"{self.count:06d}.png", light_u8(plane) if self.bits == 8 else _u16(light_float(plane)))

    def _write(self, rgb, gbuffer, where):
        name = f"{self.count:06d}.png"
        if rgb is not None:
            if self.bits == 8:
                write_png(self.out.tmp / name, as_rgb_u8(rgb, where))
            else:
                write_png(self.out.tmp / name, _u16(_rgb_float(rgb, where)))
        if gbuffer is None:
            return
        if self.bits == 8:
            passes = dict(zip(MODALITIES, as_teacher(gbuffer, self.depth_near, where)))
            passes = {m: (p[..., 0] if _is_gray(p) else p) for m, p in passes.items()}
        else:
            passes = encode_passes_16(as_frame(gbuffer, self.depth_near, where), self.depth_near)
        for mod, img in passes.items():
            folder = self.out.tmp / mod
            folder.mkdir(exist_ok=True)
            write_png(folder / name, img)


def _is_gray(img: np.ndarray) -> bool:
    return bool((img[..., 0] == img[..., 1]).all() and (img[..., 0] == img[..., 2]).all())


def _u16(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * 65535.0), 0, 65535).astype(np.uint16)


def encode_passes_16(frame: GBufferFrame, depth_near: float = DEFAULT_DEPTH_NEAR) -> dict[str, np.ndarray]:
    """Canonical frame -> the teacher encodings at 16 bits: {mod: uint16 (H, W) or (H, W, 3)}."""
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(frame.depth > 0, depth_near / frame.depth, 1.0)
    return {
        "albedo": _u16(linear_to_srgb(frame.albedo)),
        "depth": _u16(np.clip(np.nan_to_num(inv, nan=0.0), 0.0, 1.0)),
        "metallic": _u16(np.clip(frame.metallic, 0, 1)),
        "normal": _u16(np.clip(frame.normal, -1, 1) * 0.5 + 0.5),
        "roughness": _u16(np.clip(frame.roughness, 0, 1)),
    }


EXR_LAYERS = {
    "albedo": ("R", "G", "B"),
    "depth": ("Z",),
    "metallic": ("Y",),
    "normal": ("X", "Y", "Z"),
    "roughness": ("Y",),
}
"""Channel names of each pass inside a multi-layer EXR frame (channel "{mod}.{name}")."""


class ExrSequenceSink(Sink):
    """One float32 EXR per frame: linear R, G, B and/or the canonical passes as named layers (+ shadow.Y, sky.Y)."""

    prefers = "canonical"
    writes_light = True
    _light_planes: dict = {}  # this frame's light passes, layers of its one file (_write)

    def _write_light(self, name, plane, where):
        self._light_planes = {**self._light_planes, name: light_float(plane)}

    def _write(self, rgb, gbuffer, where):
        channels = {f"{name}.Y": plane for name, plane in self._light_planes.items()}
        self._light_planes = {}
        if rgb is not None:
            lin = srgb_to_linear(_rgb_float(rgb, where))
            channels.update({c: lin[..., i] for i, c in enumerate("RGB")})
        if gbuffer is not None:
            frame = as_frame(gbuffer, self.depth_near, where)
            for mod, names in EXR_LAYERS.items():
                arr = getattr(frame, mod)
                for i, c in enumerate(names):
                    channels[f"{mod}.{c}"] = arr[..., i] if arr.ndim == 3 else arr
        write_exr(self.out.tmp / f"{self.count:06d}.exr", channels)


class NpyWindowSink(Sink):
    """G-buffers -> window-0000.npy, uint8 (T, 5, H, W, 3) per `window` frames; RGB -> rgb-0000.npy."""

    def __init__(self, folder, window: int = 16, overwrite: bool = False, depth_near: float = DEFAULT_DEPTH_NEAR):
        if window < 1:
            raise AlayaError(f"npy window length must be >= 1, got {window}")
        super().__init__(folder, overwrite, depth_near)
        self.window = window
        self._gbuf, self._rgb, self._k = [], [], 0

    def _write(self, rgb, gbuffer, where):
        if gbuffer is None:
            raise AlayaError(f"{where}: npy windows need G-buffer frames")
        self._gbuf.append(as_teacher(gbuffer, self.depth_near, where))
        if rgb is not None:
            self._rgb.append(as_rgb_u8(rgb, where))
        if len(self._gbuf) == self.window:
            self._flush()

    def _flush(self):
        if not self._gbuf:
            return
        np.save(self.out.tmp / f"window-{self._k:04d}.npy", np.stack(self._gbuf))
        if self._rgb:
            np.save(self.out.tmp / f"rgb-{self._k:04d}.npy", np.stack(self._rgb))
        self._gbuf, self._rgb, self._k = [], [], self._k + 1

    def _finish(self):
        self._flush()


class BackgroundWriter:
    """Feeds a Sink from a worker thread, so that encoding the frames overlaps the next chunk's
    compute instead of adding to it (Pillow's PNG and PyAV's H.264 encoders release the GIL; on an
    H200 this took the default model from 59 to 75 FPS steady, docs/benchmarks.md).

        writer = BackgroundWriter(Mp4Sink("out/render.mp4"))
        writer.put([(rgb, None), ...])     # a chunk's frames: returns at once unless `depth` wait
        writer.close()                     # waits for the queued frames, then the sink's close()

    At most `depth` chunks wait, so memory stays flat when the encoder is the slower side. The
    frames handed over must not be changed afterwards. A write that fails (bad frame, full disk)
    aborts the sink in the worker, and the error is raised by the next put() or by close(); abort()
    drops the chunks still queued and the output.
    """

    def __init__(self, sink: Sink, depth: int = 2):
        import queue
        import threading

        self.sink = sink
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._dropping = False  # set by abort(): skip what is still queued
        self._thread = threading.Thread(target=self._run, name=f"alaya-flash writer {sink.path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is not None or self._dropping:
                continue
            try:
                for rgb, gbuffer, *light in batch:
                    self.sink.write(rgb, gbuffer, **(light[0] if light else {}))  # aborts the sink itself on an error
            except BaseException as e:  # noqa: BLE001  (handed to the caller's thread)
                self._error = e

    def put(self, frames: list) -> None:
        """Queue one chunk's frames as (rgb, gbuffer) pairs or (rgb, gbuffer, {light pass name: plane}) (as
        Sink.write takes them)."""
        self._check()
        if frames:
            self._queue.put(frames)

    def close(self) -> Path | None:
        """Write what is queued, then close the sink (see Sink.close)."""
        self._stop()
        self._check()
        return self.sink.close()

    def abort(self) -> None:
        self._dropping = True
        self._stop()
        self.sink.abort()

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _check(self) -> None:
        if self._error is not None:
            self._stop()
            raise self._error

    @property
    def count(self) -> int:
        return self.sink.count


FRAME_FORMATS = ("mp4", "png", "exr", "npy")


class FrameWriter:
    """A sink stage of the chunk loop (streaming/render/driver.py): rendered frames, and optionally the
    G-buffers they came from, written as they arrive on a BackgroundWriter.

    format: mp4 (H.264 video), png / exr (numbered frame folders), npy (windows with the G-buffers).
    step(images=IMAGE float (T, H, W, 3) [0, 1], gbuffers=GBuffers): the decoder lags its input, so
    frames wait for their G-buffers (and their light passes, when they carry them) and pair in stream
    order. close() (flush) returns the path;
    abort() leaves nothing at the destination.
    """

    def __init__(self, path, format: str = "mp4", fps: float = 16.0, overwrite: bool = False):
        if format not in FRAME_FORMATS:
            raise AlayaError(f"unknown output format {format!r}; choose one of {', '.join(FRAME_FORMATS)}")
        sink = {"mp4": lambda: Mp4Sink(path, fps=fps, overwrite=overwrite),
                "png": lambda: PngSequenceSink(path, overwrite=overwrite),
                "exr": lambda: ExrSequenceSink(path, overwrite=overwrite),
                "npy": lambda: NpyWindowSink(path, overwrite=overwrite)}[format]()
        self.path, self.sink = Path(path), sink
        self.writer = BackgroundWriter(sink)  # encodes while the next chunk renders
        self.frames: list = []  # decoded frames waiting for their G-buffers
        self.gbuffers: list = []
        self.with_gbuffers = False

    def step(self, images=None, gbuffers=None) -> None:
        if images is not None:
            self.frames.extend(to_uint8(images))
        if gbuffers is not None:
            self.with_gbuffers = True
            light = {name: plane.numpy() for name, plane in gbuffers.light_passes().items()}
            self.gbuffers.extend((images, {name: plane[i] for name, plane in light.items()})
                                 for i, images in enumerate(gbuffers.images.numpy()))
        self._write()

    def _write(self) -> None:
        n = min(len(self.frames), len(self.gbuffers)) if self.with_gbuffers else len(self.frames)
        self.writer.put([(self.frames[i], *(self.gbuffers[i] if self.with_gbuffers else (None, {})))
                         for i in range(n)])
        del self.frames[:n]
        if self.with_gbuffers:
            del self.gbuffers[:n]

    def flush(self) -> Path | None:
        self._write()
        if self.with_gbuffers and (self.frames or self.gbuffers):
            self.abort()
            raise AlayaError(f"{self.path}: {len(self.frames)} frame(s) and {len(self.gbuffers)} G-buffer(s) left "
                             "unpaired: the frames and G-buffers differ in length")
        return self.writer.close()

    def abort(self) -> None:
        self.writer.abort()

    @property
    def count(self) -> int:
        return self.sink.count


def open_sink(dst, to: str, fps: float = 16.0, overwrite: bool = False, png_bits: int = 8,
              window: int = 16, depth_near: float = DEFAULT_DEPTH_NEAR) -> Sink:
    """A G-buffer stream sink by format name (SINK_FORMATS); mp4 is the teacher's {mod}.mp4 layout."""
    if to == "mp4":
        return TeacherMp4Sink(dst, fps, overwrite, depth_near)
    if to == "png":
        return PngSequenceSink(dst, png_bits, overwrite, depth_near)
    if to == "exr":
        return ExrSequenceSink(dst, overwrite, depth_near)
    if to == "npy":
        return NpyWindowSink(dst, window, overwrite, depth_near)
    raise AlayaError(f"unknown output format {to!r}; choose one of {', '.join(SINK_FORMATS)}")


def write_stream(stream, sink: Sink, progress=None) -> int:
    """Copy a GBufferStream (readers.py) into a sink in the sink's preferred form; returns frames written.

    8-bit sources reach 8-bit sinks unchanged (teacher form throughout); float sources reach EXR
    (and 16-bit PNG) as canonical floats; the light passes go along where the sink's layout has them.
    progress, if given, is called with 1 per frame.
    On any error the sink is aborted: nothing is left at its destination.
    """
    with sink:
        if sink.prefers == "teacher":
            items = ((ext.get("rgb"), images, frame_light_passes(ext)) for images, ext in stream.teacher_frames(extras=True))
        else:  # a frame's light passes go with it in its extras
            items = ((f.extras.get("rgb"), f, {}) for f in stream)
        for rgb, gbuffer, light in items:
            sink.write(rgb=rgb, gbuffer=gbuffer, **light)
            if progress:
                progress(1)
    return sink.count
