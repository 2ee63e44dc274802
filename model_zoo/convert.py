"""Other namings of the Wan DiT -> Wan-native keys, applied on load (model.md §3.4).

One table of (pattern, replacement) rules, applied in order to each key. Covers diffusers'
WanTransformer3DModel and Helios (`attn1.to_q`, `condition_embedder.*`, `proj_out`, ...) and the
`model.` prefix of Self-Forcing-style wrappers. Module names never change to suit a naming.
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
WRAPPER_PREFIXES = ("model.", "module.", "dit.")  # training wrappers (Self-Forcing: "model.")


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
