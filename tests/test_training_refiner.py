"""The refiner stage: fitting the model's own frames, the prompt-reading config, the render cache,
the turned target, novel wordings, mirrored crops, devices and config checking."""
from __future__ import annotations

import json

import pytest
import torch

from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import write


def test_refiner_stage_fits_the_models_frames_to_the_ground_truth(runs, tmp_path):
    """60 steps of the refiner stage on the exported model's renders bring them nearer the ground
    truth than the decoder's frames are; a second run reuses the renders (same model, same recipe),
    and the export ships the refiner the model folder then loads."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 2,
           "crop": 32, "batch": 4, "steps": 60, "lr": 3e-3, "log_every": 20, "ckpt_every": 60, "precision": "fp32",
           "config": "gbuffer-refiner-16"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    log = (tmp_path / "ref" / "train.log").read_text()
    assert log.count("rendered training clip") == 2
    cfg["steps"] = 61
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    assert (tmp_path / "ref" / "train.log").read_text().count("rendered training clip") == 2  # renders reused

    from alaya_flash.model_zoo.codecs import refiner as rf
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16"])
    from alaya_flash.model_zoo.loading import load_strict
    load_strict(net, common.final_weights(tmp_path / "ref", "refiner"))
    clips = ClipSet(runs / "data", "train")
    renders, _ = model_renders(common.config_from_dict(cfg, RefinerStageConfig), clips, None)
    before, after = [], []
    for c in range(2):
        for q in range(len(clips.presets)):
            frames = torch.from_numpy(renders[c, q]).float() / 255
            truth = torch.from_numpy(clips.rgb[c, q]).float() / 255
            before.append(torch.mean((frames - truth) ** 2))
            after.append(torch.mean((net.refine(frames, torch.from_numpy(clips.gbuffers[c])) - truth) ** 2))
    assert sum(after) < 0.8 * sum(before)
    assert bundle.load_flash_folder(runs / "model").refiner is not None  # the fixture's second export shipped one


def test_prompt_refiner_stage_learns_each_presets_look(runs, tmp_path):
    """The refiner config that reads the prompt, trained on the same renders: its frames near the
    ground truth with the preset's own wording, and are further from it with another preset's."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 2,
           "crop": 32, "batch": 4, "steps": 80, "lr": 3e-3, "log_every": 20, "ckpt_every": 80, "precision": "fp32",
           "config": "gbuffer-refiner-16-prompt"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16-prompt"])
    load_strict(net, common.final_weights(tmp_path / "ref", "refiner"))
    clips = ClipSet(runs / "data", "train")
    renders, _ = model_renders(common.config_from_dict(cfg, RefinerStageConfig), clips, None)
    encode = TextEncoder.load()
    emb = [encode([clips.prompts[p]["heldout"][0]])[0] for p in clips.presets]  # wordings it never saw
    before, own, other = [], [], []
    for c in range(2):
        for q in range(len(clips.presets)):
            frames = torch.from_numpy(renders[c, q]).float() / 255
            truth = torch.from_numpy(clips.rgb[c, q]).float() / 255
            gb = torch.from_numpy(clips.gbuffers[c])

            def err(e):
                return torch.mean((net.refine(frames, gb, e.expand(len(frames), -1)) - truth) ** 2)

            before.append(torch.mean((frames - truth) ** 2))
            own.append(err(emb[q]))
            other.append(err(emb[(q + 1) % len(emb)]))
    assert sum(own) < 0.8 * sum(before)
    assert sum(own) < sum(other)


def test_refiner_with_a_mixed_in_world_refines_that_world_closer(mixed, tmp_path):
    """With mix_data / mix_rate the model's renders of a second dataset's clips (other presets) are made
    too (renders-mix/) and half the crops come from them: the refiner then brings that world's renders
    nearer their ground truth than the same training on the first dataset alone."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, _embeddings, model_renders

    base = {"model": str(mixed / "model"), "data": str(mixed / "data"), "clips": 2, "crop": 32, "batch": 4, "steps": 60,
            "lr": 3e-3, "log_every": 60, "ckpt_every": 60, "precision": "fp32", "config": "gbuffer-refiner-16-prompt"}
    runs = {"mixed": {"mix_data": str(mixed / "mix-data"), "mix_rate": 0.5}, "alone": {}}
    for name, extra in runs.items():
        cfg = {**base, **extra, "out": str(tmp_path / name)}
        assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / f"{name}.json", cfg)]) == 0
    mix = ClipSet(mixed / "mix-data", "train")
    mix_cfg = common.config_from_dict({**base, **runs["mixed"], "out": str(tmp_path / "mixed")}, RefinerStageConfig)
    renders, picks = model_renders(mix_cfg, mix, None, mix=True)  # the mixed run's cache
    emb = _embeddings([w for row in picks for w in row]).view(2, len(mix.presets), 1, -1)  # each render's own wording
    errors = {}
    for name in runs:
        net = rf.build(rf.CONFIGS["gbuffer-refiner-16-prompt"])
        load_strict(net, common.final_weights(tmp_path / name, "refiner"))
        err = []
        for c in range(2):
            for q in range(len(mix.presets)):
                frames = torch.from_numpy(renders[c, q]).float() / 255
                refined = net.refine(frames, torch.from_numpy(mix.gbuffers[c]), emb[c, q].expand(len(frames), -1))
                err.append(torch.mean((refined - torch.from_numpy(mix.rgb[c, q]).float() / 255) ** 2))
        errors[name] = sum(err)
    assert (tmp_path / "mixed" / "renders-mix" / "clip-000001.safetensors").is_file()
    assert errors["mixed"] < errors["alone"]


def test_refiner_renders_are_made_again_for_new_wordings_or_weights(runs, tmp_path, monkeypatch):
    import shutil

    from alaya_flash.model_zoo import bundle
    from alaya_flash.training import prompts
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    class Log:
        rendered = 0

        def info(self, *args):
            Log.rendered += 1

    model = tmp_path / "model"
    shutil.copytree(runs / "model", model)
    cfg = common.config_from_dict({"out": str(tmp_path / "ref"), "model": str(model), "data": str(runs / "data"),
                                   "clips": 1, "precision": "fp32"}, RefinerStageConfig)
    clips = ClipSet(runs / "data", "train")
    first, _ = model_renders(cfg, clips, Log())
    assert Log.rendered == 1 and (model_renders(cfg, clips, Log())[0] == first).all()
    assert Log.rendered == 1  # the cache was used
    bundle.save_flash(bundle.load_flash_folder(model), model)  # the same tensors written again: still cached
    model_renders(cfg, clips, Log())
    assert Log.rendered == 1
    real = prompts.prompts
    monkeypatch.setattr(prompts, "prompts", lambda preset, split: [w + ", new" for w in real(preset, split)])
    model_renders(cfg, clips, Log())
    assert Log.rendered == 2  # other wordings: rendered again
    monkeypatch.setattr(prompts, "prompts", real)
    other = bundle.load_flash_folder(model, dtype=torch.float32)
    with torch.no_grad():
        next(other.dit.parameters()).add_(0.01)
    bundle.save_flash(other, model)
    model_renders(cfg, clips, Log())
    assert Log.rendered == 3  # other weights at the same path: rendered again


@pytest.mark.parametrize("bad, message", [
    ({"config": "refiner-99"}, "config 'refiner-99' is unknown"),
    ({"precision": "fp16"}, "precision 'fp16' is not bf16 or fp32"),
    ({"model": "nowhere"}, "nowhere is not a model folder"),
    ({"prompt_dropout": 1.5}, "prompt_dropout 1.5 is not in [0, 1]"),
    ({"text_noise": -0.1}, "text_noise -0.1 must be >= 0"),
    ({"render_jitter": 1.0}, "render_jitter 1.0 is not in [0, 1)"),
    ({"target": "mean"}, "target 'mean' is unknown; choose truth or turned"),
    ({"novel_share": 1.5}, "novel_share 1.5 is not in [0, 1]"),
    ({"device": "tpu"}, "refiner stage: device 'tpu' is unknown; choose cpu or cuda"),
    ({"mix_rate": 0.5}, "go together (both or neither)"),
    ({"mix_data": "x", "mix_rate": 0.5, "novel_share": 0.5}, "novel_share and mix_data do not go together"),
    ({"caption_rate": 1.5}, "caption_rate 1.5 must be between 0 and 1"),
])
def test_bad_refiner_config_is_refused(bad, message, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "r"), "model": str(tmp_path), **bad}
    (tmp_path / "config.json").write_text("{}")
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_refiner_trained_towards_the_turned_truth_lands_nearer_it(runs, tmp_path):
    """target "turned": the refiner fits the dataset's rgb_turned, not its rgb. Made unmistakable here by
    writing the negative of the ground truth as rgb_turned: the same renders and crops then end
    nearer it than to the truth, and nearer it than a refiner fitted to the truth.

    Both refiners stay far from either target (the tiny model's renders are far off), and most of
    their error is shared by the two targets and varies from run to run, so a ratio of the two errors
    is noisy: over 20 runs (seeds 0-9, bf16 autocast as on AMX CPUs and float32 as elsewhere) 80 steps
    at lr 3e-3 gave 0.46 to 1.25 ("twice as near" held in 3, the default seed's 0.475 on CPUs without
    fast bf16, 0.67 with it); 240 steps at the stage's lr 1e-3 gave 0.47 to 0.88 over 40 runs. Where
    each lands on the line from the truth (-1) to the turned target (+1), the shared error cancels:
    in those 40 runs the two refiners landed 0.25 to 0.40 apart on it (mean 0.34)."""
    import numpy as np

    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    data = json.loads((runs / "data" / "dataset.json").read_text())["config"]
    assert main(["--quiet", "train", "data", "--config", write(tmp_path / "d.json", {
        **data, "out": str(tmp_path / "data"), "heldout_clips": 0, "sun_turns": 4})]) == 0
    for path in (tmp_path / "data" / "train").glob("*.npz"):
        with np.load(path) as z:
            clip = dict(z)
        assert clip["rgb_turned"].shape == clip["rgb"].shape
        np.savez_compressed(path, **{**clip, "rgb_turned": 255 - clip["rgb"]})
    clips = ClipSet(tmp_path / "data", "train")
    errors = {}
    for target in ("truth", "turned"):
        cfg = {"out": str(tmp_path / target), "model": str(runs / "model"), "data": str(tmp_path / "data"), "clips": 2,
               "crop": 32, "batch": 4, "steps": 240, "lr": 1e-3, "log_every": 80, "ckpt_every": 240,
               "precision": "fp32", "config": "gbuffer-refiner-16", "target": target}
        assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / f"{target}.json", cfg)]) == 0
        net = rf.build(rf.CONFIGS["gbuffer-refiner-16"])
        load_strict(net, common.final_weights(tmp_path / target, "refiner"))
        renders, _ = model_renders(common.config_from_dict(cfg, RefinerStageConfig), clips, None)
        out = torch.stack([torch.stack([net.refine(torch.from_numpy(renders[c, q]).float() / 255,
                                                   torch.from_numpy(clips.gbuffers[c])) for q in range(2)])
                           for c in range(2)])
        errors[target] = {t: torch.mean((out - torch.from_numpy(x).float() / 255) ** 2).item()
                          for t, x in (("truth", clips.rgb), ("turned", clips.rgb_turned))}
    assert errors["turned"]["turned"] < errors["truth"]["turned"], errors
    assert errors["turned"]["turned"] < errors["turned"]["truth"]  # nearer its own target than the truth
    assert errors["truth"]["truth"] < errors["truth"]["turned"]
    # where each lands on the line from the truth (-1) to the turned target (+1): (e_truth - e_turned) / distance
    apart = torch.mean((torch.from_numpy(clips.rgb).float() - torch.from_numpy(clips.rgb_turned).float()) ** 2).item() / 255 ** 2
    side = {target: (e["truth"] - e["turned"]) / apart for target, e in errors.items()}
    assert side["turned"] - side["truth"] > 0.15, (side, errors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refiner_stage_on_cuda_renders_and_trains_as_on_the_cpu(runs, tmp_path, monkeypatch):
    """device cuda: the model renders on the GPU and the refiner trains there; in float32 (autocast
    and TF32 off) the renders and the trained weights match the CPU run's up to rounding."""
    import contextlib

    from alaya_flash.training import refiner
    from alaya_flash.training.data import ClipSet

    monkeypatch.setattr(refiner, "autocast", lambda device: contextlib.nullcontext())
    base = {"model": str(runs / "model"), "data": str(runs / "data"), "clips": 2, "crop": 16, "batch": 4, "steps": 4,
            "lr": 1e-3, "log_every": 2, "ckpt_every": 4, "precision": "fp32", "config": "gbuffer-refiner-16-prompt"}
    clips = ClipSet(runs / "data", "train")
    weights, renders = {}, {}
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for name, device, extra in (("cpu", "cpu", {}), ("cuda", "cuda", {}), ("init", "cpu", {"lr": 0.0})):
            cfg = {**base, "out": str(tmp_path / name), "device": device, **extra}
            assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / f"{name}.json", cfg)]) == 0
            weights[name] = common.final_weights(tmp_path / name, "refiner")
            renders[name] = refiner.model_renders(common.config_from_dict(cfg, refiner.RefinerStageConfig), clips, None)[0]
    assert abs(renders["cpu"].astype(int) - renders["cuda"].astype(int)).max() <= 3
    norm = lambda d: sum(v.float().pow(2).sum() for v in d.values()).sqrt().item()  # noqa: E731
    a, b, init = weights["cpu"], weights["cuda"], weights["init"]
    moved = norm({k: a[k].float() - init[k].float() for k in a})
    apart = norm({k: a[k].float() - b[k].float() for k in a})
    assert moved > 0 and apart < 0.1 * moved


def test_refiner_target_turned_needs_a_dataset_with_turns(runs, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "r"), "model": str(runs / "model"), "data": str(runs / "data"), "target": "turned"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) != 0
    assert f"target 'turned' needs a dataset made with sun_turns > 1; {runs / 'data'} has none" in capsys.readouterr().err
    assert not list((tmp_path / "r").glob("renders/*"))  # refused before rendering


def test_novel_share_trains_on_renders_of_the_refiner_wordings_read_with_their_own(runs, tmp_path, monkeypatch):
    """novel_share 1: every crop comes from the renders prompted with the 'refiner' split's wordings
    (rendered once into renders-refiner/, beside the training-wording renders), and reads the
    embedding of the wording its clip and preset were rendered with."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import read_metadata
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.training.prompts import prompts

    seen = []
    real_build = rf.build

    def recording_build(config):
        net = real_build(config)
        forward = net.forward

        def spy(rgb, planes, text=None):
            seen.append(text.detach().clone())
            return forward(rgb, planes, text)

        net.forward = spy
        return net

    monkeypatch.setattr(rf, "build", recording_build)
    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 2,
           "crop": 16, "batch": 4, "steps": 3, "log_every": 1, "ckpt_every": 3, "precision": "fp32",
           "prompt_dropout": 0.0, "novel_share": 1.0}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    log = (tmp_path / "ref" / "train.log").read_text()
    assert log.count("(train wordings)") == 2 and log.count("(refiner wordings)") == 2
    used = set()
    for c in range(2):
        recipe = json.loads(read_metadata(tmp_path / "ref" / "renders-refiner" / f"clip-{c:06d}.safetensors")["recipe"])
        for preset, wording in zip(("bright_sunny", "moonlit_night"), recipe["wordings"]):
            assert wording in prompts(preset, "refiner")
            used.add(wording)
    allowed = TextEncoder.load()(sorted(used))[:, 0].float()
    crops = torch.cat(seen)
    assert len(crops) == 12  # 3 steps x batch 4
    assert all(torch.isclose(allowed, e, atol=1e-6).all(-1).any() for e in crops)


def test_world_v2_crops_read_their_clips_caption_mirrored_with_the_crop(runs, world_v2_data, tmp_path, monkeypatch,
                                                                        capsys):
    """caption_rate 1: every crop of a world v2 dataset reads its clip's caption under its preset, and
    exactly the crops mirrored left-right read the mirrored caption (the sun on the other side). A
    dataset without captions is refused by name."""
    pytest.importorskip("mitsuba")
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.training import refiner as stage
    from alaya_flash.training.data import ClipSet
    from alaya_flash.streaming.world.traced import presets

    data = world_v2_data  # 2 clips of 5 frames under 2 presets (training_helpers.world_v2_config)
    # a mirrored caption that differs whatever side the seeds gave the two clips
    monkeypatch.setattr(presets, "mirrored_caption", lambda text: text + " Seen in a mirror.")
    events = []
    real_forward, real_mirrored = rf.GBufferRefiner.forward, stage._mirrored
    monkeypatch.setattr(rf.GBufferRefiner, "forward",
                        lambda self, rgb, planes, text=None: events.append(text.detach().clone()) or
                        real_forward(self, rgb, planes, text))
    monkeypatch.setattr(stage, "_mirrored", lambda *crop: events.append("mirrored") or real_mirrored(*crop))
    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(data), "clips": 2, "crop": 16,
           "batch": 6, "steps": 3, "log_every": 3, "ckpt_every": 3, "precision": "fp32", "prompt_dropout": 0.0,
           "config": "gbuffer-refiner-16-prompt", "caption_rate": 1.0}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    captions = ClipSet(data, "train").captions
    own = stage._embeddings([t for row in captions for t in row])
    mirrored = stage._embeddings([t + " Seen in a mirror." for row in captions for t in row])
    steps = []
    for e in events:
        if isinstance(e, str):
            steps.append(steps.pop() + 1 if steps and isinstance(steps[-1], int) else 1)
        else:
            flips = steps.pop() if steps and isinstance(steps[-1], int) else 0
            steps.append((flips, e))
    assert len(steps) == 3
    total = 0
    for flips, texts in steps:
        is_own = torch.isclose(texts[:, None], own[None], atol=1e-5).all(-1).any(-1)
        is_mirrored = torch.isclose(texts[:, None], mirrored[None], atol=1e-5).all(-1).any(-1)
        assert (is_own | is_mirrored).all() and int(is_mirrored.sum()) == flips
        total += flips
    assert 0 < total < 18
    cfg.update(data=str(runs / "data"), out=str(tmp_path / "v1"))
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "v1.json", cfg)]) != 0
    assert "caption_rate 1.0 needs a refiner config that reads the prompt and clip captions" in capsys.readouterr().err


def test_mirrored_refiner_crops_turn_the_normals_with_the_image():
    from alaya_flash.model_zoo.codecs.refiner import gbuffer_planes
    from alaya_flash.training.refiner import _mirrored

    g = torch.Generator().manual_seed(0)
    gb = torch.randint(0, 256, (5, 4, 6, 3), dtype=torch.uint8, generator=g)
    rgb, target = (torch.randint(0, 256, (4, 6, 3), dtype=torch.uint8, generator=g) for _ in range(2))
    planes = gbuffer_planes(gb)
    m_rgb, m_planes, m_target = _mirrored(rgb, planes, target)
    assert torch.equal(m_rgb[:, 0], rgb[:, -1]) and torch.equal(m_target[:, 5], target[:, 0])
    # the normal's x (plane 5) is negated: n -> -n, i.e. (n + 1) / 2 -> 1 - (n + 1) / 2; y, z and the rest only move
    assert torch.allclose(m_planes[5, :, 0], 1 - planes[5, :, -1])
    for i in (0, 1, 2, 3, 4, 6, 7, 8):
        assert torch.equal(m_planes[i], planes[i].flip(-1))
    back = _mirrored(*_mirrored(rgb, planes, target))
    assert torch.equal(back[0], rgb) and torch.allclose(back[1], planes) and torch.equal(back[2], target)


def test_light_refiner_stage_reads_the_prior_under_each_clips_recorded_light(runs, tmp_path):
    """A light-reading refiner trains on the renders beside the shading prior's planes under each clip's
    recorded light (cached: a second run shades nothing again); its frames come nearer the truth, and
    another sun changes them."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.light import Light, pack
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 2,
           "crop": 32, "batch": 4, "steps": 60, "lr": 3e-3, "log_every": 20, "ckpt_every": 60, "precision": "fp32",
           "config": "gbuffer-refiner-16-light"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    assert (tmp_path / "ref" / "train.log").read_text().count("shaded training clip") == 2
    cfg["steps"] = 61
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    assert (tmp_path / "ref" / "train.log").read_text().count("shaded training clip") == 2  # planes reused
    net = rf.build(rf.CONFIGS["gbuffer-refiner-16-light"])
    load_strict(net, common.final_weights(tmp_path / "ref", "refiner"))
    clips = ClipSet(runs / "data", "train")
    renders, picks = model_renders(common.config_from_dict(cfg, RefinerStageConfig), clips, None)
    from alaya_flash.training.refiner import _embeddings

    before, after = [], []
    for c in range(2):
        for q in range(len(clips.presets)):
            frames = torch.from_numpy(renders[c, q]).float() / 255
            truth = torch.from_numpy(clips.rgb[c, q]).float() / 255
            gb = torch.from_numpy(clips.gbuffers[c])
            text = _embeddings([picks[c][q]]).expand(len(frames), -1)
            before.append(torch.mean((frames - truth) ** 2))
            after.append(torch.mean((net.refine(frames, gb, text, torch.from_numpy(clips.light[c, q])) - truth) ** 2))
    assert sum(after) < 0.8 * sum(before)
    other = pack(Light(sun_azimuth=-170.0, sun_elevation=5.0)).expand(len(frames), -1)
    assert not torch.allclose(net.refine(frames, gb, text, other), net.refine(frames, gb, text, torch.from_numpy(clips.light[1, q])), atol=1e-3)


def test_prompt_light_rate_trains_a_blending_refiner_beside_the_prior_under_the_prompts_light(runs, tmp_path, capsys):
    """With prompt_light_rate the stage also shades each clip under the light the shipped light head reads from
    the preset's wording (out/priors-prompt/), the planes `--light prompt` renders with; a refiner that reads no
    light refuses the rate in one line."""
    import numpy as np

    from alaya_flash.model_zoo.loading import read_state_dict
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming.gbuffer import DEFAULT_DEPTH_NEAR
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import prompt_lights

    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 1,
           "crop": 32, "batch": 4, "steps": 4, "log_every": 2, "ckpt_every": 4, "precision": "fp32",
           "config": "gbuffer-refiner-16-blend", "prompt_light_rate": 0.5}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    clips = ClipSet(runs / "data", "train")
    lights = prompt_lights(clips, 1)
    assert lights.shape[:3] == (1,) + clips.rgb.shape[1:3]
    planes = read_state_dict(tmp_path / "ref" / "priors-prompt" / "clip-000000.safetensors")["planes"]
    q = len(clips.presets) - 1
    want = ShadingPrior()(torch.from_numpy(clips.gbuffers[0]), torch.from_numpy(lights[0, q]), DEFAULT_DEPTH_NEAR)
    assert torch.equal(planes[q], want.mul(255).round().clamp(0, 255).to(torch.uint8))
    assert not np.array_equal(planes.numpy(), read_state_dict(tmp_path / "ref" / "priors" / "clip-000000.safetensors")["planes"].numpy())
    cfg.update(config="gbuffer-refiner-16-context", out=str(tmp_path / "plain"))
    assert main(["train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 2
    assert "prompt_light_rate 0.5 needs a refiner config that reads the light" in capsys.readouterr().err


def test_shadow_and_sky_pass_rates_shade_with_the_clips_recorded_visibilities(runs, tmp_path, capsys):
    """With shadow_pass_rate the stage also shades each clip with its recorded sun visibility as the shadows
    (out/priors-shadow/: what an engine's shadow pass gives the prior), with sky_pass_rate with that and its
    recorded sky visibility as the ambient occlusion (out/priors-shadow-sky/: a sky pass too); a dataset that
    records neither refuses each rate in one line naming it."""
    import shutil

    import numpy as np

    from alaya_flash.model_zoo.loading import read_state_dict
    from alaya_flash.model_zoo.shading_prior import ShadingPrior
    from alaya_flash.streaming.gbuffer import DEFAULT_DEPTH_NEAR
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import load_run

    data = tmp_path / "data"  # the session's dataset, with a sun visibility recorded: the left half in shadow
    shutil.copytree(runs / "data", data)
    for name in json.loads((data / "dataset.json").read_text())["clips"]["train"]:
        with np.load(data / name) as z:
            arrays = dict(z)
        p, t, h, w = arrays["rgb"].shape[:4]
        vis = np.full((p, t, h, w), 255, np.uint8)
        vis[..., : w // 2] = 0
        sky = np.full((t, h, w), 255, np.uint8)
        sky[:, h // 2:] = 64  # the lower half sees a quarter of the sky
        np.savez(data / name, **arrays, sun_visibility=vis, sky_visibility=sky)
    cfg = {"out": str(tmp_path / "ref"), "model": str(runs / "model"), "data": str(data), "clips": 1,
           "crop": 32, "batch": 4, "steps": 4, "log_every": 2, "ckpt_every": 4, "precision": "fp32",
           "config": "gbuffer-refiner-16-sky", "shadow_pass_rate": 0.5, "prompt_light_rate": 0.5,
           "sky_pass_rate": 0.5}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    net, name = load_run(tmp_path / "ref")  # it trained reading whether each crop's light and shadows were given
    assert name == "gbuffer-refiner-16-sky" and net.reads_given and net.reads_sky and net.head[0].weight.grad is None
    prior = ShadingPrior(net.config.prior_config)  # its prior: with reflections
    clips = ClipSet(data, "train")
    planes = read_state_dict(tmp_path / "ref" / "priors-shadow" / "clip-000000.safetensors")["planes"]
    q = len(clips.presets) - 1
    vis = torch.from_numpy(clips.sun_visibility[0, q]).float() / 255
    want = prior(torch.from_numpy(clips.gbuffers[0]), torch.from_numpy(clips.light[0, q]), DEFAULT_DEPTH_NEAR,
                          sun_visibility=vis)
    assert torch.equal(planes[q], want.mul(255).round().clamp(0, 255).to(torch.uint8))
    assert (planes[:, :, 3, :, : 16] == 0).all() and not torch.equal(
        planes, read_state_dict(tmp_path / "ref" / "priors" / "clip-000000.safetensors")["planes"])
    both = read_state_dict(tmp_path / "ref" / "priors-shadow-sky" / "clip-000000.safetensors")["planes"]
    sky = torch.from_numpy(clips.sky_visibility[0]).float() / 255
    want = prior(torch.from_numpy(clips.gbuffers[0]), torch.from_numpy(clips.light[0, q]), DEFAULT_DEPTH_NEAR,
                          sun_visibility=vis, sky_visibility=sky)
    assert torch.equal(both[q], want.mul(255).round().clamp(0, 255).to(torch.uint8))
    h = both.shape[-2]
    assert (both[:, :, 4, h // 2:] == 64).all() and (both[:, :, 4, : h // 2] == 255).all()  # the AO is the sky pass
    assert torch.equal(both[:, :, 3], planes[:, :, 3])  # and the shadows the shadow pass
    cfg.update(data=str(runs / "data"), out=str(tmp_path / "none"), sky_pass_rate=0.0)
    assert main(["train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 2
    assert "shadow_pass_rate 0.5 needs a refiner config that reads the light and a dataset that records sun " \
           "visibility" in capsys.readouterr().err
    cfg.update(shadow_pass_rate=0.0, sky_pass_rate=0.5, out=str(tmp_path / "no-sky"))
    assert main(["train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 2
    assert "sky_pass_rate 0.5 needs a refiner config that reads the light and a dataset that records sky " \
           "visibility" in capsys.readouterr().err
    cfg.update(config="gbuffer-refiner-16-given")  # a refiner whose prior leaves the sky pass out
    assert main(["train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 2
    assert "sky_pass_rate 0.5 needs a refiner config that reads the sky pass (gbuffer-refiner-16-sky), not " \
           "gbuffer-refiner-16-given" in capsys.readouterr().err


def test_mix_clips_sets_how_many_of_the_mixed_worlds_clips_are_rendered(mixed, tmp_path, capsys):
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.refiner import RefinerStageConfig, model_renders

    cfg = common.config_from_dict({"model": str(mixed / "model"), "data": str(mixed / "data"), "clips": 2,
                                   "mix_data": str(mixed / "mix-data"), "mix_rate": 0.5, "mix_clips": 1,
                                   "precision": "fp32", "out": str(tmp_path / "r")}, RefinerStageConfig)
    import logging

    log = logging.getLogger("test")
    mix = ClipSet(mixed / "mix-data", "train")
    assert len(model_renders(cfg, mix, log, mix=True)[0]) == 1
    assert len(model_renders(cfg, ClipSet(mixed / "data", "train"), log)[0]) == 2
    bad = {"out": str(tmp_path / "x"), "model": str(mixed / "model"), "data": str(mixed / "data"), "mix_clips": -1}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "bad.json", bad)]) != 0
    assert "mix_clips -1" in capsys.readouterr().err


def test_init_starts_the_refiner_from_a_model_folders_refiner(tmp_path):
    """`init`: the stage starts from a model folder's refiner of the same config (a fine-tune), strictly; a folder
    of another refiner config, or with none, is one line naming it."""
    from alaya_flash.model_zoo.codecs import refiner as refiner_codec
    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.model_zoo.loading import save_safetensors
    from alaya_flash.training.refiner import RefinerStageConfig, _start_from

    name = "gbuffer-refiner-16-given"
    shipped = refiner_codec.build(refiner_codec.CONFIGS[name])
    with torch.no_grad():
        for t in shipped.parameters():
            t.normal_()
    folder = tmp_path / "model"
    folder.mkdir()
    save_safetensors(shipped.state_dict(), folder / "refiner.safetensors", {"role": "refiner"})
    (folder / "config.json").write_text(json.dumps({"networks": {"refiner": {"config_name": name}}}))
    net = refiner_codec.build(refiner_codec.CONFIGS[name])
    _start_from(net, RefinerStageConfig(config=name, init=str(folder)))
    for key, value in shipped.state_dict().items():
        assert torch.equal(net.state_dict()[key], value), key
    with pytest.raises(AlayaError, match=f"init {folder}'s refiner is '{name}', the stage trains "
                                         "'gbuffer-refiner-16-mirror': not the same network"):
        _start_from(refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-mirror"]),
                    RefinerStageConfig(config="gbuffer-refiner-16-mirror", init=str(folder)))
    # a refiner whose prior took no sky pass starts one whose prior does: the same network
    mirror = refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-mirror"])
    save_safetensors(mirror.state_dict(), folder / "refiner.safetensors", {"role": "refiner"})
    (folder / "config.json").write_text(json.dumps({"networks": {"refiner": {"config_name": "gbuffer-refiner-16-mirror"}}}))
    sky = refiner_codec.build(refiner_codec.CONFIGS["gbuffer-refiner-16-sky"])
    _start_from(sky, RefinerStageConfig(config="gbuffer-refiner-16-sky", init=str(folder)))
    assert all(torch.equal(sky.state_dict()[k], v) for k, v in mirror.state_dict().items())
    with pytest.raises(AlayaError, match="is not a model folder with a refiner"):
        _start_from(net, RefinerStageConfig(config=name, init=str(tmp_path)))
