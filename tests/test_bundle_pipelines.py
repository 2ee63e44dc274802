"""Model folders (save/load strictly, clear errors) and the chunk-level Flash / teacher pipelines."""
import json

import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.streaming.render import pipelines as pl
from alaya_flash.streaming.values import GBuffers, PromptSchedule, parse_schedule
from stream_helpers import random_gbuffers as _gbuffers
from stream_helpers import render_all as _render


@pytest.fixture(scope="module")
def flash():
    return bundle.make_random_flash(seed=0)


@pytest.fixture(scope="module")
def prompts(flash):
    return PromptSchedule.encode(flash.text_encoder(), "0: a sunny street\n8: a rainy night")


@pytest.mark.parametrize("n", [1, 4, 5, 13, 16])
def test_flash_n_frames_in_n_out_and_chunking_does_not_matter(flash, prompts, n):
    g = _gbuffers(n)
    whole = _render(pl.FlashPipeline(flash, prompts, seed=3), [g])
    assert whole.shape == (n, 16, 16, 3)
    assert 0 <= whole.min() and whole.max() <= 1
    pieces = [GBuffers(g.images[i : i + 3]) for i in range(0, n, 3)]
    assert torch.equal(_render(pl.FlashPipeline(flash, prompts, seed=3), pieces), whole)


def test_flash_seed_and_prompt_schedule_change_frames(flash, prompts):
    g = _gbuffers(13)
    a = _render(pl.FlashPipeline(flash, prompts, seed=0), [g])
    assert not torch.equal(a, _render(pl.FlashPipeline(flash, prompts, seed=1), [g]))
    one = PromptSchedule.encode(flash.text_encoder(), "a sunny street")
    b = _render(pl.FlashPipeline(flash, one, seed=0), [g])
    # the schedule switches at pixel frame 8 (latent 3, the second chunk): the first chunk agrees
    assert torch.equal(a[:9], b[:9]) and not torch.equal(a[9:], b[9:])


def test_schedule_parsing():
    assert parse_schedule("plain prompt") == [(0, "plain prompt")]
    assert parse_schedule("0: a\n10: b\n  more") == [(0, "a"), (10, "b more")]
    with pytest.raises(AlayaError, match="frame 0"):
        parse_schedule("5: late")
    with pytest.raises(AlayaError, match="increase"):
        parse_schedule("0: a\n9: b\n3: c")


def test_flash_folder_round_trip(flash, prompts, tmp_path):
    bundle.save_flash(flash, tmp_path / "m", {"dit": "dit-tiny"})
    loaded = bundle.load_flash_folder(tmp_path / "m", dtype=torch.float32)
    assert loaded.random_weights and loaded.settings == flash.settings
    g = _gbuffers(5)
    assert torch.equal(_render(pl.FlashPipeline(loaded, prompts), [g]), _render(pl.FlashPipeline(flash, prompts), [g]))


def test_flash_folder_errors_name_file_and_key(flash, tmp_path):
    folder = bundle.save_flash(flash, tmp_path / "m")
    from safetensors.torch import load_file, save_file

    sd = load_file(folder / "decoder.safetensors")
    sd.pop(sorted(sd)[0])
    save_file(sd, folder / "decoder.safetensors")
    with pytest.raises(CheckpointError, match="decoder.safetensors.*missing"):
        bundle.load_flash_folder(folder)
    (folder / "decoder.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"decoder\.safetensors: missing"):
        bundle.load_flash_folder(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="line 1, column 2"):
        bundle.load_flash_folder(folder)
    (folder / "config.json").write_text(json.dumps({"format": "alaya-flash/teacher", "version": 1, "networks": {}}))
    with pytest.raises(CheckpointError, match="expected 'alaya-flash/flash'"):
        bundle.load_flash_folder(folder)
    with pytest.raises(AlayaError, match="no such model folder"):
        bundle.load_flash_folder(tmp_path / "nope")


def test_no_default_model_is_said_clearly(monkeypatch, tmp_path):
    monkeypatch.setattr(bundle, "DEFAULT_DIR", tmp_path / "default")
    with pytest.raises(AlayaError, match="no default Flash model yet"):
        bundle.load_flash_folder(None)


def test_teacher_windows_and_round_trip(prompts, tmp_path):
    teacher = bundle.make_random_teacher(settings=bundle.TeacherSettings(steps=2, window_frames=9))
    neg = teacher.text_encoder()([""])
    g = _gbuffers(13)
    whole = _render(pl.TeacherPipeline(teacher, prompts, neg, seed=1), [g])
    assert whole.shape == (13, 16, 16, 3)
    pieces = [GBuffers(g.images[i : i + 4]) for i in range(0, 13, 4)]
    assert torch.equal(_render(pl.TeacherPipeline(teacher, prompts, neg, seed=1), pieces), whole)
    bundle.save_teacher(teacher, tmp_path / "t")
    loaded = bundle.load_teacher(tmp_path / "t", dtype=torch.float32)
    assert torch.equal(_render(pl.TeacherPipeline(loaded, prompts, neg, seed=1), [g]), whole)
    with pytest.raises(AlayaError, match="4k\\+1"):
        pl.TeacherEncode(teacher.vae, window_frames=8)


def test_full_vae_decodes_flash_latents_to_same_frame_count(flash, prompts):
    teacher = bundle.make_random_teacher()
    g = _gbuffers(6)
    enc, smp = pl.GBufferEncode(flash.gbuffer_encoder), pl.FlashSample(flash, prompts)
    lat = pl.concat_chunks([smp.step(enc.step(g)), smp.step(enc.flush()), smp.flush()])
    frames = pl.Decode(pl.VAEDecoder(teacher.vae)).step(lat)
    assert frames.shape == (6, 16, 16, 3)


@pytest.mark.parametrize("kind", ["kv-cache", "history"])
def test_two_streams_at_once_over_one_model_give_each_its_own_frames(flash, prompts, kind):
    """Sessions share the weights, never state: two streams rendered at the same time on two threads
    give exactly the frames each gives alone (what `bench --sessions 2` and two live viewers rely on)."""
    from concurrent.futures import ThreadPoolExecutor

    model = flash
    if kind == "history":
        pytest.importorskip("diffusers")
        from alaya_flash.model_zoo.release import make_random_release

        model = make_random_release("helios-flash-small", encoder_hidden=8)
    prompts = PromptSchedule.encode(model.text_encoder(), "0: a sunny street\n8: a rainy night")
    clips = [[GBuffers(_gbuffers(13, seed=s).images[i : i + 4]) for i in range(0, 13, 4)] for s in (1, 2)]
    alone = [_render(pl.FlashPipeline(model, prompts, seed=s), clip) for s, clip in enumerate(clips)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda s: _render(pl.FlashPipeline(model, prompts, seed=s), clips[s]), range(2)))
    assert all(torch.equal(a, b) for a, b in zip(alone, together))
    assert not torch.equal(alone[0], alone[1])
