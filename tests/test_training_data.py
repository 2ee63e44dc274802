"""Training data: the rendered dataset (splits, presets, the turned ground truth of sun_turns),
its wordings, its config checking, and benchmarks/sun_side.py."""
from __future__ import annotations

import json

import pytest

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.cli import main
from training_helpers import load_benchmark, write


def test_turned_ground_truth_is_the_same_whichever_way_the_world_faces(monkeypatch):
    """sun_turns 4: the mean over the world's turns by 90 degrees does not change when the light
    itself is turned by 90 degrees (what a renderer cannot see on a square courtyard), while the
    one-sun ground truth does. The G-buffers and that ground truth are the data without turns."""
    from alaya_flash.training import data
    from alaya_flash.streaming.world import shading

    cfg = data.DataConfig(width=32, height=32, frames=5, objects=4, presets=("bright_sunny", "cyberpunk_neon"),
                          sun_turns=4)
    first = data.render_clip(cfg, 5)
    plain = data.render_clip(data.DataConfig(**{**cfg.__dict__, "sun_turns": 1}), 5)
    assert "rgb_turned" not in plain and set(first) == {"gbuffers", "rgb", "presets", "rgb_turned", "light", "up"}
    assert (first["rgb"] == plain["rgb"]).all() and (first["gbuffers"] == plain["gbuffers"]).all()
    for name in cfg.presets:  # cyberpunk_neon: its fill lights turn too
        monkeypatch.setitem(shading.PRESETS, name, shading.turned(shading.PRESETS[name], 90))
    second = data.render_clip(cfg, 5)
    diff = lambda a, b: abs(a.astype(int) - b.astype(int))  # noqa: E731
    assert (second["gbuffers"] == first["gbuffers"]).all()
    for q in range(2):
        assert diff(second["rgb"][q], first["rgb"][q]).mean() > 2  # the light moved
        assert diff(second["rgb_turned"][q], first["rgb_turned"][q]).max() <= 1  # its mean over turns did not
        assert diff(first["rgb_turned"][q], first["rgb"][q]).mean() > 1


@pytest.mark.parametrize("bad, message", [
    ({"sun_turns": 0}, "data config: sun_turns 0 must be >= 1"),
    ({"presets": ["dusk"]}, "data config: preset 'dusk' is unknown"),
    ({"heldout_seed": 3}, "data config: held-out seeds overlap the training seeds"),
])
def test_bad_data_config_is_refused(bad, message, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "d"), "width": 32, "height": 32, "frames": 5, "train_clips": 4, **bad}
    assert main(["--quiet", "train", "data", "--config", write(tmp_path / "d.json", cfg)]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_dataset_made_before_sun_turns_still_resumes(runs, tmp_path):
    import shutil

    from alaya_flash.training.data import ClipSet, DataConfig, build_dataset

    shutil.copytree(runs / "data", tmp_path / "data")
    meta_path = tmp_path / "data" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    del meta["config"]["sun_turns"]
    meta["config"]["out"] = str(tmp_path / "data")
    meta_path.write_text(json.dumps(meta))
    config = {**meta["config"], "out": str(tmp_path / "data"), "presets": tuple(meta["config"]["presets"])}
    build_dataset(DataConfig(**config))  # no clip is rendered again and nothing is refused
    assert ClipSet(tmp_path / "data", "train").rgb_turned is None
    with pytest.raises(AlayaError, match="dataset made with another config"):
        build_dataset(DataConfig(**{**config, "sun_turns": 4}))


def test_dataset_splits_share_no_seed_and_hold_every_preset(runs):
    from alaya_flash.training.data import ClipSet

    train, held = ClipSet(runs / "data", "train"), ClipSet(runs / "data", "heldout")
    assert train.rgb.shape == (2, 2, 9, 32, 32, 3) and train.gbuffers.shape == (2, 9, 5, 32, 32, 3)
    assert held.rgb.shape[0] == 1
    meta = json.loads((runs / "data" / "dataset.json").read_text())
    assert not set(meta["clips"]["train"]) & set(meta["clips"]["heldout"])
    # same geometry, different light: the presets differ in RGB but share one G-buffer clip
    assert (train.rgb[0, 0].astype(int) - train.rgb[0, 1].astype(int)).__abs__().mean() > 5
    prompts = meta["prompts"]["bright_sunny"]
    assert len(prompts["train"]) == 8 and len(prompts["heldout"]) == 2
    assert not set(prompts["train"]) & set(prompts["heldout"])


def test_every_preset_has_distinct_training_heldout_refiner_and_anchor_wordings():
    from alaya_flash.training.prompts import prompts
    from alaya_flash.streaming.world.shading import PRESETS

    seen = set()
    for name in PRESETS:
        train, held, refiner, anchor = (prompts(name, split) for split in ("train", "heldout", "refiner", "anchor"))
        assert train[0] == PRESETS[name].prompt and len(set(train)) == 8 and len(set(held)) == 2
        assert len(set(refiner)) == 6 and len(set(anchor)) == 10
        assert not set(train) & set(held) and not set(refiner) & (set(train) | set(held)), name
        assert not set(anchor) & (set(train) | set(held) | set(refiner)), name
        everything = set(train) | set(held) | set(refiner) | set(anchor)
        assert not everything & seen, name  # none shared between presets either
        seen |= everything
    with pytest.raises(ValueError, match="'test' is not one of train, heldout, refiner, anchor"):
        prompts("overcast", "test")


def test_sun_side_script_scores_the_blend_and_the_wrong_side(capsys):
    """benchmarks/sun_side.py: on a new scene the blend of four sun azimuths is nearer bright_sunny's
    ground truth than the sun turned to the other side is; the turned sun is nearer overcast's."""
    script = load_benchmark("sun_side")
    assert script.main(["--seeds", "100000", "--size", "48", "--frames", "5", "--stride", "2"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["blend"]["psnr_sunny_db"] > report["turned"]["psnr_sunny_db"]
    assert report["turned"]["nearest_sunny"] is False and report["turned"]["margin_db"] < 0


def test_a_clip_records_the_light_its_truth_was_shaded_with(tmp_path):
    """The stored per-frame light and up vector, through the shading prior, give back the clip's truth:
    the physics world's truth is the prior's shading model (without shadows here, as data.json renders)."""
    import torch

    from alaya_flash.model_zoo.light import PACKED
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming import metrics
    from alaya_flash.training.data import DataConfig, render_clip

    cfg = DataConfig(out=str(tmp_path / "d"), width=32, height=32, frames=5, presets=("bright_sunny", "sunset_dramatic"),
                     train_clips=1, heldout_clips=1).validate()
    clip = render_clip(cfg, 7)
    assert clip["light"].shape == (2, 5, PACKED) and clip["up"].shape == (5, 3)
    for p in range(2):
        out = ShadingPrior()(torch.from_numpy(clip["gbuffers"]), torch.from_numpy(clip["light"][p]),
                             up=torch.from_numpy(clip["up"]), sun_visibility=torch.ones(5, 32, 32), ao=False)
        truth = torch.from_numpy(clip["rgb"][p]).permute(0, 3, 1, 2).float() / 255
        assert metrics.psnr(out[:, :3], truth) >= 45.0


def test_a_world_v2_clip_records_its_scenes_exposure_in_the_light():
    """World v2's truth is tone-mapped with the preset's exposure times the scene's (interiors 2x): the
    recorded light carries both, so the prior exposes as the truth does."""
    import numpy as np

    from alaya_flash.model_zoo.light import SLICES
    from alaya_flash.streaming.world.traced import TRACED_PRESETS
    from alaya_flash.training.data import DataConfig, render_traced_clip

    cfg = DataConfig(width=16, height=16, frames=5, train_clips=1, heldout_clips=0, world="pathtrace",
                     scenes=("interior",), presets=("bright_sunny",), spp=1).validate()
    clip, info = render_traced_clip(cfg, 3)
    assert info["scene"] == "interior"
    exposure = clip["light"][0, :, SLICES["exposure"]]
    assert np.allclose(exposure, TRACED_PRESETS["bright_sunny"].base.exposure * 2.0)
