"""How much a shot's frames move with the torch thread count, the figure behind batch's `--threads`.

    .venv/bin/python benchmarks/determinism.py                          # default model, 64x64, 64 frames
    .venv/bin/python benchmarks/determinism.py --model random:tiny --precision fp32 --size 32

Renders one synthetic shot with `alaya-flash batch --engine local` as float32 EXR frames (every bit
of the frames), with --threads 1, --threads 1 again in a second process, and --threads 2 (each
process started with OMP_NUM_THREADS equal to its --threads), and
prints the largest difference (in 1/255 steps of the linear EXR values) and how many frames differ
between them. How far the bits move depends on the content and prompt (a stream amplifies a last-bit
difference through its KV cache or lets it round away). Figures only (docs/runner.md, "Determinism").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import ROOT, import_package

CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]


def frames(folder: Path) -> np.ndarray:
    from alaya_flash.streaming.files.image_files import read_exr

    return np.stack([np.stack([read_exr(p)[c] for c in "RGB"], -1) for p in sorted(folder.glob("*.exr"))])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--prompt", default="a sunny street")
    p.add_argument("--input", type=Path, help="a G-buffer clip to render instead of a synthetic one "
                   "(e.g. from `alaya-flash world --out clips/w --frames 120 --size 128`)")
    args = p.parse_args(argv)
    import_package()
    from alaya_flash.streaming.files.sinks import NpyWindowSink, write_stream
    from alaya_flash.streaming.files.synthetic import synthetic_stream

    with tempfile.TemporaryDirectory(prefix="alaya-determinism-") as tmp:
        tmp = Path(tmp)
        if args.input is not None:
            (tmp / "shot").symlink_to(args.input.resolve())
        else:
            write_stream(synthetic_stream(args.size, args.size, args.frames, seed=1), NpyWindowSink(tmp / "shot"))
        runs = {}
        for label, threads in (("1 thread", 1), ("1 thread, another process", 1), ("2 threads", 2)):
            out = tmp / label.replace(" ", "").replace(",", "")
            subprocess.run([*CLI, "--quiet", "batch", str(ROOT / "workflows" / "api" / "render-gbuffer-sequence.json"),
                            "--inputs", str(tmp / "shot"), "--out", f"{out}/{{name}}", "--engine", "local",
                            "--set", f"Load Flash Model.model={args.model}", "--set", f"Load Flash Model.precision={args.precision}",
                            "--set", f"Encode Prompt.text={args.prompt}", "--set", "Save.format=exr", "--threads", str(threads)], cwd=ROOT, check=True,
                           env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
            runs[label] = frames(out / "shot")
        base = runs["1 thread"]
        for label, x in runs.items():
            d = np.abs(x.astype(np.float64) - base)
            print(json.dumps({"vs 1 thread": label, "max_diff_255": round(float(d.max()) * 255, 2),
                              "frames_differing": int((d.reshape(len(d), -1).max(1) > 0).sum()), "frames": len(d),
                              "first_differing": int(np.argmax(d.reshape(len(d), -1).max(1) > 0)) if d.max() > 0 else None,
                              "model": args.model, "precision": args.precision, "prompt": args.prompt}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
