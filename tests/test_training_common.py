"""Training recipe end to end: a smoke run of every stage (tiny sizes, a few steps) through
`alaya-flash train` writes checkpoints and logs; resume equivalence, export and import, the
learning-rate schedule, config checking and the recipe script train_default.sh."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import TINY_DIT, write


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


def test_export_loads_with_the_bundle_loaders(runs):
    from alaya_flash.model_zoo import bundle

    flash = bundle.load_flash_folder(runs / "model", dtype=torch.float32)
    teacher = bundle.load_teacher(runs / "model" / "teacher", dtype=torch.float32)
    assert flash.settings.chunk_frames == 1
    student = common.final_weights(runs / "dmd", "dit")
    for k, v in flash.dit.state_dict().items():  # bf16 export of the trained student
        assert torch.equal(v, student[k].to(torch.bfloat16).float()), k
    assert teacher.dit.config == flash.dit.config
    assert (teacher.settings.cfg, teacher.settings.window_frames) == (3.0, 9)  # the export config's


def test_export_blends_a_second_students_weights_in(runs, tmp_path, capsys):
    """blend_run: the shipped DiT is (1 - blend_weight) * student_run's + blend_weight * blend_run's;
    a weight outside (0, 1), a student of another shape and one of another chunk size are refused in one line."""
    from alaya_flash.model_zoo import bundle
    from training_helpers import rollout_config

    base = {"student_run": str(runs / "dmd"), "teacher_run": str(runs / "teacher"), "codecs_run": str(runs / "codecs"),
            "vae_run": str(runs / "vae"), "trained_size": [32, 32], "dtype": "float32"}
    out = tmp_path / "blend"
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", {
        **base, "out": str(out), "blend_run": str(runs / "rollout"), "blend_weight": 0.25})]) == 0
    mine, theirs = common.final_weights(runs / "dmd", "dit"), common.final_weights(runs / "rollout", "dit")
    blended = bundle.load_flash_folder(out, dtype=torch.float32).dit.state_dict()
    assert blended.keys() == mine.keys()
    assert any(not torch.equal(mine[k], theirs[k]) for k in mine)  # two different students
    for k, v in blended.items():
        assert torch.allclose(v, 0.75 * mine[k].float() + 0.25 * theirs[k].float(), atol=1e-6), k

    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "w.json", {
        **base, "out": str(tmp_path / "w"), "blend_run": str(runs / "rollout"), "blend_weight": 1.0})]) != 0
    assert "blend_weight 1.0 is not in (0, 1)" in capsys.readouterr().err
    grown = tmp_path / "grown"  # the same student with a third block
    assert main(["--quiet", "train", "student-rollout", "--config",
                 write(tmp_path / "g.json", rollout_config(runs, grown, steps=1, layers=3))]) == 0
    capsys.readouterr()
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "g2.json", {
        **base, "out": str(tmp_path / "g2"), "blend_run": str(grown)})]) != 0
    err = capsys.readouterr().err
    assert f"blend_run {grown}'s DiT is not student_run {runs / 'dmd'}'s: num_layers 3 against 2" in err
    assert not (tmp_path / "g2" / "dit.safetensors").exists()
    chunked = tmp_path / "chunked"  # the same DiT trained to stream 2 latent frames a chunk
    assert main(["--quiet", "train", "student-rollout", "--config",
                 write(tmp_path / "c.json", rollout_config(runs, chunked, steps=1, chunk_frames=2))]) == 0
    capsys.readouterr()
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "c2.json", {
        **base, "out": str(tmp_path / "c2"), "blend_run": str(chunked)})]) != 0
    assert f"blend_run {chunked} was trained with chunk_frames 2, student_run {runs / 'dmd'} with 1" \
        in capsys.readouterr().err


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
    from alaya_flash.training.latent_data import checkpoint_step
    assert checkpoint_step(imp / "student") == 0
    rollout = {"out": str(tmp_path / "r"), "student_run": str(imp / "student"), "data": str(runs / "data"),
               "vae_run": str(imp / "vae"), "codecs_run": str(imp / "codecs"), "frames": 9, "window_frames": 2,
               "sink_frames": 1, "steps": 1, "batch": 2, "ckpt_every": 1}
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "r.json", rollout)]) == 0


def test_import_refuses_a_folder_that_is_not_a_model_and_an_out_holding_another(runs, tmp_path, capsys):
    cfg = write(tmp_path / "i.json", {"model": str(tmp_path / "nothing"), "out": str(tmp_path / "imp")})
    assert main(["--quiet", "train", "import", "--config", cfg]) != 0
    assert f"import: {tmp_path / 'nothing'} is not a model folder (no config.json)" in capsys.readouterr().err
    cfg = write(tmp_path / "j.json", {"model": str(runs / "model"), "out": str(tmp_path / "imp")})
    assert main(["--quiet", "train", "import", "--config", cfg]) == 0
    written = {p: p.stat().st_mtime_ns for p in (tmp_path / "imp").rglob("*.safetensors")}
    assert main(["--quiet", "train", "import", "--config", cfg]) == 0  # the same model again: nothing to do
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "imp").rglob("*.safetensors")} == written
    import shutil

    other = shutil.copytree(runs / "model", tmp_path / "other")
    (other / "config.json").write_text((other / "config.json").read_text() + "\n")  # another model's files
    cfg = write(tmp_path / "k.json", {"model": str(other), "out": str(tmp_path / "imp")})
    assert main(["--quiet", "train", "import", "--config", cfg]) != 0
    assert "already there, from another model or an older import; import into an empty folder (out)" \
        in capsys.readouterr().err


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


def test_a_truncated_latest_checkpoint_falls_back_to_the_one_before(runs, tmp_path):
    """A run killed while its disk filled leaves a truncated newest checkpoint: resume sets it aside
    with a warning and continues from the previous one, and the result equals an uninterrupted run."""
    cfg = {**TINY_DIT, "data": str(runs / "data"), "vae_run": str(runs / "vae"), "codecs_run": str(runs / "codecs"),
           "cond_encoder": "vae", "frames": 9, "batch": 2, "log_every": 1, "ckpt_every": 1}
    for name in ("once", "broken"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "latents-train.safetensors").symlink_to(runs / "teacher" / "latents-train.safetensors")
    assert main(["--quiet", "train", "teacher", "--config", write(tmp_path / "a.json", {**cfg, "out": str(tmp_path / "once"), "steps": 4})]) == 0
    b = write(tmp_path / "b.json", {**cfg, "out": str(tmp_path / "broken")})
    assert main(["--quiet", "train", "teacher", "--config", b, "--set", "steps=3"]) == 0
    newest = tmp_path / "broken" / "ckpt-000003.safetensors"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    assert main(["--quiet", "train", "teacher", "--config", b, "--set", "steps=4"]) == 0
    log = (tmp_path / "broken" / "train.log").read_text()
    assert "ckpt-000003.safetensors: cannot be read back" in log and "resumed from ckpt-000002" in log
    assert (tmp_path / "broken" / "ckpt-000003.safetensors.damaged").exists()
    one, two = common.final_weights(tmp_path / "once", "dit"), common.final_weights(tmp_path / "broken", "dit")
    for k in one:
        assert torch.equal(one[k], two[k]), k


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


def test_learning_rate_schedule_warms_up_holds_and_decays():
    from alaya_flash.training.common import StageConfig, lr_scale

    cfg = StageConfig(steps=100, warmup=10, decay_steps=20)
    got = [lr_scale(cfg, i) for i in range(100)]
    assert got[0] == pytest.approx(0.1) and got[9] == 1.0 and got[50] == 1.0
    assert got[80] == 1.0 and got[81] < 1.0 and got[99] == pytest.approx(0.05 + 0.95 / 20)
    assert all(a >= b for a, b in zip(got[50:], got[51:]))  # never rises after warmup
    assert lr_scale(StageConfig(steps=100), 99) == 1.0  # no schedule: constant


def _recipe_calls(script_name: str) -> list[tuple[str, object]]:
    """Every `train` call of a recipe script, loaded: (stage, its validated config). Its --set keys
    must exist, with the right types, and pass validation; shell variables take their defaults."""
    import re
    import shlex
    from pathlib import Path

    from alaya_flash.training import stage
    from alaya_flash.streaming.cli.commands.train import parse_overrides

    root = Path(__file__).resolve().parents[1]
    script = re.sub(r"\s*\\\n\s*", " ", (root / "training" / script_name).read_text())  # continued lines
    script = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", script)  # ${X:-default} -> default
    variables: dict[str, str] = {}
    for name, value in re.findall(r'^(\w+)="([^"]*)"$', script, flags=re.M):  # in order: S="$S ..." grows S
        variables[name] = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), value)
    calls = re.findall(r"\$AF --quiet train (\S+) (--config \$C/\S+(?: --set \S+| \$\w+)*)", script)
    out = []
    for name, args in calls:
        args = re.sub(r"\$(\w+)", lambda m: variables.get(m.group(1), m.group(0)), args)
        words = shlex.split(args.replace("$C/", str(root / "training/configs") + "/"))
        config, overrides = words[1], {}
        for key, value in zip(words[2::2], words[3::2]):
            assert key == "--set", args
            overrides.update(parse_overrides([value]))
        cls, _ = stage(name)
        out.append((name, common.load_config(config, cls, overrides)))
    return out


def test_train_default_script_runs_valid_configs_in_increasing_phases():
    """Every `train` call of the recipe script loads, and a stage's phases raise `steps` each time: a
    phase that does not would resume, find its checkpoint already there, and silently train nothing."""
    calls = _recipe_calls("train_default.sh")
    assert len(calls) >= 10  # data, 4 vae phases, cache, 4 codecs phases, teacher, students, exports
    steps: dict[str, list[int]] = {}
    for name, cfg in calls:
        if hasattr(cfg, "steps") and name != "export":
            steps.setdefault(f"{name}:{cfg.out}", []).append(cfg.steps)
    for run, phases in steps.items():
        assert phases == sorted(set(phases)), f"{run}: phases' steps {phases} do not increase"
    assert steps["codecs:runs/codecs"] == [2000, 2600, 4200, 4800]
    assert steps["vae:runs/vae"] == [2800, 3600, 8000, 16000]


def test_finetune_v2_script_chains_its_stages(tmp_path, monkeypatch):
    """finetune_v2.sh's calls load, and each stage reads what the one before it writes: world v2 data and
    the physics world's, the imported networks, each student's latents of both worlds and its decoder, a
    refiner of the 128x128 model's own, a finish of the student on 256x256 clips of both worlds (10 world v2 scenes,
    then 26), exported; then a blending light-reading refiner on that model's frames of 12 more scenes, into
    model_zoo/default."""
    monkeypatch.chdir(tmp_path)  # its paths are relative to the repository
    (tmp_path / "model_zoo").symlink_to(Path(__file__).resolve().parents[1] / "model_zoo")
    # the refiner stage checks that its model exists, which the export before it writes: a stand-in for it
    for model in ("m128-v2m4", "model-world-v2"):
        (tmp_path / "runs" / model).mkdir(parents=True)
        (tmp_path / "runs" / model / "config.json").write_text("{}")
    calls = _recipe_calls("finetune_v2.sh")
    assert [name for name, _ in calls] == ["data", "data", "data", "import", "student-rollout", "student-rollout",
                                           "decoder", "student-rollout", "decoder", "data", "student-rollout",
                                           "decoder", "export", "refiner", "data", "student-rollout",
                                           "student-rollout", "data", "student-rollout", "export", "data", "refiner",
                                           "export"]
    physics, physics_full, data, imported, first, second, decoder2, third, decoder3, data24, fourth, decoder4, export, \
        refiner, data256, finish, finish2, data256_more, finish3, shipped, data_light, light, default = \
        (cfg for _, cfg in calls)
    # the student and decoder train on 128x128 clips of both worlds, the refiner reads the physics world at 256x256
    assert physics.world == "physics" and (physics.width, physics.height) == (128, 128)
    assert physics_full.world == "physics" and (physics_full.width, physics_full.height) == (256, 256)
    assert data.world == data24.world == "pathtrace" and data.out == data24.out and (data.width, data.height) == (128, 128)
    assert data.train_clips < data24.train_clips and (data24.width, data24.heldout_clips) == (128, data.heldout_clips)
    students = (first, second, third, fourth)
    assert all(s.data == data.out and s.mix_data == physics.out and s.caption_rate == 0.5 for s in students)
    assert all(0 < s.mix_rate == decoder2.mix_rate < 0.5 for s in students)  # world v2 gets most steps
    assert first.student_run == f"{imported.out}/student"
    assert [s.student_run for s in students[1:]] == [s.out for s in students[:-1]]  # each continues the one before
    assert first.steps < second.steps and len({s.out for s in students}) == 4
    # each decoder refits the student before it from the last decoder, on that student's latents of both worlds
    for decoder, student, codecs in ((decoder2, second, f"{imported.out}/codecs"), (decoder3, third, decoder2.out),
                                     (decoder4, fourth, decoder3.out)):
        assert decoder.student_run == student.out and decoder.codecs_run == codecs
        assert decoder.latents == f"{student.out}/latents-train.safetensors"
        assert decoder.mix_latents == f"{student.out}/latents-mix.safetensors"
        assert (student.window_frames, student.sink_frames) == (decoder.window_frames, decoder.sink_frames) \
            == (export.window_frames, export.sink_frames)  # trained with the cache the exported sampler streams with
    assert export.student_run == fourth.out
    assert export.codecs_run == shipped.codecs_run == decoder4.out and export.refiner_run == ""
    # the refiner learns the exported model's own frames, with the context path and the captions, both worlds
    assert refiner.model == export.out and shipped.refiner_run == refiner.out
    assert refiner.config == "gbuffer-refiner-16-context" and refiner.caption_rate > 0 and refiner.target == "truth"
    assert (refiner.data, refiner.mix_data, refiner.mix_rate) == (data.out, physics_full.out, first.mix_rate)
    # the finish continues the last 128x128 student on world v2's clips at 256x256 with the physics world's 256x256
    # clips mixed in, in two runs, then on more scenes in a third (the held-out ones rendered too, for eval), and the
    # shipped model is the finished student with that decoder and refiner
    assert data256.world == data256_more.world == "pathtrace" and data256.out == data256_more.out != data.out
    assert (data256.width, data256.height) == (data256_more.width, data256_more.height) == (256, 256)
    assert data256.train_clips <= data24.train_clips < data256_more.train_clips and data256.heldout_clips == 0
    assert data256_more.heldout_clips > 0
    finishes = (finish, finish2, finish3)
    assert all(s.data == data256.out and s.mix_data == physics_full.out and s.caption_rate == 0.5 for s in finishes)
    assert [s.student_run for s in finishes] + [shipped.student_run] == [fourth.out] + [s.out for s in finishes]
    assert all((s.window_frames, s.sink_frames, s.mix_rate) == (fourth.window_frames, fourth.sink_frames, fourth.mix_rate)
               for s in finishes)
    assert finish.lr < fourth.lr and finish.steps < finish2.steps == finish3.steps and len({s.out for s in finishes}) == 3
    assert shipped.out == "runs/model-world-v2" and export.out != shipped.out
    # every training stage takes THREADS (default 1: a shared CPU), so THREADS=2 reaches all of them
    trained = [cfg for name, cfg in calls if name in ("student-rollout", "decoder", "refiner")]
    assert len(trained) == 12 and {cfg.threads for cfg in trained} == {1}
    # the light: 12 unseen world v2 scenes, and the blending refiner on the finished model's frames of them and of the
    # physics world's, beside the prior under the recorded light or (a share) the prompt's; shipped as the default
    assert data_light.world == "pathtrace" and data_light.out not in (data.out, data256.out)
    assert data_light.train_seed >= data256_more.train_clips and data_light.heldout_clips == 0
    assert light.model == shipped.out and (light.data, light.mix_data) == (data_light.out, physics_full.out)
    assert light.config == "gbuffer-refiner-16-mirror" and 0 < light.prompt_light_rate < 1 and light.caption_rate > 0
    assert 0 < light.shadow_pass_rate < 1  # a share of the world v2 crops shaded with their shadow pass
    assert default.refiner_run == light.out and default.out == "model_zoo/default"
    assert (default.student_run, default.codecs_run) == (shipped.student_run, shipped.codecs_run)


def test_light_student_script_chains_its_stages(tmp_path, monkeypatch):
    """light_student.sh's calls load and chain: the default imported, a student made to read the light on world
    v2's light scenes with the physics world mixed in, continued with the prior's columns at their own rate,
    exported, a refiner on that model's frames, and the two exported together."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model_zoo").symlink_to(Path(__file__).resolve().parents[1] / "model_zoo")
    (tmp_path / "runs" / "model-lit2").mkdir(parents=True)  # the refiner checks its model, which the export writes
    (tmp_path / "runs" / "model-lit2" / "config.json").write_text("{}")
    calls = _recipe_calls("light_student.sh")
    assert [name for name, _ in calls] == ["import", "student-rollout", "student-rollout", "export", "refiner", "export"]
    imported, first, second, export, refiner, final = (cfg for _, cfg in calls)
    assert first.reads_light and first.student_run == f"{imported.out}/student" and first.codecs_run == f"{imported.out}/codecs"
    assert second.student_run == first.out and second.light_lr > second.lr and not second.reads_light
    assert first.mix_data and first.data == second.data == refiner.data and 0 < first.prompt_light_rate < 1
    assert export.student_run == final.student_run == second.out and refiner.model == export.out
    assert final.refiner_run == refiner.out and final.out != export.out
