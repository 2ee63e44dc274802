"""A Flash release folder (model_zoo/helios.py has its layout) -> a FlashModel that renders.

- transformer/ + transformer_partial.safetensors: the Helios backbone (helios.load_transformer).
- gbuf_small_encoder.safetensors: the grouped five-branch G-buffer encoder
  (codecs/gbuffer_encoder.py), hidden width read from the shapes. The release's own tensor names are
  not public; read are our grouped names (`encoder.N.*`), the same under a `gbuffer_encoder.`,
  `gbuf_encoder.`, `model.` or `module.` prefix, and five per-branch TAEHV encoders
  (`branches.G.N.*`, `encoders.G.N.*`, `branchG.N.*`), which are joined into the grouped form.
- tiny_decoder/taew2_1_ft.safetensors: TAEHV names as taew2_1 (`decoder.N.*`, with or without the
  `encoder.N.*` half, which rendering does not use).
- The prompt encoder: umT5-XXL for a 4096-wide backbone (the release ships none; found beside the
  folder as for the teacher, or given), MiniLM for a 384-wide one.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from . import helios, published
from .bundle import UMT5_PREFIX, FlashModel, FlashSettings
from .codecs.gbuffer_encoder import GBufferEncoder, GBufferEncoderConfig, join_branches
from .codecs.tiny import CONFIGS as TINY_CONFIGS, TinyCodec, build_encoder
from .errors import AlayaError, CheckpointError
from .loading import check_shapes, read_header, read_state_dict, shape_str
from .precision import preferred_dtype

ENCODER_PREFIXES = ("gbuffer_encoder.", "gbuf_encoder.", "model.", "module.")
BRANCH_RE = re.compile(r"^(?:branches\.|encoders\.|branch)(?P<g>\d)\.(?P<rest>\d+\..+)$")
# What the release renders with by default: 4 steps (the card), the KV-cache sampler's warped
# schedule (a guess: the release states no timesteps), chunks of 4 latent frames (16 pixel frames, the
# sample windows' length; a guess).
RELEASE_SETTINGS = FlashSettings(steps=4, shift=5.0, chunk_frames=4, window_frames=19, sink_frames=1)


def _encoder_state(path: Path) -> dict[str, torch.Tensor]:
    state = read_state_dict(path)
    for prefix in ENCODER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
            break
    branches: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        m = BRANCH_RE.match(key)
        if m:
            branches.setdefault(int(m["g"]), {})["encoder." + m["rest"]] = value
    if branches:
        if sorted(branches) != list(range(5)) or len(state) != sum(map(len, branches.values())):
            raise CheckpointError(f"{path}: per-branch names for branches {sorted(branches)}; a G-buffer encoder has "
                                  "exactly branches 0-4 (albedo, depth, metallic, normal, roughness) and nothing else")
        try:
            return join_branches([branches[g] for g in range(5)])
        except AlayaError as err:
            raise CheckpointError(f"{path}: {err}") from None
    return state


def load_encoder(path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> GBufferEncoder:
    """The release's G-buffer encoder, hidden width from its first conv, loaded strictly."""
    path = Path(path)
    state = _encoder_state(path)
    first = state.get("encoder.0.weight")
    if first is None or first.ndim != 4:
        raise CheckpointError(f"{path}: no encoder.0.weight (the first conv of a G-buffer encoder); "
                              f"its tensors start {', '.join(sorted(state)[:3])}")
    if first.shape[0] % 5:
        raise CheckpointError(f"{path}: encoder.0.weight is {shape_str(first.shape)}; five branches need a multiple of 5 rows")
    module = GBufferEncoder(GBufferEncoderConfig(hidden=first.shape[0] // 5))
    _load(module, state, path)
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_decoder(path: str | Path, device="cpu", dtype: torch.dtype = torch.float32) -> TinyCodec:
    """taew2_1_ft as taew2_1: decoder.* (and encoder.* when present), strictly."""
    path = Path(path)
    state = read_state_dict(path)
    codec = TinyCodec(TINY_CONFIGS["taew2_1"])
    if not any(k.startswith("encoder.") for k in state):  # a decoder-only file: no encoder half to hold
        codec.encoder = nn.Sequential()
        codec.decoder_only = True
    _load(codec, state, path)
    return codec.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _load(module: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    check_shapes({k: tuple(v.shape) for k, v in module.state_dict().items()},
                 {k: tuple(v.shape) for k, v in state.items()}, str(path))
    module.load_state_dict(state, strict=True)


def text_encoder_for(folder: Path, text_dim: int, text_encoder: str | None = None) -> str:
    """The prompt encoder's name for a backbone of this width (umT5 found beside the folder, else unnamed)."""
    if text_encoder:
        return text_encoder if text_encoder.startswith(UMT5_PREFIX) or text_encoder == "all-minilm-l6-v2" \
            else UMT5_PREFIX + str(text_encoder)
    if text_dim == 384:
        return "all-minilm-l6-v2"
    found = published.find_text_encoder(folder / helios.TRANSFORMER_DIR)
    return f"{UMT5_PREFIX}{found}" if found else "umt5-xxl"


def load_release(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 text_encoder: str | None = None) -> FlashModel:
    """A release folder as a FlashModel (sampler kind "history"); a missing file is one line naming it."""
    folder = Path(folder)
    missing = helios.missing_files(folder)
    if missing:
        raise CheckpointError(f"{folder}: a Flash release lacks {', '.join(missing)} "
                              f"({'; '.join(helios.RELEASE_FILES[m] for m in missing)})")
    dtype = dtype or preferred_dtype(device)
    backbone = helios.load_transformer(folder, device, dtype)
    encoder = load_encoder(folder / helios.ENCODER_FILE, device, dtype)
    decoder = load_decoder(folder / helios.DECODER_FILE, device, dtype)
    text = text_encoder_for(folder, backbone.dit.config.text_dim, text_encoder)
    return FlashModel(backbone.dit, encoder, decoder, settings=RELEASE_SETTINGS, text_encoder_name=text, path=folder)


def describe_release(folder: str | Path) -> tuple[list[str], bool]:
    """`model identify` lines for a release folder (names and shapes checked, nothing loaded but the
    two small codecs) and whether it renders as it is."""
    folder = Path(folder)
    lines = [f"{folder}: an AlayaRenderer-Flash release (diffusers {helios.HELIOS_CLASS}; compressed-history sampler)"]
    absent = helios.missing_files(folder)
    missing = [f"{m} ({helios.RELEASE_FILES[m]})" for m in absent]
    ok = True
    text_dim = None
    if helios.TRANSFORMER_DIR not in absent:
        try:
            plan = helios.plan_transformer(folder)
            c = plan.module.config
            text_dim = c.text_dim
            lines.append(f"  {helios.TRANSFORMER_DIR}/: {helios.HELIOS_CLASS} (in {c.in_channels}, dim "
                         f"{c.num_attention_heads * c.attention_head_dim}, {c.num_layers} layers, {c.num_attention_heads} heads, "
                         f"text {c.text_dim}); {plan.layout}")
            if (folder / helios.PARTIAL_FILE).is_file():
                lines.append(f"  {helios.PARTIAL_FILE}: {plan.overlaid} tensors loaded on top; memory patchifiers take "
                             f"{plan.module.patch_short.in_channels} channels")
            if plan.unused:
                lines.append(f"  unused ({len(plan.unused)}): {', '.join(plan.unused)}; {helios.WITHOUT_UNUSED}")
        except AlayaError as err:
            lines.append(f"  {helios.TRANSFORMER_DIR}/: {err}")
            ok = False
    for name, loader, what in ((helios.ENCODER_FILE, load_encoder, "grouped G-buffer encoder"),
                               (helios.DECODER_FILE, load_decoder, "tiny decoder, taew2_1 layout")):
        path = folder / name
        if not path.is_file():
            continue
        try:
            module = loader(path, "cpu", torch.float32)
        except AlayaError as err:
            lines.append(f"  {name}: {err}")
            ok = False
            continue
        detail = f"hidden {module.config.hidden}" if name == helios.ENCODER_FILE else \
            ("decoder only" if getattr(module, "decoder_only", False) else "encoder + decoder")
        dtypes = {d for _s, d in read_header(path).values()}
        lines.append(f"  {name}: {what} ({detail}); dtype {', '.join(sorted(dtypes))}")
    if text_dim == published.UMT5_DIM:
        found = published.find_text_encoder(folder / helios.TRANSFORMER_DIR)
        if found is None:
            missing.append("text encoder (umT5-XXL: --text-encoder, or ComfyUI's text_encoders/umt5_xxl_*.safetensors)")
        else:
            lines.append(f"  text encoder: umT5-XXL {found}")
    lines.append(f"  missing: {', '.join(missing)}" if missing else ("  nothing missing to render" if ok else "  see above"))
    return lines, ok


RANDOM_BACKBONES = {  # bench and tests: the release's structure at a named size, random weights
    "helios-flash-1.3b": helios.FLASH_1_3B,  # the release's size (research model.md 2.2)
    "helios-flash-small": {**helios.FLASH_1_3B, "num_attention_heads": 6, "attention_head_dim": 64, "ffn_dim": 1536,
                           "num_layers": 6, "rope_dim": [24, 20, 20]},  # dit-small's widths, for CPU comparisons with the KV-cache sampler
}


def make_random_release(name: str = "helios-flash-small", device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32, encoder_hidden: int = 128, seed: int = 0) -> FlashModel:
    """A release-shaped FlashModel with RANDOM weights: the named backbone (prompts MiniLM-wide, 384),
    the grouped encoder at `encoder_hidden`, taew2_1. Speed does not depend on the weights' values."""
    if name not in RANDOM_BACKBONES:
        raise AlayaError(f"unknown release backbone {name!r}; known: {', '.join(RANDOM_BACKBONES)}")
    torch.manual_seed(seed)
    transformer = helios.build_transformer({**RANDOM_BACKBONES[name], "text_dim": 384}, device=device, dtype=dtype)
    encoder = GBufferEncoder(GBufferEncoderConfig(hidden=encoder_hidden)).to(device=device, dtype=dtype)
    decoder = TinyCodec(TINY_CONFIGS["taew2_1"]).to(device=device, dtype=dtype)
    return FlashModel(helios.HeliosDiT(transformer.eval().requires_grad_(False)), encoder.eval().requires_grad_(False),
                      decoder.eval().requires_grad_(False), settings=RELEASE_SETTINGS, random_weights=True)
