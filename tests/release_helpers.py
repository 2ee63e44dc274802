"""A tiny random Flash release in the published layout (model_zoo/helios.py), written from diffusers'
own HeliosTransformer3DModel at a tiny config: transformer/ by save_pretrained, the partial file
(96-channel patch embedding, memory patchifiers, output table, text-sink tensors) on top, the grouped
G-buffer encoder and taew2_1-layout decoder."""
from __future__ import annotations

from pathlib import Path

import torch

from alaya_flash.model_zoo import helios
from alaya_flash.model_zoo.codecs.gbuffer_encoder import GBufferEncoder, GBufferEncoderConfig, split_branches
from alaya_flash.model_zoo.codecs.tiny import CONFIGS as TINY_CONFIGS, TinyCodec
from alaya_flash.model_zoo.loading import save_safetensors

# Wan-1.3B's structure at a tiny width; prompts MiniLM-wide (384) so tests need no umT5.
TINY = dict(helios.FLASH_1_3B, num_attention_heads=2, attention_head_dim=16, ffn_dim=64, num_layers=2,
            text_dim=384, freq_dim=32, rope_dim=[4, 6, 6])
TEXT_SINK = {"text_sink.tokens": (4, 384), "text_sink.proj.weight": (32, 384)}  # names a reader cannot know


def tiny_transformer(seed: int = 0, history_channels: int | None = None, **overrides):
    torch.manual_seed(seed)
    model = helios.build_transformer({**TINY, **overrides}, history_channels=history_channels).eval()
    with torch.no_grad():  # zero-initialised parts random too, so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def partial_state(model, history_channels: int = 96, seed: int = 1) -> dict[str, torch.Tensor]:
    """The partial file's tensors: new values for the patch embedding, patchifiers and output table, plus text-sink tensors."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name in ("patch_embedding", *helios.MEMORY_PATCHES):
        conv = getattr(model, name)
        shape = list(conv.weight.shape)
        if name != "patch_embedding":
            shape[1] = history_channels
        out[f"{name}.weight"] = torch.randn(shape, generator=g) * 0.05
        out[f"{name}.bias"] = torch.randn(conv.bias.shape, generator=g) * 0.05
    out["norm_out.scale_shift_table"] = torch.randn(model.norm_out.scale_shift_table.shape, generator=g) * 0.1
    for key, (n, _width) in TEXT_SINK.items():
        out[key] = torch.randn(n, model.config.text_dim, generator=g)
    return out


def write_tiny_release(folder: Path, history_channels: int = 96, encoder_names: str = "grouped",
                       decoder_only: bool = False, text_dim: int = 384) -> Path:
    """RELEASE/transformer/, transformer_partial.safetensors, gbuf_small_encoder.safetensors, tiny_decoder/taew2_1_ft.safetensors."""
    folder = Path(folder)
    model = tiny_transformer(text_dim=text_dim)
    model.save_pretrained(folder / helios.TRANSFORMER_DIR)
    save_safetensors(partial_state(model, history_channels), folder / helios.PARTIAL_FILE)
    torch.manual_seed(2)
    encoder = GBufferEncoder(GBufferEncoderConfig(hidden=8))
    state = encoder.state_dict()
    if encoder_names == "branches":  # five TAEHV encoders side by side
        state = {f"branches.{g}.{k.removeprefix('encoder.')}": v for g, part in enumerate(split_branches(state))
                 for k, v in part.items()}
    save_safetensors(state, folder / helios.ENCODER_FILE)
    torch.manual_seed(3)
    codec = TinyCodec(TINY_CONFIGS["taew2_1"])
    state = codec.state_dict()
    if decoder_only:
        state = {k: v for k, v in state.items() if k.startswith("decoder.")}
    save_safetensors(state, folder / helios.DECODER_FILE)
    return folder
