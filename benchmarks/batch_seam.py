"""The seam of a split shot (`batch --split N --preroll P`): how the join looks against the whole render.

    alaya-flash world --out w5 --frames 120 --size 128 --seed 5
    .venv/bin/python benchmarks/batch_seam.py --input w5 --split 40 --preroll 0 8 16 32

Renders the shot whole and split (PNG frames, `batch --engine local`, 1 thread), then, at every
seam (the first frame of each part after the first), prints for each pre-roll:
  seam_jump     mean |frame[a] - frame[a-1]| (0-255) across the seam of the split render
  whole_jump    the same two frames' step in the whole render (the motion that is really there)
  steady_jump   the whole render's mean step between consecutive frames
  after_seam    mean |split - whole| over the 8 frames from the seam on (the parts are other streams)
  first_part    mean |split - whole| over the first part's frames before its end (same stream start)
A seam shows as seam_jump well above whole_jump. Figures only (docs/runner.md, "Long shots").
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from _common import ROOT, import_package

CLI = [sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); import conftest; "
       "from alaya_flash.streaming.cli import main; sys.exit(main())"]


def frames(folder: Path) -> np.ndarray:
    from PIL import Image

    return np.stack([np.asarray(Image.open(p), dtype=np.float64) for p in sorted(folder.glob("*.png"))])


def render(tmp: Path, out: str, clip: Path, args, extra: list[str]) -> np.ndarray:
    subprocess.run([*CLI, "--quiet", "batch", str(ROOT / "workflows" / "api" / "render-gbuffer-sequence.json"),
                    "--inputs", str(clip), "--out", f"{tmp / out}/{{name}}", "--engine", "local", "--threads", "1",
                    "--set", f"Load Flash Model.model={args.model}", "--set", f"Encode Prompt.text={args.prompt}", "--set", "Save.format=png",
                    *extra], cwd=ROOT, check=True)
    return frames(tmp / out / clip.name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=Path, required=True, help="a G-buffer clip (folder or .npy)")
    p.add_argument("--model", default="default")
    p.add_argument("--prompt", default="a sunny street")
    p.add_argument("--split", type=int, default=40)
    p.add_argument("--preroll", type=int, nargs="+", default=[0, 8, 16, 32])
    args = p.parse_args(argv)
    import_package()
    with tempfile.TemporaryDirectory(prefix="alaya-seam-") as tmp:
        tmp = Path(tmp)
        clip = tmp / "shot"
        clip.symlink_to(args.input.resolve())
        whole = render(tmp, "whole", clip, args, [])
        steps = np.abs(np.diff(whole, axis=0)).mean(axis=(1, 2, 3))
        seams = list(range(args.split, len(whole), args.split))
        for preroll in args.preroll:
            split = render(tmp, f"p{preroll}", clip, args, ["--split", str(args.split), "--preroll", str(preroll)])
            assert split.shape == whole.shape, (split.shape, whole.shape)
            jump = [float(np.abs(split[a] - split[a - 1]).mean()) for a in seams]
            after = [float(np.abs(split[a:a + 8] - whole[a:a + 8]).mean()) for a in seams]
            print(json.dumps({"preroll": preroll, "split": args.split, "seams": seams,
                              "seam_jump": round(float(np.mean(jump)), 2),
                              "whole_jump": round(float(np.mean([steps[a - 1] for a in seams])), 2),
                              "steady_jump": round(float(steps.mean()), 2),
                              "after_seam": round(float(np.mean(after)), 2),
                              "first_part": round(float(np.abs(split[:args.split - 4] - whole[:args.split - 4]).mean()), 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
