"""sinks.BackgroundWriter: the Save node's sink fed from a worker thread. It must write exactly
what the sink would, surface a failed write with the sink's own message, keep memory bounded and
leave nothing behind on an error or an abort."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.files import sinks


def frames(n, h=16, w=24, seed=0):
    g = np.random.default_rng(seed)
    return [g.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(n)]


def test_writes_the_same_files_as_the_sink_itself(tmp_path):
    rgb = frames(7)
    direct = sinks.PngSequenceSink(tmp_path / "direct")
    for f in rgb:
        direct.write(rgb=f)
    direct.close()
    writer = sinks.BackgroundWriter(sinks.PngSequenceSink(tmp_path / "threaded"))
    for chunk in (rgb[:3], [], rgb[3:4], rgb[4:]):
        writer.put([(f, None) for f in chunk])
    assert writer.close() == tmp_path / "threaded" and writer.count == 7
    names = sorted(p.name for p in (tmp_path / "direct").iterdir())
    assert len(names) == 8 and names == sorted(p.name for p in (tmp_path / "threaded").iterdir())  # + the mark
    assert all((tmp_path / "direct" / n).read_bytes() == (tmp_path / "threaded" / n).read_bytes() for n in names)


def test_a_failed_write_is_raised_with_the_sinks_message_and_nothing_is_left(tmp_path):
    writer = sinks.BackgroundWriter(sinks.PngSequenceSink(tmp_path / "out"))
    writer.put([(f, None) for f in frames(2)])
    writer.put([(f, None) for f in frames(1, w=32)])  # another size: the worker's write fails
    with pytest.raises(AlayaError, match=r"out: frame 2: size 32x16 differs from the first frame's 24x16"):
        writer.close()
    assert not list(tmp_path.iterdir())  # neither the output nor its temporary folder


def test_the_next_put_raises_a_failure_already_seen(tmp_path):
    writer = sinks.BackgroundWriter(sinks.PngSequenceSink(tmp_path / "out"))
    writer.put([(None, None)])  # nothing to write: the sink refuses the frame
    writer._stop()  # let the worker take it (the thread ends after the queued chunk)
    with pytest.raises(AlayaError, match="frame 0: nothing to write"):
        writer.put([(f, None) for f in frames(1)])
    assert not list(tmp_path.iterdir())


class _Held(sinks.PngSequenceSink):
    """A sink whose writes wait for a release: a slow encoder."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.release = threading.Event()

    def _write(self, rgb, gbuffer, where):
        assert self.release.wait(10)
        super()._write(rgb, gbuffer, where)


def test_at_most_depth_chunks_wait(tmp_path):
    sink = _Held(tmp_path / "out")
    writer = sinks.BackgroundWriter(sink, depth=2)
    chunk = [(f, None) for f in frames(2)]
    for _ in range(3):  # one taken by the worker (held), two queued
        writer.put(chunk)
    fourth = threading.Thread(target=writer.put, args=(chunk,))
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive()  # blocked: the queue is full
    sink.release.set()
    fourth.join(10)
    assert not fourth.is_alive()
    writer.close()
    assert sink.count == 8 and len(list((tmp_path / "out").glob("*.png"))) == 8


def test_abort_drops_the_queued_chunks_and_the_output(tmp_path):
    sink = _Held(tmp_path / "out")
    writer = sinks.BackgroundWriter(sink, depth=4)
    for _ in range(3):
        writer.put([(f, None) for f in frames(2)])
    aborting = threading.Thread(target=writer.abort)
    aborting.start()  # the worker is held inside the first chunk meanwhile
    aborting.join(0.3)
    sink.release.set()
    aborting.join(10)
    assert not aborting.is_alive()
    assert sink.count in (0, 2)  # at most the chunk the worker had begun; the queued ones were dropped
    assert not list(tmp_path.iterdir())


def test_live_recorder_writes_beside_the_loop_and_reports_a_bad_frame(tmp_path):
    """The live Recorder encodes through a BackgroundWriter: a good recording is whole on close; a
    frame of another size fails the recording with the sink's message and leaves no folder."""
    from alaya_flash.streaming.live.recorder import Recorder
    from alaya_flash.streaming.files.readers import open_gbuffers

    teacher = np.random.default_rng(1).integers(0, 256, (5, 16, 24, 3), dtype=np.uint8)
    rec = Recorder(tmp_path / "good", fps=10, gbuffers=True)
    for f in frames(5):
        rec.write(f, teacher)
    assert rec.close() == tmp_path / "good"
    assert open_gbuffers(tmp_path / "good" / "gbuffers").info.num_frames == 5

    rec = Recorder(tmp_path / "bad", fps=10)
    rec.write(frames(1)[0], None)
    rec.write(frames(1, w=32)[0], None)
    with pytest.raises(AlayaError, match="frame 1: size 32x16 differs"):
        rec.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good"]
