"""G-buffer readers: every on-disk layout users bring, read lazily, one frame at a time.

    stream = open_gbuffers("clips/clip_0052", size=(448, 832))   # layout auto-detected
    print(stream.info)                                         # StreamInfo(layout=..., num_frames=...)
    for frame in stream:                                       # canonical GBufferFrame, float passes
        ...
    for chunk in stream.teacher_chunks(16):                    # uint8 (T, 5, H, W, 3), what models eat
        ...

Layouts (docs/gbuffers.md has the details):
  teacher-mp4     a folder with `{mod}.mp4` or `{clip}_{mod}.mp4` per modality (the teacher's clip
                  layout), plus `rgb.mp4` / `{clip}_rgb.mp4` ground truth when present (extras["rgb"])
                  and the light passes `shadow.mp4`, `sky.mp4` (extras["shadow"], ["sky"], below);
                  a folder holding several clips side by side is read one clip at a time by the path
                  `FOLDER/CLIP` (find_video_clips lists them)
  image-sequence  a folder with one sub-folder per modality (`albedo/0000.png` ...), or files whose
                  names carry the modality (`albedo_0000.png`, `0000.depth.exr`), or multi-layer
                  EXR frames (channels `albedo.R`, `depth.Z`, ..., as the EXR sink writes them).
                  PNG 8-bit = teacher encoding; PNG 16-bit = the same encoding at 16 bits;
                  EXR = canonical float (depth in scene units, +inf background, float normals)
  npy-windows     uint8 arrays (T, 5, H, W, 3) in MODALITIES order, one .npy per window
                  (the Flash model card's samples); a stream is the sorted list of windows

Every layout may carry the light passes (gbuffer.py LIGHT_PASSES) beside the five, each in the same forms
(`shadow.mp4`, `shadow/0000.png`, `shadow_0000.exr`, an EXR layer `shadow`; `sky.mp4`, `sky/0000.png`, ...):
"shadow" the sun's visibility (white where the sun reaches, black in its shadow), "sky" the share of the
sky each pixel's surface sees (white open, black enclosed), read as extras[name] uint8 (H, W) (8-bit grey
as is, 16-bit scaled, EXR clamped to [0, 1]; colour averaged). The shading prior takes its shadows and
its ambient occlusion from them (streaming/values.py GBuffers.shadow, .sky).

Engines' float exports (Blender multilayer / multi-part EXR, Unreal Movie Render Queue, Unity HDRP
AOVs) are read by pass name and converted to canonical form by `conventions` (conventions.py:
normal space and axes with camera.json, depth units and background, smoothness), with warnings
for passes that look like a wrong convention.

8-bit sources (MP4, npy, 8-bit PNG) reach teacher form bit-exactly: no canonical round trip.
Memory is bounded: MP4s decode frame by frame, npy windows are memory-mapped one at a time,
images are opened when their frame is read.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ...model_zoo.errors import AlayaError
from ..gbuffer import (
    DEFAULT_DEPTH_NEAR,
    LIGHT_PASS_MEANING,
    LIGHT_PASSES,
    MODALITIES,
    PASS_CHANNELS,
    GBufferFrame,
    StreamInfo,
    frame_to_teacher,
    linear_to_srgb,
    srgb_to_linear,
    teacher_to_frame,
)
from . import conventions as cv
from .image_files import exr_software, png_header, read_exr, read_png
from .resize import RESIZE_MODES, resize_frame, resize_rgb, resize_teacher

log = logging.getLogger(__name__)

LAYOUTS = ("teacher-mp4", "image-sequence", "npy-windows")
NAN_POLICIES = ("error", "fix")
"""What to do with NaN/-Inf in float depth (and any non-finite value in other float passes):
"error" raises naming the file, the count and the first pixel; "fix" logs the same line and
replaces them with background (depth +inf, normal (0, 0, 1), albedo/metallic/roughness 0)."""

DEFAULT_FPS = 16.0
IMAGE_EXTS = (".png", ".exr")
_EXTRA_NAMES = ("rgb",) + LIGHT_PASSES
_TOKEN = re.compile(r"(?:^|[_.\-])(" + "|".join(MODALITIES + _EXTRA_NAMES) + r")(?=$|[_.\-])", re.IGNORECASE)


def natural_key(path: Path):
    """Sort key that orders frame_2 before frame_10."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", path.name)]


# ---------------------------------------------------------------------------------------------
# The stream: slicing, resizing and form conversion over any source.


class GBufferStream:
    """A lazily read G-buffer stream. Re-iterable; each iteration re-opens its files.

    info describes what iteration yields (after start/stop/stride and resizing): frame index i is
    the i-th yielded frame, timestamp i / info.fps. Sources yield either teacher form (8-bit) or
    canonical frames (float); each is converted only when the other form is asked for.
    """

    def __init__(self, source, start: int = 0, stop: int | None = None, stride: int = 1,
                 size: tuple[int, int] | None = None, resize: str = "stretch"):
        if start < 0 or (stop is not None and stop < 0) or stride < 1:
            raise AlayaError(f"{source.info.source}: bad frame range start={start} stop={stop} stride={stride}")
        if resize not in RESIZE_MODES:
            raise AlayaError(f"resize mode {resize!r} is not one of {', '.join(RESIZE_MODES)}")
        if size is not None and (len(size) != 2 or min(size) < 1):
            raise AlayaError(f"bad size {size!r}: expected (height, width) with both >= 1")
        self.source, self.start, self.stop, self.stride = source, start, stop, stride
        self.size = tuple(size) if size is not None else None
        self.resize = resize
        native = source.info
        n = native.num_frames
        if n is not None:
            count = len(range(start, n if stop is None else min(stop, n), stride))
        else:  # unknown length (e.g. an MP4 without a frame count): only an empty range is known
            count = 0 if stop is not None and stop <= start else None
        if count == 0:
            raise AlayaError(f"{native.source}: empty stream (no frames in range start={start} stop={stop}"
                             f" of {n} frames)")
        h, w = self.size or native.size
        self.info = native.replace(height=h, width=w, num_frames=count, fps=native.fps / stride)

    def __repr__(self) -> str:
        return f"GBufferStream({self.info})"

    def _native(self) -> Iterator[tuple[object, dict]]:
        yield from self.source.frames(self.start, self.stop, self.stride)

    def __iter__(self) -> Iterator[GBufferFrame]:
        depth_near = self.info.depth_near
        for i, (payload, extras) in enumerate(self._native()):
            ts = i / self.info.fps
            if self.source.kind == "teacher":
                images, extras = self._resize_teacher(payload, extras)
                frame = teacher_to_frame(images, index=i, timestamp=ts, depth_near=depth_near)
                frame.extras.update(extras)
            else:  # a shallow copy: never mutate frames a caller's generator handed us
                frame = dataclasses.replace(payload, index=i, timestamp=ts, extras={**payload.extras, **extras})
                frame = resize_frame(frame, self.size, self.resize) if self.size else frame
            yield frame

    def teacher_frames(self, extras: bool = False) -> Iterator:
        """Yield teacher form uint8 (5, H, W, 3) per frame, or (images, extras) with extras=True."""
        for payload, ext in self._native():
            if self.source.kind == "teacher":
                images, ext = self._resize_teacher(payload, ext)
            else:
                frame = dataclasses.replace(payload, extras={**payload.extras, **ext})
                frame = resize_frame(frame, self.size, self.resize) if self.size else frame
                images, ext = frame_to_teacher(frame, self.info.depth_near), frame.extras
            yield (images, ext) if extras else images

    def teacher_chunks(self, length: int, drop_last: bool = False, first: int = 0,
                       extras: bool = False) -> Iterator:
        """Yield uint8 (T, 5, H, W, 3) chunks of `length` frames; the last may be shorter unless drop_last.
        first: the first chunk has this many frames instead (0: `length`). extras: yield (chunk, {name:
        stacked extras}) with each extra every frame of the chunk has (the rgb truth, the light passes)."""
        if length < 1 or first < 0:
            raise AlayaError(f"chunk length must be >= 1, got {length}" if length < 1 else f"first chunk length {first} < 0")
        buf, want = [], first or length

        def chunk():
            images = np.stack([im for im, _ in buf])
            if not extras:
                return images
            names = set.intersection(*(set(ext) for _, ext in buf))
            return images, {n: np.stack([ext[n] for _, ext in buf]) for n in sorted(names)}

        for item in self.teacher_frames(extras=True):
            buf.append(item)
            if len(buf) == want:
                yield chunk()
                buf, want = [], length
        if buf and not drop_last:
            yield chunk()

    def _resize_teacher(self, images: np.ndarray, extras: dict) -> tuple[np.ndarray, dict]:
        if not self.size:
            return images, extras
        out = {k: (resize_rgb(v, self.size, self.resize) if v.dtype == np.uint8 and v.ndim in (2, 3) else v)
               for k, v in extras.items()}
        return resize_teacher(images, self.size, self.resize), out

    # Context-manager sugar: sources hold no open files between iterations.
    def close(self) -> None:
        pass

    def __enter__(self) -> "GBufferStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def from_frames(cls, info: StreamInfo, make_frames: Callable[[], Iterator[GBufferFrame]], **kwargs) -> "GBufferStream":
        """A stream over canonical frames from a callable (each call starts the sequence afresh)."""
        return cls(_CallableSource(info, make_frames), **kwargs)


class _CallableSource:
    kind = "canonical"

    def __init__(self, info: StreamInfo, make_frames):
        self.info, self.make_frames = info, make_frames

    def frames(self, start, stop, stride):
        for i, frame in enumerate(self.make_frames()):
            if stop is not None and i >= stop:
                break
            if i >= start and (i - start) % stride == 0:
                yield frame, {}


# ---------------------------------------------------------------------------------------------
# Entry point and detection.


def open_gbuffers(
    path,
    layout: str | None = None,
    *,
    start: int = 0,
    stop: int | None = None,
    stride: int = 1,
    size: tuple[int, int] | None = None,
    resize: str = "stretch",
    nan_policy: str = "error",
    fps: float | None = None,
    depth_near: float | str = DEFAULT_DEPTH_NEAR,
    depth_far: float | None = None,
    conventions: str = "auto",
    world_normals: str = "error",
) -> GBufferStream:
    """Open a G-buffer stream from a folder or .npy file; layout=None auto-detects (see LAYOUTS).

    size is the output (height, width); resize picks "stretch" (teacher: LANCZOS, no crop) or
    "crop" (aspect-preserving centre crop). fps overrides the source's rate (npy and images carry
    none and default to 16). nan_policy applies to float EXR passes (see NAN_POLICIES).

    conventions (conventions.CONVENTION_CHOICES) says which engine wrote float passes: "auto" detects
    it from pass names and logs its choice; "blender", "unreal", "unity" convert that engine's
    normals, depth and albedo to canonical form (world-space normals need camera.json beside the
    passes, or world_normals="keep"); "alaya" is our own form. depth_near="auto" picks it from the
    data (float sources: the 1st percentile of depth over a few frames); depth_far makes anything
    farther background.
    """
    path = Path(path)
    clip = None
    if not path.exists() and path.parent.is_dir() and clip_files(path.parent, path.name):
        path, clip, layout = path.parent, path.name, layout or "teacher-mp4"  # FOLDER/CLIP: one clip of several
    if nan_policy not in NAN_POLICIES:
        raise AlayaError(f"nan_policy {nan_policy!r} is not one of {', '.join(NAN_POLICIES)}")
    if not path.exists():
        raise AlayaError(f"{path}: no such file or folder")
    _refuse_special_files(path)
    if conventions not in cv.CONVENTION_CHOICES:
        raise AlayaError(f"conventions {conventions!r} is not one of {', '.join(cv.CONVENTION_CHOICES)}")
    if world_normals not in cv.WORLD_NORMAL_POLICIES:
        raise AlayaError(f"world_normals {world_normals!r} is not one of {', '.join(cv.WORLD_NORMAL_POLICIES)}")
    if depth_far is not None and not depth_far > 0:
        raise AlayaError(f"depth_far must be > 0, got {depth_far!r}")
    auto_near = isinstance(depth_near, str) and depth_near == "auto"
    if auto_near:
        depth_near = DEFAULT_DEPTH_NEAR
    elif isinstance(depth_near, str) or not (np.isfinite(depth_near) and depth_near > 0):
        raise AlayaError(f"depth_near must be > 0 or 'auto', got {depth_near!r}")
    layout = layout or detect_layout(path)
    if clip is not None and layout != "teacher-mp4":
        raise AlayaError(f"{path / clip}: a clip of {clip}_{{mod}}.mp4 files is read with the teacher-mp4 layout, not {layout}")
    if layout == "teacher-mp4":
        source = TeacherMp4Source(path, depth_near, clip=clip)
    elif layout == "npy-windows":
        source = NpyWindowsSource(path, depth_near)
    elif layout == "image-sequence":
        source = ImageSequenceSource(path, depth_near, nan_policy, conventions, world_normals, depth_far)
    else:
        raise AlayaError(f"{path}: unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if layout != "image-sequence" and (conventions not in ("auto", "alaya") or depth_far is not None):
        raise AlayaError(f"{path}: {layout} holds 8-bit teacher-form passes; conventions and depth_far apply to "
                         "float EXR image sequences only")
    if auto_near:
        _auto_depth_near(source)
    if fps is not None:
        source.info = source.info.replace(fps=float(fps))
    log.debug("%s: %s", path, source.description)
    return GBufferStream(source, start=start, stop=stop, stride=stride, size=size, resize=resize)


def _auto_depth_near(source) -> None:
    """Set source.info.depth_near from the data (float EXR sources; others keep their encoding's)."""
    if not getattr(source, "exr_only", False):
        log.info("%s: depth_near auto: %s passes carry their own depth encoding; keeping %g",
                 source.info.source, source.info.layout, source.info.depth_near)
        return
    n = source.info.num_frames
    picks = sorted({0, n // 3, (2 * n) // 3, n - 1})
    depths = [source._read(i)[0].depth for i in picks]
    near = cv.auto_depth_near(depths)
    if near is None:
        log.warning("%s: depth_near auto: no finite depth in frames %s; keeping %g", source.info.source, picks,
                    source.info.depth_near)
        return
    log.info("%s: depth_near auto: %g (1st percentile of depth over frames %s)", source.info.source, near, picks)
    source.depth_near = near
    source.info = source.info.replace(depth_near=near)


def _refuse_special_files(path: Path, depth: int = 2) -> None:
    """A FIFO, socket or device among the inputs would block the reader or feed it garbage: refuse it
    by name (the folder and its pass subfolders, without following into deeper trees)."""
    def check(entry_path: Path, is_file: bool, is_dir: bool) -> None:
        if not is_file and not is_dir:
            raise AlayaError(f"{entry_path}: not a regular file (a FIFO, socket or device); G-buffers are read from files")

    if not path.is_dir():
        check(path, path.is_file(), False)
        return
    with os.scandir(path) as entries:
        for e in entries:
            check(Path(e.path), e.is_file(), e.is_dir())
            if e.is_dir() and depth > 1:
                _refuse_special_files(Path(e.path), depth - 1)


def detect_layout(path: Path) -> str:
    """Name the layout of path (one of LAYOUTS) or raise AlayaError saying what was found."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() == ".npy":
            return "npy-windows"
        raise AlayaError(f"{path}: unknown layout: a G-buffer stream is a folder (teacher MP4s or image "
                         f"sequences) or .npy window files, not a single {path.suffix or 'extension-less'} file")
    if not path.is_dir():
        raise AlayaError(f"{path}: no such file or folder")
    names = {p.name.lower(): p for p in path.iterdir()}
    if any(n.endswith(".mp4") and _modality_of(Path(n)) for n in names):
        return "teacher-mp4"
    if any(n.endswith(".npy") for n in names):
        return "npy-windows"
    if any(m in names and names[m].is_dir() for m in MODALITIES) or any(
        n.endswith(IMAGE_EXTS) for n in names
    ):
        return "image-sequence"
    raise AlayaError(
        f"{path}: unknown layout: found no {{mod}}.mp4 files, no .npy windows, no modality folders "
        f"({', '.join(MODALITIES)}) and no PNG/EXR images"
    )


def _modality_of(p: Path, engines: bool = False) -> str | None:
    """The modality (or 'rgb') a file name carries, e.g. 'clip_0052_depth.mp4' -> 'depth'.

    engines=True also knows engines' pass names (conventions.PASS_ALIASES: 'Seq.BaseColor.0001.exr'
    -> 'albedo', 'Render_Smoothness_0001.exr' -> 'smoothness') and names glued to the frame
    number ('albedo0001.exr', Blender's File Output default)."""
    found = _TOKEN.findall(p.stem) or ([p.stem.lower()] if p.stem.lower() in MODALITIES + _EXTRA_NAMES else [])
    if found:
        return found[-1].lower()
    if engines:
        for token in reversed(re.split(r"[_.\-\s]+", p.stem)):
            mod = cv.pass_of(re.sub(r"\d+$", "", token), file_name=True) or cv.pass_suffix_of(token)
            if mod:
                return mod
    return None


def _missing(path: Path, missing: list[str], found: dict) -> AlayaError:
    have = ", ".join(sorted(found)) or "none"
    return AlayaError(f"{path}: missing modality {', '.join(missing)} (found: {have})")


# ---------------------------------------------------------------------------------------------
# teacher-mp4


def clip_files(folder: Path, clip: str) -> dict[str, Path]:
    """The `{clip}_{mod}.mp4` files of one clip in `folder` (modality names in any case), by modality."""
    files = {}
    for p in folder.iterdir():
        if p.suffix.lower() == ".mp4" and p.stem[: len(clip) + 1] == f"{clip}_":
            name = p.stem[len(clip) + 1:].lower()
            if name in MODALITIES + _EXTRA_NAMES:
                files[name] = p
    return files if all(m in files for m in MODALITIES) else {}


def find_video_clips(root: Path, depth: int = 3) -> list[str]:
    """The G-buffer video clips under `root` (up to `depth` folders down), as paths relative to it that
    open_gbuffers reads: FOLDER for a folder of `{mod}.mp4` (AlayaRenderer's clip layout), FOLDER/CLIP
    for each clip of `CLIP_{mod}.mp4` files; only clips with all five passes."""
    found: list[str] = []

    def walk(folder: Path, left: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        names = {p.name.lower() for p in entries if p.is_file()}
        if all(f"{m}.mp4" in names for m in MODALITIES):
            found.append(folder.relative_to(root).as_posix())
        for p in entries:
            if p.is_file() and p.suffix.lower() == ".mp4" and p.stem.lower().endswith("_albedo"):
                clip = p.stem[: -len("_albedo")]
                if clip_files(folder, clip):
                    found.append((folder / clip).relative_to(root).as_posix())
            elif p.is_dir() and left > 0 and not p.name.startswith("."):
                walk(p, left - 1)

    if root.is_dir():
        walk(root, depth)
    return found


class TeacherMp4Source:
    """The teacher's clip folder: one 8-bit RGB MP4 per modality, decoded frame by frame with PyAV;
    clip: read only `{clip}_{mod}.mp4` of a folder holding several clips."""

    kind = "teacher"

    def __init__(self, folder: Path, depth_near: float = DEFAULT_DEPTH_NEAR, clip: str | None = None):
        self.folder = folder
        self.files = clip_files(folder, clip) if clip is not None else self._find(folder)
        missing = [m for m in MODALITIES if m not in self.files]
        if missing:
            raise _missing(folder, missing, self.files)
        probes = {name: _probe_mp4(p) for name, p in self.files.items()}
        sizes = {name: (w, h) for name, (w, h, _, _) in probes.items()}
        if len(set(sizes.values())) > 1:
            desc = ", ".join(f"{self.files[n].name} is {w}x{h}" for n, (w, h) in sizes.items())
            raise AlayaError(f"{folder}: modalities disagree in size: {desc}")
        counts = {name: n for name, (_, _, n, _) in probes.items()}
        if all(counts.values()) and len(set(counts.values())) > 1:
            desc = ", ".join(f"{self.files[n].name} has {c}" for n, c in counts.items())
            raise AlayaError(f"{folder}: modalities disagree in frame count: {desc}")
        rates = {name: r for name, (_, _, _, r) in probes.items() if r}
        if len({round(r, 3) for r in rates.values()}) > 1:
            desc = ", ".join(f"{self.files[n].name} at {r:g} fps" for n, r in rates.items())
            raise AlayaError(f"{folder}: modalities disagree in frame rate ({desc}); export every pass at one rate")
        w, h, n, fps = probes["albedo"]
        self.info = StreamInfo(w, h, fps or DEFAULT_FPS, n or None, depth_near, "srgb", layout="teacher-mp4",
                               source=str(folder / clip if clip is not None else folder))
        naming = "{mod}.mp4" if self.files["albedo"].name == "albedo.mp4" else "{clip}_{mod}.mp4"
        self.description = f"teacher-mp4 ({naming}{', with rgb ground truth' if 'rgb' in self.files else ''})"

    @staticmethod
    def _find(folder: Path) -> dict[str, Path]:
        files = {}
        mp4s = sorted(p for p in folder.iterdir() if p.suffix.lower() == ".mp4")
        for name in MODALITIES + _EXTRA_NAMES:
            exact = [p for p in mp4s if p.stem == name or p.stem == f"{folder.name}_{name}"]
            loose = [p for p in mp4s if _modality_of(p) == name]
            pick = exact or loose
            if len(pick) > 1:
                raise AlayaError(f"{folder}: several MP4s for {name}: {', '.join(p.name for p in pick)}")
            if pick:
                files[name] = pick[0]
        return files

    def frames(self, start: int, stop: int | None, stride: int):
        import av

        names = list(self.files)
        containers = [_open_mp4(self.files[n]) for n in names]
        try:
            decoders = [c.decode(video=0) for c in containers]
            i = 0
            while stop is None or i < stop:
                got = {}
                for name, dec in zip(names, decoders):
                    try:
                        got[name] = next(dec, None)
                    except (av.error.FFmpegError, ValueError) as err:
                        raise AlayaError(f"{self.files[name]}: corrupt or truncated MP4 at frame {i} ({err})") from None
                ended = [n for n, f in got.items() if f is None]
                if len(ended) == len(names):
                    return
                if ended:
                    longer = [self.files[n].name for n in names if n not in ended]
                    raise AlayaError(f"{self.folder}: modalities disagree in frame count: "
                                     f"{', '.join(self.files[n].name for n in ended)} ended after {i} frames, "
                                     f"{', '.join(longer)} {'has' if len(longer) == 1 else 'have'} more")
                if i >= start and (i - start) % stride == 0:
                    arrays = {}
                    for name, fr in got.items():
                        if (fr.width, fr.height) != (self.info.width, self.info.height):
                            raise AlayaError(f"{self.files[name]}: frame {i} is {fr.width}x{fr.height}, "
                                             f"expected {self.info.width}x{self.info.height}")
                        arrays[name] = fr.to_ndarray(format="rgb24")
                    images = np.stack([arrays[m] for m in MODALITIES])
                    extras = {n: arrays[n] for n in _EXTRA_NAMES if n in arrays}
                    for n in LIGHT_PASSES:
                        if n in extras:
                            extras[n] = light_plane(n, self.files[n], extras[n])
                    yield images, extras
                i += 1
        finally:
            for c in containers:
                c.close()


def _open_mp4(path: Path):
    import av

    try:
        return av.open(str(path))
    except (av.error.FFmpegError, OSError, ValueError) as err:
        raise AlayaError(f"{path}: not a readable MP4, corrupt or truncated ({err})") from None


def _probe_mp4(path: Path) -> tuple[int, int, int, float]:
    """(width, height, frame count or 0 if unknown, fps or 0) from the container header."""
    container = _open_mp4(path)
    try:
        if not container.streams.video:
            raise AlayaError(f"{path}: MP4 has no video stream")
        s = container.streams.video[0]
        rate = s.average_rate or s.guessed_rate
        if s.codec_context is None or not s.codec_context.width:  # a header too damaged to say its size
            raise AlayaError(f"{path}: not a readable MP4, corrupt or truncated (its video stream has no size)")
        return s.codec_context.width, s.codec_context.height, int(s.frames or 0), float(rate or 0)
    finally:
        container.close()


# ---------------------------------------------------------------------------------------------
# npy-windows


class NpyWindowsSource:
    """Sorted .npy windows, uint8 (T, 5, H, W, 3) each; headers checked on open, data memory-mapped."""

    kind = "teacher"

    def __init__(self, path: Path, depth_near: float = DEFAULT_DEPTH_NEAR):
        if path.is_file():
            files = [path]
        else:
            files = sorted((p for p in path.iterdir() if p.suffix.lower() == ".npy" and not p.name.startswith("rgb")),
                           key=natural_key)
        if not files:
            raise AlayaError(f"{path}: empty stream (no .npy windows)")
        self.files = files
        self.lengths = []
        hw = None
        for f in files:
            shape = _npy_window_shape(f)
            if hw is None:
                hw = shape[2:4]
            elif shape[2:4] != hw:
                raise AlayaError(f"{f}: window is {shape[3]}x{shape[2]}, {files[0].name} is {hw[1]}x{hw[0]}")
            self.lengths.append(shape[0])
        total = sum(self.lengths)
        if total == 0:
            raise AlayaError(f"{path}: empty stream (all windows have 0 frames)")
        folder = path if path.is_dir() else path.parent
        rgb = sorted(folder.glob("rgb*.npy"), key=natural_key) if path.is_dir() else []
        self.rgb_files = rgb if rgb else None
        if rgb and len(rgb) != len(files):
            raise AlayaError(f"{path}: {len(rgb)} rgb windows for {len(files)} G-buffer windows")
        self.info = StreamInfo(hw[1], hw[0], DEFAULT_FPS, total, depth_near, "srgb", layout="npy-windows",
                               source=str(path))
        self.description = f"npy-windows ({len(files)} window{'s' * (len(files) != 1)}, {total} frames)"

    def frames(self, start: int, stop: int | None, stride: int):
        stop = self.info.num_frames if stop is None else min(stop, self.info.num_frames)
        offset = 0
        for k, (f, n) in enumerate(zip(self.files, self.lengths)):
            wanted = [i for i in range(max(start, offset), min(stop, offset + n)) if (i - start) % stride == 0]
            if wanted:
                arr = _load_npy(f)
                rgb = _load_npy(self.rgb_files[k]) if self.rgb_files else None
                for i in wanted:
                    extras = {"rgb": np.array(rgb[i - offset])} if rgb is not None else {}
                    yield np.array(arr[i - offset]), extras  # copy: detach from the memory map
                del arr, rgb
            offset += n


def _npy_window_shape(path: Path) -> tuple[int, ...]:
    """Shape of a G-buffer window from its header; checks dtype, layout and file length."""
    from numpy.lib import format as npf

    try:
        with open(path, "rb") as f:
            major, _ = npf.read_magic(f)
            read_header = npf.read_array_header_1_0 if major == 1 else npf.read_array_header_2_0
            shape, _, dtype = read_header(f)
            data_start = f.tell()
    except (ValueError, OSError, EOFError) as err:
        raise AlayaError(f"{path}: not a readable .npy file, corrupt or truncated ({err})") from None
    if dtype != np.uint8 or len(shape) != 5 or shape[1] != 5 or shape[4] != 3:
        raise AlayaError(f"{path}: window is {dtype} {tuple(shape)}, expected uint8 (T, 5, H, W, 3) "
                         f"in order {', '.join(MODALITIES)}")
    expected = data_start + int(np.prod(shape))
    actual = path.stat().st_size
    if actual < expected:
        raise AlayaError(f"{path}: truncated .npy ({actual} bytes, header promises {expected})")
    return tuple(shape)


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        raise AlayaError(f"{path}: not a readable .npy file ({err})") from None


# ---------------------------------------------------------------------------------------------
# image-sequence


class ImageSequenceSource:
    """PNG/EXR frames: per-modality folders, modality-named files, or multi-layer (multi-part) EXRs.

    Float EXR passes are converted from the engine convention (`conventions`) to canonical form;
    8-bit PNG passes are teacher form already (convention alaya only)."""

    def __init__(self, folder: Path, depth_near: float = DEFAULT_DEPTH_NEAR, nan_policy: str = "error",
                 conventions: str = "auto", world_normals: str = "error", depth_far: float | None = None):
        self.folder, self.depth_near, self.nan_policy = folder, depth_near, nan_policy
        self.world_normals, self.depth_far = world_normals, depth_far
        self.files, style = self._find(folder)  # name -> [paths] (multilayer: name "frames")
        self.multilayer = style == "multi-layer EXR"
        if self.multilayer:
            first = self.files["frames"][0]
            chans = read_exr(first)
            groups = cv.group_channels(chans)
            if "smoothness" in groups and "roughness" not in groups:
                groups["roughness"] = groups.pop("smoothness")
            missing = [m for m in MODALITIES if m not in groups]
            if missing:
                raise AlayaError(f"{first}: multi-layer EXR lacks modality {', '.join(missing)} "
                                 f"(channels: {', '.join(sorted(chans))})")
            h, w = next(iter(chans.values())).shape
            for name in LIGHT_PASSES:
                if name in self.files and len(self.files[name]) != len(self.files["frames"]):
                    raise AlayaError(f"{folder}: {len(self.files[name])} {name} files for "
                                     f"{len(self.files['frames'])} multi-layer EXR frames; give one a frame")
            self.layers = tuple(n for n in LIGHT_PASSES if n in groups)  # light passes as layers: the first frame's
            self.has_rgb = all(c in chans for c in "RGB") or "rgb" in groups
            self.kind = "canonical"
            self.exr_only = True
            names = list(chans)
        else:
            if "smoothness" in self.files and "roughness" not in self.files:
                self.files["roughness"] = self.files.pop("smoothness")
                self.smoothness = True
            missing = [m for m in MODALITIES if m not in self.files]
            if missing:
                raise _missing(folder, missing, self.files)
            self.files = {n: v for n, v in self.files.items() if n in MODALITIES + _EXTRA_NAMES}
            counts = {n: len(v) for n, v in self.files.items()}
            if len(set(counts.values())) > 1:
                desc = ", ".join(f"{n} has {c}" for n, c in counts.items())
                raise AlayaError(f"{folder}: modalities disagree in frame count: {desc} files")
            if not counts["albedo"]:
                raise AlayaError(f"{folder}: empty stream (no frames)")
            sizes, eight_bit = {}, True
            names = [str(p.relative_to(folder)) for v in self.files.values() for p in v[:1]]
            for name, paths in self.files.items():
                p = paths[0]
                if p.suffix.lower() == ".png":
                    w_, h_, bits, _ = png_header(p)
                    eight_bit &= bits <= 8
                else:
                    chans = read_exr(p)
                    h_, w_ = next(iter(chans.values())).shape
                    names += list(chans)
                    eight_bit = False
                sizes[name] = (w_, h_)
            if len(set(sizes.values())) > 1:
                desc = ", ".join(f"{self.files[n][0].name} is {w_}x{h_}" for n, (w_, h_) in sizes.items())
                raise AlayaError(f"{folder}: modalities disagree in size: {desc}")
            w, h = sizes["albedo"]
            self.kind = "teacher" if eight_bit else "canonical"
            self.exr_only = all(v[0].suffix.lower() == ".exr" for n, v in self.files.items() if n in MODALITIES)
        n = len(next(iter(self.files.values())))
        if n == 0:
            raise AlayaError(f"{folder}: empty stream (no frames)")
        self.convention = self._pick_convention(conventions, names)
        camera_file = folder / cv.CAMERA_FILE
        self.camera = cv.load_camera(camera_file, self.convention.camera_axes) if camera_file.is_file() else None
        self.checks = cv.FrameChecks(str(folder), self.convention,
                                     self.camera if self.convention.normal_space == "world" else None)
        if self.convention.normal_space == "world" and self.camera is None:
            if world_normals == "error":  # fail on open, before anything is written
                raise AlayaError(f"{folder}: {self.convention.name} normals are in world space and no {cv.CAMERA_FILE} "
                                 f"gives the camera rotation; write {cv.CAMERA_FILE} beside the passes "
                                 f"(docs/gbuffers.md, camera.json), or {cv.KEEP_WORLD_NORMALS}")
            log.warning("%s: %s normals are in world space and there is no %s: using them unconverted "
                        "(world_normals=keep); the model expects camera-space normals", folder,
                        self.convention.name, cv.CAMERA_FILE)
        self.info = StreamInfo(w, h, DEFAULT_FPS, n, depth_near, "srgb" if self.kind == "teacher" else "linear",
                               normal_space="camera-opengl" if self.convention.normal_space == "camera" or self.camera
                               else f"world-{self.convention.name}",
                               layout="image-sequence", source=str(folder))
        exts = sorted({p.suffix.lower().lstrip(".") for v in self.files.values() for p in v[:1]})
        conv = "" if self.convention.name == "alaya" else f", {self.convention.name} conventions"
        self.description = f"image-sequence ({style}, {'/'.join(exts)}{conv})"

    smoothness = False

    def _pick_convention(self, choice: str, names: list[str]) -> cv.Convention:
        if choice == "auto":
            choice, why = cv.detect_convention(names)
            exr = next((v[0] for v in self.files.values() if v[0].suffix.lower() == ".exr"), None)
            software = exr_software(exr) if exr is not None and choice == "alaya" else None
            if software and software.lower().startswith("blender"):  # File Output items named like ours
                choice, why = "blender", f"EXR header: written by {software}"
            if self.kind == "teacher":
                choice, why = "alaya", "8-bit passes are teacher form"
            log.info("%s: conventions auto: %s (%s)", self.folder, choice, why)
        elif self.kind == "teacher" and choice != "alaya":
            raise AlayaError(f"{self.folder}: {choice} conventions apply to float EXR passes; these are 8-bit PNGs "
                             "in teacher form (use --conventions alaya or auto, or export EXR)")
        return cv.CONVENTIONS[choice]

    @staticmethod
    def _find(folder: Path) -> tuple[dict[str, list[Path]], str]:
        def images(d: Path) -> list[Path]:
            return sorted((p for p in d.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file()), key=natural_key)

        subdirs = {m: folder / m for m in MODALITIES + _EXTRA_NAMES if (folder / m).is_dir()}
        if not subdirs:  # engines' per-pass folders (Unreal MRQ's {render_pass}/..., BaseColor/, SceneDepth/)
            for d in sorted(p for p in folder.iterdir() if p.is_dir()):
                mod = cv.pass_of(d.name, file_name=True)
                if mod and mod not in subdirs:
                    subdirs[mod] = d
        if subdirs:
            found = {m: images(d) for m, d in subdirs.items()}
            root = images(folder)  # RGB frames next to the pass folders (as PngSequenceSink writes them)
            if root and "rgb" not in found:
                found["rgb"] = root
            return found, "one folder per modality"
        flat = images(folder)
        if not flat:
            raise AlayaError(f"{folder}: empty stream (no PNG or EXR images)")
        grouped: dict[str, list[Path]] = {}
        for p in flat:
            mod = _modality_of(p, engines=True)
            if mod:
                grouped.setdefault(mod, []).append(p)
        if grouped and not (set(grouped) <= set(_EXTRA_NAMES) and all(p.suffix.lower() == ".exr" for p in flat)):
            return grouped, "modality in file names"
        if all(p.suffix.lower() == ".exr" for p in flat):  # light passes may sit beside them in files of their own
            side = {n: grouped[n] for n in LIGHT_PASSES if n in grouped}
            taken = {p for paths in side.values() for p in paths}
            return {"frames": [p for p in flat if p not in taken], **side}, "multi-layer EXR"
        raise AlayaError(f"{folder}: unknown layout: images carry no modality in their names "
                         f"(expected e.g. albedo_0000.png or albedo/0000.png)")

    def frames(self, start: int, stop: int | None, stride: int):
        n = self.info.num_frames
        for i in range(start, n if stop is None else min(stop, n), stride):
            yield self._read(i)

    def _read(self, i: int):
        if self.multilayer:
            return self._read_multilayer(self.files["frames"][i], i)
        passes, extras = {}, {}
        for name, paths in self.files.items():
            p = paths[i]
            arr = read_png(p) if p.suffix.lower() == ".png" else read_exr(p)
            if isinstance(arr, dict):
                hw = next(iter(arr.values())).shape
            else:
                hw = arr.shape[:2]
            if hw != self.info.size:
                raise AlayaError(f"{p}: image is {hw[1]}x{hw[0]}, expected {self.info.width}x{self.info.height}")
            (extras if name in _EXTRA_NAMES else passes)[name] = (p, arr)
        if self.kind == "teacher":
            images = np.stack([_as_teacher_pass(m, *passes[m]) for m in MODALITIES])
            return images, {n: light_plane(n, *v) if n in LIGHT_PASSES else _as_teacher_pass("albedo", *v)
                            for n, v in extras.items()}
        raw = {}
        for m in MODALITIES:
            p, arr = passes[m]
            if isinstance(arr, dict):
                raw[m] = self._exr_pass(m, p, _strip_layers(arr), smoothness=m == "roughness" and self.smoothness)
            else:
                raw[m] = _decode_pass(m, p, arr, self.depth_near)
        frame = self._canonical(raw, {m: passes[m][0] for m in MODALITIES}, i,
                                float_passes={m for m in MODALITIES if isinstance(passes[m][1], dict)})
        ext = {}
        for n, (p, arr) in extras.items():
            if n in LIGHT_PASSES:
                ext[n] = light_plane(n, p, arr)
            else:
                ext[n] = _as_teacher_pass("albedo", p, arr) if not isinstance(arr, dict) else _exr_rgb_u8(p, _strip_layers(arr))
        return frame, ext

    def _exr_pass(self, m: str, p: Path, chans: dict, prefix: str = "", smoothness: bool = False) -> np.ndarray:
        alpha = next((chans[c] for c in ("A", "a", "alpha") if c in chans), None) if m == "albedo" else None
        arr = _decode_exr_pass(m, p, chans, prefix=prefix)
        if alpha is not None:  # premultiplied by coverage (Blender's colour AOVs): divide it out
            partial = (alpha > 0) & (alpha < 0.999)
            if partial.any():
                arr = np.where(partial[..., None], arr / np.where(partial, alpha, 1.0)[..., None], arr)
                arr = np.ascontiguousarray(arr, dtype=np.float32)
            if partial.mean() > 0.25:  # coverage is partial at edges only; this is something else
                self.checks.warn("albedo-alpha", f"{p}: albedo alpha ({prefix}A) is below 1 on {partial.mean():.0%} "
                                                 "of pixels: read as coverage (colour divided by alpha); if it is "
                                                 "opacity, export albedo as RGB without alpha")
        return (1.0 - arr).astype(np.float32) if smoothness else arr

    def _canonical(self, raw: dict, paths: dict, i: int, float_passes=frozenset(MODALITIES)) -> GBufferFrame:
        conv = self.convention
        if "depth" in float_passes:
            self.checks.raw_depth(raw["depth"], paths["depth"])
        if conv.name != "alaya" or self.depth_far is not None:
            if "depth" in float_passes:
                raw["depth"] = cv.convert_depth(raw["depth"], conv, self.camera, paths["depth"], self.depth_far)
        if conv.name != "alaya":
            if "normal" in float_passes:
                raw["normal"] = cv.to_camera_normals(raw["normal"], conv, self.camera, i, paths["normal"],
                                                     self.world_normals)
            if "albedo" in float_passes:
                raw["albedo"] = cv.convert_albedo(raw["albedo"], conv)
            if "normal" in float_passes:  # canonical background: (0, 0, 1) wherever depth says nothing was hit
                raw["normal"][np.isposinf(raw["depth"])] = (0.0, 0.0, 1.0)
        frame = GBufferFrame(0, 0.0, **raw)
        self._check_finite(frame, paths)
        self.checks.canonical(frame.albedo, frame.depth, frame.metallic, frame.normal, paths["normal"])
        return frame

    def _read_multilayer(self, p: Path, i: int = 0):
        chans = read_exr(p)
        hw = next(iter(chans.values())).shape
        if hw != self.info.size:
            raise AlayaError(f"{p}: image is {hw[1]}x{hw[0]}, expected {self.info.width}x{self.info.height}")
        groups = cv.group_channels(chans)
        smooth = "smoothness" in groups and "roughness" not in groups
        if smooth:
            groups["roughness"] = groups.pop("smoothness")
        for m in MODALITIES:  # the first frame had them all: name this frame's first gap
            if m not in groups:
                want = " or ".join("/".join(f"{m}.{c}" for c in o) for o in _EXR_NAMES[m])
                raise AlayaError(f"{p}: {m} EXR needs channels {want} (has none); the file has channels: "
                                 f"{', '.join(sorted(chans))}")
        raw = {}
        for m in MODALITIES:
            layer, layer_chans = groups[m]
            raw[m] = self._exr_pass(m, p, layer_chans, prefix=f"{layer}.", smoothness=m == "roughness" and smooth)
        frame = self._canonical(raw, {m: p for m in MODALITIES}, i)
        extras = {}
        if self.has_rgb:
            rgb = {c: chans[c] for c in "RGB" if c in chans}
            extras["rgb"] = _exr_rgb_u8(p, rgb if len(rgb) == 3 else groups["rgb"][1])
        for name in LIGHT_PASSES:
            if (name in groups) != (name in self.layers):  # a layer in some frames only
                first = self.files["frames"][0].name
                raise AlayaError(f"{p}: " + (f"has a {name} layer but {first} has none" if name in groups else
                                             f"has no {name} layer ({name}.Y) but {first} has one")
                                 + f"; a stream carries the {name} pass with every frame or never")
            if name in groups:
                extras[name] = light_plane(name, p, groups[name][1])
            elif name in self.files:  # in files of its own
                side = self.files[name][i]
                arr = read_png(side) if side.suffix.lower() == ".png" else read_exr(side)
                plane = light_plane(name, side, arr)
                if plane.shape != hw:
                    raise AlayaError(f"{side}: image is {plane.shape[1]}x{plane.shape[0]}, expected {hw[1]}x{hw[0]}")
                extras[name] = plane
        return frame, extras

    def _check_finite(self, frame: GBufferFrame, paths: dict[str, Path]) -> None:
        for name in MODALITIES:
            arr = getattr(frame, name)
            bad = (np.isnan(arr) | (arr == -np.inf)) if name == "depth" else ~np.isfinite(arr)
            if bad.ndim == 3:
                bad = bad.any(-1)
            count = int(bad.sum())
            if not count:
                continue
            y, x = (int(v) for v in np.argwhere(bad)[0])
            what = "NaN/-Inf" if name == "depth" else "NaN/Inf"
            msg = f"{paths[name]}: {name} has {count} {what} pixel{'s' * (count != 1)}, first at (x={x}, y={y})"
            if self.nan_policy == "error":
                raise AlayaError(msg + "; use nan_policy='fix' (--nan-policy fix) to replace them with background")
            log.warning("%s; replaced with background (nan_policy=fix)", msg)
            fill = {"depth": np.inf, "normal": np.float32([0, 0, 1])}.get(name, 0.0)
            arr[bad] = fill
        negative = frame.depth < 0
        if negative.any():  # encoded, it would read as "closer than near": wrong, not background
            y, x = (int(v) for v in np.argwhere(negative)[0])
            raise AlayaError(f"{paths['depth']}: depth has {int(negative.sum())} negative pixel(s), first at (x={x}, y={y}), "
                             f"value {float(frame.depth[y, x]):g}: depth is a distance along the view axis, >= 0 "
                             "(a reversed or NDC depth needs converting first)")


def light_plane(name: str, path: Path, arr) -> np.ndarray:
    """A light pass image (LIGHT_PASSES `name`) -> uint8 (H, W), 255 = seen (the sun, the whole sky): 8-bit as
    is, 16-bit scaled, float (an EXR's channels) clamped to [0, 1]; colour channels averaged, alpha dropped."""
    if isinstance(arr, dict):
        chans = _strip_layers(arr)
        names = [c for c in ("R", "G", "B") if c in chans] or [c for c in chans if c not in ("A", "a", "alpha")]
        if not names:
            raise AlayaError(f"{path}: the {name} pass has no colour channel (channels: {', '.join(sorted(chans))})")
        v = np.mean([np.asarray(chans[c], np.float32) for c in names], axis=0)
        if not np.isfinite(v).all():
            raise AlayaError(f"{path}: the {name} pass has NaN/Inf pixels; it is {LIGHT_PASS_MEANING[name]}, 0 to 1")
        return np.rint(np.clip(v, 0.0, 1.0) * 255).astype(np.uint8)
    arr = np.asarray(arr)
    if arr.ndim == 3:
        arr = arr[..., :3].mean(-1) if arr.shape[-1] >= 3 else arr[..., 0]
    scale = 255.0 / 65535.0 if arr.dtype == np.uint16 else 1.0
    return np.rint(arr.astype(np.float32) * scale).clip(0, 255).astype(np.uint8)


def _as_teacher_pass(name: str, path: Path, arr: np.ndarray) -> np.ndarray:
    """8-bit PNG pass -> (H, W, 3) uint8 exactly as the teacher reads it (gray replicated)."""
    if arr.ndim == 2:
        if name in ("albedo", "normal"):
            raise AlayaError(f"{path}: {name} has 1 channel, expected 3 (RGB)")
        return np.repeat(arr[..., None], 3, axis=-1)
    return arr


def _decode_pass(name: str, path: Path, arr, depth_near: float) -> np.ndarray:
    """One pass from a PNG (teacher encoding, 8 or 16 bit) or an EXR (canonical float)."""
    if isinstance(arr, dict):
        return _decode_exr_pass(name, path, arr)
    if arr.ndim == 2 and name in ("albedo", "normal"):
        raise AlayaError(f"{path}: {name} has 1 channel, expected 3 (RGB)")
    x = arr.astype(np.float32) / (65535.0 if arr.dtype == np.uint16 else 255.0)
    if name == "albedo":
        return srgb_to_linear(x)
    if name == "normal":
        n = x * 2.0 - 1.0
        norm = np.linalg.norm(n, axis=-1, keepdims=True)
        return np.where(norm > 1e-6, n / np.maximum(norm, 1e-6), np.float32([0, 0, 1])).astype(np.float32)
    x = x[..., 0] if x.ndim == 3 else x
    if name == "depth":
        with np.errstate(divide="ignore"):
            return np.where(x > 0, depth_near / x, np.inf).astype(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


_EXR_NAMES = {
    "albedo": (("R", "G", "B"),),
    "normal": (("X", "Y", "Z"), ("R", "G", "B"), ("x", "y", "z")),
    "depth": (("Z",), ("depth",), ("Y",), ("R",), ("z",), ("V",), ("X",)),
    "metallic": (("Y",), ("metallic",), ("R",), ("V",), ("X",)),
    "roughness": (("Y",), ("roughness",), ("R",), ("V",), ("X",)),
}


def _strip_layers(chans: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A one-pass EXR whose channels carry one layer prefix (`ViewLayer.Depth.Z`, `Seq.WorldNormal.R`)
    -> bare channel names; anything else unchanged."""
    if all("." in c for c in chans):
        layers = {c.rsplit(".", 1)[0] for c in chans}
        if len(layers) == 1:
            return {c.rsplit(".", 1)[1]: v for c, v in chans.items()}
    return chans


def _decode_exr_pass(name: str, path: Path, chans: dict[str, np.ndarray], prefix: str = "") -> np.ndarray:
    """Pick a pass's channels from an EXR: albedo RGB, normal XYZ or RGB, single passes Z/Y/R or the only one."""
    for option in _EXR_NAMES[name]:
        if all(c in chans for c in option):
            picked = [chans[c] for c in option]
            break
    else:
        if PASS_CHANNELS[name] == 1 and len(chans) == 1:
            picked = list(chans.values())
        else:
            want = " or ".join("/".join(prefix + c for c in o) for o in _EXR_NAMES[name])
            have = ", ".join(prefix + c for c in sorted(chans)) or "none"
            raise AlayaError(f"{path}: {name} EXR needs channels {want} (has {have})")
    arr = picked[0] if len(picked) == 1 else np.stack(picked, axis=-1)
    return np.ascontiguousarray(arr, dtype=np.float32)



def _exr_rgb_u8(path: Path, chans: dict[str, np.ndarray]) -> np.ndarray:
    """Linear float RGB from an EXR -> sRGB uint8 (H, W, 3), the form extras["rgb"] takes."""
    if not all(c in chans for c in "RGB"):
        raise AlayaError(f"{path}: rgb EXR needs channels R, G, B (has {', '.join(sorted(chans))})")
    rgb = np.stack([np.nan_to_num(chans[c], nan=0.0) for c in "RGB"], -1)
    return np.clip(np.rint(linear_to_srgb(rgb) * 255), 0, 255).astype(np.uint8)
