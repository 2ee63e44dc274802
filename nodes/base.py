"""Base classes of the stream nodes: ComfyUI calls FUNCTION once over whole sequences, the runner
steps the same stage chunk by chunk (docs/runner.md). A node class sets CATEGORY, its types and
`open_stream` (sources) or `start_stream` (stages and sinks)."""
from __future__ import annotations

from ..streaming.engine.runner import run_stage_whole


def refuse(node: str, problems) -> None:
    """One error naming the node for the problems found (None entries: no problem); checks a node runs
    when it starts, since ComfyUI repeats a queue-time message on every input it names."""
    found = [p for p in problems if p]
    if found:
        from ..model_zoo.errors import AlayaError

        raise AlayaError(f"{node}: {'; '.join(found)}")


class SourceNode:
    STREAM = "source"
    FUNCTION = "run"

    def run(self, **inputs):
        """Every chunk of open_stream, joined per output (as run_source_whole); inside ComfyUI, after each
        chunk, a cancel check and the progress bar with the newest frame's albedo (no-ops outside)."""
        from ..streaming.engine.driver import concat_chunks
        from . import comfy

        chunks, bar = [], comfy.Progress(inputs.get("frames") or 1)
        for chunk in self.open_stream(**inputs):
            chunks.append(chunk)
            if len(chunks) == 1:  # a source that knows its length says so with its first chunk (Load G-Buffers)
                bar.total = next((v for v in chunk[1:] if isinstance(v, int) and v > 0), bar.total)
            gbuffers = chunk[0]
            bar.total = max(bar.total, bar.done + len(gbuffers))
            bar.update(len(gbuffers), preview=_newest_albedo(gbuffers) if bar.bar is not None else None)
        return tuple(concat_chunks([c[i] for c in chunks]) for i in range(len(type(self).RETURN_TYPES)))


def _newest_albedo(gbuffers):
    """The albedo pass of the newest frame as an IMAGE frame (H, W, 3) in [0, 1], or None."""
    images = getattr(gbuffers, "images", None)
    return images[-1, 0].float().div(255) if images is not None and len(images) else None


class StageNode:
    STREAM = "stage"
    FUNCTION = "run"

    def run(self, **inputs):
        return run_stage_whole(self, **inputs)


def pieces(value, n: int) -> list:
    """A chunk value cut into consecutive pieces of at most n frames (GBuffers, Latents or IMAGE)."""
    if hasattr(value, "pieces"):
        return value.pieces(n)
    return [value[i:i + n] for i in range(0, len(value), n)] or [value]


class Piecewise:
    """A stage stepped piece by piece within one call, so that ComfyUI's single call over a whole
    sequence checks for cancel and moves its progress bar every `piece` frames (the stages buffer
    internally, so the frames do not depend on the cut). preview(outputs, inputs) -> an IMAGE frame
    for the bar, or None. Outside ComfyUI the pieces cost nothing but a loop."""

    def __init__(self, inner, piece: int, preview=None):
        self.inner, self.piece, self.preview = inner, piece, preview

    def step(self, **inputs):
        from ..streaming.engine.driver import concat_chunks
        from . import comfy

        cut = {k: pieces(v, self.piece) for k, v in inputs.items() if v is not None}
        count = max((len(p) for p in cut.values()), default=0)
        bar = comfy.Progress(count)
        outs = []
        for i in range(count):
            comfy.check_interrupted()
            part = {k: (cut[k][i] if k in cut and i < len(cut[k]) else None) for k in inputs}
            out = self.inner.step(**part)
            outs.append(out)
            bar.update(1, preview=self.preview(out, part) if self.preview and bar.bar is not None else None)
        outs = [o for o in outs if o is not None]
        if not outs:
            return None
        return tuple(concat_chunks([o[j] for o in outs]) for j in range(len(outs[0])))

    def flush(self):
        return self.inner.flush()

    def abort(self):
        if hasattr(self.inner, "abort"):
            self.inner.abort()
