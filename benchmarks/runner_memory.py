"""Resident memory of `alaya-flash run` over a long stream: the render workflow on 5,000 frames.

    .venv/bin/python benchmarks/runner_memory.py                       # 5,000 frames at 32x32
    .venv/bin/python benchmarks/runner_memory.py --frames 1000 --size 64

Generates a G-buffer clip (npy windows, synthetic scene), then runs
workflows/api/render-gbuffer-sequence.json through StreamRunner with the tiny random Flash model
(fp32), writing an MP4 as frames come. RSS is sampled after every tick; it prints RSS after the
warm-up ticks, at the end, the growth between them, the peak, and FPS. Flat memory means the
growth stays near zero however long the stream. Figures only (they go to docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, import_package, rss_mib


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=5000, help="stream length")
    p.add_argument("--size", type=int, default=32, help="square frame size (multiple of 16)")
    p.add_argument("--chunk", type=int, default=12, help="frames per tick")
    p.add_argument("--warmup", type=int, default=10, help="ticks before the baseline RSS is taken")
    args = p.parse_args(argv)
    import_package()
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
    from alaya_flash.streaming.render.runner import StreamRunner
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream
    from alaya_flash.streaming.render.workflow import parse_workflow

    with tempfile.TemporaryDirectory(prefix="alaya-runner-mem-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        write_stream(synthetic_stream(args.size, args.size, args.frames), NpyWindowSink(tmp / "clip", window=256))
        print(f"generated {args.frames} frames in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        g = json.loads((ROOT / "workflows" / "api" / "render-gbuffer-sequence.json").read_text())
        g["1"]["inputs"].update(path=str(tmp / "clip"), chunk=args.chunk)
        g["2"]["inputs"].update(model="random:tiny", precision="fp32", device="cpu")
        (save,) = [n for n in g.values() if n["class_type"] == "AlayaFlash_Save"]
        save["inputs"].update(filename=str(tmp / "out.mp4"))
        marks = {"warm": None, "peak": 0.0, "samples": []}

        def progress(stats):
            rss = rss_mib()
            marks["peak"] = max(marks["peak"], rss)
            if stats.ticks == args.warmup:
                marks["warm"] = rss
            if stats.ticks % 50 == 0:
                marks["samples"].append((stats.frames, round(rss, 1)))

        stats = StreamRunner(parse_workflow(g, NODES), NODES, progress=progress).run()
        end = rss_mib()
        import av

        with av.open(str(tmp / "out.mp4")) as f:
            written = sum(1 for _ in f.decode(video=0))
    print(json.dumps({"frames_in": stats.frames, "frames_written": written, "size": args.size, "ticks": stats.ticks,
                      "rss_after_warmup_mib": round(marks["warm"], 1), "rss_end_mib": round(end, 1),
                      "growth_mib": round(end - marks["warm"], 1), "peak_mib": round(marks["peak"], 1),
                      "fps": round(stats.fps, 2), "seconds": round(stats.seconds, 1), "rss_by_frame": marks["samples"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
