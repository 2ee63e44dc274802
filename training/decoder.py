"""Stage c2: the tiny decoder adapted to the student's latents.

`train decoder`: the distilled tiny decoder learned to turn the VAE's latents into frames, but at
render time it reads the student's latents, which carry the student's own errors (a colour cast
that grows along the stream, softer detail). This stage renders every training clip under every
preset once with the student, streaming exactly as KVCacheSampler does (student.rollout, a random
training wording per clip and preset), caches those latents, and trains the decoder on aligned
crops of them against the ground-truth pixels with the codecs stage's decoder loss (L1 + MSE,
motion and boundary terms). The G-buffer encoder is carried over unchanged, so the output folder
is a codecs run that `train export` takes as `codecs_run`. The decoder is then the student's:
adapt it again after retraining the student.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..model_zoo.codecs import gbuffer_encoder, tiny
from ..model_zoo.errors import AlayaError
from .codecs import add_frame_terms, tiny_decode
from .common import (StageConfig, autocast, check_mix, check_pair_weight, descend, final_weights, latest_checkpoint,
                     step_generator, train_loop)
from .data import ClipSet
from .latent_data import LatentSet, checkpoint_step, nearest_presets, selected_windows


@dataclass(frozen=True)
class DecoderStageConfig(StageConfig):
    out: str = "runs/decoder"
    student_run: str = "runs/student-rollout"  # the student whose latents the decoder learns to read
    latents: str = "runs/student-rollout/latents-train.safetensors"  # whole-clip cache of student-rollout
    codecs_run: str = "runs/codecs"  # the decoder to start from and the G-buffer encoder to carry over
    crop: int = 40  # square pixel crop, a multiple of 8
    chunk_frames: int = 1  # the student's streaming settings (export.json)
    window_frames: int = 6
    sink_frames: int = 1
    lr: float = 3e-4
    motion_weight: float = 1.0
    boundary_weight: float = 2.0
    chroma_weight: float = 0.0  # weight of chroma_loss (hue with brightness taken out; codecs.py)
    # > 0: half the batch is the other half's clips and crops under their nearest preset (by the
    # ground-truth latents), and the change between the two decodes is fitted to the ground truth's
    pair_weight: float = 0.0
    # a second whole-clip cache (student-rollout's latents-mix.safetensors: another world) whose clips
    # make up the batch of a mix_rate share of the steps, so the decoder keeps that world too
    mix_latents: str = ""
    mix_rate: float = 0.0

    def validate(self):
        if self.crop % 8 or self.crop <= 0:
            raise AlayaError(f"decoder stage: crop {self.crop} must be a positive multiple of 8")
        check_mix("decoder stage", self.mix_latents, self.mix_rate)
        check_pair_weight("decoder stage", self.pair_weight, self.batch)
        if self.motion_weight < 0 or self.boundary_weight < 0 or self.chroma_weight < 0:
            raise AlayaError(f"decoder stage: motion_weight {self.motion_weight}, boundary_weight "
                             f"{self.boundary_weight} and chroma_weight {self.chroma_weight} must be >= 0")


@torch.no_grad()
def student_renders(cfg: DecoderStageConfig, data: LatentSet, latents: str, name: str, log) -> torch.Tensor:
    """The student's streamed latents of every clip of the cache `latents` under every preset,
    (N, P, 16, T', h, w); cached in out/`name`, made again when the student or the settings changed."""
    from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors
    from .student import rollout, student_sigmas
    from .teacher import load_dit

    path = Path(cfg.out) / name
    recipe = {"student_run": cfg.student_run, "student_step": checkpoint_step(cfg.student_run), "latents": latents,
              "seed": cfg.seed, "chunk_frames": cfg.chunk_frames, "window_frames": cfg.window_frames,
              "sink_frames": cfg.sink_frames}
    if path.is_file() and json.loads(read_metadata(path).get("recipe", "{}")) == recipe:
        return read_state_dict(path)["renders"]
    student = load_dit(cfg.student_run).eval()
    g = torch.Generator().manual_seed(cfg.seed)
    n, p = data.rgb.shape[:2]
    wording = torch.randint(data.wordings("train"), (n, p), generator=g)
    out = torch.empty_like(data.rgb)
    for q in range(p):
        for a in range(0, n, 8):
            idx = range(a, min(a + 8, n))
            prompt = torch.stack([data.embedding(q, "train", int(wording[i, q])) for i in idx])
            out[a:idx.stop, q] = rollout(student, data.cond[a:idx.stop], prompt, cfg.chunk_frames, len(student_sigmas()) - 1,
                                         g, cfg.window_frames, cfg.sink_frames, finish=True)
        log.info("student renders: preset %d/%d", q + 1, p)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors({"renders": out}, path, {"recipe": recipe})
    return out


@dataclass
class _Source:
    """One whole-clip cache with what the decoder reads beside it: the student's renders of its clips
    and the clips' ground-truth pixels."""

    clips: ClipSet
    windows: list
    frames: int
    renders: torch.Tensor
    nearest: torch.Tensor | None


def _source(cfg: DecoderStageConfig, latents: str, name: str, log) -> _Source:
    from ..model_zoo.loading import read_metadata

    path = Path(latents)
    if not path.is_file():
        raise AlayaError(f"{path}: whole-clip latent cache not found; run `alaya-flash train student-rollout` first")
    recipe = json.loads(read_metadata(path)["recipe"])
    data = LatentSet(path)
    clips = ClipSet(recipe["data"], "train")
    windows = selected_windows(clips, recipe["frames"], recipe.get("max_windows", 0))
    if len(windows) != len(data):
        raise AlayaError(f"{path}: {len(data)} windows, the dataset {recipe['data']} has {len(windows)}")
    return _Source(clips, windows, recipe["frames"], student_renders(cfg, data, latents, name, log),
                   nearest_presets(data.rgb) if cfg.pair_weight else None)


def run_decoder(cfg: DecoderStageConfig, log, progress=None) -> int:
    from ..model_zoo.loading import load_strict, read_metadata

    sources = [_source(cfg, cfg.latents, "renders.safetensors", log)]
    if cfg.mix_latents:
        sources.append(_source(cfg, cfg.mix_latents, "renders-mix.safetensors", log))
    ckpt = latest_checkpoint(Path(cfg.codecs_run))
    if ckpt is None:
        raise AlayaError(f"{cfg.codecs_run}: no checkpoint here; run `alaya-flash train codecs` first")
    names = json.loads(read_metadata(ckpt)["extra"])
    codec = tiny.build(tiny.CONFIGS[names["tiny"]])
    genc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[names["gbuffer_encoder"]]).requires_grad_(False)
    if latest_checkpoint(Path(cfg.out)) is None:  # a fresh run starts from the codecs' weights
        load_strict(codec, final_weights(Path(cfg.codecs_run), "tiny"))
        load_strict(genc, final_weights(Path(cfg.codecs_run), "gbuffer_encoder"))
    opt = torch.optim.AdamW(codec.decoder.parameters(), lr=cfg.lr, weight_decay=0.0)
    k = cfg.crop // 8

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        src = sources[int(torch.rand(1, generator=g) < cfg.mix_rate) if cfg.mix_rate else 0]  # drawn only when mixing
        n, p = src.renders.shape[:2]
        h, w = src.clips.rgb.shape[3:5]
        nearest, frames = src.nearest, src.frames
        picks = []
        for _ in range(cfg.batch // 2 if nearest is not None else cfg.batch):
            c, q = int(torch.randint(n, (1,), generator=g)), int(torch.randint(p, (1,), generator=g))
            y, x = int(torch.randint(h // 8 - k + 1, (1,), generator=g)), int(torch.randint(w // 8 - k + 1, (1,), generator=g))
            picks.append((c, q, y, x))
        if nearest is not None:
            picks += [(c, int(nearest[c, q]), y, x) for c, q, y, x in picks]
        z, rgb = [], []
        for c, q, y, x in picks:
            clip, start = src.windows[c]
            z.append(src.renders[c, q, :, :, y:y + k, x:x + k])
            rgb.append(src.clips.rgb[clip, q, start:start + frames, 8 * y:8 * (y + k), 8 * x:8 * (x + k)])
        target = torch.from_numpy(np.stack(rgb)).permute(0, 1, 4, 2, 3).float() / 255  # NTCHW [0, 1]
        with autocast():
            out = tiny_decode(codec, torch.stack(z).float()).float()[:, :frames]
        loss = F.l1_loss(out, target) + F.mse_loss(out, target)
        losses = {"dec": loss.item()}
        loss = add_frame_terms(loss, losses, out, target, time_dim=1, channel_dim=2,  # (B, T, C, H, W)
                               motion=cfg.motion_weight, boundary=cfg.boundary_weight, chroma=cfg.chroma_weight)
        if nearest is not None:
            (oa, ob), (ta, tb) = out.chunk(2), target.chunk(2)
            pair = F.l1_loss(oa - ob, ta - tb) + F.mse_loss(oa - ob, ta - tb)
            loss = loss + cfg.pair_weight * pair
            losses["pair"] = pair.item()
        descend(opt, loss, codec.decoder.parameters())
        return losses

    return train_loop(cfg, {"tiny": codec, "gbuffer_encoder": genc}, {"opt_decoder": opt}, step, log, progress,
                      extra={"tiny": names["tiny"], "gbuffer_encoder": names["gbuffer_encoder"]})
