"""Shots per hour of `alaya-flash batch`: in this process, and on Ray with 1 and 2 workers.

    .venv/bin/python benchmarks/batch.py                                   # 8 shots, 32 frames, 128x128
    .venv/bin/python benchmarks/batch.py --shots 16 --frames 48 --size 256 --workers 1 2 4 --threads 1

Generates `--shots` synthetic G-buffer clips (npy windows), then renders them with the standard
render workflow and the embedded default model (`--model`; random:tiny for a quick look) through
`alaya-flash batch --force`, once per configuration. For each it prints the wall time (Ray start,
model loading per worker and rendering) and two rates: shots/hour over the wall time, and steady
shots/hour over the busiest worker's rendering time (what a long batch approaches, once the
workers are up). Figures only (they go to docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import ROOT, import_package


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shots", type=int, default=8)
    p.add_argument("--frames", type=int, default=32, help="frames per shot")
    p.add_argument("--size", type=int, default=128, help="square frame size (multiple of 16)")
    p.add_argument("--model", default="default", help="Flash model folder name, or random:tiny")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Ray worker counts to try")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--no-local", action="store_true", help="skip the in-process run")
    args = p.parse_args(argv)
    import_package()
    from alaya_flash.streaming.cli import main as cli
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    configs = ([("local", ["--engine", "local"])] if not args.no_local else [])
    configs += [(f"ray, {n} worker{'s' if n > 1 else ''}", ["--engine", "ray", "--workers", str(n)]) for n in args.workers]
    with tempfile.TemporaryDirectory(prefix="alaya-batch-bench-") as tmp:
        tmp = Path(tmp)
        for i in range(args.shots):
            write_stream(synthetic_stream(args.size, args.size, args.frames, seed=i), NpyWindowSink(tmp / "clips" / f"s{i:02d}"))
        print(f"{args.shots} shots x {args.frames} frames at {args.size}x{args.size}, model {args.model}, "
              f"{args.threads} thread(s) per worker")
        for label, extra in configs:
            out = tmp / label.replace(" ", "").replace(",", "-")
            stdout = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(stdout):
                code = cli(["--quiet", "batch", str(ROOT / "workflows" / "api" / "render-gbuffer-sequence.json"),
                            "--inputs", str(tmp / "clips" / "*"), "--out", f"{out}/{{name}}.mp4",
                            "--set", f"Load Flash Model.model={args.model}", "--threads", str(args.threads), "--force", "--json", *extra])
            wall = time.perf_counter() - start
            if code != 0:
                print(f"{label}: exit status {code}")
                continue
            summary = json.loads(stdout.getvalue())
            busy = defaultdict(float)
            for line in (out / "manifest.jsonl").read_text().splitlines():
                record = json.loads(line)
                busy[record["worker"]] += record["seconds"]["wall"]
            steady = 3600 * args.shots / max(busy.values())
            print(json.dumps({"config": label, "wall_s": round(wall, 1), "shots_per_hour": round(3600 * args.shots / wall),
                              "steady_shots_per_hour": round(steady), "frames_per_s": round(summary["frames"] / wall, 1),
                              "workers": summary["workers"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
