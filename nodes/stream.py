"""Render G-Buffer Stream: the whole Flash render of a G-buffer clip on disk in one node, chunk by chunk.

Inside ComfyUI every node runs once over the whole sequence, so a graph of separate nodes holds the
whole clip in memory (G-buffers, latents, frames). This node reads the clip, encodes, samples, decodes,
refines and writes it a chunk at a time through the one chunk loop (streaming/render/driver.py), as
`alaya-flash run` does, so its memory stays flat however long the clip; the frames are those of the
render workflow for the same seed and chunk. Its optional light reaches the refiner as Refine's does.
"""
from __future__ import annotations

from . import comfy
from .base import refuse
from .gbuffers import LoadGBuffers, _chunk_input
from .output import FORMATS, Save, _Saving, destination
from .models import RefinerHandle
from .render import LIGHT, SEED, FlashSampler, _own, flash_settings, refiner_lights

CATEGORY = "alaya-flash/render"


class RenderGBufferStream:
    DESCRIPTION = ("Render a G-buffer clip on disk with a Flash model and write it, chunk by chunk: read, encode, "
                   "sample, decode, refine and save in one node, so memory stays flat however long the clip (a graph "
                   "of separate nodes holds the whole clip in memory inside ComfyUI). The frames are those of "
                   "Load G-Buffers -> Encode G-Buffers -> Flash Sampler -> Decode -> Refine -> Save.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "render"

    @classmethod
    def INPUT_TYPES(cls):
        load = LoadGBuffers.INPUT_TYPES()["required"]
        sampler = FlashSampler.INPUT_TYPES()["required"]
        save = Save.INPUT_TYPES()["required"]
        return {"required": {
            "model": ("ALAYA_FLASH", {"tooltip": "From Load Flash Model (its encoder, decoder and refiner are used)."}),
            "prompt": ("ALAYA_PROMPT", {"tooltip": "From Encode Prompt (a prompt or a schedule keyed by frame)."}),
            "path": load["path"],
            "start": load["start"],
            "frames": load["frames"],
            "width": load["width"],
            "height": load["height"],
            "chunk": _chunk_input(),
            "seed": SEED,
            "steps": sampler["steps"],
            "chunk_frames": sampler["chunk_frames"],
            "window_frames": sampler["window_frames"],
            "sink_frames": sampler["sink_frames"],
            "filename": ("STRING", {"default": "alaya-flash/stream.mp4", "tooltip": save["filename"][1]["tooltip"]}),
            "format": (FORMATS, {"default": "mp4", "tooltip": save["format"][1]["tooltip"]}),
            "fps": save["fps"],
            "overwrite": save["overwrite"],
        }, "optional": {
            "light": (LIGHT, {"tooltip": "The light, frame by frame (Light, Light From Prompt), for a model whose refiner "
                                         "reads the light; unconnected: the prompt's. A model whose refiner does not read "
                                         "the light refuses one."}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, path):
        return LoadGBuffers.VALIDATE_INPUTS(path)

    @classmethod
    def IS_CHANGED(cls, path, **_):
        return LoadGBuffers.IS_CHANGED(path)

    def render(self, model, prompt, path, start, frames, width, height, chunk, seed, steps, chunk_frames, window_frames,
               sink_frames, filename, format, fps, overwrite, light=None):
        from ..streaming.render.cpu import cpu_plan
        from ..streaming.render.driver import StageGraph, Step, drive
        from ..streaming.render.pipelines import flash_steps

        named = Save.VALIDATE_INPUTS(filename)  # checked here: this node's VALIDATE_INPUTS takes only `path`
        refuse("Render G-Buffer Stream", FlashSampler.check_values(steps, chunk_frames, window_frames, sink_frames)
               + [None if named is True else named] + Save.check_values(filename, format, overwrite))
        lights = refiner_lights("Render G-Buffer Stream", RefinerHandle(model.refiner, model), prompt, light)
        source = LoadGBuffers().open_stream(path, "auto", start, frames, 1, "stretch", width, height, chunk)
        steps_ = flash_steps(model, prompt, seed, lights=lights, steps=_own(steps), chunk_frames=_own(chunk_frames),
                             window_frames=_own(window_frames), sink_frames=_own(sink_frames))
        saving = _Saving(destination(filename, format), format, fps, overwrite)
        wiring = {"images": (steps_[-1].name, 0)} | ({"gbuffers": ("gbuffers", 0)} if format == "npy" else {})
        steps_.append(Step("save", saving, wiring, outputs=0))
        graph = StageGraph(["gbuffers"], steps_)
        status = flash_settings(model, graph["sample"].stage, steps, chunk_frames, window_frames, sink_frames)
        bar = comfy.Progress(frames or 1)

        def chunks():
            for i, (gbuffers, count) in enumerate(source):
                if i == 0 and count:  # Load G-Buffers says how many frames the clip has with its first chunk
                    bar.total = count
                yield (gbuffers,)

        def progress(stats):
            bar.total = max(bar.total, stats.frames)
            bar.update(stats.frames - bar.done, preview=saving.last if bar.bar is not None else None)

        # inside ComfyUI on a CPU the stages run on 2 lanes as in the CLI (one thread each: node_run), the
        # frames those of one thread; an error or a cancel aborts every stage: the output's temporary file goes
        lanes = cpu_plan().lanes if comfy.in_comfyui() and comfy.torch_device().type == "cpu" else None
        with comfy.node_run():
            drive(graph, {"gbuffers": chunks()}, sinks=["save"], progress=progress, lanes=lanes)
        ui = dict(graph["save"].flushed["ui"])
        ui["text"] = [status, *ui.get("text", [])]
        return {"ui": ui}


NODES = {
    "AlayaFlash_RenderGBufferStream": (RenderGBufferStream, "Render G-Buffer Stream (Alaya Flash)"),
}
