"""What a live session renders with (LiveRenderer): the standard Flash pipeline, or a saved workflow.

`renderer_factory(...)` returns a zero-argument callable that the render thread calls once, so the
model loads on the thread that uses it. Every renderer follows LiveRenderer:
chunk_frames, reset(), set_prompt(text), set_light(light, offset), light_problem,
render(uint8 (T, 5, H, W, 3), **light) -> uint8 (T', H, W, 3); light: the G-buffers' light passes by name
(shadow=, sky=), uint8 (T, H, W) (an engine's, streaming/live/ingest.py), which the shading prior takes as
its shadows and its ambient occlusion.

FlashLive drives streaming/render/pipelines.py's Flash stages (G-buffer encoder -> few-step AR sampler
-> tiny streaming decoder) on an endless stream: it never flushes. It asks its session for exactly
the frames that complete the next autoregressive chunk (Wan's arithmetic: the first chunk of c
latent frames covers 1 + 4(c - 1) pixel frames, every later one 4c), so each render call returns
the frames it was given. A prompt change recomputes the text keys/values and keeps the KV cache
(KVCacheSampler.set_prompt), so the style changes mid-stream without a cut; reset() starts the
stream over with the same seed and the current prompt. set_light(light, offset) changes the light a
refiner that reads it gets, from the frame `offset` frames into the next render call on (a Light, or
None: the prompt's light again), with no cut; `light_problem` says why a light would go unread (None
when the model's refiner reads it).

Several sessions (the page's stream and each engine's, streaming/live/ingest.py) share one
factory: the model is loaded once, on the first call, and every session gets its own renderer
(its own stream state) over the same weights. Their calls take turns on the weights, in arrival
order (FairLock), one chunk at a time: on a CPU two concurrent renders would only fight for the
same cores, and on a GPU they would queue on the same device anyway.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from ...model_zoo.errors import AlayaError
from ...model_zoo.latents import TIME_COMPRESSION

log = logging.getLogger(__name__)


class LiveRenderer(Protocol):
    """What a live session renders with (FlashLive, WorkflowLive below).

    render(chunk uint8 (T, 5, H, W, 3), MODALITIES order, **light) -> uint8 (T', H, W, 3) RGB; T'
    may differ from T per call (a renderer may hold frames back), but over the stream every input
    frame gives exactly one output frame, in order. light: the chunk's light passes by name (shadow=,
    sky=: GBuffers.shadow, .sky), uint8 (T, H, W); each given with every chunk of a stream or never.
    """

    chunk_frames: int

    def reset(self) -> None: ...

    def set_prompt(self, text: str) -> None: ...

    def set_light(self, light, offset: int = 0) -> None: ...

    light_problem: str | None

    def render(self, chunk: np.ndarray, **light: np.ndarray) -> np.ndarray: ...


class FlashLive:
    """LiveRenderer over a Flash model (model_zoo.bundle.FlashModel)."""

    def __init__(self, model, seed: int = 0, fps: float = 30.0, chunk_latents: int | None = None,
                 steps: int | None = None, lights=None):
        """lights: a LightSchedule (serve --light) the stream starts under, else the prompt's light."""
        from ..render.lighting import unread_light

        self.model, self.seed, self.fps = model, seed, fps
        self.chunk_latents = chunk_latents or model.settings.chunk_frames
        self.steps = steps
        self.encode_text = model.text_encoder()
        self.light_problem = unread_light(model.refiner, model.describe(), model.gbuffer_encoder)
        self.lights = lights  # what a reset starts from: a LightSchedule, or None (the prompt's)
        self.light = None  # the Light set live (set_light), or None
        self._emb = None
        self.text = None
        self.set_prompt("")

    @property
    def chunk_frames(self) -> int:
        """Pixel frames that complete the next AR chunk (first chunk: 1 + 4(c - 1), then 4c)."""
        c = self.chunk_latents
        return TIME_COMPRESSION * c - (TIME_COMPRESSION - 1 if self._frames == 0 else 0)

    @property
    def steady_chunk_frames(self) -> int:
        """Pixel frames of every chunk after the first (what an engine's hello says)."""
        return TIME_COMPRESSION * self.chunk_latents

    def reset(self) -> None:
        from ..render.pipelines import FlashPipeline
        from ..values import PromptSchedule

        from ..render.lighting import LightSchedule

        lights = LightSchedule.constant(self.light) if self.light is not None else self.lights
        self.pipe = FlashPipeline(self.model, PromptSchedule.constant(self._emb, self.text), seed=self.seed,
                                  steps=self.steps, chunk_frames=self.chunk_latents,
                                  lights=lights if self.light_problem is None else None)
        self._frames = 0

    def set_light(self, light, offset: int = 0) -> None:
        """The light from the frame `offset` frames into the next render call on (a Light; None: the prompt's)."""
        self.pipe.set_light(light, self._frames + offset)  # LightNotRead when the model does not read one
        self.light, self.lights = light, None

    def set_prompt(self, text: str) -> None:
        import torch

        from ..values import PromptSchedule

        with torch.no_grad():
            emb = self.encode_text([text]).to(self.model.device)
        self._emb, self.text = emb, text
        if getattr(self, "pipe", None) is None:
            self.reset()
        else:
            self.pipe.set_prompts(PromptSchedule.constant(emb, text))

    def render(self, chunk: np.ndarray, **light: np.ndarray) -> np.ndarray:
        from ..values import GBuffers
        from ..files.sinks import to_uint8

        self._frames += len(chunk)
        frames = self.pipe.step(GBuffers(chunk, fps=self.fps, **light))
        if frames is None:
            return np.zeros((0, *chunk.shape[2:4], 3), np.uint8)
        return to_uint8(frames)


def load_flash_model(model: Path | None, random_model: bool, device: str):
    """The Flash model the page renders with: --random-model, a folder, or the embedded default."""
    from ...model_zoo import bundle, folders, runtime

    if random_model:
        log.warning("live: rendering with tiny RANDOM weights (the pictures are noise; the plumbing is real)")
        return runtime.accelerate(bundle.make_random_flash(seed=0, device=device))
    if model is None and not bundle.has_default_flash():
        raise AlayaError("no default Flash model is installed yet; pass --model FOLDER, or --random-model to try "
                         "the page with tiny random weights")
    return runtime.accelerate(folders.load_flash(model, device=device))  # the process's --backend


class FairLock:
    """A first-come, first-served lock: sessions on shared weights render in the order they asked."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = self._serving = 0

    def __enter__(self) -> "FairLock":
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            while ticket != self._serving:
                self._cond.wait()
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


class TakingTurns:
    """A live renderer whose calls hold the shared weights' lock; last_wait: seconds the last render
    waited for its turn. Everything else reads through to the renderer."""

    def __init__(self, renderer, lock: FairLock):
        self.renderer, self.lock, self.last_wait = renderer, lock, 0.0

    def __getattr__(self, name):
        return getattr(self.renderer, name)

    @property
    def chunk_frames(self) -> int:
        return self.renderer.chunk_frames

    @property
    def steady_chunk_frames(self) -> int:
        return getattr(self.renderer, "steady_chunk_frames", self.renderer.chunk_frames)

    @property
    def held_frames(self) -> int:
        return getattr(self.renderer, "held_frames", 0)

    def reset(self) -> None:
        with self.lock:
            self.renderer.reset()

    def set_prompt(self, text: str) -> None:
        with self.lock:
            self.renderer.set_prompt(text)

    def set_light(self, light, offset: int = 0) -> None:
        with self.lock:
            self.renderer.set_light(light, offset)

    def render(self, chunk: np.ndarray, **light: np.ndarray) -> np.ndarray:
        asked = time.perf_counter()
        with self.lock:
            self.last_wait = time.perf_counter() - asked
            return self.renderer.render(chunk, **light)


def renderer_factory(model: Path | None = None, workflow: Path | None = None, random_model: bool = False,
                     seed: int = 0, fps: float = 30.0, device: str = "cpu", chunk_latents: int | None = None,
                     steps: int | None = None, node_classes: dict | None = None, refine: bool = True,
                     light: str | None = None) -> Callable:
    """A callable that builds a live renderer on the calling render thread (see the module docstring);
    every call gives a new renderer (a session's own stream state) over weights loaded once.

    workflow: a saved workflow run by WorkflowLive; node_classes (the CLI looks them up) is then required.
    refine=False leaves out the model's G-buffer refiner (faster frames, the decoder's own).
    light: the light every session starts under, as `--light` takes it (one light or 'FRAME: light'
    lines); a model whose refiner does not read the light refuses it here (the model is loaded now).
    """
    from ..render.lighting import user_lights

    lock = FairLock()
    lights = None if light is None else user_lights(light, "--light")
    if workflow is not None:
        if node_classes is None:
            raise AlayaError("a workflow renderer needs the node classes")
        from ..render.workflow import feed_light, load_workflow, validate

        wf = load_workflow(workflow, node_classes)
        if light is not None:
            feed_light(wf, light, node_classes)
        validate(wf, node_classes)  # report problems now, not in the thread
        static_cache: dict = {}  # run-once node outputs (the loaded models), shared by the sessions

        def make_workflow():
            with lock:
                renderer = WorkflowLive(workflow, node_classes, fps=fps, static_cache=static_cache, light=light)
            return TakingTurns(renderer, lock)

        return make_workflow
    if model is not None and not Path(model).is_dir():
        raise AlayaError(f"{model}: no such model folder")
    if model is None and not random_model:
        from ...model_zoo import bundle

        if not bundle.has_default_flash():  # say so now, not later inside the render thread
            load_flash_model(None, False, device)
    loaded = []  # the model, once loaded (a failed load is tried again by the next call)

    def load():
        if not loaded:
            flash = load_flash_model(model, random_model, device)
            if not refine:
                flash.refiner = None
            loaded.append(flash)
        return loaded[0]

    if lights is not None:  # refused now, in one line, rather than on the page once it runs
        from ..render.lighting import unread_light

        why = unread_light(load().refiner, load().describe(), load().gbuffer_encoder)
        if why:
            raise AlayaError(f"--light: {why}" + ("; --no-refiner left its refiner out" if not refine else ""))

    def make():
        with lock:
            renderer = FlashLive(load(), seed=seed, fps=fps, chunk_latents=chunk_latents, steps=steps, lights=lights)
        return TakingTurns(renderer, lock)

    return make


class WorkflowLive:
    """LiveRenderer over a saved workflow (API or UI format).

    The workflow's one G-buffer source node (Load G-Buffers, Physics World, ...) is replaced by the
    page's source: each render() is one tick of the workflow's stage graph (the runner's, on the one
    driver loop) with the live chunk as that node's output. The frames shown are those feeding the
    first output node's `images` input (Stream Preview, Save, ...); output nodes themselves do not
    run (nothing is written). Static nodes (model loading, prompt encoding) run once. A prompt change
    re-runs the Encode Prompt nodes with the new text and restarts the stream stages (a cut:
    `prompt_restarts`), since a generic graph has no handle on its sampler's cache; reset() restarts
    the stages too.
    """

    prompt_restarts = True

    def __init__(self, path: Path, node_classes: dict, fps: float = 30.0, static_cache: dict | None = None,
                 light: str | None = None):
        from ..render.runner import StreamRunner
        from ..render.workflow import Link, feed_light, load_workflow, validate

        self.fps = fps
        wf = load_workflow(path, node_classes)
        if light is not None:  # serve --light: a Light node feeds the workflow's light inputs, as run --light
            feed_light(wf, light, node_classes)
        self.light_problem = (f"{path}: a --workflow session renders under its own light (serve --light, or a Light "
                              "node in the workflow); the page's and engines' light messages go to the Flash pipeline")
        order = validate(wf, node_classes)
        shown = [spec.inputs["images"] for nid in order for spec in [wf.nodes[nid]]
                 if getattr(node_classes[spec.class_type], "OUTPUT_NODE", False) and isinstance(spec.inputs.get("images"), Link)]
        if not shown:
            raise AlayaError(f"{path}: no output node shows frames (an 'images' input, e.g. Stream Preview or Save)")
        self.display = shown[0]
        self.runner = StreamRunner(wf, node_classes, targets=[self.display.node],
                                   static_cache={} if static_cache is None else static_cache)
        if len(self.runner.sources) != 1:
            raise AlayaError(f"{path}: the live page feeds exactly one G-buffer source node; the shown frames depend "
                             f"on {len(self.runner.sources)} ({', '.join(self.runner.sources) or 'none'})")
        self.source = self.runner.sources[0]
        self.prompt_nodes = [n for n in self.runner.order if wf.nodes[n].class_type == "AlayaFlash_EncodePrompt"]
        self.text = None
        self.reset()

    @property
    def values(self) -> dict[str, tuple]:
        """The run-once nodes' outputs (the loaded models, the encoded prompt), by node id."""
        return self.runner.values

    @property
    def chunk_frames(self) -> int:
        return 1 if self._frames == 0 else TIME_COMPRESSION  # Wan: one frame, then one latent's four

    @property
    def steady_chunk_frames(self) -> int:
        return TIME_COMPRESSION

    def reset(self) -> None:
        self.runner.run_static()  # cached: only nodes whose inputs changed (the prompt) run again
        self.graph = self.runner.start()
        self._frames = 0

    def set_prompt(self, text: str) -> None:
        if not self.prompt_nodes:
            raise AlayaError(f"{self.runner.wf.source}: the workflow has no Encode Prompt node to take the page's prompt")
        for nid in self.prompt_nodes:
            self.runner.wf.nodes[nid].inputs["text"] = text
        self.text = text
        self.reset()

    def set_light(self, light, offset: int = 0) -> None:
        raise AlayaError(self.light_problem)

    def render(self, chunk: np.ndarray, **light: np.ndarray) -> np.ndarray:
        from ..values import GBuffers
        from ..files.sinks import to_uint8

        self._frames += len(chunk)
        n_out = len(self.runner.classes[self.runner.wf.nodes[self.source].class_type].RETURN_TYPES)
        values = self.graph.tick({self.source: (GBuffers(chunk, fps=self.fps, **light),) + (None,) * (n_out - 1)})
        result = values.get(self.display.node)
        frames = None if result is None else result[self.display.output]
        if frames is None:
            return np.zeros((0, *chunk.shape[2:4], 3), np.uint8)
        return to_uint8(frames)
