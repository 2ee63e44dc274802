"""Long shots in frame ranges (`batch --split N --preroll P --overlap O`): the part jobs, the stage
that drops a part's pre-roll frames, and the assembly of the parts into the shot's output.

Part i renders output frames [a, b) of the shot (b - a = N, the last part shorter), and every part
after the first also the O frames before a, which the previous part renders too; it reads from
a - O - P: the P pre-roll frames warm up the stream state (KV cache, codec memories, the decoder's
lag) and are dropped before the Save node, which writes the part as a lossless frame folder (PNG,
or EXR for an EXR output) in a hidden folder beside the output. When every part is done the
frames are joined in order into the shot's output (an MP4 is encoded once, from the PNGs), the O
frames two parts share crossfaded (the later part's weight rising (k + 1) / (O + 1)). Each part is
its own stream from its own first frame, so a split shot is not the unsplit render; the crossfade
spreads the difference between the two streams over O frames instead of one step. The seam
(docs/runner.md, "Long shots") is measured by benchmarks/batch_seam.py.
"""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import numpy as np

from ...model_zoo.errors import AlayaError
from ..render.runner import run_stage_whole
from ..render.workflow import Link, NodeSpec

TRIM = "AlayaFlash_BatchTrim"
PART_FORMAT = {"mp4": "png", "png": "png", "exr": "exr"}  # lossless frames for each output format


class Trim:
    """Drop the first `drop` frames of an IMAGE stream (a part's pre-roll); batch-internal, not a pack node."""

    STREAM, STREAM_INPUTS, RETURN_TYPES, FUNCTION, CATEGORY = "stage", ("images",), ("IMAGE",), "run", "alaya-flash/batch"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "drop": ("INT", {"default": 0, "min": 0, "max": 10_000_000})}}

    def start_stream(self, drop):
        return _Dropping(drop)

    run = run_stage_whole


class _Dropping:
    def __init__(self, drop: int):
        self.left = drop

    def step(self, images):
        if images is None:
            return (None,)
        cut = min(self.left, len(images))
        self.left -= cut
        return (images[cut:] if cut < len(images) else None,)

    def flush(self):
        return (None,)


NODES = {TRIM: Trim}


def shot_frames(wf, source: str, classes) -> int:
    """Frames the shot's source yields (the Load G-Buffers node's range), for cutting it into parts."""
    spec = wf.nodes[source]
    if spec.class_type != "AlayaFlash_LoadGBuffers":
        raise AlayaError(f"--split needs a Load G-Buffers source, not {spec.class_type}")
    inputs = {k: v for k, v in spec.inputs.items() if k != "chunk"}
    stream = classes[spec.class_type]()._stream(**inputs)
    if not stream.info.num_frames:
        raise AlayaError(f"{spec.inputs['path']}: its length is unknown, so it cannot be split into parts")
    return stream.info.num_frames


def part_ranges(frames: int, split: int, preroll: int, overlap: int = 0) -> list[tuple[int, int, int]]:
    """(read_from, first_written, end) in shot frames for each part: [first_written, end) is written,
    the first `overlap` of them (none for the first part) shared with the previous part, and
    read_from = max(0, first_written - preroll)."""
    out = []
    for a in range(0, frames, split):
        first = max(0, a - overlap)
        out.append((max(0, first - preroll), first, min(a + split, frames)))
    return out


def part_jobs(wf, name: str, source: str, save: str, frames: int, split: int, preroll: int,
              overlap: int = 0) -> list[dict]:
    """The API-format workflow of each part of a shot (its Save node writing a lossless frame folder);
    each job says how many of its first frames the previous part also wrote (`overlap`)."""
    spec = wf.nodes[save]
    if isinstance(spec.inputs.get("gbuffers"), Link):
        raise AlayaError(f"--split: the Save node {save} also writes the G-buffers; split shots write frames only")
    fmt = spec.inputs.get("format", "mp4")
    if fmt not in PART_FORMAT:
        raise AlayaError(f"--split: Save format {fmt!r} cannot be joined from parts; use mp4, png or exr")
    if overlap >= split:
        raise AlayaError(f"--overlap {overlap} must be below --split {split} (a part's frames crossfade into the next)")
    src = wf.nodes[source].inputs
    start, stride = src.get("start", 0), src.get("stride", 1)
    jobs = []
    ranges = part_ranges(frames, split, preroll, overlap)
    for i, (read_from, first, end) in enumerate(ranges):
        one = copy.deepcopy(wf)
        one.nodes[source].inputs.update(start=start + read_from * stride, frames=(end - read_from) * stride)
        one.nodes[TRIM] = NodeSpec(TRIM, {"images": one.nodes[save].inputs["images"], "drop": first - read_from})
        one.nodes[save].inputs.update(images=Link(TRIM, 0), filename=str(parts_folder(wf, save) / f"part-{i:04d}"),
                                      format=PART_FORMAT[fmt], overwrite=True)
        shared = ranges[i - 1][2] - first if i else 0  # frames the previous part wrote too
        jobs.append({"name": f"{name} [{i + 1}/{len(ranges)}]", "workflow": one.to_api(), "frames_kept": end - first,
                     "overlap": shared})
    return jobs


def parts_folder(wf, save: str) -> Path:
    from .shots import output_of

    final = output_of(wf, save)
    return final.with_name(f".{final.name}.parts")


def assemble(final: Path, fmt: str, fps: float, parts: list[Path], overlaps: list[int] | None = None) -> int:
    """Join the parts' frame folders, in order, into the shot's output (atomically); the first
    overlaps[i] frames of part i are crossfaded with the last ones of part i - 1. Returns frames."""
    from ..files.sinks import AtomicOutput, Mp4Sink

    ext = PART_FORMAT[fmt]
    folders = [sorted(part.glob(f"*.{ext}")) for part in parts]
    frames = _joined(folders, overlaps or [0] * len(parts))
    if fmt == "mp4":
        with Mp4Sink(final, fps=fps, overwrite=True) as sink:
            for frame in frames:
                sink.write(_read(frame, ext))
        return len(frames)
    out = AtomicOutput(final, overwrite=True, is_dir=True)
    try:
        for k, frame in enumerate(frames):
            if isinstance(frame, Path):
                os.replace(frame, out.tmp / f"{k:06d}.{ext}")
            else:
                _write(out.tmp / f"{k:06d}.{ext}", _read(frame, ext), ext)
    except BaseException:
        out.abort()
        raise
    out.commit()
    return len(frames)


def _joined(folders: list[list[Path]], overlaps: list[int]) -> list:
    """The output's frames in order: a part's frame file, or (earlier, later, later's weight) for a
    crossfaded one."""
    out: list = []
    for files, shared in zip(folders, overlaps):
        if shared > min(len(out), len(files)):
            raise AlayaError(f"joining the parts: {shared} frames should overlap, but a part has only "
                             f"{min(len(out), len(files))}")
        for k in range(shared):
            earlier = out[len(out) - shared + k]
            out[len(out) - shared + k] = (earlier, files[k], (k + 1) / (shared + 1))
        out.extend(files[shared:])
    return out


def _read(frame, ext: str):
    """A frame as written: uint8 (H, W, 3) for PNG, {channel: float32 (H, W)} for EXR; a crossfade's blend."""
    from ..files.image_files import read_exr, read_png

    if isinstance(frame, Path):
        return read_png(frame) if ext == "png" else read_exr(frame)
    earlier, later, w = frame
    a, b = _read(earlier, ext), _read(later, ext)
    if ext == "png":
        return np.clip(np.round((1 - w) * a.astype(np.float32) + w * b.astype(np.float32)), 0, 255).astype(np.uint8)
    return {c: (1 - w) * a[c] + w * b[c] for c in a}


def _write(path: Path, frame, ext: str) -> None:
    from ..files.image_files import write_exr, write_png

    write_png(path, frame) if ext == "png" else write_exr(path, frame)


def remove_parts(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
