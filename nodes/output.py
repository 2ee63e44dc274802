"""Output nodes: Save (mp4 / png / exr / npy through streaming/files/sinks.py) and Stream Preview.

Both are sink stages: they write as frames come (the runner's memory stays flat), into
`name.tmp`, and move the result into place when the stream ends; an error or interruption
removes the temporary output (abort), so no partial file is ever left at the destination.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from . import comfy
from .base import Piecewise, StageNode, refuse

CATEGORY = "alaya-flash/output"
FORMATS = ["mp4", "png", "exr", "npy"]
EMPTY_FILENAME = "filename is empty: name the output file (mp4) or folder (png, exr, npy)"
NUL_FILENAME = "filename holds a NUL character (\\x00), which no file name may hold"


class Save(StageNode):
    DESCRIPTION = ("Write the rendered frames: mp4 (H.264 video), png / exr (numbered frame folder), or npy "
                   "(windows of 16 frames, with the G-buffers: training-data layout). Connect the G-buffers to also "
                   "write the aligned passes (png, exr, npy). Frames are encoded on a background thread while the next chunk "
                   "renders. Relative paths start at ComfyUI's output folder.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("images", "gbuffers")
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                # lazy: ComfyUI runs Save's check_lazy_status, which checks the output, before the render
                "images": ("IMAGE", {"lazy": True, "tooltip": "Frames to write (IMAGE [T, H, W, 3] in [0, 1])."}),
                "filename": ("STRING", {"default": "alaya-flash/render.mp4", "tooltip": "Output file (mp4) or folder (png, exr, npy); relative to ComfyUI's output folder (the current folder outside ComfyUI)."}),
                "format": (FORMATS, {"default": "mp4", "tooltip": "mp4: H.264 yuv420p; png: 8-bit frames; exr: float32 linear frames; npy: uint8 windows (needs G-buffers)."}),
                "fps": ("FLOAT", {"default": 16.0, "min": 1.0, "max": 240.0, "tooltip": "Frame rate of the video (mp4)."}),
                "overwrite": ("BOOLEAN", {"default": False, "tooltip": "Replace an existing output (it is replaced only once the new one is complete); a folder only when alaya-flash wrote it or it is empty."}),
            },
            "optional": {
                "gbuffers": ("ALAYA_GBUFFERS", {"tooltip": "The input G-buffers, written beside the frames (png, exr, npy)."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, filename):
        # ComfyUI repeats a returned message on every input named here (it showed each of these three
        # times when this took filename, format and overwrite): what needs the others is check_values
        return EMPTY_FILENAME if not filename.strip() else NUL_FILENAME if "\x00" in filename else True

    @staticmethod
    def check_values(filename, format="mp4", overwrite=False) -> list[str | None]:
        """What would stop the write: run by the runner's validation, and in ComfyUI by check_lazy_status
        (before the frames are rendered) and when the node starts."""
        from ..streaming.files.sinks import replace_refusal

        if not filename.strip() or "\x00" in filename:
            return []  # VALIDATE_INPUTS says so (and an empty path is refused by name when writing)
        path = destination(filename, format)
        if path.exists() and not overwrite:
            return [f"output {path} already exists (set overwrite to replace it)"]
        return [replace_refusal(path, format != "mp4")]

    def check_lazy_status(self, filename, format, fps, overwrite, images=None, gbuffers=None):
        """ComfyUI asks this before it computes `images` (lazy): the output is checked first, so a
        render that could not be saved never starts."""
        refuse("Save", self.check_values(filename, format, overwrite))
        return ["images"] if images is None else []

    def start_stream(self, filename, format, fps, overwrite):
        refuse("Save", self.check_values(filename, format, overwrite))
        return Piecewise(_Saving(destination(filename, format), format, fps, overwrite), 16)


def destination(filename: str, format: str) -> Path:
    """The output path: mp4 gets a .mp4 suffix when it has none; sequences are folders."""
    path = comfy.output_path(filename)
    if format == "mp4" and path.name and path.suffix.lower() != ".mp4":  # no name: AtomicOutput says so
        path = path.with_name(path.name + ".mp4")
    return path


class _Saving:
    """streaming.files.sinks.FrameWriter with the node's UI result: inside ComfyUI an mp4 in the output
    folder shows on the node and in the queue as a video (ComfyUI's SaveVideo form); frame folders,
    and files written elsewhere, show their last frame (a PNG in ComfyUI's temp folder)."""

    def __init__(self, path: Path, format: str, fps: float, overwrite: bool):
        from ..streaming.files.sinks import FrameWriter

        self.format, self.last = format, None
        self.inner = FrameWriter(path, format, fps, overwrite)

    def step(self, images=None, gbuffers=None):
        if images is not None and len(images):
            self.last = images[-1]
        self.inner.step(images, gbuffers)

    def flush(self):
        out = self.inner.flush()
        ui = {"text": [f"wrote {self.inner.count} frames to {out}" if out else "no frames written"]}
        video = comfy.view_entry(out) if out is not None and self.format == "mp4" else None
        if video is not None:
            ui.update(images=[video], animated=(True,))
        elif self.last is not None:
            still = comfy.preview_entry(self.last, f"save-{uuid.uuid4().hex[:8]}")
            if still is not None:
                ui["images"] = [still]
        return {"ui": ui}

    def abort(self):
        self.inner.abort()


class StreamPreview(StageNode):
    DESCRIPTION = ("Show the stream as it renders: the newest frame is written to a JPEG (replaced atomically "
                   "every chunk, for a live page or an image viewer) and, inside ComfyUI, shown on the progress bar.")
    CATEGORY = CATEGORY
    STREAM_INPUTS = ("images",)
    RETURN_TYPES = ()
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE", {"tooltip": "Frames to show."}),
            "filename": ("STRING", {"default": "alaya-flash/latest.jpg", "tooltip": "JPEG holding the newest frame; relative to ComfyUI's output folder (the current folder outside ComfyUI). Empty: no file."}),
        }}

    def start_stream(self, filename):
        return _Previewing(comfy.output_path(filename) if filename else None)


class _Previewing:
    def __init__(self, path: Path | None):
        self.path, self.frames, self.last = path, 0, None
        self.bar = comfy.Progress(1)

    def step(self, images):
        if images is None or not len(images):
            return
        self.frames += len(images)
        last = self.last = images[-1]
        if self.path is not None:
            from PIL import Image

            from ..streaming.files.sinks import to_uint8

            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            Image.fromarray(to_uint8(last[None])[0]).save(tmp, format="JPEG", quality=90)
            os.replace(tmp, self.path)
        self.bar.done = 0
        self.bar.update(1, preview=last)

    def flush(self):
        ui = {"text": [f"previewed {self.frames} frames"]}
        still = comfy.preview_entry(self.last, f"preview-{uuid.uuid4().hex[:8]}") if self.frames else None
        if still is not None:
            ui["images"] = [still]
        return {"ui": ui}


NODES = {
    "AlayaFlash_Save": (Save, "Save (Alaya Flash)"),
    "AlayaFlash_StreamPreview": (StreamPreview, "Stream Preview (Alaya Flash)"),
}
