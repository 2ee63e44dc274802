"""Stage a: the codec teacher (a small Wan VAE) and the distilled codecs matching its latent space.

`train vae`: a Wan2.1-VAE-structured autoencoder (model_zoo/codecs/wan_vae.py) trained on random
crops of ground-truth clips AND of G-buffer images (each pass as an RGB video, as the teacher
encodes them), with L1 + MSE reconstruction, a little latent noise and a small pull of the
normalized latents towards zero mean / unit scale (so the DiT sees a well-scaled space).

`train codecs`: with the VAE frozen, distil
- the slim tiny codec (model_zoo/codecs/tiny.py, TAEHV layout): decoder from VAE latents to the
  ground-truth frames (L1 + MSE), encoder to the VAE latents (MSE);
- the 5-branch G-buffer encoder (model_zoo/codecs/gbuffer_encoder.py) to the VAE latents of the
  five passes (MSE), in the Wan frame alignment (latent 0 = frame 0 alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..model_zoo.codecs import gbuffer_encoder, tiny, wan_vae
from ..model_zoo.errors import AlayaError
from ..model_zoo.latents import TIME_COMPRESSION
from .common import (StageConfig, autocast, check_device, check_mix, descend, final_weights, latest_checkpoint,
                     step_generator, train_loop)
from .data import ClipSet


@dataclass(frozen=True)
class VAEStageConfig(StageConfig):
    out: str = "runs/vae"
    vae: str = "wan2.1-vae-small"  # a named WanVAEConfig
    base_dim: int = 0  # override the named config's base width (0 = keep)
    frames: int = 5  # 4k+1 frames per sample
    crop: int = 64  # square crop (multiple of 8; 0 = whole frame)
    gbuffer_fraction: float = 0.5  # share of samples that are G-buffer passes rather than RGB
    latent_noise: float = 0.05
    latent_reg: float = 1e-3
    motion_weight: float = 0.0  # weight of motion_loss beside the reconstruction
    chroma_weight: float = 0.0  # weight of chroma_loss beside the reconstruction
    # where the VAE trains: "cpu" or "cuda". Samples and noise are drawn on the CPU from the step's
    # seed either way, so a run draws the same crops and noise on both
    device: str = "cpu"
    # a vae run folder (e.g. runs/imported/vae) whose latest weights start this run when `out` has no
    # checkpoint yet; the optimizer starts fresh (continue the shipped VAE without its run folder)
    init: str = ""
    # a second dataset folder whose training clips give the whole batch of a mix_rate share of the
    # steps (a VAE for two worlds); the latent statistics stay those of `data`
    mix_data: str = ""
    mix_rate: float = 0.0

    def validate(self):
        check_device("vae stage", self.device)
        check_mix("vae stage", self.mix_data, self.mix_rate)
        if self.motion_weight < 0 or self.chroma_weight < 0:
            raise AlayaError(f"vae stage: motion_weight {self.motion_weight} and chroma_weight {self.chroma_weight} "
                             "must be >= 0")
        if (self.frames - 1) % TIME_COMPRESSION or self.crop % 8:
            raise AlayaError(f"vae stage: frames {self.frames} must be 4k+1 and crop {self.crop} a multiple of 8")
        if self.vae not in wan_vae.CONFIGS:
            raise AlayaError(f"vae stage: vae {self.vae!r} is unknown; choose from {', '.join(wan_vae.CONFIGS)}")


@dataclass(frozen=True)
class CodecStageConfig(StageConfig):
    out: str = "runs/codecs"
    vae_run: str = "runs/vae"  # folder of the trained codec teacher
    tiny: str = "taew-slim"  # a named TinyCodecConfig
    gbuffer_encoder: str = "gbuffer-encoder-slim"  # a named GBufferEncoderConfig
    frames: int = 9
    crop: int = 64
    lr: float = 1e-3
    # a teacher run's latents-train.safetensors (cond_encoder "vae"): crop the VAE targets out of these
    # whole-window latents instead of encoding every crop (see run_codecs); "" = encode each crop
    latents: str = ""
    motion_weight: float = 0.0  # weight of motion_loss on the tiny decoder's frames
    boundary_weight: float = 0.0  # weight of boundary_motion_loss on the tiny decoder's frames
    # a codecs run folder (e.g. runs/imported/codecs) whose latest tiny codec and G-buffer encoder start
    # this run when `out` has no checkpoint yet; the optimizer starts fresh
    init: str = ""
    # a second dataset folder whose training clips give the whole batch of a mix_rate share of the steps,
    # their VAE targets encoded crop by crop (`latents` caches the first dataset's only)
    mix_data: str = ""
    mix_rate: float = 0.0

    def validate(self):
        check_mix("codecs stage", self.mix_data, self.mix_rate)
        if self.motion_weight < 0 or self.boundary_weight < 0:
            raise AlayaError(f"codecs stage: motion_weight {self.motion_weight} and boundary_weight "
                             f"{self.boundary_weight} must be >= 0")
        if (self.frames - 1) % TIME_COMPRESSION or self.crop % 8:
            raise AlayaError(f"codecs stage: frames {self.frames} must be 4k+1 and crop {self.crop} a multiple of 8")
        if self.tiny not in tiny.CONFIGS or self.gbuffer_encoder not in gbuffer_encoder.CONFIGS:
            raise AlayaError(f"codecs stage: unknown codec config {self.tiny!r} or {self.gbuffer_encoder!r}")


def vae_config(cfg: VAEStageConfig) -> wan_vae.WanVAEConfig:
    from dataclasses import replace

    base = wan_vae.CONFIGS[cfg.vae]
    return replace(base, base_dim=cfg.base_dim) if cfg.base_dim else base


def sample_clips(clips: ClipSet, g: torch.Generator, batch: int, frames: int, crop: int):
    """Random windows: gbuffers uint8 (B, T, 5, h, w, 3), rgb uint8 (B, T, h, w, 3), preset index (B,)."""
    n, p, t, h, w = clips.rgb.shape[:5]
    if frames > t or crop > min(h, w):
        raise AlayaError(f"dataset clips are {t} frames of {h}x{w}; cannot cut {frames} frames of {crop}x{crop}")
    c = crop or h
    cw = crop or w
    idx = torch.randint(n, (batch,), generator=g).tolist()
    pre = torch.randint(p, (batch,), generator=g).tolist()
    gb, rgb = [], []
    for i, k in zip(idx, pre):
        s = int(torch.randint(t - frames + 1, (1,), generator=g))
        y = int(torch.randint(h - c + 1, (1,), generator=g))
        x = int(torch.randint(w - cw + 1, (1,), generator=g))
        gb.append(clips.gbuffers[i, s:s + frames, :, y:y + c, x:x + cw])
        rgb.append(clips.rgb[i, k, s:s + frames, y:y + c, x:x + cw])
    return torch.from_numpy(np.stack(gb)), torch.from_numpy(np.stack(rgb)), torch.tensor(pre)


def motion_loss(frames: torch.Tensor, target: torch.Tensor, dim: int) -> torch.Tensor:
    """L1 between the frame-to-frame changes of a decoded clip and of its ground truth (along `dim`).

    Pixel losses alone let a decoder that expands each latent into 4 frames return nearly the same
    frame 4 times and jump at the next latent (cross-latent change ratio 3.1 for the tiny decoder,
    flicker ratio 2.2 for the VAE); this term prices the change itself."""
    return F.l1_loss(frames.diff(dim=dim), target.diff(dim=dim))


def boundary_motion_loss(frames: torch.Tensor, target: torch.Tensor, dim: int) -> torch.Tensor:
    """motion_loss on the changes into each latent's first frame only (frames 1, 5, 9, ... along `dim`).

    A causal decoder sees latent k's past when it starts decoding latent k + 1, so it can continue
    from the frame it last gave back; with every change weighted alike it did not (change across
    latent boundaries 2.25x the change inside one, the ground truth's 0.97x), and a streaming
    student that decodes one latent per chunk stutters at that 4-frame beat."""
    into = torch.arange(0, frames.shape[dim] - 1, TIME_COMPRESSION, device=frames.device)  # diff i: frame i -> i + 1
    return F.l1_loss(frames.diff(dim=dim).index_select(dim, into), target.diff(dim=dim).index_select(dim, into))


def chroma_loss(frames: torch.Tensor, target: torch.Tensor, dim: int) -> torch.Tensor:
    """L1 between the colour of a decoded clip and of its ground truth: each pixel minus its mean over
    the channels (`dim`), i.e. what is left once brightness is taken out.

    The VAE trained on L1 + MSE alone gave back about 60% of the ground truth's chroma spread (purple
    floors came out grey-pink); brightness errors dominate those losses, this term prices hue alone."""
    return F.l1_loss(frames - frames.mean(dim, keepdim=True), target - target.mean(dim, keepdim=True))


def add_frame_terms(loss: torch.Tensor, losses: dict[str, float], frames: torch.Tensor, target: torch.Tensor, *,
                    time_dim: int, channel_dim: int, motion: float = 0.0, boundary: float = 0.0,
                    chroma: float = 0.0) -> torch.Tensor:
    """loss plus each term above whose weight is not 0, in this order: motion_loss along time_dim,
    boundary_motion_loss along time_dim and chroma_loss over channel_dim; each term's value is
    logged in `losses` as motion, jump and chroma."""
    for name, weight, term, dim in (("motion", motion, motion_loss, time_dim),
                                    ("jump", boundary, boundary_motion_loss, time_dim),
                                    ("chroma", chroma, chroma_loss, channel_dim)):
        if weight:
            value = term(frames, target, dim=dim)
            loss = loss + weight * value
            losses[name] = value.item()
    return loss


def to_video(u8: torch.Tensor) -> torch.Tensor:
    """uint8 (B, T, H, W, 3) -> Wan VAE pixels (B, 3, T, H, W) in [-1, 1]."""
    return u8.permute(0, 4, 1, 2, 3).float().mul(2 / 255).sub(1)


def gbuffer_videos(gb: torch.Tensor) -> torch.Tensor:
    """Teacher-form uint8 (B, T, 5, H, W, 3) -> (B * 5, 3, T, H, W) in [-1, 1], modality-major per sample."""
    b, t, m, h, w, c = gb.shape
    return to_video(gb.permute(0, 2, 1, 3, 4, 5).reshape(b * m, t, h, w, c))


@torch.no_grad()
def vae_gbuffer_latents(vae: wan_vae.WanVAE, gb: torch.Tensor) -> torch.Tensor:
    """Teacher-form G-buffers (B, T, 5, H, W, 3) -> (B, 80, T', h, w): the VAE latent of each pass, concatenated."""
    z = vae.encode(gbuffer_videos(gb), chunk=None).float()
    b = gb.shape[0]
    return z.reshape(b, 5 * z.shape[1], *z.shape[2:])


def start_from(stage: str, cfg: StageConfig, nets: dict[str, torch.nn.Module], log) -> None:
    """`init`: a new run (no checkpoint in `out` yet) starts from another run's latest weights of each
    named network; weights that do not fit are refused naming the run."""
    if not cfg.init or latest_checkpoint(Path(cfg.out)) is not None:
        return
    from ..model_zoo.loading import load_strict

    try:
        for name, net in nets.items():
            load_strict(net, final_weights(Path(cfg.init), name))
    except AlayaError as e:
        raise AlayaError(f"{stage}: init {cfg.init}: {e}") from None
    log.info("started from the weights of %s (fresh optimizer)", cfg.init)


def run_vae(cfg: VAEStageConfig, log, progress=None) -> int:
    clips = ClipSet(cfg.data, "train")
    sets = [clips] + ([ClipSet(cfg.mix_data, "train")] if cfg.mix_data else [])
    vcfg = vae_config(cfg)
    dev = torch.device(cfg.device)
    vae = wan_vae.build(vcfg)
    start_from("vae stage", cfg, {"vae": vae}, log)
    vae = vae.to(dev)
    opt = torch.optim.AdamW(vae.parameters(), lr=cfg.lr, weight_decay=0.0)
    log.info("vae %s: %.2fM parameters, %s training clips, on %s", vcfg,
             sum(p.numel() for p in vae.parameters()) / 1e6, " + ".join(str(len(c)) for c in sets), dev)

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        k = int(torch.rand(1, generator=g) < cfg.mix_rate) if cfg.mix_rate else 0  # drawn only when mixing
        gb, rgb, _ = sample_clips(sets[k], g, cfg.batch, cfg.frames, cfg.crop)
        use_gb = torch.rand(cfg.batch, generator=g) < cfg.gbuffer_fraction
        passes = torch.randint(5, (cfg.batch,), generator=g)
        video = torch.stack([to_video(gb[j:j + 1, :, passes[j]])[0] if use_gb[j] else to_video(rgb[j:j + 1])[0]
                             for j in range(cfg.batch)]).to(dev)
        with autocast(dev):
            z = vae._encode(video, None)  # normalized mu, with gradients (encode() is inference-only)
            noisy = z + cfg.latent_noise * torch.randn(z.shape, generator=g).to(dev)
            recon = vae_decode_unclamped(vae, noisy).float()
        rec = F.l1_loss(recon, video) + F.mse_loss(recon, video)
        reg = z.float().pow(2).mean()
        loss = rec + cfg.latent_reg * reg
        losses = {"rec": rec.item(), "z2": reg.item()}
        if cfg.mix_rate:
            losses["mix"] = k
        loss = add_frame_terms(loss, losses, recon, video, time_dim=2, channel_dim=1,  # (B, C, T, H, W)
                               motion=cfg.motion_weight, chroma=cfg.chroma_weight)
        descend(opt, loss, vae.parameters())
        return losses

    reached = train_loop(cfg, {"vae": vae}, {"opt_vae": opt}, step, log, progress,
                         extra={"vae_config": _asdict(vcfg)})
    if latent_stats_step(cfg.out) != reached:  # missing, or of weights a resumed run has since changed
        calibrate_vae(cfg, clips, log, reached)
    return reached


LATENT_STATS = "latent-stats.safetensors"


def latent_stats_step(run_dir: str | Path) -> int | None:
    """The checkpoint step a run folder's latent statistics were measured at (None: no statistics,
    or statistics from before the step was recorded)."""
    from ..model_zoo.loading import read_metadata

    stats = Path(run_dir) / LATENT_STATS
    if not stats.is_file():
        return None
    step = read_metadata(stats).get("step")
    return None if step is None else int(step)


@torch.no_grad()
def calibrate_vae(cfg: VAEStageConfig, clips: ClipSet, log, step: int, samples: int = 16) -> None:
    """Per-channel mean and std of the trained VAE's (normalized) latents of ground-truth clips.

    load_vae folds them into the VAE's conv1 / conv2 so that its latents have zero mean and unit
    variance per channel (what the DiT's noise schedule assumes) with the decoder unchanged in
    effect; a small VAE trained briefly otherwise leaves latents at a small scale.
    """
    from ..model_zoo.loading import save_safetensors

    vae = load_vae(cfg.out, calibrated=False).to(cfg.device)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    _, rgb, _ = sample_clips(clips, g, samples, cfg.frames, 0)
    z = torch.cat([vae.encode(to_video(rgb[i:i + 4]).to(cfg.device), chunk=None).float().cpu()
                   for i in range(0, samples, 4)])
    mean, std = z.mean(dim=(0, 2, 3, 4)), z.std(dim=(0, 2, 3, 4)).clamp_min(1e-3)
    save_safetensors({"mean": mean, "std": std}, Path(cfg.out) / LATENT_STATS, {"samples": samples, "step": step})
    log.info("latent stats: mean %s std %s", [round(v, 3) for v in mean.tolist()], [round(v, 3) for v in std.tolist()])


def fold_latent_stats(vae: wan_vae.WanVAE, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Make encode() return (z - mean) / std and decode() accept it, by editing conv1 / conv2 exactly."""
    from ..model_zoo.latents import WAN21_LATENT_MEAN, WAN21_LATENT_STD

    z = vae.config.z_dim
    wm, ws = torch.tensor(WAN21_LATENT_MEAN), torch.tensor(WAN21_LATENT_STD)
    c1w, c1b = vae.conv1.weight.data, vae.conv1.bias.data
    # mu' = WM + (mu - WM - WS * mean) / std, so normalize(mu') = (normalize(mu) - mean) / std
    c1w[:z] /= std.view(-1, 1, 1, 1, 1)
    c1b[:z] = (c1b[:z] - wm - ws * mean) / std + wm
    # conv2 sees mu' where it saw mu = WM + std * (mu' - WM) + WS * mean: scale its columns, shift its bias
    c2w, c2b = vae.conv2.weight.data, vae.conv2.bias.data
    shift = wm * (1 - std) + ws * mean
    c2b += (c2w.flatten(1) @ shift)
    c2w *= std.view(1, -1, 1, 1, 1)


def vae_decode_unclamped(vae: wan_vae.WanVAE, z: torch.Tensor) -> torch.Tensor:
    """WanVAE.decode for training: whole clip, with gradients and WITHOUT the final clamp (a clamped
    output saturated on the wrong side gets no gradient and stays stuck)."""
    from ..model_zoo.latents import denormalize

    return vae.decoder(vae.conv2(denormalize(z)), {})


def _asdict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)


def load_vae(run_dir: str | Path, calibrated: bool = True) -> wan_vae.WanVAE:
    """The trained codec teacher from a `train vae` output folder (config from its checkpoint).

    calibrated: fold the folder's latent statistics (calibrate_vae) into it, as every later stage sees it.
    """
    from ..model_zoo.loading import load_strict, read_metadata

    ckpt = latest_checkpoint(Path(run_dir))
    if ckpt is None:
        raise AlayaError(f"{run_dir}: no checkpoint here; run `alaya-flash train vae` first")
    import json

    raw = json.loads(read_metadata(ckpt)["extra"])["vae_config"]
    raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    vae = wan_vae.build(wan_vae.WanVAEConfig(**raw))
    load_strict(vae, final_weights(Path(run_dir), "vae"))
    stats = Path(run_dir) / LATENT_STATS
    if calibrated:
        if not stats.is_file():
            raise AlayaError(f"{stats}: missing; run `alaya-flash train vae` again to calibrate the latents")
        at, step = latent_stats_step(run_dir), int(read_metadata(ckpt)["step"])
        if at is not None and at != step:
            raise AlayaError(f"{stats}: measured at step {at} but {ckpt.name} is step {step}; "
                             "run `alaya-flash train vae` again to recalibrate")
        from ..model_zoo.loading import read_state_dict

        got = read_state_dict(stats)
        fold_latent_stats(vae, got["mean"], got["std"])
    return vae.eval().requires_grad_(False)


def gbuffer_encoder_latents(enc: gbuffer_encoder.GBufferEncoder, gb: torch.Tensor) -> torch.Tensor:
    """GBufferEncoder.encode with gradients: teacher-form (B, T, 5, H, W, 3) -> (B, 80, T', h, w)."""
    x = enc.to_input(gb)
    x = torch.cat([x[:, :1].expand(-1, TIME_COMPRESSION - 1, -1, -1, -1), x], 1)  # frame 0 alone -> latent 0
    return tiny.run_causal(enc.encoder, x, {}).permute(0, 2, 1, 3, 4)


def tiny_decode(codec: tiny.TinyCodec, z: torch.Tensor) -> torch.Tensor:
    """TinyCodec.decode with gradients and no clamp: (B, 16, T', h, w) -> (B, 4T'-3, 3, H, W)."""
    frames = tiny.run_causal(codec.decoder, z.permute(0, 2, 1, 3, 4), {})
    return frames[:, codec.config.frames_to_trim:]


def tiny_encode(codec: tiny.TinyCodec, frames: torch.Tensor) -> torch.Tensor:
    """TinyCodec.encode with gradients: frames (B, T, 3, H, W) in [0, 1], T a multiple of 4 -> (B, 16, T/4, h, w)."""
    return tiny.run_causal(codec.encoder, frames, {}).permute(0, 2, 1, 3, 4)


class CachedTargets:
    """The VAE's latents of every training window (a teacher run's latent cache), with the windows'
    pixels, for cutting aligned random crops: pixels at a multiple of 8 and the latents under them."""

    def __init__(self, cfg: CodecStageConfig, clips: ClipSet):
        import json

        from ..model_zoo.loading import read_metadata
        from .latent_data import LatentSet, selected_windows

        path = Path(cfg.latents)
        if not path.is_file():
            raise AlayaError(f"{path}: latent cache not found; run `alaya-flash train teacher` (it writes it) first")
        recipe = json.loads(read_metadata(path).get("recipe", "{}"))
        want = {"data": str(cfg.data), "vae_run": str(cfg.vae_run), "frames": cfg.frames, "cond_encoder": "vae",
                "split": "train", "size": 0}
        for key, value in want.items():
            if recipe.get(key) != value:
                raise AlayaError(f"{path}: made with {key}={recipe.get(key)!r}, the codecs stage needs {value!r}")
        self.clips, self.latents, self.frames = clips, LatentSet(path), cfg.frames
        self.windows = selected_windows(clips, cfg.frames, recipe.get("max_windows", 0))
        if len(self.windows) != len(self.latents):
            raise AlayaError(f"{path}: {len(self.latents)} windows, the dataset has {len(self.windows)}")

    def sample(self, g: torch.Generator, batch: int, crop: int):
        """gbuffers uint8 (B, T, 5, c, c, 3), rgb uint8 (B, T, c, c, 3), VAE latents of both (B, 16 | 80, T', c/8, c/8),
        and what was cut: [(window, preset, latent row, latent column)]."""
        rgb_z, cond_z, frames = self.latents.rgb, self.latents.cond, self.frames
        n, p = rgb_z.shape[:2]
        h, w = self.clips.rgb.shape[3:5]
        k = (crop or min(h, w)) // 8
        gb, rgb, zr, zg, where = [], [], [], [], []
        for _ in range(batch):
            i, q = int(torch.randint(n, (1,), generator=g)), int(torch.randint(p, (1,), generator=g))
            y, x = int(torch.randint(h // 8 - k + 1, (1,), generator=g)), int(torch.randint(w // 8 - k + 1, (1,), generator=g))
            c, s = self.windows[i]
            gb.append(self.clips.gbuffers[c, s:s + frames, :, 8 * y:8 * (y + k), 8 * x:8 * (x + k)])
            rgb.append(self.clips.rgb[c, q, s:s + frames, 8 * y:8 * (y + k), 8 * x:8 * (x + k)])
            zr.append(rgb_z[i, q, :, :, y:y + k, x:x + k])
            zg.append(cond_z[i, :, :, y:y + k, x:x + k])
            where.append((i, q, y, x))
        return (torch.from_numpy(np.stack(gb)), torch.from_numpy(np.stack(rgb)), torch.stack(zr).float(),
                torch.stack(zg).float(), where)


def run_codecs(cfg: CodecStageConfig, log, progress=None) -> int:
    """Distil the codecs from the frozen VAE. With cfg.latents the VAE targets are crops of its
    whole-window latents (cached once by the teacher stage) rather than the VAE's latents of each
    pixel crop: no VAE pass per step (the stage ran ~1.9 s a step encoding 12 crops, most of it in
    the VAE), and the targets are what the decoder meets at inference, latents of whole frames."""
    clips = ClipSet(cfg.data, "train")
    mix = ClipSet(cfg.mix_data, "train") if cfg.mix_data else None
    cached = CachedTargets(cfg, clips) if cfg.latents else None
    vae = None if cached and mix is None else load_vae(cfg.vae_run)
    codec = tiny.build(tiny.CONFIGS[cfg.tiny])
    genc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[cfg.gbuffer_encoder])
    start_from("codecs stage", cfg, {"tiny": codec, "gbuffer_encoder": genc}, log)
    params = list(codec.parameters()) + list(genc.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    log.info("tiny codec %s (%.2fM), G-buffer encoder %s (%.2fM)", cfg.tiny, sum(p.numel() for p in codec.parameters()) / 1e6,
             cfg.gbuffer_encoder, sum(p.numel() for p in genc.parameters()) / 1e6)

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        k = int(torch.rand(1, generator=g) < cfg.mix_rate) if cfg.mix_rate else 0  # drawn only when mixing
        if cached and not k:
            gb, rgb, z_rgb, z_gb, _ = cached.sample(g, cfg.batch, cfg.crop)
        else:
            gb, rgb, _ = sample_clips(mix if k else clips, g, cfg.batch, cfg.frames, cfg.crop)
            with torch.no_grad(), autocast():
                z_rgb = vae.encode(to_video(rgb), chunk=None).float()
                z_gb = vae_gbuffer_latents(vae, gb)
        target = rgb.permute(0, 1, 4, 2, 3).float() / 255  # NTCHW [0, 1]
        with autocast():
            frames = tiny_decode(codec, z_rgb).float()
            # TAEHV groups frames 0-3, 4-7, ...: the clip's last frame is repeated to fill the last group
            pad = target[:, -1:].expand(-1, 3, -1, -1, -1)
            z_tiny = tiny_encode(codec, torch.cat([target, pad], 1)).float()
            z_gb_hat = gbuffer_encoder_latents(genc, gb).float()
        dec = F.l1_loss(frames, target) + F.mse_loss(frames, target)
        enc = F.mse_loss(z_tiny, z_rgb)
        gbl = F.mse_loss(z_gb_hat, z_gb)
        loss = dec + enc + gbl
        losses = {"dec": dec.item(), "enc": enc.item(), "gbuf": gbl.item()}
        if cfg.mix_rate:
            losses["mix"] = k
        loss = add_frame_terms(loss, losses, frames, target, time_dim=1, channel_dim=2,  # (B, T, C, H, W)
                               motion=cfg.motion_weight, boundary=cfg.boundary_weight)
        descend(opt, loss, params)
        return losses

    return train_loop(cfg, {"tiny": codec, "gbuffer_encoder": genc}, {"opt_codecs": opt}, step, log, progress,
                      extra={"tiny": cfg.tiny, "gbuffer_encoder": cfg.gbuffer_encoder})
