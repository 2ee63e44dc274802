"""Shared pieces of the training tests: config files, the tiny DiT, every stage run once, the benchmarks.

`build_runs` is the body of the session-scoped `runs` fixture (conftest.py): every test file of the
training recipe reads the same runs, made once per test session.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from alaya_flash.streaming.cli import main

ROOT = Path(__file__).resolve().parents[1]
# The Mitsuba variant of the tests' tiny world v2 datasets (32x32, 2 spp), whose subject is the data stage and what
# reads its clips, not the tracer: scalar_rgb traces them in a quarter of llvm_ad_rgb's CPU time (its kernels'
# compiling is most of a tiny frame's time). What "auto" (llvm_ad_rgb here) traces: test_world_v2.py, the guard.
TINY_VARIANT = "scalar_rgb"
TINY_DIT = {"dit": "dit-tiny", "dim": 32, "ffn_dim": 64, "num_heads": 2, "num_layers": 2}


def write(path, cfg: dict):
    path.write_text(json.dumps(cfg))
    return str(path)


def load_benchmark(name: str):
    """benchmarks/NAME.py, imported as a module (the folder is not a package; its scripts import _common
    as a sibling, as they do when run as files)."""
    folder = str(ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def build_runs(tmp_path_factory) -> Path:
    """Every stage once, in order, on a 2-clip 32x32 dataset; returns the folder of the runs."""
    root = tmp_path_factory.mktemp("train")
    d = lambda name: str(root / name)  # noqa: E731
    base = {"ckpt_every": 2, "log_every": 1, "batch": 2}
    stages = [
        ("data", {"out": d("data"), "width": 32, "height": 32, "frames": 9, "train_clips": 2, "heldout_clips": 1,
                  "objects": 3, "presets": ["bright_sunny", "moonlit_night"]}),
        ("vae", {**base, "out": d("vae"), "data": d("data"), "steps": 3, "base_dim": 4, "frames": 5, "crop": 16,
                 "motion_weight": 1.0, "chroma_weight": 1.0}),
        ("codecs", {**base, "out": d("codecs"), "data": d("data"), "vae_run": d("vae"), "steps": 2, "frames": 5, "crop": 16,
                    "motion_weight": 1.0, "boundary_weight": 2.0}),
        ("teacher", {**base, **TINY_DIT, "out": d("teacher"), "data": d("data"), "vae_run": d("vae"),
                     "cond_encoder": "vae", "frames": 9, "steps": 3, "text_noise": 0.5}),
        ("student-ode", {**base, "out": d("ode"), "teacher_run": d("teacher"), "codecs_run": d("codecs"), "pairs": 2,
                         "ode_steps": 4, "chunk_frames": 1, "steps": 2, "data_weight": 1.0, "clean_context": 0.5,
                         "text_noise": 0.5}),
        ("student-dmd", {**base, "out": d("dmd"), "teacher_run": d("teacher"), "student_run": d("ode"),
                         "codecs_run": d("codecs"), "chunk_frames": 1, "gen_every": 2, "steps": 3}),
        ("student-rollout", {**base, "out": d("rollout"), "student_run": d("ode"), "data": d("data"), "vae_run": d("vae"),
                             "codecs_run": d("codecs"), "frames": 9, "window_frames": 2, "sink_frames": 1, "steps": 2,
                             "pair_weight": 1.0}),
        ("decoder", {**base, "out": d("decoder"), "student_run": d("rollout"), "codecs_run": d("codecs"),
                     "latents": str(root / "rollout" / "latents-train.safetensors"), "crop": 16, "window_frames": 2,
                     "sink_frames": 1, "steps": 2, "pair_weight": 1.0}),
        ("export", {"out": d("model"), "student_run": d("dmd"), "teacher_run": d("teacher"), "codecs_run": d("codecs"),
                    "vae_run": d("vae"), "trained_size": [32, 32], "teacher_window_frames": 9,
                    "teacher_cfg": 3.0}),
        ("refiner", {**base, "out": d("refiner"), "model": d("model"), "data": d("data"), "clips": 2, "crop": 16,
                     "steps": 2, "precision": "fp32"}),
        ("export", {"out": d("model"), "student_run": d("dmd"), "teacher_run": d("teacher"), "codecs_run": d("codecs"),
                    "vae_run": d("vae"), "refiner_run": d("refiner"), "trained_size": [32, 32],
                    "teacher_window_frames": 9, "teacher_cfg": 3.0}),
    ]
    for stage, cfg in stages:
        assert main(["--quiet", "train", stage, "--config", write(root / f"{stage}.json", cfg)]) == 0, stage
    return root


def rollout_config(runs: Path, out: Path, **extra) -> dict:
    """25 steps of student-rollout on the fixture's data from its ODE student (lr 3e-3, 9-frame clips)."""
    return {"out": str(out), "student_run": str(runs / "ode"), "data": str(runs / "data"), "vae_run": str(runs / "vae"),
            "codecs_run": str(runs / "codecs"), "frames": 9, "window_frames": 2, "sink_frames": 1, "batch": 2,
            "lr": 3e-3, "steps": 25, "log_every": 1, "ckpt_every": 25, **extra}


def world_v2_config(out: Path, **extra):
    """The training tests' world v2 dataset: 2 path-traced clips of 5 frames (a street, a courtyard) at
    32x32 under bright_sunny (a sun, so captions name its side) and overcast (none)."""
    from alaya_flash.training.data import DataConfig

    return DataConfig(out=str(out), width=32, height=32, frames=5, fps=8.0, train_clips=2, heldout_clips=0,
                      world="pathtrace", scenes=("street", "courtyard"), presets=("bright_sunny", "overcast"), spp=2,
                      variant=TINY_VARIANT, **extra).validate()


def build_world_v2_data(root: Path) -> Path:
    """The body of the session-scoped `world_v2_data` fixture (conftest.py): world_v2_config built once."""
    from alaya_flash.training.data import build_dataset

    build_dataset(world_v2_config(root / "world-v2-data"))
    return root / "world-v2-data"


def build_mixed(runs: Path) -> Path:
    """runs/mix-data: 2 clips of other seeds under two presets the fixture's data lacks; runs/mixed: the
    rollout student trained with it mixed into half its steps (mix_rate 0.5)."""
    data = {"out": str(runs / "mix-data"), "width": 32, "height": 32, "frames": 9, "train_clips": 2, "heldout_clips": 0,
            "train_seed": 50, "objects": 3, "presets": ["cyberpunk_neon", "snowy_winter", "underwater"]}
    assert main(["--quiet", "train", "data", "--config", write(runs / "mix-data.json", data)]) == 0
    conf = rollout_config(runs, runs / "mixed", mix_data=str(runs / "mix-data"), mix_rate=0.5)
    assert main(["--quiet", "train", "student-rollout", "--config", write(runs / "mixed.json", conf)]) == 0
    return runs
