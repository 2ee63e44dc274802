"""Schedules, the pure samplers, the KV-cache sampler and the teacher sampler."""
from dataclasses import replace

import pytest
import torch

from alaya_flash.model_zoo import dit
from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.streaming.render import sampler
from alaya_flash.streaming.render.kv_cache_sampler import KVCacheConfig, KVCacheSampler
from alaya_flash.streaming.render.teacher_sampler import teacher_sample

TINY = dit.CONFIGS["dit-tiny"]


def tiny(cfg=TINY):
    torch.manual_seed(0)
    return dit.WanDiT(cfg).eval()


def test_warped_four_step_table_is_exact():
    t = sampler.warped_timesteps()
    assert t.dtype == torch.float64
    assert t.tolist() == [1000.0, 937.5, 2500.0 / 3, 625.0]
    assert KVCacheConfig().timesteps.tolist() == t.tolist()


def test_teacher_sigmas_match_diffsynth_template():
    s = sampler.teacher_sigmas(50, 5.0)
    assert len(s) == 51 and s[0] == 1.0 and s[-1] == 0.0
    assert round(1000 * s[1].item(), 1) == 995.9 and round(1000 * s[-2].item(), 1) == 92.6
    assert torch.all(s[1:] < s[:-1])


def test_sample_x0_with_fixed_denoiser_returns_it_and_uses_given_noise():
    target = torch.randn(2, 3)
    seen, noises = [], []

    def denoise(x, sigma):
        seen.append((x.clone(), sigma))
        return target

    def noise(i):
        noises.append(i)
        return torch.full((2, 3), float(i))

    out = sampler.sample_x0(denoise, torch.zeros(2, 3), [1.0, 0.75, 0.5], noise)
    assert torch.equal(out, target)
    assert noises == [0, 1] and [s for _, s in seen] == [1.0, 0.75, 0.5]
    torch.testing.assert_close(seen[2][0], 0.5 * target + 0.5 * 1.0)


def test_euler_on_a_straight_path_is_exact():
    x0, n = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    out = sampler.sample_euler(lambda x, s: n - x0, n, sampler.teacher_sigmas(7, 3.0))
    torch.testing.assert_close(out, x0)
    x = sampler.add_noise(x0, n, 0.3)
    torch.testing.assert_close(sampler.x0_from_velocity(x, n - x0, 0.3), x0)


def kv_sampler(model=None, **kw):
    cfg = KVCacheConfig(**{"window_frames": 6, "sink_frames": 1, **kw})
    return KVCacheSampler(model or tiny(), cfg)


def stream(kvs, seed, chunks, prompt):
    state = kvs.new_state(prompt, seed=seed)
    return [kvs.step(state, c)[0] for c in chunks], state


def cond_chunks(n=3, frames=2, h=4, w=4, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 80, frames, h, w, generator=g) for _ in range(n)]


def test_stream_is_reproducible_from_its_seed_and_leaves_global_rng_alone():
    kvs, chunks = kv_sampler(), cond_chunks()
    prompt = torch.randn(1, 5, 16)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, state = stream(kvs, 7, chunks, prompt)
    assert torch.equal(torch.rand(3), before)  # the global generator was never drawn from
    b, _ = stream(kvs, 7, chunks, prompt)
    c, _ = stream(kvs, 8, chunks, prompt)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.allclose(a[0], c[0])
    kvs.reset(state)
    again = [kvs.step(state, ch)[0] for ch in chunks]
    assert all(torch.equal(x, y) for x, y in zip(a, again))
    assert a[0].shape == (1, 16, 2, 4, 4) and state.frame == 6


def test_first_chunk_equals_the_x0_loop_over_a_bidirectional_forward():
    model, chunk = tiny(), cond_chunks(1)[0]
    prompt = torch.randn(1, 5, 16)
    kvs = kv_sampler(model)
    out, _ = kvs.step(kvs.new_state(prompt, seed=3), chunk)
    g = torch.Generator().manual_seed(3)
    draw = lambda i=0: torch.randn(1, 16, 2, 4, 4, generator=g)

    def denoise(x, s):
        v = model(torch.cat([x, chunk], 1), torch.full((1,), 1000 * s), prompt)
        return sampler.x0_from_velocity(x, v, s)

    with torch.no_grad():
        ref = sampler.sample_x0(denoise, draw(), [t / 1000 for t in sampler.warped_timesteps().tolist()], draw)
    assert (out - ref).abs().max() <= 1e-5


def test_later_chunks_see_the_clean_cache_and_the_prompt_change_is_seen():
    model = tiny()
    kvs, chunks = kv_sampler(model), cond_chunks(3)
    p1, p2 = torch.randn(1, 5, 16), torch.randn(1, 7, 16)
    base, state = stream(kvs, 1, chunks, p1)
    # same stream with a different second G-buffer chunk: the third chunk must change (history)
    other, _ = stream(kvs, 1, [chunks[0], chunks[0], chunks[2]], p1)
    assert not torch.allclose(base[2], other[2])
    # prompt change before chunk 3: chunk 3 differs, the cache keeps its size and history
    state = kvs.new_state(p1, seed=1)
    kvs.step(state, chunks[0])
    kvs.step(state, chunks[1])
    frames = state.cache.frames
    kvs.set_prompt(state, p2)
    assert state.cache.frames == frames
    changed, _ = kvs.step(state, chunks[2])
    assert not torch.allclose(changed, base[2])
    with pytest.raises(AlayaError, match="new prompt has batch 2"):
        kvs.set_prompt(state, torch.randn(2, 5, 16))


def test_kv_cache_sampler_refuses_bad_conditioning():
    kvs = kv_sampler()
    state = kvs.new_state(torch.randn(1, 5, 16))
    with pytest.raises(AlayaError, match="expected \\(1, 80, frames, height, width\\)"):
        kvs.step(state, torch.randn(1, 16, 2, 4, 4))
    with pytest.raises(AlayaError, match="rope 'spiral'"):
        KVCacheConfig(rope="spiral")


def test_ten_thousand_frame_stream_keeps_flat_memory():
    """10,000 latent frames in chunks of 100: the cache never grows or moves; positions stay bounded."""
    model = tiny(replace(TINY, num_layers=1))
    kvs = KVCacheSampler(model, KVCacheConfig(nominal_steps=(1000,), window_frames=100, sink_frames=4))
    state = kvs.new_state(torch.randn(1, 3, 16), seed=0)
    chunk = torch.randn(1, 80, 100, 2, 2)
    sizes = {}
    for i in range(100):
        latents, state = kvs.step(state, chunk)
        if i in (1, 99):
            sizes[i] = (state.cache.k.shape, state.cache.nbytes, state.cache.k.data_ptr(), state.cache.frames)
    assert state.frame == 10_000 and latents.isfinite().all()
    assert sizes[1] == sizes[99]
    assert state.cache.evicted == 10_000 - 104


def test_teacher_cfg_and_schedule():
    model = tiny()
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(1, 80, 2, 4, 4, generator=g)
    pos, neg = torch.randn(1, 5, 16, generator=g), torch.randn(1, 5, 16, generator=g)
    noise = torch.randn(1, 16, 2, 4, 4, generator=g)
    one = teacher_sample(model, cond, pos, neg, steps=1, cfg=5.0, noise=noise)
    with torch.no_grad():  # one Euler step from sigma 1 to 0: x0 = noise - v_cfg
        inp, t = torch.cat([noise, cond], 1), torch.full((1,), 1000.0)
        v = sampler.cfg_combine(model(inp, t, pos), model(inp, t, neg), 5.0)
    torch.testing.assert_close(one, noise - v)
    assert torch.equal(teacher_sample(model, cond, pos, neg, steps=3, cfg=1.0, seed=4),
                       teacher_sample(model, cond, pos, None, steps=3, seed=4))
    with pytest.raises(AlayaError, match="conditioning latents have 16 channels"):
        teacher_sample(model, noise, pos)


def test_prompt_recache_reencodes_exactly_the_held_frames():
    model = tiny()
    kvs = kv_sampler(model, recache_on_prompt=True)  # window 6 + sink 1
    p1, p2 = torch.randn(1, 5, 16), torch.randn(1, 4, 16)
    chunks = cond_chunks(5)
    # no eviction yet: re-encoding under the same prompt reproduces the cache
    state = kvs.new_state(p1, seed=2)
    for c in chunks[:3]:
        kvs.step(state, c)
    before = state.cache.k.clone(), state.cache.v.clone()
    kvs.set_prompt(state, p1)
    assert (state.cache.k - before[0]).abs().max() <= 1e-5 and (state.cache.v - before[1]).abs().max() <= 1e-5
    # after evictions the history mirrors the cache: block 0's keys depend only on each frame's input
    for c in chunks[3:]:
        kvs.step(state, c)
    assert state.cache.evicted == 3 and state.history.frames == state.cache.frames == 7
    k0 = state.cache.k[0].clone()
    kvs.set_prompt(state, p1)
    assert (state.cache.k[0] - k0).abs().max() <= 1e-5
    # a new prompt re-encodes (block 1 sees it through block 0's cross-attention), the stream goes on
    k1 = state.cache.k[1].clone()
    kvs.set_prompt(state, p2)
    assert (state.cache.k[0] - k0).abs().max() <= 1e-5 and (state.cache.k[1] - k1).abs().max() > 1e-3
    frame = state.frame
    out, _ = kvs.step(state, chunks[0])
    assert out.isfinite().all() and state.frame == frame + 2 and state.cache.frames == 7
    with pytest.raises(AlayaError, match="recache_on_prompt needs rope='relative'"):
        KVCacheConfig(rope="absolute", recache_on_prompt=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stream_on_cuda_equals_the_cpu_stream():
    """The stream's noise comes from its CPU generator, so a seed gives the same frames on a GPU as
    on the CPU (to float32 rounding), through evictions of the rolling cache."""
    model, chunks, prompt = tiny(), cond_chunks(5), torch.randn(1, 5, 16)
    cpu, cpu_state = stream(kv_sampler(model), 4, chunks, prompt)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # matmuls: no TF32 by default
        gpu, gpu_state = stream(kv_sampler(model.cuda()), 4, chunks, prompt)
    assert gpu_state.cache.evicted == cpu_state.cache.evicted > 0
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda"
        assert (a - b.cpu()).abs().max() <= 1e-3 * a.abs().max()
