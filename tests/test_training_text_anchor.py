"""The text-anchor stage: it refits only the prompt MLPs, pulls new wordings onto their preset's
mean, resumes as one run, exports, and refuses bad configs and runs."""
from __future__ import annotations

import pytest
import torch

from alaya_flash.training import common
from alaya_flash.streaming.cli import main
from training_helpers import write


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
    flash = bundle.load_flash_folder(model, dtype=torch.float32)
    assert torch.equal(flash.dit.text_embedding[0].weight, common.final_weights(out, "dit")["text_embedding.0.weight"].bfloat16().float())
    assert flash.settings.chunk_frames == 1  # the student run's, carried through the anchor run


def test_text_anchor_refits_both_prompt_mlps_of_a_context_refiner(runs, tmp_path):
    """A context refiner reads the prompt twice (its features' FiLM and the context path's): both MLPs
    are refitted, every other refiner weight stays the source's."""
    ref = {"out": str(tmp_path / "ctx"), "model": str(runs / "model"), "data": str(runs / "data"), "clips": 2,
           "crop": 16, "batch": 2, "steps": 2, "ckpt_every": 2, "log_every": 1, "precision": "fp32",
           "config": "gbuffer-refiner-16-context"}
    assert main(["--quiet", "train", "refiner", "--config", write(tmp_path / "ctx.json", ref)]) == 0
    out = _text_anchor(runs, tmp_path, "anchor", refiner_run=ref["out"], steps=4)
    new, old = common.final_weights(out, "refiner"), common.final_weights(tmp_path / "ctx", "refiner")
    assert new.keys() == old.keys()
    changed = {k for k in new if not torch.equal(new[k], old[k].float())}
    assert {k.split(".")[0] for k in changed} == {"text", "context_text"}, changed


def _with_a_strong_text_path(runs, folder, g: torch.Generator):
    """The fixture's rollout student with its text path (text_embedding and cross-attention) random, into
    folder: barely trained, the prompt would have little say in its offsets."""
    from alaya_flash.model_zoo.loading import read_metadata, read_state_dict, save_safetensors

    ckpt = common.latest_checkpoint(runs / "rollout")
    state = read_state_dict(ckpt)
    for key in [k for k in state if k.startswith("dit.text_embedding.") or (k.startswith("dit.") and ".cross_attn." in k)]:
        state[key] = 0.3 * torch.randn(state[key].shape, generator=g)
    folder.mkdir()
    save_safetensors(state, folder / ckpt.name, read_metadata(ckpt))


def test_text_anchor_pulls_new_wordings_onto_their_presets_mean(runs, tmp_path):
    """After the stage, the extra wordings' DiT offsets lie nearer their preset's target (the source's mean
    over the preset's training wordings) than the other presets' by a wider margin, the refiner's frames
    for them nearer its target frames, and the empty prompt keeps the DiT's offsets."""
    import logging

    from alaya_flash.training.refiner import load_run
    from alaya_flash.training.teacher import load_dit
    from alaya_flash.training.text_anchor import (Anchor, RefinerAnchor, TextAnchorConfig, _embeddings,
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
    _with_a_strong_text_path(runs, tmp_path / "student", g)
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


def test_text_anchor_with_mixup_reads_a_blend_of_wordings_as_the_blend_of_their_presets(runs, tmp_path):
    """Anchored on wordings alone, the MLP is free between them; with `mixup`, blends of two wordings of
    different presets give offsets nearer the blend of the presets' targets."""
    from alaya_flash.training.teacher import load_dit
    from alaya_flash.training.text_anchor import Anchor, TextAnchorConfig, _embeddings, _wordings, dit_text_response

    _with_a_strong_text_path(runs, tmp_path / "student", torch.Generator().manual_seed(0))
    common_cfg = {"student_run": str(tmp_path / "student"), "refiner_run": "", "steps": 150, "log_every": 50,
                  "ckpt_every": 150, "text_noise": 0.0, "lr": 3e-3}
    plain = _text_anchor(runs, tmp_path, "plain", **common_cfg)
    mixed = _text_anchor(runs, tmp_path, "mixed", mixup=1.0, **common_cfg)
    presets, train, extra = _wordings(TextAnchorConfig(data=str(runs / "data")))
    train, extra = [_embeddings(w) for w in train], [_embeddings(w) for w in extra]
    anchor = Anchor(load_dit(tmp_path / "student"), train, extra, _embeddings([""]))
    a, b = torch.cat([train[0], extra[0]]), torch.cat([train[1], extra[1]])  # every wording of the two presets
    lam = torch.linspace(0.2, 0.8, len(a))[:, None]
    blends = torch.nn.functional.normalize(lam * a + (1 - lam) * b, dim=-1)
    want = lam * anchor.means[0] + (1 - lam) * anchor.means[1]
    with torch.no_grad():
        error = {name: float((dit_text_response(load_dit(run), blends) - want).norm(dim=1).mean())
                 for name, run in (("plain", plain), ("mixed", mixed))}
    assert error["mixed"] < 0.8 * error["plain"], error


def test_dit_text_response_is_what_cross_attention_adds_for_a_one_token_prompt():
    from alaya_flash.model_zoo import dit as dit_mod
    from alaya_flash.training.text_anchor import dit_text_response

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
    ({"mixup": -0.5}, "mixup -0.5 must be >= 0"),
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


def _as_world_v2(runs, tmp_path):
    """The fixture's dataset as world v2 would describe it: the same presets and wordings, "world": "pathtrace"
    (the stage reads only dataset.json's presets, wordings and world to anchor the DiT)."""
    import json

    meta = json.loads((runs / "data" / "dataset.json").read_text())
    meta["world"] = "pathtrace"
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "dataset.json").write_text(json.dumps(meta))
    return tmp_path / "v2"


def test_text_anchor_on_world_v2_data_keeps_how_the_captions_read(runs, tmp_path, capsys):
    """A student trained on world v2 read its clips' captions (scene, preset, sun side) as prompts of their
    own: anchored on world v2 data, every caption keeps the source's offsets, while the same anchoring on
    data without captions moves them with the wordings."""
    import json

    from alaya_flash.training.teacher import load_dit
    from alaya_flash.training.text_anchor import _captions, _embeddings, dit_text_response

    _with_a_strong_text_path(runs, tmp_path / "student", torch.Generator().manual_seed(0))
    v2 = _as_world_v2(runs, tmp_path)
    presets = json.loads((v2 / "dataset.json").read_text())["presets"]
    captions = _captions(str(v2), presets)
    assert _captions(str(runs / "data"), presets) == []
    # every scene kind, with and without each sun side: the captions eval prompts world v2 clips with
    assert len(captions) > 3 * len(presets) and all("; the scene is " in c for c in captions)
    over = dict(student_run=str(tmp_path / "student"), refiner_run="", steps=150, log_every=50, ckpt_every=150,
                text_noise=0.5, lr=3e-3)
    kept = _text_anchor(runs, tmp_path, "kept", data=str(v2), **over)
    free = _text_anchor(runs, tmp_path, "free", **over)
    assert f"keeping the source's response to {len(captions)} world v2 captions" in (kept / "train.log").read_text()
    e = _embeddings(captions)
    with torch.no_grad():
        before = dit_text_response(load_dit(tmp_path / "student"), e)
        moved = {name: float((dit_text_response(load_dit(run), e) - before).norm(dim=-1).mean())
                 for name, run in (("kept", kept), ("free", free))}
    assert moved["kept"] < 0.3 * moved["free"], moved
    # the refiner's anchor does not keep captions yet: refused, in one line naming the data
    cfg = {"out": str(tmp_path / "r"), "data": str(v2), "student_run": str(runs / "rollout"),
           "refiner_run": str(runs / "refiner"), "steps": 1}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / "r.json", cfg)]) != 0
    assert f"refiner_run with world v2 data ({v2}) is not supported yet" in capsys.readouterr().err


def test_text_anchor_with_a_second_world_anchors_the_presets_only_it_has(runs, mixed, tmp_path, capsys):
    """A student of two worlds: mix_data's presets that data lacks are anchored too (their wordings pulled onto
    their own preset's mean) after data's; the refiner anchor refuses a second world."""
    import json

    from alaya_flash.training.teacher import load_dit
    from alaya_flash.training.text_anchor import Anchor, TextAnchorConfig, _embeddings, _wordings

    ours = json.loads((runs / "data" / "dataset.json").read_text())["presets"]
    theirs = json.loads((runs / "mix-data" / "dataset.json").read_text())["presets"]
    only_theirs = [p for p in theirs if p not in ours]
    assert only_theirs
    cfg = TextAnchorConfig(data=str(runs / "data"), mix_data=str(runs / "mix-data"), student_run=str(runs / "mixed"))
    presets, train, extra = _wordings(cfg)
    assert presets == ours + only_theirs
    assert train[:len(ours)] == _wordings(TextAnchorConfig(data=str(runs / "data")))[1]
    out = _text_anchor(runs, tmp_path, "two", mix_data=str(runs / "mix-data"), student_run=str(runs / "mixed"),
                       refiner_run="", steps=60, log_every=30, ckpt_every=60, lr=3e-3, text_noise=0.5)
    assert f"anchoring {len(presets)} presets" in (out / "train.log").read_text()
    train, extra = [_embeddings(w) for w in train], [_embeddings(w) for w in extra]
    anchor = Anchor(load_dit(runs / "mixed"), train, extra, _embeddings([""]))
    theirs_extra = extra[len(ours):]  # wordings of the presets only the second world has
    assert anchor.margin(load_dit(out), extra) > anchor.margin(load_dit(runs / "mixed"), extra)
    assert all(len(e) for e in theirs_extra)
    cfg = {"out": str(tmp_path / "r"), "data": str(runs / "data"), "mix_data": str(runs / "mix-data"),
           "student_run": str(runs / "mixed"), "refiner_run": str(runs / "refiner"), "steps": 1}
    assert main(["--quiet", "train", "text-anchor", "--config", write(tmp_path / "r.json", cfg)]) != 0
    assert f"refiner_run with mix_data ({runs / 'mix-data'}) is not supported" in capsys.readouterr().err
