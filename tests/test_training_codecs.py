"""The vae and codecs stages: crops from the cached latents, the motion, boundary and chroma losses,
resume and init, devices, config checking, and benchmarks/codec_quality.py."""
from __future__ import annotations

import json

import pytest
import torch

from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import load_benchmark, write


def test_codecs_from_cached_latents_cut_aligned_crops(runs, tmp_path, capsys):
    """codecs with `latents`: each crop's targets are the teacher cache's latents of that very window
    and preset, at the 8-pixel-aligned place of the pixel crop; a cache of another recipe is refused."""
    from alaya_flash.training.codecs import CachedTargets, CodecStageConfig, load_vae, to_video, vae_gbuffer_latents
    from alaya_flash.training.data import ClipSet

    cache = str(runs / "teacher" / "latents-train.safetensors")
    cfg = CodecStageConfig(data=str(runs / "data"), vae_run=str(runs / "vae"), frames=9, crop=16, latents=cache)
    clips = ClipSet(cfg.data, "train")
    targets = CachedTargets(cfg, clips)
    gb, rgb, z_rgb, z_gb, where = targets.sample(torch.Generator().manual_seed(3), 4, 16)
    vae = load_vae(cfg.vae_run)
    for j, (i, q, y, x) in enumerate(where):
        c, s = targets.windows[i]
        assert torch.equal(rgb[j], torch.from_numpy(clips.rgb[c, q, s:s + 9, 8 * y:8 * y + 16, 8 * x:8 * x + 16]))
        assert torch.equal(gb[j], torch.from_numpy(clips.gbuffers[c, s:s + 9, :, 8 * y:8 * y + 16, 8 * x:8 * x + 16]))
        with torch.no_grad(), common.autocast():  # as the cache was encoded
            whole = vae.encode(to_video(torch.from_numpy(clips.rgb[c, q, s:s + 9])[None]), chunk=None).float()
            passes = vae_gbuffer_latents(vae, torch.from_numpy(clips.gbuffers[c, s:s + 9])[None])
        assert torch.allclose(z_rgb[j], whole[0, :, :, y:y + 2, x:x + 2], atol=1e-4)
        assert torch.allclose(z_gb[j], passes[0, :, :, y:y + 2, x:x + 2], atol=1e-4)
    conf = write(tmp_path / "c.json", {"out": str(tmp_path / "c"), "data": cfg.data, "vae_run": cfg.vae_run,
                                       "latents": cache, "frames": 5, "crop": 16, "steps": 2, "batch": 2})
    assert main(["train", "codecs", "--config", conf]) == 2
    assert "made with frames=9, the codecs stage needs 5" in capsys.readouterr().err
    conf = write(tmp_path / "d.json", {"out": str(tmp_path / "d"), "data": cfg.data, "vae_run": cfg.vae_run,
                                       "latents": cache, "frames": 9, "crop": 16, "steps": 2, "batch": 2})
    assert main(["--quiet", "train", "codecs", "--config", conf]) == 0
    assert "dec=" in (tmp_path / "d" / "train.log").read_text()


def test_resumed_vae_recalibrates_and_stale_statistics_are_refused(runs, tmp_path, capsys):
    import shutil

    from alaya_flash.training import codecs

    shutil.copytree(runs / "vae", tmp_path / "vae")
    assert codecs.latent_stats_step(tmp_path / "vae") == 3
    before = codecs.load_vae(tmp_path / "vae").conv1.weight.clone()
    cfg = write(tmp_path / "vae.json", {"out": str(tmp_path / "vae"), "data": str(runs / "data"), "steps": 5,
                                        "batch": 2, "base_dim": 4, "frames": 5, "crop": 16, "ckpt_every": 5})
    assert main(["--quiet", "train", "vae", "--config", cfg]) == 0  # a curriculum's second phase
    assert codecs.latent_stats_step(tmp_path / "vae") == 5
    assert not torch.equal(codecs.load_vae(tmp_path / "vae").conv1.weight, before)
    # statistics of other weights than the checkpoint's are refused, naming both steps
    shutil.copy(runs / "vae" / codecs.LATENT_STATS, tmp_path / "vae" / codecs.LATENT_STATS)
    with pytest.raises(Exception, match="measured at step 3 but ckpt-000005.safetensors is step 5"):
        codecs.load_vae(tmp_path / "vae")


def test_motion_loss_prices_held_frames_not_a_constant_offset():
    from alaya_flash.training.codecs import motion_loss

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 8, 3, 4, 4, generator=g)  # (B, T, C, H, W)
    assert motion_loss(target + 0.1, target, dim=1).item() < 1e-6  # the same motion, shifted in brightness
    held = target[:, [0, 0, 0, 0, 4, 4, 4, 4]]  # each group of 4 frames repeats its first: a jump every 4
    assert motion_loss(held, target, dim=1).item() > 0.1
    assert motion_loss(held.transpose(1, 2), target.transpose(1, 2), dim=2).item() == pytest.approx(
        motion_loss(held, target, dim=1).item())


def test_boundary_motion_loss_prices_only_the_changes_into_each_latent():
    from alaya_flash.training.codecs import boundary_motion_loss

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 9, 3, 4, 4, generator=g)  # (B, T, C, H, W): latents 0 | 1-4 | 5-8
    inside = target.clone()
    inside[:, 2:4] += 0.3  # frames inside latent 1 moved: the changes into frames 1 and 5 are untouched
    assert boundary_motion_loss(inside, target, dim=1).item() < 1e-6
    jump = target.clone()
    jump[:, 5:] += 0.3  # latent 2 starts off from where latent 1 ended
    assert boundary_motion_loss(jump, target, dim=1).item() == pytest.approx(0.15, abs=1e-6)  # 1 of 2 changes
    assert boundary_motion_loss(jump.transpose(1, 2), target.transpose(1, 2), dim=2).item() == pytest.approx(
        boundary_motion_loss(jump, target, dim=1).item())


def test_chroma_loss_prices_hue_not_brightness():
    from alaya_flash.training.codecs import chroma_loss

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 3, 5, 4, 4, generator=g)  # (B, C, T, H, W)
    assert chroma_loss(target + 0.2, target, dim=1).item() < 1e-6  # brighter, same colour
    grey = target.mean(1, keepdim=True).expand_as(target)  # same brightness, colour gone
    assert chroma_loss(grey, target, dim=1).item() > 0.1
    assert chroma_loss(grey.transpose(1, 2), target.transpose(1, 2), dim=2).item() == pytest.approx(
        chroma_loss(grey, target, dim=1).item())


@pytest.mark.parametrize("stage", ["vae", "codecs"])
def test_negative_motion_weight_is_refused(stage, tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "motion_weight": -1})
    assert main(["--quiet", "train", stage, "--config", cfg]) != 0
    assert f"{stage} stage: motion_weight -1.0" in capsys.readouterr().err


def test_negative_boundary_weight_is_refused(tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "boundary_weight": -2})
    assert main(["--quiet", "train", "codecs", "--config", cfg]) != 0
    assert "codecs stage: motion_weight 0.0 and boundary_weight -2.0 must be >= 0" in capsys.readouterr().err


def test_negative_chroma_weight_is_refused(tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "chroma_weight": -0.5})
    assert main(["--quiet", "train", "vae", "--config", cfg]) != 0
    assert "vae stage: motion_weight 0.0 and chroma_weight -0.5 must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("device, message", [
    ("tpu", "vae stage: device 'tpu' is unknown; choose cpu or cuda"),
    pytest.param("cuda", "vae stage: device 'cuda' asked for, but this torch sees no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
])
def test_vae_stage_refuses_a_device_it_cannot_train_on(device, message, tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "device": device})
    assert main(["--quiet", "train", "vae", "--config", cfg]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything is written


def test_vae_stage_on_an_explicit_cpu_device_equals_the_default(runs, tmp_path):
    """device only places the networks: the same seed draws the same crops and noise, so one step
    gives the same weights with device cpu named as with the default."""
    cfg = {"out": "", "data": str(runs / "data"), "steps": 1, "base_dim": 4, "frames": 5, "crop": 16, "batch": 2,
           "ckpt_every": 1, "log_every": 1}
    got = []
    for name, extra in (("default", {}), ("cpu", {"device": "cpu"})):
        out = tmp_path / name
        assert main(["--quiet", "train", "vae", "--config", write(tmp_path / f"{name}.json",
                                                                  {**cfg, **extra, "out": str(out)})]) == 0
        got.append(common.final_weights(out, "vae"))
    assert got[0].keys() == got[1].keys()
    assert all(torch.equal(got[0][k], got[1][k]) for k in got[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_vae_stage_resumes_on_the_other_device(first, then, runs, tmp_path, monkeypatch):
    """A checkpoint holds CPU tensors: a run begun on one device continues on the other from its
    step, with its optimizer's moments, and ends where an uninterrupted run on the first device
    does, up to the two devices' float32 rounding (autocast and TF32 off for the comparison)."""
    import contextlib

    from alaya_flash.training import codecs

    monkeypatch.setattr(codecs, "autocast", lambda device: contextlib.nullcontext())
    cfg = {"data": str(runs / "data"), "base_dim": 4, "frames": 5, "crop": 16, "batch": 2, "ckpt_every": 2,
           "log_every": 1, "lr": 1e-3}
    once = write(tmp_path / "once.json", {**cfg, "out": str(tmp_path / "once"), "steps": 4, "device": first})
    split = write(tmp_path / "split.json", {**cfg, "out": str(tmp_path / "split")})
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # matmuls: no TF32 by default
        assert main(["--quiet", "train", "vae", "--config", once]) == 0
        assert main(["--quiet", "train", "vae", "--config", split, "--set", "steps=2", "--set", f"device={first}"]) == 0
        at_two = common.final_weights(tmp_path / "split", "vae")
        assert main(["--quiet", "train", "vae", "--config", split, "--set", "steps=4", "--set", f"device={then}"]) == 0
    assert "resumed from ckpt-000002" in (tmp_path / "split" / "train.log").read_text()
    a, b = common.final_weights(tmp_path / "once", "vae"), common.final_weights(tmp_path / "split", "vae")
    norm = lambda d: sum(v.float().pow(2).sum() for v in d.values()).sqrt().item()  # noqa: E731
    moved = norm({k: a[k] - at_two[k] for k in a})
    apart = norm({k: a[k] - b[k] for k in a})
    assert moved > 0 and apart < 0.1 * moved  # steps 3-4 without the restored moments land far off


def test_vae_stage_starts_from_another_runs_weights(runs, tmp_path, capsys):
    """init: a new run starts from another run's latest VAE weights (with lr 0 it keeps them exactly);
    a run that has checkpoints resumes from them instead; weights of another shape are refused by name."""
    cfg = {"data": str(runs / "data"), "base_dim": 4, "frames": 5, "crop": 16, "batch": 2, "ckpt_every": 1,
           "log_every": 1, "init": str(runs / "vae")}
    conf = write(tmp_path / "init.json", {**cfg, "out": str(tmp_path / "a"), "steps": 1, "lr": 0.0})
    assert main(["--quiet", "train", "vae", "--config", conf]) == 0
    assert "started from the weights of" in (tmp_path / "a" / "train.log").read_text()
    start, kept = common.final_weights(runs / "vae", "vae"), common.final_weights(tmp_path / "a", "vae")
    assert all(torch.equal(start[k], kept[k]) for k in start)
    assert main(["--quiet", "train", "vae", "--config", conf, "--set", "steps=2"]) == 0
    assert (tmp_path / "a" / "train.log").read_text().count("started from the weights of") == 1  # resumed
    wider = write(tmp_path / "wider.json", {**cfg, "out": str(tmp_path / "b"), "steps": 1, "base_dim": 8})
    assert main(["--quiet", "train", "vae", "--config", wider]) != 0
    assert f"vae stage: init {runs / 'vae'}: state dict: keys do not match" in capsys.readouterr().err


def test_codec_quality_script_reports_the_control_ceiling(runs, capsys):
    """benchmarks/codec_quality.py: each decoder's round trip of every preset is scored for the eval's
    nearest-preset control, with a rate per clip and preset and its smallest margin."""
    script = load_benchmark("codec_quality")
    assert script.main(["--data", str(runs / "data"), "--vae", str(runs / "vae"), "--codecs", str(runs / "codecs"),
                        "--clips", "1", "--frames", "9"]) == 0
    report = json.loads(capsys.readouterr().out)
    for name in ("vae_roundtrip", "tiny_decoder_on_vae_latents"):
        assert report[f"{name}_nearest_rate"] in (0.0, 0.5, 1.0)  # 1 clip x 2 presets
        assert report[f"{name}_min_margin_db"] <= report[f"{name}_margin_db"]
        assert (report[f"{name}_nearest_rate"] == 1.0) == (report[f"{name}_min_margin_db"] > 0)


def _mixed_world_error(mixed, decode) -> float:
    """Mean squared error of decode(uint8 clip (1, T, H, W, 3)) -> frames (T, H, W, 3) in [0, 1] over every
    clip and preset of the `mixed` fixture's second world (other seeds, presets the first world lacks)."""
    from alaya_flash.training.data import ClipSet

    clips = ClipSet(mixed / "mix-data", "train")
    err = []
    with torch.no_grad():
        for c in range(len(clips)):
            for q in range(clips.rgb.shape[1]):
                u8 = torch.from_numpy(clips.rgb[c, q, :5])
                err.append(float((decode(u8[None]) - u8.float().div(255)).pow(2).mean()))
    return sum(err) / len(err)


def test_vae_with_a_mixed_in_world_reconstructs_that_world_closer(mixed, tmp_path):
    """mix_data / mix_rate: half the steps crop the second world's clips; from the same start (init) and
    seed, its clips come back nearer their truth than after the same training without it."""
    from alaya_flash.training.codecs import load_vae, to_video

    cfg = {"data": str(mixed / "data"), "init": str(mixed / "vae"), "base_dim": 4, "frames": 5, "crop": 16,
           "batch": 2, "steps": 30, "lr": 3e-3, "ckpt_every": 30, "log_every": 1}
    for name, extra in (("alone", {}), ("mixed", {"mix_data": str(mixed / "mix-data"), "mix_rate": 0.5})):
        assert main(["--quiet", "train", "vae", "--config", write(tmp_path / f"{name}.json",
                                                                  {**cfg, **extra, "out": str(tmp_path / name)})]) == 0
    assert "mix=1" in (tmp_path / "mixed" / "train.log").read_text()  # some steps came from the second world

    def error(run) -> float:
        vae = load_vae(tmp_path / run)
        return _mixed_world_error(mixed, lambda u8: vae.decode(vae.encode(to_video(u8), chunk=None), chunk=None)
                                  .float()[0].permute(1, 2, 3, 0).add(1).div(2).clamp(0, 1))

    assert error("mixed") < error("alone")


def test_codecs_start_from_a_run_and_mix_in_a_world(mixed, tmp_path, capsys):
    """codecs init: a new run starts from another run's tiny codec and G-buffer encoder (lr 0 keeps them
    exactly). mix_data: half the steps crop the second world (VAE targets encoded per crop, beside the
    first world's cached ones); the tiny decoder then decodes that world's VAE latents nearer its truth."""
    from alaya_flash.training.codecs import load_vae, to_video
    from alaya_flash.model_zoo.codecs import tiny

    cache = mixed / "teacher" / "latents-train.safetensors"
    cfg = {"data": str(mixed / "data"), "vae_run": str(mixed / "vae"), "init": str(mixed / "codecs"), "frames": 9,
           "crop": 16, "batch": 2, "ckpt_every": 1, "log_every": 1}
    kept = write(tmp_path / "kept.json", {**cfg, "out": str(tmp_path / "kept"), "steps": 1, "lr": 0.0})
    assert main(["--quiet", "train", "codecs", "--config", kept]) == 0
    assert "started from the weights of" in (tmp_path / "kept" / "train.log").read_text()
    for name in ("tiny", "gbuffer_encoder"):
        start, got = common.final_weights(mixed / "codecs", name), common.final_weights(tmp_path / "kept", name)
        assert all(torch.equal(start[k], got[k]) for k in start)
    train = {**cfg, "steps": 30, "lr": 3e-3, "ckpt_every": 30, "latents": str(cache)}  # the first world's cached
    for name, extra in (("alone", {}), ("mixed", {"mix_data": str(mixed / "mix-data"), "mix_rate": 0.5})):
        assert main(["--quiet", "train", "codecs", "--config", write(tmp_path / f"{name}.json",
                                                                     {**train, **extra, "out": str(tmp_path / name)})]) == 0
    assert "mix=1" in (tmp_path / "mixed" / "train.log").read_text()
    vae = load_vae(mixed / "vae")

    def error(run) -> float:
        codec = tiny.build(tiny.CONFIGS["taew-slim"]).eval()
        codec.load_state_dict(common.final_weights(tmp_path / run, "tiny"))
        return _mixed_world_error(mixed, lambda u8: codec.decode(vae.encode(to_video(u8), chunk=None).float())
                                  .float()[0].permute(0, 2, 3, 1)[:5].clamp(0, 1))

    assert error("mixed") < error("alone")
    wrong = write(tmp_path / "wrong.json", {**cfg, "out": str(tmp_path / "wrong"), "steps": 1,
                                            "tiny": "taew-slim", "init": str(mixed / "vae")})
    assert main(["--quiet", "train", "codecs", "--config", wrong]) != 0
    assert f"codecs stage: init {mixed / 'vae'}:" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["vae", "codecs"])
@pytest.mark.parametrize("bad, message", [({"mix_rate": 0.5}, "go together (both or neither)"),
                                          ({"mix_rate": 1.5, "mix_data": "x"}, "mix_rate 1.5 must be between 0 and 1")])
def test_bad_mix_is_refused(stage, bad, message, tmp_path, capsys):
    assert main(["--quiet", "train", stage, "--config", write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), **bad})]) != 0
    err = capsys.readouterr().err
    assert f"{stage} stage: mix_rate" in err and message in err
    assert not (tmp_path / "x").exists()
