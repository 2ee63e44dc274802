"""The AlayaRenderer-Flash release: diffusers' HeliosTransformer3DModel plus the release's own files.

The published release (docs/model.md, "The Flash release") is a folder:

    RELEASE/
      transformer/                          diffusers layout: config.json + weights (one file or shards + index)
      transformer_partial.safetensors       loaded on top: 96-channel patch embedding, memory patchifiers,
                                            norm_out.scale_shift_table, text-sink weights
      gbuf_small_encoder.safetensors        the grouped 5-branch G-buffer encoder (hidden 128)
      tiny_decoder/taew2_1_ft.safetensors   TAEHV taew2_1, fine-tuned

The backbone is diffusers' own class (the `release` extra: diffusers >= 0.42), never a copy. Its
config comes from transformer/config.json; the partial file's tensors replace the ones of the same
name. The memory patchifiers (patch_short/mid/long) take either every input channel (latents and
G-buffer latents: 96) or the latents alone (16); which one is read from the partial file's shapes
and the modules are rebuilt to match. Every stored tensor that is not a parameter of the model is
reported by name and shape (`HeliosDiT.unused`), with what the render does without it.

`HeliosDiT` wraps the transformer behind the interface the samplers use: `forward(x, t, prompt_emb,
history)` with x = [noisy latents | G-buffer latents] on channels, exactly the teacher's input, and
`history` the long/mid/short windows and their fixed frame positions (streaming/render/history_sampler.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from .errors import AlayaError, CheckpointError
from . import jsonfile
from .loading import LazyReader, materialize, read_header, shape_str
from .precision import preferred_dtype
from .weight_files import unit_parts  # the same shard and index checks as the teacher's files

log = logging.getLogger(__name__)

TRANSFORMER_DIR = "transformer"
PARTIAL_FILE = "transformer_partial.safetensors"
ENCODER_FILE = "gbuf_small_encoder.safetensors"
DECODER_FILE = "tiny_decoder/taew2_1_ft.safetensors"
RELEASE_FILES = {  # what each file is, as `model identify` names it
    TRANSFORMER_DIR: "Helios transformer (diffusers layout)",
    PARTIAL_FILE: "partial transformer weights (G-buffer patch embedding, memory patchifiers, text sink)",
    ENCODER_FILE: "grouped G-buffer encoder",
    DECODER_FILE: "tiny decoder (taew2_1_ft)",
}
HELIOS_CLASS = "HeliosTransformer3DModel"
MEMORY_PATCHES = ("patch_short", "patch_mid", "patch_long")
# Wan-1.3B size with the teacher's 96 input channels (research/model.md 2.2: the card's "1.3B,
# 96 input channels"); what a release's transformer/config.json is expected to say.
FLASH_1_3B = {
    "patch_size": [1, 2, 2], "num_attention_heads": 12, "attention_head_dim": 128, "in_channels": 96,
    "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30,
    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_dim": [44, 42, 42],
    "rope_theta": 10000.0, "guidance_cross_attn": True, "zero_history_timestep": True,
    "has_multi_term_memory_patch": True,
}  # fmt: skip
# What a render does without stored tensors the model has no parameter for.
WITHOUT_UNUSED = ("diffusers' HeliosTransformer3DModel has no parameter for them; the render runs without them: "
                  "the prompt reaches the model through cross-attention only (no text-sink tokens), so prompt "
                  "adherence can differ from the release's own renderer")


def helios_class():
    """diffusers' HeliosTransformer3DModel, or one clear line on what to install."""
    try:
        import diffusers
    except ImportError:
        raise AlayaError("the Flash release needs diffusers with HeliosTransformer3DModel (0.42 or later): "
                         "pip install 'alaya-flash[release]'") from None
    cls = getattr(diffusers, HELIOS_CLASS, None)
    if cls is None:
        raise AlayaError(f"diffusers {diffusers.__version__} has no {HELIOS_CLASS} (added in 0.42): "
                         "pip install 'alaya-flash[release]'")
    return cls


def is_release(folder: str | Path) -> bool:
    """A folder in the release's layout (its partial file, or a Helios transformer/ beside the codecs)."""
    folder = Path(folder)
    if not folder.is_dir():
        return False
    if (folder / PARTIAL_FILE).is_file():
        return True
    return _class_name(folder / TRANSFORMER_DIR / "config.json") == HELIOS_CLASS


def _class_name(path: Path) -> str | None:
    try:
        return jsonfile.loads(path.read_text(encoding="utf-8")).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None


def missing_files(folder: str | Path) -> list[str]:
    """The release's files absent from folder (in RELEASE_FILES order)."""
    folder = Path(folder)
    out = []
    for name in RELEASE_FILES:
        p = folder / name
        present = (p / "config.json").is_file() if name == TRANSFORMER_DIR else p.is_file()
        if not present:
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class HeliosShape:
    """What the samplers and pipelines read of a Helios backbone (the Wan DiT's config has the same names)."""

    in_dim: int  # latents + G-buffer latents (96)
    out_dim: int  # latent channels (16)
    text_dim: int
    dim: int
    layers: int
    history_channels: int  # what the memory patchifiers take: in_dim (latents + G-buffers) or out_dim

    @property
    def cond_dim(self) -> int:
        return self.in_dim - self.out_dim


@dataclass
class HistoryWindows:
    """One chunk's compressed history, as diffusers' Helios forward takes it: latents (B, C, T, h, w)
    and their frame positions (1, T) for the long, mid and short windows."""

    long: Tensor
    mid: Tensor
    short: Tensor
    positions_long: Tensor
    positions_mid: Tensor
    positions_short: Tensor
    positions_chunk: Tensor


class HeliosDiT(nn.Module):
    """diffusers' HeliosTransformer3DModel behind the samplers' interface (sampler kind "history")."""

    sampler_kind = "history"

    def __init__(self, transformer: nn.Module, unused: list[str] | None = None):
        super().__init__()
        self.transformer = transformer
        c = transformer.config
        if not getattr(c, "has_multi_term_memory_patch", False):
            raise AlayaError(f"{HELIOS_CLASS} without memory patchifiers (has_multi_term_memory_patch false) "
                             "cannot stream with compressed history")
        self.config = HeliosShape(
            in_dim=c.in_channels, out_dim=c.out_channels or c.in_channels, text_dim=c.text_dim,
            dim=c.num_attention_heads * c.attention_head_dim, layers=c.num_layers,
            history_channels=transformer.patch_short.in_channels,
        )
        self.unused: list[str] = list(unused or [])  # "name [shape]" of stored tensors the model does not use

    def forward(self, x: Tensor, t: Tensor, prompt_emb: Tensor, history: HistoryWindows) -> Tensor:
        """x (B, in_dim, T, h, w), t (B,) in [0, 1000], prompt_emb (B, L, text_dim) -> velocity (B, out_dim, T, h, w)."""
        dtype = self.transformer.patch_embedding.weight.dtype
        out = self.transformer(
            hidden_states=x.to(dtype), timestep=t, encoder_hidden_states=prompt_emb.to(dtype),
            indices_hidden_states=history.positions_chunk,
            indices_latents_history_short=history.positions_short,
            indices_latents_history_mid=history.positions_mid,
            indices_latents_history_long=history.positions_long,
            latents_history_short=history.short.to(dtype), latents_history_mid=history.mid.to(dtype),
            latents_history_long=history.long.to(dtype), return_dict=False,
        )[0]
        return out.float()


def _set_memory_channels(transformer: nn.Module, channels: int) -> None:
    """Rebuild the three memory patchifiers to take `channels` inputs (kernel and stride unchanged)."""
    for name in MEMORY_PATCHES:
        old = getattr(transformer, name)
        if old.in_channels == channels:
            continue
        new = nn.Conv3d(channels, old.out_channels, kernel_size=old.kernel_size, stride=old.stride,
                        device=old.weight.device, dtype=old.weight.dtype)
        setattr(transformer, name, new)


def build_transformer(config: dict, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                      history_channels: int | None = None) -> nn.Module:
    """The diffusers transformer from its config dict (keys starting with '_' ignored), on device in
    dtype, with diffusers' float32 modules kept in float32; random weights unless on the meta device."""
    cls = helios_class()
    kwargs = {k: v for k, v in config.items() if not k.startswith("_")}
    try:
        with torch.device(device):
            model = cls.from_config(kwargs)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{HELIOS_CLASS} config: {err}") from None
    if history_channels is not None:
        with torch.device(device):
            _set_memory_channels(model, history_channels)
    return _cast(model, dtype)


def _cast(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """dtype everywhere except the modules diffusers keeps in float32 (time embedder, tables, norms).
    Cast tensor by tensor: diffusers warns on a whole-model .to(dtype), which would not keep them."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model


# ---------------------------------------------------------------------------------------------
# Loading a release


@dataclass
class _Stored:
    """Tensors on disk: name -> (file, key, shape)."""

    refs: dict[str, tuple[Path, str, tuple[int, ...]]] = field(default_factory=dict)

    def add(self, path: Path, header: dict) -> None:
        for key, (shape, _dtype) in header.items():
            self.refs[key] = (path, key, tuple(shape))


def _transformer_files(folder: Path) -> tuple[dict, _Stored, str]:
    """transformer/: its config and the tensors of its weights (one file, or shards through the index)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: missing config.json (the release's transformer/ is a diffusers folder)")
    try:
        config = jsonfile.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise CheckpointError(f"{config_path}: malformed JSON ({err})") from None
    if not isinstance(config, dict) or config.get("_class_name") != HELIOS_CLASS:
        got = config.get("_class_name") if isinstance(config, dict) else type(config).__name__
        raise CheckpointError(f"{config_path}: _class_name is {got!r}, expected {HELIOS_CLASS!r}")
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    files = sorted(p for p in folder.glob("*.safetensors"))
    if indexes:
        unit = indexes[0]
    elif len(files) == 1:
        unit = files[0]
    elif not files:
        raise CheckpointError(f"{folder}: no .safetensors weights beside config.json")
    else:
        raise CheckpointError(f"{folder}: {len(files)} .safetensors files and no index naming which tensor is where")
    parts, _meta, source, layout = unit_parts(unit)
    stored = _Stored()
    for path, header in parts:
        stored.add(path, header)
    return config, stored, layout


def _memory_channels(partial: dict[str, tuple[int, ...]], config: dict, source: str) -> int | None:
    """The memory patchifiers' input channels the partial file says (all three must agree), or None."""
    seen = {name: partial[f"{name}.weight"][1] for name in MEMORY_PATCHES if f"{name}.weight" in partial}
    if not seen:
        return None
    values = set(seen.values())
    if len(values) > 1:
        raise CheckpointError(f"{source}: the memory patchifiers take different input channels "
                              f"({', '.join(f'{k}: {v}' for k, v in seen.items())})")
    channels = values.pop()
    latents, inputs = config.get("out_channels") or config.get("in_channels"), config.get("in_channels")
    if channels not in (latents, inputs):
        raise CheckpointError(f"{source}: {next(iter(seen))}.weight takes {channels} channels; the transformer's "
                              f"memory patchifiers take its {inputs} input channels or its {latents} latent channels")
    return channels


@dataclass
class TransformerPlan:
    """What loading transformer/ + the partial file will do, decided from headers alone."""

    module: nn.Module  # built on the meta device, memory patchifiers already at the stored width
    refs: dict[str, tuple[Path, str, tuple[int, ...]]]  # parameter -> (file, key, shape)
    unused: list[str]  # "name shape (file)" of stored tensors the model has no parameter for
    layout: str  # how transformer/ is stored
    overlaid: int  # parameters taken from the partial file


def plan_transformer(folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> TransformerPlan:
    """Check transformer/ and transformer_partial.safetensors against each other (names and shapes only)."""
    folder = Path(folder)
    config, stored, layout = _transformer_files(folder / TRANSFORMER_DIR)
    partial_path = folder / PARTIAL_FILE
    partial = read_header(partial_path) if partial_path.is_file() else {}
    partial_shapes = {k: tuple(s) for k, (s, _d) in partial.items()}
    channels = _memory_channels(partial_shapes, config, str(partial_path))
    if channels is None:  # no patchifiers in the partial file: the stored ones say it
        channels = _memory_channels({k: r[2] for k, r in stored.refs.items()}, config, str(folder / TRANSFORMER_DIR))
    module = build_transformer(config, device="meta", dtype=dtype, history_channels=channels)
    own = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    for key, shape in partial_shapes.items():  # a partial tensor that names a parameter must fit it
        if key in own and shape != own[key]:
            raise CheckpointError(f"{partial_path}: {key} is {shape_str(shape)}, but the transformer "
                                  f"({folder / TRANSFORMER_DIR / 'config.json'}) needs {shape_str(own[key])}")
    refs = dict(stored.refs)
    overlaid = 0
    for key in partial:
        if key in own:
            refs[key] = (partial_path, key, partial_shapes[key])
            overlaid += 1
    unused = [f"{ref[1]} {shape_str(ref[2])} ({ref[0].name})" for k, ref in sorted(refs.items()) if k not in own]
    unused += [f"{k} {shape_str(s)} ({partial_path.name})" for k, s in sorted(partial_shapes.items()) if k not in own]
    missing = sorted(set(own) - set(refs))
    if missing:
        raise CheckpointError(f"{folder}: {len(missing)} parameters of the transformer are in neither transformer/ nor "
                              f"{PARTIAL_FILE} (e.g. {', '.join(missing[:3])})")
    for key, ref in refs.items():  # transformer/'s own tensors must fit too (the partial's were checked above)
        if key in own and ref[2] != own[key]:
            raise CheckpointError(f"{ref[0]}: {key} is {shape_str(ref[2])}, but its config.json needs {shape_str(own[key])}")
    return TransformerPlan(module, {k: r for k, r in refs.items() if k in own}, unused, layout, overlaid)


@dataclass
class ReleaseTransformer:
    """The loaded backbone and what its loading said."""

    dit: HeliosDiT
    layout: str  # how transformer/ was stored
    overlaid: int  # tensors taken from the partial file


def load_transformer(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                     window: int = 256 << 20) -> ReleaseTransformer:
    """transformer/ with transformer_partial.safetensors on top, strictly and lazily (docs/model.md)."""
    folder = Path(folder)
    dtype = dtype or preferred_dtype(device)
    plan = plan_transformer(folder, dtype)
    module, refs, unused = plan.module, plan.refs, plan.unused
    device = torch.device(device)
    with LazyReader(window) as reader:

        def producer(ref):
            def make(want: torch.dtype, dev: torch.device) -> Tensor:
                raw = reader.raw(ref[0], ref[1])
                out = raw.to(device=dev, dtype=want, copy=True)
                del raw
                reader.after(ref[0])
                return out

            return make

        materialize(module, {k: producer(r) for k, r in refs.items()}, str(folder), device,
                    shapes={k: r[2] for k, r in refs.items()})
    with torch.device(device):  # the RoPE tables are non-persistent buffers: made here, not read
        module.rope = type(module.rope)(rope_dim=tuple(module.config.rope_dim), theta=module.config.rope_theta)
    left = [n for n, b in module.named_buffers() if b.is_meta]
    if left:
        raise CheckpointError(f"{folder}: buffers {', '.join(left)} of {HELIOS_CLASS} are neither stored nor rebuilt")
    if unused:
        log.warning("%s: %d stored tensors unused: %s; %s", folder, len(unused), ", ".join(unused), WITHOUT_UNUSED)
    dit = HeliosDiT(module.eval().requires_grad_(False), unused)
    return ReleaseTransformer(dit, plan.layout, plan.overlaid)
