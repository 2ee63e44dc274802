"""The quickstart demo: a bundled G-buffer stream rendered to a preview video.

Until the default model ships, the "render" is a tiled panel: the five passes as the model sees
them (teacher form, 8-bit) plus a plain Lambert shading of albedo and normals, so the video shows
the whole input at a glance. The source is pluggable: DEMO_SOURCES maps a name to a factory
(width, height, num_frames, seed) -> GBufferStream ("synthetic", the default, and "world", the
physics world); any G-buffer path works too.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..gbuffer import MODALITIES, linear_to_srgb
from ..files.readers import GBufferStream
from ..files.synthetic import synthetic_stream

class WorldDemo:
    """The physics world as the demo's stream, and the light it is lit by. Like a game engine, the world
    knows where its sun is: `light(k)` is the demo preset's sun turned with frame k's camera (known once
    frame k has been drawn), exact where the prompt's light head can only guess the sun's side."""

    PRESET = "sunset_dramatic"  # the preset DEMO_PROMPT words

    def __init__(self, width: int, height: int, num_frames: int, seed: int):
        from ..world import WorldConfig  # MuJoCo + moderngl load only when asked for
        from ..world.world import WorldSource

        self.source = WorldSource(WorldConfig(seed=seed, width=width, height=height, num_frames=num_frames, presets=()))
        self.headings: dict[int, float] = {}
        self.stream = GBufferStream.from_frames(self.source.info, self._frames)

    def _frames(self):
        from ..world.shading import heading

        for frame, camera in self.source.frames_with_cameras():
            self.headings[frame.index] = heading(camera)
            yield frame

    def light(self, index: int):
        from ..world.shading import light_of

        return light_of(self.PRESET, self.headings[index])


DEMO_SOURCES: dict[str, Callable[..., GBufferStream]] = {
    "synthetic": lambda width, height, num_frames, seed: synthetic_stream(width, height, num_frames, seed=seed),
    "world": lambda width, height, num_frames, seed: WorldDemo(width, height, num_frames, seed).stream,  # streaming/world/
}

_LIGHT = np.float32([0.4, 0.7, 0.6]) / np.linalg.norm([0.4, 0.7, 0.6])  # camera space, from upper right


def lambert_preview(frame) -> np.ndarray:
    """Canonical frame -> uint8 (H, W, 3): albedo * (ambient + n.l), sRGB encoded; sky light blue."""
    ndotl = np.clip(frame.normal @ _LIGHT, 0.0, 1.0)[..., None]
    lin = frame.albedo * (0.25 + 0.75 * ndotl)
    lin[np.isinf(frame.depth)] = (0.35, 0.5, 0.8)
    return np.clip(np.rint(linear_to_srgb(lin) * 255), 0, 255).astype(np.uint8)


def panel(images: np.ndarray, extra: np.ndarray, extra_label: str) -> np.ndarray:
    """Teacher form (5, H, W, 3) + one more (H, W, 3) tile -> uint8 (2H, 3W, 3) labelled grid."""
    from PIL import Image, ImageDraw

    tiles = list(images) + [extra]
    labels = list(MODALITIES) + [extra_label]
    h, w = images.shape[1:3]
    grid = np.zeros((2 * h, 3 * w, 3), np.uint8)
    for k, tile in enumerate(tiles):
        r, c = divmod(k, 3)
        grid[r * h:(r + 1) * h, c * w:(c + 1) * w] = tile
    im = Image.fromarray(grid)
    draw = ImageDraw.Draw(im)
    for k, label in enumerate(labels):
        r, c = divmod(k, 3)
        x, y = c * w + 4, r * h + 3
        draw.text((x + 1, y + 1), label, fill=(0, 0, 0))
        draw.text((x, y), label, fill=(255, 255, 255))
    return np.asarray(im)


def render_demo(stream: GBufferStream, out: Path, overwrite: bool = False, progress=None) -> int:
    """Write the preview panel video of stream to out (MP4, atomic); returns frames written."""
    from ..gbuffer import frame_to_teacher
    from ..files.sinks import Mp4Sink

    with Mp4Sink(out, fps=stream.info.fps, overwrite=overwrite) as sink:
        for frame in stream:
            rgb = frame.extras.get("rgb")
            extra, label = (rgb, "rgb") if rgb is not None else (lambert_preview(frame), "shaded")
            sink.write(panel(frame_to_teacher(frame, stream.info.depth_near), extra, label))
            if progress:
                progress(1)
    return sink.count


DEMO_PROMPT = ("colourful toy objects tumbling and rolling across a walled courtyard; the scene is lit by a low "
               "golden sun at sunset under an orange and purple sky with long shadows, creating a dramatic, "
               "cinematic atmosphere.")


def render_model_demo(stream: GBufferStream, out: Path, model, prompt: str = DEMO_PROMPT, seed: int = 0,
                      overwrite: bool = False, progress=None, chunk: int = 4, light=None) -> int:
    """Render stream with a Flash model (streaming, chunk by chunk) into the panel video: the five
    passes plus the model's RGB frame. light: frame index -> its Light (an engine's sun, WorldDemo.light),
    for a model whose refiner reads the light; None: the prompt's light. Returns frames written."""
    import torch

    from ..gbuffer import frame_to_teacher
    from ..render.pipelines import FlashPipeline
    from ..values import GBuffers, PromptSchedule
    from ..files.sinks import to_uint8
    from ..files.sinks import Mp4Sink

    pipe = FlashPipeline(model, PromptSchedule.encode(model.text_encoder(), prompt), seed=seed)
    pending: list[np.ndarray] = []  # G-buffer images waiting for their rendered frame

    def chunks():
        batch = []
        for k, frame in enumerate(stream):
            if light is not None:  # as an engine sends its sun with each frame
                pipe.set_light(light(k), k)
            images = frame_to_teacher(frame, stream.info.depth_near)
            pending.append(images)
            batch.append(images)
            if len(batch) == chunk:
                yield GBuffers(torch.from_numpy(np.stack(batch)), stream.info.fps, stream.info.depth_near)
                batch = []
        if batch:
            yield GBuffers(torch.from_numpy(np.stack(batch)), stream.info.fps, stream.info.depth_near)

    with Mp4Sink(out, fps=stream.info.fps, overwrite=overwrite) as sink:
        for rgb in pipe.run(chunks()):
            for frame in to_uint8(rgb):
                sink.write(panel(pending.pop(0), frame, "alaya-flash"))
                if progress:
                    progress(1)
    return sink.count
