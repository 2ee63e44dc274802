"""Wan DiT: checkpoint-faithful spec, and the three attention modes computing the same thing."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from alaya_flash.model_zoo import dit
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.cli import main

from conftest import ROOT

TINY = dit.CONFIGS["dit-tiny"]
ONE_LAYER = replace(TINY, num_layers=1)


def tiny(cfg=TINY, seed=0):
    torch.manual_seed(seed)
    return dit.WanDiT(cfg).eval()


def key_file_lines():
    text = (ROOT / "tests/data/alayarenderer-teacher.keys.txt").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_spec_teacher_and_stock_wan_equal_key_file(capsys):
    want = key_file_lines()
    assert len(want) == 825
    assert main(["model", "spec", "alayarenderer-teacher"]) == 0
    assert capsys.readouterr().out.splitlines() == want
    stock = [l.replace("patch_embedding.weight 1536x96x1x2x2", "patch_embedding.weight 1536x16x1x2x2") for l in want]
    assert stock != want
    assert main(["model", "spec", "wan2.1-t2v-1.3b"]) == 0
    assert capsys.readouterr().out.splitlines() == stock


def test_spec_unknown_config_names_the_known_ones(capsys):
    assert main(["model", "spec", "dit-huge"]) == 2
    err = capsys.readouterr().err
    assert "unknown config 'dit-huge'" in err and "dit-tiny" in err


def test_rope_split_and_patchify_match_wan():
    assert dit.rope_axis_dims(128) == (44, 42, 42)
    model = tiny()
    x = torch.randn(2, 96, 3, 4, 6)
    ref = model.patch_embedding(x).flatten(2).transpose(1, 2)
    torch.testing.assert_close(model.patchify(x), ref, rtol=1e-5, atol=1e-6)
    tokens = torch.randn(2, 3 * 2 * 3, 64)
    u = model.unpatchify(tokens, 3, 2, 3)
    # token (f, h, w), feature (ph, pw, c) lands at pixel (f, 2h+ph, 2w+pw), channel c
    assert torch.equal(u[1, 5, 2, 2 * 1 + 1, 2 * 2 + 0], tokens[1, 2 * 6 + 1 * 3 + 2, (1 * 2 + 0) * 16 + 5])


def test_time_embedding_is_wan_sinusoid():
    e = dit.sinusoidal_embedding(torch.tensor([0.0, 625.0]), 8)
    assert torch.equal(e[0], torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0], dtype=torch.float64))
    freqs = 10000.0 ** (-torch.arange(4, dtype=torch.float64) / 4)
    assert torch.allclose(e[1], torch.cat([torch.cos(625 * freqs), torch.sin(625 * freqs)]))


def inputs(frames=6, h=4, w=4, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 96, frames, h, w, generator=g)
    prompt = torch.randn(batch, 5, TINY.text_dim, generator=g)
    return x, prompt


@pytest.mark.parametrize("rope", ["absolute", "relative"])
def test_chunked_with_cache_equals_block_causal_full_sequence(rope):
    model = tiny()
    x, prompt = inputs(frames=9)
    # past chunks were written clean (t=0), the last chunk is mid-denoising
    t = torch.tensor([[0.0] * 6 + [937.5] * 3])
    with torch.no_grad():
        full = model(x, t, prompt, chunk_frames=3)
        ctx = model.prepare_prompt(prompt)
        cache = model.new_cache(1, 4, 4, window_frames=9, rope=rope)
        outs = []
        for c in range(3):
            sl = slice(3 * c, 3 * c + 3)
            # a noisy pass first: re-denoising overwrites the slot, so it must leave no trace
            model(torch.randn_like(x[:, :, sl]), torch.full((1,), 500.0), ctx, cache=cache, start_frame=3 * c)
            outs.append(model(x[:, :, sl], t[:, sl], ctx, cache=cache, start_frame=3 * c))
    assert (torch.cat(outs, 2) - full).abs().max() <= 1e-5
    assert cache.frames == 9


def test_block_causal_chunks_do_not_see_the_future_and_first_chunk_is_bidirectional():
    model = tiny()
    x, prompt = inputs(frames=6)
    t = torch.full((1,), 700.0)
    with torch.no_grad():
        full = model(x, t, prompt, chunk_frames=3)
        first = model(x[:, :, :3], t, prompt)  # bidirectional over the first chunk alone
        x2 = x.clone()
        x2[:, :, 3:] += 1.0
        changed = model(x2, t, prompt, chunk_frames=3)
        bidir = model(x2, t, prompt)
    assert (full[:, :, :3] - first).abs().max() <= 1e-5
    assert torch.equal(changed[:, :, :3], full[:, :, :3])
    assert not torch.allclose(bidir[:, :, :3], full[:, :, :3])


def test_redenoising_leaves_cache_length_unchanged():
    model = tiny()
    x, prompt = inputs(frames=3)
    cache = model.new_cache(1, 4, 4, window_frames=6, sink_frames=1)
    ptr = cache.k.data_ptr()
    with torch.no_grad():
        for step in range(4):
            model(x, torch.full((1,), 1000.0 - 100 * step), prompt, cache=cache, start_frame=0)
            assert (cache.frames, cache.end_frame) == (3, 3)
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=3)
        assert (cache.frames, cache.end_frame) == (6, 6)
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=3)
        assert (cache.frames, cache.end_frame) == (6, 6)
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=6)  # new chunk: now the eviction
        assert (cache.frames, cache.evicted) == (7, 2)
    assert cache.k.data_ptr() == ptr


def test_cache_refuses_gaps_and_oversized_chunks():
    model = tiny()
    x, prompt = inputs(frames=3)
    cache = model.new_cache(1, 4, 4, window_frames=2)
    with pytest.raises(AlayaError, match="does not fit the window of 2"):
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=0)
    cache = model.new_cache(1, 4, 4, window_frames=6)
    with torch.no_grad():
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=0)
    with pytest.raises(AlayaError, match="starting at latent frame 5, expected 3 \\(next\\) or 0 \\(again\\)"):
        model(x, torch.zeros(1), prompt, cache=cache, start_frame=5)
    with pytest.raises(AlayaError, match="latent size changed"):
        model(x[..., :2], torch.zeros(1), prompt, cache=cache, start_frame=3)


def test_relative_rope_rolling_window_equals_recompute_from_scratch():
    """One layer: keys/values of a frame depend only on that frame, so after evictions the
    streamed chunk must equal a fresh block-causal forward over [sink frames, window frames]."""
    model = tiny(ONE_LAYER)
    x, prompt = inputs(frames=14, h=2, w=4)
    sink, window, chunk = 2, 6, 3  # frames 0-1 sink; the stream runs 14 frames in chunks 2,3,3,3,3
    starts = [0, 2, 5, 8, 11]
    sizes = [2, 3, 3, 3, 3]
    t_clean = torch.zeros(1)
    t_last = torch.full((1,), 833.0)
    with torch.no_grad():
        ctx = model.prepare_prompt(prompt)
        cache = model.new_cache(1, 2, 4, window_frames=window, sink_frames=sink, rope="relative")
        for s, n in zip(starts, sizes):
            t = t_last if s == starts[-1] else t_clean
            out = model(x[:, :, s : s + n], t, ctx, cache=cache, start_frame=s)
        assert cache.evicted == 14 - sink - window
        # from scratch: the sink frames, then the last `window` frames, positions 0..7
        kept = torch.cat([x[:, :, :sink], x[:, :, 14 - window :]], 2)
        t_frames = torch.tensor([[0.0] * (sink + window - chunk) + [833.0] * chunk])
        ref = model(kept, t_frames, ctx)[:, :, -chunk:]  # bidirectional == block-causal for the last chunk
    assert (out - ref).abs().max() <= 1e-5


def test_absolute_rope_stops_at_table_end_relative_does_not():
    model = tiny(ONE_LAYER)
    x, prompt = inputs(frames=4, h=2, w=2)
    ctx = model.prepare_prompt(prompt)
    with torch.no_grad():
        for rope in ("absolute", "relative"):
            cache = model.new_cache(1, 2, 2, window_frames=4, rope=rope)
            cache.end_frame = 1022  # as if 1022 frames had streamed
            if rope == "absolute":
                with pytest.raises(AlayaError, match="past the 1024 absolute RoPE positions"):
                    model(x, torch.zeros(1), ctx, cache=cache, start_frame=1022)
            else:
                assert model(x, torch.zeros(1), ctx, cache=cache, start_frame=1022).isfinite().all()


def test_bfloat16_close_to_float32_and_per_frame_timesteps():
    model = tiny()
    x, prompt = inputs(frames=3)
    t = torch.tensor([[900.0, 500.0, 100.0]])
    with torch.no_grad():
        ref = model(x, t, prompt)
        low = model.to(torch.bfloat16)(x, t, prompt)
        one = model(x, torch.full((1,), 900.0), prompt)
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.05 * ref.abs().max()
    assert not torch.allclose(one, low)


def test_bad_inputs_are_named():
    model = tiny()
    with pytest.raises(AlayaError, match="expected \\(batch, 96, frames, height, width\\)"):
        model(torch.randn(1, 16, 3, 4, 4), torch.zeros(1), torch.randn(1, 5, 16))
    with pytest.raises(AlayaError, match="prompt embedding has shape \\(1, 5, 8\\)"):
        model(torch.randn(1, 96, 3, 4, 4), torch.zeros(1), torch.randn(1, 5, 8))
    with pytest.raises(AlayaError, match="not divisible by the patch"):
        model(torch.randn(1, 96, 3, 5, 4), torch.zeros(1), torch.randn(1, 5, 16))


def test_cached_path_trains_through_the_current_chunk():
    """The cache stores detached K/V, but the chunk's own live K/V carry gradients (trainer use)."""
    model = tiny()
    x, prompt = inputs(frames=6)
    cache = model.new_cache(1, 4, 4, window_frames=6)
    with torch.no_grad():
        model(x[:, :, :3], torch.zeros(1), prompt, cache=cache, start_frame=0)
    x2 = x[:, :, 3:].clone().requires_grad_(True)
    out = model(x2, torch.full((1,), 625.0), prompt, cache=cache, start_frame=3)
    out.square().mean().backward()
    assert x2.grad is not None and x2.grad.abs().sum() > 0
    assert model.blocks[0].self_attn.k.weight.grad.abs().sum() > 0
    assert not cache.k.requires_grad
    full = model(x, torch.tensor([[0.0] * 3 + [625.0] * 3]), prompt, chunk_frames=3)
    assert (full[:, :, 3:] - out).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precisions_run(dtype):
    model = tiny().to(dtype)
    x, prompt = inputs(frames=3)
    cache = model.new_cache(1, 4, 4, window_frames=3)
    assert cache.k.dtype == dtype
    with torch.no_grad():
        out = model(x, torch.full((1,), 500.0), prompt, cache=cache, start_frame=0)
    assert out.dtype == torch.float32 and out.isfinite().all()


def test_a_umt5_context_is_zero_padded_to_text_len_as_wan_does():
    """Wan pads the prompt's tokens with zeros to 512 and attends to the padding (no mask): a model with
    text_len pads what it is given, and equals the same weights fed the zero-padded context by hand;
    unpadded, the output differs (what every umT5 checkpoint rendered before text_len)."""
    torch.manual_seed(0)
    padded_cfg = replace(dit.CONFIGS["dit-tiny"], text_len=12)
    model = dit.build(padded_cfg).eval()
    plain = dit.build(dit.CONFIGS["dit-tiny"]).eval()
    plain.load_state_dict(model.state_dict())
    x, t = torch.randn(1, padded_cfg.in_dim, 2, 4, 4), torch.tensor([500.0])
    emb = torch.randn(1, 7, padded_cfg.text_dim)
    by_hand = torch.cat([emb, torch.zeros(1, 5, padded_cfg.text_dim)], 1)
    with torch.no_grad():
        ours = model(x, t, emb)
        reference = plain(x, t, by_hand)
        unpadded = plain(x, t, emb)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-6)
    assert (ours - unpadded).abs().max() > 1e-3
    with pytest.raises(AlayaError, match="13 tokens; this model reads at most 12"):
        model.prepare_prompt(torch.randn(1, 13, padded_cfg.text_dim))


def test_the_published_teacher_config_reads_512_padded_umt5_tokens():
    assert dit.CONFIGS["alayarenderer-teacher"].text_len == 512
    assert dit.CONFIGS["dit-small"].text_len == 0  # the MiniLM default keeps its one pooled token
    from alaya_flash.model_zoo import registry

    meta = registry.build("alayarenderer-teacher", device="meta")
    assert dit.infer_config({k: tuple(v.shape) for k, v in meta.state_dict().items()}).text_len == 512
