"""Bounded memory: the Python-side peak of reader -> writer does not grow with stream length."""
import tracemalloc

from alaya_flash.streaming.files import sinks
from alaya_flash.streaming.files.readers import open_gbuffers
from alaya_flash.streaming.files.synthetic import synthetic_stream


def peak_bytes(tmp_path, n):
    src = tmp_path / f"src{n}"
    sinks.write_stream(synthetic_stream(32, 16, n), sinks.NpyWindowSink(src, window=4))
    tracemalloc.start()
    try:
        for fmt in ("mp4", "png", "exr"):  # npy reader -> every folder writer, then read each back
            sinks.write_stream(open_gbuffers(src), sinks.open_sink(tmp_path / f"{fmt}{n}", fmt))
            for _ in open_gbuffers(tmp_path / f"{fmt}{n}").teacher_frames():
                pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_is_flat_in_stream_length(tmp_path):
    peak_bytes(tmp_path, 2)  # warm-up: first use imports codecs and fills caches
    short, long = peak_bytes(tmp_path, 8), peak_bytes(tmp_path, 48)
    # one frame is 5*16*32*3 = 7.7 kB; 40 more frames held anywhere would add >= 300 kB
    assert long < short + 150_000, (short, long)
