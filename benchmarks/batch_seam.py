"""The seam of a split shot (`batch --split N --preroll P --overlap O`): the step across the join
against the clip's own steps between frames.

    alaya-flash world --out w5 --frames 160 --size 128 --seed 5
    .venv/bin/python benchmarks/batch_seam.py --input w5 --split 40 --variants 0:0 48:0 48:8 16:8

Renders the shot whole and split (PNG frames, `batch --engine local`, 1 thread), each variant
PRE-ROLL:OVERLAP, then prints per variant (PSNR in dB of one frame against the one before it, a
"step"; lower is a bigger change):
  median_step    the split render's median step over the whole clip (the clip's own motion)
  seam_step      the worst step in each seam's region (from the step into its first crossfaded
                 frame to the step onto the part's first own frame; the one step across the cut
                 without overlap), worst over the seams
  whole_seam_step the whole render's worst step over the same steps (the motion that is really
                 there: faster than the median near some seams)
  seam_vs_median seam_step - median_step (>= -0.5: within 0.5 dB of the clip's median step)
  seam_vs_whole  the worst, over the same steps, of split step - whole step (what the join adds)
  cut_step       the step onto each part's first own frame (a - 1 -> a), worst over the seams, and
                 whole_cut_step the whole render's there
  after_seam     mean |split - whole| (0-255) over the 8 frames from each seam on (the parts are
                 other streams from their first frame)
Figures only (docs/runner.md, "Long shots").
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
                    "--set", f"Load Flash Model.model={args.model}", "--set", f"Encode Prompt.text={args.prompt}",
                    "--set", "Save.format=png", *extra], cwd=ROOT, check=True)
    return frames(tmp / out / clip.name)


def steps_db(video: np.ndarray) -> np.ndarray:
    """PSNR of each frame against the one before: [k - 1] is the step k - 1 -> k."""
    mse = ((video[1:] - video[:-1]) ** 2).mean(axis=(1, 2, 3))
    return 10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-10))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=Path, required=True, help="a G-buffer clip (folder or .npy)")
    p.add_argument("--model", default="default")
    p.add_argument("--prompt", default="a sunny street")
    p.add_argument("--split", type=int, default=40)
    p.add_argument("--variants", nargs="+", default=["0:0", "48:0", "48:8", "16:8"], metavar="PREROLL:OVERLAP")
    args = p.parse_args(argv)
    import_package()
    with tempfile.TemporaryDirectory(prefix="alaya-seam-") as tmp:
        tmp = Path(tmp)
        clip = tmp / "shot"
        clip.symlink_to(args.input.resolve())
        whole = render(tmp, "whole", clip, args, [])
        whole_steps = steps_db(whole)
        seams = list(range(args.split, len(whole), args.split))
        for variant in args.variants:
            preroll, overlap = (int(v) for v in variant.split(":"))
            split = render(tmp, f"p{preroll}-o{overlap}", clip, args,
                           ["--split", str(args.split), "--preroll", str(preroll), "--overlap", str(overlap)])
            assert split.shape == whole.shape, (split.shape, whole.shape)
            s = steps_db(split)
            region = [k for a in seams for k in range(a - overlap - 1, a)]  # steps into a - overlap .. onto a
            seam_step = float(s[region].min())
            print(json.dumps({
                "preroll": preroll, "overlap": overlap, "split": args.split, "seams": seams,
                "median_step": round(float(np.median(s)), 2), "whole_median_step": round(float(np.median(whole_steps)), 2),
                "seam_step": round(seam_step, 2), "whole_seam_step": round(float(whole_steps[region].min()), 2),
                "seam_vs_median": round(seam_step - float(np.median(s)), 2),
                "seam_vs_whole": round(float((s[region] - whole_steps[region]).min()), 2),
                "cut_step": round(float(s[[a - 1 for a in seams]].min()), 2),
                "whole_cut_step": round(float(whole_steps[[a - 1 for a in seams]].min()), 2),
                "after_seam": round(float(np.mean([np.abs(split[a:a + 8] - whole[a:a + 8]).mean() for a in seams])), 2),
            }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
