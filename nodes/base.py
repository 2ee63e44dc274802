"""Base classes of the stream nodes: ComfyUI calls FUNCTION once over whole sequences, the runner
steps the same stage chunk by chunk (docs/runner.md). A node class sets CATEGORY, its types and
`open_stream` (sources) or `start_stream` (stages and sinks)."""
from __future__ import annotations

from ..streaming.engine.runner import run_source_whole, run_stage_whole


class SourceNode:
    STREAM = "source"
    FUNCTION = "run"

    def run(self, **inputs):
        return run_source_whole(self, **inputs)


class StageNode:
    STREAM = "stage"
    FUNCTION = "run"

    def run(self, **inputs):
        return run_stage_whole(self, **inputs)
