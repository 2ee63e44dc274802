"""The teacher stage and its latent cache: caching without training, stale caches, new wordings,
prompt noise and dropout in the cache's samples, devices and config checking."""
from __future__ import annotations

import json

import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import TINY_DIT, write


def test_teacher_with_zero_steps_only_caches_the_latents(runs, tmp_path):
    """train_default.sh's first teacher call (--set steps=0) writes the latent cache the codecs
    crop from, and no checkpoint."""
    cfg = {**TINY_DIT, "out": str(tmp_path / "t"), "data": str(runs / "data"), "vae_run": str(runs / "vae"),
           "cond_encoder": "vae", "frames": 9, "steps": 3, "warmup": 2, "decay_steps": 2}
    conf = write(tmp_path / "t.json", cfg)
    assert main(["--quiet", "train", "teacher", "--config", conf, "--set", "steps=0", "--set", "threads=2"]) == 0
    assert (tmp_path / "t" / "latents-train.safetensors").is_file()
    assert common.latest_checkpoint(tmp_path / "t") is None
    # a cache made from an earlier checkpoint of the VAE is stale: the next call encodes again
    import shutil

    from alaya_flash.model_zoo.loading import read_metadata

    shutil.copytree(runs / "vae", tmp_path / "vae")
    conf = write(tmp_path / "t2.json", {**cfg, "out": str(tmp_path / "t2"), "vae_run": str(tmp_path / "vae")})
    cache = tmp_path / "t2" / "latents-train.safetensors"
    assert main(["--quiet", "train", "teacher", "--config", conf, "--set", "steps=0"]) == 0
    assert json.loads(read_metadata(cache)["recipe"])["vae_step"] == 3
    made = cache.stat().st_mtime_ns
    assert main(["--quiet", "train", "teacher", "--config", conf, "--set", "steps=0"]) == 0
    assert cache.stat().st_mtime_ns == made  # the same VAE: reused
    vae = write(tmp_path / "vae.json", {"out": str(tmp_path / "vae"), "data": str(runs / "data"), "steps": 4,
                                        "batch": 2, "base_dim": 4, "frames": 5, "crop": 16, "ckpt_every": 4})
    assert main(["--quiet", "train", "vae", "--config", vae]) == 0  # resumed: its latents changed
    assert main(["--quiet", "train", "teacher", "--config", conf, "--set", "steps=0"]) == 0
    assert json.loads(read_metadata(cache)["recipe"])["vae_step"] == 4


def test_new_wordings_refresh_a_cache_without_encoding_the_windows_again(runs, tmp_path):
    """dataset.json rewritten with more paraphrases: the teacher's cache keeps its latents and gets the
    new prompt embeddings; the teacher's train_wordings limits the prompts it draws."""
    import shutil

    from alaya_flash.training.teacher import TeacherStageConfig, prepare_latents

    class Log:  # encode_split logs a line only when it encodes the windows
        def __init__(self):
            self.lines = []

        def info(self, *args):
            self.lines.append(args)

    shutil.copytree(runs / "data", tmp_path / "data")
    cfg = TeacherStageConfig(out=str(tmp_path / "t"), data=str(tmp_path / "data"), vae_run=str(runs / "vae"),
                             cond_encoder="vae", frames=9)
    log = Log()
    before = prepare_latents(cfg, "train", log)
    assert len(log.lines) == 1
    meta_path = tmp_path / "data" / "dataset.json"
    meta = json.loads(meta_path.read_text())
    meta["prompts"]["bright_sunny"]["train"].append("a blinding summer noon over the yard")
    meta["prompts"]["moonlit_night"]["train"].append("a pitch-dark yard under a thin crescent moon")
    meta_path.write_text(json.dumps(meta))
    after = prepare_latents(cfg, "train", log)
    assert len(log.lines) == 1  # not encoded again
    assert torch.equal(after.rgb, before.rgb) and torch.equal(after.cond, before.cond)
    assert after.prompts["moonlit_night"]["train"][-1].startswith("a pitch-dark yard")
    new = after.prompt_emb["moonlit_night.train.8"]
    assert new.shape == before.embedding("moonlit_night", "train", 0).shape
    assert not torch.equal(new, after.embedding("moonlit_night", "train", 0))
    g = torch.Generator().manual_seed(0)
    _, _, prompt, (_, pi) = after.sample(g, 16, wordings=1)
    for q, e in zip(pi.tolist(), prompt):
        assert torch.equal(e, after.embedding(q, "train", 0))
    with pytest.raises(AlayaError, match="10 training wordings asked for, the dataset has 9"):
        after.sample(g, 2, wordings=10)
    # a hand-edited dataset whose presets have different numbers of wordings is refused by name
    meta["prompts"]["bright_sunny"]["train"].pop()
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(AlayaError, match="different numbers of train wordings"):
        prepare_latents(cfg, "train", log)


def test_teacher_stage_refuses_an_unknown_device(tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "device": "tpu"})
    assert main(["--quiet", "train", "teacher", "--config", cfg]) != 0
    assert "teacher stage: device 'tpu' is unknown; choose cpu or cuda" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_teacher_stage_on_cuda_trains_as_on_the_cpu(runs, tmp_path, monkeypatch):
    """device cuda: the same samples (drawn on the CPU), the pass on the GPU; in float32 (autocast
    and TF32 off) the weights after 3 steps differ from the CPU run's by under a tenth of what the
    steps moved them."""
    import contextlib

    from alaya_flash.training import teacher

    monkeypatch.setattr(teacher, "autocast", lambda device: contextlib.nullcontext())
    base = {**TINY_DIT, "data": str(runs / "data"), "vae_run": str(runs / "vae"), "cond_encoder": "vae", "frames": 9,
            "steps": 3, "batch": 2, "ckpt_every": 3, "log_every": 1, "lr": 1e-3, "warmup": 0}
    weights = {}
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for name, device, extra in (("cpu", "cpu", {}), ("cuda", "cuda", {}), ("init", "cpu", {"lr": 0.0})):
            cfg = {**base, "out": str(tmp_path / name), "device": device, **extra}
            assert main(["--quiet", "train", "teacher", "--config", write(tmp_path / f"{name}.json", cfg)]) == 0
            weights[name] = common.final_weights(tmp_path / name, "dit")
    norm = lambda d: sum(v.float().pow(2).sum() for v in d.values()).sqrt().item()  # noqa: E731
    a, b, init = weights["cpu"], weights["cuda"], weights["init"]
    moved = norm({k: a[k].float() - init[k].float() for k in a})
    apart = norm({k: a[k].float() - b[k].float() for k in a})
    assert moved > 0 and apart < 0.1 * moved


def test_negative_train_wordings_is_refused(tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "train_wordings": -3})
    assert main(["--quiet", "train", "teacher", "--config", cfg]) != 0
    assert "teacher stage: train_wordings -3 must be >= 0 (0 = all)" in capsys.readouterr().err


def test_text_noise_moves_kept_prompts_to_a_shell_and_leaves_dropped_ones(runs):
    """perturb_prompts keeps unit norm and moves a prompt by about `noise` (cosine 1/sqrt(1 + noise^2));
    LatentSet.sample perturbs the kept prompts only: a dropped one stays the exact CFG negative."""
    from alaya_flash.training.latent_data import LatentSet, perturb_prompts

    g = torch.Generator().manual_seed(0)
    e = torch.nn.functional.normalize(torch.randn(2000, 1, 384), dim=-1)
    moved = perturb_prompts(e, 0.7, g)
    assert torch.allclose(moved.norm(dim=-1), torch.ones(2000, 1), atol=1e-5)
    cos = (moved * e).sum(-1)
    assert abs(cos.mean().item() - 1 / (1 + 0.7 ** 2) ** 0.5) < 0.01 and cos.std() < 0.03
    data = LatentSet(runs / "teacher" / "latents-train.safetensors")
    _, _, prompt, (_, pi) = data.sample(torch.Generator().manual_seed(3), 64, prompt_dropout=0.5, text_noise=0.7)
    dropped = (prompt == data.negative).all(-1).squeeze(1)
    assert 10 < dropped.sum() < 54
    kept = [data.embedding(int(q), "train", w) for q in pi[~dropped] for w in range(data.wordings("train"))]
    assert not any(torch.equal(p, k) for p in prompt[~dropped] for k in kept)
    _, _, plain, _ = data.sample(torch.Generator().manual_seed(3), 64, prompt_dropout=0.5)
    assert torch.equal(plain[dropped], prompt[dropped]) and torch.equal((plain == data.negative).all(-1).squeeze(1), dropped)


def test_world_v2_captions_are_cached_per_window_and_drawn_at_caption_rate(runs, world_v2_data, tmp_path, capsys):
    """A world v2 dataset's clip captions (the only prompts that name the sun's side) reach the latent
    cache per window and preset; caption_rate swaps that share of the kept prompts for them."""
    pytest.importorskip("mitsuba")
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.latent_data import LatentSet

    data = world_v2_data  # 2 clips of 5 frames under 2 presets (training_helpers.world_v2_config)
    cfg = {"out": str(tmp_path / "teacher"), "data": str(data), "vae_run": str(runs / "vae"), "cond_encoder": "vae",
           "frames": 5, "steps": 1, "batch": 2, "caption_rate": 0.5, **TINY_DIT}
    assert main(["--quiet", "train", "teacher", "--config", write(tmp_path / "teacher.json", cfg)]) == 0
    cache = LatentSet(tmp_path / "teacher" / "latents-train.safetensors")
    clips = ClipSet(data, "train")
    assert cache.captions.shape == (2, 2, 1, 384)
    text = TextEncoder.load()
    assert torch.allclose(cache.captions[1, 0], text([clips.captions[1][0]])[0], atol=1e-6)
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    _, _, captioned, (wi, pi) = cache.sample(g(), 32, caption_rate=1.0)
    assert torch.equal(captioned, cache.captions[wi, pi])
    _, _, half, _ = cache.sample(g(), 32, prompt_dropout=0.25, caption_rate=0.5)
    is_caption = (half == cache.captions[wi, pi]).all(-1).squeeze(1)
    is_negative = (half == cache.negative).all(-1).squeeze(1)
    assert 4 < is_caption.sum() < 28 and not (is_caption & is_negative).any()
    _, _, plain, _ = cache.sample(g(), 32)  # caption_rate 0 draws nothing more: the old stream
    assert not (plain == cache.captions[wi, pi]).all(-1).any()
    v1 = LatentSet(runs / "teacher" / "latents-train.safetensors")
    with pytest.raises(AlayaError, match="caption_rate 0.5 needs clip captions"):
        v1.sample(g(), 2, caption_rate=0.5)
    assert main(["train", "teacher", "--config", write(tmp_path / "bad.json", {**cfg, "caption_rate": 1.5})]) == 2
    assert "caption_rate 1.5 must be between 0 and 1" in capsys.readouterr().err
