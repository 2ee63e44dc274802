"""Long shots in frame ranges (`batch --split N --preroll P`): the part jobs, the stage that drops a
part's pre-roll frames, and the assembly of the parts into the shot's output.

Part i renders output frames [a, b) of the shot (b - a = N, the last part shorter) by reading from
a - P: the P pre-roll frames warm up the stream state (KV cache, codec memories, the decoder's
lag) and are dropped before the Save node, which writes the part as a lossless frame folder
(PNG, or EXR for an EXR output) in a hidden folder beside the output. When every part is done
the frames are joined in order into the shot's output (an MP4 is encoded once, from the PNGs).
Each part is its own stream from its own first frame, so a split shot is not the unsplit render:
the seam (docs/runner.md, "Long shots") is measured by benchmarks/batch_seam.py.
"""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

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


def part_ranges(frames: int, split: int, preroll: int) -> list[tuple[int, int, int]]:
    """(read_from, first_kept, end) in shot frames for each part: [first_kept, end) is written,
    read_from = max(0, first_kept - preroll)."""
    return [(max(0, a - preroll), a, min(a + split, frames)) for a in range(0, frames, split)]


def part_jobs(wf, name: str, source: str, save: str, frames: int, split: int, preroll: int) -> list[dict]:
    """The API-format workflow of each part of a shot (its Save node writing a lossless frame folder)."""
    spec = wf.nodes[save]
    if isinstance(spec.inputs.get("gbuffers"), Link):
        raise AlayaError(f"--split: the Save node {save} also writes the G-buffers; split shots write frames only")
    fmt = spec.inputs.get("format", "mp4")
    if fmt not in PART_FORMAT:
        raise AlayaError(f"--split: Save format {fmt!r} cannot be joined from parts; use mp4, png or exr")
    src = wf.nodes[source].inputs
    start, stride = src.get("start", 0), src.get("stride", 1)
    jobs = []
    ranges = part_ranges(frames, split, preroll)
    for i, (read_from, first, end) in enumerate(ranges):
        one = copy.deepcopy(wf)
        one.nodes[source].inputs.update(start=start + read_from * stride, frames=(end - read_from) * stride)
        one.nodes[TRIM] = NodeSpec(TRIM, {"images": one.nodes[save].inputs["images"], "drop": first - read_from})
        one.nodes[save].inputs.update(images=Link(TRIM, 0), filename=str(parts_folder(wf, save) / f"part-{i:04d}"),
                                      format=PART_FORMAT[fmt], overwrite=True)
        jobs.append({"name": f"{name} [{i + 1}/{len(ranges)}]", "workflow": one.to_api(), "frames_kept": end - first})
    return jobs


def parts_folder(wf, save: str) -> Path:
    from .shots import output_of

    final = output_of(wf, save)
    return final.with_name(f".{final.name}.parts")


def assemble(final: Path, fmt: str, fps: float, parts: list[Path]) -> int:
    """Join the parts' frame folders, in order, into the shot's output (atomically); returns frames."""
    from ..files.image_files import read_png
    from ..files.sinks import AtomicOutput, Mp4Sink

    ext = PART_FORMAT[fmt]
    frames = [p for part in parts for p in sorted(part.glob(f"*.{ext}"))]
    if fmt == "mp4":
        with Mp4Sink(final, fps=fps, overwrite=True) as sink:
            for p in frames:
                sink.write(read_png(p))
    else:
        out = AtomicOutput(final, overwrite=True, is_dir=True)
        try:
            for k, p in enumerate(frames):
                os.replace(p, out.tmp / f"{k:06d}.{ext}")
        except BaseException:
            out.abort()
            raise
        out.commit()
    return len(frames)


def remove_parts(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
