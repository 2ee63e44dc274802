"""Is the colour in the VAE's latents? A probe against the tiny decoder, on the teacher's latent cache.

  .venv/bin/python scripts/latent_colour_probe.py --data runs/data --cache runs/teacher/latents-train.safetensors \
      --codecs runs/codecs

The target is the ground truth's low-frequency colour: the mean RGB of each 8x8 pixel block over
the frames of one latent (frame 0 alone, then groups of 4), i.e. one colour per latent position.
A small MLP reads it from the 16 latent channels at that position (trained on the first 3/4 of the
cached windows, scored on the rest); the tiny decoder's frames, block-averaged the same way, are
scored on the same windows. If the decoder's block-colour error is no worse than the probe's, the
decoder already gets what the latents hold and a colour error is the VAE's (its latents); if the
probe does much better, the decoder is the one to train. Prints MSE in [0, 1] pixel units.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codec_quality import import_package


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="runs/data")
    p.add_argument("--cache", default="runs/teacher/latents-train.safetensors")
    p.add_argument("--codecs", default="runs/codecs")
    p.add_argument("--probe-steps", type=int, default=1500)
    args = p.parse_args(argv)
    import_package()
    import torch

    from alaya_flash.model_zoo.codecs import tiny
    from alaya_flash.model_zoo.loading import load_strict, read_metadata
    from alaya_flash.training.common import autocast, final_weights, latest_checkpoint
    from alaya_flash.training.data import ClipSet
    from alaya_flash.training.latent_data import LatentSet, selected_windows
    from alaya_flash.streaming.metrics import latent_frame_groups

    torch.set_num_threads(1)
    cache = LatentSet(args.cache)
    recipe = json.loads(read_metadata(args.cache)["recipe"])
    if recipe["size"] or recipe["cond_encoder"] != "vae":
        print(f"{args.cache}: needs a cache of full-size frames made with cond_encoder 'vae'", file=sys.stderr)
        return 2
    clips = ClipSet(args.data, "train")
    windows = selected_windows(clips, recipe["frames"], recipe["max_windows"])
    names = json.loads(read_metadata(latest_checkpoint(Path(args.codecs)))["extra"])
    codec = tiny.build(tiny.CONFIGS[names["tiny"]]).eval()
    load_strict(codec, final_weights(Path(args.codecs), "tiny"))

    def block_colours(frames):  # (P, T, H, W, 3) in [0, 1] -> (P, T', H/8, W/8, 3)
        means = torch.stack([frames[:, g].mean(1) for g in latent_frame_groups(frames.shape[1])], 1)
        n, t, h, w, c = means.shape
        return means.reshape(n, t, h // 8, 8, w // 8, 8, c).mean((3, 5))

    targets = torch.stack([block_colours(torch.from_numpy(clips.rgb[c, :, s:s + recipe["frames"]]).float() / 255)
                           for c, s in windows])  # (N, P, T', h, w, 3)
    latents = cache.rgb.float().permute(0, 1, 3, 4, 5, 2)  # (N, P, T', h, w, 16)
    split = len(windows) * 3 // 4
    train_x, train_y = latents[:split].reshape(-1, 16), targets[:split].reshape(-1, 3)
    torch.manual_seed(0)
    probe = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.GELU(), torch.nn.Linear(128, 3))
    opt = torch.optim.Adam(probe.parameters(), 3e-3)
    for _ in range(args.probe_steps):
        idx = torch.randint(len(train_x), (4096,))
        loss = (probe(train_x[idx]) - train_y[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    test_y = targets[split:]
    with torch.no_grad():
        probe_mse = float((probe(latents[split:].reshape(-1, 16)) - test_y.reshape(-1, 3)).pow(2).mean())
        decoded = []
        with autocast():
            for i in range(split, len(windows)):
                frames = codec.decode(cache.rgb[i].float()).float()[:, :recipe["frames"]]  # (P, T, 3, H, W)
                decoded.append(block_colours(frames.clamp(0, 1).permute(0, 1, 3, 4, 2)))
        decoder_mse = float((torch.stack(decoded) - test_y).pow(2).mean())
    print(json.dumps({"windows_scored": len(windows) - split, "probe_block_colour_mse": probe_mse,
                      "tiny_decoder_block_colour_mse": decoder_mse,
                      "target_variance": float(test_y.reshape(-1, 3).var(0).mean())}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
