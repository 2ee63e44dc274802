"""Base classes of the stream nodes: ComfyUI calls FUNCTION once over whole sequences, the runner
steps the same stage chunk by chunk (docs/runner.md). A node class sets CATEGORY, its types and
`open_stream` (sources) or `start_stream` (stages and sinks)."""
from __future__ import annotations

from ..streaming.render.runner import run_stage_whole

MODEL = -1  # a sampler widget at -1 takes the loaded model's trained value (config.json "session")


def refuse(node: str, problems) -> None:
    """One error naming the node for the problems found (None entries: no problem); checks a node runs
    when it starts, since ComfyUI repeats a queue-time message on every input it names."""
    found = [p for p in problems if p]
    if found:
        from ..model_zoo.errors import AlayaError

        raise AlayaError(f"{node}: {'; '.join(found)}")


def settings_line(ran: dict, widgets: dict) -> str:
    """The settings a sampler ran with, -1 resolved, for the node's canvas text: 'steps 4* · chunk 1* ·
    window 1* · sink 1*  (*: the model's)'; a value whose widget was -1 (or absent) is marked the model's."""
    def shown(v):
        return f"{v:g}" if isinstance(v, float) else str(v)

    marks = {name: widgets.get(name, MODEL) == MODEL for name in ran}
    line = " · ".join(f"{name} {shown(v)}{'*' if marks[name] else ''}" for name, v in ran.items())
    return line + ("  (*: the model's)" if any(marks.values()) else "")


class SourceNode:
    STREAM = "source"
    FUNCTION = "run"

    def run(self, **inputs):
        """Every chunk of open_stream, joined per output (as run_source_whole). Inside ComfyUI the stream
        is read a frame at a time (a source's frames do not depend on its chunk), with a cancel check after
        each frame and the progress bar, with the newest frame's albedo, every PIECE_SECONDS (no-ops outside)."""
        import time

        from ..streaming.render.driver import concat_chunks
        from . import comfy

        chunks, bar = [], comfy.Progress(inputs.get("frames") or 1)
        if bar.bar is not None and "chunk" in inputs:
            inputs = {**inputs, "chunk": 1}
        read = shown = 0
        due = 0.0  # when the bar moves next (time.monotonic()): the first frame shows at once
        with comfy.node_run():
            for chunk in self.open_stream(**inputs):
                chunks.append(chunk)
                read += len(chunk[0])
                if len(chunks) == 1:  # a source that knows its length says so with its first chunk (Load G-Buffers)
                    bar.total = next((v for v in chunk[1:] if isinstance(v, int) and v > 0), bar.total)
                comfy.check_interrupted()
                if time.monotonic() >= due or bar.bar is None:
                    bar.total = max(bar.total, read)
                    bar.update(read - shown, preview=_newest_albedo(chunk[0]) if bar.bar is not None else None)
                    shown, due = read, time.monotonic() + comfy.PIECE_SECONDS
            if read > shown:
                bar.total = max(bar.total, read)
                bar.update(read - shown, preview=_newest_albedo(chunks[-1][0]))
        return tuple(concat_chunks([c[i] for c in chunks]) for i in range(len(type(self).RETURN_TYPES)))


def _newest_albedo(gbuffers):
    """The albedo pass of the newest frame as an IMAGE frame (H, W, 3) in [0, 1], or None."""
    images = getattr(gbuffers, "images", None)
    return images[-1, 0].float().div(255) if images is not None and len(images) else None


class StageNode:
    """start_stream may set `self.status`, a line the node shows on the canvas after it runs (ComfyUI's
    ui text, drawn by web/node_status.js): the samplers' settings with -1 resolved."""

    STREAM = "stage"
    FUNCTION = "run"
    status: str | None = None

    def run(self, **inputs):
        from . import comfy

        self.status = None
        with comfy.node_run():
            out = run_stage_whole(self, **inputs)
        if self.status and not isinstance(out, dict):
            return {"ui": {"text": [self.status]}, "result": out}
        return out


def pieces(value, n: int) -> list:
    """A chunk value cut into consecutive pieces of at most n frames (GBuffers, Latents or IMAGE)."""
    if hasattr(value, "pieces"):
        return value.pieces(n)
    return [value[i:i + n] for i in range(0, len(value), n)] or [value]


class Piecewise:
    """A stage stepped piece by piece within one call, so that ComfyUI's single call over a whole
    sequence checks for cancel and moves its progress bar after every piece. Pieces are sized by measured
    time (comfy.PieceClock: one frame first, then what fits in PIECE_SECONDS, at most `most` frames), so a
    cancel lands as soon on a busy machine as on an idle one; the stages buffer internally, so the frames do
    not depend on the cut. preview(outputs, inputs) -> an IMAGE frame for the bar, or None. Outside
    ComfyUI the pieces cost nothing but a loop."""

    def __init__(self, inner, most: int | None = None, preview=None, fixed: bool = False):
        # fixed: always `most` frames a piece, for a stage whose frames depend in their last bits on how
        # many frames one call takes (Decode: the decoders batch over time), so that ComfyUI's frames stay
        # those of the runner; a cancel still lands inside a piece (comfy.cancel_points)
        self.inner, self.most, self.preview, self.fixed = inner, most, preview, fixed

    def step(self, **inputs):
        import time

        from ..streaming.render.driver import concat_chunks
        from . import comfy

        frames = {k: pieces(v, 1) for k, v in inputs.items() if v is not None}
        count = max((len(p) for p in frames.values()), default=0)
        bar, clock = comfy.Progress(count), comfy.PieceClock(self.most)
        if self.fixed:
            clock.size = clock.most = self.most
        outs, a = [], 0
        while a < count:
            comfy.check_interrupted()
            b = min(count, a + clock.size)
            part = {k: _join(frames[k][a:b]) if k in frames else None for k in inputs}
            started = time.monotonic()
            out = self.inner.step(**part)
            if not self.fixed:
                clock.took(b - a, time.monotonic() - started)
            outs.append(out)
            bar.update(b - a, preview=self.preview(out, part) if self.preview and bar.bar is not None else None)
            a = b
        outs = [o for o in outs if o is not None]
        if not outs:
            return None
        return tuple(concat_chunks([o[j] for o in outs]) for j in range(len(outs[0])))

    def flush(self):
        return self.inner.flush()

    def abort(self):
        if hasattr(self.inner, "abort"):
            self.inner.abort()


def _join(frames: list):
    """Consecutive one-frame pieces of one input joined again; None past that input's end."""
    from ..streaming.render.driver import concat_chunks

    return concat_chunks(frames) if frames else None
