"""Score G-buffer refiners on the same unrefined frames, as `alaya-flash eval` scores a model.

`alaya-flash eval` renders every held-out clip under every preset again for each model folder. A
refiner changes only the last step, so this renders the model's unrefined frames once, exactly as
eval streams them (seed 0, 4-frame chunks, each preset's training caption and first held-out
paraphrase), keeps them in --cache (rendered again when the model's tensors, the data or the
precision change), and refines them with each candidate. It prints one JSON line per candidate
with eval's content (PSNR, SSIM; training wording) and control (both wordings) figures: for a
model folder's own refiner they equal eval's with `--heldout-wordings 1` (tested; eval scores both
held-out paraphrases by default). A candidate is a `train refiner` run
folder, a model folder (its refiner.safetensors), or `none` (the decoder's frames).

    .venv/bin/python scripts/compare_refiners.py --model model_zoo/default --data runs/data --clips 4 \\
        --cache runs/heldout-unrefined.safetensors model_zoo/default runs/refiner none
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def unrefined_frames(model_dir: str, data: str, clips: int, precision: str, cache: Path | None, log=print,
                     presets: str = "all"):
    """{"C.PRESET.KIND": frames float (T, H, W, 3)} of the model without its refiner; the clips, preset names
    and wordings (eval's)."""
    from alaya_flash.model_zoo import folders
    from alaya_flash.model_zoo.loading import read_metadata, read_state_dict, save_safetensors
    from alaya_flash.training.refiner import _model_stamp
    from alaya_flash.training.eval import _clips, _render
    from alaya_flash.streaming.render.pipelines import FlashPipeline
    from alaya_flash.streaming.values import PromptSchedule

    found, names, prompts = _clips(argparse.Namespace(presets=presets, data=data, clips=clips, frames=None), None)
    recipe = {"weights": _model_stamp(Path(model_dir)), "data": str(data), "clips": len(found), "presets": names,
              "precision": precision}
    if cache is not None and cache.is_file() and json.loads(read_metadata(cache).get("recipe", "{}")) == recipe:
        return read_state_dict(cache), found, names, prompts
    model = folders.load_flash(model_dir, dtype=torch.bfloat16 if precision == "bf16" else torch.float32)
    text = model.text_encoder()
    frames = {}
    for c, gb in enumerate(clip["gbuffers"] for clip in found):
        for name in names:
            for kind in ("train", "heldout"):
                pipe = FlashPipeline(model, PromptSchedule.encode(text, prompts[name][kind]), seed=0, refine=False)
                frames[f"{c}.{name}.{kind}"] = _render(pipe, gb)[0].float().contiguous()
        log(f"rendered clip {c + 1}/{len(found)} under {len(names)} presets, both wordings")
    if cache is not None:
        save_safetensors(frames, cache, {"recipe": recipe})
    return frames, found, names, prompts


def load_candidate(spec: str):
    """A refiner from a `train refiner` run or a model folder; None for 'none'."""
    from alaya_flash.model_zoo import folders
    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.training.refiner import load_run

    if spec == "none":
        return None
    path = Path(spec)
    if (path / "config.json").is_file():
        refiner = folders.load_flash(path, dtype=torch.float32).refiner
        if refiner is None:
            raise AlayaError(f"{spec}: this model folder has no refiner")
        return refiner
    return load_run(path)[0]


def score(net, frames: dict, found, names, prompts, precision: str) -> dict:
    """eval's content and control figures of the frames refined by `net` (None: as they are)."""
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.streaming import metrics
    from alaya_flash.training.eval import _mean, control_record

    if net is not None:
        net = net.to(torch.bfloat16 if precision == "bf16" else torch.float32).eval()
    encode = TextEncoder.load() if net is not None and net.text_dim else None
    psnr, ssim = [], []
    control = {kind: {"hits": [], "margins": [], "misses": []} for kind in ("train", "heldout")}
    for c, (gb, rgb) in enumerate((clip["gbuffers"], clip["rgb"]) for clip in found):
        gt = [torch.from_numpy(rgb[p]).float() / 255 for p in range(len(names))]
        for p, name in enumerate(names):
            for kind in ("train", "heldout"):
                out = frames[f"{c}.{name}.{kind}"]
                if net is not None:
                    text = encode([prompts[name][kind]])[0, 0].float().expand(len(out), -1) if encode else None
                    with torch.no_grad():
                        out = net.refine(out, torch.from_numpy(gb), text)
                hit, margin, miss = control_record(out, gt, p, names, c)
                control[kind]["hits"].append(hit)
                control[kind]["margins"].append(margin)
                if miss:
                    control[kind]["misses"].append(miss)
                if kind == "train":
                    psnr.append(metrics.psnr(out, gt[p]))
                    ssim.append(metrics.ssim(out, gt[p]))
    return {"content": {"psnr_db": _mean(psnr), "ssim": _mean(ssim)},
            "control": {f"{kind}_wordings": {"nearest_rate": _mean(v["hits"]), "margin_db": _mean(v["margins"]),
                                             "misses": v["misses"]} for kind, v in control.items()}}


def main(argv=None) -> int:
    from alaya_flash.model_zoo.errors import AlayaError

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidates", nargs="+", help="`train refiner` run folders, model folders, or none")
    parser.add_argument("--model", default="model_zoo/default", help="the model whose unrefined frames are refined")
    parser.add_argument("--data", default="runs/data", help="dataset folder (its held-out split)")
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--presets", default="all", help="comma-separated preset names, as eval's --presets")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--cache", type=Path, default=None, help="safetensors file to keep the unrefined frames in")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.cache is not None and args.cache.suffix != ".safetensors":
            raise AlayaError(f"--cache {args.cache}: frames are kept in a .safetensors file")
        nets = [load_candidate(spec) for spec in args.candidates]  # bad candidates fail before any rendering
        log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
        frames, found, names, prompts = unrefined_frames(args.model, args.data, args.clips, args.precision, args.cache, log,
                                                         args.presets)
        for spec, net in zip(args.candidates, nets):
            print(json.dumps({"candidate": spec, **score(net, frames, found, names, prompts, args.precision)}), flush=True)
    except AlayaError as e:
        print(f"compare_refiners: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
