"""Stage f: anchor the text path, so that new wordings of a lighting style read like its training ones.

The prompt reaches the student DiT as one pooled MiniLM token: `text_embedding` (an MLP) maps it to
the model width and every block's cross-attention adds o(v(context)) to its tokens (one key: the
softmax is 1 and the query does not matter). So what a prompt does to the DiT is one vector per
block, a function of the embedding alone. The refiner reads the same embedding through its own MLP
(`text`, FiLM parameters).

Trained on 8 wordings per preset, both MLPs are tight where they were trained (a preset's wordings
land 0.22-0.30 apart in the DiT's per-block offsets) and scatter the wordings they never saw (0.6 to
2.0, some nearer another preset's: the held-out bright_sunny paraphrase landed nearest autumn_warm
and rendered warm). This stage refits only those two MLPs, on every wording of each preset (its
training ones and `extra_split`'s from prompts.py, never the held-out ones) moved by prompt noise
(latent_data.perturb_prompts); every other weight is copied unchanged, so each preset keeps the look
the student and refiner learnt and only which wordings select it changes.

- DiT (`text_noise`): a wording's offsets are regressed onto the preset's mean offsets over its
  training wordings under the source weights; the empty prompt keeps its own. They enter the
  residual stream additively: anchored alone, the DiT kept its content (27.77 dB against 27.73 on
  the held-out scenes). Held only at the wordings, the MLP is free between them; `mixup` also holds it
  at blends of two prompts, each regressed onto the same blend of their targets.
- Refiner (`refiner_text_noise`): FiLM parameters scale features, and their mean is no trained
  point (regressed in that space the refiner lost 0.8-1.4 dB). So it is anchored on images: crops of
  its own training renders (the `refiner_run`'s render cache, rendered again only if that model
  changed since), each read with a wording of the crop's preset, are regressed onto the source
  refiner's mean frame over the preset's training wordings (that mean scored 27.78 dB against the
  caption's 27.76); `prompt_dropout` of them read the empty prompt and keep the source's own frame.

On world v2 data (`"world": "pathtrace"`) the student also read captions (`caption_rate`: the scene,
the preset and the sun's side), which are none of a preset's wordings: every caption keeps the
source's own offsets, as the empty prompt does (pulled freely, the captions moved with the wordings
and the world v2 fine-tune lost 1.5 dB on held-out world v2, docs/training.md). The refiner anchor does not
take captions yet, so it is refused there. A student of two worlds names both datasets (`data`,
`mix_data`): a preset only the second has (the physics world's underwater) is anchored too, where
left out its wordings drifted with the shared MLP (the world v2 fine-tune's underwater lost 7.9 dB).

The output run holds the whole student DiT (and refiner); export reads it as `student_run` (and
`refiner_run`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..model_zoo.errors import AlayaError
from ..model_zoo.text_encoder import MINILM
from .common import StageConfig, autocast, latest_checkpoint, step_generator, train_loop
from .latent_data import perturb_prompts
from .refiner import _embeddings  # pooled MiniLM embeddings of wordings, as the refiner stage reads them


@dataclass(frozen=True)
class TextAnchorConfig(StageConfig):
    out: str = "runs/text-anchor"
    data: str = "runs/data"  # the dataset the student trained on: its presets and training wordings
    student_run: str = "runs/student-rollout"  # the student DiT whose text_embedding is refitted
    refiner_run: str = ""  # a `train refiner` run whose prompt MLP is refitted too ("": none)
    extra_split: str = "refiner,anchor"  # prompts.py splits of extra wordings, comma-separated ("": none)
    extra_wordings: int = 0  # the first N of them per preset (0: all); the rest can validate the stage
    # a second dataset (another world the student also learnt): its presets that data lacks are anchored too
    mix_data: str = ""
    text_noise: float = 1.0  # prompt-embedding noise of this expected norm on every DiT sample
    # pairs of wordings blended per step (as many as wordings x this): the blend's offsets are the targets' blend
    mixup: float = 0.0
    refiner_text_noise: float = 0.5  # the same on the refiner's crops
    batch: int = 8  # refiner crops per step
    crop: int = 64  # square pixel crop of the refiner's renders
    prompt_dropout: float = 0.1  # share of refiner crops read with the empty prompt (which keeps its own output)
    steps: int = 1500
    lr: float = 1e-3
    warmup: int = 0
    ckpt_every: int = 500
    log_every: int = 100
    threads: int = 2

    def validate(self):
        from .prompts import SPLITS

        for split in _splits(self.extra_split):
            if split == "heldout":
                raise AlayaError("text-anchor: extra_split 'heldout' would train on the paraphrases eval holds out")
            if split not in SPLITS:
                raise AlayaError(f"text-anchor: extra_split {split!r} is unknown; choose from refiner, anchor, train")
        if self.mixup < 0:
            raise AlayaError(f"text-anchor: mixup {self.mixup} must be >= 0")
        if self.text_noise < 0 or self.refiner_text_noise < 0:
            raise AlayaError(f"text-anchor: text_noise {self.text_noise} and refiner_text_noise "
                             f"{self.refiner_text_noise} must be >= 0")
        if not 0 <= self.prompt_dropout <= 1:
            raise AlayaError(f"text-anchor: prompt_dropout {self.prompt_dropout} is not in [0, 1]")
        if self.extra_wordings < 0:
            raise AlayaError(f"text-anchor: extra_wordings {self.extra_wordings} must be >= 0 (0: all)")
        if self.crop <= 0 or self.batch <= 0:
            raise AlayaError(f"text-anchor: crop {self.crop} and batch {self.batch} must be > 0")
        if self.refiner_run and self.mix_data:
            raise AlayaError(f"text-anchor: refiner_run with mix_data ({self.mix_data}) is not supported: the refiner "
                             "anchor reads one dataset's renders; anchor the DiT alone (refiner_run \"\")")


def _splits(extra_split: str) -> list[str]:
    return [x.strip() for x in extra_split.split(",") if x.strip()]


def dit_text_response(dit: nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
    """Pooled prompt embeddings (N, text_dim) -> what each block's cross-attention adds for them, (N, layers * dim).
    Exact for a one-token prompt: attention over one key returns its value whatever the query."""
    context = dit.text_embedding(embeddings)
    return torch.cat([block.cross_attn.o(block.cross_attn.v(context)) for block in dit.blocks], -1)


class Anchor:
    """The DiT's regression set: every wording's embedding and the per-block offsets it should give."""

    def __init__(self, dit: nn.Module, train: list[torch.Tensor], extra: list[torch.Tensor], empty: torch.Tensor,
                 kept: torch.Tensor | None = None):
        self.net, self.text = dit, dit.text_embedding  # text: the MLP this stage refits
        # prompts that keep the source's own offsets: the empty one (the CFG negative) and `kept` (world v2 captions)
        self.kept = empty if kept is None else torch.cat([empty, kept])
        with torch.no_grad():  # targets from the weights as loaded: the source run's
            own = [dit_text_response(dit, e) for e in train]
            self.means = torch.stack([r.mean(0) for r in own])  # (presets, width): what a preset's wordings should give
            targets = []
            for r, m, x in zip(own, self.means, extra):
                targets += [m.expand_as(r), m.expand(len(x), -1)]
            self.target = torch.cat(targets)
            self.kept_target = dit_text_response(dit, self.kept)
        self.inputs = torch.cat([t for pair in zip(train, extra) for t in pair])

    def loss(self, g: torch.Generator, noise: float, mixup: float = 0.0) -> torch.Tensor:
        x = perturb_prompts(self.inputs, noise, g) if noise else self.inputs
        loss = (F.mse_loss(dit_text_response(self.net, x), self.target)
               + F.mse_loss(dit_text_response(self.net, self.kept), self.kept_target))
        if mixup:
            loss = loss + F.mse_loss(*self._blends(g, round(mixup * len(self.inputs))))
        return loss

    def _blends(self, g: torch.Generator, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` blends of two random prompts (wordings or kept ones): the net's offsets and the targets' blend.
        Between trained points a new wording then lands between their responses, not beyond them."""
        inputs, targets = torch.cat([self.inputs, self.kept]), torch.cat([self.target, self.kept_target])
        a, b = (torch.randint(len(inputs), (count,), generator=g) for _ in range(2))
        lam = torch.rand((count, 1), generator=g)
        x = F.normalize(lam * inputs[a] + (1 - lam) * inputs[b], dim=-1)
        return dit_text_response(self.net, x), lam * targets[a] + (1 - lam) * targets[b]

    @torch.no_grad()
    def margin(self, net: nn.Module, wordings: list[torch.Tensor]) -> float:
        """How much nearer `net`'s offsets for wordings (a tensor per preset) lie to their preset's target mean
        than to the nearest other preset's, on average (the DiT's scale may grow: distances alone would not tell)."""
        margins = []
        for p, e in enumerate(wordings):
            dist = torch.cdist(dit_text_response(net, e), self.means)
            own = dist[:, p].clone()
            dist[:, p] = float("inf")
            margins.append(dist.min(1).values - own)
        return float(torch.cat(margins).mean())


class RefinerAnchor:
    """The refiner's regression set: crops of its own training renders and G-buffers, each read with a
    wording of its preset, against the source refiner's mean frame over the preset's training wordings."""

    def __init__(self, cfg: "TextAnchorConfig", refiner: nn.Module, source: nn.Module, train: list[torch.Tensor],
                 extra: list[torch.Tensor], empty: torch.Tensor, presets: list[str], log):
        from ..model_zoo.loading import read_metadata
        from .common import config_from_dict
        from .data import ClipSet
        from .refiner import RefinerStageConfig, model_renders

        raw = json.loads(read_metadata(latest_checkpoint(Path(cfg.refiner_run)))["config"])
        ref_cfg = config_from_dict(raw, RefinerStageConfig, f"{cfg.refiner_run} (its refiner stage config)")
        self.clips = ClipSet(ref_cfg.data, "train")
        if list(self.clips.presets) != presets:
            raise AlayaError(f"text-anchor: {cfg.refiner_run} was trained on presets {self.clips.presets}, "
                             f"the student on {presets}")
        self.renders, _ = model_renders(ref_cfg, self.clips, log)  # its cache, unless that model changed since
        # its prompt MLPs: the FiLM of the full- and quarter-resolution features and, in a context refiner,
        # that of the context path
        mlps = [refiner.text] + ([refiner.context_text] if hasattr(refiner, "context_text") else [])
        self.net, self.source, self.text = refiner, source, nn.ModuleList(mlps)
        fewest = min(map(len, train))  # a stack needs as many per preset (the dataset writes 8 for each)
        self.train = torch.stack([t[:fewest] for t in train])  # (P, W, D)
        self.choices = [torch.cat([t, x]) for t, x in zip(train, extra)]  # every wording a crop may read, per preset
        self.empty, self.cfg = empty, cfg

    def crops(self, g: torch.Generator, count: int, preset: int | None = None):
        """`count` random crops: renders (B, 3, k, k), G-buffer planes (B, 9, k, k), their presets."""
        from ..model_zoo.codecs.refiner import gbuffer_planes

        n, p, t, h, w = self.renders.shape[:5]
        k = min(self.cfg.crop, h, w)
        rgb, planes, presets = [], [], []
        for _ in range(count):
            c, q, f = (int(torch.randint(m, (1,), generator=g)) for m in (n, p, t))
            q = q if preset is None else preset
            y, x = (int(torch.randint(m - k + 1, (1,), generator=g)) for m in (h, w))
            rgb.append(torch.from_numpy(self.renders[c, q, f, y:y + k, x:x + k]).permute(2, 0, 1).float() / 255)
            planes.append(gbuffer_planes(torch.from_numpy(self.clips.gbuffers[c, f, :, y:y + k, x:x + k])))
            presets.append(q)
        return torch.stack(rgb), torch.stack(planes), presets

    @torch.no_grad()
    def targets(self, rgb: torch.Tensor, planes: torch.Tensor, presets: list[int]) -> torch.Tensor:
        """The source refiner's mean frame over each crop's preset's training wordings."""
        words = self.train[presets]  # (B, W, D)
        b, m = words.shape[:2]
        with autocast():
            many = self.source(rgb.repeat_interleave(m, 0), planes.repeat_interleave(m, 0), words.flatten(0, 1)).float()
        return many.unflatten(0, (b, m)).mean(1)

    def loss(self, g: torch.Generator, noise: float) -> torch.Tensor:
        rgb, planes, presets = self.crops(g, self.cfg.batch)
        choices = [self.choices[q] for q in presets]
        texts = torch.stack([w[int(torch.randint(len(w), (1,), generator=g))] for w in choices])
        drop = torch.rand((len(presets), 1), generator=g) < self.cfg.prompt_dropout
        texts = perturb_prompts(texts, noise, g) if noise else texts
        texts = torch.where(drop, self.empty.expand_as(texts), texts)
        target = self.targets(rgb, planes, presets)
        with torch.no_grad(), autocast():  # the empty prompt keeps the source's own frame
            alone = self.source(rgb, planes, self.empty.expand(len(presets), -1)).float()
        target = torch.where(drop[:, :, None, None], alone, target)
        with autocast():
            out = self.net(rgb, planes, texts).float()
        return F.l1_loss(out, target) + F.mse_loss(out, target)

    @torch.no_grad()
    def gap(self, net: nn.Module, wordings: list[torch.Tensor], crops: int = 4) -> float:
        """Mean absolute difference between `net`'s frames for wordings (a tensor per preset) and the preset's
        target frame, on the same `crops` crops per preset (seed 0) whatever the net."""
        g = torch.Generator().manual_seed(0)
        diffs = []
        for q, words in enumerate(wordings):
            if not len(words):
                continue
            rgb, planes, presets = self.crops(g, crops, preset=q)
            target = self.targets(rgb, planes, presets)
            for e in words:
                with autocast():
                    out = net(rgb, planes, e.expand(crops, -1)).float()
                diffs.append(float((out - target).abs().mean()))
        return sum(diffs) / max(1, len(diffs))


def _wordings(cfg: TextAnchorConfig) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(presets, training wordings per preset as the dataset lists them, extra wordings per preset)."""
    from .data import dataset_meta
    from .prompts import prompts

    meta = dataset_meta(cfg.data, "train")  # presets and wordings only: no clip is loaded
    presets = list(meta["presets"])
    train = [list(meta["prompts"][p]["train"]) for p in presets]
    if cfg.mix_data:  # the other world's presets too, those data lacks (the wordings of shared ones are data's)
        mix = dataset_meta(cfg.mix_data, "train")
        more = [p for p in mix["presets"] if p not in presets]
        presets += more
        train += [list(mix["prompts"][p]["train"]) for p in more]
    extra = [[w for split in _splits(cfg.extra_split) for w in prompts(p, split) if w not in train[i]]
             for i, p in enumerate(presets)]
    extra = [words[:cfg.extra_wordings or None] for words in extra]
    return presets, train, extra


def _captions(data: str, presets: list[str]) -> list[str]:
    """Every caption a world v2 student reads (each scene kind, each of `presets`, each sun side, and no side),
    or [] for other data. A student trained with `caption_rate` learnt them as prompts of their own."""
    from .data import dataset_meta

    if dataset_meta(data, "train").get("world") != "pathtrace":
        return []
    from ..streaming.world.traced.presets import SIDES, TRACED_PRESETS, caption
    from ..streaming.world.traced.scene import KINDS

    found = {caption(TRACED_PRESETS[p], kind, side) for kind in KINDS for p in presets if p in TRACED_PRESETS
             for side in (None, *SIDES)}
    return sorted(found)


def run_text_anchor(cfg: TextAnchorConfig, log, progress=None) -> int:
    from ..model_zoo.loading import read_metadata
    from .teacher import load_dit

    for key in ("student_run", "refiner_run"):
        run = getattr(cfg, key)
        if run and latest_checkpoint(Path(run)) is None:
            raise AlayaError(f"text-anchor: {key} {run} holds no checkpoint (ckpt-N.safetensors); train that stage first")
    presets, train_words, extra_words = _wordings(cfg)
    captions = _captions(cfg.data, presets)
    if cfg.refiner_run and captions:
        raise AlayaError(f"text-anchor: refiner_run with world v2 data ({cfg.data}) is not supported yet: the refiner "
                         "anchor would move how its captions read; anchor the DiT alone (refiner_run \"\")")
    source = latest_checkpoint(Path(cfg.student_run))
    extra_meta = json.loads(read_metadata(source)["extra"])
    extra_meta.pop("elapsed_s", None)
    if extra_meta.get("text_encoder", MINILM) != MINILM:
        # with several prompt tokens the cross-attention's output depends on the queries too
        raise AlayaError(f"text-anchor: {cfg.student_run} reads {extra_meta['text_encoder']} prompts; the anchor "
                         f"fits one pooled token's cross-attention ({MINILM}) only")
    dit = load_dit(cfg.student_run).float()
    nets: dict[str, nn.Module] = {"dit": dit}
    train = [_embeddings(w) for w in train_words]
    extra = [_embeddings(w) if w else torch.zeros(0, train[0].shape[1]) for w in extra_words]
    empty = _embeddings([""])
    if dit.text_embedding[0].in_features != empty.shape[1]:
        raise AlayaError(f"{cfg.student_run}: the DiT reads {dit.text_embedding[0].in_features}-wide prompts, "
                         f"not MiniLM's {empty.shape[1]}; this stage anchors MiniLM-prompted students")
    if captions:
        log.info("keeping the source's response to %d world v2 captions (every scene kind, preset and sun side)",
                 len(captions))
    anchors = [Anchor(dit, train, extra, empty, _embeddings(captions) if captions else None)]
    if cfg.refiner_run:
        from .refiner import load_run

        refiner, name = load_run(cfg.refiner_run)
        if not refiner.text_dim:
            raise AlayaError(f"{cfg.refiner_run}: its refiner ({name}) reads no prompt; leave refiner_run empty")
        refiner = refiner.float()
        frozen = load_run(cfg.refiner_run)[0].float().eval().requires_grad_(False)  # the targets' source
        nets["refiner"] = refiner
        extra_meta["refiner"] = name
        anchors.append(RefinerAnchor(cfg, refiner, frozen, train, extra, empty, presets, log))
    for net in nets.values():  # only the text MLPs learn; every other weight stays the source's
        net.requires_grad_(False)
    for a in anchors:
        a.text.requires_grad_(True)
    params = [p for a in anchors for p in a.text.parameters()]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    names = ["dit", "refiner"]
    probe, probed = (extra, "extra") if sum(map(len, extra)) else (train, "training")

    def measure() -> str:  # what the probed wordings give against their preset's target
        return ", ".join([f"DiT margin {anchors[0].margin(dit, probe):.3f}"]
                         + [f"refiner gap {a.gap(a.net, probe):.4f}" for a in anchors[1:]])

    log.info("anchoring %d presets: %d training and %d extra wordings (splits: %s); the %s wordings before: %s",
             len(presets), sum(map(len, train_words)), sum(map(len, extra_words)), cfg.extra_split or "none", probed,
             measure())

    def step(i: int) -> dict[str, float]:
        g = step_generator(cfg.seed, i)
        losses = [anchors[0].loss(g, cfg.text_noise, cfg.mixup)] + [a.loss(g, cfg.refiner_text_noise) for a in anchors[1:]]
        opt.zero_grad(set_to_none=True)
        sum(losses).backward()
        for a in anchors:  # each MLP's gradient clipped on its own: the two losses differ in scale
            torch.nn.utils.clip_grad_norm_(a.text.parameters(), 1.0)
        opt.step()
        return {f"{n}_text": v.item() for n, v in zip(names, losses)}

    reached = train_loop(cfg, nets, {"opt_text": opt}, step, log, progress, extra=extra_meta)
    log.info("the %s wordings after: %s", probed, measure())
    return reached
