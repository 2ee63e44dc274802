"""Published teacher and VAE files, in every form users download, into our Wan-native modules.

Forms read (docs/model.md, "Published files: where each goes"):

- Wan-native single file: bare Wan keys (`patch_embedding.weight`, `blocks.N.self_attn.q.weight`,
  ...; VAE `encoder.conv1.weight`, `decoder.middle.0.residual.0.gamma`, ...). The AlayaRenderer
  release's `model.safetensors`, Wan-AI/Wan2.1-T2V-1.3B's `diffusion_pytorch_model.safetensors`, and
  ComfyUI's repackaged `models/diffusion_models/*.safetensors` and `models/vae/wan_2.1_vae.safetensors`.
- Sharded: `<name>-0000N-of-0000M.safetensors` + `<name>.safetensors.index.json` (`weight_map`:
  key -> shard file), as Wan and diffusers repos ship large models.
- ComfyUI prefixed: keys under `model.diffusion_model.` (ComfyUI's checkpoints and ModelSave; a
  checkpoint's VAE is under `first_stage_model.`).
- fp8-scaled (ComfyUI): float8 weights, each with a per-tensor scale: the legacy form
  (`<layer>.scale_weight`, optional `<layer>.scale_input`, a `scaled_fp8` marker tensor) and the
  newer one (`<layer>.weight_scale`, `<layer>.input_scale`, `<layer>.comfy_quant` JSON). Weights are
  dequantized on load (stored value x scale, in float32, then cast); the scale, input-scale and
  marker tensors are consumed. An fp8 weight without a scale is refused.
- diffusers: a repo folder with `transformer/` (WanTransformer3DModel) and `vae/` (AutoencoderKLWan),
  each with config.json and weights (single or sharded); names converted by model_zoo/convert.py.

Dtypes bf16, fp16, fp32 and fp8-scaled are read. Reading is lazy: headers are read and every key
and shape is checked against the module (built on the meta device) before any data is read; then
one tensor at a time is read from the memory-mapped file, cast to the target dtype and handed to
the module (load_state_dict(assign=True)), so peak memory is about one copy of the weights.

    teacher = load_teacher_files("Wan2.1-T2V-1.3B-Diffusers")             # a diffusers repo: transformer/ + vae/
    teacher = load_teacher_files("AlayaRenderer/model.safetensors", "models/vae/wan_2.1_vae.safetensors",
                                 text_encoder="umt5-xxl:models/text_encoders/umt5_xxl_fp16.safetensors")
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from . import convert, pickled, registry
from .bundle import TeacherModel, TeacherSettings, load_teacher, model_folder_kind
from .codecs.wan_vae import CONFIGS as VAE_CONFIGS, WanVAEConfig
from .dit import CONFIGS as DIT_CONFIGS, UMT5_DIM, WAN_TEXT_LEN, DiTConfig, infer_config
from .errors import AlayaError, CheckpointError
from . import jsonfile
from .loading import DTYPE_LABELS, FP8_DTYPES, LazyReader, dequantize_fp8, materialize, read_header, read_metadata
from .precision import preferred_dtype
from .umt5 import WAN_TOKENIZER_DIRS
from .weight_files import PICKLE_SUFFIXES, SHARD_RE, index_parts, unit_parts

# Wan's standard negative prompt (Wan-Video/Wan2.1 wan/configs/shared_config.py, sample_neg_prompt),
# which the AlayaRenderer inference script hard-codes (research model.md §1.4).
WAN_NEGATIVE_PROMPT = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
    "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
    "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)
# A published teacher samples as the AlayaRenderer script does: 50 steps, CFG 5, shift 5, 81 frames.
PUBLISHED_TEACHER_SETTINGS = TeacherSettings(negative_prompt=WAN_NEGATIVE_PROMPT)

# Key prefixes, longest first. DiT: ComfyUI checkpoints / ModelSave, bare diffusion_model, Self-Forcing.
DIT_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "pipe.dit.", "model.", "")  # pipe.dit.: DiffSynth-Studio training with its prefix kept
VAE_PREFIXES = ("first_stage_model.", "vae.", "model.", "")  # ComfyUI checkpoints, DiffSynth ("model.")
# marker keys (after the prefix): any one present says which network a file holds
DIT_MARKERS = ("patch_embedding.weight",)  # the same name in Wan's and diffusers' namings
VAE_MARKERS = ("decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.norm1.gamma")
WAN22_VAE_MARKER = "decoder.upsamples.0.upsamples.0.residual.2.weight"  # Wan2.2's 48-channel VAE
HELIOS_MARKERS = ("patch_short.weight", "norm_out.scale_shift_table")  # the Flash student in diffusers' Helios naming
T5_MARKERS = ("encoder.block.0.layer.0.SelfAttention.q.weight", "shared.weight")
UMT5_VOCAB = 256384
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")  # ComfyUI fp8: legacy, newer
INPUT_SCALE_SUFFIXES = (".scale_input", ".input_scale")  # activation scales: not needed to dequantize weights
# Where ComfyUI keeps each kind of file, under its models/ folder
COMFY_DIT_DIRS = ("diffusion_models", "unet", "checkpoints")
COMFY_VAE_DIRS = ("vae",)
COMFY_TEXT_DIRS = ("text_encoders", "clip")
PICKLE_LAYOUT = "PyTorch pickle, read tensors-only (torch.load weights_only)"
# Wan-AI's folders (Wan2.1-T2V-1.3B/ as downloaded): the VAE and umT5 as pickles, umT5's tokenizer in google/umt5-xxl/
WAN_VAE_FILE = "Wan2.1_VAE.pth"
WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
UMT5_NAME = "umt5-xxl"  # the text encoder name a published teacher needs (model.md §1.4)


@dataclass(frozen=True)
class TensorRef:
    """One stored tensor: which file, its key there, shape and safetensors dtype (and its fp8 scale)."""

    path: Path
    key: str
    shape: tuple[int, ...]
    dtype: str
    scale: "TensorRef | None" = None


@dataclass
class WeightSet:
    """One network's tensors on disk under Wan-native names; nothing read yet.

    component: "dit" or "vae"; layout: how the files are laid out ("single file", "sharded: 3
    files + index", "diffusers folder", ...); naming: "wan" or "diffusers"; prefix: the key prefix
    stripped ("" for none); config: from a config.json or the file's metadata when there is one.
    """

    component: str
    source: str  # the path named in messages (a file, an index, a folder)
    layout: str
    naming: str
    prefix: str
    tensors: dict[str, TensorRef]
    config: object | None = None
    notes: list[str] = field(default_factory=list)
    pickled: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # a .pth's tensors (memory-mapped), by stored key

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: r.shape for k, r in self.tensors.items()}

    @property
    def scaled(self) -> int:
        return sum(1 for r in self.tensors.values() if r.scale is not None)

    def dtype(self) -> str:
        """'bf16', 'fp16', 'fp32', or 'fp8-scaled (fp8 e4m3fn; N tensors scaled, the rest bf16)'; by element count."""
        return dtype_summary((r.shape, r.dtype, r.scale is not None) for r in self.tensors.values())

    def form(self, naming: bool = True) -> str:
        """How `model identify` names the form, e.g. "single file, keys under 'model.diffusion_model.' (ComfyUI), fp8-scaled"."""
        parts = [self.layout]
        if self.prefix:
            comfy = self.prefix.startswith(("model.diffusion_model.", "first_stage_model."))
            parts.append(f"keys under {self.prefix!r}" + (" (ComfyUI)" if comfy else ""))
        if naming:
            parts.append("diffusers names, converted" if self.naming == "diffusers" else "Wan-native names")
        if self.scaled:
            parts.append("fp8-scaled (ComfyUI)")
        return ", ".join(parts)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def dtype_summary(entries) -> str:
    """entries: (shape, safetensors dtype, scaled) per tensor -> 'bf16', 'bf16 (fp32 for 3 tensors)',
    'fp8-scaled (fp8 e4m3fn; 210 tensors scaled, the rest bf16/fp32)'; the main dtype by element count."""
    count: Counter = Counter()
    tensors: Counter = Counter()
    scaled = 0
    for shape, dtype, is_scaled in entries:
        if dtype not in DTYPE_LABELS:  # integer tensors: an embedded tokenizer, quantization configs
            continue
        count[dtype] += _numel(shape)
        tensors[dtype] += 1
        scaled += bool(is_scaled)
    if not count:
        return "empty"
    main = [d for d, _ in count.most_common()]
    label = lambda d: DTYPE_LABELS.get(d, d.lower())  # noqa: E731
    fp8 = [d for d in main if d in FP8_DTYPES]
    if fp8:
        rest = [label(d) for d in main if d not in FP8_DTYPES]
        tail = f", the rest {'/'.join(rest)}" if rest else ""
        what = f"{scaled} tensors scaled" if scaled else "NO scales"
        return f"fp8-scaled ({label(fp8[0])}; {what}{tail})" if scaled else f"{label(fp8[0])} ({what}{tail})"
    others = [f"{label(d)} for {tensors[d]} tensors" for d in main[1:]]
    return label(main[0]) + (f" ({', '.join(others)})" if others else "")


def header_dtype(header: dict) -> str:
    """dtype_summary of a raw header (fp8 scales and markers counted as such)."""
    scaled = {k[: -len(sfx)] + ".weight" for k in header for sfx in SCALE_SUFFIXES if k.endswith(sfx)}
    skip = lambda k: k.endswith((*SCALE_SUFFIXES, *INPUT_SCALE_SUFFIXES, ".comfy_quant")) or k.endswith("scaled_fp8")  # noqa: E731
    return dtype_summary((s, d, k in scaled) for k, (s, d) in header.items() if not skip(k))


# ---------------------------------------------------------------------------------------------
# Which networks a header holds


def components(keys) -> dict[str, str]:
    """{'dit': prefix, 'vae': prefix} for the Wan DiT / Wan2.1 VAE found among keys (first prefix that fits)."""
    keys = set(keys)
    found = {}
    for prefix in DIT_PREFIXES:
        if any(prefix + m in keys for m in DIT_MARKERS):
            found["dit"] = prefix
            break
    for prefix in VAE_PREFIXES:
        if any(prefix + m in keys for m in VAE_MARKERS):
            found["vae"] = prefix
            break
    return found


def _is_wan22_vae(keys) -> bool:
    return any(k.endswith(WAN22_VAE_MARKER) for k in keys)


def _read_comfy_quant(path: Path, key: str) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        raw = f.get_tensor(key)
    try:
        return json.loads(bytes(raw.to(torch.uint8).tolist()).decode("utf-8"))
    except ValueError:
        raise CheckpointError(f"{path}: {key} is not a JSON quantization config") from None


def _collect(parts: list[tuple[Path, dict]], component: str, prefix: str, source: str, layout: str,
             metadata: dict | None = None) -> WeightSet:
    """The WeightSet of one network from (file, header) parts: prefix stripped, fp8 scales paired, names converted."""
    stored: dict[str, TensorRef] = {}
    for path, header in parts:
        for key, (shape, dtype) in header.items():
            if prefix and not key.startswith(prefix):
                continue  # another network of the same file (a ComfyUI checkpoint's VAE or text encoder)
            name = key[len(prefix):]
            if name in stored:
                raise CheckpointError(f"{source}: {key} is stored twice ({stored[name].path.name} and {path.name})")
            stored[name] = TensorRef(path, key, tuple(shape), dtype)
    if component == "dit" and any(m in stored for m in HELIOS_MARKERS):
        raise CheckpointError(f"{source}: a DiT in diffusers' Helios naming (the Flash student: {', '.join(m for m in HELIOS_MARKERS if m in stored)}); "
                              "it loads as part of a Flash release folder (transformer/ beside transformer_partial.safetensors and the codecs: "
                              "pass that folder as the Flash model), not as a Wan DiT")
    if component == "vae" and _is_wan22_vae(stored):
        raise CheckpointError(f"{source}: the Wan2.2 VAE (48 latent channels); this renderer reads the Wan2.1 VAE (e.g. ComfyUI's wan_2.1_vae.safetensors)")
    # ComfyUI fp8: pair each weight with its scale; consume markers and activation scales
    stored.pop("scaled_fp8", None)
    try:
        quant = json.loads((metadata or {}).get("_quantization_metadata") or "{}")
        layers = dict(quant.get("layers") or {})
    except (ValueError, TypeError, AttributeError):
        raise CheckpointError(f"{source}: its _quantization_metadata is not {{'layers': {{...}}}} JSON") from None
    for layer, conf in layers.items():
        fmt = conf.get("format") if isinstance(conf, dict) else conf
        if fmt not in ("float8_e4m3fn", "float8_e5m2"):
            raise CheckpointError(f"{source}: layer {layer} is quantized as {fmt!r}; only per-tensor scaled fp8 is read")
    scales: dict[str, TensorRef] = {}
    for name in list(stored):
        if name.endswith(".comfy_quant"):
            ref = stored.pop(name)
            fmt = _read_comfy_quant(ref.path, ref.key).get("format")
            if fmt not in ("float8_e4m3fn", "float8_e5m2"):
                raise CheckpointError(f"{ref.path}: {ref.key} says format {fmt!r}; only per-tensor scaled fp8 is read")
        elif name.endswith(INPUT_SCALE_SUFFIXES):
            stored.pop(name)
        else:
            for suffix in SCALE_SUFFIXES:
                if name.endswith(suffix):
                    scales[name[: -len(suffix)] + ".weight"] = stored.pop(name)
    for weight, ref in scales.items():
        if weight not in stored:
            raise CheckpointError(f"{ref.path}: {ref.key} scales {prefix}{weight}, which the file does not hold")
        stored[weight] = replace(stored[weight], scale=ref)
    for name, ref in stored.items():
        if ref.dtype in FP8_DTYPES and ref.scale is None:
            raise CheckpointError(
                f"{ref.path}: {ref.key} is stored as {DTYPE_LABELS[ref.dtype]} without a scale ({prefix}{name[:-len('.weight')] if name.endswith('.weight') else name}.scale_weight); "
                "fp8 files without per-tensor scales are not read: use the bf16/fp16 file or ComfyUI's fp8_scaled one")
    # names: Wan-native
    if component == "dit":
        naming = convert.naming(stored)
        rename = {k: convert.wan_name(k) for k in stored}
    else:
        naming = convert.vae_naming(stored)
        nrb = convert.vae_num_res_blocks(stored)
        rename = {k: (convert.vae_wan_name(k, nrb) if naming == "diffusers" else k) for k in stored}
    tensors: dict[str, TensorRef] = {}
    for old, new in rename.items():
        if new in tensors:
            raise CheckpointError(f"{source}: {stored[old].key} and {tensors[new].key} both name {new}")
        tensors[new] = stored[old]
    config = _config_from_metadata(metadata, component, source)
    return WeightSet(component, source, layout, naming, prefix, tensors, config=config)


def _config_from_metadata(metadata: dict | None, component: str, source: str):
    """Our own files (dit.save) carry the DiT config in their metadata."""
    if component != "dit" or not metadata or "config" not in metadata or metadata.get("family", "dit") != "dit":
        return None
    try:
        raw = json.loads(metadata["config"])
        raw["patch_size"] = tuple(raw.get("patch_size", (1, 2, 2)))
        return DiTConfig(**raw)
    except (ValueError, TypeError) as err:
        raise CheckpointError(f"{source}: metadata 'config' is not a DiT config ({err})") from None


# ---------------------------------------------------------------------------------------------
# Files, shard sets and folders -> WeightSets


def open_file(path: str | Path) -> list[WeightSet]:
    """Every Wan DiT / Wan VAE held by a .safetensors file, a shard of a set, an index, or a PyTorch
    pickle (Wan's Wan2.1_VAE.pth: read tensors-only, model_zoo/pickled.py)."""
    path = Path(path)
    if pickled.is_pickle(path):
        return pickle_sets(path, pickled.read_state(path))
    parts, meta, source, layout = unit_parts(path)
    keys = [k for _, h in parts for k in h]
    out = []
    for component, prefix in components(keys).items():
        out.append(_collect(parts, component, prefix, source, layout, meta))
    return out


def pickle_sets(path: Path, state: dict[str, torch.Tensor]) -> list[WeightSet]:
    """Every Wan DiT / Wan VAE in a pickle's state dict (read by pickled.read_state)."""
    parts = [(path, pickled.header(state))]
    sets = [_collect(parts, c, prefix, str(path), PICKLE_LAYOUT) for c, prefix in components(state).items()]
    for ws in sets:
        ws.pickled = state
    return sets


@dataclass
class _Unit:
    path: Path  # a .safetensors file (not a shard) or an index
    found: dict[str, str]  # component -> prefix


def _folder_units(folder: Path) -> list[_Unit]:
    """The weight files and shard sets directly in folder, each with the networks it holds."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    covered = set()
    for index in indexes:
        try:
            covered.update(jsonfile.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            pass
    units = []
    for index in indexes:
        parts, _ = index_parts(index)
        units.append(_Unit(index, components(k for _, h in parts for k in h)))
    for f in sorted(folder.glob("*.safetensors")):
        if f.name in covered:
            continue
        m = SHARD_RE.match(f.name)
        if m:
            raise CheckpointError(f"{f}: shard {int(m['i'])} of {int(m['n'])} without its index "
                                  f"({m['stem']}.safetensors.index.json) in {folder}")
        units.append(_Unit(f, components(read_header(f))))
    return units


def _is_variant(path: Path) -> bool:
    """diffusers' dtype variants: diffusion_pytorch_model.fp16.safetensors."""
    return bool(re.search(r"\.(fp16|bf16|fp32|fp8)\.safetensors(\.index\.json)?$", path.name))


def _read_json(path: Path) -> dict:
    try:
        data = jsonfile.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err})") from None
    except ValueError as err:
        raise CheckpointError(f"{path}: malformed JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def dit_config_from_json(cfg: dict, source: str) -> DiTConfig | None:
    """A DiTConfig from diffusers' WanTransformer3DModel config.json or Wan's own (WanModel) config.json."""
    cls = cfg.get("_class_name", "")
    try:
        if cls == "WanTransformer3DModel" or "num_attention_heads" in cfg:
            for key in ("image_dim", "added_kv_proj_dim"):
                if cfg.get(key):
                    raise CheckpointError(f"{source}: {key} is set: an image-conditioned Wan (I2V/VACE), not a T2V or G-buffer DiT")
            heads, head_dim = int(cfg.get("num_attention_heads", 12)), int(cfg.get("attention_head_dim", 128))
            text_dim = int(cfg.get("text_dim", UMT5_DIM))
            return DiTConfig(
                in_dim=int(cfg.get("in_channels", 16)), out_dim=int(cfg.get("out_channels") or cfg.get("in_channels", 16)),
                dim=heads * head_dim, ffn_dim=int(cfg.get("ffn_dim", 8960)), freq_dim=int(cfg.get("freq_dim", 256)),
                text_dim=text_dim, text_len=WAN_TEXT_LEN if text_dim == UMT5_DIM else 0, num_heads=heads,
                num_layers=int(cfg.get("num_layers", 30)), patch_size=tuple(cfg.get("patch_size", (1, 2, 2))),
                eps=float(cfg.get("eps", 1e-6)), rope_positions=int(cfg.get("rope_max_seq_len", 1024)),
            ).validate()
        if cls == "WanModel" or "num_heads" in cfg:
            if cfg.get("model_type", "t2v") not in ("t2v", None):
                raise CheckpointError(f"{source}: model_type {cfg.get('model_type')!r}: an image-conditioned Wan, not a T2V or G-buffer DiT")
            base = DiTConfig()
            text_dim = int(cfg.get("text_dim", base.text_dim))
            return DiTConfig(
                in_dim=int(cfg.get("in_dim", 16)), out_dim=int(cfg.get("out_dim", 16)), dim=int(cfg.get("dim", base.dim)),
                ffn_dim=int(cfg.get("ffn_dim", base.ffn_dim)), freq_dim=int(cfg.get("freq_dim", base.freq_dim)),
                text_dim=text_dim, text_len=int(cfg.get("text_len", WAN_TEXT_LEN if text_dim == UMT5_DIM else 0)),
                num_heads=int(cfg.get("num_heads", base.num_heads)), num_layers=int(cfg.get("num_layers", base.num_layers)),
                patch_size=tuple(cfg.get("patch_size", base.patch_size)), eps=float(cfg.get("eps", base.eps)),
            ).validate()
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: not a Wan DiT config ({err})") from None
    return None


def vae_config_from_json(cfg: dict, source: str) -> WanVAEConfig | None:
    """A WanVAEConfig from diffusers' AutoencoderKLWan config.json."""
    if cfg.get("_class_name") != "AutoencoderKLWan" and "base_dim" not in cfg:
        return None
    if cfg.get("is_residual") or int(cfg.get("z_dim", 16)) != 16:
        raise CheckpointError(f"{source}: the Wan2.2 VAE (residual, {cfg.get('z_dim')} latent channels); this renderer reads the Wan2.1 VAE")
    if cfg.get("attn_scales"):
        raise CheckpointError(f"{source}: attn_scales {cfg['attn_scales']} (the Wan2.1 VAE has none)")
    try:
        return WanVAEConfig(base_dim=int(cfg.get("base_dim", 96)), z_dim=int(cfg.get("z_dim", 16)),
                            dim_mult=tuple(int(m) for m in cfg.get("dim_mult", (1, 2, 4, 4))),
                            num_res_blocks=int(cfg.get("num_res_blocks", 2)),
                            temporal_downsample=tuple(bool(t) for t in cfg.get("temperal_downsample", (False, True, True))))
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: not a Wan VAE config ({err})") from None


def _diffusers_root(folder: Path) -> bool:
    return (folder / "model_index.json").is_file() or any((folder / s / "config.json").is_file() for s in ("transformer", "vae"))


def open_folder(folder: str | Path, component: str) -> WeightSet:
    """The `component` ('dit' or 'vae') weights of a folder: a diffusers repo root (transformer/ or
    vae/), a diffusers component folder, a Wan repo, the AlayaRenderer release, or any folder whose
    .safetensors files hold exactly one such network."""
    folder = Path(folder)
    if _diffusers_root(folder):
        sub = folder / ("transformer" if component == "dit" else "vae")
        if not sub.is_dir():
            raise CheckpointError(f"{folder}: a diffusers repo without {sub.name}/ (no {'DiT' if component == 'dit' else 'VAE'} here)")
        folder = sub
    units = [u for u in _folder_units(folder) if component in u.found]
    if len(units) > 1:
        plain = [u for u in units if not _is_variant(u.path)]
        units = plain if len(plain) == 1 else units
    what = "DiT" if component == "dit" else "Wan2.1 VAE"
    if not units and component == "vae" and (folder / WAN_VAE_FILE).is_file():  # a Wan-AI folder as downloaded
        return open_weights(folder / WAN_VAE_FILE, "vae")
    if not units:
        pickles = [p.name for p in sorted(folder.iterdir()) if p.suffix in PICKLE_SUFFIXES]
        extra = f" (pickles here, not read as a {what}: {', '.join(pickles)})" if pickles else ""
        raise CheckpointError(f"{folder}: no {what} .safetensors here{extra}")
    if len(units) > 1:
        raise CheckpointError(f"{folder}: several {what} files ({', '.join(u.path.name for u in units)}); pass one of them")
    (ws,) = [w for w in open_file(units[0].path) if w.component == component]
    config_file = folder / "config.json"
    if config_file.is_file():
        cfg = _read_json(config_file)
        parsed = (dit_config_from_json if component == "dit" else vae_config_from_json)(cfg, str(config_file))
        if parsed is not None:
            ws.config = parsed
            if cfg.get("_class_name") in ("WanTransformer3DModel", "AutoencoderKLWan"):
                ws.layout = f"diffusers folder ({folder.name}/: config.json + {ws.layout})"
            else:
                ws.layout = f"Wan repo folder (config.json + {ws.layout})"
    return ws


def open_weights(path: str | Path, component: str) -> WeightSet:
    """The `component` ('dit' or 'vae') WeightSet of a file, an index, a shard, or a folder."""
    path = Path(path)
    if not path.exists():
        raise AlayaError(f"{path}: no such file or folder")
    if path.is_dir():
        return open_folder(path, component)
    found = [w for w in open_file(path) if w.component == component]
    if not found and component == "dit" and path.suffix == ".safetensors" and any(".lora_" in k for k in read_header(path)):
        raise CheckpointError(f"{path}: a LoRA (lora_A / lora_B weights), not a full DiT; this renderer reads full DiT "
                              "checkpoints (e.g. DiffSynth-Studio's full training output, epoch-N.safetensors)")
    if not found:
        what = "a Wan DiT" if component == "dit" else "a Wan2.1 VAE"
        raise CheckpointError(f"{path}: not {what} (none of its keys is {' or '.join((DIT_MARKERS if component == 'dit' else VAE_MARKERS))})")
    return found[0]


# ---------------------------------------------------------------------------------------------
# Configs from shapes


def infer_vae_config(shapes: dict[str, tuple[int, ...]]) -> WanVAEConfig:
    """The WanVAEConfig implied by Wan-native VAE key shapes."""
    try:
        base = shapes["encoder.conv1.weight"][0]
        z_dim = shapes["conv2.weight"][0]
        idx = sorted({int(k.split(".")[2]) for k in shapes if k.startswith("encoder.downsamples.")})
        stages, temporal, current = [], [], []
        for i in idx:
            p = f"encoder.downsamples.{i}."
            if p + "resample.1.weight" in shapes:
                temporal.append(p + "time_conv.weight" in shapes)
                stages.append(current)
                current = []
            else:
                current.append(shapes[p + "residual.2.weight"][0])
        stages.append(current)
        return WanVAEConfig(base_dim=base, z_dim=z_dim, dim_mult=tuple(s[-1] // base for s in stages),
                            num_res_blocks=len(stages[0]), temporal_downsample=tuple(temporal))
    except (KeyError, IndexError, ZeroDivisionError) as err:
        raise AlayaError(f"not a Wan VAE state dict: key {err} is missing or mis-shaped") from None


def config_of(ws: WeightSet):
    """The config a WeightSet loads into: its config.json / metadata one, else the one its shapes imply."""
    if ws.config is not None:
        return ws.config
    try:
        return infer_config(ws.shapes()) if ws.component == "dit" else infer_vae_config(ws.shapes())
    except AlayaError as err:
        raise CheckpointError(f"{ws.source}: {err}") from None


# ---------------------------------------------------------------------------------------------
# Loading


def load_network(ws: WeightSet, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 config=None, window: int = 256 << 20) -> nn.Module:
    """Build ws's network on the meta device and fill it strictly, one tensor at a time (see module doc)."""
    config = config or config_of(ws)
    dtype = dtype or preferred_dtype(device)
    family = "dit" if ws.component == "dit" else "wan-vae"
    module = registry.build_config(family, config, device="meta", dtype=dtype)
    device = torch.device(device)
    source = ws.source + (" (names converted from diffusers')" if ws.naming == "diffusers" else "")
    with LazyReader(window) as reader:

        def read(ref: TensorRef) -> torch.Tensor:
            return ws.pickled[ref.key] if ws.pickled is not None else reader.raw(ref.path, ref.key)

        def producer(ref: TensorRef):
            def make(want: torch.dtype, dev: torch.device) -> torch.Tensor:
                raw = read(ref)
                if ref.scale is not None:
                    scale = read(ref.scale)
                    try:  # on a GPU: the 1-byte weights go over, the product is computed there
                        out = dequantize_fp8(raw.to(dev), scale.to(dev), want)
                    except CheckpointError as err:
                        raise CheckpointError(f"{ref.path}: {ref.key}: {err}") from None
                    del scale
                elif raw.dtype == want and raw.device == dev:
                    out = raw.clone()  # our own memory, not a view of the mapped file
                else:
                    out = raw.to(device=dev, dtype=want)
                del raw
                reader.after(ref.path)
                return out

            return make

        materialize(module, {k: producer(r) for k, r in ws.tensors.items()}, source, device, shapes=ws.shapes())
    return module.eval().requires_grad_(False)


def load_dit(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
             config: DiTConfig | None = None) -> nn.Module:
    """A Wan DiT (teacher, stock T2V, ...) from any published form, strictly and lazily."""
    return load_network(open_weights(path, "dit"), device, dtype, config)


def load_vae(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> nn.Module:
    """The Wan2.1 VAE from any published form (Wan-native / ComfyUI file, diffusers vae/ folder), strictly and lazily."""
    return load_network(open_weights(path, "vae"), device, dtype)


# ---------------------------------------------------------------------------------------------
# Finding the other parts of a teacher next to its DiT


def _has(path: Path, component: str) -> bool:
    try:
        return path.is_file() and path.suffix == ".safetensors" and component in components(read_header(path))
    except CheckpointError:
        return False


def _comfy_models_dir(start: Path) -> Path | None:
    """ComfyUI's models/ folder when the folder start is (or lies in) models/diffusion_models/ (or unet/, checkpoints/)."""
    for parent in (start, *start.parents):
        if parent.name in COMFY_DIT_DIRS:
            return parent.parent
    return None


def wan_folders(dit: str | Path) -> list[Path]:
    """Wan-AI folders as downloaded (Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth) that go with a DiT:
    its own folder (Wan2.1-T2V-1.3B/ itself), and in DiffSynth-Studio's layout, which AlayaRenderer's
    README uses (models/train/RUN/epoch-N.safetensors beside models/Wan-AI/Wan2.1-T2V-1.3B/), the Wan
    folders under models/Wan-AI/."""
    dit = Path(dit)
    folder = dit if dit.is_dir() else dit.parent
    found = [folder]
    for parent in (folder, *folder.parents):
        if parent.name == "train":
            found += sorted((parent.parent / "Wan-AI").glob("Wan2.1-T2V-*"))
            break
    return [f for f in found if (f / WAN_VAE_FILE).is_file() or (f / WAN_T5_FILE).is_file()]


def find_vae(dit: str | Path) -> Path | None:
    """A Wan2.1 VAE next to a DiT: a diffusers repo's vae/, a VAE file in the DiT's folder or its vae/
    subfolder, or ComfyUI's models/vae/ (wan_2.1_vae.safetensors first); else a Wan-AI folder's
    Wan2.1_VAE.pth (wan_folders)."""
    dit = Path(dit)
    folder = dit if dit.is_dir() else dit.parent
    if dit.is_dir() and _diffusers_root(dit) and (dit / "vae").is_dir():
        return dit / "vae"
    if (folder.name == "transformer") and (folder.parent / "vae" / "config.json").is_file():
        return folder.parent / "vae"
    places = [folder, folder / "vae"]
    models = _comfy_models_dir(folder)
    if models is not None:
        places += [models / d for d in COMFY_VAE_DIRS]
    for place in places:
        if not place.is_dir():
            continue
        preferred = place / "wan_2.1_vae.safetensors"
        if _has(preferred, "vae"):
            return preferred
        hits = [f for f in sorted(place.glob("*.safetensors")) if _has(f, "vae") and not _has(f, "dit")]
        if len(hits) == 1:
            return hits[0]
    for wan in wan_folders(dit):
        if (wan / WAN_VAE_FILE).is_file():
            return wan / WAN_VAE_FILE
    return None


def _umt5_rank(path: Path) -> int:
    name = path.name.lower()
    return 1 if "fp8" in name else 0  # full precision first


def _umt5_width(path: Path) -> int | None:
    """The width of the umT5 encoder at path, from its headers (None when it is not one)."""
    from .umt5 import text_dim_of

    try:
        return text_dim_of(path)
    except AlayaError:
        return None


def find_text_encoder(dit: str | Path) -> Path | None:
    """umT5-XXL next to a DiT: a diffusers repo's text_encoder/, ComfyUI's models/text_encoders/umt5*.safetensors,
    else a Wan-AI folder's models_t5_umt5-xxl-enc-bf16.pth (its tokenizer in google/umt5-xxl/ beside it)."""
    dit = Path(dit)
    root = dit if dit.is_dir() else dit.parent
    if root.name == "transformer":
        root = root.parent
    if (root / "text_encoder" / "config.json").is_file():
        return root / "text_encoder"
    places = [root, root / "text_encoders"]
    models = _comfy_models_dir(dit if dit.is_dir() else dit.parent)
    if models is not None:
        places += [models / d for d in COMFY_TEXT_DIRS]
    for place in places:
        hits = sorted(place.glob("*umt5*.safetensors"), key=lambda p: (_umt5_rank(p), p.name)) if place.is_dir() else []
        if hits:
            return hits[0]
    for wan in wan_folders(dit):  # with its tokenizer: umT5 reads none without one
        if (wan / WAN_T5_FILE).is_file() and any((wan / d / "spiece.model").is_file() for d in WAN_TOKENIZER_DIRS):
            return wan / WAN_T5_FILE
    return None


def load_teacher_files(dit: str | Path, vae: str | Path | None = None, device: str | torch.device = "cpu",
                       dtype: torch.dtype | None = None, text_encoder: str | None = None,
                       settings: TeacherSettings | None = None) -> TeacherModel:
    """A teacher (DiT + Wan VAE) from published files, each in any form this module reads.

    dit: a DiT file, index or shard, a diffusers repo root (then the VAE defaults to its vae/), a
    diffusers transformer/ folder, a Wan repo folder, the AlayaRenderer release folder, or one of our
    teacher model folders. vae: a VAE file or folder; None looks next to the DiT (find_vae).
    text_encoder: stored as the model's text_encoder_name; None: the umT5 found next to the DiT as
    "umt5-xxl:<path>" (find_text_encoder), else "umt5-xxl" for a 4096-wide DiT, else our MiniLM.
    settings: default PUBLISHED_TEACHER_SETTINGS (50 steps, CFG 5, shift 5, 81 frames, Wan's negative prompt).
    """
    dit = Path(dit)
    if dit.is_dir() and model_folder_kind(dit) == "teacher" and vae is None:
        model = load_teacher(dit, device=device, dtype=dtype or preferred_dtype(device))
        if text_encoder:
            model.text_encoder_name = text_encoder
        return model
    dtype = dtype or preferred_dtype(device)
    dit_net = load_dit(dit, device, dtype)
    vae_path = Path(vae) if vae is not None else find_vae(dit)
    if vae_path is None:
        raise CheckpointError(f"{dit}: no Wan2.1 VAE found next to it (a diffusers vae/ folder, "
                              f"ComfyUI's models/vae/wan_2.1_vae.safetensors, a Wan-AI folder's {WAN_VAE_FILE}); pass vae=")
    vae_net = load_vae(vae_path, device, dtype)
    if text_encoder is None:
        found = find_text_encoder(dit)
        wide = dit_net.config.text_dim == UMT5_DIM  # umT5-XXL's width: a found encoder is checked when loaded
        if found is not None and (wide or _umt5_width(found) == dit_net.config.text_dim):
            text_encoder = f"{UMT5_NAME}:{found}"
        elif dit_net.config.text_dim == UMT5_DIM:
            text_encoder = UMT5_NAME  # names no file: loading the prompt encoder says what is missing
        else:
            text_encoder = "all-minilm-l6-v2"
    return TeacherModel(dit_net, vae_net, settings=settings or PUBLISHED_TEACHER_SETTINGS,
                        text_encoder_name=text_encoder, path=dit)


# ---------------------------------------------------------------------------------------------
# What a DiT / VAE is (for `model identify`)


def dit_kind(config: DiTConfig) -> str:
    """'teacher DiT', 'stock Wan T2V DiT', 'Flash-student DiT' from a DiT's shape."""
    size = {1536: " 1.3B", 5120: " 14B"}.get(config.dim, "") if config.num_layers in (30, 40) else ""
    if config.in_dim == config.out_dim:
        return f"stock Wan T2V DiT{size}"
    if config.in_dim == config.out_dim + 80:  # + five 16-channel G-buffer latents
        if config.text_dim == UMT5_DIM:
            return "teacher DiT" + (" (AlayaRenderer)" if _same_shapes(config, DIT_CONFIGS["alayarenderer-teacher"]) else "")
        return "Flash-student DiT"
    return f"Wan DiT ({config.in_dim} input channels)"


def _same_shapes(a: DiTConfig, b: DiTConfig) -> bool:
    keys = ("in_dim", "out_dim", "dim", "ffn_dim", "freq_dim", "text_dim", "num_layers", "patch_size")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def published_size(config: DiTConfig) -> bool:
    """A DiT of a shape Wan published (1.3B, 14B) or G-buffer conditioned (96 = 16 + 5 x 16 channels)."""
    wan = any(_same_shapes(replace(config, in_dim=c.in_dim), c) for c in DIT_CONFIGS.values() if c.dim >= 1536)
    wan14 = config.dim == 5120 and config.ffn_dim == 13824 and config.num_layers == 40
    return wan or wan14 or config.in_dim == config.out_dim + 80


def vae_name(config: WanVAEConfig) -> str:
    names = [n for n, c in VAE_CONFIGS.items() if c == config]
    return names[0] if names else f"unnamed (base_dim {config.base_dim})"
