"""The AlayaRenderer-Flash release: diffusers' Helios backbone, the compressed-history sampler, the
release's codecs and folder (model_zoo/helios.py, model_zoo/release.py, streaming/render/history_sampler.py).

A tiny random release in the published layout is written from diffusers' own class
(tests/release_helpers.py). The sampler is checked against diffusers' own HeliosPipeline, chunk
for chunk, on the same weights, noise and history."""
import logging
import sys
import tracemalloc

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from alaya_flash.model_zoo import helios, release  # noqa: E402
from alaya_flash.model_zoo.folders import is_model_folder, load_flash  # noqa: E402
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError  # noqa: E402
from alaya_flash.model_zoo.identify import identify_path  # noqa: E402
from alaya_flash.model_zoo.loading import read_state_dict, save_safetensors  # noqa: E402
from alaya_flash.streaming.cli import main  # noqa: E402
from alaya_flash.streaming.render.history_sampler import HistoryConfig, HistorySampler, positions  # noqa: E402
from release_helpers import TEXT_SINK, TINY, partial_state, tiny_transformer, write_tiny_release  # noqa: E402
from test_umt5 import spiece, state, write_comfy  # noqa: E402,F401  (module-scoped fixtures: a tiny umT5)


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    return write_tiny_release(tmp_path_factory.mktemp("release") / "AlayaRenderer-Flash")


def pipeline_latents(transformer, prompt, steps, chunk, chunks, history_sizes, size=64, seed=7):
    """diffusers' HeliosPipeline (Euler scheduler, no CFG) -> every generated latent frame, and its sigmas."""
    from diffusers import AutoencoderKLWan, HeliosPipeline, HeliosScheduler
    from diffusers.pipelines.helios.pipeline_helios import calculate_shift

    torch.manual_seed(0)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True]).eval()
    scheduler = HeliosScheduler(stages=1, scheduler_type="euler", use_dynamic_shifting=True)
    pipe = HeliosPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt_embeds=prompt, height=size, width=size, num_frames=chunks * ((chunk - 1) * 4 + 1),
               num_inference_steps=steps, guidance_scale=1.0, generator=torch.Generator().manual_seed(seed),
               output_type="latent", num_latent_frames_per_chunk=chunk, history_sizes=list(history_sizes)).frames
    latent = size // 8
    scheduler.set_timesteps(steps, sigmas=np.linspace(0.999, 0.0, steps + 1)[:-1],
                            mu=calculate_shift(chunk * latent * latent // 4))
    return out, tuple(float(s) for s in scheduler.sigmas)


def test_history_sampler_equals_diffusers_helios_pipeline_chunk_for_chunk():
    """Three chunks with the anchor, long/mid/short windows filling up: our sampler's latents equal
    diffusers' HeliosPipeline's on the same weights, noise (the same seeded CPU draws) and schedule."""
    transformer = tiny_transformer(in_channels=16)
    prompt = torch.randn(1, 5, TINY["text_dim"], generator=torch.Generator().manual_seed(3))
    sizes, chunk = (4, 2, 1), 2
    want, sigmas = pipeline_latents(transformer, prompt, steps=3, chunk=chunk, chunks=3, history_sizes=sizes)
    sampler = HistorySampler(helios.HeliosDiT(transformer), HistoryConfig(history_sizes=sizes, sampler="euler", sigmas=sigmas))
    state = sampler.new_state(prompt, seed=7)
    got = torch.cat([sampler.step(state, torch.zeros(1, 0, chunk, 8, 8))[0] for _ in range(3)], 2)
    assert got.shape == want.shape == (1, 16, 6, 8, 8)
    assert (got - want).abs().max() < 1e-4
    # the history mattered: a sampler that forgets it (a fresh state per chunk) does not match
    fresh = [sampler.step(sampler.new_state(prompt, seed=7), torch.zeros(1, 0, chunk, 8, 8))[0] for _ in range(1)]
    assert (fresh[0] - want[:, :, :2]).abs().max() < 1e-4  # chunk 1 has no history either way
    later = HistorySampler(helios.HeliosDiT(transformer), sampler.config)
    s2 = later.new_state(prompt, seed=7)
    later.step(s2, torch.zeros(1, 0, chunk, 8, 8))
    s2.history.zero_()
    s2.anchor = None
    assert (later.step(s2, torch.zeros(1, 0, chunk, 8, 8))[0] - want[:, :, 2:4]).abs().max() > 1e-3


def test_history_sizes_are_taken_largest_first_as_diffusers_does():
    """diffusers' HeliosPipeline sorts history_sizes largest first; given (1, 2, 4), our sampler equals its
    run (and the (4, 2, 1) one) instead of reading 1 as the long window."""
    transformer = tiny_transformer(in_channels=16)
    prompt = torch.randn(1, 5, TINY["text_dim"], generator=torch.Generator().manual_seed(3))
    want, sigmas = pipeline_latents(transformer, prompt, steps=2, chunk=2, chunks=3, history_sizes=(1, 2, 4))
    config = HistoryConfig(history_sizes=(1, 2, 4), sampler="euler", sigmas=sigmas)
    assert config.history_sizes == (4, 2, 1)
    sampler = HistorySampler(helios.HeliosDiT(transformer), config)
    state = sampler.new_state(prompt, seed=7)
    got = torch.cat([sampler.step(state, torch.zeros(1, 0, 2, 8, 8))[0] for _ in range(3)], 2)
    assert (got - want).abs().max() < 1e-4
    # taken as given (long 1, short 4), the third chunk is another one
    unsorted = HistorySampler(helios.HeliosDiT(transformer), config)
    object.__setattr__(unsorted.config, "history_sizes", (1, 2, 4))
    st = unsorted.new_state(prompt, seed=7)
    other = torch.cat([unsorted.step(st, torch.zeros(1, 0, 2, 8, 8))[0] for _ in range(3)], 2)
    assert (other - want).abs().max() > 1e-3


def test_gbuffer_conditioning_enters_through_the_96_channel_patch_embedding():
    """A 96-channel backbone whose G-buffer columns of the patch embedding are zero, with 16-channel
    memory patchifiers, equals the 16-channel one (and so diffusers' pipeline) whatever the G-buffers;
    with those columns set, the G-buffers change the frames."""
    t16 = tiny_transformer(in_channels=16)
    t96 = tiny_transformer(in_channels=96, history_channels=16)
    state = t16.state_dict()
    w = state["patch_embedding.weight"]
    state["patch_embedding.weight"] = torch.cat([w, torch.zeros(w.shape[0], 80, *w.shape[2:])], 1)
    t96.load_state_dict(state)
    prompt = torch.randn(1, 5, TINY["text_dim"])
    want, sigmas = pipeline_latents(t16, prompt, steps=2, chunk=2, chunks=2, history_sizes=(4, 2, 1))
    cfg = HistoryConfig(history_sizes=(4, 2, 1), sampler="euler", sigmas=sigmas)
    sampler = HistorySampler(helios.HeliosDiT(t96), cfg)
    state_ = sampler.new_state(prompt, seed=7)
    cond = torch.randn(1, 80, 4, 8, 8)
    got = torch.cat([sampler.step(state_, cond[:, :, i:i + 2])[0] for i in (0, 2)], 2)
    assert (got - want).abs().max() < 1e-4
    with torch.no_grad():
        t96.patch_embedding.weight[:, 16:] = torch.randn_like(t96.patch_embedding.weight[:, 16:]) * 0.05
    moved = HistorySampler(helios.HeliosDiT(t96), cfg)
    st = moved.new_state(prompt, seed=7)
    assert (moved.step(st, cond[:, :, :2])[0] - want[:, :, :2]).abs().max() > 1e-3


def test_positions_are_fixed_whatever_the_stream_length():
    pos = positions((16, 2, 1), 4)
    assert pos["short"].tolist() == [[0, 19]] and pos["long"].tolist() == [list(range(1, 17))]
    assert pos["mid"].tolist() == [[17, 18]] and pos["chunk"].tolist() == [[20, 21, 22, 23]]


@pytest.mark.slow
def test_ten_thousand_latent_frames_at_flat_memory():
    """10,000 latent frames (1,250 chunks of 8): the state holds the same tensors of the same size
    after chunk 2 and after chunk 1,250, and Python's allocations do not grow."""
    dit = helios.HeliosDiT(tiny_transformer(num_layers=1))
    sampler = HistorySampler(dit, HistoryConfig(nominal_steps=(1000.0,)))
    state = sampler.new_state(torch.randn(1, 1, TINY["text_dim"]))
    cond = torch.randn(1, 80, 8, 2, 2)
    sizes = None
    tracemalloc.start()
    for i in range(1250):
        sampler.step(state, cond)
        if i == 1:
            sizes = [(tuple(t.shape), t.nbytes) for t in state.tensors()]
            traced = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - traced
    tracemalloc.stop()
    assert state.frame == 10_000
    assert [(tuple(t.shape), t.nbytes) for t in state.tensors()] == sizes == [((1, 96, 19, 2, 2), 29184), ((1, 96, 1, 2, 2), 1536)]
    assert grown < 256 << 10


def test_prompt_change_and_reset():
    dit = helios.HeliosDiT(tiny_transformer())
    sampler = HistorySampler(dit)
    a, b = torch.randn(1, 3, TINY["text_dim"]), torch.randn(1, 3, TINY["text_dim"])
    cond = torch.randn(1, 80, 2, 4, 4)
    state = sampler.new_state(a, seed=1)
    first = sampler.step(state, cond)[0]
    sampler.set_prompt(state, b)
    changed = sampler.step(state, cond)[0]
    sampler.reset(state)
    sampler.set_prompt(state, a)
    assert torch.equal(sampler.step(state, cond)[0], first)  # same seed, empty history: the same frames
    other = sampler.new_state(a, seed=1)
    sampler.step(other, cond)
    assert (sampler.step(other, cond)[0] - changed).abs().max() > 1e-4  # the new prompt took effect
    with pytest.raises(AlayaError, match="latent size changed mid-stream"):
        sampler.step(state, torch.randn(1, 80, 2, 6, 6))
    with pytest.raises(AlayaError, match=r"expected \(batch, tokens, 384\)"):
        sampler.set_prompt(state, torch.randn(1, 3, 16))


def test_release_loads_strictly_with_the_partial_file_on_top(release_dir, caplog):
    with caplog.at_level(logging.WARNING):
        model = load_flash(release_dir, dtype=torch.float32)
    dit = model.dit
    assert isinstance(dit, helios.HeliosDiT) and dit.sampler_kind == "history"
    assert (dit.config.in_dim, dit.config.cond_dim, dit.config.history_channels) == (96, 80, 96)
    partial = read_state_dict(release_dir / helios.PARTIAL_FILE)
    stored = read_state_dict(release_dir / "transformer" / "diffusion_pytorch_model.safetensors")
    own = dit.transformer.state_dict()
    for key in ("patch_embedding.weight", "patch_mid.bias", "norm_out.scale_shift_table"):
        assert torch.equal(own[key], partial[key]) and not torch.equal(own[key], stored[key])
    assert torch.equal(own["blocks.1.attn1.to_q.weight"], stored["blocks.1.attn1.to_q.weight"])
    assert dit.unused == [f"{k} {'x'.join(map(str, s))} ({helios.PARTIAL_FILE})" for k, s in sorted(TEXT_SINK.items())]
    assert "text_sink.tokens 4x384" in caplog.text and "the render runs without them" in caplog.text
    assert model.text_encoder_name == "all-minilm-l6-v2" and model.settings.steps == 4
    assert model.gbuffer_encoder.config.hidden == 8 and model.decoder.config == release.TINY_CONFIGS["taew2_1"]
    assert is_model_folder(release_dir) == "flash"


def test_memory_patchifier_width_is_read_from_the_partial_file(tmp_path):
    folder = write_tiny_release(tmp_path / "r16", history_channels=16)
    dit = load_flash(folder, dtype=torch.float32).dit
    assert dit.config.history_channels == 16 and dit.transformer.patch_long.weight.shape[1] == 16
    latents, state = HistorySampler(dit).step(HistorySampler(dit).new_state(torch.randn(1, 2, 384)), torch.randn(1, 80, 1, 4, 4))
    assert latents.shape == (1, 16, 1, 4, 4) and state.history.shape[1] == 16


def test_release_codecs_in_their_other_name_forms(tmp_path):
    """Five per-branch encoders join into the grouped one (same weights); a decoder-only taew2_1_ft loads."""
    grouped = write_tiny_release(tmp_path / "a")
    branches = write_tiny_release(tmp_path / "b", encoder_names="branches", decoder_only=True)
    enc_a = release.load_encoder(grouped / helios.ENCODER_FILE)
    enc_b = release.load_encoder(branches / helios.ENCODER_FILE)
    assert all(torch.equal(enc_a.state_dict()[k], v) for k, v in enc_b.state_dict().items())
    dec = release.load_decoder(branches / helios.DECODER_FILE)
    assert dec.decoder_only and len(dec.encoder) == 0
    full = release.load_decoder(grouped / helios.DECODER_FILE)
    z = torch.randn(1, 16, 2, 2, 2)
    assert torch.equal(dec.decode(z), full.decode(z))


def test_bad_release_files_each_get_one_line(tmp_path):
    # a partial file whose shapes contradict the transformer
    folder = write_tiny_release(tmp_path / "bad")
    state = read_state_dict(folder / helios.PARTIAL_FILE)
    state["patch_embedding.weight"] = state["patch_embedding.weight"][:, :48]
    save_safetensors(state, folder / helios.PARTIAL_FILE)
    with pytest.raises(CheckpointError, match=r"transformer_partial.safetensors: patch_embedding.weight is 32x48x1x2x2, "
                                              r"but the transformer .* needs 32x96x1x2x2"):
        load_flash(folder)
    # patchifiers that take neither the inputs nor the latents
    state = partial_state(tiny_transformer(), history_channels=40)
    save_safetensors(state, folder / helios.PARTIAL_FILE)
    with pytest.raises(CheckpointError, match="patch_short.weight takes 40 channels"):
        load_flash(folder)
    # a missing component
    good = write_tiny_release(tmp_path / "missing")
    (good / helios.ENCODER_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"a Flash release lacks gbuf_small_encoder.safetensors \(grouped G-buffer encoder\)"):
        load_flash(good)
    # an encoder file of another layout
    save_safetensors({"weight": torch.zeros(2, 2)}, good / helios.ENCODER_FILE)
    with pytest.raises(CheckpointError, match="no encoder.0.weight"):
        load_flash(good)


def test_diffusers_without_helios_is_one_line(monkeypatch):
    import types

    old = types.ModuleType("diffusers")
    old.__version__ = "0.35.2"  # a release from before Helios
    monkeypatch.setitem(sys.modules, "diffusers", old)
    with pytest.raises(AlayaError, match=r"diffusers 0.35.2 has no HeliosTransformer3DModel \(added in 0.42\): "
                                         r"pip install 'alaya-flash\[release\]'"):
        helios.helios_class()
    monkeypatch.setitem(sys.modules, "diffusers", None)  # not installed
    with pytest.raises(AlayaError, match=r"pip install 'alaya-flash\[release\]'"):
        helios.helios_class()


def test_model_identify_names_the_release_and_what_is_missing(release_dir, tmp_path, capsys):
    report = identify_path(release_dir)
    text = "\n".join(report.lines)
    assert report.status == 0 and "an AlayaRenderer-Flash release" in text
    assert "memory patchifiers take 96 channels" in text and "unused (2): text_sink.proj.weight 32x384" in text
    assert "grouped G-buffer encoder (hidden 8)" in text and text.endswith("nothing missing to render")
    partial = write_tiny_release(tmp_path / "partial")
    (partial / helios.DECODER_FILE).unlink()
    assert main(["model", "identify", str(partial)]) == 0
    assert "missing: tiny_decoder/taew2_1_ft.safetensors (tiny decoder (taew2_1_ft))" in capsys.readouterr().out


def test_render_and_sample_windows_with_a_release(release_dir, tmp_path, capsys):
    """`alaya-flash render CLIP --model RELEASE` renders (the same Load Flash Model node ComfyUI runs);
    the release's sample windows (16, 5, H, W, 3) uint8 read as they are."""
    import av

    from alaya_flash.streaming.files.readers import open_gbuffers

    window = (np.random.default_rng(0).random((16, 5, 32, 32, 3)) * 255).astype(np.uint8)
    np.save(tmp_path / "window-00.npy", window)
    out = tmp_path / "snow.mp4"
    assert main(["render", str(tmp_path / "window-00.npy"), "--model", str(release_dir), "--prompt", "snow",
                 "--out", str(out)]) == 0
    assert f"wrote 16 frames to {out}" in capsys.readouterr().err
    with av.open(str(out)) as f:
        frames = [fr.to_ndarray(format="rgb24") for fr in f.decode(video=0)]
    assert len(frames) == 16 and frames[0].shape == (32, 32, 3)
    big = np.lib.format.open_memmap(tmp_path / "sample.npy", mode="w+", dtype=np.uint8, shape=(16, 5, 448, 832, 3))
    del big
    stream = open_gbuffers(tmp_path / "sample.npy")
    assert (stream.info.num_frames, stream.info.height, stream.info.width) == (16, 448, 832)


def test_a_umt5_wide_release_renders_with_the_text_encoder_given(tmp_path, state, spiece, capsys):  # noqa: F811
    """A release whose backbone reads umT5 (here a tiny umT5, 32 wide) renders with --text-encoder;
    without one, identify says what is missing."""
    folder = write_tiny_release(tmp_path / "umt5-release", text_dim=32)
    report = "\n".join(identify_path(folder).lines)
    assert "text 32" in report and report.endswith("nothing missing to render")  # 32 wide is not umT5-XXL's 4096
    umt5 = tmp_path / "umt5_tiny.safetensors"
    write_comfy(umt5, state, spiece)
    np.save(tmp_path / "w.npy", np.zeros((5, 5, 16, 16, 3), np.uint8))
    out = tmp_path / "u.mp4"
    assert main(["render", str(tmp_path / "w.npy"), "--model", str(folder), "--prompt", "snow", "--out", str(out),
                 "--text-encoder", str(umt5)]) == 0
    assert out.is_file()
    assert main(["render", str(tmp_path / "w.npy"), "--model", str(folder), "--prompt", "snow", "--out",
                 str(tmp_path / "v.mp4")]) == 2
    assert "no umT5-XXL file was given or found beside it: pass --text-encoder FILE" in capsys.readouterr().err


def test_comfyui_load_flash_model_lists_and_loads_a_release(release_dir, monkeypatch):
    import types

    from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES

    fp = types.ModuleType("folder_paths")
    fp.get_folder_paths = lambda kind: [str(release_dir.parent)] if kind == "diffusion_models" else []
    monkeypatch.setitem(sys.modules, "folder_paths", fp)
    node = NODES["AlayaFlash_LoadFlashModel"]
    assert release_dir.name in node.INPUT_TYPES()["required"]["model"][0]
    assert node.VALIDATE_INPUTS(model=release_dir.name) is True
    model = node().load(release_dir.name, "(from model)", "cpu", "fp32", "(from model)")[0]
    assert isinstance(model.dit, helios.HeliosDiT)
    sampler = NODES["AlayaFlash_FlashSampler"]
    from alaya_flash.streaming.values import PromptSchedule

    prompt = PromptSchedule.encode(model.text_encoder(), "snow")
    stage = sampler().start_stream(model, prompt, seed=0, steps=-1, chunk_frames=-1, window_frames=-1, sink_frames=-1).inner
    assert isinstance(stage.sampler, HistorySampler) and stage.chunk_frames == 4
    with pytest.raises(AlayaError, match="keeps a compressed history"):
        sampler().start_stream(model, prompt, seed=0, steps=-1, chunk_frames=-1, window_frames=12, sink_frames=-1)
