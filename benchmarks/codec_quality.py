"""Reconstruction quality of trained codecs on a dataset's held-out clips: the ceiling the renderer
can reach (its frames come out of these decoders).

  .venv/bin/python benchmarks/codec_quality.py --data runs/data --vae runs/vae [--codecs runs/codecs]

Prints PSNR (dB, mean over clips and presets) of the VAE round trip of the ground truth, of the
tiny decoder on the VAE's latents, of the tiny codec's own round trip, and the G-buffer encoder's
latent error against the VAE's latents of the passes (MSE in normalized latent units; the latents
have unit variance, so 1.0 means nothing learned). For each decoder also the PSNR after the best
affine colour map of the clip (3x3 + offset, least squares against the ground truth): what it loses
to colour casts and washed-out chroma alone. And the eval's temporal ratio
(frame-to-frame change over the ground truth's) and its cross-window ratio with a window per latent
(change from one latent's frames to the next's over the change inside one): the floor that a
renderer decoding through it starts from. With 2 or more presets, also the control ceiling: how
often each decoder's round trip of a preset's ground truth is nearest (by PSNR) to that preset's
ground truth among the clip's presets, and the margin (`*_nearest_rate`, `*_margin_db`, and the
smallest margin, `*_min_margin_db`): the eval's prompt controllability of a renderer whose latents
were exactly the VAE's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _common import import_package


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="runs/data")
    p.add_argument("--vae", default="runs/vae")
    p.add_argument("--codecs", default=None)
    p.add_argument("--clips", type=int, default=2)
    p.add_argument("--frames", type=int, default=9)
    p.add_argument("--presets", type=int, default=8, help="first N presets")
    p.add_argument("--device", default="cpu", help="torch device for the networks (cpu or cuda); metrics are computed on the CPU")
    args = p.parse_args(argv)
    import_package()
    import torch

    from alaya_flash.model_zoo.codecs import gbuffer_encoder, tiny
    from alaya_flash.model_zoo.loading import load_strict, read_metadata
    from alaya_flash.training.codecs import load_vae, to_video, vae_gbuffer_latents
    from alaya_flash.training.common import autocast, final_weights, latest_checkpoint
    from alaya_flash.training.data import ClipSet
    from alaya_flash.streaming.metrics import boundary_ratio, nearest, psnr, temporal
    from alaya_flash.streaming.values import latent_start_pixel

    torch.set_num_threads(1)
    held = ClipSet(args.data, "heldout")
    dev = torch.device(args.device)
    vae = load_vae(args.vae).to(dev)
    codec = genc = None
    if args.codecs:
        names = json.loads(read_metadata(latest_checkpoint(Path(args.codecs)))["extra"])
        codec = tiny.build(tiny.CONFIGS[names["tiny"]]).eval()
        load_strict(codec, final_weights(Path(args.codecs), "tiny"))
        genc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[names["gbuffer_encoder"]]).eval()
        load_strict(genc, final_weights(Path(args.codecs), "gbuffer_encoder"))
        codec, genc = codec.to(dev), genc.to(dev)
    got = {"vae_roundtrip_psnr": [], "tiny_decoder_on_vae_latents_psnr": [], "tiny_roundtrip_psnr": [],
           "gbuffer_encoder_latent_mse": []}
    t = args.frames
    per_latent = []
    bounds = [latent_start_pixel(k) for k in range(2, (t - 1) // 4 + 1)]  # latent 1 -> 2 onwards

    def colour_fit(frames, gt):
        """frames mapped by the least-squares affine colour transform onto gt (both (T, H, W, 3))."""
        with torch.autocast("cpu", enabled=False):
            x = torch.cat([frames.reshape(-1, 3), torch.ones(frames.numel() // 3, 1)], 1).double()
            a = torch.linalg.lstsq(x, gt.reshape(-1, 3).double(), driver="gelsd").solution  # a flat frame is rank-deficient
            return (x @ a).float().reshape(gt.shape).clamp(0, 1)

    def motion(name: str, frames, gt) -> None:  # frames, gt: (T, H, W, 3) in [0, 1]
        got.setdefault(f"{name}_temporal_ratio", []).append(temporal(frames, gt)["ratio"])
        got.setdefault(f"{name}_cross_latent_ratio", []).append(boundary_ratio(frames, bounds))

    def control(name: str, frames, refs, k: int) -> None:  # nearest preset among the clip's ground truths
        if len(refs) > 1:
            near = nearest(frames, refs, k)
            got.setdefault(f"{name}_nearest_rate", []).append(float(near["hit"]))
            got.setdefault(f"{name}_margin_db", []).append(near["margin_db"])
    with torch.no_grad(), autocast(dev):
        for c in range(min(args.clips, len(held))):
            presets = min(args.presets, held.rgb.shape[1])
            refs = [torch.from_numpy(held.rgb[c, k, :t]).float() / 255 for k in range(presets)]
            for k in range(presets):
                u8 = torch.from_numpy(held.rgb[c, k, :t])
                gt = refs[k]  # (T, H, W, 3)
                z = vae.encode(to_video(u8[None]), chunk=None)
                rec = vae.decode(z.float(), chunk=None).float()[0].permute(1, 2, 3, 0).add(1).div(2).clamp(0, 1).cpu()
                got["vae_roundtrip_psnr"].append(psnr(rec, gt))
                got.setdefault("vae_roundtrip_colour_fit_psnr", []).append(psnr(colour_fit(rec, gt), gt))
                got.setdefault("ground_truth_cross_latent_ratio", []).append(boundary_ratio(gt, bounds))
                motion("vae_roundtrip", rec, gt)
                control("vae_roundtrip", rec, refs, k)
                if codec is not None:
                    # (T, H, W, 3) in [0, 1]
                    dec = codec.decode(z.float()).float()[0].permute(0, 2, 3, 1)[:t].clamp(0, 1).cpu()
                    got["tiny_decoder_on_vae_latents_psnr"].append(psnr(dec, gt))
                    got.setdefault("tiny_decoder_on_vae_latents_colour_fit_psnr", []).append(psnr(colour_fit(dec, gt), gt))
                    motion("tiny_decoder_on_vae_latents", dec, gt)
                    control("tiny_decoder_on_vae_latents", dec, refs, k)
                    frames = gt.permute(0, 3, 1, 2)[None]
                    pad = frames[:, -1:].expand(-1, (-t) % 4, -1, -1, -1)
                    zt = codec.encode(torch.cat([frames, pad], 1).to(dev))
                    rt = codec.decode(zt.float()).float()[0].cpu()
                    n = min(rt.shape[0], t)
                    got["tiny_roundtrip_psnr"].append(psnr(rt.permute(0, 2, 3, 1)[:n].clamp(0, 1), gt[:n]))
            if genc is not None:
                gb = torch.from_numpy(held.gbuffers[c, :t])[None]
                ref = vae_gbuffer_latents(vae, gb)
                err = (genc.encode(gb.to(dev)).float() - ref).pow(2).cpu()
                got["gbuffer_encoder_latent_mse"].append(float(err.mean()))
                per_latent.append(err.mean(dim=(0, 1, 3, 4)))
    known = lambda v: [x for x in v if x is not None]  # noqa: E731  (a clip too short for a boundary gives None)
    report = {k: (sum(known(v)) / len(known(v)) if known(v) else None) for k, v in got.items()}
    for name in ("vae_roundtrip", "tiny_decoder_on_vae_latents"):
        if got.get(f"{name}_margin_db"):
            report[f"{name}_min_margin_db"] = min(got[f"{name}_margin_db"])
    if per_latent:  # drift along the stream: later latents have a different past than the first ones
        report["gbuffer_encoder_latent_mse_per_latent"] = torch.stack(per_latent).mean(0).tolist()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
