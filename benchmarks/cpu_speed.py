"""CPU speed of the default model by frame size, against an earlier commit, measured alternately.

    python benchmarks/cpu_speed.py                                   # 128 256 384 512, 3 runs each
    python benchmarks/cpu_speed.py --sizes 256 --runs 5 --busy-neighbour
    python benchmarks/cpu_speed.py --baseline 2afdfc7 --sizes 256 512

For each size it runs `alaya-flash bench --model model_zoo/default` from this tree and from the
baseline commit (exported with `git archive` into a temporary folder), one after the other, `runs`
times, and prints the medians: steady FPS, first-frame latency and milliseconds a frame per stage
(on the CPU plan with lanes, each stage's time is its lane's, one thread), and the FPS ratio of this
tree over the baseline (whose bench has no warm-up: its first frame includes one-off costs). The machines are shared and noisy: alternating the two and taking medians
keeps the ratio honest when the absolute figures drift. Prints figures, asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "2afdfc7"  # the last commit before the CPU speed work (fused ops, lanes, folded pools)


def export(commit: str, into: Path) -> Path:
    """The baseline tree as an importable `alaya_flash` (a folder whose child of that name is the tree)."""
    tree = into / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (into / "pkg").mkdir()
    (into / "pkg" / "alaya_flash").symlink_to(tree)
    return into / "pkg"


def bench(size: int, frames: int, extra: list[str], pythonpath: Path | None, busy: bool) -> dict:
    code = "import sys; from alaya_flash.streaming.cli import main; sys.exit(main())"
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    cmd = [sys.executable, "-c", code, "--quiet", "bench", "--model", str(ROOT / "model_zoo" / "default"),
           "--size", str(size), "--frames", str(frames), "--chunk", "4", "--json", *extra]
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if out.returncode:
        raise SystemExit(f"bench failed ({'baseline' if pythonpath else 'tree'}, {size}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(rows: list[dict]) -> dict:
    flash = [r["flash"] for r in rows]
    stages = sorted({k for f in flash for k in f["ms_per_frame"]})
    return {"fps": statistics.median(f["fps_steady"] for f in flash),
            "first": statistics.median(f["first_frame_latency_s"] for f in flash),
            "ms": {k: statistics.median(f["ms_per_frame"].get(k, 0.0) for f in flash) for k in stages},
            "cpu": rows[0].get("cpu", "-"), "rss": statistics.median(r["peak_rss_mib"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 384, 512])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--frames", type=int, default=96)
    parser.add_argument("--baseline", default=BASELINE, help="commit to compare with ('none': this tree only)")
    parser.add_argument("--busy-neighbour", action="store_true", help="one busy process runs beside every bench")
    parser.add_argument("--bench-args", default="", help="more bench options, e.g. '--no-pipeline'")
    args = parser.parse_args()
    extra = args.bench_args.split()
    with tempfile.TemporaryDirectory(prefix="alaya-cpu-speed-") as tmp:
        base = None if args.baseline == "none" else export(args.baseline, Path(tmp))
        print(f"load average before: {os.getloadavg()[0]:.2f}; runs alternate tree / baseline {args.baseline}")
        for size in args.sizes:
            tree_rows, base_rows = [], []
            for _ in range(args.runs):
                tree_rows.append(bench(size, args.frames, extra, None, args.busy_neighbour))
                if base is not None:  # (the baseline's bench has no CPU plan options)
                    base_rows.append(bench(size, args.frames, [], base, args.busy_neighbour))
            t = summary(tree_rows)
            line = (f"{size}x{size}: {t['fps']:.2f} FPS steady, first frame {t['first']:.3f} s, ms/frame "
                    + ", ".join(f"{k} {v:.1f}" for k, v in t["ms"].items()) + f", peak RSS {t['rss']:.0f} MiB [{t['cpu']}]")
            if base_rows:
                b = summary(base_rows)
                line += f"\n    baseline: {b['fps']:.2f} FPS, first frame {b['first']:.3f} s; ratio {t['fps'] / b['fps']:.2f}x"
            print(line, flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
