"""Training recipe: a smoke run of every stage (tiny sizes, a few steps) through `alaya-flash train`,
resume equivalence, config checking, and the distillation pieces checked against inference."""
from __future__ import annotations

import json

import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.training import common
from alaya_flash.streaming.cli import main

TINY_DIT = {"dit": "dit-tiny", "dim": 32, "ffn_dim": 64, "num_heads": 2, "num_layers": 2}


def write(path, cfg: dict):
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
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


def test_every_stage_writes_checkpoints_and_logs(runs):
    for name, steps in (("vae", 3), ("codecs", 2), ("teacher", 3), ("ode", 2), ("dmd", 3), ("rollout", 2), ("decoder", 2),
                        ("refiner", 2)):
        ckpt = common.latest_checkpoint(runs / name)
        assert ckpt is not None and ckpt.name == f"ckpt-{steps:06d}.safetensors", name
        assert "done" in (runs / name / "train.log").read_text()
    assert "motion=" in (runs / "vae" / "train.log").read_text() and "chroma=" in (runs / "vae" / "train.log").read_text()
    assert "pair=" in (runs / "rollout" / "train.log").read_text() and "pair=" in (runs / "decoder" / "train.log").read_text()
    assert len(list((runs / "data" / "train").glob("*.npz"))) == 2
    assert len(list((runs / "data" / "heldout").glob("*.npz"))) == 1


def test_ode_data_term_pulls_the_student_towards_the_data(runs, tmp_path):
    """student-ode with data_weight > 0 regresses onto the ground-truth latents as well: after the
    same steps its one-step x0 from pure noise is closer to the data than pure ODE regression's."""
    from alaya_flash.model_zoo.training.latent_data import LatentSet
    from alaya_flash.model_zoo.training.teacher import load_dit

    assert "data=" in (runs / "ode" / "train.log").read_text()
    cfg = {"teacher_run": str(runs / "teacher"), "codecs_run": str(runs / "codecs"), "pairs": 2, "ode_steps": 4,
           "chunk_frames": 1, "batch": 2, "lr": 3e-3, "steps": 25, "log_every": 25, "ckpt_every": 25}
    errors = {}
    for weight in (0.0, 4.0):
        out = tmp_path / f"w{weight}"
        out.mkdir()
        (out / "trajectories.safetensors").symlink_to(runs / "ode" / "trajectories.safetensors")
        (out / "latents-student.safetensors").symlink_to(runs / "ode" / "latents-student.safetensors")
        conf = write(tmp_path / f"w{weight}.json", {**cfg, "out": str(out), "data_weight": weight})
        assert main(["--quiet", "train", "student-ode", "--config", conf]) == 0
        model = load_dit(out).eval()
        data = LatentSet(runs / "teacher" / "latents-train.safetensors")
        cond = LatentSet(runs / "ode" / "latents-student.safetensors").cond
        g = torch.Generator().manual_seed(1)
        err = []
        with torch.no_grad():
            for p in range(len(data.presets)):
                x0 = data.rgb[:, p]
                noise = torch.randn(x0.shape, generator=g)
                prompt = data.embedding(p, "train", 0)[None].expand(x0.shape[0], -1, -1)
                v = model(torch.cat([noise, cond], 1), torch.full((x0.shape[0], x0.shape[2]), 1000.0), prompt,
                          chunk_frames=1)
                err.append(float((noise - v - x0).pow(2).mean()))
        errors[weight] = sum(err) / len(err)
    assert errors[4.0] < errors[0.0], errors


def test_codecs_from_cached_latents_cut_aligned_crops(runs, tmp_path, capsys):
    """codecs with `latents`: each crop's targets are the teacher cache's latents of that very window
    and preset, at the 8-pixel-aligned place of the pixel crop; a cache of another recipe is refused."""
    from alaya_flash.model_zoo.training.codecs import CachedTargets, CodecStageConfig, load_vae, to_video, vae_gbuffer_latents
    from alaya_flash.model_zoo.training.data import ClipSet

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


def test_student_trains_on_the_distilled_encoders_latents(runs):
    """Teacher on the VAE's G-buffer latents, student on the streaming encoder's, window for window."""
    from alaya_flash.model_zoo.codecs import gbuffer_encoder
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.latent_data import LatentSet

    teacher = LatentSet(runs / "teacher" / "latents-train.safetensors")
    student = LatentSet(runs / "ode" / "latents-student.safetensors")
    assert student.rgb is None and student.cond.shape == teacher.cond.shape
    enc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS["gbuffer-encoder-slim"]).eval()
    load_strict(enc, common.final_weights(runs / "codecs", "gbuffer_encoder"))
    clips = ClipSet(runs / "data", "train")
    with torch.no_grad(), common.autocast():
        first = enc.encode(torch.from_numpy(clips.gbuffers[0, :9])[None]).float()[0]
    torch.testing.assert_close(student.cond[0], first)
    assert (student.cond - teacher.cond).abs().mean() > 1e-3  # not the VAE's latents
    assert (runs / "dmd" / "latents-student.safetensors").is_file()
    # the DMD stage took the ODE stage's encoding instead of encoding the windows again
    assert "encoded" not in (runs / "dmd" / "train.log").read_text()
    assert torch.equal(LatentSet(runs / "dmd" / "latents-student.safetensors").cond, student.cond)


def test_export_loads_with_the_bundle_loaders(runs):
    from alaya_flash.model_zoo import bundle

    flash = bundle.load_flash(runs / "model", dtype=torch.float32)
    teacher = bundle.load_teacher(runs / "model" / "teacher", dtype=torch.float32)
    assert flash.settings.chunk_frames == 1
    student = common.final_weights(runs / "dmd", "dit")
    for k, v in flash.dit.state_dict().items():  # bf16 export of the trained student
        assert torch.equal(v, student[k].to(torch.bfloat16).float()), k
    assert teacher.dit.config == flash.dit.config
    assert (teacher.settings.cfg, teacher.settings.window_frames) == (3.0, 9)  # the export config's


def test_import_then_export_gives_the_same_weights_back(runs, tmp_path):
    """`train import` turns an exported model into run folders that the later stages read and that
    `train export` writes out again unchanged: the way to fine-tune the shipped default."""
    from safetensors.torch import load_file

    model = runs / "model"
    assert main(["--quiet", "train", "import", "--config",
                 write(tmp_path / "i.json", {"model": str(model), "out": str(tmp_path / "imp")})]) == 0
    imp = tmp_path / "imp"
    again = tmp_path / "again"
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", {
        "out": str(again), "student_run": str(imp / "student"), "teacher_run": str(imp / "teacher"),
        "codecs_run": str(imp / "codecs"), "vae_run": str(imp / "vae"), "refiner_run": str(imp / "refiner"),
        "trained_size": [32, 32], "teacher_window_frames": 9, "teacher_cfg": 3.0})]) == 0
    files = sorted(p.relative_to(model) for p in model.rglob("*.safetensors"))
    assert len(files) == 6  # dit, gbuffer_encoder, decoder, refiner; teacher/dit, teacher/vae
    for f in files:
        a, b = load_file(model / f), load_file(again / f)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    for name in ("config.json", "teacher/config.json"):
        assert json.loads((again / name).read_text())["networks"] == json.loads((model / name).read_text())["networks"]
    # the imported student streams with the model's chunk size, and a later stage can start from it
    from alaya_flash.model_zoo.training.latent_data import checkpoint_step
    assert checkpoint_step(imp / "student") == 0
    rollout = {"out": str(tmp_path / "r"), "student_run": str(imp / "student"), "data": str(runs / "data"),
               "vae_run": str(imp / "vae"), "codecs_run": str(imp / "codecs"), "frames": 9, "window_frames": 2,
               "sink_frames": 1, "steps": 1, "batch": 2, "ckpt_every": 1}
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "r.json", rollout)]) == 0


def test_import_refuses_a_folder_that_is_not_a_model_and_a_used_out(runs, tmp_path, capsys):
    cfg = write(tmp_path / "i.json", {"model": str(tmp_path / "nothing"), "out": str(tmp_path / "imp")})
    assert main(["--quiet", "train", "import", "--config", cfg]) != 0
    assert f"import: {tmp_path / 'nothing'} is not a model folder (no config.json)" in capsys.readouterr().err
    cfg = write(tmp_path / "j.json", {"model": str(runs / "model"), "out": str(tmp_path / "imp")})
    assert main(["--quiet", "train", "import", "--config", cfg]) == 0
    assert main(["--quiet", "train", "import", "--config", cfg]) != 0
    assert "already there; import into an empty folder (out)" in capsys.readouterr().err


def test_refiner_stage_fits_the_models_frames_to_the_ground_truth(runs, tmp_path):
    """60 steps of the refiner stage on the exported model's renders bring them nearer the ground
    truth than the decoder's frames are; a second run reuses the renders (same model, same recipe),
    and the export ships the refiner the model folder then loads."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.refiner import RefinerStageConfig, model_renders

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
    assert bundle.load_flash(runs / "model").refiner is not None  # the fixture's second export shipped one


def test_prompt_refiner_stage_learns_each_presets_look(runs, tmp_path):
    """The refiner config that reads the prompt, trained on the same renders: its frames near the
    ground truth with the preset's own wording, and are further from it with another preset's."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.refiner import RefinerStageConfig, model_renders

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


def test_refiner_renders_are_made_again_for_new_wordings_or_weights(runs, tmp_path, monkeypatch):
    import shutil

    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.training import prompts
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.refiner import RefinerStageConfig, model_renders

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
    bundle.save_flash(bundle.load_flash(model), model)  # the same tensors written again: still cached
    model_renders(cfg, clips, Log())
    assert Log.rendered == 1
    real = prompts.prompts
    monkeypatch.setattr(prompts, "prompts", lambda preset, split: [w + ", new" for w in real(preset, split)])
    model_renders(cfg, clips, Log())
    assert Log.rendered == 2  # other wordings: rendered again
    monkeypatch.setattr(prompts, "prompts", real)
    other = bundle.load_flash(model, dtype=torch.float32)
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
])
def test_bad_refiner_config_is_refused(bad, message, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "r"), "model": str(tmp_path), **bad}
    (tmp_path / "config.json").write_text("{}")
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_turned_ground_truth_is_the_same_whichever_way_the_world_faces(monkeypatch):
    """sun_turns 4: the mean over the world's turns by 90 degrees does not change when the light
    itself is turned by 90 degrees (what a renderer cannot see on a square courtyard), while the
    one-sun ground truth does. The G-buffers and that ground truth are the data without turns."""
    from alaya_flash.model_zoo.training import data
    from alaya_flash.streaming.world import shading

    cfg = data.DataConfig(width=32, height=32, frames=5, objects=4, presets=("bright_sunny", "cyberpunk_neon"),
                          sun_turns=4)
    first = data.render_clip(cfg, 5)
    plain = data.render_clip(data.DataConfig(**{**cfg.__dict__, "sun_turns": 1}), 5)
    assert "rgb_turned" not in plain and set(first) == {"gbuffers", "rgb", "presets", "rgb_turned"}
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

    from alaya_flash.model_zoo.training.data import ClipSet, DataConfig, build_dataset

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


def test_refiner_trained_towards_the_turned_truth_lands_nearer_it(runs, tmp_path):
    """target "turned": the refiner fits the dataset's rgb_turned, not its rgb. Made unmistakable here by
    writing the negative of the ground truth as rgb_turned: the same renders and crops then end
    nearer it than to the truth, and twice as near it as a refiner fitted to the truth."""
    import numpy as np

    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.refiner import RefinerStageConfig, model_renders

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
               "crop": 32, "batch": 4, "steps": 80, "lr": 3e-3, "log_every": 40, "ckpt_every": 80,
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
    assert errors["turned"]["turned"] < 0.5 * errors["truth"]["turned"]
    assert errors["turned"]["turned"] < errors["turned"]["truth"]  # nearer its own target than the truth
    assert errors["truth"]["truth"] < errors["truth"]["turned"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_refiner_stage_on_cuda_renders_and_trains_as_on_the_cpu(runs, tmp_path, monkeypatch):
    """device cuda: the model renders on the GPU and the refiner trains there; in float32 (autocast
    and TF32 off) the renders and the trained weights match the CPU run's up to rounding."""
    import contextlib

    from alaya_flash.model_zoo.training import refiner
    from alaya_flash.model_zoo.training.data import ClipSet

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


def test_dataset_splits_share_no_seed_and_hold_every_preset(runs):
    from alaya_flash.model_zoo.training.data import ClipSet

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
    from alaya_flash.model_zoo.training.prompts import prompts
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


def test_novel_share_trains_on_renders_of_the_refiner_wordings_read_with_their_own(runs, tmp_path, monkeypatch):
    """novel_share 1: every crop comes from the renders prompted with the 'refiner' split's wordings
    (rendered once into renders-refiner/, beside the training-wording renders), and reads the
    embedding of the wording its clip and preset were rendered with."""
    from alaya_flash.model_zoo.codecs import refiner as rf
    from alaya_flash.model_zoo.loading import read_metadata
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.model_zoo.training.prompts import prompts

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


def test_new_wordings_refresh_a_cache_without_encoding_the_windows_again(runs, tmp_path):
    """dataset.json rewritten with more paraphrases: the teacher's cache keeps its latents and gets the
    new prompt embeddings; the teacher's train_wordings limits the prompts it draws."""
    import shutil

    from alaya_flash.model_zoo.training.teacher import TeacherStageConfig, prepare_latents

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


def test_resume_equals_an_uninterrupted_run(runs, tmp_path):
    cfg = {**TINY_DIT, "data": str(runs / "data"), "vae_run": str(runs / "vae"), "codecs_run": str(runs / "codecs"),
           "cond_encoder": "vae", "frames": 9, "batch": 2, "log_every": 1, "ckpt_every": 1}
    for name in ("once", "twice"):  # share the cached latents so both runs see the same data
        (tmp_path / name).mkdir()
        (tmp_path / name / "latents-train.safetensors").symlink_to(runs / "teacher" / "latents-train.safetensors")
    assert main(["--quiet", "train", "teacher", "--config", write(tmp_path / "a.json", {**cfg, "out": str(tmp_path / "once"), "steps": 4})]) == 0
    b = write(tmp_path / "b.json", {**cfg, "out": str(tmp_path / "twice")})
    assert main(["--quiet", "train", "teacher", "--config", b, "--set", "steps=2"]) == 0
    assert main(["--quiet", "train", "teacher", "--config", b, "--set", "steps=4"]) == 0
    assert "resumed from ckpt-000002" in (tmp_path / "twice" / "train.log").read_text()
    one, two = common.final_weights(tmp_path / "once", "dit"), common.final_weights(tmp_path / "twice", "dit")
    for k in one:
        assert torch.equal(one[k], two[k]), k


def test_resumed_vae_recalibrates_and_stale_statistics_are_refused(runs, tmp_path, capsys):
    import shutil

    from alaya_flash.model_zoo.training import codecs

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
    from alaya_flash.model_zoo.training.codecs import motion_loss

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 8, 3, 4, 4, generator=g)  # (B, T, C, H, W)
    assert motion_loss(target + 0.1, target, dim=1).item() < 1e-6  # the same motion, shifted in brightness
    held = target[:, [0, 0, 0, 0, 4, 4, 4, 4]]  # each group of 4 frames repeats its first: a jump every 4
    assert motion_loss(held, target, dim=1).item() > 0.1
    assert motion_loss(held.transpose(1, 2), target.transpose(1, 2), dim=2).item() == pytest.approx(
        motion_loss(held, target, dim=1).item())


def test_boundary_motion_loss_prices_only_the_changes_into_each_latent():
    from alaya_flash.model_zoo.training.codecs import boundary_motion_loss

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
    from alaya_flash.model_zoo.training.codecs import chroma_loss

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

    from alaya_flash.model_zoo.training import codecs

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

    from alaya_flash.model_zoo.training import teacher

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


def test_unknown_config_key_is_refused_by_name(tmp_path, capsys):
    cfg = write(tmp_path / "bad.json", {"out": str(tmp_path / "x"), "stepz": 3})
    assert main(["train", "teacher", "--config", cfg]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and "'stepz'" in err
    cfg = write(tmp_path / "bad2.json", {"steps": "many"})
    assert main(["train", "vae", "--config", cfg]) == 2
    assert "'steps' is 'many'" in capsys.readouterr().err
    cfg = write(tmp_path / "bad3.json", {"data_weight": -1.0})
    assert main(["train", "student-ode", "--config", cfg]) == 2
    assert "data_weight -1.0 must be >= 0" in capsys.readouterr().err
    cfg = write(tmp_path / "bad5.json", {"text_noise": -0.5})
    assert main(["train", "teacher", "--config", cfg]) == 2
    assert "teacher stage: text_noise -0.5 must be >= 0" in capsys.readouterr().err
    cfg = write(tmp_path / "bad6.json", {"text_noise": -0.5})
    assert main(["train", "student-ode", "--config", cfg]) == 2
    assert "student-ode: text_noise -0.5 must be >= 0" in capsys.readouterr().err
    cfg = write(tmp_path / "bad4.json", {"clean_context": 1.5})
    assert main(["train", "student-ode", "--config", cfg]) == 2
    assert "clean_context 1.5 must be in [0, 1]" in capsys.readouterr().err


def test_training_rollout_equals_the_inference_session(monkeypatch):
    """The DMD self-rollout (exit at the last step) renders exactly what FlashSession streams
    (in float32: training's bf16 autocast, where it is on, is switched off for the comparison)."""
    import contextlib

    from alaya_flash.model_zoo import dit
    from alaya_flash.model_zoo.training import student
    from alaya_flash.model_zoo.training.student import rollout

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    from alaya_flash.streaming.session import FlashSession, SessionConfig

    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    cond = torch.randn(1, 80, 4, 4, 4)
    prompt = torch.randn(1, 1, 16)
    with torch.no_grad():
        ours = rollout(model, cond, prompt, chunk_frames=2, exit_step=3, g=torch.Generator().manual_seed(5))
    session = FlashSession(model, SessionConfig(window_frames=4, sink_frames=0))
    state = session.new_state(prompt, seed=5)
    theirs = torch.cat([session.step(state, cond[:, :, i:i + 2])[0] for i in (0, 2)], 2)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_finished_rollout_with_a_sink_equals_the_inference_session(monkeypatch):
    """student-rollout's rollout (every step run, the rolling cache with a sink, frames evicted)
    renders what FlashSession streams, whichever step carries the gradient: the steps after it
    still run and the cache gets the chunk's final x0."""
    import contextlib

    from alaya_flash.model_zoo import dit
    from alaya_flash.model_zoo.training import student
    from alaya_flash.model_zoo.training.student import rollout
    from alaya_flash.streaming.session import FlashSession, SessionConfig

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    cond = torch.randn(1, 80, 5, 4, 4)
    prompt = torch.randn(1, 1, 16)
    session = FlashSession(model, SessionConfig(window_frames=2, sink_frames=1))
    state = session.new_state(prompt, seed=5)
    theirs = torch.cat([session.step(state, cond[:, :, i:i + 1])[0] for i in range(5)], 2)
    assert state.cache.evicted > 0
    with torch.no_grad():
        ours = rollout(model, cond, prompt, 1, 3, torch.Generator().manual_seed(5), window_frames=2, sink_frames=1,
                       finish=True)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        # with the gradient at step 1, the chunks returned are step 1's x0, but the stream is the same:
        # its first chunk's x0 at step 1 is what it is in the finished rollout, and the last chunk,
        # made from that same cache, differs only by being an earlier step's estimate
        early = rollout(model, cond, prompt, 1, 1, torch.Generator().manual_seed(5), window_frames=2, sink_frames=1,
                        finish=True)
    assert not torch.allclose(early, ours)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # the finished rollout up to step 1 of the first chunk, by hand
        sig = student.student_sigmas()
        cache = model.new_cache(1, 4, 4, window_frames=2, sink_frames=1)
        x = torch.randn((1, 16, 1, 4, 4), generator=g)
        ctx = model.prepare_prompt(prompt)
        x0 = x - sig[0] * model(torch.cat([x, cond[:, :, :1]], 1), torch.full((1,), 1000 * sig[0]), ctx, cache=cache)
        x = student.sampler.add_noise(x0, torch.randn(x.shape, generator=g), sig[1])
        x0 = x - sig[1] * model(torch.cat([x, cond[:, :, :1]], 1), torch.full((1,), 1000 * sig[1]), ctx, cache=cache)
    torch.testing.assert_close(early[:, :, :1], x0, atol=1e-5, rtol=1e-5)


def test_rollout_stage_regresses_the_stream_onto_the_data(runs, tmp_path):
    """student-rollout lowers the error of the student's own streamed render against the ground
    truth (the loss it logs)."""
    from alaya_flash.model_zoo.training.latent_data import LatentSet
    from alaya_flash.model_zoo.training.student import rollout
    from alaya_flash.model_zoo.training.teacher import load_dit

    data = LatentSet(runs / "rollout" / "latents-train.safetensors")
    assert data.rgb.shape[3] == 3 and data.cond.shape[1] == 80  # whole 9-frame clips, distilled conditioning

    def stream_error(run) -> float:
        model = load_dit(run).eval()
        err = []
        with torch.no_grad():
            for p in range(len(data.presets)):
                prompt = data.embedding(p, "train", 0)[None].expand(len(data), -1, -1)
                x = rollout(model, data.cond, prompt, 1, 3, torch.Generator().manual_seed(1), 2, 1, finish=True)
                err.append(float((x - data.rgb[:, p]).pow(2).mean()))
        return sum(err) / len(err)

    out = tmp_path / "rollout"
    out.mkdir()
    (out / "latents-train.safetensors").symlink_to(runs / "rollout" / "latents-train.safetensors")
    conf = {"out": str(out), "student_run": str(runs / "ode"), "data": str(runs / "data"), "vae_run": str(runs / "vae"),
            "codecs_run": str(runs / "codecs"), "frames": 9, "window_frames": 2, "sink_frames": 1, "batch": 2,
            "lr": 3e-3, "steps": 25, "log_every": 25, "ckpt_every": 25}
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "r.json", conf)]) == 0
    assert "encoded" not in (out / "train.log").read_text()  # the cached clips were reused
    assert stream_error(out) < stream_error(runs / "ode")


def test_nearest_presets_pick_the_other_preset_nearest_on_the_same_clip():
    from alaya_flash.model_zoo.training.latent_data import nearest_presets

    rgb = torch.zeros(2, 3, 1, 1, 1, 2)
    rgb[0, :, 0, 0, 0, 0] = torch.tensor([0.0, 1.0, 3.0])  # clip 0: 0-1 near, 2 nearest to 1
    rgb[1, :, 0, 0, 0, 0] = torch.tensor([0.0, 5.0, 0.5])  # clip 1: 0-2 near, 1 nearest to 2
    assert nearest_presets(rgb).tolist() == [[1, 0, 1], [2, 2, 0]]


def test_pairs_share_the_clip_and_take_the_nearest_preset(runs):
    from alaya_flash.model_zoo.training.latent_data import LatentSet, nearest_presets
    from alaya_flash.model_zoo.training.student import sample_pairs

    data = LatentSet(runs / "rollout" / "latents-train.safetensors")
    nearest = nearest_presets(data.rgb)
    x0, cond, prompt = sample_pairs(data, nearest, torch.Generator().manual_seed(3), 3)
    assert x0.shape[0] == cond.shape[0] == prompt.shape[0] == 6
    for k in range(3):
        assert torch.equal(cond[k], cond[k + 3])
        (w, p), = [(w, p) for w in range(len(data)) for p in range(len(data.presets))
                   if torch.equal(data.rgb[w, p], x0[k]) and torch.equal(data.cond[w], cond[k])]
        assert torch.equal(x0[k + 3], data.rgb[w, nearest[w, p]])
        q = int(nearest[w, p])
        assert any(torch.equal(prompt[k + 3], data.embedding(q, "train", i)) for i in range(data.wordings("train")))


def test_pair_term_regresses_the_change_between_presets(runs, tmp_path):
    """With pair_weight the change between a clip's renders under two presets comes nearer the
    change between their ground truths than the same training without the term brings it."""
    from alaya_flash.model_zoo.training.latent_data import LatentSet
    from alaya_flash.model_zoo.training.student import rollout
    from alaya_flash.model_zoo.training.teacher import load_dit

    data = LatentSet(runs / "rollout" / "latents-train.safetensors")

    def pair_error(run) -> float:
        model = load_dit(run).eval()
        with torch.no_grad():
            x = [rollout(model, data.cond, data.embedding(p, "train", 0)[None].expand(len(data), -1, -1), 1, 3,
                         torch.Generator().manual_seed(1), 2, 1, finish=True) for p in (0, 1)]
        return float(((x[0] - x[1]) - (data.rgb[:, 0] - data.rgb[:, 1])).pow(2).mean())

    def train(weight: float):
        out = tmp_path / f"pairs-{weight}"
        out.mkdir()
        (out / "latents-train.safetensors").symlink_to(runs / "rollout" / "latents-train.safetensors")
        conf = {"out": str(out), "student_run": str(runs / "ode"), "data": str(runs / "data"),
                "vae_run": str(runs / "vae"), "codecs_run": str(runs / "codecs"), "frames": 9, "window_frames": 2,
                "sink_frames": 1, "batch": 2, "lr": 3e-3, "steps": 25, "log_every": 25, "ckpt_every": 25,
                "pair_weight": weight}
        assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / f"{weight}.json", conf)]) == 0
        return pair_error(out)

    assert train(4.0) < train(0.0)


def test_decoder_stage_decodes_the_students_latents_closer_to_the_ground_truth(runs, tmp_path):
    """`train decoder` renders every cached clip under every preset with the student once, then
    adapts the tiny decoder to those latents: decoded, they come nearer the ground truth than through
    the codecs' decoder; the G-buffer encoder is carried over, and export takes the run as codecs_run."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.codecs import tiny
    from alaya_flash.model_zoo.loading import load_strict, read_state_dict
    from alaya_flash.model_zoo.training.data import ClipSet
    from alaya_flash.model_zoo.training.latent_data import LatentSet

    cache = runs / "rollout" / "latents-train.safetensors"
    renders = read_state_dict(runs / "decoder" / "renders.safetensors")["renders"]
    assert renders.shape == LatentSet(cache).rgb.shape and not torch.equal(renders, LatentSet(cache).rgb)
    out = tmp_path / "decoder"
    out.mkdir()
    (out / "renders.safetensors").symlink_to(runs / "decoder" / "renders.safetensors")
    conf = {"out": str(out), "student_run": str(runs / "rollout"), "codecs_run": str(runs / "codecs"),
            "latents": str(cache), "crop": 16, "window_frames": 2, "sink_frames": 1, "batch": 2, "lr": 3e-3,
            "steps": 30, "log_every": 30, "ckpt_every": 30}
    assert main(["--quiet", "train", "decoder", "--config", write(tmp_path / "dec.json", conf)]) == 0
    assert "student renders" not in (out / "train.log").read_text()  # the cached renders were reused
    clips = ClipSet(runs / "data", "train")
    gt = torch.from_numpy(clips.rgb[:, :, :9]).float().div(255).permute(0, 1, 2, 5, 3, 4)  # N, P, T, 3, H, W

    def error(run) -> float:
        codec = tiny.build(tiny.CONFIGS["taew-slim"]).eval()
        load_strict(codec, common.final_weights(run, "tiny"))
        with torch.no_grad():
            frames = torch.stack([codec.decode(renders[:, q]) for q in range(renders.shape[1])], 1)
        return float((frames[:, :, :9] - gt).pow(2).mean())

    assert error(out) < error(runs / "codecs")
    model = tmp_path / "model"
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "exp.json", {
        "out": str(model), "student_run": str(runs / "rollout"), "teacher_run": str(runs / "teacher"),
        "codecs_run": str(out), "vae_run": str(runs / "vae"), "trained_size": [32, 32]})]) == 0
    flash = bundle.load_flash(model, dtype=torch.float32)
    for k, v in flash.gbuffer_encoder.state_dict().items():
        assert torch.equal(v, common.final_weights(runs / "codecs", "gbuffer_encoder")[k].to(torch.bfloat16).float()), k
    for k, v in flash.decoder.state_dict().items():
        assert torch.equal(v, common.final_weights(out, "tiny")[k].to(torch.bfloat16).float()), k


def test_decoder_pair_term_fits_the_change_between_presets(runs, tmp_path):
    """With pair_weight the decoder's change between a clip's decodes under two presets comes nearer
    the change between their ground-truth frames than the same training without the term brings it."""
    from alaya_flash.model_zoo.codecs import tiny
    from alaya_flash.model_zoo.loading import load_strict, read_state_dict
    from alaya_flash.model_zoo.training.data import ClipSet

    renders = read_state_dict(runs / "decoder" / "renders.safetensors")["renders"]
    gt = torch.from_numpy(ClipSet(runs / "data", "train").rgb[:, :, :9]).float().div(255).permute(0, 1, 2, 5, 3, 4)

    def train(weight: float) -> float:
        out = tmp_path / f"dec-{weight}"
        out.mkdir()
        (out / "renders.safetensors").symlink_to(runs / "decoder" / "renders.safetensors")
        conf = {"out": str(out), "student_run": str(runs / "rollout"), "codecs_run": str(runs / "codecs"),
                "latents": str(runs / "rollout" / "latents-train.safetensors"), "crop": 16, "window_frames": 2,
                "sink_frames": 1, "batch": 2, "lr": 3e-3, "steps": 30, "log_every": 30, "ckpt_every": 30,
                "pair_weight": weight}
        assert main(["--quiet", "train", "decoder", "--config", write(tmp_path / f"{weight}.json", conf)]) == 0
        codec = tiny.build(tiny.CONFIGS["taew-slim"]).eval()
        load_strict(codec, common.final_weights(out, "tiny"))
        with torch.no_grad():
            a, b = (codec.decode(renders[:, q])[:, :9] for q in (0, 1))
        return float(((a - b) - (gt[:, 0] - gt[:, 1])).pow(2).mean())

    assert train(4.0) < train(0.0)


def test_decoder_chroma_term_fits_the_hue(runs, tmp_path):
    """With chroma_weight the decoder's hue (each pixel minus its channel mean) comes nearer the ground
    truth's than the same training without the term brings it."""
    from alaya_flash.model_zoo.codecs import tiny
    from alaya_flash.model_zoo.loading import load_strict, read_state_dict
    from alaya_flash.model_zoo.training.codecs import chroma_loss
    from alaya_flash.model_zoo.training.data import ClipSet

    renders = read_state_dict(runs / "decoder" / "renders.safetensors")["renders"]
    gt = torch.from_numpy(ClipSet(runs / "data", "train").rgb[:, :, :9]).float().div(255).permute(0, 1, 2, 5, 3, 4)

    def train(weight: float) -> float:
        out = tmp_path / f"dec-{weight}"
        out.mkdir()
        (out / "renders.safetensors").symlink_to(runs / "decoder" / "renders.safetensors")
        conf = {"out": str(out), "student_run": str(runs / "rollout"), "codecs_run": str(runs / "codecs"),
                "latents": str(runs / "rollout" / "latents-train.safetensors"), "crop": 16, "window_frames": 2,
                "sink_frames": 1, "batch": 2, "lr": 3e-3, "steps": 30, "log_every": 30, "ckpt_every": 30,
                "chroma_weight": weight}
        assert main(["--quiet", "train", "decoder", "--config", write(tmp_path / f"{weight}.json", conf)]) == 0
        if weight:
            assert " chroma=" in (out / "train.log").read_text()
        codec = tiny.build(tiny.CONFIGS["taew-slim"]).eval()
        load_strict(codec, common.final_weights(out, "tiny"))
        with torch.no_grad():
            frames = torch.stack([codec.decode(renders[:, q])[:, :9] for q in range(renders.shape[1])], 1)
        return float(chroma_loss(frames, gt, dim=3))

    assert train(8.0) < train(0.0)


@pytest.mark.parametrize("bad, message", [({"crop": 12}, "crop 12 must be a positive multiple of 8"),
                                          ({"motion_weight": -1.0}, "must be >= 0"),
                                          ({"chroma_weight": -1.0}, "chroma_weight -1.0 must be >= 0"),
                                          ({"pair_weight": -1.0}, "pair_weight -1.0 must be >= 0"),
                                          ({"pair_weight": 1.0, "batch": 3}, "batch 3 even")])
def test_bad_decoder_config_is_refused(bad, message, tmp_path, capsys):
    assert main(["train", "decoder", "--config", write(tmp_path / "bad.json", bad)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [({"frames": 8}, "frames 8 must be 4k + 1"),
                                          ({"window_frames": 0}, "window_frames 0 must hold a chunk"),
                                          ({"pair_weight": -1.0}, "pair_weight -1.0 must be >= 0"),
                                          ({"pair_weight": 1.0, "batch": 3}, "batch 3 even")])
def test_bad_rollout_config_is_refused(bad, message, tmp_path, capsys):
    assert main(["train", "student-rollout", "--config", write(tmp_path / "bad.json", bad)]) == 2
    assert message in capsys.readouterr().err


def test_dmd_gradient_is_the_score_difference():
    """0.5 * MSE(x, sg(x - g)) has gradient g / numel with respect to x (Self-Forcing's trick)."""
    import torch.nn.functional as F

    x = torch.randn(2, 3, 4, requires_grad=True)
    g = torch.randn(2, 3, 4)
    (0.5 * F.mse_loss(x.double(), (x.double() - g.double()).detach())).backward()
    torch.testing.assert_close(x.grad, (g / x.numel()).float())


def test_text_noise_moves_kept_prompts_to_a_shell_and_leaves_dropped_ones(runs):
    """perturb_prompts keeps unit norm and moves a prompt by about `noise` (cosine 1/sqrt(1 + noise^2));
    LatentSet.sample perturbs the kept prompts only: a dropped one stays the exact CFG negative."""
    from alaya_flash.model_zoo.training.latent_data import LatentSet, perturb_prompts

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


def test_clean_context_makes_a_clean_prefix_and_keeps_the_last_chunk_noisy():
    """chunk_knots: with clean_context 0 no chunk is clean; with 1 every sample has a clean prefix of
    1 .. chunks-1 whole chunks (the KV cache's view of the past) followed only by noisy chunks."""
    from alaya_flash.model_zoo.training.student import chunk_knots

    g = torch.Generator().manual_seed(0)
    assert not (chunk_knots(g, 64, 6, 2, 4, 0.0) == 4).any()
    pick = chunk_knots(g, 256, 7, 2, 4, 1.0)  # 4 chunks, the last one a single frame
    assert pick.shape == (256, 7)
    clean = pick == 4
    lengths = clean.sum(1)
    assert torch.equal(clean, torch.arange(7)[None] < lengths[:, None])  # a prefix ...
    assert set(lengths.tolist()) == {2, 4, 6}  # ... of whole chunks, 1 to 3 of the 4
    assert torch.equal(pick[:, 0:6:2], pick[:, 1:6:2])  # one knot per chunk
    share = (chunk_knots(g, 4000, 3, 1, 4, 0.25) == 4).any(1).float().mean()
    assert 0.2 < share < 0.3


def test_teacher_trajectory_keeps_the_student_sigmas(monkeypatch):
    """ODE pairs: the stored states are the Euler states at sigma 1, .9375, .8333, .625, then x0
    (compared in float32, as in the rollout test)."""
    import contextlib

    from alaya_flash.model_zoo import dit
    from alaya_flash.model_zoo.training import student

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    from alaya_flash.model_zoo.training.student import teacher_trajectory
    from alaya_flash.streaming import sampler

    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    noise, cond = torch.randn(1, 16, 1, 4, 4), torch.randn(1, 80, 1, 4, 4)
    prompt, neg = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    traj = teacher_trajectory(model, noise, cond, prompt, neg, steps=8, cfg_scale=2.0)
    assert traj.shape == (1, 5, 16, 1, 4, 4)
    assert torch.equal(traj[:, 0], noise)

    def velocity(x, s):
        inp, t = torch.cat([x, cond], 1), torch.full((1,), 1000 * s)
        return sampler.cfg_combine(model(inp, t, prompt), model(inp, t, neg), 2.0)

    with torch.no_grad():
        x0 = sampler.sample_euler(velocity, noise, sampler.teacher_sigmas(8, 5.0))
    torch.testing.assert_close(traj[:, -1], x0, atol=1e-5, rtol=1e-4)


def test_learning_rate_schedule_warms_up_holds_and_decays():
    from alaya_flash.model_zoo.training.common import StageConfig, lr_scale

    cfg = StageConfig(steps=100, warmup=10, decay_steps=20)
    got = [lr_scale(cfg, i) for i in range(100)]
    assert got[0] == pytest.approx(0.1) and got[9] == 1.0 and got[50] == 1.0
    assert got[80] == 1.0 and got[81] < 1.0 and got[99] == pytest.approx(0.05 + 0.95 / 20)
    assert all(a >= b for a, b in zip(got[50:], got[51:]))  # never rises after warmup
    assert lr_scale(StageConfig(steps=100), 99) == 1.0  # no schedule: constant


def test_trajectories_of_an_earlier_teacher_are_made_again(runs, tmp_path):
    """The ODE pairs are cached in the student's folder; a teacher resumed since (or other wordings)
    makes them stale, so they are generated again rather than silently reused."""
    import logging
    import shutil

    from alaya_flash.model_zoo.loading import read_metadata
    from alaya_flash.model_zoo.training.latent_data import LatentSet
    from alaya_flash.model_zoo.training.student import ODEStageConfig, make_trajectories
    from alaya_flash.model_zoo.training.teacher import load_dit

    shutil.copytree(runs / "teacher", tmp_path / "teacher")
    cfg = ODEStageConfig(out=str(tmp_path / "o"), teacher_run=str(tmp_path / "teacher"), pairs=2, ode_steps=4)
    data = LatentSet(tmp_path / "teacher" / "latents-train.safetensors")
    log = logging.getLogger("test-trajectories")
    path = tmp_path / "o" / "trajectories.safetensors"
    first = make_trajectories(cfg, load_dit(cfg.teacher_run), data, log)["states"]
    made = path.stat().st_mtime_ns
    assert torch.equal(make_trajectories(cfg, load_dit(cfg.teacher_run), data, log)["states"], first)
    assert path.stat().st_mtime_ns == made  # same teacher, same recipe: read back
    teacher = {**TINY_DIT, "out": str(tmp_path / "teacher"), "data": str(runs / "data"), "vae_run": str(runs / "vae"),
               "cond_encoder": "vae", "frames": 9, "steps": 5, "batch": 2, "ckpt_every": 5, "lr": 1e-2}
    assert main(["--quiet", "train", "teacher", "--config", write(tmp_path / "t.json", teacher)]) == 0
    again = make_trajectories(cfg, load_dit(cfg.teacher_run), data, log)["states"]
    assert json.loads(read_metadata(path)["recipe"])["teacher_step"] == 5
    assert not torch.equal(again, first)


def test_train_default_script_runs_valid_configs_in_increasing_phases():
    """Every `train` call of the recipe script loads (its --set keys exist, with the right types, and
    pass validation), and a stage's phases raise `steps` each time: a phase that does not would
    resume, find its checkpoint already there, and silently train nothing."""
    import re
    import shlex
    from pathlib import Path

    from alaya_flash.model_zoo.training import stage
    from alaya_flash.streaming.commands.train import parse_overrides

    root = Path(__file__).resolve().parents[1]
    script = (root / "model_zoo/training/train_default.sh").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r'^(\w+)="([^"]*)"$', script, flags=re.M))
    calls = re.findall(r"\$AF --quiet train (\S+) (--config \$C/\S+(?: --set \S+| \$\w+)*)", script)
    assert len(calls) >= 10  # data, 4 vae phases, cache, 4 codecs phases, teacher, students, exports
    steps: dict[str, list[int]] = {}
    for name, args in calls:
        args = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), args)
        words = shlex.split(args.replace("$C/", str(root / "model_zoo/training/configs") + "/"))
        config, overrides = words[1], {}
        for key, value in zip(words[2::2], words[3::2]):
            assert key == "--set", args
            overrides.update(parse_overrides([value]))
        cls, _ = stage(name)
        cfg = common.load_config(config, cls, overrides)
        if hasattr(cfg, "steps") and name != "export":
            steps.setdefault(f"{name}:{cfg.out}", []).append(cfg.steps)
    for run, phases in steps.items():
        assert phases == sorted(set(phases)), f"{run}: phases' steps {phases} do not increase"
    assert steps["codecs:runs/codecs"] == [2000, 2600, 4200, 4800]
    assert steps["vae:runs/vae"] == [2800, 3600, 8000, 16000]


def test_codec_quality_script_reports_the_control_ceiling(runs, capsys):
    """scripts/codec_quality.py: each decoder's round trip of every preset is scored for the eval's
    nearest-preset control, with a rate per clip and preset and its smallest margin."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "codec_quality.py"
    spec = importlib.util.spec_from_file_location("codec_quality", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--data", str(runs / "data"), "--vae", str(runs / "vae"), "--codecs", str(runs / "codecs"),
                        "--clips", "1", "--frames", "9"]) == 0
    report = json.loads(capsys.readouterr().out)
    for name in ("vae_roundtrip", "tiny_decoder_on_vae_latents"):
        assert report[f"{name}_nearest_rate"] in (0.0, 0.5, 1.0)  # 1 clip x 2 presets
        assert report[f"{name}_min_margin_db"] <= report[f"{name}_margin_db"]
        assert (report[f"{name}_nearest_rate"] == 1.0) == (report[f"{name}_min_margin_db"] > 0)


def test_mirrored_refiner_crops_turn_the_normals_with_the_image():
    from alaya_flash.model_zoo.codecs.refiner import gbuffer_planes
    from alaya_flash.model_zoo.training.refiner import _mirrored

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


def test_sun_side_script_scores_the_blend_and_the_wrong_side(capsys):
    """scripts/sun_side.py: on a new scene the blend of four sun azimuths is nearer bright_sunny's
    ground truth than the sun turned to the other side is; the turned sun is nearer overcast's."""
    script = _script("sun_side")
    assert script.main(["--seeds", "100000", "--size", "48", "--frames", "5", "--stride", "2"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["blend"]["psnr_sunny_db"] > report["turned"]["psnr_sunny_db"]
    assert report["turned"]["nearest_sunny"] is False and report["turned"]["margin_db"] < 0


def _script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_refiners_gives_evals_figures_from_frames_rendered_once(runs, tmp_path, capsys):
    """scripts/compare_refiners.py: a model folder's own refiner, and none, score what `alaya-flash
    eval` reports with and without it; a second call reads the cached frames; a refiner run scores."""
    script = _script("compare_refiners")
    model, data = str(runs / "model"), str(runs / "data")
    common_args = ["--clips", "1", "--presets", "bright_sunny,moonlit_night", "--precision", "fp32"]
    reports = {}
    for flag in ([], ["--no-refiner"]):
        assert main(["--quiet", "eval", "--model", model, "--data", data, "--no-teacher", "--runtime-frames", "5",
                     "--runtime-size", "32", "--heldout-wordings", "1", "--json", *common_args, *flag]) == 0
        reports[bool(flag)] = json.loads(capsys.readouterr().out)["student"]
    cache = tmp_path / "frames.safetensors"
    args = [model, "none", str(runs / "refiner"), "--model", model, "--data", data, "--cache", str(cache), *common_args]
    for call in range(2):
        assert script.main(args) == 0
        captured = capsys.readouterr()
        assert ("rendered clip 1/1" in captured.err) == (call == 0)  # the second call reads the cache
        own, plain, run = [json.loads(line) for line in captured.out.splitlines()]
        for got, report in ((own, reports[False]), (plain, reports[True])):
            assert got["content"]["psnr_db"] == pytest.approx(report["content"]["psnr_db"], abs=1e-4)
            assert got["content"]["ssim"] == pytest.approx(report["content"]["ssim"], abs=1e-5)
            for kind in ("train_wordings", "heldout_wordings"):
                assert got["control"][kind]["nearest_rate"] == report["control"][kind]["nearest_rate"]
                assert got["control"][kind]["margin_db"] == pytest.approx(report["control"][kind]["margin_db"], abs=1e-4)
        assert run["candidate"] == str(runs / "refiner") and run["content"]["psnr_db"] > 0
    assert script.main([str(tmp_path), "--model", model, "--data", data, *common_args]) == 1
    assert f"compare_refiners: {tmp_path}: no checkpoint here; run `alaya-flash train refiner` first" in capsys.readouterr().err
    assert script.main([model, "--model", model, "--data", data, "--cache", str(tmp_path / "frames.pt"), *common_args]) == 1
    assert "--cache " + str(tmp_path / "frames.pt") + ": frames are kept in a .safetensors file" in capsys.readouterr().err


def _text_anchor(runs, tmp_path, name, **over):
    cfg = {"out": str(tmp_path / name), "data": str(runs / "data"), "student_run": str(runs / "rollout"),
           "refiner_run": str(runs / "refiner"), "steps": 40, "log_every": 20, "ckpt_every": 20, "threads": 1, **over}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / f"{name}.json", cfg)]) == 0
    return tmp_path / name


def test_text_anchor_refits_only_the_prompt_mlps_and_exports(runs, tmp_path):
    """text-anchor changes the student's text_embedding and the refiner's prompt MLP and nothing else;
    export reads its run as student_run and refiner_run, and the model folder loads."""
    from alaya_flash.model_zoo import bundle

    out = _text_anchor(runs, tmp_path, "anchor")
    assert "the extra wordings after: DiT margin" in (out / "train.log").read_text()
    for net, source, text in (("dit", runs / "rollout", "text_embedding."), ("refiner", runs / "refiner", "text.")):
        new, old = common.final_weights(out, net), common.final_weights(source, net)
        assert new.keys() == old.keys()
        changed = {k for k in new if not torch.equal(new[k], old[k].float())}
        assert changed and all(k.startswith(text) for k in changed), (net, changed)
    model = tmp_path / "model"
    cfg = {"out": str(model), "student_run": str(out), "teacher_run": str(runs / "teacher"), "codecs_run": str(runs / "codecs"),
           "vae_run": str(runs / "vae"), "refiner_run": str(out), "trained_size": [32, 32], "teacher_window_frames": 9}
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", cfg)]) == 0
    flash = bundle.load_flash(model, dtype=torch.float32)
    assert torch.equal(flash.dit.text_embedding[0].weight, common.final_weights(out, "dit")["text_embedding.0.weight"].bfloat16().float())
    assert flash.settings.chunk_frames == 1  # the student run's, carried through the anchor run


def test_text_anchor_pulls_new_wordings_onto_their_presets_mean(runs, tmp_path):
    """After the stage, the extra wordings' DiT offsets lie nearer their preset's target (the source's mean
    over the preset's training wordings) than the other presets' by a wider margin, the refiner's frames
    for them nearer its target frames, and the empty prompt keeps the DiT's offsets."""
    import logging

    from alaya_flash.model_zoo.training.refiner import load_run
    from alaya_flash.model_zoo.training.teacher import load_dit
    from alaya_flash.model_zoo.training.text_anchor import (Anchor, RefinerAnchor, TextAnchorConfig, _embeddings,
                                                            _wordings, dit_text_response)

    from alaya_flash.model_zoo.loading import read_metadata, read_state_dict, save_safetensors

    # the fixture's refiner trained 2 steps from the identity (zero tail and FiLM): random weights give
    # the prompt a say in its frames first
    ckpt = common.latest_checkpoint(runs / "refiner")
    state = read_state_dict(ckpt)
    g = torch.Generator().manual_seed(0)
    for key in [k for k in state if k.startswith("refiner.")]:
        state[key] = 0.3 * torch.randn(state[key].shape, generator=g)
    (tmp_path / "strong").mkdir()
    save_safetensors(state, tmp_path / "strong" / ckpt.name, read_metadata(ckpt))  # its config still finds the renders
    # and the tiny student's text path, barely trained, a say in its offsets
    ckpt = common.latest_checkpoint(runs / "rollout")
    state = read_state_dict(ckpt)
    for key in [k for k in state if k.startswith("dit.text_embedding.") or (k.startswith("dit.") and ".cross_attn." in k)]:
        state[key] = 0.3 * torch.randn(state[key].shape, generator=g)
    (tmp_path / "student").mkdir()
    save_safetensors(state, tmp_path / "student" / ckpt.name, read_metadata(ckpt))
    out = _text_anchor(runs, tmp_path, "anchor", student_run=str(tmp_path / "student"),
                       refiner_run=str(tmp_path / "strong"), steps=150, log_every=50,
                       ckpt_every=150, text_noise=0.5, refiner_text_noise=0.0, lr=3e-3, crop=16)
    assert "the extra wordings after: DiT margin" in (out / "train.log").read_text()
    cfg = TextAnchorConfig(data=str(runs / "data"), student_run=str(tmp_path / "student"),
                           refiner_run=str(tmp_path / "strong"), crop=16)
    presets, train, extra = _wordings(cfg)
    train, extra, empty = [_embeddings(w) for w in train], [_embeddings(w) for w in extra], _embeddings([""])
    dit_before, dit_after = load_dit(tmp_path / "student"), load_dit(out)
    anchor = Anchor(dit_before, train, extra, empty)
    # anchored exactly, a wording lies on its preset's mean: its margin is the distance between the 2 means
    apart = float((anchor.means[0] - anchor.means[1]).norm())
    assert anchor.margin(dit_after, extra) > max(anchor.margin(dit_before, extra), 0.5 * apart)
    with torch.no_grad():
        moved = (dit_text_response(dit_after, empty) - dit_text_response(dit_before, empty)).norm()
        assert moved < 0.2 * dit_text_response(dit_before, empty).norm()
    ref_before, ref_after = load_run(tmp_path / "strong")[0], load_run(out)[0]
    ref = RefinerAnchor(cfg, ref_before, ref_before, train, extra, empty, presets, logging.getLogger("test"))
    assert ref.gap(ref_after, extra) < 0.7 * ref.gap(ref_before, extra)


def test_dit_text_response_is_what_cross_attention_adds_for_a_one_token_prompt():
    from alaya_flash.model_zoo import dit as dit_mod
    from alaya_flash.model_zoo.training.text_anchor import dit_text_response

    torch.manual_seed(0)
    model = dit_mod.build(dit_mod.CONFIGS["dit-tiny"]).eval()
    prompt = torch.nn.functional.normalize(torch.randn(2, model.config.text_dim), dim=-1)
    with torch.no_grad():
        want = dit_text_response(model, prompt).unflatten(-1, (len(model.blocks), -1))
        context = model.text_embedding(prompt[:, None])
        for b, block in enumerate(model.blocks):
            k, v = block.cross_attn.prompt_kv(context)
            tokens = torch.randn(2, 7, model.config.dim)  # any query: one key takes all the attention
            got = block.cross_attn(tokens, k, v)
            assert torch.allclose(got, want[:, None, b].expand_as(got), atol=1e-5), b


def test_text_anchor_resumes_as_one_run(runs, tmp_path):
    once = _text_anchor(runs, tmp_path, "once", refiner_run="", steps=40)
    twice = _text_anchor(runs, tmp_path, "twice", refiner_run="", steps=20)
    _text_anchor(runs, tmp_path, "twice", refiner_run="", steps=40)
    assert "resumed from ckpt-000020" in (twice / "train.log").read_text()
    one, two = common.final_weights(once, "dit"), common.final_weights(twice, "dit")
    for k in one:
        assert torch.equal(one[k], two[k]), k


@pytest.mark.parametrize("bad, message", [
    ({"extra_split": "heldout"}, "extra_split 'heldout' would train on the paraphrases eval holds out"),
    ({"extra_split": "fresh"}, "extra_split 'fresh' is unknown"),
    ({"extra_split": "refiner,heldout"}, "extra_split 'heldout' would train on the paraphrases eval holds out"),
    ({"text_noise": -1.0}, "text_noise -1.0 and refiner_text_noise 0.5 must be >= 0"),
    ({"prompt_dropout": 2.0}, "prompt_dropout 2.0 is not in [0, 1]"),
])
def test_bad_text_anchor_config_is_refused(bad, message, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "a"), "refiner_run": "", **bad}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / "a.json", cfg)]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("key", ["student_run", "refiner_run"])
def test_text_anchor_refuses_a_run_without_checkpoints(key, runs, tmp_path, capsys):
    cfg = {"out": str(tmp_path / "a"), "data": str(runs / "data"), "student_run": str(runs / "rollout"),
           "refiner_run": str(runs / "refiner"), key: str(tmp_path / "nowhere")}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / "a.json", cfg)]) != 0
    assert f"{key} {tmp_path / 'nowhere'} holds no checkpoint" in capsys.readouterr().err
    assert not list((tmp_path / "a").glob("ckpt-*"))


def test_text_anchor_refuses_a_refiner_that_reads_no_prompt(runs, tmp_path, capsys):
    plain = tmp_path / "plain"
    cfg = {"out": str(plain), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 1, "crop": 16,
           "steps": 1, "precision": "fp32", "config": "gbuffer-refiner-16"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "r.json", cfg)]) == 0
    cfg = {"out": str(tmp_path / "a"), "data": str(runs / "data"), "student_run": str(runs / "rollout"),
           "refiner_run": str(plain), "steps": 1}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / "a.json", cfg)]) != 0
    assert "reads no prompt; leave refiner_run empty" in capsys.readouterr().err


def test_text_anchor_without_extra_wordings_anchors_the_training_ones(runs, tmp_path):
    out = _text_anchor(runs, tmp_path, "plain", refiner_run="", extra_split="", steps=2, ckpt_every=2)
    log = (out / "train.log").read_text()
    assert "16 training and 0 extra wordings (splits: none)" in log and "the training wordings after: DiT margin" in log
    assert "nan" not in log
