"""Stage c: the few-step block-causal student, distilled from the teacher.

`train student-ode` (CausVid / Self-Forcing ODE initialisation, research streaming.md §1.8 A):
the student starts as a copy of the teacher. Teacher PF-ODE trajectories (Euler, shift 5, CFG)
are generated once for `pairs` training samples, keeping the states at the student's few-step
sigmas (1, 0.9375, 0.8333, 0.625: on the teacher's grid when ode_steps is a multiple of 4) and
the clean endpoint. Per chunk a random stored state is the input, all chunks in one
block-causal pass; loss: MSE of the x0 prediction against the endpoint.

`train student-dmd` (Self-Forcing, §1.8 B): the student renders whole windows chunk by chunk with
the rolling KV cache exactly as KVCacheSampler does (few-step x0 loop, clean pass at t=0 into the
cache), with gradients only at one random exit step shared by all chunks; the cache refresh runs
without gradients. Distribution matching on the output x: x_t at a random shifted sigma,
real x0 = teacher with CFG, fake x0 = critic (initialised as a copy of the teacher),
g = (fake - real) / mean|x - real|, loss 0.5 * MSE(x, sg(x - g)). The critic learns the
student's distribution with flow matching on every rollout; the generator steps every
`gen_every` iterations. AdamW betas (0, 0.999) as in Self-Forcing.

`train student-rollout`: the same self-rollout over whole clips, every step of every chunk run
as at inference, regressed onto the ground-truth latents (run_rollout).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..model_zoo import dit
from ..model_zoo.errors import AlayaError
from ..model_zoo.text_encoder import MINILM
from ..streaming.render import kv_cache_sampler, sampler, teacher_sampler
from .common import (StageConfig, autocast, check_caption_rate, check_mix, check_pair_weight, check_text_encoder, descend,
                     step_generator, train_loop)
from .latent_data import LatentSet, nearest_presets, perturb_prompts
from .teacher import flow_loss, load_dit


@dataclass(frozen=True)
class ODEStageConfig(StageConfig):
    out: str = "runs/student-ode"
    teacher_run: str = "runs/teacher"
    pairs: int = 64  # teacher trajectories generated (once, cached in out/)
    ode_steps: int = 16  # teacher Euler steps per trajectory (a multiple of the student's 4)
    ode_cfg: float = 3.0
    codecs_run: str = ""  # set: the student conditions on this distilled G-buffer encoder (see student_cond)
    chunk_frames: int = 2  # latent frames per streaming chunk
    lr: float = 5e-5
    rope_offset_max: int = 8
    data_weight: float = 0.0  # weight of the ground-truth term (see run_ode); 0 = pure ODE regression
    clean_context: float = 0.0  # share of samples whose first chunks are clean context (see run_ode)
    text_noise: float = 0.0  # prompt embedding noise in both terms (latent_data.perturb_prompts)

    def validate(self):
        if self.data_weight < 0:
            raise AlayaError(f"student-ode: data_weight {self.data_weight} must be >= 0")
        if self.text_noise < 0:
            raise AlayaError(f"student-ode: text_noise {self.text_noise} must be >= 0")
        if not 0 <= self.clean_context <= 1:
            raise AlayaError(f"student-ode: clean_context {self.clean_context} must be in [0, 1]")
        if self.ode_steps % len(sampler.FEW_STEP_NOMINAL):
            raise AlayaError(f"student-ode: ode_steps {self.ode_steps} must be a multiple of {len(sampler.FEW_STEP_NOMINAL)}")


@dataclass(frozen=True)
class DMDStageConfig(StageConfig):
    out: str = "runs/student-dmd"
    teacher_run: str = "runs/teacher"
    student_run: str = "runs/student-ode"
    codecs_run: str = ""  # as in ODEStageConfig
    chunk_frames: int = 2
    real_cfg: float = 3.0  # teacher guidance in the real score (uncond + w (cond - uncond))
    gen_every: int = 5  # generator step every N critic steps
    lr: float = 2e-6  # generator
    critic_lr: float = 4e-6
    min_sigma: float = 0.02
    max_sigma: float = 0.98
    dmd_shift: float = 5.0


def student_sigmas() -> list[float]:
    return [float(t) / 1000 for t in sampler.warped_timesteps()]


@torch.no_grad()
def teacher_trajectory(teacher: dit.WanDiT, noise: torch.Tensor, cond: torch.Tensor, prompt: torch.Tensor,
                       negative: torch.Tensor, steps: int, cfg_scale: float) -> torch.Tensor:
    """Teacher Euler (shift 5, CFG) from noise; returns (B, K + 1, C, T, h, w): states at the student's sigmas, then x0."""
    knots = student_sigmas()
    kept: dict[int, torch.Tensor] = {}
    guided = teacher_sampler.guided_velocity(teacher, cond, prompt, negative, cfg_scale, batched=True)

    def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
        for k, s in enumerate(knots):
            if abs(s - sigma) < 1e-6:
                kept[k] = x.clone()
        with autocast():
            return guided(x, sigma)

    x0 = sampler.sample_euler(velocity, noise, sampler.teacher_sigmas(steps, sampler.FEW_STEP_SHIFT))
    if len(kept) != len(knots):
        raise AlayaError(f"teacher trajectory: only {len(kept)} of the {len(knots)} student sigmas are on the teacher grid")
    return torch.stack([kept[k] for k in range(len(knots))] + [x0], 1)


def make_trajectories(cfg: ODEStageConfig, teacher: dit.WanDiT, data: LatentSet, log) -> dict[str, torch.Tensor]:
    """Generate (or read back) the ODE pairs: states (N, K+1, 16, T', h, w), window, preset, wording."""
    import json

    from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors
    from .latent_data import checkpoint_step

    path = Path(cfg.out) / "trajectories.safetensors"
    # what the pairs depend on: a retrained teacher or new wordings make a file on disk stale
    recipe = {"pairs": cfg.pairs, "ode_steps": cfg.ode_steps, "ode_cfg": cfg.ode_cfg, "seed": cfg.seed,
              "teacher_step": checkpoint_step(cfg.teacher_run), "wordings": data.wordings("train")}
    if path.is_file() and json.loads(read_metadata(path).get("recipe", "{}")) == recipe:
        return read_state_dict(path)
    g = torch.Generator().manual_seed(cfg.seed)
    n, p = data.rgb.shape[:2]
    wi = torch.randint(n, (cfg.pairs,), generator=g)
    pi = torch.randint(p, (cfg.pairs,), generator=g)
    wo = torch.randint(data.wordings("train"), (cfg.pairs,), generator=g)
    states = []
    teacher.eval()
    for a in range(0, cfg.pairs, 8):
        sl = slice(a, min(a + 8, cfg.pairs))
        cond = data.cond[wi[sl]]
        prompt = torch.stack([data.embedding(int(q), "train", int(w)) for q, w in zip(pi[sl], wo[sl])])
        noise = torch.randn((cond.shape[0], 16, *cond.shape[2:]), generator=g)
        states.append(teacher_trajectory(teacher, noise, cond, prompt, data.negative[None], cfg.ode_steps, cfg.ode_cfg))
        log.info("teacher trajectories %d/%d", sl.stop, cfg.pairs)
    out = {"states": torch.cat(states), "window": wi, "preset": pi, "wording": wo}
    save_safetensors(out, path, {"recipe": recipe})
    return out


def _data(teacher_run: str) -> LatentSet:
    path = Path(teacher_run) / "latents-train.safetensors"
    if not path.is_file():
        raise AlayaError(f"{path}: missing; run `alaya-flash train teacher` first")
    return LatentSet(path)


def student_cond(cfg: ODEStageConfig | DMDStageConfig, data: LatentSet, log) -> torch.Tensor:
    """The G-buffer latents the student trains on, (N, 80, T', h, w) for the teacher file's windows.

    The teacher conditions on what it was trained with (the VAE's latents of each pass, in the
    original recipe); the streaming student sees the distilled 5-branch encoder's latents, so with
    cfg.codecs_run set it is trained on exactly those (encoded once, cached in cfg.out), while
    every teacher and critic call in its losses keeps the teacher's conditioning.
    """
    import json

    from ..model_zoo.loading import read_metadata
    from .latent_data import encode_split

    if not cfg.codecs_run:
        return data.cond
    recipe = json.loads(read_metadata(Path(cfg.teacher_run) / "latents-train.safetensors")["recipe"])
    if recipe["cond_encoder"] == "distilled" and recipe["codecs_run"] == cfg.codecs_run:
        return data.cond
    out = Path(cfg.out) / "latents-student.safetensors"
    earlier = Path(getattr(cfg, "student_run", "") or cfg.out) / out.name
    if not out.is_file() and earlier.is_file() and earlier != out:
        # the ODE stage's copy (encode_split re-encodes it here if it was made with another recipe)
        import shutil

        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(earlier, out)
    path = encode_split(recipe["data"], recipe["split"], recipe["frames"], recipe["vae_run"], cfg.codecs_run, "distilled",
                        out, log, recipe["max_windows"], recipe["size"], with_rgb=False)
    cond = LatentSet(path).cond
    if cond.shape != data.cond.shape:
        raise AlayaError(f"{path}: conditioning {tuple(cond.shape)} does not match the teacher's {tuple(data.cond.shape)}")
    return cond


def chunk_knots(g: torch.Generator, b: int, t: int, chunk_frames: int, clean: int, clean_context: float) -> torch.Tensor:
    """(B, T) knot indices: one random student step (0 .. clean - 1) per chunk of chunk_frames latent
    frames; in a clean_context share of the samples the chunks before a random one are clean (index
    `clean`), the last chunk never."""
    chunks = -(-t // chunk_frames)
    pick = torch.randint(clean, (b, chunks), generator=g)
    if clean_context and chunks > 1:
        cut = torch.randint(1, chunks, (b, 1), generator=g)
        prefix = (torch.rand(b, 1, generator=g) < clean_context) & (torch.arange(chunks)[None] < cut)
        pick = pick.masked_fill(prefix, clean)
    return pick.repeat_interleave(chunk_frames, 1)[:, :t]


def run_ode(cfg: ODEStageConfig, log, progress=None) -> int:
    """ODE regression on teacher trajectories, plus (data_weight > 0) the same few-step regression on
    the data: ground-truth latents noised to the student's sigmas, x0 against the clean latents.

    The data term is there because a briefly trained small teacher is the student's ceiling under
    pure ODE regression; the physics world's frames are a near-deterministic function of the
    G-buffers and the preset, so the student can learn them from the data directly. The teacher's
    trajectories keep it on the teacher's few-step paths (and the DMD stage after it).

    In one block-causal pass every chunk sits at its own random sigma, so a chunk learns to attend
    to noisy past chunks, while at inference the KV cache holds the past at t = 0 (the clean pass).
    With clean_context > 0 that share of samples has a random number of leading chunks replaced by
    their clean endpoint at sigma 0, the cache's view; the loss counts only the noisy chunks.
    """
    data = _data(cfg.teacher_run)
    scond = student_cond(cfg, data, log)
    teacher = load_dit(cfg.teacher_run).requires_grad_(False)
    traj = make_trajectories(cfg, teacher, data, log)
    student = copy.deepcopy(teacher).requires_grad_(True)
    del teacher
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    knots = torch.tensor(student_sigmas() + [0.0])  # the student's steps, then the clean endpoint (index k_noisy)
    states = traj["states"]
    k_noisy = states.shape[1] - 1

    def x0_loss(x: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor, prompt: torch.Tensor, target: torch.Tensor,
                offset: int) -> torch.Tensor:
        """One block-causal pass: x (B, C, T, h, w) at per-frame sigma (B, T) -> MSE of its x0 against
        target over the noisy frames (a clean frame is its own x0: nothing to learn there)."""
        with autocast():
            v = student(torch.cat([x, cond], 1), 1000 * sigma, prompt, chunk_frames=cfg.chunk_frames,
                        start_frame=offset).float()
        err = (x - sigma[:, None, :, None, None] * v - target).pow(2).mean(dim=(1, 3, 4))  # (B, T)
        noisy = (sigma > 0).float()
        return (err * noisy).sum() / noisy.sum()

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        idx = torch.randint(states.shape[0], (cfg.batch,), generator=g)
        s = states[idx]  # (B, K+1, C, T, h, w)
        b, _, c, t = s.shape[:4]
        pick = chunk_knots(g, b, t, cfg.chunk_frames, k_noisy, cfg.clean_context)
        x = s[torch.arange(b)[:, None], pick, :, torch.arange(t)[None, :]].permute(0, 2, 1, 3, 4)  # (B, C, T, h, w)
        cond = scond[traj["window"][idx]]
        prompt = torch.stack([data.embedding(int(q), "train", int(w)) for q, w in zip(traj["preset"][idx], traj["wording"][idx])])
        if cfg.text_noise:
            prompt = perturb_prompts(prompt, cfg.text_noise, g)
        offset = int(torch.randint(cfg.rope_offset_max + 1, (1,), generator=g))
        ode = x0_loss(x, knots[pick], cond, prompt, s[:, -1], offset)
        out = {"ode": ode.item()}
        loss = ode
        if cfg.data_weight:
            x0, _, prompt, (wi, _) = data.sample(g, cfg.batch, text_noise=cfg.text_noise)
            sigma = knots[chunk_knots(g, x0.shape[0], x0.shape[2], cfg.chunk_frames, k_noisy, cfg.clean_context)]
            noisy = sampler.add_noise(x0, torch.randn(x0.shape, generator=g), sigma[:, None, :, None, None])
            real = x0_loss(noisy, sigma, scond[wi], prompt, x0, offset)
            loss = loss + cfg.data_weight * real
            out["data"] = real.item()
        descend(opt, loss, student.parameters())
        return out

    return train_loop(cfg, {"dit": student}, {"opt_dit": opt}, step, log, progress,
                      extra={"dit_config": asdict(student.config), "chunk_frames": cfg.chunk_frames})


def rollout(student: dit.WanDiT, cond: torch.Tensor, prompt: torch.Tensor, chunk_frames: int, exit_step: int,
            g: torch.Generator, window_frames: int = 0, sink_frames: int = 0, finish: bool = False) -> torch.Tensor:
    """Self-rollout of a window with the rolling KV cache (KVCacheSampler's loop), gradients only at exit_step.

    cond (B, 80, T, h, w), prompt (B, 1, text_dim) -> x0 (B, 16, T, h, w), each chunk's x0 at exit_step.
    window_frames / sink_frames: the cache's (0: the whole window, no sink). finish: the chunk's
    remaining steps still run (without gradients) and the cache gets its final x0, as at inference;
    otherwise the exit step's x0 is the chunk's output (Self-Forcing's random-exit rollout).
    """
    sigmas = student_sigmas()
    b, _, t, h, w = cond.shape
    cache = student.new_cache(b, h, w, window_frames=window_frames or t, sink_frames=sink_frames)
    with torch.no_grad():
        ctx = student.prepare_prompt(prompt)  # cross-attention K/V without gradients ...
    live_ctx = student.prepare_prompt(prompt) if torch.is_grad_enabled() else ctx  # ... and with, for the exit step
    outs = []
    for start in range(0, t, chunk_frames):
        c = cond[:, :, start:start + chunk_frames]
        shape = (b, student.config.out_dim, c.shape[2], h, w)
        velocity = kv_cache_sampler.chunk_velocity(student, c, ctx, cache, start)
        out, step = [], iter(range(len(sigmas)))

        def denoise(x: torch.Tensor, sigma: float) -> torch.Tensor:
            i = next(step)
            grad = i == exit_step and torch.is_grad_enabled()
            with torch.set_grad_enabled(grad), autocast():
                x0 = x - sigma * velocity(x, sigma, prompt=live_ctx if grad else ctx).float()
            if i == exit_step:
                out.append(x0)
            return x0

        def chunk_velocity(x: torch.Tensor, sigma: float, prompt=ctx) -> torch.Tensor:
            with autocast():
                return velocity(x, sigma, prompt)

        kv_cache_sampler.sample_chunk(chunk_velocity, lambda: torch.randn(shape, generator=g),
                             sigmas[: len(sigmas) if finish else exit_step + 1], denoise=denoise)
        outs.append(out[0])
    return torch.cat(outs, 2)


def dmd_loss(x: torch.Tensor, teacher: dit.WanDiT, critic: dit.WanDiT, cond: torch.Tensor, prompt: torch.Tensor,
             negative: torch.Tensor, cfg: DMDStageConfig, g: torch.Generator) -> torch.Tensor:
    """Self-Forcing's distribution-matching loss on a rollout x (B, 16, T, h, w)."""
    b = x.shape[0]
    u = torch.rand(b, generator=g)
    sigma = sampler.shift_sigma(u, cfg.dmd_shift).clamp(cfg.min_sigma, cfg.max_sigma)
    s = sigma.view(b, 1, 1, 1, 1)
    noise = torch.randn(x.shape, generator=g)
    with torch.no_grad():
        xt = (1 - s) * x.detach() + s * noise
        inp, t = torch.cat([xt, cond], 1), 1000 * sigma
        with autocast():
            v = teacher(torch.cat([inp, inp]), torch.cat([t, t]), torch.cat([prompt, negative.expand(b, -1, -1)])).float()
            v_fake = critic(inp, t, prompt).float()
        real = xt - s * sampler.cfg_combine(v[:b], v[b:], cfg.real_cfg)
        fake = xt - s * v_fake
        grad = (fake - real) / (x.detach() - real).abs().mean(dim=(1, 2, 3, 4), keepdim=True).clamp_min(1e-6)
    xd = x.double()
    return 0.5 * F.mse_loss(xd, (xd - grad.double()).detach())


def run_dmd(cfg: DMDStageConfig, log, progress=None) -> int:
    data = _data(cfg.teacher_run)
    scond = student_cond(cfg, data, log)
    teacher = load_dit(cfg.teacher_run).requires_grad_(False).eval()
    student = load_dit(cfg.student_run)
    critic = copy.deepcopy(teacher).requires_grad_(True)
    opt_g = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.0, 0.999))
    opt_c = torch.optim.AdamW(critic.parameters(), lr=cfg.critic_lr, weight_decay=0.01, betas=(0.0, 0.999))
    n_steps = len(student_sigmas())

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        _, cond, prompt, (wi, _) = data.sample(g, cfg.batch)
        gen_step = i % cfg.gen_every == 0
        exit_step = int(torch.randint(n_steps, (1,), generator=g))
        out = {}
        with torch.set_grad_enabled(gen_step):
            x = rollout(student, scond[wi], prompt, cfg.chunk_frames, exit_step, g)
        if gen_step:
            loss = dmd_loss(x, teacher, critic, cond, prompt, data.negative[None], cfg, g)
            descend(opt_g, loss, student.parameters(), 10.0)
            out["dmd"] = loss.item()
        closs = flow_loss(critic, x.detach(), cond, prompt, g, cfg.dmd_shift)
        descend(opt_c, closs, critic.parameters(), 10.0)
        out["critic"] = closs.item()
        return out

    return train_loop(cfg, {"dit": student, "critic": critic}, {"opt_dit": opt_g, "opt_critic": opt_c}, step, log,
                      progress, extra={"dit_config": asdict(student.config), "chunk_frames": cfg.chunk_frames})


@dataclass(frozen=True)
class RolloutStageConfig(StageConfig):
    out: str = "runs/student-rollout"
    student_run: str = "runs/student-ode"  # the student to continue (student-ode or student-dmd folder)
    vae_run: str = "runs/vae"  # ground-truth latents of whole clips (encoded once, cached in out/)
    codecs_run: str = "runs/codecs"  # the distilled G-buffer encoder the student streams with
    frames: int = 25  # pixel frames per window (4k + 1): whole clips, as the evaluation streams them
    max_windows: int = 0
    chunk_frames: int = 1
    window_frames: int = 6  # the rolling cache of the shipped model (export.json)
    sink_frames: int = 1
    lr: float = 1e-5
    # > 0: the batch comes in pairs, one clip under a preset and under the preset whose ground truth
    # is nearest to it, and the change between the two renders is regressed onto the ground truth's
    pair_weight: float = 0.0
    caption_rate: float = 0.0  # share of prompts that are the clip's caption (world v2: names the sun's side)
    # a second dataset (another world) whose clips make up the batch of a mix_rate share of the steps, so
    # a student fine-tuned on a new world keeps the old one (cached in out/latents-mix.safetensors)
    mix_data: str = ""
    mix_rate: float = 0.0
    mix_max_windows: int = 0
    # the prompt context: "all-minilm-l6-v2+tokens" adds the word tokens after the sentence embedding,
    # so the DiT can read words the pooled embedding nearly merges (the sun's side); export writes it
    text_encoder: str = MINILM
    # side pairs: a copy of `data`'s first clips rendered with the sun on the other side (data's sun
    # "opposite"); a side_rate share of the steps take a clip and preset from both, each read with its
    # own caption, and the change between the two renders is fitted to the truths' with side_weight
    side_data: str = ""
    side_rate: float = 0.0
    side_weight: float = 1.0
    # > the student's block count: it continues with this many blocks, the new ones starting as
    # identities (grow_blocks), so a trained student gains depth without retraining from nothing
    layers: int = 0
    # the student reads the shading prior's image through the G-buffer encoder's sixth branch
    # (training/light_reading.py); a light-reading student_run continues so without it
    reads_light: bool = False
    # shares of a light-reading student's windows whose prior is shaded under the light head's reading of the
    # prompt (as `--light prompt` renders), and of the others with the recorded shadows (an engine's shadow pass)
    prompt_light_rate: float = 0.0
    shadow_pass_rate: float = 0.0
    # the learning rate of the DiT's input columns that read the prior's channels (0: lr): they start at zero,
    # and at the rest's rate they stayed small (norm 0.25 against 12.2 after 1,200 steps at 5e-5)
    light_lr: float = 0.0

    def validate(self):
        if (self.frames - 1) % 4 or self.frames < 5:
            raise AlayaError(f"student-rollout: frames {self.frames} must be 4k + 1 and at least 5")
        if self.layers < 0:
            raise AlayaError(f"student-rollout: layers {self.layers} must be 0 (the student's own) or a block count")
        check_mix("student-rollout", self.mix_data, self.mix_rate)
        check_text_encoder("student-rollout", self.text_encoder)
        check_mix("student-rollout (side pairs)", self.side_data, self.side_rate)
        if self.side_rate and (self.batch % 2 or self.side_weight < 0):
            raise AlayaError(f"student-rollout: side pairs need an even batch (got {self.batch}) and side_weight >= 0 "
                             f"(got {self.side_weight})")
        check_pair_weight("student-rollout", self.pair_weight, self.batch)
        check_caption_rate("student-rollout", self.caption_rate)
        if self.caption_rate and self.pair_weight:
            raise AlayaError("student-rollout: caption_rate and pair_weight do not go together (pairs take preset wordings)")
        if self.window_frames < self.chunk_frames or self.sink_frames < 0:
            raise AlayaError(f"student-rollout: window_frames {self.window_frames} must hold a chunk "
                             f"({self.chunk_frames}) and sink_frames {self.sink_frames} be >= 0")
        if self.light_lr < 0:
            raise AlayaError(f"student-rollout: light_lr {self.light_lr} must be >= 0 (0: lr)")
        for name in ("prompt_light_rate", "shadow_pass_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise AlayaError(f"student-rollout: {name} {getattr(self, name)} must be in [0, 1]")
        if self.reads_light and (self.pair_weight or self.side_rate):
            raise AlayaError("student-rollout: reads_light does not go with pair_weight or side_rate (their pairs "
                             "share one conditioning, and a light-reading one differs by preset)")


def sample_pairs(data: LatentSet, nearest: torch.Tensor, g: torch.Generator, pairs: int):
    """2 x pairs samples: a random clip, preset and training wording each, then the same clips under
    their nearest other preset (random wordings); x0, cond, prompt as LatentSet.sample returns them."""
    x0, cond, prompt, (wi, pi) = data.sample(g, pairs)
    qi = nearest[wi, pi]
    wo = torch.randint(data.wordings("train"), (pairs,), generator=g)
    other = torch.stack([data.embedding(int(q), "train", int(w)) for q, w in zip(qi, wo)])
    return torch.cat([x0, data.rgb[wi, qi]]), torch.cat([cond, cond]), torch.cat([prompt, other])


class SidePairs:
    """A dataset's clips (`data`) beside the same clips with the sun on the other side (`other`): the
    G-buffers, hence the conditioning, are the same; the truths and the captions differ in the side."""

    def __init__(self, data: LatentSet, other: LatentSet, where: str):
        n = len(other)
        if data.captions is None or other.captions is None or data.presets != other.presets or n > len(data):
            raise AlayaError(f"student-rollout: side_data {where} must be world v2 clips under data's presets, "
                             f"no more clips than data has")
        if not torch.equal(data.cond[:n], other.cond):
            raise AlayaError(f"student-rollout: side_data {where}: its clips' G-buffers are not data's first {n} "
                             "(render it with data's config and seeds, sun 'opposite')")
        self.data, self.other = data, other
        # (clip, preset) whose captions differ: the presets that name a side
        self.pairs = [(w, p) for w in range(n) for p in range(len(data.presets))
                      if not torch.equal(data.captions[w, p], other.captions[w, p])]
        if not self.pairs:
            raise AlayaError(f"student-rollout: side_data {where}: no caption differs from data's; is its sun 'opposite'?")

    def sample(self, g: torch.Generator, pairs: int):
        """2 x pairs samples: clips and presets under data's side, then the same under the other side."""
        pick = [self.pairs[int(i)] for i in torch.randint(len(self.pairs), (pairs,), generator=g)]
        w, p = (torch.tensor(x) for x in zip(*pick))
        x0 = torch.cat([self.data.rgb[w, p], self.other.rgb[w, p]])
        prompt = torch.cat([self.data.captions[w, p], self.other.captions[w, p]])
        return x0, torch.cat([self.data.cond[w], self.data.cond[w]]), prompt


# a block's writes to the residual stream: zeroed, the block is the identity
BLOCK_OUTPUTS = {f"{m}.{p}" for m in ("self_attn.o", "cross_attn.o", "ffn.2") for p in ("weight", "bias")}


def grow_blocks(model: dit.WanDiT, layers: int, where: str = "student") -> dit.WanDiT:
    """`model` with `layers` blocks that computes exactly what it does. Each new block is a copy of
    an old one placed right after it (new block j copies old block j * old // new_count, so new
    blocks spread evenly through the stack) with its three output projections zeroed: self-
    attention, cross-attention and FFN add nothing to the residual stream until training moves
    them, while their inputs (q, k, v, FFN) start from trained weights."""
    old = model.config.num_layers
    if layers < old:
        raise AlayaError(f"{where}: layers {layers} is fewer than its {old} blocks; blocks are only added")
    extra = layers - old
    after = [j * old // extra for j in range(extra)]  # the old block each new one copies and follows
    grown = dit.build(replace(model.config, num_layers=layers)).to(next(model.parameters()).dtype)
    order = []  # (source block, zeroed) for each block of the grown stack
    for i in range(old):
        order += [(i, False)] + [(i, True)] * after.count(i)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}
    for new, (src, zeroed) in enumerate(order):
        for name, value in model.blocks[src].state_dict().items():
            state[f"blocks.{new}.{name}"] = torch.zeros_like(value) if zeroed and name in BLOCK_OUTPUTS else value.clone()
    grown.load_state_dict(state, strict=True)
    return grown


def run_rollout(cfg: RolloutStageConfig, log, progress=None) -> int:
    """Self-rollout regression onto the ground truth, over whole clips.

    Trained on 3-latent windows with clean or teacher-forced pasts, the student drifts along a
    stream: its later chunks read its own imperfect past, which it never saw (exposure bias; the
    default's PSNR fell ~1.7 dB from latent 0 to latent 6 and its colour cast grew). Here it renders
    each clip exactly as KVCacheSampler does (4 steps per chunk, fresh noise per step, the clean pass
    into the rolling cache with the shipped window and sink), with gradients at one random step
    shared by the chunks, and that step's x0 is regressed onto the ground-truth latents. The
    physics world's frames are a near-deterministic function of G-buffers and preset, so the
    regression target is the data itself, not a teacher.

    With mix_data, a mix_rate share of the steps take their batch from a second dataset (each step
    from one of the two): fine-tuned on world v2 alone, the student forgot the physics world
    (26.8 -> 13.6 dB there), so a fine-tune keeps the old world in its batches.

    With pair_weight, presets that look alike (bright_sunny and overcast differ mostly in white
    balance) get their own term: a plain MSE spends its gradient on the content error both renders
    share, while the change the prompt makes, small against it, is what decides controllability.
    Side pairs (side_data) do the same for the sun's side, which only the clip's caption names.
    """
    from .latent_data import encode_split
    from .light_reading import LIT_CONFIG, light_reading_student, run_encoder

    genc = None
    own = run_encoder(cfg.student_run)
    if cfg.reads_light or (own is not None and own.config.reads_light):
        student, genc = light_reading_student(cfg.student_run, cfg.codecs_run, log)
    else:
        student = load_dit(cfg.student_run)

    def encoded(data: str, name: str, max_windows: int) -> LatentSet:
        return LatentSet(encode_split(data, "train", cfg.frames, cfg.vae_run, cfg.codecs_run, "distilled",
                                      Path(cfg.out) / name, log, max_windows, text_encoder=cfg.text_encoder,
                                      encoder=genc))

    sets = [encoded(cfg.data, "latents-train.safetensors", cfg.max_windows)]
    if cfg.mix_data:
        sets.append(encoded(cfg.mix_data, "latents-mix.safetensors", cfg.mix_max_windows))
    sides = None
    if cfg.side_data:
        sides = SidePairs(sets[0], encoded(cfg.side_data, "latents-side.safetensors", cfg.max_windows), cfg.side_data)
    if cfg.layers and cfg.layers != student.config.num_layers:
        log.info("grew %s's %d blocks to %d", cfg.student_run, student.config.num_layers, cfg.layers)
        student = grow_blocks(student, cfg.layers, cfg.student_run)
    student.requires_grad_(True)
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.99))
    n_steps = len(student_sigmas())
    nearest = [nearest_presets(s.rgb) if cfg.pair_weight else None for s in sets]

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        k = int(torch.rand(1, generator=g) < cfg.mix_rate) if cfg.mix_rate else 0  # drawn only when mixing
        side = bool(k == 0 and cfg.side_rate and torch.rand(1, generator=g) < cfg.side_rate)  # drawn only with pairs
        data = sets[k]
        if side:
            x0, cond, prompt = sides.sample(g, cfg.batch // 2)
        elif nearest[k] is None:  # a physics world mixed in has no captions: its prompts are the wordings
            rate = cfg.caption_rate if k == 0 or data.captions is not None else 0.0
            x0, cond, prompt, _ = data.sample(g, cfg.batch, caption_rate=rate, prompt_light_rate=cfg.prompt_light_rate,
                                              shadow_pass_rate=cfg.shadow_pass_rate)
        else:
            x0, cond, prompt = sample_pairs(data, nearest[k], g, cfg.batch // 2)
        exit_step = int(torch.randint(n_steps, (1,), generator=g))
        x = rollout(student, cond, prompt, cfg.chunk_frames, exit_step, g, cfg.window_frames, cfg.sink_frames, finish=True)
        err = (x - x0).pow(2).mean(dim=(0, 1, 3, 4))  # per latent frame
        loss = err.mean()
        logs = {"rollout": loss.item(), "first": err[0].item(), "last": err[-1].item()}
        if cfg.mix_rate:
            logs["mix"] = k
        if nearest[k] is not None or side:
            (xa, xb), (ya, yb) = x.chunk(2), x0.chunk(2)
            pair = ((xa - xb) - (ya - yb)).pow(2).mean()
            loss = loss + (cfg.side_weight if side else cfg.pair_weight) * pair
            logs["side" if side else "pair"] = pair.item()
        descend_reading_light(loss)
        return logs

    if cfg.light_lr and genc is None:
        raise AlayaError(f"student-rollout: light_lr is for a student that reads the light (reads_light, or a "
                         f"light-reading student_run); {cfg.student_run} does not")
    light_cols = slice(student.config.in_dim - genc.config.latent_channels, None) if genc is not None else None

    def descend_reading_light(loss) -> None:
        """descend, with the prior's input columns moved light_lr / lr times as far (Adam's step scales with
        the rate, and both rates follow the same schedule)."""
        w = student.patch_embedding.weight
        before = w[:, light_cols].detach().clone() if light_cols is not None and cfg.light_lr else None
        descend(opt, loss, student.parameters())
        if before is not None:
            with torch.no_grad():
                w[:, light_cols] += (cfg.light_lr / cfg.lr - 1) * (w[:, light_cols] - before)

    nets = {"dit": student, **({"gbuffer_encoder": genc} if genc is not None else {})}  # export ships its encoder
    return train_loop(cfg, nets, {"opt_dit": opt}, step, log, progress,
                      extra={"dit_config": asdict(student.config), "chunk_frames": cfg.chunk_frames,
                             "text_encoder": cfg.text_encoder, **({"gbuffer_encoder": LIT_CONFIG} if genc is not None else {})})
