"""Stage e: the G-buffer refiner, fitted to a Flash model's own frames (model_zoo/codecs/refiner.py).

`train refiner` renders training clips with a Flash model folder exactly as it renders at
inference (FlashPipeline without a refiner: streamed G-buffer encoder, few-step sampler with
the rolling KV cache, tiny decoder; a random training wording per clip and preset), one clip
at a time into out/renders/ (a render whose recipe matches is kept, so an interrupted stage
resumes without rendering again), then trains the refiner on aligned crops of those frames and
their G-buffers against the ground truth (L1 + MSE). `train export --set refiner_run=...` puts
it into a model folder. The refiner learns that model's errors: train it again after the
student or the decoder changed.

A refiner config that reads the prompt (`gbuffer-refiner-16-prompt`) sees, with each crop, the
embedding of a random training wording of the crop's preset (any of them, not only the one the
clip was rendered with: paraphrases must steer it alike). Trained on scenes the student never
saw (`data` pointing at a dataset of other seeds, configs/data-refiner.json), it learns what the
student gets wrong on new scenes, the lighting among it, rather than what it gets wrong on the
scenes it memorised. On world v2 data, `caption_rate` of the crops read the clip's own caption
instead, the only prompt that names the sun's side (a mirrored crop: the caption naming the other).

On a new scene the sun's side is not in the input (data.py), so the frame the refiner should aim
for is the ground truth's mean over the courtyard's turns, not the one sun the scene was lit by:
`target` "turned" trains towards that mean (a dataset made with sun_turns > 1), with the
expectation computed rather than learnt from scattered samples.

With `mix_data` the model also renders a second dataset's training clips (another world, into
out/renders-mix/) and a `mix_rate` share of the crops come from them: a model for two worlds gets a
refiner for both.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..model_zoo.codecs import refiner as refiner_codec
from ..model_zoo.errors import AlayaError
from .common import (StageConfig, autocast, check_caption_rate, check_device, check_mix, descend, step_generator,
                     train_loop)
from .data import ClipSet
from .latent_data import perturb_prompts


CHUNK = 4  # G-buffer frames per pipeline step when rendering, as `alaya-flash eval` streams them
TARGETS = ("truth", "turned")


@dataclass(frozen=True)
class RefinerStageConfig(StageConfig):
    out: str = "runs/refiner"
    model: str = "model_zoo/default"  # the Flash model whose frames the refiner learns to correct
    clips: int = 24  # training clips to render under every preset (0: all of the split)
    config: str = "gbuffer-refiner-16-prompt"  # the refiner's named config (model_zoo/codecs/refiner.py)
    precision: str = "bf16"  # of the renders: the precision the model runs in
    crop: int = 96  # square pixel crop
    batch: int = 8
    lr: float = 1e-3
    prompt_dropout: float = 0.1  # share of crops a prompt-reading refiner sees with the empty prompt instead
    text_noise: float = 0.0  # prompt-embedding noise of this expected norm (latent_data.perturb_prompts)
    render_jitter: float = 0.0  # random per-channel gain 1 +- j and offset +- j/2 on the render it reads (not the target)
    mirror: bool = True  # mirror half the crops left-right (normals' x negated): the sun's side is not in the G-buffers
    target: str = "truth"  # or "turned": the ground truth's mean over the world's turns (data made with sun_turns > 1)
    novel_share: float = 0.0  # share of crops from renders prompted with the 'refiner' wordings (prompts.py)
    device: str = "cpu"  # or "cuda": where the model renders and the refiner trains (a render cache serves both)
    # a second dataset (another world) whose first `clips` training clips the model renders too (out/renders-mix/);
    # a mix_rate share of the crops come from them, so a refiner for two worlds learns both
    mix_data: str = ""
    mix_rate: float = 0.0
    mix_clips: int = 0  # mix_data's clips to render (0: as many as `clips`)
    # share of a world v2 dataset's crops read with the clip's own caption (the only prompt naming the sun's
    # side; a mirrored crop's caption names the other side) instead of a training wording of the preset
    caption_rate: float = 0.0
    # share of a light-reading refiner's crops whose prior is shaded under the light the shipped light head reads
    # from the clip's caption (else the preset's first training wording) instead of the clip's recorded light:
    # what a stream renders under when nobody gives it the light, so the refiner learns how far to trust it
    prompt_light_rate: float = 0.0
    # share of the other crops whose prior takes its shadows from the clip's recorded sun visibility (what an
    # engine's shadow pass gives, model_zoo/shading_prior.py) instead of screen-space marching: a world v2
    # dataset records it; casters off the screen (a courtyard's walls) shadow only there
    shadow_pass_rate: float = 0.0
    # share of the other crops whose prior takes both its shadows and its ambient occlusion from the clip's
    # recordings (an engine's shadow pass and sky pass): a world v2 dataset made since 2026-12-08 records the
    # sky's visibility; a room's walls and ceiling block the sky only there
    sky_pass_rate: float = 0.0
    # a model folder whose refiner (of the same config) the training starts from, instead of the identity: a
    # fine-tune ("": from zero; a run resumed from its checkpoint ignores it)
    init: str = ""

    def validate(self):
        check_device("refiner stage", self.device)
        check_mix("refiner stage", self.mix_data, self.mix_rate)
        check_caption_rate("refiner stage", self.caption_rate)
        if self.mix_data and self.novel_share:
            raise AlayaError("refiner stage: novel_share and mix_data do not go together (novel renders are of 'data' only)")
        if self.config not in refiner_codec.CONFIGS:
            raise AlayaError(f"refiner stage: config {self.config!r} is unknown; known: {', '.join(refiner_codec.CONFIGS)}")
        if self.sky_pass_rate and not refiner_codec.CONFIGS[self.config].sky:
            raise AlayaError(f"refiner stage: sky_pass_rate {self.sky_pass_rate} needs a refiner config that reads the "
                             f"sky pass (gbuffer-refiner-16-sky), not {self.config}")
        if self.target not in TARGETS:
            raise AlayaError(f"refiner stage: target {self.target!r} is unknown; choose {' or '.join(TARGETS)}")
        if self.precision not in ("bf16", "fp32"):
            raise AlayaError(f"refiner stage: precision {self.precision!r} is not bf16 or fp32")
        if not 0 <= self.render_jitter < 1:
            raise AlayaError(f"refiner stage: render_jitter {self.render_jitter} is not in [0, 1)")
        if self.text_noise < 0:
            raise AlayaError(f"refiner stage: text_noise {self.text_noise} must be >= 0")
        if not 0 <= self.novel_share <= 1:
            raise AlayaError(f"refiner stage: novel_share {self.novel_share} is not in [0, 1]")
        if not 0 <= self.prompt_light_rate <= 1:
            raise AlayaError(f"refiner stage: prompt_light_rate {self.prompt_light_rate} is not in [0, 1]")
        if not 0 <= self.shadow_pass_rate <= 1:
            raise AlayaError(f"refiner stage: shadow_pass_rate {self.shadow_pass_rate} is not in [0, 1]")
        if not 0 <= self.sky_pass_rate <= 1:
            raise AlayaError(f"refiner stage: sky_pass_rate {self.sky_pass_rate} is not in [0, 1]")
        if not 0 <= self.prompt_dropout <= 1:
            raise AlayaError(f"refiner stage: prompt_dropout {self.prompt_dropout} is not in [0, 1]")
        if self.crop <= 0 or self.clips < 0 or self.mix_clips < 0:
            raise AlayaError(f"refiner stage: crop {self.crop} must be > 0, clips {self.clips} and mix_clips "
                             f"{self.mix_clips} >= 0")
        if not (Path(self.model) / "config.json").is_file():
            raise AlayaError(f"refiner stage: {self.model} is not a model folder (no config.json)")


def _model_stamp(folder: Path) -> dict:
    """What identifies the model in a render's recipe: a SHA-256 of each network's tensors (not of the
    files, whose headers a re-export may order differently); the refiner's own file is left out."""
    import hashlib

    from ..model_zoo.loading import read_state_dict

    stamp = {}
    for f in sorted(folder.glob("*.safetensors")):
        if f.name == "refiner.safetensors":
            continue
        h = hashlib.sha256()
        for key, tensor in sorted(read_state_dict(f).items()):
            h.update(key.encode())
            h.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        stamp[f.name] = h.hexdigest()
    return stamp


@torch.no_grad()
def model_renders(cfg: RefinerStageConfig, clips: ClipSet, log, split: str = "train",
                  mix: bool = False) -> tuple[np.ndarray, list]:
    """The model's frames of the first `cfg.clips` training clips under every preset, uint8 (N, P, T, H, W, 3),
    each clip and preset prompted with a random wording of the prompt split `split` (prompts.py), and
    those wordings, [clip][preset]. The 'train' renders live in out/renders/, others in out/renders-SPLIT/;
    mix: the clips are mix_data's, in out/renders-mix/. A model whose encoder reads the light renders each clip
    under its recorded light (the light most of a light-reading refiner's crops are shaded under)."""
    from ..streaming.render.lighting import recorded
    from ..streaming.render.pipelines import FlashPipeline, encoder_reads_light
    from ..streaming.values import GBuffers, PromptSchedule
    from ..streaming.files.sinks import to_uint8
    from ..model_zoo import folders
    from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors
    from .prompts import prompts as wordings

    wanted = cfg.mix_clips if mix and cfg.mix_clips else cfg.clips
    n = len(clips) if wanted == 0 else min(wanted, len(clips))
    folder = Path(cfg.out) / ("renders-mix" if mix else "renders" if split == "train" else f"renders-{split}")
    recipe = {"model": str(cfg.model), "weights": _model_stamp(Path(cfg.model)), "data": str(cfg.mix_data if mix else cfg.data),
              "seed": cfg.seed, "precision": cfg.precision}
    model = None
    out = np.empty((n, len(clips.presets), *clips.rgb.shape[2:]), np.uint8)
    rng = random.Random(cfg.seed if split == "train" else f"{cfg.seed}-{split}")
    chosen = []
    for c in range(n):
        picks = [rng.choice(wordings(p, split)) for p in clips.presets]
        chosen.append(picks)
        path = folder / f"clip-{c:06d}.safetensors"
        clip_recipe = {**recipe, "clip": c, "wordings": picks}  # new wordings in prompts.py: render again
        if path.is_file() and json.loads(read_metadata(path).get("recipe", "{}")) == clip_recipe:
            out[c] = read_state_dict(path)["frames"].numpy()
            continue
        if model is None:
            dtype = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
            model = folders.load_flash(cfg.model, device=cfg.device, dtype=dtype)
            text = model.text_encoder()
        lit = encoder_reads_light(model.gbuffer_encoder)
        if lit and clips.light is None:
            raise AlayaError(f"refiner stage: {cfg.model}'s encoder reads the light, and {clips.root} records none")
        for q, preset in enumerate(clips.presets):
            pipe = FlashPipeline(model, PromptSchedule.encode(text, picks[q]), seed=cfg.seed + c * len(clips.presets) + q,
                                 refine=False, lights=recorded(clips.light[c, q]) if lit else None)
            gbuffers = torch.from_numpy(clips.gbuffers[c])
            frames = list(pipe.run(GBuffers(gbuffers[a:a + CHUNK]) for a in range(0, len(gbuffers), CHUNK)))
            out[c, q] = to_uint8(torch.cat(frames))
        save_safetensors({"frames": torch.from_numpy(out[c])}, path, {"recipe": clip_recipe})
        log.info("rendered training clip %d/%d under %d presets (%s wordings)", c + 1, n, len(clips.presets), split)
    return out, chosen


@torch.no_grad()
def prompt_lights(clips: ClipSet, n: int) -> np.ndarray:
    """The light the shipped light head reads for each of the first n clips under each preset, float32
    (n, P, T, PACKED), held over the clip: from the clip's caption (world v2's name the sun's side), else from
    the preset's first training wording (what `--light prompt` renders under)."""
    from ..model_zoo import light_head
    from ..model_zoo.bundle import load_text_encoder
    from ..model_zoo.text_encoder import MINILM

    head, encoder = light_head.load(), load_text_encoder(MINILM)
    t = clips.rgb.shape[2]
    out = []
    for c in range(n):
        texts = [clips.captions[c][q] if clips.captions is not None else clips.prompts[name]["train"][0]
                 for q, name in enumerate(clips.presets)]
        packed = head.packed(*encoder.states(texts)).float()  # (P, PACKED)
        out.append(packed[:, None].expand(-1, t, -1).numpy())
    return np.stack(out)


@torch.no_grad()
def prior_planes(cfg: RefinerStageConfig, clips: ClipSet, n: int, log, mix: bool = False,
                 from_prompt: bool = False, shadow_pass: bool = False, sky_pass: bool = False) -> np.ndarray:
    """The shading prior's planes of the first n clips under each preset's recorded light (from_prompt: the
    light head's reading of its prompt, prompt_lights), uint8 (n, P, T, 5, H, W), what a light-reading refiner
    sees beside each render (the camera's up as inference has it: estimated from the normals). shadow_pass:
    the shadows are the clip's recorded sun visibility (an engine's shadow pass), not marched in screen space;
    sky_pass: the ambient occlusion is its recorded sky visibility (an engine's sky pass).
    Kept in out/priors[-prompt][-shadow][-sky][-mix]/ (a clip whose recipe matches is read back)."""
    from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors
    from ..model_zoo.shading_prior import ShadingPrior
    from ..streaming.gbuffer import DEFAULT_DEPTH_NEAR

    if clips.light is None and not from_prompt:
        raise AlayaError(f"refiner stage: config {cfg.config!r} reads the light, and {clips.root} records none "
                         "(made before clips carried their lights): make the dataset again")
    if shadow_pass and clips.sun_visibility is None:
        raise AlayaError(f"refiner stage: shadow_pass_rate needs recorded sun visibility, and {clips.root} has none "
                         "(only a world v2 dataset records it)")
    if sky_pass and clips.sky_visibility is None:
        raise AlayaError(f"refiner stage: sky_pass_rate needs recorded sky visibility, and {clips.root} has none "
                         "(a world v2 dataset made since 2026-12-08 records it)")
    prior = ShadingPrior(refiner_codec.CONFIGS[cfg.config].prior_config)  # the refiner's own
    folder = Path(cfg.out) / ("priors" + ("-prompt" if from_prompt else "") + ("-shadow" if shadow_pass else "")
                              + ("-sky" if sky_pass else "") + ("-mix" if mix else ""))
    recipe = {"data": str(cfg.mix_data if mix else cfg.data), "prior": repr(prior.config)}
    if shadow_pass:
        recipe["shadows"] = "recorded"
    if sky_pass:
        recipe["sky"] = "recorded"
    lights = clips.light
    if from_prompt:
        lights = prompt_lights(clips, n)
        recipe["light"] = "prompt"
    p, t, h, w = clips.rgb.shape[1:5]
    out = np.empty((n, p, t, 5, h, w), np.uint8)
    for c in range(n):
        path = folder / f"clip-{c:06d}.safetensors"
        if path.is_file() and json.loads(read_metadata(path).get("recipe", "{}")) == {**recipe, "clip": c}:
            out[c] = read_state_dict(path)["planes"].numpy()
            continue
        gbuffers = torch.from_numpy(clips.gbuffers[c])
        for q in range(p):
            shadows = torch.from_numpy(clips.sun_visibility[c, q]).float() / 255 if shadow_pass else None
            sky = torch.from_numpy(clips.sky_visibility[c]).float() / 255 if sky_pass else None
            planes = prior(gbuffers, torch.from_numpy(lights[c, q]), DEFAULT_DEPTH_NEAR, sun_visibility=shadows,
                           sky_visibility=sky)
            out[c, q] = planes.mul(255).round().clamp(0, 255).to(torch.uint8).numpy()
        save_safetensors({"planes": torch.from_numpy(out[c])}, path, {"recipe": {**recipe, "clip": c}})
        log.info("shaded training clip %d/%d under %d lights", c + 1, n, p)
    return out


@dataclass
class _Source:
    """One dataset's training clips, the model's renders of them, the frames to fit and the wordings' embeddings."""

    clips: ClipSet
    renders: np.ndarray
    goal: np.ndarray
    texts: torch.Tensor | None  # (P, W, D) for a prompt-reading refiner
    captions: torch.Tensor | None = None  # (N, P, 2, D): each clip's caption per preset, as is and mirrored
    priors: np.ndarray | None = None  # (N, P, T, 5, H, W) uint8: the shading prior's planes, for a light-reading refiner
    prompt_priors: np.ndarray | None = None  # the same under the light head's reading of the prompt (prompt_light_rate)
    shadow_priors: np.ndarray | None = None  # the same with the recorded sun visibility's shadows (shadow_pass_rate)
    sky_priors: np.ndarray | None = None  # the same with its shadows and its sky visibility as the AO (sky_pass_rate)


def _source(cfg: RefinerStageConfig, data: str, log, text_dim: int, mix: bool = False, light: bool = False) -> _Source:
    clips = ClipSet(data, "train")
    goal = clips.rgb if cfg.target == "truth" else clips.rgb_turned
    if goal is None:
        raise AlayaError(f"refiner stage: target 'turned' needs a dataset made with sun_turns > 1; {data} has none")
    renders, _ = model_renders(cfg, clips, log, mix=mix)
    captions = None
    if cfg.caption_rate and text_dim and clips.captions is not None:
        from ..streaming.world.traced.presets import mirrored_caption

        n = len(renders)
        texts = [t for row in clips.captions[:n] for caption in row for t in (caption, mirrored_caption(caption))]
        captions = _embeddings(texts).view(n, len(clips.presets), 2, -1)
    priors = prior_planes(cfg, clips, len(renders), log, mix) if light else None
    prompt_priors = prior_planes(cfg, clips, len(renders), log, mix, from_prompt=True) \
        if light and cfg.prompt_light_rate else None
    # (a dataset without recorded shadows, the physics world's, keeps its screen-space ones)
    shadow_priors = prior_planes(cfg, clips, len(renders), log, mix, shadow_pass=True) \
        if light and cfg.shadow_pass_rate and clips.sun_visibility is not None else None
    sky_priors = prior_planes(cfg, clips, len(renders), log, mix, shadow_pass=True, sky_pass=True) \
        if light and cfg.sky_pass_rate and clips.sky_visibility is not None else None
    return _Source(clips, renders, goal, _wording_embeddings(clips) if text_dim else None, captions, priors,
                   prompt_priors, shadow_priors, sky_priors)


def run_refiner(cfg: RefinerStageConfig, log, progress=None) -> int:
    dev = torch.device(cfg.device)
    net = refiner_codec.build(refiner_codec.CONFIGS[cfg.config]).to(dev)
    if cfg.init:
        _start_from(net, cfg)
    sources = [_source(cfg, cfg.data, log, net.text_dim, light=net.reads_light)]
    if cfg.mix_data:
        sources.append(_source(cfg, cfg.mix_data, log, net.text_dim, mix=True, light=net.reads_light))
    if net.reads_light and cfg.novel_share:
        raise AlayaError("refiner stage: novel_share is not supported with a refiner that reads the light")
    if cfg.prompt_light_rate and not net.reads_light:
        raise AlayaError(f"refiner stage: prompt_light_rate {cfg.prompt_light_rate} needs a refiner config that reads "
                         f"the light ({cfg.config} does not)")
    if cfg.shadow_pass_rate and not (net.reads_light and any(src.shadow_priors is not None for src in sources)):
        raise AlayaError(f"refiner stage: shadow_pass_rate {cfg.shadow_pass_rate} needs a refiner config that reads the "
                         f"light and a dataset that records sun visibility, which only world v2's has ({cfg.config}, {cfg.data})")
    if cfg.sky_pass_rate and not (net.reads_light and any(src.sky_priors is not None for src in sources)):
        raise AlayaError(f"refiner stage: sky_pass_rate {cfg.sky_pass_rate} needs a refiner config that reads the "
                         f"light and a dataset that records sky visibility, which only world v2's has ({cfg.config}, {cfg.data})")
    if cfg.caption_rate and not (net.text_dim and any(src.captions is not None for src in sources)):
        raise AlayaError(f"refiner stage: caption_rate {cfg.caption_rate} needs a refiner config that reads the prompt "
                         f"and clip captions, which only a world v2 dataset has ({cfg.config}, {cfg.data})")
    clips, renders = sources[0].clips, sources[0].renders
    # renders prompted with wordings no other stage trained on, each crop of them read with its own wording
    novel, novel_picks = model_renders(cfg, clips, log, "refiner") if cfg.novel_share else (None, None)
    empty = _embeddings([""])[0] if net.text_dim else None  # (D,)
    novel_texts = None
    n, p = renders.shape[:2]
    k = min(cfg.crop, *(size for src in sources for size in src.renders.shape[3:5]))  # one crop size for every source
    if novel is not None and net.text_dim:
        novel_texts = _embeddings([x for picks in novel_picks for x in picks]).view(n, p, -1)  # (N, P, D)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=0.0)

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        rgb, planes, target, text, priors, given = [], [], [], [], [], []
        for _ in range(cfg.batch):
            # (each draw only when asked for, so runs without a mix or novel renders keep their random stream)
            src = sources[int(float(torch.rand((), generator=g)) < cfg.mix_rate) if cfg.mix_rate else 0]
            n, p, t, h, w = src.renders.shape[:5]
            c, q, f = (int(torch.randint(m, (1,), generator=g)) for m in (n, p, t))
            y, x = (int(torch.randint(m - k + 1, (1,), generator=g)) for m in (h, w))
            from_novel = novel is not None and float(torch.rand((), generator=g)) < cfg.novel_share
            frames = novel if from_novel else src.renders
            captioned = False
            if src.texts is not None:  # the render's own novel wording, the clip's caption, or a random training
                # wording of the preset; now and then the empty prompt
                if from_novel:
                    e = novel_texts[c, q]
                else:
                    e = src.texts[q, int(torch.randint(src.texts.shape[1], (1,), generator=g))]
                dropped = float(torch.rand((), generator=g)) < cfg.prompt_dropout
                if src.captions is not None and not from_novel:  # (drawn only then: the old random stream otherwise)
                    captioned = float(torch.rand((), generator=g)) < cfg.caption_rate and not dropped
                text.append(empty if dropped else src.captions[c, q, 0] if captioned else e)
            crop = [torch.from_numpy(frames[c, q, f, y:y + k, x:x + k]),
                    refiner_codec.gbuffer_planes(torch.from_numpy(src.clips.gbuffers[c, f, :, y:y + k, x:x + k])),
                    torch.from_numpy(src.goal[c, q, f, y:y + k, x:x + k])]
            if src.priors is not None:  # (the draw only with prompt priors: the old random stream otherwise)
                shaded = src.priors
                if src.prompt_priors is not None and float(torch.rand((), generator=g)) < cfg.prompt_light_rate:
                    shaded = src.prompt_priors
                elif src.sky_priors is not None and float(torch.rand((), generator=g)) < cfg.sky_pass_rate:
                    shaded = src.sky_priors
                elif src.shadow_priors is not None and float(torch.rand((), generator=g)) < cfg.shadow_pass_rate:
                    shaded = src.shadow_priors
                # what a config with `given` reads: the light given (not the prompt's), the shadows from a pass
                from_pass = shaded is src.shadow_priors or shaded is src.sky_priors
                given.append(torch.tensor([float(shaded is not src.prompt_priors), float(from_pass)]))
                crop.append(torch.from_numpy(shaded[c, q, f, :, y:y + k, x:x + k]).float() / 255)
            if cfg.mirror and float(torch.rand((), generator=g)) < 0.5:
                crop = _mirrored(*crop)
                if captioned:  # the mirrored scene's sun is on the other side
                    text[-1] = src.captions[c, q, 1]
            rgb.append(crop[0])
            planes.append(crop[1])
            target.append(crop[2])
            if src.priors is not None:
                priors.append(crop[3])

        def images(batch):  # uint8 (B, k, k, 3) -> float (B, 3, k, k) in [0, 1]
            return torch.stack(batch).permute(0, 3, 1, 2).float() / 255

        seen = images(rgb)
        if cfg.render_jitter:  # the render's light and colour become a hint; the prompt and G-buffers must carry them
            j = cfg.render_jitter
            gain = 1 + j * (2 * torch.rand((len(seen), 3, 1, 1), generator=g) - 1)
            offset = j / 2 * (2 * torch.rand((len(seen), 3, 1, 1), generator=g) - 1)
            seen = (seen * gain + offset).clamp(0, 1)
        with autocast(dev):
            prompt = torch.stack(text) if text else None
            if prompt is not None and cfg.text_noise:
                prompt = perturb_prompts(prompt, cfg.text_noise, g)  # drawn on the CPU, as on any device
            prior = torch.stack(priors).to(dev) if priors else None  # (B, 5, k, k), light-reading configs
            args = [seen.to(dev), torch.stack(planes).to(dev), None if prompt is None else prompt.to(dev)]
            flags = torch.stack(given).to(dev) if net.reads_given else None  # (B, 2)
            out = net(*args, *([prior, flags] if priors else [])).float()
        truth = images(target).to(dev)
        loss = F.l1_loss(out, truth) + F.mse_loss(out, truth)
        descend(opt, loss, net.parameters())
        return {"refine": loss.item()}

    return train_loop(cfg, {"refiner": net}, {"opt_refiner": opt}, step, log, progress, extra={"refiner": cfg.config})


def _start_from(net, cfg: RefinerStageConfig) -> None:
    """Load the refiner of the model folder `cfg.init` into net, strictly: the same network as cfg.config's (whose
    prior may take the sky pass where the folder's did not)."""
    from ..model_zoo.loading import load_strict, read_state_dict

    folder = Path(cfg.init)
    try:
        named = json.loads((folder / "config.json").read_text())["networks"]["refiner"].get("config_name")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise AlayaError(f"refiner stage: init {folder} is not a model folder with a refiner") from None
    plain = {name: replace(c, sky=False) for name, c in refiner_codec.CONFIGS.items()}
    if named not in plain or plain[named] != plain[cfg.config]:  # a -mirror refiner may start a -sky one
        raise AlayaError(f"refiner stage: init {folder}'s refiner is {named!r}, the stage trains {cfg.config!r}: "
                         "not the same network")
    load_strict(net, read_state_dict(folder / "refiner.safetensors"))


def load_run(run: str | Path) -> tuple[refiner_codec.GBufferRefiner, str]:
    """A `train refiner` run's refiner (its latest checkpoint, strictly) and the config name it was trained as."""
    from ..model_zoo.loading import load_strict, read_metadata
    from .common import latest_checkpoint, net_weights

    ckpt = latest_checkpoint(Path(run))
    if ckpt is None:
        raise AlayaError(f"{run}: no checkpoint here; run `alaya-flash train refiner` first")
    name = json.loads(read_metadata(ckpt)["extra"])["refiner"]
    net = refiner_codec.build(refiner_codec.CONFIGS[name])
    load_strict(net, net_weights(ckpt, "refiner"))
    return net, name


def _mirrored(rgb, planes, target, *prior):
    """A crop mirrored left-right: a mirrored scene under the mirrored light, as valid a sample as the first.
    Camera-space normals then point the other way in x (plane 5: x in [0, 1] from [-1, 1]); the shading
    prior's planes (images of that light) mirror as they are."""
    planes = planes.flip(-1).clone()
    planes[5] = 1 - planes[5]
    return [rgb.flip(-2), planes, target.flip(-2), *(p.flip(-1) for p in prior)]


def _embeddings(wordings: list[str]) -> torch.Tensor:
    """Pooled MiniLM embeddings (len(wordings), D), what Refine reads for a prompt."""
    from ..model_zoo.bundle import load_text_encoder
    from ..model_zoo.text_encoder import MINILM

    with torch.no_grad():  # the process's one MiniLM: a stage embeds wordings a preset at a time
        return load_text_encoder(MINILM)(wordings)[:, 0].float()


def _wording_embeddings(clips: ClipSet) -> torch.Tensor:
    """MiniLM embeddings of every training wording of every preset, (P, W, D) (W: the fewest a preset has)."""
    lists = [clips.prompts[p]["train"] for p in clips.presets]
    w = min(len(x) for x in lists)
    return torch.stack([_embeddings(x[:w]) for x in lists])
