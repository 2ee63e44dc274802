"""Other namings of the Wan DiT -> Wan-native keys, applied on load (model.md §3.4).

One table of (pattern, replacement) rules, applied in order to each key. Covers diffusers'
WanTransformer3DModel and Helios (`attn1.to_q`, `condition_embedder.*`, `proj_out`, ...) and the
`model.` prefix of Self-Forcing-style wrappers. Module names never change to suit a naming.

The Wan2.1 VAE: diffusers' AutoencoderKLWan naming (`encoder.conv_in`, `down_blocks.N.norm1`,
`mid_block.resnets.N`, `decoder.up_blocks.S.resnets.R`, `upsamplers.0`, `quant_conv`, ...) ->
Wan-native (`encoder.conv1`, `downsamples.N.residual.0`, `middle.0`, `decoder.upsamples.I`,
`conv1`, ...) by `vae_to_wan`; the decoder's flat index is S * (num_res_blocks + 2) + R.
"""
from __future__ import annotations

import re
from typing import Mapping

import torch

# diffusers / Helios name -> Wan-native name (model.md §3.4)
DIFFUSERS_TO_WAN: list[tuple[str, str]] = [
    (r"^blocks\.(\d+)\.attn1\.to_q\.", r"blocks.\1.self_attn.q."),
    (r"^blocks\.(\d+)\.attn1\.to_k\.", r"blocks.\1.self_attn.k."),
    (r"^blocks\.(\d+)\.attn1\.to_v\.", r"blocks.\1.self_attn.v."),
    (r"^blocks\.(\d+)\.attn1\.to_out\.0\.", r"blocks.\1.self_attn.o."),
    (r"^blocks\.(\d+)\.attn1\.norm_(q|k)\.", r"blocks.\1.self_attn.norm_\2."),
    (r"^blocks\.(\d+)\.attn2\.to_q\.", r"blocks.\1.cross_attn.q."),
    (r"^blocks\.(\d+)\.attn2\.to_k\.", r"blocks.\1.cross_attn.k."),
    (r"^blocks\.(\d+)\.attn2\.to_v\.", r"blocks.\1.cross_attn.v."),
    (r"^blocks\.(\d+)\.attn2\.to_out\.0\.", r"blocks.\1.cross_attn.o."),
    (r"^blocks\.(\d+)\.attn2\.norm_(q|k)\.", r"blocks.\1.cross_attn.norm_\2."),
    (r"^blocks\.(\d+)\.norm2\.", r"blocks.\1.norm3."),  # the affine norm before cross-attention
    (r"^blocks\.(\d+)\.ffn\.net\.0\.proj\.", r"blocks.\1.ffn.0."),
    (r"^blocks\.(\d+)\.ffn\.net\.2\.", r"blocks.\1.ffn.2."),
    (r"^blocks\.(\d+)\.scale_shift_table$", r"blocks.\1.modulation"),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^proj_out\.", "head.head."),
    (r"^scale_shift_table$", "head.modulation"),  # diffusers Wan
    (r"^norm_out\.scale_shift_table$", "head.modulation"),  # Helios
]
_RULES = [(re.compile(p), r) for p, r in DIFFUSERS_TO_WAN]
# Wrappers around a DiT's keys, longest first: ComfyUI checkpoints and ModelSave files
# ("model.diffusion_model."), training wrappers (Self-Forcing: "model.").
WRAPPER_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.", "module.", "dit.")


def wan_name(key: str) -> str:
    """One key in any known naming -> its Wan-native name (unknown keys are returned unchanged)."""
    for prefix in WRAPPER_PREFIXES:  # no Wan or diffusers DiT key starts with these
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    for pattern, repl in _RULES:
        new, n = pattern.subn(repl, key)
        if n:
            return new
    return key


def naming(keys) -> str:
    """'wan' when the keys are Wan-native, 'diffusers' when any follows diffusers' naming."""
    return "diffusers" if any(wan_name(k) != k for k in keys) else "wan"


def to_wan(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A DiT state dict in any known naming -> Wan-native names (use as load_strict's convert=)."""
    return {wan_name(k): v for k, v in state.items()}


def wan_to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Wan-native -> diffusers naming (for tests and export); inverse of to_wan on diffusers Wan keys."""
    inverse = [
        (r"^blocks\.(\d+)\.self_attn\.(q|k|v)\.", lambda m: f"blocks.{m[1]}.attn1.to_{m[2]}."),
        (r"^blocks\.(\d+)\.self_attn\.o\.", lambda m: f"blocks.{m[1]}.attn1.to_out.0."),
        (r"^blocks\.(\d+)\.self_attn\.norm_(q|k)\.", lambda m: f"blocks.{m[1]}.attn1.norm_{m[2]}."),
        (r"^blocks\.(\d+)\.cross_attn\.(q|k|v)\.", lambda m: f"blocks.{m[1]}.attn2.to_{m[2]}."),
        (r"^blocks\.(\d+)\.cross_attn\.o\.", lambda m: f"blocks.{m[1]}.attn2.to_out.0."),
        (r"^blocks\.(\d+)\.cross_attn\.norm_(q|k)\.", lambda m: f"blocks.{m[1]}.attn2.norm_{m[2]}."),
        (r"^blocks\.(\d+)\.norm3\.", lambda m: f"blocks.{m[1]}.norm2."),
        (r"^blocks\.(\d+)\.ffn\.0\.", lambda m: f"blocks.{m[1]}.ffn.net.0.proj."),
        (r"^blocks\.(\d+)\.ffn\.2\.", lambda m: f"blocks.{m[1]}.ffn.net.2."),
        (r"^blocks\.(\d+)\.modulation$", lambda m: f"blocks.{m[1]}.scale_shift_table"),
        (r"^text_embedding\.0\.", lambda m: "condition_embedder.text_embedder.linear_1."),
        (r"^text_embedding\.2\.", lambda m: "condition_embedder.text_embedder.linear_2."),
        (r"^time_embedding\.0\.", lambda m: "condition_embedder.time_embedder.linear_1."),
        (r"^time_embedding\.2\.", lambda m: "condition_embedder.time_embedder.linear_2."),
        (r"^time_projection\.1\.", lambda m: "condition_embedder.time_proj."),
        (r"^head\.head\.", lambda m: "proj_out."),
        (r"^head\.modulation$", lambda m: "scale_shift_table"),
    ]
    out = {}
    for key, value in state.items():
        for pattern, repl in inverse:
            new, n = re.subn(pattern, repl, key)
            if n:
                key = new
                break
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# The Wan2.1 VAE: diffusers AutoencoderKLWan <-> Wan-native (wan/modules/vae.py, ComfyUI's
# wan_2.1_vae.safetensors). Checked against diffusers' own key list in tests/data.

# inside one residual block: diffusers -> Wan (the index into Wan's `residual` Sequential)
_RES_TO_WAN = {"norm1.": "residual.0.", "conv1.": "residual.2.", "norm2.": "residual.3.", "conv2.": "residual.6.",
               "conv_shortcut.": "shortcut."}
_RES_TO_DIFFUSERS = {v: k for k, v in _RES_TO_WAN.items()}
_VAE_FIXED = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2.", "encoder.conv_in.": "encoder.conv1.",
              "decoder.conv_in.": "decoder.conv1.", "encoder.norm_out.": "encoder.head.0.",
              "encoder.conv_out.": "encoder.head.2.", "decoder.norm_out.": "decoder.head.0.",
              "decoder.conv_out.": "decoder.head.2."}


def _res(rest: str, table: dict[str, str]) -> str:
    for a, b in table.items():
        if rest.startswith(a):
            return b + rest[len(a):]
    return rest  # resample.1.*, time_conv.*, attention parts: the same in both namings


def vae_wan_name(key: str, num_res_blocks: int = 2) -> str:
    """One Wan VAE key in diffusers' naming -> Wan-native (Wan-native keys are returned unchanged)."""
    for a, b in _VAE_FIXED.items():
        if key.startswith(a):
            return b + key[len(a):]
    m = re.match(r"^(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d+)\.(.*)$", key)
    if m:
        side, kind, i, rest = m.groups()
        if kind == "attentions":
            return f"{side}.middle.1.{rest}"
        return f"{side}.middle.{2 * int(i)}.{_res(rest, _RES_TO_WAN)}"
    m = re.match(r"^encoder\.down_blocks\.(\d+)\.(.*)$", key)
    if m:
        return f"encoder.downsamples.{m[1]}.{_res(m[2], _RES_TO_WAN)}"
    m = re.match(r"^decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.*)$", key)
    if m:
        stage, _, r, rest = m.groups()
        base = int(stage) * (num_res_blocks + 2)
        if r is None:  # the stage's upsample follows its num_res_blocks + 1 residual blocks
            return f"decoder.upsamples.{base + num_res_blocks + 1}.{rest}"
        return f"decoder.upsamples.{base + int(r)}.{_res(rest, _RES_TO_WAN)}"
    return key


def vae_wan_to_diffusers_name(key: str, num_res_blocks: int = 2) -> str:
    """The inverse of vae_wan_name (tests and export)."""
    for a, b in _VAE_FIXED.items():
        if key.startswith(b):
            return a + key[len(b):]
    m = re.match(r"^(encoder|decoder)\.middle\.(\d)\.(.*)$", key)
    if m:
        side, i, rest = m.groups()
        if i == "1":
            return f"{side}.mid_block.attentions.0.{rest}"
        return f"{side}.mid_block.resnets.{int(i) // 2}.{_res(rest, _RES_TO_DIFFUSERS)}"
    m = re.match(r"^encoder\.downsamples\.(\d+)\.(.*)$", key)
    if m:
        return f"encoder.down_blocks.{m[1]}.{_res(m[2], _RES_TO_DIFFUSERS)}"
    m = re.match(r"^decoder\.upsamples\.(\d+)\.(.*)$", key)
    if m:
        stage, r = divmod(int(m[1]), num_res_blocks + 2)
        if r == num_res_blocks + 1:
            return f"decoder.up_blocks.{stage}.upsamplers.0.{m[2]}"
        return f"decoder.up_blocks.{stage}.resnets.{r}.{_res(m[2], _RES_TO_DIFFUSERS)}"
    return key


def vae_naming(keys) -> str:
    """'diffusers' when the VAE keys follow AutoencoderKLWan's naming, else 'wan'."""
    return "diffusers" if any(".mid_block." in k or ".down_blocks." in k or ".up_blocks." in k or k.startswith("quant_conv.")
                              for k in keys) else "wan"


def vae_num_res_blocks(keys) -> int:
    """num_res_blocks of a diffusers-named Wan VAE (its first up block holds num_res_blocks + 1 resnets); 2 if unseen."""
    found = {int(m[1]) for k in keys if (m := re.match(r"^decoder\.up_blocks\.0\.resnets\.(\d+)\.", k))}
    return max(found) if found else 2


def vae_to_wan(state: Mapping[str, torch.Tensor], num_res_blocks: int | None = None) -> dict:
    """A Wan VAE state (or shape) dict in diffusers' or Wan's naming -> Wan-native names."""
    if vae_naming(state) == "wan":
        return dict(state)
    nrb = vae_num_res_blocks(state) if num_res_blocks is None else num_res_blocks
    return {vae_wan_name(k, nrb): v for k, v in state.items()}


def vae_wan_to_diffusers(state: Mapping[str, torch.Tensor], num_res_blocks: int = 2) -> dict:
    """Wan-native VAE names -> diffusers' AutoencoderKLWan naming (tests and export)."""
    return {vae_wan_to_diffusers_name(k, num_res_blocks): v for k, v in state.items()}
