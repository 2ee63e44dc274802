"""The student stages (student-ode, student-dmd, student-rollout): the distillation pieces checked
against inference (rollout = KVCacheSampler, the teacher's trajectories, the DMD gradient), the
data, pair and clean-context terms, cached trajectories, and config checking."""
from __future__ import annotations

import json
import re

import pytest
import torch

from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import TINY_DIT, write


def test_ode_data_term_pulls_the_student_towards_the_data(runs, tmp_path):
    """student-ode with data_weight > 0 regresses onto the ground-truth latents as well: after the
    same steps its one-step x0 from pure noise is closer to the data than pure ODE regression's."""
    from alaya_flash.training.latent_data import LatentSet
    from alaya_flash.training.teacher import load_dit

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


def test_student_trains_on_the_distilled_encoders_latents(runs):
    """Teacher on the VAE's G-buffer latents, student on the streaming encoder's, window for window."""
    from alaya_flash.model_zoo.codecs import gbuffer_encoder
    from alaya_flash.model_zoo.loading import load_strict
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.latent_data import LatentSet

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


def test_training_rollout_equals_the_inference_session(monkeypatch):
    """The DMD self-rollout (exit at the last step) renders exactly what KVCacheSampler streams
    (in float32: training's bf16 autocast, where it is on, is switched off for the comparison)."""
    import contextlib

    from alaya_flash.model_zoo import dit
    from alaya_flash.training import student
    from alaya_flash.training.student import rollout

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    from alaya_flash.streaming.render.kv_cache_sampler import KVCacheConfig, KVCacheSampler

    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    cond = torch.randn(1, 80, 4, 4, 4)
    prompt = torch.randn(1, 1, 16)
    with torch.no_grad():
        ours = rollout(model, cond, prompt, chunk_frames=2, exit_step=3, g=torch.Generator().manual_seed(5))
    sampler = KVCacheSampler(model, KVCacheConfig(window_frames=4, sink_frames=0))
    state = sampler.new_state(prompt, seed=5)
    theirs = torch.cat([sampler.step(state, cond[:, :, i:i + 2])[0] for i in (0, 2)], 2)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_finished_rollout_with_a_sink_equals_the_inference_session(monkeypatch):
    """student-rollout's rollout (every step run, the rolling cache with a sink, frames evicted)
    renders what KVCacheSampler streams, whichever step carries the gradient: the steps after it
    still run and the cache gets the chunk's final x0."""
    import contextlib

    from alaya_flash.model_zoo import dit
    from alaya_flash.training import student
    from alaya_flash.training.student import rollout
    from alaya_flash.streaming.render.kv_cache_sampler import KVCacheConfig, KVCacheSampler

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    cond = torch.randn(1, 80, 5, 4, 4)
    prompt = torch.randn(1, 1, 16)
    sampler = KVCacheSampler(model, KVCacheConfig(window_frames=2, sink_frames=1))
    state = sampler.new_state(prompt, seed=5)
    theirs = torch.cat([sampler.step(state, cond[:, :, i:i + 1])[0] for i in range(5)], 2)
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


def _stream_error(run, data) -> float:
    """The mean squared error of a student's finished rollout of every clip of a LatentSet under every
    preset (first training wording) against the clips' ground-truth latents."""
    from alaya_flash.training.student import rollout
    from alaya_flash.training.teacher import load_dit

    model = load_dit(run).eval()
    err = []
    with torch.no_grad():
        for p in range(len(data.presets)):
            prompt = data.embedding(p, "train", 0)[None].expand(len(data), -1, -1)
            x = rollout(model, data.cond, prompt, 1, 3, torch.Generator().manual_seed(1), 2, 1, finish=True)
            err.append(float((x - data.rgb[:, p]).pow(2).mean()))
    return sum(err) / len(err)


def test_rollout_stage_regresses_the_stream_onto_the_data(runs, tmp_path):
    """student-rollout lowers the error of the student's own streamed render against the ground
    truth (the loss it logs)."""
    from alaya_flash.training.latent_data import LatentSet
    from training_helpers import rollout_config

    data = LatentSet(runs / "rollout" / "latents-train.safetensors")
    assert data.rgb.shape[3] == 3 and data.cond.shape[1] == 80  # whole 9-frame clips, distilled conditioning
    out = tmp_path / "rollout"
    out.mkdir()
    (out / "latents-train.safetensors").symlink_to(runs / "rollout" / "latents-train.safetensors")
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "r.json", rollout_config(runs, out))]) == 0
    assert "encoded" not in (out / "train.log").read_text()  # the cached clips were reused
    assert _stream_error(out, data) < _stream_error(runs / "ode", data)


def test_rollout_with_a_mixed_in_world_keeps_that_world(mixed, tmp_path):
    """With mix_data / mix_rate half the steps take their batch from a second dataset (other clips under
    presets the first lacks), encoded beside the first: the student then streams that world nearer its
    ground truth than the same training on the first dataset alone leaves it."""
    from alaya_flash.training.latent_data import LatentSet
    from training_helpers import rollout_config

    mix = LatentSet(mixed / "mixed" / "latents-mix.safetensors")
    assert mix.presets == ["cyberpunk_neon", "snowy_winter", "underwater"] and len(mix) == 2
    drawn = [float(v) for v in re.findall(r" mix=([\d.]+)", (mixed / "mixed" / "train.log").read_text())]
    assert len(drawn) == 25 and set(drawn) == {0.0, 1.0}  # each step from one of the two datasets
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "latents-train.safetensors").symlink_to(mixed / "rollout" / "latents-train.safetensors")
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "a.json", rollout_config(mixed, alone))]) == 0
    assert _stream_error(mixed / "mixed", mix) < _stream_error(alone, mix)


def test_rollout_with_word_tokens_caches_them_and_exports_a_model_that_reads_them(runs, tmp_path, capsys):
    """text_encoder all-minilm-l6-v2+tokens: the rollout's cache holds each wording's sentence embedding
    then its word tokens (the sentence embedding equal to the default cache's), its checkpoints record
    the encoder, export writes it into config.json, the folder loads with it, and text-anchor (which
    fits one pooled token) refuses the run."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.loading import read_metadata
    from alaya_flash.model_zoo.text_encoder import CONTEXT_TOKENS
    from alaya_flash.training.latent_data import LatentSet
    from training_helpers import rollout_config

    out = tmp_path / "tokens"
    conf = rollout_config(runs, out, steps=2, ckpt_every=2, text_encoder=bundle.MINILM_TOKENS)
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "t.json", conf)]) == 0
    cache = out / "latents-train.safetensors"
    assert json.loads(read_metadata(cache)["recipe"])["text_encoder"] == bundle.MINILM_TOKENS
    words, pooled = LatentSet(cache), LatentSet(runs / "rollout" / "latents-train.safetensors")
    assert words.negative.shape == (1 + CONTEXT_TOKENS, 384) and pooled.negative.shape == (1, 384)
    assert torch.equal(words.embedding(0, "train", 0)[:1], pooled.embedding(0, "train", 0))
    assert common.run_text_encoder(out) == bundle.MINILM_TOKENS and common.run_text_encoder(runs / "rollout") == "all-minilm-l6-v2"
    export = {"out": str(tmp_path / "model"), "student_run": str(out), "teacher_run": str(runs / "teacher"),
              "codecs_run": str(runs / "codecs"), "vae_run": str(runs / "vae"), "trained_size": [32, 32],
              "teacher_window_frames": 9}
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", export)]) == 0
    assert json.loads((tmp_path / "model" / "config.json").read_text())["text_encoder"] == bundle.MINILM_TOKENS
    model = bundle.load_flash_folder(tmp_path / "model")
    assert model.text_encoder_name == bundle.MINILM_TOKENS
    assert model.text_encoder()(["a moonlit night"]).shape == (1, 1 + CONTEXT_TOKENS, 384)
    anchor = {"out": str(tmp_path / "anchor"), "data": str(runs / "data"), "student_run": str(out), "steps": 1}
    assert main(["train", "text-anchor", "--config", write(tmp_path / "a.json", anchor)]) == 2
    assert "fits one pooled token's cross-attention" in capsys.readouterr().err


def test_side_pairs_fit_the_change_the_sun_side_makes(runs, world_v2_data, tmp_path, capsys):
    """data's sun "opposite" renders the same world v2 clips (the same G-buffers) with the sun on the
    other side and captions naming it; student-rollout's side pairs then bring the change between a
    clip's renders under the two captions nearer the change between the two truths than the same
    training on the captions alone leaves it. Pairs from clips that are not the same are refused."""
    pytest.importorskip("mitsuba")
    from alaya_flash.training.data import ClipSet, build_dataset, dataset_meta
    from alaya_flash.training.latent_data import LatentSet
    from alaya_flash.training.student import rollout
    from alaya_flash.training.teacher import load_dit
    from alaya_flash.streaming.world.traced.presets import OPPOSITE_SIDE
    from training_helpers import rollout_config, world_v2_config

    frames = 5  # the session's world v2 clips (world_v2_config): 2 latent frames
    build_dataset(world_v2_config(tmp_path / "other", sun="opposite"))
    seeded, other = ClipSet(world_v2_data, "train"), ClipSet(tmp_path / "other", "train")
    assert (seeded.gbuffers == other.gbuffers).all() and not (seeded.rgb[:, 0] == other.rgb[:, 0]).all()
    sides = [[dataset_meta(d, "train")["clip_info"][c]["sun_side"] for c in seeded.meta["clips"]["train"]]
             for d in (world_v2_data, tmp_path / "other")]
    assert sides[1] == [OPPOSITE_SIDE[s] for s in sides[0]]
    assert seeded.captions[0][0] != other.captions[0][0] and seeded.captions[0][1] == other.captions[0][1]

    def train(name: str, **extra) -> float:
        conf = rollout_config(runs, tmp_path / name, data=str(world_v2_data), caption_rate=1.0, frames=frames, **extra)
        assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / f"{name}.json", conf)]) == 0
        a = LatentSet(tmp_path / name / "latents-train.safetensors")
        b = LatentSet(tmp_path / "paired" / "latents-side.safetensors")
        model = load_dit(tmp_path / name).eval()
        with torch.no_grad():
            x = [rollout(model, s.cond, s.captions[:, 0], 1, 3, torch.Generator().manual_seed(1), 2, 1, finish=True)
                 for s in (a, b)]
        return float(((x[0] - x[1]) - (a.rgb[:, 0] - b.rgb[:, 0])).pow(2).mean())

    paired = train("paired", side_data=str(tmp_path / "other"), side_rate=1.0, side_weight=4.0)
    assert " side=" in (tmp_path / "paired" / "train.log").read_text()
    assert paired < train("captions")
    bad = rollout_config(runs, tmp_path / "bad", data=str(world_v2_data), side_data=str(runs / "data"), side_rate=0.5,
                         frames=frames)
    assert main(["train", "student-rollout", "--config", write(tmp_path / "bad.json", bad)]) == 2
    assert "must be world v2 clips under data's presets" in capsys.readouterr().err


def test_nearest_presets_pick_the_other_preset_nearest_on_the_same_clip():
    from alaya_flash.training.latent_data import nearest_presets

    rgb = torch.zeros(2, 3, 1, 1, 1, 2)
    rgb[0, :, 0, 0, 0, 0] = torch.tensor([0.0, 1.0, 3.0])  # clip 0: 0-1 near, 2 nearest to 1
    rgb[1, :, 0, 0, 0, 0] = torch.tensor([0.0, 5.0, 0.5])  # clip 1: 0-2 near, 1 nearest to 2
    assert nearest_presets(rgb).tolist() == [[1, 0, 1], [2, 2, 0]]


def test_pairs_share_the_clip_and_take_the_nearest_preset(runs):
    from alaya_flash.training.latent_data import LatentSet, nearest_presets
    from alaya_flash.training.student import sample_pairs

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
    from alaya_flash.training.latent_data import LatentSet
    from alaya_flash.training.student import rollout
    from alaya_flash.training.teacher import load_dit

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


def test_grown_student_streams_exactly_what_it_did():
    """grow_blocks adds blocks that start as identities: the grown DiT streams the same latents as the
    one it grew from, bit for bit; its old blocks keep their order and weights, each new one copies
    the block before it except for its zeroed outputs; it only grows."""
    from alaya_flash.model_zoo import dit
    from alaya_flash.model_zoo.errors import AlayaError
    from alaya_flash.training.student import BLOCK_OUTPUTS, grow_blocks, rollout

    torch.manual_seed(0)
    model = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    grown = grow_blocks(model, 5).eval()
    assert grown.config.num_layers == 5
    cond, prompt = torch.randn(1, 80, 3, 4, 4), torch.randn(1, 1, 16)
    with torch.no_grad():
        ours, theirs = (rollout(m, cond, prompt, 1, 3, torch.Generator().manual_seed(2), 2, 1, finish=True)
                        for m in (model, grown))
    assert torch.equal(ours, theirs)
    # 3 new blocks over 2 old: after old block 0 one copy, after old block 1 two (j * 2 // 3 = 0, 0, 1)
    sources = [0, 0, 0, 1, 1]
    old = [model.blocks[i].state_dict() for i in range(2)]
    for b, src in enumerate(sources):
        new_block = b not in (0, 3)
        for name, value in grown.blocks[b].state_dict().items():
            want = torch.zeros_like(value) if new_block and name in BLOCK_OUTPUTS else old[src][name]
            assert torch.equal(value, want), (b, name)
    assert torch.equal(grow_blocks(model, 2).blocks[1].ffn[2].weight, model.blocks[1].ffn[2].weight)
    with pytest.raises(AlayaError, match="layers 1 is fewer than its 2 blocks"):
        grow_blocks(model, 1)


def test_rollout_with_more_layers_grows_the_student_and_trains_the_new_blocks(runs, tmp_path, capsys):
    """student-rollout's `layers` continues the student with more blocks: its checkpoints hold the grown
    DiT (the config records the count; export and the loader read it), the new blocks' outputs have
    moved from zero, and a count below the student's is refused in one line."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.training.teacher import load_dit
    from training_helpers import rollout_config

    out = tmp_path / "grown"
    conf = rollout_config(runs, out, steps=3, ckpt_every=3, layers=3)
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "g.json", conf)]) == 0
    assert "grew" in (out / "train.log").read_text()
    grown = load_dit(out)
    assert grown.config.num_layers == 3 and grown.blocks[1].ffn[2].weight.abs().sum() > 0
    export = {"out": str(tmp_path / "model"), "student_run": str(out), "teacher_run": str(runs / "teacher"),
              "codecs_run": str(runs / "codecs"), "vae_run": str(runs / "vae"), "trained_size": [32, 32],
              "teacher_window_frames": 9}
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", export)]) == 0
    assert len(bundle.load_flash_folder(tmp_path / "model").dit.blocks) == 3
    fewer = rollout_config(runs, tmp_path / "fewer", steps=1, layers=1)
    assert main(["train", "student-rollout", "--config", write(tmp_path / "f.json", fewer)]) == 2
    assert "layers 1 is fewer than its 2 blocks; blocks are only added" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [({"frames": 8}, "frames 8 must be 4k + 1"),
                                          ({"window_frames": 0}, "window_frames 0 must hold a chunk"),
                                          ({"pair_weight": -1.0}, "pair_weight -1.0 must be >= 0"),
                                          ({"pair_weight": 1.0, "batch": 3}, "batch 3 even"),
                                          ({"caption_rate": -0.1}, "caption_rate -0.1 must be between 0 and 1"),
                                          ({"caption_rate": 0.5, "pair_weight": 1.0}, "do not go together"),
                                          ({"mix_rate": 1.5, "mix_data": "x"}, "mix_rate 1.5 must be between 0 and 1"),
                                          ({"mix_rate": 0.5}, "go together (both or neither)"),
                                          ({"mix_data": "x"}, "go together (both or neither)"),
                                          ({"text_encoder": "umt5-xxl:/x"}, "text_encoder 'umt5-xxl:/x' is not one of"),
                                          ({"side_data": "x"}, "go together (both or neither)"),
                                          ({"side_data": "x", "side_rate": 0.5, "batch": 3}, "side pairs need an even batch"),
                                          ({"layers": -1}, "layers -1 must be 0 (the student's own) or a block count")])
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


def test_clean_context_makes_a_clean_prefix_and_keeps_the_last_chunk_noisy():
    """chunk_knots: with clean_context 0 no chunk is clean; with 1 every sample has a clean prefix of
    1 .. chunks-1 whole chunks (the KV cache's view of the past) followed only by noisy chunks."""
    from alaya_flash.training.student import chunk_knots

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
    from alaya_flash.training import student

    monkeypatch.setattr(student, "autocast", contextlib.nullcontext)
    from alaya_flash.training.student import teacher_trajectory
    from alaya_flash.streaming.render import sampler

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


def test_trajectories_of_an_earlier_teacher_are_made_again(runs, tmp_path):
    """The ODE pairs are cached in the student's folder; a teacher resumed since (or other wordings)
    makes them stale, so they are generated again rather than silently reused."""
    import logging
    import shutil

    from alaya_flash.model_zoo.loading import read_metadata
    from alaya_flash.training.latent_data import LatentSet
    from alaya_flash.training.student import ODEStageConfig, make_trajectories
    from alaya_flash.training.teacher import load_dit

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


def test_rollout_reads_the_light_and_exports_a_model_that_does(runs, tmp_path):
    """student-rollout with reads_light: the cache holds the passes' 80 channels once and the prior's 16 per
    (window, preset) under each way the light comes; the run's checkpoint holds its encoder; a run continued
    from it stays light-reading (light_lr moves the prior's input columns that many times as far); export ships
    that encoder, and the folder renders with a light."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.model_zoo.light import Light
    from alaya_flash.streaming.render import pipelines as pl
    from alaya_flash.streaming.render.lighting import LightSchedule
    from alaya_flash.streaming.values import PromptSchedule
    from alaya_flash.training.latent_data import LatentSet
    from alaya_flash.training.teacher import load_dit
    from stream_helpers import random_gbuffers, render_all
    from training_helpers import rollout_config

    out = tmp_path / "lit"
    conf = rollout_config(runs, out, steps=2, ckpt_every=2, reads_light=True, prompt_light_rate=0.5)
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "l.json", conf)]) == 0
    data = LatentSet(out / "latents-train.safetensors")
    plain = LatentSet(runs / "rollout" / "latents-train.safetensors")
    assert torch.equal(data.cond, plain.cond)  # the passes' branches are the codecs run's
    assert set(data.lit) == {"lit", "lit_prompt"}  # the physics fixture records no sun visibility
    assert data.lit["lit"].shape == (*plain.rgb.shape[:2], 16, *plain.cond.shape[2:])
    _, cond, _, _ = data.sample(torch.Generator().manual_seed(0), 2)
    assert cond.shape[1] == 96
    more = tmp_path / "more"
    conf = rollout_config(runs, more, student_run=str(out), steps=1, ckpt_every=1)
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "m.json", conf)]) == 0
    # light_lr: the prior's input columns move light_lr / lr times as far as at lr, the rest as far
    fast = tmp_path / "fast"
    conf = rollout_config(runs, fast, student_run=str(out), steps=1, ckpt_every=1, light_lr=10 * conf["lr"])
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "f.json", conf)]) == 0
    w0, w1, w10 = (load_dit(r).patch_embedding.weight for r in (out, more, fast))
    torch.testing.assert_close(w10[:, 96:] - w0[:, 96:], 10 * (w1[:, 96:] - w0[:, 96:]), rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(w10[:, :96], w1[:, :96])
    assert (w1[:, 96:] - w0[:, 96:]).abs().max() > 0
    export = {"out": str(tmp_path / "model"), "student_run": str(more), "teacher_run": str(runs / "teacher"),
              "codecs_run": str(runs / "codecs"), "vae_run": str(runs / "vae"), "trained_size": [32, 32],
              "teacher_window_frames": 9}
    assert main(["--quiet", "train", "export", "--config", write(tmp_path / "e.json", export)]) == 0
    model = bundle.load_flash_folder(tmp_path / "model")
    assert model.gbuffer_encoder.config.reads_light and model.dit.config.in_dim == 112
    sched = PromptSchedule.encode(model.text_encoder(), "a courtyard at noon")
    frames = render_all(pl.FlashPipeline(model, sched, lights=LightSchedule.constant(Light(sun_elevation=35.0))), [random_gbuffers(5, 32, 32)])
    assert frames.shape == (5, 32, 32, 3)
    conf = rollout_config(runs, tmp_path / "bad", reads_light=True, pair_weight=1.0)
    assert main(["--quiet", "train", "student-rollout", "--config", write(tmp_path / "b.json", conf)]) == 2
