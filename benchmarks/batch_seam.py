"""The seam of a split shot (`batch --split N --preroll P --overlap O`): the step across the join
against the clip's own steps between frames.

    alaya-flash world --out w5 --frames 160 --size 128 --seed 5      # and seeds 6, 7
    .venv/bin/python benchmarks/batch_seam.py --input w5 --split 16 --variants 48:8 0:0   # and --split 20

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
  median_seam_step, whole_median_seam_step  the median over the seams of each seam's worst step
                 (split; whole over the same steps): with a small --split (16, 20) the seams are a
                 sample, not 3 frames; median_seam_vs_median is median_seam_step - median_step
  median_window_step  the same statistic anywhere in the clip: the median, over every run of as many
                 consecutive steps as a seam's region, of its worst step (a worst of 9 is below a
                 median of 1 wherever it is taken)
  median_cut_step the median over the seams of the step onto each part's first own frame (one step,
                 like median_step), and whole_median_cut_step the whole render's there
  seam_steps, whole_seam_steps  each seam's worst step (split, whole)
--steps-out FILE writes every variant's steps (and the whole render's) as JSON, for other statistics.
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
    p.add_argument("--steps-out", type=Path, help="write the steps of every render here (JSON)")
    args = p.parse_args(argv)
    import_package()
    with tempfile.TemporaryDirectory(prefix="alaya-seam-") as tmp:
        tmp = Path(tmp)
        clip = tmp / "shot"
        clip.symlink_to(args.input.resolve())
        whole = render(tmp, "whole", clip, args, [])
        whole_steps = steps_db(whole)
        seams = list(range(args.split, len(whole), args.split))
        dump = {"whole": whole_steps.round(3).tolist(), "seams": seams}
        for variant in args.variants:
            preroll, overlap = (int(v) for v in variant.split(":"))
            split = render(tmp, f"p{preroll}-o{overlap}", clip, args,
                           ["--split", str(args.split), "--preroll", str(preroll), "--overlap", str(overlap)])
            assert split.shape == whole.shape, (split.shape, whole.shape)
            s = steps_db(split)
            regions = [list(range(a - overlap - 1, a)) for a in seams]  # steps into a - overlap .. onto a
            region = [k for r in regions for k in r]
            seam_step = float(s[region].min())
            per_seam = np.array([s[r].min() for r in regions])
            whole_per_seam = np.array([whole_steps[r].min() for r in regions])
            windows = np.lib.stride_tricks.sliding_window_view(s, overlap + 1).min(axis=1)
            cuts = [a - 1 for a in seams]
            dump[variant] = s.round(3).tolist()
            print(json.dumps({
                "preroll": preroll, "overlap": overlap, "split": args.split, "seams": seams,
                "median_step": round(float(np.median(s)), 2), "whole_median_step": round(float(np.median(whole_steps)), 2),
                "seam_step": round(seam_step, 2), "whole_seam_step": round(float(whole_steps[region].min()), 2),
                "seam_vs_median": round(seam_step - float(np.median(s)), 2),
                "seam_vs_whole": round(float((s[region] - whole_steps[region]).min()), 2),
                "cut_step": round(float(s[[a - 1 for a in seams]].min()), 2),
                "whole_cut_step": round(float(whole_steps[[a - 1 for a in seams]].min()), 2),
                "after_seam": round(float(np.mean([np.abs(split[a:a + 8] - whole[a:a + 8]).mean() for a in seams])), 2),
                "median_seam_step": round(float(np.median(per_seam)), 2),
                "whole_median_seam_step": round(float(np.median(whole_per_seam)), 2),
                "median_seam_vs_median": round(float(np.median(per_seam) - np.median(s)), 2),
                "median_window_step": round(float(np.median(windows)), 2),
                "median_cut_step": round(float(np.median(s[cuts])), 2),
                "whole_median_cut_step": round(float(np.median(whole_steps[cuts])), 2),
                "seam_steps": [round(float(v), 2) for v in per_seam],
                "whole_seam_steps": [round(float(v), 2) for v in whole_per_seam],
            }), flush=True)
        if args.steps_out:
            args.steps_out.write_text(json.dumps(dump))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
