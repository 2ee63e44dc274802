"""A student that reads the light: the G-buffer encoder's sixth branch and the DiT's wider input.

The light-reading encoder ("gbuffer-encoder-slim-lit", model_zoo/codecs/gbuffer_encoder.py) adds one
branch for the shading prior's image of each frame. It starts as the tiny codec's RGB encoder, which
maps an image to the latent space the DiT writes, so the new 16 channels are a lit guess of the answer;
the DiT's patch embedding gains 16 input columns that start at zero, so the widened student renders
exactly what it rendered before and learns from there how far to trust the guess
(tests/test_light_reading.py).

In the latent cache (training/latent_data.py) the prior's channels depend on the preset's light, so
they are kept per (window, preset) beside the passes' channels, one tensor per way the light comes:
"lit" (each clip's recorded light), "lit_pass" (that light with the recorded sun visibility as the
shadows: an engine's shadow pass), "lit_prompt" (the light head's reading of the prompt).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from ..model_zoo import dit
from ..model_zoo.codecs import gbuffer_encoder
from ..model_zoo.errors import AlayaError

LIT_CONFIG = "gbuffer-encoder-slim-lit"
VARIANTS = ("lit", "lit_pass", "lit_prompt")  # latent cache keys, see the module docstring


def lit_encoder(passes: gbuffer_encoder.GBufferEncoder, rgb_encoder: dict[str, torch.Tensor]) -> gbuffer_encoder.GBufferEncoder:
    """The five-branch `passes` encoder with a sixth branch for the prior's image, copied from `rgb_encoder`
    (a tiny codec's `encoder.*` weights at the same width)."""
    cfg = gbuffer_encoder.CONFIGS[LIT_CONFIG]
    if passes.config.reads_light:
        return passes
    if passes.config.hidden != cfg.hidden or passes.config.branches != 5:
        raise AlayaError(f"light-reading encoder: starts from a five-branch encoder of width {cfg.hidden}, got "
                         f"{passes.config.branches} branches of width {passes.config.hidden}")
    branches = gbuffer_encoder.split_branches(passes.state_dict(), passes.config.branches)
    rgb = {k: v.float() for k, v in rgb_encoder.items() if k.startswith("encoder.")}
    if rgb.keys() != branches[0].keys() or any(rgb[k].shape != branches[0][k].shape for k in rgb):
        raise AlayaError(f"light-reading encoder: the tiny codec's encoder is not a branch of width {cfg.hidden}")
    lit = gbuffer_encoder.build(cfg)
    lit.load_state_dict(gbuffer_encoder.join_branches([*branches, rgb]), strict=True)
    return lit


def widen_inputs(model: dit.WanDiT, channels: int) -> dit.WanDiT:
    """`model` reading `channels` more conditioning channels after its own, whose patch-embedding weights
    start at zero (the widened model computes exactly what `model` did)."""
    cfg = dataclasses.replace(model.config, in_dim=model.config.in_dim + channels)
    wide = dit.build(cfg)
    state = dict(model.state_dict())
    w = state["patch_embedding.weight"]
    state["patch_embedding.weight"] = torch.cat([w, w.new_zeros(w.shape[0], channels, *w.shape[2:])], 1)
    wide.load_state_dict(state, strict=True)
    return wide


def run_encoder(run: str | Path) -> gbuffer_encoder.GBufferEncoder | None:
    """The G-buffer encoder a run's latest checkpoint holds (a codecs run, or a light-reading student run),
    None when it holds none."""
    from ..model_zoo.loading import load_strict, read_metadata
    from .common import final_weights, latest_checkpoint

    ckpt = latest_checkpoint(Path(run))
    if ckpt is None:
        raise AlayaError(f"{run}: no checkpoint here; run that stage first")
    name = json.loads(read_metadata(ckpt).get("extra", "{}")).get("gbuffer_encoder")
    if name is None:
        return None
    enc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[name])
    load_strict(enc, final_weights(Path(run), "gbuffer_encoder"))
    return enc.eval()


def light_reading_student(student_run: str | Path, codecs_run: str | Path, log=None) -> tuple[dit.WanDiT, gbuffer_encoder.GBufferEncoder]:
    """The student and its light-reading encoder: a light-reading run's own, or made from a five-branch
    student (widen_inputs) and codecs_run's encoder and tiny codec (lit_encoder)."""
    from .common import final_weights
    from .teacher import load_dit

    student = load_dit(student_run)
    own = run_encoder(student_run)
    if own is not None and own.config.reads_light:
        return student, own
    passes = run_encoder(codecs_run)
    if passes is None:
        raise AlayaError(f"{codecs_run}: holds no G-buffer encoder (a codecs or decoder run does)")
    enc = lit_encoder(passes, final_weights(Path(codecs_run), "tiny"))
    extra = enc.config.out_channels - student.config.cond_dim
    if extra != enc.config.latent_channels:
        raise AlayaError(f"{student_run}: its DiT reads {student.config.cond_dim} conditioning channels; a light-reading "
                         f"student starts from one reading the five passes' {passes.config.out_channels}")
    if log:
        log.info("light-reading student: %s's DiT widened by %d zero input channels, %s's encoder given the prior's "
                 "branch (its tiny codec's encoder)", student_run, extra, codecs_run)
    return widen_inputs(student, extra), enc.eval()
