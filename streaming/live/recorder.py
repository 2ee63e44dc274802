"""Recording a live session through the project's sinks: RGB, optionally G-buffers, and controls.

    rec = Recorder(Path("recordings/live-20261202-120000"), fps=30, gbuffers=True)
    rec.event(0, {"event": "prompt", "text": "..."})
    rec.controls(0, controls)             # per G-buffer frame, as captured
    rec.write(rgb, teacher)               # per rendered frame: uint8 (H, W, 3), uint8 (5, H, W, 3)
    path = rec.close()                    # or rec.abort()

The folder holds rgb.mp4 (H.264, Mp4Sink) or, with gbuffers, the teacher's clip layout
({mod}.mp4 + rgb.mp4, lossless, TeacherMp4Sink; readable by open_gbuffers), and controls.jsonl
(one JSON object per line: {"frame": i, "move": [r, f], "yaw", "pitch", "zoom", "jump", "push"}
per captured frame, plus {"frame": i, "event": ...} lines for prompt, preset, source and reset).
The whole folder is written under a hidden temporary name (sinks.temp_name:
`.live-....<pid>-<token>.alaya-tmp.tmp`) and moved into place on close, so a crash leaves no
half-written recording under the final name; abort (and a signal, which unwinds to abort or close)
removes it. What a kill -9 left, the next recording into the same folder removes (sweep_recordings).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from ..files.sinks import TEMP_MARK, AtomicOutput, BackgroundWriter, Mp4Sink, TeacherMp4Sink, sweep_leftovers
from ..world.play import Controls


def sweep_recordings(folder: Path) -> list[Path]:
    """Remove the temporary recording folders in `folder` that killed servers left (only this
    program's names, only of processes that no longer run: sinks.sweep_leftovers)."""
    removed = []
    if folder.is_dir():
        for tmp in folder.glob(f".live-*.{TEMP_MARK}.tmp"):
            removed += sweep_leftovers(folder / tmp.name[1:].split(".", 1)[0])
    return removed


class Recorder:
    def __init__(self, folder: Path, fps: float, gbuffers: bool = False):
        sweep_recordings(folder.parent)
        self.out = AtomicOutput(folder, overwrite=False, is_dir=True)
        self.path = self.out.dst
        self.gbuffers = gbuffers
        try:
            self.sink = TeacherMp4Sink(self.out.tmp / "gbuffers", fps) if gbuffers else Mp4Sink(self.out.tmp / "rgb.mp4", fps)
            self._log = open(self.out.tmp / "controls.jsonl", "w", encoding="utf-8")
            # Encoding (six lossless videos a frame with G-buffers) runs beside the live loop, not in it.
            self.writer = BackgroundWriter(self.sink, depth=max(1, round(fps)))  # at most a second waits
        except BaseException:
            self.out.abort()
            raise
        self.frames = 0
        self._done = False

    def controls(self, frame: int, controls: Controls) -> None:
        row = {"frame": frame, **dataclasses.asdict(controls)}
        row["move"] = list(row["move"])
        self._log.write(json.dumps(row) + "\n")

    def event(self, frame: int, what: dict) -> None:
        self._log.write(json.dumps({"frame": frame, **what}) + "\n")

    def write(self, rgb: np.ndarray, teacher: np.ndarray | None) -> None:
        self.writer.put([(rgb, teacher if self.gbuffers else None)])
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the videos and the log and move the folder into place; None when no frame was written."""
        if self._done:
            return None
        if self.frames == 0:
            self.abort()
            return None
        self._done = True
        try:
            self._log.close()
            self.writer.close()
        except BaseException:
            self.out.abort()
            raise
        return self.out.commit()

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self._log.close()
        self.writer.abort()
        self.out.abort()
