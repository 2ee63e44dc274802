"""Codec speed and streaming memory on this machine: tiny codec vs the full Wan VAE, G-buffer encoder.

  .venv/bin/python benchmarks/codecs.py speed                      # 256x256 and 448x832, bf16 and fp32
  .venv/bin/python benchmarks/codecs.py speed --sizes 256x256 --dtypes bf16
  .venv/bin/python benchmarks/codecs.py memory --frames 10000      # RSS over a long stream
  .venv/bin/python benchmarks/codecs.py flops                      # GFLOP per frame, exact

`speed` prints a markdown table of frames per second (pixel frames out of a decoder, pixel frames
into an encoder; median of --repeats runs after one warm-up run on the same shapes) and the
tiny/full ratio. Weights are random (speed does not depend on them). Clips are short on purpose:
the full VAE takes seconds per frame at 448x832 on 2 CPU cores.

`memory` streams --frames pixel frames through the taew2_1 decoder (one latent at a time) and the
G-buffer encoder (one frame at a time) at a small size, and prints the process RSS after the first
100 frames and at the end, and the codec state sizes, which must not grow.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from _common import import_package, median_seconds, rss_mib


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def speed(args) -> None:
    from alaya_flash.model_zoo import registry
    from alaya_flash.model_zoo.codecs.tiny import run_causal

    torch.manual_seed(0)
    rows = []
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        for dname in args.dtypes:
            dt = DTYPES[dname]
            tiny = registry.build("taew2_1", dtype=dt).eval()
            vae = registry.build("wan2.1-vae", dtype=dt).eval()
            genc = registry.build("gbuffer-encoder", dtype=dt).eval()
            z_tiny = torch.randn(1, 16, args.latents, h // 8, w // 8, dtype=dt)
            frames = torch.rand(1, 4 * args.latents, 3, h, w, dtype=dt)
            n_dec = 4 * args.latents - 3
            gbuf = torch.randint(0, 256, (1, n_dec, 5, h, w, 3), dtype=torch.uint8)
            # the full VAE costs seconds per frame here: its clip is --vae-latents long, one cold run
            z_vae = z_tiny[:, :, : args.vae_latents]
            n_vae = 4 * args.vae_latents - 3
            video = torch.rand(1, 3, n_vae, h, w, dtype=dt) * 2 - 1
            with torch.no_grad():
                t = {
                    "tiny decode": (n_dec, median_seconds(lambda: tiny.decode(z_tiny), args.repeats)),
                    "tiny encode": (frames.shape[1], median_seconds(lambda: tiny.encode(frames), args.repeats)),
                    "G-buffer encoder": (n_dec, median_seconds(lambda: genc.encode(gbuf), args.repeats)),
                }
                if not args.no_vae:
                    t["Wan VAE decode"] = (n_vae, median_seconds(lambda: vae.decode(z_vae), 1, warmup=0))
                    t["Wan VAE encode"] = (n_vae, median_seconds(lambda: vae.encode(video), 1, warmup=0))
                if args.grouped_branches:  # the training form: one grouped stack for all five branches
                    x = genc.to_input(gbuf)
                    x = torch.cat([x[:, :1]] * 3 + [x], 1)  # the Wan alignment encode() uses

                    def grouped():
                        return run_causal(genc.encoder, x, {})

                    t["G-buffer encoder (grouped)"] = (n_dec, median_seconds(grouped, args.repeats))
            fps = {k: n / s for k, (n, s) in t.items()}
            rows.append((size, dname, fps))
            print(f"{size} {dname}: " + ", ".join(f"{k} {v:.2f} fps" for k, v in fps.items()), file=sys.stderr)
    names = list(rows[0][2])
    print(f"| size | dtype | {' | '.join(names)} | tiny/VAE decode | tiny/VAE encode |")
    print("|" + "---|" * (len(names) + 4))
    for size, dname, fps in rows:
        cells = " | ".join(f"{fps[k]:.3g}" for k in names)
        ratio = lambda a, b: f"{fps[a] / fps[b]:.0f}x" if b in fps else "-"  # noqa: E731
        print(f"| {size} | {dname} | {cells} | {ratio('tiny decode', 'Wan VAE decode')} | {ratio('tiny encode', 'Wan VAE encode')} |")


def memory(args) -> None:
    from alaya_flash.model_zoo import registry
    from alaya_flash.model_zoo.codecs.gbuffer_encoder import GBufferEncoderStream
    from alaya_flash.model_zoo.codecs.tiny import TinyStream

    torch.manual_seed(0)
    dt = DTYPES[args.dtype]
    h = w = args.size
    tiny = registry.build(args.decoder, dtype=dt).eval()
    genc = registry.build(args.encoder, dtype=dt).eval()
    dec, enc = TinyStream(tiny), GBufferEncoderStream(genc)
    z = torch.randn(1, 16, h // 8, w // 8, dtype=dt)
    frame = torch.randint(0, 256, (5, h, w, 3), dtype=torch.uint8)
    out_frames = in_frames = 0
    marks = {}
    start = time.perf_counter()
    while out_frames < args.frames:
        got = dec.decode(z)
        out_frames += got.shape[1]
        for _ in range(got.shape[1]):
            enc.encode(frame)
            in_frames += 1
        if out_frames >= 100 and "first" not in marks:
            marks["first"] = (rss_mib(), dec.state_shapes(), enc.state_shapes())
    end = (rss_mib(), dec.state_shapes(), enc.state_shapes())
    wall = time.perf_counter() - start
    print(f"{args.decoder} frames decoded {out_frames}, {args.encoder} frames encoded {in_frames}, "
          f"{h}x{w} {args.dtype}, {wall:.1f} s wall")
    print(f"RSS after 100 frames {marks['first'][0]:.1f} MiB, at the end {end[0]:.1f} MiB, growth {end[0] - marks['first'][0]:+.1f} MiB")
    print(f"decoder state unchanged: {marks['first'][1] == end[1]}, encoder state unchanged: {marks['first'][2] == end[2]}")


def flops(args) -> None:
    """Analytic FLOPs per pixel frame (torch FlopCounterMode on the meta device: no data, exact)."""
    from torch.utils.flop_counter import FlopCounterMode

    from alaya_flash.model_zoo import registry

    def count(fn) -> float:
        with FlopCounterMode(display=False) as mode:
            fn()
        return mode.get_total_flops()

    n_lat = 6
    n_pix = 4 * n_lat - 3
    print("| size | tiny decode | tiny encode | Wan VAE decode | Wan VAE encode | G-buffer encoder | VAE/tiny decode | VAE/tiny encode |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes:
        h, w = (int(v) for v in size.split("x"))
        with torch.device("meta"):
            tiny, vae = registry.build("taew2_1", device="meta"), registry.build("wan2.1-vae", device="meta")
            genc = registry.build("gbuffer-encoder", device="meta")
            z = torch.randn(1, 16, n_lat, h // 8, w // 8)
            g = {
                "td": count(lambda: tiny.decode(z)) / n_pix,
                "te": count(lambda: tiny.encode(torch.rand(1, 4 * n_lat, 3, h, w))) / (4 * n_lat),
                "vd": count(lambda: vae.decode(z)) / n_pix,
                "ve": count(lambda: vae.encode(torch.rand(1, 3, n_pix, h, w))) / n_pix,
                "ge": count(lambda: genc.encode(torch.rand(1, n_pix, 5, h, w, 3) * 2 - 1)) / n_pix,
            }
        cells = " | ".join(f"{g[k] / 1e9:.1f}" for k in ("td", "te", "vd", "ve", "ge"))
        print(f"| {size} | {cells} | {g['vd'] / g['td']:.1f}x | {g['ve'] / g['te']:.1f}x |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("speed", help="frames per second, tiny codec vs Wan VAE, G-buffer encoder")
    p.add_argument("--sizes", nargs="+", default=["256x256", "448x832"], help="HxW frame sizes")
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES), help="weight dtypes")
    p.add_argument("--latents", type=int, default=2, help="latent frames per clip (4*latents-3 pixel frames)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per tiny-codec figure (the VAE: 1, no warm-up)")
    p.add_argument("--vae-latents", type=int, default=1, help="latent frames of the full VAE's clip")
    p.add_argument("--no-vae", action="store_true", help="skip the full VAE")
    p.add_argument("--grouped-branches", action="store_true",
                   help="also time the G-buffer encoder's grouped training form (encode() runs five stacks in bf16/fp16)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    m = sub.add_parser("memory", help="RSS over a long stream (tiny decoder + G-buffer encoder)")
    m.add_argument("--frames", type=int, default=10_000, help="pixel frames to stream")
    m.add_argument("--decoder", default="taew-slim", help="tiny-codec config streamed by the decoder")
    m.add_argument("--encoder", default="gbuffer-encoder-slim", help="G-buffer encoder config")
    m.add_argument("--size", type=int, default=32, help="square frame size in pixels (multiple of 8)")
    m.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="weight dtype")
    m.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    f = sub.add_parser("flops", help="GFLOP per pixel frame of each codec (analytic, meta device)")
    f.add_argument("--sizes", nargs="+", default=["256x256", "448x832"], help="HxW frame sizes")
    f.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import_package()
    {"speed": speed, "memory": memory, "flops": flops}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
