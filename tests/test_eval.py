"""`alaya-flash eval`: the five-axis report on tiny random models and a tiny held-out set; the metrics."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from alaya_flash.streaming import metrics
from alaya_flash.streaming.cli import main
from training_helpers import TINY_VARIANT


@pytest.fixture(scope="module", autouse=True)
def _light_head_scored_once():
    """Every eval scores the shipped light head on its 262 held-out texts (MiniLM on each alone: seconds);
    the same files give the same figures, so this file's evals share the first one's. That one reads the
    texts' encodings through the session's prompt store (the bits MiniLM gives each text alone), where
    test_lighting.py's test of the same head puts them (or takes them from)."""
    import functools

    from alaya_flash.model_zoo.bundle import model_text_encoder
    from alaya_flash.model_zoo.text_encoder import MINILM
    from alaya_flash.training import eval as ev
    from alaya_flash.training import light_head as stage

    score, scores = stage.score, ev.light_head_scores

    def through_the_store():
        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(stage, "score", lambda head, _encoder, items, encoded=None:
                          score(head, model_text_encoder(MINILM), items, encoded))
            return scores()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ev, "light_head_scores", functools.cache(through_the_store))
        yield


def test_noise_free_psnr_sees_through_the_truths_noise():
    """A render scored against a noisy truth whose noise power is known: noise_free_psnr gives its PSNR
    against the clean image (within 0.2 dB), where plain PSNR is dragged down by the truth's noise."""
    g = torch.Generator().manual_seed(0)
    clean = torch.rand(4, 64, 64, 3, generator=g)
    truth = clean + 0.05 * torch.randn(clean.shape, generator=g)
    render = clean + 0.03 * torch.randn(clean.shape, generator=g)
    want = metrics.psnr(render, clean)
    assert metrics.noise_free_psnr(render, truth, 0.05 ** 2) == pytest.approx(want, abs=0.2)
    assert metrics.psnr(render, truth) < want - 3
    # a render closer to the truth than its noise allows is floored, not infinite or undefined
    assert math.isfinite(metrics.noise_free_psnr(truth, truth, 0.05 ** 2))


def test_metrics_on_known_inputs():
    torch.manual_seed(0)
    x = torch.rand(5, 16, 16, 3)
    assert metrics.psnr(x, x) == math.inf
    assert metrics.ssim(x, x) == pytest.approx(1.0, abs=1e-5)
    assert metrics.psnr(x, (x + 0.1).clamp(0, 1)) < metrics.psnr(x, (x + 0.01).clamp(0, 1))
    worse = x.clone()
    worse[1:5] = (worse[1:5] + 0.1).clamp(0, 1)  # latent 1's frames only
    by_latent = metrics.psnr_by_latent(worse, x)
    assert len(by_latent) == 2 and by_latent[0] == math.inf and by_latent[1] < 30
    assert len(metrics.psnr_by_latent(torch.rand(9, 4, 4, 3), torch.rand(9, 4, 4, 3))) == 3
    still = x[:1].expand(5, -1, -1, -1)
    assert metrics.temporal(still, x)["ratio"] == 0.0
    t = metrics.temporal(x, x)
    assert t["diff_error"] == 0.0 and t["ratio"] == pytest.approx(1.0)
    # a jump only at frame 3: boundary at 3 changes, inside chunks nothing does
    jump = torch.cat([torch.zeros(3, 4, 4, 3), torch.ones(2, 4, 4, 3)])
    assert metrics.boundary_ratio(jump + 0.01 * torch.arange(5.0).view(5, 1, 1, 1), [3]) > 10
    assert metrics.boundary_ratio(x, []) is None
    refs = [torch.zeros_like(x), x, torch.ones_like(x)]
    near = metrics.nearest(x, refs, 1)
    assert near["hit"] and near["margin_db"] == math.inf
    near = metrics.nearest(x, refs, 0)
    assert not near["hit"] and near["margin_db"] < 0 and near["nearest"] == 1


def test_psnr_by_scale_finds_where_the_error_lives():
    """A render whose light is off everywhere (less light added everywhere: a coarse error) is mended at
    every scale; one whose detail is off (1-pixel noise) is mended at none; the two together only as far
    as the noise leaves."""
    from alaya_flash.streaming.gbuffer import linear_to_srgb, srgb_to_linear

    g = torch.Generator().manual_seed(0)
    truth = torch.rand(3, 40, 56, 3, generator=g) * 0.5 + 0.25  # sides 8 does not divide evenly
    dim = torch.from_numpy(linear_to_srgb(srgb_to_linear(truth.numpy()) - 0.04))
    noisy = (truth + 0.03 * torch.randn(truth.shape, generator=g)).clamp(0, 1)
    both = (dim + 0.03 * torch.randn(truth.shape, generator=g)).clamp(0, 1)
    base = {name: metrics.psnr(x, truth) for name, x in (("dim", dim), ("noisy", noisy), ("both", both))}
    by = {name: metrics.psnr_by_scale(x, truth) for name, x in (("dim", dim), ("noisy", noisy), ("both", both))}
    assert list(by["dim"]) == list(metrics.SCALES)
    assert all(v > base["dim"] + 8 for v in by["dim"].values()), (base, by["dim"])
    assert all(abs(v - base["noisy"]) < 0.5 for v in by["noisy"].values()), (base, by["noisy"])
    assert all(base["both"] + 6 < v < base["noisy"] + 3 for v in by["both"].values()), (base, by["both"])
    assert all(v > 100 for v in metrics.psnr_by_scale(truth, truth).values())  # (float rounding of the round trip)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    from alaya_flash.model_zoo import bundle

    root = tmp_path_factory.mktemp("eval")
    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=3, sink_frames=0))
    bundle.save_flash(flash, root / "model")
    teacher = bundle.make_random_teacher(vae="wan2.1-vae-small", settings=bundle.TeacherSettings(steps=2, window_frames=5))
    bundle.save_teacher(teacher, root / "model" / "teacher")
    return root


@pytest.mark.slow
def test_eval_report_has_every_axis_for_student_and_teacher(tiny_models, capsys):
    out = tiny_models / "report.json"
    rc = main(["--quiet", "eval", "--model", str(tiny_models / "model"), "--clips", "1", "--frames", "9", "--size", "32",
               "--presets", "bright_sunny,moonlit_night", "--runtime-size", "32", "--runtime-frames", "5",
               "--long-frames", "12", "--long-block", "4", "--long-size", "32", "--out", str(out), "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    for m in ("student", "teacher"):
        r = report[m]
        assert 0 < r["content"]["psnr_db"] < 60 and -1 <= r["content"]["ssim"] <= 1
        assert len(r["content"]["psnr_db_by_latent"]) == 3  # 9 frames: frame 0, 1-4, 5-8
        by_scale = r["content"]["psnr_db_truth_coarser_than"]
        assert list(by_scale) == [str(k) for k in metrics.SCALES]
        assert all(v > r["content"]["psnr_db"] for v in by_scale.values())  # the truth's light helps a random model
        by_preset = r["content"]["psnr_db_by_preset"]  # one clip: the overall mean is the presets' mean
        assert list(by_preset) == ["bright_sunny", "moonlit_night"]
        assert sum(by_preset.values()) / 2 == pytest.approx(r["content"]["psnr_db"])
        assert r["content"]["psnr_db_by_clip"] == [pytest.approx(r["content"]["psnr_db"])]  # per clip, in order
        assert r["temporal"]["ratio"] >= 0 and r["temporal"]["diff_error"] >= 0
        held = r["content"]["heldout_wordings"]  # the same clip under the 2 held-out paraphrases of each preset
        assert len(held["psnr_db_by_paraphrase"]) == 2 and all(0 < v < 60 for v in held["psnr_db_by_paraphrase"])
        assert sum(held["psnr_db_by_paraphrase"]) / 2 == pytest.approx(held["psnr_db"])
        assert list(held["psnr_db_by_preset"]) == ["bright_sunny", "moonlit_night"]
        assert sum(held["psnr_db_by_preset"].values()) / 2 == pytest.approx(held["psnr_db"])
        for kind, renders, suffix in (("train_wordings", 2, ""), ("heldout_wordings", 4, r" \[paraphrase [12]\]")):
            rate, misses = r["control"][kind]["nearest_rate"], r["control"][kind]["misses"]
            # 1 clip x 2 presets, x 2 held-out paraphrases each
            assert 0.0 <= rate <= 1.0 and len(misses) == round((1 - rate) * renders)
            assert all(re.fullmatch(r"clip 0: \w+ -> \w+ \(-\d+\.\d\d dB\)" + suffix, m) for m in misses), misses
        by = r["control"]["heldout_wordings"]["nearest_rate_by_paraphrase"]
        assert len(by) == 2 and sum(by) / 2 == pytest.approx(r["control"]["heldout_wordings"]["nearest_rate"])
        assert r["runtime_eval_size"]["fps"] > 0
    # student chunks of 1 latent (4 frames) have boundaries in 9 frames; so do teacher windows of 5
    assert report["student"]["cross_window"]["ratio"] is not None
    assert report["teacher"]["cross_window"]["ratio"] is not None
    assert report["student"]["content"]["vs_teacher"]["psnr_db"] > 0
    assert report["student"]["runtime"]["size"] == [32, 32] and report["student"]["runtime"]["fps"] > 0
    assert report["setup"]["teacher_steps"] == 2 and report["setup"]["frames"] == 9
    long = report["student"]["long_stream"]  # the student only: the default pipeline's stream
    assert "long_stream" not in report["teacher"]
    assert long["frames"] == 12 and long["size"] == [32, 32] and len(long["psnr_db_by_block"]) == 3
    assert long["first_block_psnr_db"] == long["psnr_db_by_block"][0]
    assert long["drop_db"] == pytest.approx(long["first_block_psnr_db"] - long["last_block_psnr_db"])
    assert [f["frame"] for f in long["fresh_starts"]] == [4, 8]  # the midpoint block and the last
    assert [f["stream_psnr_db"] for f in long["fresh_starts"]] == long["psnr_db_by_block"][1:]
    assert long["drift_db"] == long["fresh_starts"][-1]["gain_db"]
    prior = report["prior_only"]  # the shading prior alone, under the light head's reading of each training wording
    assert list(prior["psnr_db_by_preset"]) == ["bright_sunny", "moonlit_night"]
    assert sum(prior["psnr_db_by_preset"].values()) / 2 == pytest.approx(prior["psnr_db"])
    assert prior["psnr_db_by_clip"] == [pytest.approx(prior["psnr_db"])] and "scenes" not in report["setup"]
    assert prior["psnr_db"] > 8  # the physics world's truth is the prior's own shading model: far from noise
    head = report["light_head"]
    assert head["texts"] > 50 and 0.9 <= head["preset_rate"] <= 1.0 and 0 <= head["side_rate"] <= 1


@pytest.mark.slow
def test_eval_scores_the_refiners_frames_unless_told_not_to(tmp_path, capsys):
    from alaya_flash.model_zoo import bundle

    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=3, sink_frames=0),
                                     refiner="gbuffer-refiner-16")
    with torch.no_grad():
        flash.refiner.tail[-1].bias.fill_(0.2)  # a refiner that brightens every frame: it changes the scores
    bundle.save_flash(flash, tmp_path / "model")
    args = ["--quiet", "eval", "--model", str(tmp_path / "model"), "--no-teacher", "--clips", "1", "--frames", "5",
            "--size", "32", "--presets", "bright_sunny,moonlit_night", "--runtime-size", "32", "--runtime-frames", "5",
            "--no-long-stream", "--json"]
    reports = []
    for extra in ([], ["--no-refiner"]):
        assert main([*args, *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    refined, plain = reports
    assert refined["setup"]["refiner"] is True and plain["setup"]["refiner"] is False
    assert refined["setup"]["text_encoder"] == "all-minilm-l6-v2"
    assert refined["student"]["content"]["psnr_db"] != plain["student"]["content"]["psnr_db"]


def test_eval_refuses_unknown_presets(tiny_models, capsys):
    rc = main(["eval", "--model", str(tiny_models / "model"), "--presets", "bright_sunny,disco"])
    assert rc == 2
    assert "'disco'" in capsys.readouterr().err


def test_report_names_a_model_inside_the_working_directory_relative_to_it(tmp_path, monkeypatch):
    from alaya_flash.training.eval import _shown_path

    (tmp_path / "repo" / "model_zoo" / "default").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo")
    assert _shown_path(tmp_path / "repo" / "model_zoo" / "default") == "model_zoo/default"
    assert _shown_path(tmp_path / "elsewhere") == str(tmp_path / "elsewhere")


def test_eval_refuses_a_negative_heldout_wording_count(tiny_models, capsys):
    rc = main(["eval", "--model", str(tiny_models / "model"), "--heldout-wordings", "-1"])
    assert rc == 2
    assert "--heldout-wordings -1: give a count >= 1, or 0 for all" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["physics", pytest.param("v2", marks=pytest.mark.slow)])
def test_long_stream_scores_one_continuous_stream_block_by_block(kind, monkeypatch):
    """The block curve is PSNR of a whole-clip render of the same world frames (the physics world's, or
    world v2's path-traced street), block by block; the fresh start is a new stream over the midpoint
    block's frames. (World v2's frames are the ones the long stream traced, from a config asserted equal
    to the one here: tracing them again cost seconds and gives the same frames, test_world_v2.py.)"""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.training import eval as ev
    from alaya_flash.streaming.render.pipelines import FlashPipeline
    from alaya_flash.streaming.values import PromptSchedule
    from alaya_flash.streaming.gbuffer import frame_to_teacher
    from alaya_flash.streaming.world import WorldConfig, WorldSource

    if kind == "v2":
        pytest.importorskip("mitsuba")
        from alaya_flash.streaming.world import traced

        traced_worlds = []

        class Recorded(traced.TracedSource):
            def __iter__(self):
                frames = list(super().__iter__())
                traced_worlds.append((self.config, frames))
                return iter(frames)

        monkeypatch.setattr(traced, "TracedSource", Recorded)
    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=3, sink_frames=0))
    text = flash.text_encoder()
    report = ev.long_stream(flash, text, 15, 5, (32, 32), world_kind=kind)
    assert report["world"] == kind
    if kind == "v2":
        from alaya_flash.streaming.world.traced import TracedConfig

        assert (report["scene"], report["camera"]) == (ev.LONG_V2_SCENE, ev.LONG_V2_CAMERA)
        (config, frames), = traced_worlds
        assert config == TracedConfig(seed=ev.LONG_SEED, scene=ev.LONG_V2_SCENE, camera=ev.LONG_V2_CAMERA,
                                      width=32, height=32, fps=ev.LONG_FPS, num_frames=15,
                                      presets=(ev.LONG_PRESET,), spp=ev.LONG_V2_SPP)
        assert len(frames) == 15
    else:
        world = WorldConfig(seed=ev.LONG_SEED, width=32, height=32, fps=ev.LONG_FPS, num_frames=15,
                            num_objects=ev.LONG_OBJECTS, camera=report["camera"], presets=(ev.LONG_PRESET,))
        frames = list(WorldSource(world))
    gb = np.stack([frame_to_teacher(f) for f in frames])
    gt = torch.from_numpy(np.stack([f.extras["rgb"] for f in frames])).float() / 255
    sched = PromptSchedule.encode(text, report["prompt"])
    whole, _, _ = ev._render(FlashPipeline(flash, sched), gb)
    want = [metrics.psnr(whole[a:a + 5], gt[a:a + 5]) for a in (0, 5, 10)]
    assert report["psnr_db_by_block"] == pytest.approx(want, abs=1e-4)
    assert report["first_block_psnr_db"] == report["psnr_db_by_block"][0]
    assert report["last_block_psnr_db"] == report["psnr_db_by_block"][2]
    assert [f["frame"] for f in report["fresh_starts"]] == [5, 10]  # the midpoint block and the last
    for start in report["fresh_starts"]:
        a = start["frame"]
        fresh, _, _ = ev._render(FlashPipeline(flash, sched), gb[a:a + 5])
        assert start["psnr_db"] == pytest.approx(metrics.psnr(fresh, gt[a:a + 5]), abs=1e-4)
        assert start["psnr_db"] != pytest.approx(report["psnr_db_by_block"][a // 5])  # a new stream's state
        assert start["gain_db"] == pytest.approx(start["psnr_db"] - report["psnr_db_by_block"][a // 5])
    assert report["drift_db"] == report["fresh_starts"][1]["gain_db"]


def test_a_world_lit_long_stream_equals_a_whole_render_under_the_worlds_recorded_lights():
    """world_light: the physics world hands a light-reading model each frame's sun (the long preset turned with
    the camera), so the curve is a whole render given those lights, and the fresh start gets its frames' own."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.light import pack
    from alaya_flash.training import eval as ev
    from alaya_flash.streaming.render.lighting import recorded
    from alaya_flash.streaming.render.pipelines import FlashPipeline
    from alaya_flash.streaming.values import PromptSchedule
    from alaya_flash.streaming.gbuffer import frame_to_teacher
    from alaya_flash.streaming.world import WorldConfig, WorldSource
    from alaya_flash.streaming.world.shading import heading, light_of
    from stream_helpers import random_refiner

    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=3, sink_frames=0))
    flash.refiner = random_refiner("gbuffer-refiner-16-blend")
    text = flash.text_encoder()
    report = ev.long_stream(flash, text, 10, 5, (32, 32), world_light=True)
    assert report["light"] == "the world's"
    world = WorldConfig(seed=ev.LONG_SEED, width=32, height=32, fps=ev.LONG_FPS, num_frames=10,
                        num_objects=ev.LONG_OBJECTS, camera=report["camera"], presets=(ev.LONG_PRESET,))
    frames, lights = [], []
    for frame, camera in WorldSource(world).frames_with_cameras():
        frames.append(frame)
        lights.append(light_of(ev.LONG_PRESET, heading(camera)))
    gb = np.stack([frame_to_teacher(f) for f in frames])
    gt = torch.from_numpy(np.stack([f.extras["rgb"] for f in frames])).float() / 255
    sched = PromptSchedule.encode(text, report["prompt"])
    whole, _, _ = ev._render(FlashPipeline(flash, sched, lights=recorded(pack(lights))), gb)
    assert report["psnr_db_by_block"] == pytest.approx([metrics.psnr(whole[a:a + 5], gt[a:a + 5]) for a in (0, 5)], abs=1e-3)
    fresh, _, _ = ev._render(FlashPipeline(flash, sched, lights=recorded(pack(lights[5:]))), gb[5:])
    (start,) = report["fresh_starts"]  # two blocks: the midpoint block is the last
    assert start["frame"] == 5 and start["psnr_db"] == pytest.approx(metrics.psnr(fresh, gt[5:]), abs=1e-3)
    unlit = ev.long_stream(flash, text, 10, 5, (32, 32))
    assert unlit["light"] == "the prompt's" and unlit["psnr_db_by_block"] != pytest.approx(report["psnr_db_by_block"], abs=1e-3)


@pytest.mark.parametrize("extra, message", [
    (["--long-frames", "0"], "argument --long-frames: 0 is out of range"),
    (["--long-frames", "60", "--long-block", "25"], "--long-frames 60: give a multiple of --long-block 25"),
    (["--long-frames", "25", "--long-block", "25"], "--long-frames 25: give at least two blocks of --long-block 25"),
    (["--long-size", "40x32"], "--long-size 40x32: each side must be a multiple of 16"),
])
def test_eval_refuses_a_long_stream_it_cannot_score(tiny_models, capsys, extra, message):
    assert main(["eval", "--model", str(tiny_models / "model"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err  # argparse adds a usage line


def _lit_clip(frames=3, size=16):
    """Teacher-form G-buffers and a truth with a cast shadow on the ground, a bare-metal patch and sky."""
    gb = np.zeros((frames, 5, size, size, 3), np.uint8)
    gb[:, 1, size // 4:] = 128  # depth: the top quarter is sky (0)
    gb[:, 2, size // 2:, :size // 4] = 255  # metallic 1 in the bottom-left corner
    truth = np.full((frames, size, size, 3), 200, np.uint8)
    truth[:, :size // 4] = (90, 140, 230)  # blue sky
    truth[:, size // 2:, size // 2:] = 50  # the shadowed half of the ground
    truth[:, size // 2:, :size // 4:2] = 255  # the metal's streaks of highlight
    vis = np.full((frames, size, size), 255, np.uint8)
    vis[:, :, size // 2:] = 0
    ground = np.zeros((frames, size, size), bool)
    ground[:, size // 2:] = True
    return gb, truth, vis, ground


def test_lighting_metrics_see_shadows_metals_and_sky():
    gb, truth, vis, ground = _lit_clip()
    same = metrics.lighting(truth, truth, gb, vis, ground)
    assert same["shadow_ratio"] == same["gt_shadow_ratio"] < 0.1
    assert same["metal_contrast"] == same["gt_metal_contrast"] > 0.2 and same["metal_psnr_db"] == math.inf
    assert same["sky_error_levels"] == 0 and same["sky_colour"] == pytest.approx([90 / 255, 140 / 255, 230 / 255], abs=1e-5)
    flat = np.full_like(truth, 200)  # no shadow, a matte metal, a white sky
    seen = metrics.lighting(torch.from_numpy(flat).float() / 255, truth, gb, vis, ground)
    assert seen["shadow_ratio"] == pytest.approx(1.0) and seen["metal_contrast"] == pytest.approx(0.0, abs=1e-6)
    assert seen["metal_psnr_db"] < 20 and seen["sky_error_levels"] == pytest.approx((110 + 60 + 30) / 3, abs=0.01)
    none = metrics.lighting(truth, truth, gb)  # without sun visibility: no shadow figures
    assert none["shadow_ratio"] is None and none["gt_shadow_ratio"] is None
    from alaya_flash.training.eval import lighting_summary

    summary = lighting_summary([same, seen, none])
    assert summary["shadows"]["renders"] == 2 and summary["shadows"]["within_tolerance"] == 0.5
    assert summary["metal"]["renders"] == 3 and summary["sky"]["renders"] == 3
    assert summary["sun_side"] == {"renders": 0, "pairs": 0, "move_db": None, "shadow_ratio": None,
                                   "opposite_shadow_ratio": None, "follows_rate": None}
    # renders again with the opposite sun side named: one that darkens the truth's shadow less (follows), one
    # that darkens it more (does not), one whose ground had no shadow pixels (moves, but no ratio)
    sided = [{**same, "side_move_db": 20.0, "opposite_shadow_ratio": 0.9},
             {**seen, "side_move_db": 30.0, "opposite_shadow_ratio": 0.5},
             {**none, "side_move_db": 40.0, "opposite_shadow_ratio": None}]
    side = lighting_summary(sided)["sun_side"]
    assert side["renders"] == 3 and side["pairs"] == 2 and side["move_db"] == pytest.approx(30.0)
    assert side["follows_rate"] == 0.5 and side["opposite_shadow_ratio"] == pytest.approx(0.7)


@pytest.mark.slow
def test_eval_on_a_world_v2_dataset_adds_the_lighting_axis(tiny_models, tmp_path, capsys):
    pytest.importorskip("mitsuba")
    from alaya_flash.training.data import DataConfig, build_dataset

    cfg = DataConfig(out=str(tmp_path / "data"), width=32, height=32, frames=5, fps=8.0, train_clips=1,
                     heldout_clips=1, heldout_seed=1000, world="pathtrace", scenes=("street",),
                     presets=("bright_sunny", "night_lamps"), spp=2, heldout_passes=2, variant=TINY_VARIANT).validate()
    build_dataset(cfg)
    with np.load(next((tmp_path / "data").glob("**/*.npz"))) as clip:  # each frame's light, as the prior reads it
        assert clip["light"].shape[:2] == (2, 5) and clip["up"].shape == (5, 3)
        assert np.allclose(np.linalg.norm(clip["up"], axis=1), 1.0, atol=1e-5)
    rc = main(["--quiet", "eval", "--model", str(tiny_models / "model"), "--no-teacher", "--data", str(tmp_path / "data"),
               "--runtime-size", "32", "--runtime-frames", "5", "--long-frames", "4", "--long-block", "2",
               "--long-size", "32", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    setup, lighting = report["setup"], report["student"]["lighting"]
    assert report["student"]["long_stream"]["world"] == "v2"  # the long stream follows the dataset's world
    assert setup["world"] == "pathtrace" and setup["presets"] == ["bright_sunny", "night_lamps"]
    assert setup["training_wording"] == "each clip's caption" and setup["scenes"] == ["street"]
    # both presets score the sky; only bright_sunny names a sun side, so only it scores shadows
    assert lighting["sky"]["renders"] == 2 and lighting["shadows"]["renders"] <= 1
    # bright_sunny's caption names the sun's side: rendered again with the opposite side named
    assert lighting["sun_side"]["renders"] == 1 and lighting["sun_side"]["pairs"] == lighting["shadows"]["renders"]
    content = report["student"]["content"]
    assert content["psnr_db"] > 0
    # truths of 2 passes carry their noise: the render scores higher against the noise-free truth
    assert content["truth_noise"]["truth_psnr_db"] > 0 and content["truth_noise"]["psnr_db_noise_free"] > content["psnr_db"]
    assert main(["eval", "--model", str(tiny_models / "model"), "--data", str(tmp_path / "data"),
                 "--presets", "bright_sunny,underwater"]) == 2
    assert "'underwater' is unknown; choose from bright_sunny, night_lamps" in capsys.readouterr().err
    # --split train scores the training clip (another scene, its own caption) with the same axes
    assert main(["--quiet", "eval", "--model", str(tiny_models / "model"), "--no-teacher", "--data", str(tmp_path / "data"),
                 "--split", "train", "--runtime-size", "32", "--runtime-frames", "5", "--no-long-stream", "--json"]) == 0
    train = json.loads(capsys.readouterr().out)
    assert setup["split"] == "heldout" and train["setup"]["split"] == "train" and train["setup"]["clips"] == 1
    assert train["student"]["content"]["psnr_db"] != content["psnr_db"] and "lighting" in train["student"]
    assert main(["eval", "--model", str(tiny_models / "model"), "--split", "train"]) == 2
    assert "--split train needs --data" in capsys.readouterr().err
    # --shadows pass: the prior takes each clip's recorded sun visibility as its shadows, as from an engine's pass
    assert main(["--quiet", "eval", "--model", str(tiny_models / "model"), "--no-teacher", "--data", str(tmp_path / "data"),
                 "--shadows", "pass", "--runtime-size", "32", "--runtime-frames", "5", "--no-long-stream", "--json"]) == 0
    passed = json.loads(capsys.readouterr().out)
    assert setup["shadows"] == "screen" and passed["setup"]["shadows"] == "pass"
    assert passed["prior_only"]["psnr_db_by_preset"]["bright_sunny"] != report["prior_only"]["psnr_db_by_preset"]["bright_sunny"]
    assert passed["prior_only"]["psnr_db_by_preset"]["night_lamps"] == pytest.approx(
        report["prior_only"]["psnr_db_by_preset"]["night_lamps"], abs=0.5)
    # --sky pass: its ambient occlusion from each clip's recorded sky visibility, as from an engine's sky pass
    assert main(["--quiet", "eval", "--model", str(tiny_models / "model"), "--no-teacher", "--data", str(tmp_path / "data"),
                 "--shadows", "pass", "--sky", "pass", "--runtime-size", "32", "--runtime-frames", "5", "--no-long-stream",
                 "--json"]) == 0
    sky = json.loads(capsys.readouterr().out)
    assert passed["setup"]["sky"] == "screen" and sky["setup"]["sky"] == "pass"
    assert sky["prior_only"]["psnr_db"] != passed["prior_only"]["psnr_db"]


def test_the_prior_a_model_reads_is_its_refiners_else_the_plain_one():
    """eval's prior-only baseline and bench's `shade` run the prior the model renders with: a `-mirror`
    refiner's reflects, a model whose refiner reads no light gets the light-reading encoder's (plain) one."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.codecs.gbuffer_encoder import LIT_PRIOR
    from alaya_flash.streaming.render.lighting import model_prior

    flash = bundle.make_random_flash()
    assert model_prior(flash).config == LIT_PRIOR and not LIT_PRIOR.reflections
    flash.refiner = rf.build(rf.CONFIGS["gbuffer-refiner-16-mirror"])
    assert model_prior(flash) is flash.refiner.shading_prior and model_prior(flash).config.reflections


@pytest.mark.slow
def test_eval_gives_a_light_refiner_the_prompts_light_or_the_clips_recorded_one(tmp_path, capsys):
    """--light data hands the refiner (and the prior-only baseline) each clip's recorded light per frame,
    as an engine that knows its sun would; the default reads it from the prompt. Both are scored, and
    differ (the head's light is not the clip's)."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.codecs import refiner as rf

    flash = bundle.make_random_flash(settings=bundle.FlashSettings(chunk_frames=1, window_frames=3, sink_frames=0))
    flash.refiner = rf.build(rf.CONFIGS["gbuffer-refiner-16-light"])
    with torch.no_grad():
        flash.refiner.tail[-1].weight.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    bundle.save_flash(flash, tmp_path / "model")
    args = ["--quiet", "eval", "--model", str(tmp_path / "model"), "--no-teacher", "--clips", "1", "--frames", "5",
            "--size", "32", "--presets", "bright_sunny,moonlit_night", "--runtime-size", "32", "--runtime-frames", "5",
            "--no-long-stream", "--json"]
    reports = {}
    for light in ("prompt", "data"):
        assert main([*args, "--light", light]) == 0
        reports[light] = json.loads(capsys.readouterr().out)
        assert reports[light]["setup"]["light"] == light
    assert reports["data"]["prior_only"]["light"] == "each clip's recorded light"
    assert reports["data"]["prior_only"]["reflections"] is False  # the -light refiner's prior: the plain one
    assert reports["data"]["student"]["content"]["psnr_db"] != reports["prompt"]["student"]["content"]["psnr_db"]
    assert reports["data"]["prior_only"]["psnr_db"] != reports["prompt"]["prior_only"]["psnr_db"]
    assert main([*args, "--shadows", "pass"]) == 2  # clips of the physics world record no sun visibility
    assert "--shadows pass: a physics-world clip records no sun visibility (only world v2 data does)" in capsys.readouterr().err
    assert main([*args, "--sky", "pass"]) == 2
    assert "--sky pass: a physics-world clip records no sky visibility" in capsys.readouterr().err
