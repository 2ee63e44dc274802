"""umT5-XXL, the prompt encoder of Wan 2.1 (and of the AlayaRenderer teacher), fed as Wan feeds it.

The network is transformers' `UMT5EncoderModel`: 24 layers, 4096 wide, 64 heads of 64, a gated-GELU
feed-forward of 10240, a 256384-row embedding, and a relative-position bias of its own in every layer
(32 buckets, max distance 128; umT5 does not share it as T5 does). Its parameter names are
transformers' (= ComfyUI's), `shared.weight` plus `encoder.block.N.layer.{0,1}.*` and
`encoder.final_layer_norm.weight`; `encoder.embed_tokens.weight` is the same tensor as `shared.weight`.

Prompt -> tensor, as Wan 2.1's `T5EncoderModel.__call__` (wan/modules/t5.py, text_len 512):

1. clean the text as Wan's tokenizer with `clean='whitespace'`: ftfy.fix_text, HTML entities
   unescaped twice, runs of whitespace -> one space, stripped;
2. tokenize as Wan's tokenizer (transformers' T5 tokenizer of umT5's sentencepiece model) does:
   special-token text (`</s>`, `<pad>`, `<unk>`) is that token, a run of characters outside the
   vocabulary one `<unk>`; append the end-of-sequence token; a prompt of more than 512 tokens
   keeps its first 511 and the end token (a warning names its token count);
3. run the encoder with an attention mask over the real tokens;
4. keep the real tokens' outputs and zero every position after them, up to 512:
   the result is (B, 512, 4096) float32, exactly the context Wan's DiT receives.

Files (`load_umt5` tells them apart by their content; nothing is read from a file name):

| form | weights | tokenizer |
| --- | --- | --- |
| ComfyUI `text_encoders/umt5_xxl_fp16.safetensors` (also bf16/fp32) | transformers' names | the sentencepiece model as a uint8 tensor `spiece_model` |
| ComfyUI `umt5_xxl_fp8_e4m3fn_scaled.safetensors` | float8 linear weights, each with a float32 scalar `<layer>.scale_weight` (marker tensor `scaled_fp8`), or the newer `<layer>.weight_scale` + `<layer>.comfy_quant`; dequantised on load: weight * scale | `spiece_model` |
| Hugging Face folder (google/umt5-xxl, a diffusers `text_encoder/`) | config.json + model.safetensors, or shards + model.safetensors.index.json; decoder.* / lm_head.* of a full model are not read | spiece.model in the folder, or in ../tokenizer (diffusers) |
| Wan 2.1 `models_t5_umt5-xxl-enc-bf16.pth` | a pickle with Wan's names, read tensors-only (model_zoo/pickled.py: torch.load weights_only, nothing in it runs) | spiece.model in google/umt5-xxl/ beside it (Wan-AI's folders), tokenizer/, or beside it |

A tokenizer file (spiece.model, or a folder holding it) given as `tokenizer=` overrides the one a
form carries. Loading reads one tensor at a time through safetensors' memory map and casts it to the
requested dtype, so the peak is the model plus one tensor (umT5-XXL in bf16/fp16: ~11.4 GB).
"""
from __future__ import annotations

import dataclasses
import gc
import html
import json
import logging
import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, TypeVar

import torch
from torch import nn

from .dit import WAN_TEXT_LEN
from .errors import AlayaError, CheckpointError
from . import jsonfile
from . import pickled
from .loading import check_shapes, save_safetensors
from .pickled import PICKLE_SUFFIXES

log = logging.getLogger(__name__)

TEXT_LEN = WAN_TEXT_LEN  # tokens per prompt, end token included; the output is zero-padded to it
TOKENIZER_KEY = "spiece_model"  # ComfyUI: the sentencepiece model proto as a uint8 tensor
WAN_TOKENIZER_DIRS = ("google/umt5-xxl", "tokenizer", ".")  # where a Wan .pth's spiece.model lies, from its folder
SCALED_FP8_MARKER = "scaled_fp8"  # ComfyUI's legacy scaled-fp8 marker (its dtype names the fp8 format)
TIED_KEY = "encoder.embed_tokens.weight"  # the same tensor as shared.weight
WEIGHT_SCALE_SUFFIXES = (".scale_weight", ".weight_scale")  # ComfyUI legacy, ComfyUI quant / diffusers
INPUT_SCALE_SUFFIXES = (".scale_input", ".input_scale")  # activation scales: no meaning once dequantised
QUANT_CONF_SUFFIX = ".comfy_quant"  # ComfyUI: the layer's quantisation config as JSON bytes
FP8_FORMATS = {"float8_e4m3fn", "float8_e5m2"}  # per-tensor formats read here
FULL_MODEL_PREFIXES = ("decoder.", "lm_head.")  # a full UMT5ForConditionalGeneration's other half
VOCAB_SLACK = 1024  # embedding rows may exceed the tokenizer's pieces (padding, sentinel ids) by less
DEFAULT_DTYPE = torch.bfloat16  # Wan 2.1 runs umT5 in bf16 (t5_dtype)
_FP8_HEADER_DTYPES = {"F8_E4M3", "F8_E5M2"}
_FLOAT_HEADER_DTYPES = {"F16", "BF16", "F32", "F64"}

# Wan 2.1's T5Encoder (wan/modules/t5.py) -> transformers' UMT5EncoderModel. Wan's feed-forward is
# fc2(fc1(x) * gelu(gate(x))); transformers' is wo(gelu(wi_0(x)) * wi_1(x)).
WAN_TO_HF: list[tuple[str, str]] = [
    (r"^token_embedding\.weight$", "shared.weight"),
    (r"^blocks\.(\d+)\.norm1\.weight$", r"encoder.block.\1.layer.0.layer_norm.weight"),
    (r"^blocks\.(\d+)\.attn\.([qkvo])\.weight$", r"encoder.block.\1.layer.0.SelfAttention.\2.weight"),
    (r"^blocks\.(\d+)\.pos_embedding\.embedding\.weight$",
     r"encoder.block.\1.layer.0.SelfAttention.relative_attention_bias.weight"),
    (r"^blocks\.(\d+)\.norm2\.weight$", r"encoder.block.\1.layer.1.layer_norm.weight"),
    (r"^blocks\.(\d+)\.ffn\.gate\.0\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wi_0.weight"),
    (r"^blocks\.(\d+)\.ffn\.fc1\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wi_1.weight"),
    (r"^blocks\.(\d+)\.ffn\.fc2\.weight$", r"encoder.block.\1.layer.1.DenseReluDense.wo.weight"),
    (r"^norm\.weight$", "encoder.final_layer_norm.weight"),
]
_WAN_RULES = [(re.compile(p), r) for p, r in WAN_TO_HF]

V = TypeVar("V")


@dataclass(frozen=True)
class UMT5Config:
    """Size of a umT5 encoder (transformers' UMT5Config fields, encoder only)."""

    vocab_size: int = 256384
    d_model: int = 4096
    d_ff: int = 10240
    num_heads: int = 64
    d_kv: int = 64
    num_layers: int = 24
    num_buckets: int = 32  # relative-attention buckets, in every layer
    max_distance: int = 128  # relative distances from here on share the last bucket
    eps: float = 1e-6

    def validate(self) -> "UMT5Config":
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "d_kv", "num_layers", "num_buckets", "max_distance"):
            if getattr(self, name) <= 0:
                raise AlayaError(f"UMT5Config: {name} {getattr(self, name)} must be > 0")
        return self


CONFIGS: dict[str, UMT5Config] = {
    "umt5-xxl": UMT5Config(),  # google/umt5-xxl's encoder, Wan 2.1's text encoder: 5.68B parameters
    "umt5-tiny": UMT5Config(vocab_size=512, d_model=32, d_ff=64, num_heads=4, d_kv=8, num_layers=2),  # tests
}


def hf_config(cfg: UMT5Config):
    """transformers' UMT5Config for an encoder of this size."""
    from transformers import UMT5Config as HFConfig

    return HFConfig(
        vocab_size=cfg.vocab_size, d_model=cfg.d_model, d_kv=cfg.d_kv, d_ff=cfg.d_ff, num_layers=cfg.num_layers,
        num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.num_buckets,
        relative_attention_max_distance=cfg.max_distance, layer_norm_epsilon=cfg.eps, feed_forward_proj="gated-gelu",
        is_encoder_decoder=False, use_cache=False, pad_token_id=0, eos_token_id=1,
    )


def build(cfg: UMT5Config) -> nn.Module:
    """transformers' UMT5EncoderModel of this size (inside `torch.device('meta')`: no weights allocated)."""
    from transformers import UMT5EncoderModel

    return UMT5EncoderModel(hf_config(cfg.validate())).eval()


def model_shapes_of(cfg: UMT5Config) -> dict[str, tuple[int, ...]]:
    """Name -> shape of the encoder's state dict (built on the meta device), the tied alias included."""
    with torch.device("meta"):
        module = build(cfg)
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# names


def from_wan(state: Mapping[str, V], source: str = "state dict") -> dict[str, V]:
    """Wan 2.1's T5Encoder names -> transformers' (values unchanged: tensors or shapes). Strict: a key
    outside Wan's encoder is an error naming it."""
    out: dict[str, V] = {}
    unknown = []
    for key, value in state.items():
        for pattern, repl in _WAN_RULES:
            new, n = pattern.subn(repl, key)
            if n:
                out[new] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise CheckpointError(f"{source}: {len(unknown)} key(s) are not Wan 2.1's umT5 encoder keys "
                              f"({', '.join(sorted(unknown)[:5])}{', ...' if len(unknown) > 5 else ''})")
    return out


@dataclass
class _Layout:
    """A file's (or folder's) keys sorted: each model weight's key, the fp8 scales, what is not read."""

    weights: dict[str, str]  # model key -> file key (the tied alias points at the embedding's key)
    scales: dict[str, str]  # file weight key -> file key of its per-tensor scale
    quant_confs: dict[str, str]  # file weight key -> file key of its ComfyUI quant config (JSON bytes)
    scale_orphans: list[str]  # scale / quant keys whose weight is not in the file
    tokenizer_key: str | None


def _layout(keys) -> _Layout:
    weights, scales, confs, orphans = {}, {}, {}, []
    tokenizer_key = None
    keys = list(keys)
    present = set(keys)
    for key in keys:
        if key == TOKENIZER_KEY:
            tokenizer_key = key
        elif key == SCALED_FP8_MARKER:  # its dtype names the format; the weights' own dtypes say the same
            continue
        elif key.endswith(WEIGHT_SCALE_SUFFIXES + (QUANT_CONF_SUFFIX,)):
            layer = key.rsplit(".", 1)[0]
            if f"{layer}.weight" not in present:
                orphans.append(key)
            elif key.endswith(QUANT_CONF_SUFFIX):
                confs[f"{layer}.weight"] = key
            else:
                scales[f"{layer}.weight"] = key
        elif key.endswith(INPUT_SCALE_SUFFIXES) or key.startswith(FULL_MODEL_PREFIXES):
            continue
        else:
            weights[key] = key
    # One embedding, two names: read shared.weight (or, from a file that kept only the alias, that).
    if "shared.weight" in weights or TIED_KEY in weights:
        weights.setdefault("shared.weight", weights.get(TIED_KEY))
        if TIED_KEY not in weights:
            weights[TIED_KEY] = weights["shared.weight"]
    return _Layout(weights, scales, confs, orphans, tokenizer_key)


def model_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A file's key shapes (ComfyUI fp16 or fp8-scaled, Hugging Face, or Wan names) -> the shapes
    of the encoder's state dict keys they load into; keys of no umT5 form pass through unchanged
    (`alaya-flash model identify` calls this on every file)."""
    if "token_embedding.weight" in shapes and "norm.weight" in shapes:  # Wan 2.1's names
        try:
            shapes = from_wan(shapes)
        except CheckpointError:
            return dict(shapes)
    layout = _layout(shapes)
    if "shared.weight" not in layout.weights:
        return dict(shapes)
    return {k: tuple(shapes[v]) for k, v in layout.weights.items()}


convert_names = model_shapes  # the registry's hook for `model identify`


def infer_config(shapes: Mapping[str, tuple[int, ...]], source: str = "weights") -> UMT5Config:
    """The UMT5Config implied by model-named shapes (max_distance is not visible: umT5's 128)."""
    block0 = "encoder.block.0.layer"
    try:
        vocab, d_model = shapes["shared.weight"]
        d_ff = shapes[f"{block0}.1.DenseReluDense.wi_0.weight"][0]
        buckets, heads = shapes[f"{block0}.0.SelfAttention.relative_attention_bias.weight"]
        inner = shapes[f"{block0}.0.SelfAttention.q.weight"][0]
    except KeyError as err:
        raise CheckpointError(f"{source}: not a umT5 encoder: key {err} is missing") from None
    except ValueError:
        raise CheckpointError(f"{source}: not a umT5 encoder: shared.weight or the layer-0 relative attention bias is not 2-D") from None
    layers = {int(m[1]) for k in shapes if (m := re.match(r"encoder\.block\.(\d+)\.", k))}
    if inner % heads:
        raise CheckpointError(f"{source}: q.weight has {inner} rows, not a multiple of the {heads} heads of the relative attention bias")
    return UMT5Config(vocab_size=vocab, d_model=d_model, d_ff=d_ff, num_heads=heads, d_kv=inner // heads,
                      num_layers=max(layers) + 1, num_buckets=buckets)


# ---------------------------------------------------------------------------------------------
# the tokenizer

# Unicode's White_Space characters: what Wan's `regex` pattern \s+ matches (Python's re \s would also
# take the separators U+001C..U+001F).
_WHITESPACE = re.compile("[\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def clean_prompt(text: str) -> str:
    """Wan's `clean='whitespace'`: ftfy.fix_text, HTML entities unescaped twice, whitespace runs -> ' ', stripped."""
    import ftfy

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return _WHITESPACE.sub(" ", text).strip()


class SentencePieceTokenizer:
    """umT5's tokenizer: its sentencepiece model, end token appended, at most TEXT_LEN tokens."""

    def __init__(self, model_proto: bytes, source: str):
        import sentencepiece

        self.source = source
        self.model_proto = bytes(model_proto)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        except Exception as err:  # sentencepiece raises RuntimeError / its own types for a bad proto
            raise CheckpointError(f"{source}: not a sentencepiece model ({str(err).strip()[:120]})") from None
        self.vocab_size = self.sp.get_piece_size()
        self.eos_id = self.sp.eos_id()
        if self.eos_id < 0:
            raise CheckpointError(f"{source}: the sentencepiece model has no end-of-sequence piece (umT5's is </s>, id 1)")
        self.pad_id = max(self.sp.pad_id(), 0)
        self.unk_id = self.sp.unk_id()
        # The special tokens transformers' T5 tokenizer (Wan's) matches in a prompt's text: pad, eos, unk
        specials = {self.sp.id_to_piece(i): i for i in (self.sp.pad_id(), self.eos_id, self.unk_id) if i >= 0}
        self.special_ids = specials
        self._specials = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "SentencePieceTokenizer":
        """spiece.model, or a folder that holds one (Wan's google/umt5-xxl, a diffusers tokenizer/)."""
        path = Path(path)
        if path.is_dir():
            if not (path / "spiece.model").is_file():
                has_json = " (tokenizer.json alone is not read: the sentencepiece model is)" if (path / "tokenizer.json").is_file() else ""
                raise CheckpointError(f"{path}: no spiece.model here, the umT5 sentencepiece model{has_json}")
            path = path / "spiece.model"
        if path.suffix.lower() in PICKLE_SUFFIXES:
            raise CheckpointError(f"{path}: a tokenizer is a sentencepiece model (spiece.model), not a pickle")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no such tokenizer file (umT5's sentencepiece model, spiece.model)") from None
        except OSError as err:
            raise CheckpointError(f"{path}: unreadable tokenizer ({err.strerror})") from None
        return cls(data, str(path))

    def __call__(self, prompts: list[str], max_tokens: int = TEXT_LEN) -> list[list[int]]:
        """Token ids per prompt: cleaned, encoded, end token appended; longer than max_tokens: the
        first max_tokens - 1 plus the end token, with a warning (Wan truncates silently)."""
        out = []
        for prompt in prompts:
            ids = self.encode_text(clean_prompt(prompt))
            if len(ids) + 1 > max_tokens:
                log.warning("umT5: a prompt of %d tokens is cut to %d (Wan reads %d): %.60r...",
                            len(ids) + 1, max_tokens, max_tokens, prompt)
                ids = ids[: max_tokens - 1]
            out.append(ids + [self.eos_id])
        return out

    def encode_text(self, text: str) -> list[int]:
        """The ids of cleaned text as Wan's tokenizer gives them (transformers' T5 tokenizer of this
        sentencepiece model, which Wan 2.1 runs), not as sentencepiece alone does:
        - a special token's text (`<pad>`, `</s>`, `<unk>`) is that token (ids 0, 1, 2 in umT5's model);
        - each run of characters the vocabulary lacks is one `<unk>`, where sentencepiece's byte
          fallback would spell them as UTF-8 byte pieces."""
        ids: list[int] = []
        for part in self._specials.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
                continue
            after_unk = False
            for i in self.sp.encode(part):
                unknown = self.sp.is_byte(i) or i == self.unk_id
                if not (unknown and after_unk):  # a run of unknown characters is one <unk>
                    ids.append(self.unk_id if unknown else i)
                after_unk = unknown
        return ids

    def check_pairs_with(self, rows: int, source: str) -> None:
        """The tokenizer and an embedding of `rows` rows belong together (ids fit; rows pad a little)."""
        if not 0 <= rows - self.vocab_size < VOCAB_SLACK:
            raise CheckpointError(
                f"{self.source}: the tokenizer has {self.vocab_size} pieces but {source}'s embedding (shared.weight) has "
                f"{rows} rows; they do not belong together (a umT5 embedding has the pieces plus fewer than {VOCAB_SLACK} padding rows)")


# ---------------------------------------------------------------------------------------------
# reading the forms


@dataclass
class _Tensor:
    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F16, BF16, F32, F8_E4M3, ...
    pickled: dict[str, torch.Tensor] | None = None  # a .pth's tensors (memory-mapped), by stored key


@dataclass
class _Plan:
    """What loading reads: the config, where each model tensor lives, and the tokenizer."""

    source: str
    config: UMT5Config
    weights: dict[str, _Tensor]  # model key (tied alias excluded) -> file tensor
    scales: dict[str, _Tensor]  # model key -> its fp8 scale
    tokenizer: SentencePieceTokenizer


def _header(path: Path, into: dict[str, _Tensor], source: str | None = None) -> dict[str, str]:
    """Add a safetensors file's tensors (shape, dtype; no data read) to `into`; returns its metadata."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                into[key] = _Tensor(path, key, tuple(sl.get_shape()), str(sl.get_dtype()))
            return dict(f.metadata() or {})
    except FileNotFoundError:
        raise CheckpointError(f"{source or path}: no such file") from None
    except Exception as err:  # safetensors raises its own error types for a corrupt header
        raise CheckpointError(f"{source or path}: not a readable safetensors file ({err})") from None


def _read_tensor(t: _Tensor) -> torch.Tensor:
    """One stored tensor, opened on its own: safetensors hands back a view of the file's memory map,
    which goes away with the tensor (so pages read while loading are not kept mapped)."""
    from safetensors import safe_open

    if t.pickled is not None:
        return t.pickled[t.key]

    try:
        with safe_open(str(t.file), framework="pt", device="cpu") as f:
            return f.get_tensor(t.key)
    except Exception as err:  # safetensors raises its own error types for truncated data
        raise CheckpointError(f"{t.file}: tensor {t.key} is truncated or corrupt ({err})") from None


def _folder_tensors(folder: Path) -> tuple[dict[str, _Tensor], dict[str, str]]:
    """The tensors of a Hugging Face folder: model.safetensors, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    tensors: dict[str, _Tensor] = {}
    if index.is_file():
        try:
            weight_map = jsonfile.loads(index.read_text(encoding="utf-8"))["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: not a safetensors index ({type(err).__name__}: {err})") from None
        shards: dict[str, list[str]] = {}
        for key, shard in weight_map.items():
            shards.setdefault(shard, []).append(key)
        for shard, keys in shards.items():
            if Path(shard).name != shard:
                raise CheckpointError(f"{index}: shard name {shard!r} is not a file in the folder")
            if not (folder / shard).is_file():
                raise CheckpointError(f"{index}: shard {shard} (holding {keys[0]} and {len(keys) - 1} more) is missing from {folder}")
            found: dict[str, _Tensor] = {}
            _header(folder / shard, found)
            absent = [k for k in keys if k not in found]
            if absent:
                raise CheckpointError(f"{folder / shard}: the index places {absent[0]} here, but the shard has no such tensor")
            tensors.update({k: found[k] for k in keys})
        return tensors, {}
    single = folder / "model.safetensors"
    if single.is_file():
        return tensors, _header(single, tensors)
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(f"{folder}: no model.safetensors here, only the pickle {pickles[0]}: pass that file itself "
                              "(read tensors-only)")
    raise CheckpointError(f"{folder}: none of the umT5 forms: no model.safetensors or model.safetensors.index.json "
                          "(a Hugging Face folder), and a folder is not a ComfyUI file")


def _folder_config(folder: Path) -> UMT5Config | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        raw = jsonfile.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise CheckpointError(f"{path}: malformed JSON ({err})") from None
    if not isinstance(raw, dict) or raw.get("model_type") != "umt5":
        got = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"{path}: model_type is {got!r}, expected 'umt5' (T5 and mT5 share one position bias; umT5 has one per layer)")
    if raw.get("feed_forward_proj", "gated-gelu") != "gated-gelu":
        raise CheckpointError(f"{path}: feed_forward_proj is {raw['feed_forward_proj']!r}; umT5 is 'gated-gelu'")
    fields = {"vocab_size": "vocab_size", "d_model": "d_model", "d_ff": "d_ff", "num_heads": "num_heads", "d_kv": "d_kv",
              "num_layers": "num_layers", "num_buckets": "relative_attention_num_buckets",
              "max_distance": "relative_attention_max_distance", "eps": "layer_norm_epsilon"}
    defaults = UMT5Config()
    try:
        values = {ours: type(getattr(defaults, ours))(raw.get(theirs, getattr(defaults, ours))) for ours, theirs in fields.items()}
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: a size field is not a number ({err})") from None
    return UMT5Config(**values)


def _folder_tokenizer(folder: Path) -> SentencePieceTokenizer:
    for candidate in (folder, folder.parent / "tokenizer"):
        if (candidate / "spiece.model").is_file():
            return SentencePieceTokenizer.from_file(candidate / "spiece.model")
    has_json = "; tokenizer.json alone is not read" if (folder / "tokenizer.json").is_file() else ""
    raise CheckpointError(f"{folder}: no spiece.model (umT5's sentencepiece model) here or in {folder.parent / 'tokenizer'}"
                          f"{has_json}; pass the tokenizer file")


def _quant_formats(tensors: Mapping[str, _Tensor], layout: _Layout, metadata: Mapping[str, str], source: str) -> None:
    """Refuse quantisation formats other than per-tensor float8 (ComfyUI's comfy_quant / file metadata)."""
    confs = {}
    for weight_key, conf_key in layout.quant_confs.items():
        raw = bytes(_read_tensor(tensors[conf_key]).to(torch.uint8).tolist())
        try:
            confs[weight_key] = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise CheckpointError(f"{source}: {conf_key} is not a JSON quantisation config") from None
    if "_quantization_metadata" in metadata:
        try:
            layers = json.loads(metadata["_quantization_metadata"])["layers"]
            confs.update({f"{layer}.weight": conf for layer, conf in layers.items()})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{source}: its _quantization_metadata is not {{'layers': {{...}}}} JSON") from None
    for weight_key, conf in confs.items():
        fmt = conf.get("format") if isinstance(conf, dict) else None
        if fmt not in FP8_FORMATS:
            raise CheckpointError(f"{source}: {weight_key} is quantised as {fmt!r}; only per-tensor float8 "
                                  f"({', '.join(sorted(FP8_FORMATS))}) is read")


def _plan(tensors: dict[str, _Tensor], metadata: Mapping[str, str], source: str, config: UMT5Config | None,
          tokenizer: SentencePieceTokenizer | None) -> _Plan:
    layout = _layout(tensors)
    if "shared.weight" not in layout.weights and not any(k.startswith("encoder.block.") for k in layout.weights):
        shown = ", ".join(sorted(tensors)[:3])
        raise CheckpointError(f"{source}: none of the umT5 forms: no shared.weight or encoder.block.* key "
                              f"(ComfyUI / Hugging Face names; it has {len(tensors)} tensors: {shown}{', ...' if len(tensors) > 3 else ''})")
    if layout.scale_orphans:
        raise CheckpointError(f"{source}: {layout.scale_orphans[0]} scales a weight the file does not have")
    shapes = {k: tensors[v].shape for k, v in layout.weights.items()}
    cfg = config or infer_config(shapes, source)
    check_shapes(model_shapes_of(cfg), shapes, source)
    for model_key, file_key in layout.weights.items():
        t = tensors[file_key]
        if t.dtype in _FP8_HEADER_DTYPES and file_key not in layout.scales:
            layer = file_key.rsplit(".", 1)[0]
            raise CheckpointError(f"{source}: {file_key} is stored as {t.dtype} with no scale ({layer}.scale_weight or "
                                  f"{layer}.weight_scale); float8 weights are read only with their per-tensor scales")
        if t.dtype not in _FLOAT_HEADER_DTYPES | _FP8_HEADER_DTYPES:
            raise CheckpointError(f"{source}: {file_key} is stored as {t.dtype}; umT5 weights are read as float16/bfloat16/"
                                  "float32, or float8 with a scale")
    for file_key, scale_key in layout.scales.items():
        if math.prod(tensors[scale_key].shape) != 1:
            raise CheckpointError(f"{source}: {scale_key} has shape {tensors[scale_key].shape}; only per-tensor (one number) scales are read")
    _quant_formats(tensors, layout, metadata, source)
    if tokenizer is None:
        if layout.tokenizer_key is None:
            raise CheckpointError(f"{source}: no tokenizer: the file has no {TOKENIZER_KEY} tensor (ComfyUI's embedded "
                                  "sentencepiece model); pass the tokenizer file (spiece.model)")
        proto = _read_tensor(tensors[layout.tokenizer_key])
        tokenizer = SentencePieceTokenizer(proto.to(torch.uint8).numpy().tobytes(), f"{source} ({TOKENIZER_KEY})")
    tokenizer.check_pairs_with(cfg.vocab_size, source)
    weights = {k: tensors[v] for k, v in layout.weights.items() if k != TIED_KEY}
    scales = {k: tensors[layout.scales[v]] for k, v in layout.weights.items() if k != TIED_KEY and v in layout.scales}
    return _Plan(source, cfg, weights, scales, tokenizer)


def plan_umt5(path: str | os.PathLike, tokenizer: str | os.PathLike | None = None) -> _Plan:
    """Read a umT5 form's headers (no weights): its config, where each tensor lives, its tokenizer."""
    path = Path(path)
    tok = SentencePieceTokenizer.from_file(tokenizer) if tokenizer is not None else None
    if path.name == "model.safetensors.index.json" and path.is_file():  # a folder named by its index
        path = path.parent
    if path.is_dir():
        tensors, metadata = _folder_tensors(path)
        return _plan(tensors, metadata, str(path), _folder_config(path), tok or _folder_tokenizer(path))
    if not path.exists():
        raise CheckpointError(f"{path}: no such umT5 file or folder")
    if pickled.is_pickle(path):  # Wan's models_t5_umt5-xxl-enc-bf16.pth
        return _plan(_pickle_tensors(path), {}, str(path), None, tok or _wan_tokenizer(path))
    tensors = {}
    metadata = _header(path, tensors)
    return _plan(tensors, metadata, str(path), None, tok)


def _pickle_tensors(path: Path) -> dict[str, _Tensor]:
    """A pickle's tensors (read tensors-only, memory-mapped) under transformers' names (Wan's converted)."""
    state = pickled.read_state(path)
    names = {k: k for k in state}
    if "token_embedding.weight" in state:  # Wan 2.1's T5Encoder names
        names = {wan: hf for hf, wan in from_wan({k: k for k in state}, str(path)).items()}
    head = pickled.header(state)
    return {names[k]: _Tensor(path, k, head[k][0], head[k][1], state) for k in state}


def _wan_tokenizer(path: Path) -> SentencePieceTokenizer:
    """The spiece.model that goes with a Wan .pth: google/umt5-xxl/ beside it (Wan-AI's folders), tokenizer/, or beside it."""
    for sub in WAN_TOKENIZER_DIRS:
        candidate = path.parent / sub / "spiece.model"
        if candidate.is_file():
            return SentencePieceTokenizer.from_file(candidate)
    raise CheckpointError(f"{path}: no tokenizer beside it (looked for {', '.join(str(path.parent / d / 'spiece.model') for d in WAN_TOKENIZER_DIRS[:2])}); "
                          "pass the tokenizer (spiece.model from Wan's google/umt5-xxl folder)")


def _dequantise(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, chunk: int = 1 << 20) -> torch.Tensor:
    """weight * scale (one number) in float32, rounded once to dtype; row blocks of ~chunk elements
    keep the float32 temporaries small (whole-tensor ones left the allocator holding ~1.5x the model)."""
    s = scale.to(torch.float32).reshape(())
    out = torch.empty(weight.shape, dtype=dtype)
    rows = max(1, chunk // max(1, weight[0].numel())) if weight.ndim else 1
    flat_in, flat_out = weight.reshape(weight.shape[0], -1), out.reshape(out.shape[0], -1)
    for i in range(0, weight.shape[0], rows):
        flat_out[i:i + rows] = (flat_in[i:i + rows].to(torch.float32) * s).to(dtype)
    return out


def _materialise(plan: _Plan, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Build on the meta device, then read one tensor at a time (dequantised, cast, moved) into it.

    A tensor already in `dtype` on the CPU stays a view of the file's memory map (read on first use);
    any other is converted from the map and the view dropped: the peak is the model plus one tensor."""
    with torch.device("meta"):
        model = build(plan.config)
    state: dict[str, torch.Tensor] = {}
    for key, t in plan.weights.items():
        value = _read_tensor(t)
        if key in plan.scales:  # ComfyUI's scaled fp8: weight * scale
            value = _dequantise(value, _read_tensor(plan.scales[key]), dtype)
        state[key] = value.to(device=device, dtype=dtype)
        del value
    state[TIED_KEY] = state["shared.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.encoder.embed_tokens.weight = model.shared.weight  # assign made two Parameters of one tensor: one again
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------
# the encoder


class UMT5Encoder:
    """Prompt strings -> Wan's text context (B, 512, d_model) float32, zero after each prompt's tokens.

    >>> enc = load_umt5("text_encoders/umt5_xxl_fp16.safetensors")
    >>> ctx = enc(["a moonlit night"])    # (1, 512, 4096)
    >>> enc.release()                     # frees the weights; the next call reads them again

    Recent prompts' outputs are cached (bounded LRU, real tokens only), each encoded alone so that it
    does not depend on which prompts shared its batch.
    """

    text_len = TEXT_LEN

    def __init__(self, model: nn.Module | None, tokenizer: SentencePieceTokenizer, source: str = "umT5",
                 reload: Callable[[], nn.Module] | None = None, cache_size: int = 16):
        self.model = model
        self.tokenizer = tokenizer
        self.source = source
        self._reload = reload
        self.cache_size = cache_size
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        if model is None and reload is None:
            raise AlayaError("UMT5Encoder needs a model or a way to load one")
        if model is None:
            self.model = reload()
        self.text_dim = int(self.model.config.d_model)
        tokenizer.check_pairs_with(int(self.model.config.vocab_size), source)

    @property
    def released(self) -> bool:
        return self.model is None

    def release(self) -> None:
        """Drop the weights (umT5-XXL: ~11 GB); a later call reads them again from the same file."""
        self.model = None
        self._cache.clear()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _model(self) -> nn.Module:
        if self.model is None:
            if self._reload is None:
                raise AlayaError(f"{self.source}: this umT5 encoder was released and cannot reload its weights")
            log.info("umT5: reading %s again (released earlier)", self.source)
            self.model = self._reload()
        return self.model

    @property
    def device(self) -> torch.device:
        return self._model().shared.weight.device

    def tokenize(self, prompts: list[str]) -> list[list[int]]:
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise AlayaError(f"umT5: expected a list of prompt strings, got {prompts!r:.80}")
        return self.tokenizer(list(prompts), self.text_len)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        """Each prompt's real-token outputs (n_i, d_model) float32, as Wan's T5EncoderModel returns them.

        The batch is padded to its longest prompt under an attention mask; the real tokens' outputs
        equal those of Wan's run padded to 512 (the mask hides padding; the position bias is relative)."""
        ids = self.tokenize(prompts)
        if not ids:
            return []
        model = self._model()
        device = model.shared.weight.device
        longest = max(len(i) for i in ids)
        batch = torch.full((len(ids), longest), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), longest), dtype=torch.long)
        for row, tokens in enumerate(ids):
            batch[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        hidden = model(input_ids=batch.to(device), attention_mask=mask.to(device)).last_hidden_state.float()
        return [hidden[row, : len(tokens)] for row, tokens in enumerate(ids)]

    def __call__(self, prompts: list[str]) -> torch.Tensor:
        """(B, 512, d_model) float32: each prompt's tokens, then zeros (Wan's padded context)."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise AlayaError(f"umT5: expected a list of prompt strings, got {prompts!r:.80}")
        for p in dict.fromkeys(prompts):
            if p not in self._cache:  # alone, never padded beside others: its output depends on its text only
                self._cache[p] = self.encode([p])[0]
        out = None
        for row, p in enumerate(prompts):
            self._cache.move_to_end(p)
            e = self._cache[p]
            if out is None:
                out = torch.zeros((len(prompts), self.text_len, self.text_dim), dtype=torch.float32, device=e.device)
            out[row, : e.shape[0]] = e
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        if out is None:
            return torch.zeros((0, self.text_len, self.text_dim), dtype=torch.float32)
        return out


def load_umt5(path: str | os.PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
              tokenizer: str | os.PathLike | None = None) -> UMT5Encoder:
    """A umT5 encoder from any of its forms (module docstring), on `device`, weights in `dtype`
    (default bf16, as Wan runs it). `tokenizer`: a spiece.model (or its folder) overriding the form's own."""
    plan = plan_umt5(path, tokenizer)
    device = torch.device(device)
    dtype = dtype or DEFAULT_DTYPE
    if not dtype.is_floating_point or dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise AlayaError(f"umT5: dtype {dtype} is not a compute dtype (float32, bfloat16, float16)")

    def reload() -> nn.Module:
        return _materialise(plan, device, dtype)

    return UMT5Encoder(reload(), plan.tokenizer, source=plan.source, reload=reload)


def text_dim_of(path: str | os.PathLike) -> int:
    """The output width of a umT5 form, from its headers only (4096 for umT5-XXL)."""
    path = Path(path)
    if path.is_dir():
        cfg = _folder_config(path)
        if cfg is not None:
            return cfg.d_model
        tensors, _ = _folder_tensors(path)
    else:
        if not path.exists():
            raise CheckpointError(f"{path}: no such umT5 file or folder")
        if pickled.is_pickle(path):
            tensors = _pickle_tensors(path)
        else:
            tensors = {}
            _header(path, tensors)
    layout = _layout(tensors)
    if "shared.weight" not in layout.weights or len(tensors[layout.weights["shared.weight"]].shape) != 2:
        raise CheckpointError(f"{path}: none of the umT5 forms: no 2-D shared.weight (the token embedding)")
    return int(tensors[layout.weights["shared.weight"]].shape[1])


# ---------------------------------------------------------------------------------------------
# Wan's .pth -> safetensors (the one place a pickle is opened)


def convert_wan_checkpoint(src: str | os.PathLike, dst: str | os.PathLike,
                           tokenizer: str | os.PathLike | None) -> Path:
    """Wan 2.1's `models_t5_umt5-xxl-enc-bf16.pth` -> a ComfyUI-form safetensors (transformers' names,
    the tokenizer embedded as `spiece_model`), dtypes kept. The .pth is opened with
    torch.load(weights_only=True, mmap=True): tensors only, no code, memory-mapped."""
    src, dst = Path(src), Path(dst)
    if tokenizer is None:
        raise AlayaError(f"{src}: Wan's .pth carries no tokenizer; pass --tokenizer PATH (spiece.model from Wan's "
                         "google/umt5-xxl folder) so the converted file holds one")
    tok = SentencePieceTokenizer.from_file(tokenizer)
    if dst.suffix != ".safetensors":
        raise AlayaError(f"{dst}: the converted file is written as .safetensors")
    if not src.is_file():
        raise CheckpointError(f"{src}: no such file")
    state = pickled.read_state(src)
    named = from_wan(state, str(src))
    shapes = {k: tuple(v.shape) for k, v in named.items()}
    cfg = infer_config(shapes, str(src))
    check_shapes({k: v for k, v in model_shapes_of(cfg).items() if k != TIED_KEY}, shapes, str(src))
    tok.check_pairs_with(cfg.vocab_size, str(src))
    named[TOKENIZER_KEY] = torch.frombuffer(bytearray(tok.model_proto), dtype=torch.uint8)
    meta = {"format": "alaya-flash/umt5", "converted_from": src.name, "config": dataclasses.asdict(cfg)}
    return save_safetensors(named, dst, meta)
