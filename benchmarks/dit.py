"""DiT micro-benchmarks on this machine: passes per second, achieved FLOP/s, and stream memory.

  python benchmarks/dit.py passes                   # dit-small, 256x256, bf16 and fp32
  python benchmarks/dit.py passes --dtype bf16 --config dit-tiny --size 64
  python benchmarks/dit.py stream --frames 10000    # RSS over a long dit-tiny stream

`passes` times one cached-mode DiT pass (a chunk of --chunk latent frames against a full rolling
cache of --window + --sink frames, as inside KVCacheSampler) and one bidirectional pass over the
window, and prints medians. FLOPs are counted analytically (matmuls and attention only).
Run on an otherwise idle machine for stable figures; print, never assert.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from _common import median_seconds, rss_mib
from alaya_flash.model_zoo import dit, registry
from alaya_flash.streaming.render.kv_cache_sampler import KVCacheConfig, KVCacheSampler

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def pass_flops(cfg: dit.DiTConfig, n_query: int, n_keys: int, text_len: int) -> float:
    """Matmul + attention FLOPs of one forward over n_query tokens (text K/V precomputed)."""
    d, per_patch = cfg.dim, cfg.patch_size[0] * cfg.patch_size[1] * cfg.patch_size[2]
    per_layer = (
        2 * n_query * d * d * 4  # self q k v o
        + 4 * n_query * n_keys * d  # self QK^T and AV
        + 2 * n_query * d * d * 2  # cross q o
        + 4 * n_query * text_len * d  # cross attention
        + 2 * n_query * d * cfg.ffn_dim * 2  # ffn
    )
    return cfg.num_layers * per_layer + 2 * n_query * d * (cfg.in_dim * per_patch + cfg.out_dim * per_patch)


def bench_passes(args) -> None:
    _, cfg = registry.get_config(args.config)
    h = w = args.size // 8  # Wan VAE: 8x spatial
    tokens = (h // cfg.patch_size[1]) * (w // cfg.patch_size[2])
    text_len = args.text_len
    print(f"# {args.config} at {args.size}x{args.size} (latent {h}x{w}, {tokens} tokens/frame), "
          f"chunk {args.chunk} frames, cache {args.sink}+{args.window} frames, text {text_len} tokens, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}")
    for name in args.dtype:
        torch.manual_seed(0)
        model = dit.WanDiT(cfg).to(DTYPES[name]).eval()
        prompt = model.prepare_prompt(torch.randn(1, text_len, cfg.text_dim))
        x = torch.randn(1, cfg.in_dim, args.chunk, h, w)
        cache = model.new_cache(1, h, w, window_frames=args.window, sink_frames=args.sink)
        start = 0
        with torch.no_grad():  # fill the cache to steady state
            while start + args.chunk <= args.sink + args.window + args.chunk:
                model(x, torch.zeros(1), prompt, cache=cache, start_frame=start)
                start += args.chunk
            last = start - args.chunk
            t = torch.full((1,), 937.5)
            cached = median_seconds(lambda: model(x, t, prompt, cache=cache, start_frame=last), args.repeats, warmup=2)
            n_keys = cache.frames * tokens
            window = torch.randn(1, cfg.in_dim, args.sink + args.window, h, w)
            full = median_seconds(lambda: model(window, t, prompt), args.repeats, warmup=2)
        n_full = (args.sink + args.window) * tokens
        for label, sec, nq, nk in (("cached chunk", cached, args.chunk * tokens, n_keys), ("bidirectional window", full, n_full, n_full)):
            flops = pass_flops(cfg, nq, nk, text_len)
            print(f"{name:5s} {label:21s} {nq:6d} q x {nk:6d} kv: {1000 * sec:8.1f} ms/pass  "
                  f"{1 / sec:6.2f} passes/s  {flops / sec / 1e9:7.1f} GFLOP/s")
        if args.chunk:
            chunk_s = cached * (len(KVCacheConfig().nominal_steps) + 1)
            print(f"{name:5s} one 4-step chunk (5 passes) = {1000 * chunk_s:.0f} ms -> "
                  f"{4 * args.chunk / chunk_s:.1f} pixel frames/s (DiT only)")


def bench_stream(args) -> None:
    torch.manual_seed(0)
    model = dit.WanDiT(dit.CONFIGS["dit-tiny"]).eval()
    sampler = KVCacheSampler(model, KVCacheConfig(window_frames=args.window, sink_frames=args.sink))
    state = sampler.new_state(torch.randn(1, 8, model.config.text_dim), seed=0)
    cond = torch.randn(1, model.config.cond_dim, args.chunk, 4, 4)
    n_chunks = args.frames // args.chunk
    marks = {}
    t0 = time.perf_counter()
    for i in range(n_chunks):
        sampler.step(state, cond)
        if i in (1, n_chunks // 4, n_chunks // 2, n_chunks - 1):
            marks[i + 1] = (state.frame, rss_mib(), state.cache.nbytes)
    sec = time.perf_counter() - t0
    print(f"# dit-tiny stream, latent 4x4, chunks of {args.chunk} latent frames, cache {args.sink}+{args.window} frames, "
          f"4 steps + 1 cache pass per chunk; {sec:.1f} s total")
    for chunk, (frame, rss, cache_bytes) in marks.items():
        print(f"after chunk {chunk:5d} (latent frame {frame:6d}): RSS {rss:7.1f} MB, KV cache {cache_bytes} bytes")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("passes", help="DiT passes per second and GFLOP/s")
    p.add_argument("--config", default="dit-small", help="named DiT config")
    p.add_argument("--size", type=int, default=256, help="pixel height = width")
    p.add_argument("--chunk", type=int, default=4, help="latent frames per chunk")
    p.add_argument("--window", type=int, default=8, help="cache window in latent frames")
    p.add_argument("--sink", type=int, default=0, help="cache sink frames")
    p.add_argument("--text-len", type=int, default=32, help="prompt tokens")
    p.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"], help="weight dtypes to time")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    s = sub.add_parser("stream", help="RSS over a long dit-tiny stream")
    s.add_argument("--frames", type=int, default=10000, help="latent frames to stream")
    s.add_argument("--chunk", type=int, default=4, help="latent frames per chunk")
    s.add_argument("--window", type=int, default=12, help="cache window in latent frames")
    s.add_argument("--sink", type=int, default=3, help="cache sink frames")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    (bench_passes if args.what == "passes" else bench_stream)(args)


if __name__ == "__main__":
    main()
