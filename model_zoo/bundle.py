"""Model folders: the on-disk format of a Flash model and of a teacher model.

A model is a folder:

    my-flash/                        my-teacher/
      config.json                      config.json
      dit.safetensors                  dit.safetensors
      gbuffer_encoder.safetensors      vae.safetensors
      decoder.safetensors
      refiner.safetensors            (optional: the G-buffer refiner, codecs/refiner.py)

config.json (written by save_flash / save_teacher; every key is checked on load):

    {"format": "alaya-flash/flash", "version": 1,
     "networks": {"dit": {"family": "dit", "config_name": "dit-small", "config": {...}},
                  "gbuffer_encoder": {...}, "decoder": {...},        # teacher: "dit", "vae"
                  "refiner": {...}},                                 # optional
     "text_encoder": "all-minilm-l6-v2",
     "session": {"steps": 4, "shift": 5.0, "chunk_frames": 3, "window_frames": 12,
                 "sink_frames": 3, "rope": "relative"},              # teacher: steps, cfg, shift,
     "trained_size": [height, width],                                #   window_frames, negative_prompt
     "random_weights": false, "notes": "..."}

Each network's weights live in `<role>.safetensors` (roles above), keyed exactly as the network's
state dict (Wan-native DiT keys, TAEHV indices, Wan VAE keys) and loaded strictly: a missing,
unexpected or misshapen key is an error naming the file and the key. The full dataclass config is
stored, so a folder loads without knowing the named config it came from.

The embedded default Flash model lives in model_zoo/default/ once the training recipe exports it;
`default_flash_dir()` says clearly when it does not exist yet.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import config_fields, registry
from .errors import AlayaError, CheckpointError
from . import jsonfile
from .loading import load_strict, save_safetensors
from .text_encoder import MINILM_NAMES, MINILM_TOKENS  # noqa: F401 (MINILM_TOKENS: the name users import from here)

FORMAT_VERSION = 1
CONFIG_KEYS = {"format", "version", "networks", "text_encoder", "session", "trained_size", "random_weights", "notes"}
FLASH_ROLES = {"dit": "dit", "gbuffer_encoder": "gbuffer-encoder", "decoder": "tiny-codec"}  # role -> family
FLASH_OPTIONAL_ROLES = {"refiner": "gbuffer-refiner"}  # loaded when config.json names them
TEACHER_ROLES = {"dit": "dit", "vae": "wan-vae"}
UMT5_PREFIX = "umt5-xxl:"  # "umt5-xxl:<path>": a umT5 file or folder in any form model_zoo/umt5.py reads


class _TextEncoderNames(tuple):
    """The named prompt encoders, and "umt5-xxl:<path>" for any path (a ComfyUI text_encoders/ file,
    a Hugging Face folder, a converted Wan .pth): `name in TEXT_ENCODERS` accepts both."""

    def __contains__(self, name) -> bool:
        return tuple.__contains__(self, name) or (isinstance(name, str) and name.startswith(UMT5_PREFIX)
                                                  and len(name) > len(UMT5_PREFIX))


TEXT_ENCODERS = _TextEncoderNames((*MINILM_NAMES, f"{UMT5_PREFIX}<path>"))
DEFAULT_DIR = Path(__file__).resolve().parent / "default"


@dataclass(frozen=True)
class FlashSettings:
    """How a Flash model samples by default (the Flash Sampler's widget defaults)."""

    steps: int = 4  # few-step x0 passes per chunk
    shift: float = 5.0
    chunk_frames: int = 3  # latent frames per autoregressive chunk (12 pixel frames)
    window_frames: int = 12  # latent frames in the rolling KV window, current chunk included
    sink_frames: int = 3  # first latent frames kept in the cache forever
    rope: str = "relative"


@dataclass(frozen=True)
class TeacherSettings:
    """How the teacher samples by default (model.md §1.6: 50 Euler steps, shift 5, CFG 5)."""

    steps: int = 50
    cfg: float = 5.0
    shift: float = 5.0
    window_frames: int = 81  # pixel frames per bidirectional window (21 latent frames)
    negative_prompt: str = ""


@dataclass
class _Model:
    """What a Flash model and a teacher share: where they came from, their prompt encoder (loaded on
    first use, then kept), and their DiT's device and prompt width. The fields are keyword-only, so
    each model's networks come first and stay positional."""

    _: dataclasses.KW_ONLY
    text_encoder_name: str = "all-minilm-l6-v2"
    trained_size: tuple[int, int] | None = None
    random_weights: bool = False
    path: Path | None = None
    _text: Any = field(default=None, repr=False)

    kind = ""  # "flash" or "teacher"
    label = ""  # what describe() calls it

    def text_encoder(self):
        """The prompt encoder (loaded on first use, then kept); MiniLM's behind the prompt store."""
        if self._text is None:
            self._text = model_text_encoder(self.text_encoder_name, self.device)
        return self._text

    @property
    def device(self) -> torch.device:
        return next(self.dit.parameters()).device

    @property
    def text_dim(self) -> int:
        return self.dit.config.text_dim

    def describe(self) -> str:
        where = str(self.path) if self.path else "in memory"
        return f"{self.label} ({where}{', RANDOM weights' if self.random_weights else ''})"


@dataclass
class FlashModel(_Model):
    """The three networks of a Flash model plus its settings. Networks are in eval mode."""

    dit: nn.Module
    gbuffer_encoder: nn.Module
    decoder: nn.Module  # TinyCodec; its decoder half is used
    refiner: nn.Module | None = None  # GBufferRefiner, or None: frames come straight from the decoder
    settings: FlashSettings = FlashSettings()

    kind = "flash"
    label = "Flash model"


@dataclass
class TeacherModel(_Model):
    """The teacher: a bidirectional DiT and the full Wan VAE, plus its settings."""

    dit: nn.Module
    vae: nn.Module
    settings: TeacherSettings = TeacherSettings()

    kind = "teacher"
    label = "teacher model"


def load_text_encoder(name: str, device: str | torch.device = "cpu"):
    """The named prompt encoder on a device; loaded once per (name, device) and shared (read-only)."""
    return _load_text_encoder(name, str(torch.device(device)))


@functools.lru_cache(maxsize=2)  # models share one encoder: loading it costs seconds, it never changes
def _load_text_encoder(name: str, device: str):
    if name == UMT5_PREFIX[:-1]:  # a published model's need, with no file found for it
        raise AlayaError("this model reads umT5-XXL prompt embeddings and no umT5-XXL file was given or found beside it: "
                         "pass --text-encoder FILE (e.g. ComfyUI's text_encoders/umt5_xxl_fp16.safetensors) or pick one "
                         "in the loader's text_encoder input")
    if name not in TEXT_ENCODERS:
        raise AlayaError(f"text encoder {name!r} is unknown; known: {', '.join(TEXT_ENCODERS)}")
    if name.startswith(UMT5_PREFIX):  # umT5-XXL (~11 GB in bf16): its release() frees the weights, a call reloads
        from .umt5 import load_umt5

        return load_umt5(name[len(UMT5_PREFIX):], device=device)
    from .text_encoder import TextEncoder, context_tokens

    return TextEncoder.load(device=device, tokens=context_tokens(name))


def model_text_encoder(name: str, device: str | torch.device = "cpu"):
    """A model's prompt encoder: MiniLM behind the prompt store (model_zoo/prompt_store.py: a prompt
    encoded by an earlier process is read back, and MiniLM is loaded only for one it lacks), others
    (and MiniLM with the store off) as load_text_encoder gives them."""
    from .prompt_store import store_folder

    folder = store_folder() if name in MINILM_NAMES else None
    if folder is None:
        return load_text_encoder(name, device)
    return _stored_text_encoder(name, str(torch.device(device)), str(folder))


@functools.lru_cache(maxsize=4)  # one per (name, device, store): models share it, as they share the encoder
def _stored_text_encoder(name: str, device: str, folder: str):
    from .prompt_store import StoredTextEncoder
    from .text_encoder import context_tokens, default_model_dir

    return StoredTextEncoder(lambda: load_text_encoder(name, device), default_model_dir(), Path(folder), device,
                             tokens=context_tokens(name))


# ---------------------------------------------------------------------------------------------
# config.json


def _network_entry(module: nn.Module, family: str, config_name: str | None) -> dict:
    return {"family": family, "config_name": config_name, "config": dataclasses.asdict(module.config)}


def _config_from_entry(path: Path, role: str, entry: Any, family: str):
    """The dataclass config of one network from its config.json entry."""
    if not isinstance(entry, dict) or "config" not in entry:
        raise CheckpointError(f"{path}: networks.{role} needs a 'config' object")
    if entry.get("family", family) != family:
        raise CheckpointError(f"{path}: networks.{role} has family {entry.get('family')!r}, expected {family!r}")
    cls = registry.config_class(family)
    if not isinstance(entry["config"], dict):
        raise CheckpointError(f"{path}: networks.{role}.config must be an object, got {entry['config']!r}")
    raw = dict(entry["config"])
    config_fields.check_network(path, role, family, raw)  # every value, before anything is allocated
    try:
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}  # JSON turns tuples into lists
        config = cls(**raw)
    except TypeError as err:
        raise CheckpointError(f"{path}: networks.{role}.config is not a {cls.__name__}: {err}") from None
    except AlayaError as err:  # a check in the config's __post_init__ (reads_light without a sixth branch)
        raise CheckpointError(f"{path}: networks.{role}.config: {err}") from None
    try:  # fields that must agree (a DiT's dim divisible by its heads), named with the file
        return config.validate() if hasattr(config, "validate") else config
    except AlayaError as err:
        raise CheckpointError(f"{path}: networks.{role}.config: {err}") from None


def _read_config(folder: Path, kind: str) -> dict:
    if not folder.exists():
        raise AlayaError(f"{folder}: no such model folder")
    if not folder.is_dir():
        raise AlayaError(f"{folder}: a model is a folder with config.json and .safetensors files, not a file")
    path = folder / "config.json"
    try:
        cfg = jsonfile.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (a model folder needs config.json)") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    want = f"alaya-flash/{kind}"
    if not isinstance(cfg, dict) or cfg.get("format") != want:
        got = cfg.get("format") if isinstance(cfg, dict) else type(cfg).__name__
        raise CheckpointError(f"{path}: 'format' is {got!r}, expected {want!r}")
    if cfg.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: 'version' is {cfg.get('version')!r}, this code reads {FORMAT_VERSION}")
    if not isinstance(cfg.get("networks"), dict):
        raise CheckpointError(f"{path}: 'networks' is missing")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise CheckpointError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(CONFIG_KEYS))})")
    config_fields.check_model(path, cfg)
    return cfg


def _settings(path: Path, cls, raw: Any):
    config_fields.check_session(path, "teacher" if cls is TeacherSettings else "flash", raw)
    raw = raw or {}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise CheckpointError(f"{path}: 'session' has unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    return cls(**raw)


def _write_config(folder: Path, cfg: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / "config.json")


def _model_config(model: _Model, networks: dict, notes: str) -> dict:
    """A model's config.json: its networks' entries, then what either kind of model carries beside them."""
    return {
        "format": f"alaya-flash/{model.kind}", "version": FORMAT_VERSION, "networks": networks,
        "text_encoder": model.text_encoder_name, "session": dataclasses.asdict(model.settings),
        "trained_size": list(model.trained_size) if model.trained_size else None,
        "random_weights": model.random_weights, "notes": notes,
    }


def _text_encoder_name(folder: Path, cfg: dict) -> str:
    text = cfg.get("text_encoder", "all-minilm-l6-v2")
    if text not in TEXT_ENCODERS:
        raise CheckpointError(f"{folder / 'config.json'}: text_encoder {text!r} is unknown; known: {', '.join(TEXT_ENCODERS)}")
    return text


def _model_fields(folder: Path, cfg: dict, settings_cls, text: str) -> dict:
    """The fields of a model loaded from folder beside its networks (cfg: its config.json, read and checked)."""
    return {"settings": _settings(folder / "config.json", settings_cls, cfg.get("session")), "text_encoder_name": text,
            "trained_size": _size(cfg, folder / "config.json"), "random_weights": bool(cfg.get("random_weights")), "path": folder}


def _load_networks(folder: Path, cfg: dict, roles: dict[str, str], device, dtype) -> dict[str, nn.Module]:
    path = folder / "config.json"
    missing = [r for r in roles if r not in cfg["networks"]]
    if missing:
        raise CheckpointError(f"{path}: networks {', '.join(missing)} missing (a {cfg['format']} model has {', '.join(roles)})")
    out = {}
    for role, family in roles.items():
        config = _config_from_entry(path, role, cfg["networks"][role], family)
        weights = folder / f"{role}.safetensors"
        if not weights.is_file():
            raise CheckpointError(f"{weights}: missing (the {role} weights of this model)")
        module = registry.build_config(family, config, device="meta", dtype=dtype)
        load_strict(module, weights)
        out[role] = module.to(device).eval().requires_grad_(False)
    return out


def _size(cfg: dict, path: Path):
    size = cfg.get("trained_size")
    config_fields.check_trained_size(path, size)
    return tuple(size) if size else None


# ---------------------------------------------------------------------------------------------
# Flash


def save_flash(model: FlashModel, folder: str | os.PathLike, config_names: dict[str, str] | None = None, notes: str = "") -> Path:
    """Write a Flash model folder (weights first, config.json last, each atomically)."""
    folder = Path(folder)
    names = config_names or {}
    networks = {}
    for role, family in {**FLASH_ROLES, **FLASH_OPTIONAL_ROLES}.items():
        module = getattr(model, role)
        if module is None:
            continue
        save_safetensors(module.state_dict(), folder / f"{role}.safetensors", {"family": family, "role": role})
        networks[role] = _network_entry(module, family, names.get(role))
    _write_config(folder, _model_config(model, networks, notes))
    for role in set(FLASH_OPTIONAL_ROLES) - set(networks):  # no stale optional network from an earlier save
        (folder / f"{role}.safetensors").unlink(missing_ok=True)
    return folder


def load_flash_folder(folder: str | os.PathLike | None = None, device: str | torch.device = "cpu",
                      dtype: torch.dtype = torch.bfloat16) -> FlashModel:
    """Load one of our Flash model folders strictly; folder=None loads the embedded default.
    (folders.load_flash also takes a Flash release folder: model_zoo/release.py.)"""
    folder = Path(folder) if folder is not None else default_flash_dir()
    cfg = _read_config(folder, "flash")
    nets = _load_networks(folder, cfg, FLASH_ROLES, device, dtype)
    optional = {r: f for r, f in FLASH_OPTIONAL_ROLES.items() if r in cfg["networks"]}
    nets.update(_load_networks(folder, cfg, optional, device, dtype))
    unknown = sorted(set(cfg["networks"]) - set(FLASH_ROLES) - set(FLASH_OPTIONAL_ROLES))
    if unknown:
        raise CheckpointError(f"{folder / 'config.json'}: networks {', '.join(unknown)} are unknown "
                              f"(a Flash model has {', '.join([*FLASH_ROLES, *FLASH_OPTIONAL_ROLES])})")
    text = _text_encoder_name(folder, cfg)
    cond = nets["gbuffer_encoder"].config.out_channels
    if nets["dit"].config.cond_dim != cond:
        raise CheckpointError(f"{folder / 'config.json'}: the DiT reads {nets['dit'].config.cond_dim} conditioning "
                              f"channels, the G-buffer encoder gives {cond}")
    reads = getattr(nets.get("refiner"), "text_dim", 0)
    if reads and reads != nets["dit"].config.text_dim:
        raise CheckpointError(f"{folder / 'config.json'}: the refiner reads {reads}-wide prompt embeddings, the DiT "
                              f"{nets['dit'].config.text_dim}-wide")
    return FlashModel(**nets, **_model_fields(folder, cfg, FlashSettings, text))


def make_random_flash(dit: str = "dit-tiny", gbuffer_encoder: str = "gbuffer-encoder-slim", decoder: str = "taew-slim",
                      seed: int = 0, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                      settings: FlashSettings = FlashSettings(), text_encoder: str = "all-minilm-l6-v2",
                      refiner: str | None = None) -> FlashModel:
    """A Flash model with random weights from named configs (tests and benchmarks).

    The DiT's text width is set to the text encoder's (384), and its input to its latent and the encoder's
    channels, whatever the named config says. A refiner (e.g. "gbuffer-refiner-16") starts as the identity:
    its last layer is zero.
    """
    torch.manual_seed(seed)
    text_dim = _text_dim(text_encoder)
    nets = {}
    roles = {**FLASH_ROLES, **FLASH_OPTIONAL_ROLES}
    for role, name in (("gbuffer_encoder", gbuffer_encoder), ("dit", dit), ("decoder", decoder), ("refiner", refiner)):
        if name is None:
            continue
        family, cfg = registry.get_config(name)
        if family != roles[role]:
            raise AlayaError(f"config {name!r} is a {family} config; the {role} needs a {roles[role]} config")
        if role == "dit":
            cfg = dataclasses.replace(cfg, text_dim=text_dim,
                                      in_dim=cfg.out_dim + nets["gbuffer_encoder"].config.out_channels)
        nets[role] = registry.build_config(family, cfg, dtype=dtype).to(device).eval().requires_grad_(False)
    return FlashModel(**nets, settings=settings, text_encoder_name=text_encoder, random_weights=True)


def _text_dim(name: str) -> int:
    if name not in TEXT_ENCODERS:
        raise AlayaError(f"text encoder {name!r} is unknown; known: {', '.join(TEXT_ENCODERS)}")
    if name.startswith(UMT5_PREFIX):  # read from the file's headers (4096 for umT5-XXL), no weights loaded
        from .umt5 import text_dim_of

        return text_dim_of(name[len(UMT5_PREFIX):])
    from .text_encoder import TextEncoder

    return TextEncoder.text_dim


def default_flash_dir() -> Path:
    """model_zoo/default/, where the exported default Flash model lives (an error until it exists)."""
    if not (DEFAULT_DIR / "config.json").is_file():
        raise AlayaError(
            f"no default Flash model yet: {DEFAULT_DIR} has no config.json (the training recipe exports it there); "
            "pass a model folder instead"
        )
    return DEFAULT_DIR


def shipped_models() -> dict[str, Path]:
    """Name -> folder of every Flash model folder shipped in model_zoo/ (the default and any beside it)."""
    return {p.name: p for p in sorted(DEFAULT_DIR.parent.iterdir()) if p.is_dir() and model_folder_kind(p) == "flash"}


def has_default_flash() -> bool:
    return (DEFAULT_DIR / "config.json").is_file()


# ---------------------------------------------------------------------------------------------
# Teacher


def save_teacher(model: TeacherModel, folder: str | os.PathLike, config_names: dict[str, str] | None = None, notes: str = "") -> Path:
    folder = Path(folder)
    names = config_names or {}
    networks = {}
    for role, family in TEACHER_ROLES.items():
        module = getattr(model, role)
        save_safetensors(module.state_dict(), folder / f"{role}.safetensors", {"family": family, "role": role})
        networks[role] = _network_entry(module, family, names.get(role))
    _write_config(folder, _model_config(model, networks, notes))
    return folder


def load_teacher(folder: str | os.PathLike, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.bfloat16) -> TeacherModel:
    folder = Path(folder)
    cfg = _read_config(folder, "teacher")
    nets = _load_networks(folder, cfg, TEACHER_ROLES, device, dtype)
    text = _text_encoder_name(folder, cfg)
    return TeacherModel(**nets, **_model_fields(folder, cfg, TeacherSettings, text))


def make_random_teacher(dit: str = "dit-tiny", vae: str = "wan2.1-vae-small", seed: int = 0,
                        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        settings: TeacherSettings = TeacherSettings(), text_encoder: str = "all-minilm-l6-v2") -> TeacherModel:
    """A teacher with random weights from named configs (tests and benchmarks)."""
    torch.manual_seed(seed)
    nets = {}
    for role, name in (("dit", dit), ("vae", vae)):
        family, cfg = registry.get_config(name)
        if family != TEACHER_ROLES[role]:
            raise AlayaError(f"config {name!r} is a {family} config; the {role} needs a {TEACHER_ROLES[role]} config")
        if role == "dit":
            cfg = dataclasses.replace(cfg, text_dim=_text_dim(text_encoder))
        nets[role] = registry.build_config(family, cfg, dtype=dtype).to(device).eval().requires_grad_(False)
    return TeacherModel(**nets, settings=settings, text_encoder_name=text_encoder, random_weights=True)


def model_folder_kind(path: str | os.PathLike) -> str | None:
    """'flash' or 'teacher' when path's config.json says it is one of our model folders, else None
    (folders.is_model_folder also knows a Flash release)."""
    try:
        fmt = jsonfile.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("format", "")
    except (OSError, ValueError, AttributeError):
        return None
    return {"alaya-flash/flash": "flash", "alaya-flash/teacher": "teacher"}.get(fmt)
