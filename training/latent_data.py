"""Latent-space training data: the dataset's windows encoded once, cached as safetensors.

For every window of `frames` (4k+1) frames of every clip of a split:
    rgb   (N, P, 16, T', h, w)  normalized Wan latents of the ground truth under each preset (VAE)
    cond  (N, 80, T', h, w)     G-buffer latents: the distilled 5-branch encoder (what the
                                streaming renderer feeds the DiT) or, with cond_encoder="vae",
                                the VAE's latent of each pass (the teacher's original recipe)
Prompt embeddings (MiniLM, (1, 384) each) of every wording and of "" (the CFG negative / dropped
prompt) are cached beside them; from a world v2 dataset also each window's clip captions
(caption (N, P, 1, 384): the preset's prompt about the clip's scene, naming the sun's side, the
only place a prompt says where the sun is). The teacher and student stages share this file.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..model_zoo.bundle import load_text_encoder
from ..model_zoo.errors import AlayaError
from ..model_zoo.loading import read_metadata, read_state_dict, save_safetensors, weights_hash
from ..model_zoo.text_encoder import MINILM
from .data import ClipSet
from .light_reading import VARIANTS


def encode_split(data: str | Path, split: str, frames: int, vae_run: str | Path, codecs_run: str | Path | None,
                 cond_encoder: str, out: Path, log=None, max_windows: int = 0, size: int = 0,
                 with_rgb: bool = True, text_encoder: str = MINILM, encoder=None) -> Path:
    """Encode a split's windows and prompts into `out` (skipped when it exists with the same recipe).

    text_encoder: the MiniLM context the prompts are embedded with (bundle.TEXT_ENCODERS).
    with_rgb=False: only the conditioning (the student's distilled-encoder latents of the windows
    its teacher's file holds; the windows are the same for the same data / frames / max_windows).
    encoder: a G-buffer encoder to use in place of codecs_run's; a light-reading one also writes the prior's
    channels per (window, preset) under each way the light comes (training/light_reading.py)."""
    import json

    from ..model_zoo.codecs import gbuffer_encoder
    from .codecs import load_vae, to_video, vae_gbuffer_latents
    from .common import autocast, final_weights
    from ..model_zoo.loading import load_strict
    from .data import dataset_meta

    # the checkpoint steps too: a cache of an earlier VAE or encoder (a stage resumed since) is stale
    recipe = {"data": str(data), "split": split, "frames": frames, "vae_run": str(vae_run),
              "codecs_run": str(codecs_run), "cond_encoder": cond_encoder, "max_windows": max_windows,
              "size": size, **({} if with_rgb else {"with_rgb": False}),
              "vae_step": checkpoint_step(vae_run),
              "codecs_step": checkpoint_step(codecs_run) if cond_encoder == "distilled" else None}
    meta = dataset_meta(data, split)
    recipe["clips"] = len(meta["clips"][split])  # a dataset grown since (more clips rendered) makes it stale
    if meta.get("world") == "pathtrace":
        recipe["captions"] = True  # a cache made before captions were cached is stale
    if text_encoder != MINILM:  # recorded only then, so caches made before it stay current
        recipe["text_encoder"] = text_encoder
    if encoder is not None:  # a light-reading student's own encoder: its weights decide
        recipe["encoder"] = weights_hash(encoder)[:16]
    if out.is_file() and json.loads(read_metadata(out).get("recipe", "{}")) == recipe:
        return _refresh_prompts(out, data, text_encoder)
    clips = ClipSet(data, split)
    vae = load_vae(vae_run)
    genc = encoder.eval() if encoder is not None else None
    if genc is not None and cond_encoder != "distilled":
        raise AlayaError(f"latents: an encoder is given, and cond_encoder is {cond_encoder!r}, not 'distilled'")
    if genc is None and cond_encoder == "distilled":
        if codecs_run is None:
            raise AlayaError("latents: cond_encoder 'distilled' needs codecs_run")
        ckpt_extra = json.loads(read_metadata(_latest(codecs_run)).get("extra", "{}"))
        genc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[ckpt_extra["gbuffer_encoder"]])
        load_strict(genc, final_weights(Path(codecs_run), "gbuffer_encoder"))
        genc.eval()
    elif genc is None and cond_encoder != "vae":
        raise AlayaError(f"latents: cond_encoder {cond_encoder!r} is not 'distilled' or 'vae'")
    windows = selected_windows(clips, frames, max_windows)
    lit = _LitWindows(clips, size) if genc is not None and genc.config.reads_light else None
    rgb, cond = [], []
    with torch.no_grad(), autocast():
        for c, s in windows:
            gb = _resize(torch.from_numpy(clips.gbuffers[c, s:s + frames]), size)[None]
            video = to_video(_resize(torch.from_numpy(clips.rgb[c, :, s:s + frames]), size))  # (P, 3, T, H, W)
            if with_rgb:
                rgb.append(vae.encode(video, chunk=None).float())
            if lit is not None:
                cond.append(lit.encode(genc, gb[0], c, slice(s, s + frames)))
            else:
                cond.append(genc.encode(gb).float()[0] if genc is not None else vae_gbuffer_latents(vae, gb)[0])
    if log:
        log.info("encoded %d windows of %d frames from %s/%s", len(windows), frames, data, split)
    text = load_text_encoder(text_encoder)
    if lit is not None:  # cond: the passes' channels; lit*: the prior's per preset
        variants = {k: torch.stack([v[k] for v in cond]) for k in cond[0]}
        cond = [v["cond"] for v in cond]
        variants.pop("cond")
    tensors = {"cond": torch.stack(cond), **({"rgb": torch.stack(rgb)} if with_rgb else {}),
               **_prompt_tensors(clips.prompts, text), **(variants if lit is not None else {})}
    if clips.captions is not None:
        tensors["caption"] = _caption_tensor([clips.captions[c] for c, _ in windows], text)
    save_safetensors(tensors, out, {"recipe": recipe, "presets": clips.presets, "prompts": clips.prompts})
    return out


class _LitWindows:
    """A light-reading encoder's latents of a window: the passes' channels once, and the prior's channels under
    each preset's light, each way the light comes (training/light_reading.py VARIANTS) that the data allows."""

    def __init__(self, clips: ClipSet, size: int):
        from ..model_zoo.codecs.gbuffer_encoder import LIT_PRIOR
        from ..model_zoo.shading_prior import ShadingPrior

        if clips.light is None:
            raise AlayaError(f"latents: a light-reading encoder needs each clip's light, and {clips.root} records "
                             "none (made before clips carried their lights): make the dataset again")
        if size:
            raise AlayaError("latents: a light-reading encoder shades the clips at their own size (size 0)")
        self.clips, self.prior = clips, ShadingPrior(LIT_PRIOR)
        from .refiner import prompt_lights

        self.prompt = prompt_lights(clips, len(clips))  # (N, P, T, PACKED)

    def encode(self, genc, gb: torch.Tensor, c: int, frames: slice) -> dict[str, torch.Tensor]:
        from ..model_zoo.codecs.gbuffer_encoder import with_prior
        from ..streaming.gbuffer import DEFAULT_DEPTH_NEAR

        n = genc.config.latent_channels
        out: dict[str, list[torch.Tensor]] = {}
        for q in range(len(self.clips.presets)):
            lights = {"lit": (self.clips.light[c, q, frames], None),
                      "lit_prompt": (self.prompt[c, q, frames], None)}
            if self.clips.sun_visibility is not None:
                vis = torch.from_numpy(self.clips.sun_visibility[c, q, frames]).float() / 255
                lights["lit_pass"] = (self.clips.light[c, q, frames], vis)
            for key, (light, vis) in lights.items():
                with torch.autocast("cpu", enabled=False):  # the prior in float32, as it runs beside a stream
                    planes = with_prior(self.prior, gb, torch.as_tensor(light).float(), DEFAULT_DEPTH_NEAR, vis)
                z = genc.encode(planes[None]).float()[0]
                if "cond" not in out:
                    out["cond"] = [z[:-n]]
                out.setdefault(key, []).append(z[-n:])
        return {"cond": out["cond"][0], **{k: torch.stack(v) for k, v in out.items() if k != "cond"}}


def _prompt_tensors(prompts: dict[str, dict[str, list[str]]], text) -> dict[str, torch.Tensor]:
    """MiniLM contexts (text_len, 384) of "" (negative) and of every wording: prompt.{preset}.{train|heldout}.{i}
    (text: a loaded TextEncoder)."""
    tensors = {"negative": text([""])[0]}
    for name, kinds in prompts.items():
        for kind in ("train", "heldout"):
            for w, prompt in enumerate(kinds[kind]):
                tensors[f"prompt.{name}.{kind}.{w}"] = text([prompt])[0]
    return tensors


def _caption_tensor(captions: list[list[str]], text) -> torch.Tensor:
    """MiniLM contexts (N, P, text_len, 384) of each window's caption per preset (one pass per distinct
    caption) by the TextEncoder `text`."""
    distinct = sorted({c for row in captions for c in row})
    emb = dict(zip(distinct, text(distinct)))
    return torch.stack([torch.stack([emb[c] for c in row]) for row in captions])


def _refresh_prompts(out: Path, data: str | Path, text_encoder: str) -> Path:
    """A cache whose latents are current but whose wordings are not the dataset's (dataset.json was
    rewritten with more paraphrases) gets new prompt embeddings and keeps its latents: encoding the
    windows again takes minutes, embedding the wordings a second."""
    import json

    meta = read_metadata(out)
    prompts = json.loads((Path(data) / "dataset.json").read_text())["prompts"]
    if json.loads(meta.get("prompts", "{}")) == prompts:
        return out
    state = {k: v for k, v in read_state_dict(out).items() if not k.startswith("prompt.") and k != "negative"}
    save_safetensors({**state, **_prompt_tensors(prompts, load_text_encoder(text_encoder))}, out,
                     {"recipe": json.loads(meta["recipe"]), "presets": json.loads(meta["presets"]), "prompts": prompts})
    return out


def selected_windows(clips: ClipSet, frames: int, max_windows: int = 0) -> list[tuple[int, int]]:
    """The (clip, first frame) windows a latent cache holds, in its order: all of them, or with
    max_windows every k-th one, spread over the clips."""
    windows = clips.windows(frames)
    if max_windows:
        windows = windows[:: max(1, len(windows) // max_windows)][:max_windows]
    return windows


def _resize(u8: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (..., H, W, 3) -> (..., size, size, 3) by area averaging (size 0: unchanged)."""
    if not size or u8.shape[-3] == size:
        return u8
    lead = u8.shape[:-3]
    x = u8.reshape(-1, *u8.shape[-3:]).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="area")
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).reshape(*lead, size, size, 3)


def checkpoint_step(run: str | Path) -> int:
    """The step of a run folder's latest checkpoint (what caches made from its weights record)."""
    return int(read_metadata(_latest(run))["step"])


def _latest(run: str | Path) -> Path:
    from .common import latest_checkpoint

    ckpt = latest_checkpoint(Path(run))
    if ckpt is None:
        raise AlayaError(f"{run}: no checkpoint here; run that stage first")
    return ckpt


class LatentSet:
    """A cached latent split in memory (see module docstring)."""

    def __init__(self, path: str | Path):
        import json

        path = Path(path)
        state = read_state_dict(path)
        meta = read_metadata(path)
        self.rgb, self.cond, self.negative = state.get("rgb"), state["cond"], state["negative"]
        self.captions = state.get("caption")  # (N, P, text_len, 384) from a world v2 dataset, else None
        # a light-reading encoder's prior channels per (window, preset): (N, P, 16, T', h, w) per way the light came
        self.lit = {k: state[k] for k in VARIANTS if k in state}
        self.presets: list[str] = json.loads(meta["presets"])
        self.prompts: dict = json.loads(meta["prompts"])
        self.prompt_emb = {k[len("prompt."):]: v for k, v in state.items() if k.startswith("prompt.")}
        for kind in ("train", "heldout"):  # sample() draws a wording index shared by every preset
            counts = {name: len(self.prompts[name][kind]) for name in self.presets}
            if len(set(counts.values())) > 1:
                raise AlayaError(f"{path}: presets have different numbers of {kind} wordings: {counts}")

    def __len__(self) -> int:
        return self.rgb.shape[0]

    def embedding(self, preset: int | str, kind: str, wording: int) -> torch.Tensor:
        name = preset if isinstance(preset, str) else self.presets[preset]
        return self.prompt_emb[f"{name}.{kind}.{wording}"]

    def wordings(self, kind: str) -> int:
        return len(self.prompts[self.presets[0]][kind])

    def sample(self, g: torch.Generator, batch: int, prompt_dropout: float = 0.0, wordings: int = 0,
               text_noise: float = 0.0, caption_rate: float = 0.0, prompt_light_rate: float = 0.0,
               shadow_pass_rate: float = 0.0):
        """x0 (B, 16, T', h, w), cond (B, 80, T', h, w), prompt (B, text_len, 384), (window, preset) indices.
        A light-reading encoder's cache gives cond (B, 96, ...): its prior channels under the recorded light, for
        a prompt_light_rate share the light head's reading of the prompt, and for a shadow_pass_rate share of the
        others the recorded light with the recorded shadows (where the data has them).
        wordings: draw prompts from the first this many training wordings of each preset (0 = all);
        caption_rate: the share of (kept) prompts that are the window's own caption instead (world v2);
        text_noise: perturb the (kept) prompts, see perturb_prompts."""
        n, p = self.rgb.shape[:2]
        have = self.wordings("train")
        if wordings > have:
            raise AlayaError(f"latent cache: {wordings} training wordings asked for, the dataset has {have} per preset")
        wi = torch.randint(n, (batch,), generator=g)
        pi = torch.randint(p, (batch,), generator=g)
        wo = torch.randint(wordings or have, (batch,), generator=g)
        drop = torch.rand(batch, generator=g) < prompt_dropout
        prompt = torch.stack([self.negative if d else self.embedding(int(q), "train", int(w))
                              for q, w, d in zip(pi, wo, drop)])
        if caption_rate:  # drawn only then, so a recipe without captions keeps its random stream
            if self.captions is None:
                raise AlayaError(f"latent cache: caption_rate {caption_rate} needs clip captions, which only a "
                                 "world v2 dataset (\"world\": \"pathtrace\") has")
            use = (torch.rand(batch, generator=g) < caption_rate) & ~drop
            prompt = torch.where(use[:, None, None], self.captions[wi, pi], prompt)
        if text_noise:
            prompt = torch.where(drop[:, None, None], prompt, perturb_prompts(prompt, text_noise, g))
        return self.rgb[wi, pi], self._cond(wi, pi, g, prompt_light_rate, shadow_pass_rate), prompt, (wi, pi)

    def _cond(self, wi: torch.Tensor, pi: torch.Tensor, g: torch.Generator, prompt_light_rate: float,
              shadow_pass_rate: float) -> torch.Tensor:
        if not self.lit:
            return self.cond[wi]
        # drawn only for a light-reading cache, so the others keep their random streams
        by_prompt = torch.rand(len(wi), generator=g) < prompt_light_rate
        by_pass = (torch.rand(len(wi), generator=g) < shadow_pass_rate) & ("lit_pass" in self.lit)
        lit = [self.lit["lit_prompt" if a else "lit_pass" if b else "lit"][w, p]
               for w, p, a, b in zip(wi, pi, by_prompt, by_pass)]
        return torch.cat([self.cond[wi], torch.stack(lit)], 1)


def nearest_presets(rgb: torch.Tensor) -> torch.Tensor:
    """For latents (N, P, C, T, h, w) of N clips under P presets: (N, P), the other preset whose
    latents are nearest (mean squared difference) to each preset's on the same clip."""
    n, p = rgb.shape[:2]
    flat = rgb.reshape(n, p, -1).float()
    dist = torch.cdist(flat, flat)  # (N, P, P)
    dist.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    return dist.argmin(dim=2)


def perturb_prompts(prompt: torch.Tensor, noise: float, g: torch.Generator) -> torch.Tensor:
    """Unit prompt embeddings (..., D) moved by isotropic Gaussian noise of expected norm `noise`, then
    normalized again.

    A held-out paraphrase lies about 0.7 (cosine ~0.75) from the nearest training wording in MiniLM
    space, farther than any training input the DiT saw; with noise of that size it trains on
    that shell around each wording, and a new wording is read like the training wordings nearest it.
    """
    d = prompt.shape[-1]
    moved = prompt + noise * torch.randn(prompt.shape, generator=g) / d ** 0.5
    return torch.nn.functional.normalize(moved, dim=-1)
