"""What is this file or folder: name networks from their keys and shapes only (never a file name).

Two levels:

- `identify(path)`: every named config of every registered family is built on the meta device and
  its key shapes compared with the file's (after the family's name conversion, e.g. diffusers ->
  Wan-native); the matching config names, or the closest and why not.
- `identify_path(path)` (`alaya-flash model identify FILE_OR_DIR`): any published form
  (model_zoo/published.py: Wan-native single file, sharded + index, ComfyUI prefixed, fp8-scaled,
  diffusers folders, a Wan repo) and our own model folders. Per network: which component (teacher
  DiT, stock Wan T2V DiT, Flash-student DiT, Wan VAE, tiny decoder, G-buffer encoder, refiner, umT5
  text encoder), its config, its form and dtype; for a folder, what is missing to render.
  status 0: identified; 1: not. Unreadable input raises (the CLI exits 2 with one line).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import helios, pickled, published, registry, umt5
from .bundle import FLASH_OPTIONAL_ROLES, FLASH_ROLES, TEACHER_ROLES, _config_from_entry, model_folder_kind
from .convert import vae_to_wan
from .errors import AlayaError, CheckpointError
from . import jsonfile
from .loading import check_shapes, read_header, read_metadata, read_shapes
from .release import describe_release
from .weight_files import PICKLE_SUFFIXES, refuse_non_safetensors, unit_parts


@dataclass
class Identification:
    """matches: config names whose keys and shapes equal the file's; else the closest and why not."""

    path: str
    matches: list[tuple[str, str]] = field(default_factory=list)  # (config name, family)
    converted: bool = False  # the file used another naming (converted on load)
    closest: tuple[str, str] | None = None
    mismatch: str = ""  # what differs from the closest config
    metadata_name: str | None = None

    def names(self) -> str:
        """'dit-tiny (family dit); native names' (with the metadata's name when it has one)."""
        names = ", ".join(f"{n} (family {f})" for n, f in self.matches)
        naming = "converted names" if self.converted else "native names"
        extra = f"; metadata says {self.metadata_name}" if self.metadata_name else ""
        return f"{names}; {naming}{extra}"

    def describe(self) -> str:
        if self.matches:
            return f"{self.path}: {self.names()}"
        if self.closest is None:
            return f"{self.path}: matches no known config (no registered family)"
        return f"{self.path}: matches no known config; closest {self.closest[0]} (family {self.closest[1]}): {self.mismatch}"


def _spec_shapes(name: str) -> dict[str, tuple[int, ...]]:
    module = registry.build(name, device="meta")
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _converter(family: str):
    if family == "wan-vae":
        return vae_to_wan
    return getattr(registry._family_module(family), "convert_names", None)


def match_shapes(shapes: dict[str, tuple[int, ...]], source: str, families=None, convert: bool = True) -> Identification:
    """Compare shapes with every named config (of `families`, default all); see Identification."""
    result = Identification(path=source)
    best = None
    for name, (family, _cfg) in registry.all_configs().items():
        if families is not None and family not in families:
            continue
        conv = _converter(family) if convert else None
        try:
            got = conv(shapes) if conv else shapes
        except Exception:  # a family's converter that does not apply to these keys
            got = shapes
        want = _spec_shapes(name)
        if got == want:
            result.matches.append((name, family))
            result.converted = result.converted or bool(set(got) - set(shapes))  # renamed, not merely dropped
            continue
        diff = len(set(got) ^ set(want)) + sum(1 for k in set(got) & set(want) if got[k] != want[k])
        if best is None or diff < best[0]:
            best = (diff, name, family, got, want)
    if not result.matches and best is not None:
        _, name, family, got, want = best
        result.closest = (name, family)
        result.mismatch = _mismatch(want, got)
    return result


def _mismatch(want, got) -> str:
    try:
        check_shapes(want, got, "keys")
    except CheckpointError as err:
        return str(err).removeprefix("keys: keys do not match the network: ")
    return ""


def identify(path: str | os.PathLike) -> Identification:
    """Which named configs a weight file is (see module docstring)."""
    result = match_shapes(read_shapes(path), str(path))
    result.metadata_name = read_metadata(path).get("config_name")
    return result


# ---------------------------------------------------------------------------------------------
# Any published form, and folders

COMPONENT = {  # family -> what `identify` calls a network of it
    "dit": "DiT", "wan-vae": "Wan VAE", "tiny-codec": "tiny decoder (TAEHV codec)",
    "gbuffer-encoder": "G-buffer encoder", "gbuffer-refiner": "refiner", "umt5": "umT5 text encoder",
}
MISSING_VAE = "VAE (vae/wan_2.1_vae.safetensors or --vae)"
MISSING_TEXT = "text encoder (umT5-XXL, --text-encoder)"


@dataclass
class Found:
    """One network identify found: its component kind ('dit', 'vae', 'text', 'other'), a label, where."""

    kind: str
    label: str
    where: Path
    text_dim: int = 0


@dataclass
class Report:
    path: str
    lines: list[str] = field(default_factory=list)
    found: list[Found] = field(default_factory=list)
    unknown: int = 0  # weight units that matched nothing

    @property
    def identified(self) -> bool:
        return bool(self.found)

    @property
    def status(self) -> int:
        return 0 if self.identified else 1

    def describe(self) -> str:
        return "\n".join(self.lines)


def _config_summary(cfg) -> str:
    if hasattr(cfg, "num_layers"):
        text = f"text {cfg.text_dim}" + (f" x {cfg.text_len}" if cfg.text_len else "")
        return f"in {cfg.in_dim}, dim {cfg.dim}, {cfg.num_layers} layers, {cfg.num_heads} heads, ffn {cfg.ffn_dim}, {text}"
    return f"base_dim {cfg.base_dim}, z_dim {cfg.z_dim}, dim_mult {list(cfg.dim_mult)}"


def _describe_set(ws: published.WeightSet, label: str | None = None) -> tuple[str, Found | None]:
    """One line for a DiT / VAE WeightSet, and what was found (None: not identified)."""
    where = label or ws.source
    family = "dit" if ws.component == "dit" else "wan-vae"
    shapes = ws.shapes()
    named = match_shapes(shapes, where, families=(family,), convert=False)
    named.converted = ws.naming == "diffusers"
    tail = f"form: {ws.form(naming=False)}; dtype: {ws.dtype()}"
    try:
        cfg = published.config_of(ws)
        own = registry.build_config(family, cfg, device="meta").state_dict()
        mismatch = _mismatch({k: tuple(v.shape) for k, v in own.items()}, shapes)
    except AlayaError as err:
        cfg, mismatch = None, str(err)
    if ws.component == "dit":
        kind = published.dit_kind(cfg) if cfg is not None else "Wan DiT"
    else:
        kind = "Wan VAE" + (" (Wan2.1)" if cfg is not None and cfg.z_dim == 16 else "")
    if named.matches:
        return f"{where}: {kind}: {named.names()}; {tail}", Found(ws.component, kind, Path(ws.source), getattr(cfg, "text_dim", 0))
    trusted = ws.config is not None or (ws.component == "dit" and cfg is not None and published.published_size(cfg)) \
        or ws.component == "vae"
    if cfg is not None and not mismatch and trusted:
        naming = "converted names" if ws.naming == "diffusers" else "native names"
        return (f"{where}: {kind}: unnamed config ({_config_summary(cfg)}); {naming}; {tail}",
                Found(ws.component, kind, Path(ws.source), getattr(cfg, "text_dim", 0)))
    if cfg is not None and mismatch:
        return f"{where}: a {kind} by its keys, but its shapes do not fit its config: {mismatch}", None
    return named.describe() + f"; {tail}", None


def _describe_other(path: Path, header: dict, label: str) -> tuple[str, Found | None]:
    """A weight unit holding no Wan DiT / VAE: a registered family (tiny decoder, encoder, refiner, umT5...)."""
    shapes = {k: tuple(s) for k, (s, _) in header.items()}
    dtype = published.header_dtype(header)
    if "spiece_model" in header:
        dtype += "; tokenizer embedded (spiece_model, ComfyUI's text_encoders/ form)"
    result = match_shapes(shapes, label)
    result.metadata_name = None
    if result.matches:
        family = result.matches[0][1]
        kind = COMPONENT.get(family, family)
        width = getattr(registry.get_config(result.matches[0][0])[1], "d_model", 0)
        return f"{label}: {kind}: {result.names()}; dtype: {dtype}", Found("text" if family == "umt5" else family, kind, path, width)
    if any(m in shapes for m in published.T5_MARKERS) and "encoder.block.0.layer.0.SelfAttention.q.weight" in shapes:
        vocab, width = (shapes.get("shared.weight") or (0, 0))[:2]
        kind = "umT5-XXL text encoder" if vocab == published.UMT5_VOCAB and width == 4096 else f"T5-style text encoder (vocab {vocab}, width {width})"
        check = ("; no umt5 family is registered to check every shape" if "umt5" not in registry.FAMILIES
                 else f"; umt5 family: {result.describe().split(': ', 1)[1]}")
        return f"{label}: {kind} (by its key names{check}); dtype: {dtype}", Found("text", kind, path, width)
    meta = read_metadata(path) if path.suffix == ".safetensors" else {}
    family = meta.get("family")
    if family in registry.FAMILIES and family not in ("dit", "wan-vae"):
        kind = COMPONENT.get(family, family)
        return (f"{label}: {kind} (by its metadata; config not a named one: {result.describe().split(': ', 1)[1]}); dtype: {dtype}",
                Found(family, kind, path))
    return result.describe() + f"; dtype: {dtype}", None


def _helios(header: dict) -> str | None:
    for prefix in published.DIT_PREFIXES:
        if any(prefix + m in header for m in published.HELIOS_MARKERS) and prefix + "patch_embedding.weight" in header:
            return prefix
    return None


def _describe_unit(path: Path, report: Report, label: str | None = None) -> None:
    """A .safetensors file, shard or index: one line per network it holds."""
    label = label or str(path)
    parts, _meta, source, layout = unit_parts(path)
    header = {k: v for _, h in parts for k, v in h.items()}
    if _helios(header) is not None:
        report.lines.append(f"{label}: Flash-student DiT in diffusers' Helios naming (patch_short/norm_out.scale_shift_table); "
                            f"not a Wan DiT: it renders as part of a Flash release folder (transformer/ beside "
                            f"transformer_partial.safetensors and the codecs); {layout}; dtype: {published.header_dtype(header)}")
        report.found.append(Found("flash-dit", "Flash-student DiT (Helios)", path))
        return
    sets = published.open_file(path)
    if not sets:
        line, found = _describe_other(parts[0][0] if len(parts) == 1 else path, header, label)
        if len(parts) > 1:
            line += f"; {layout}"
        report.lines.append(line)
        report.found += [found] if found else []
        report.unknown += found is None
        return
    for ws in sets:
        line, found = _describe_set(ws, label if len(sets) == 1 else f"{label} [{ws.component}]")
        report.lines.append(line)
        report.found += [found] if found else []
        report.unknown += found is None


def _describe_pickle(path: Path, report: Report) -> None:
    """A PyTorch pickle (Wan's Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth), read tensors-only:
    what it holds and how it is read; raises when it is refused (code in it, not a state dict)."""
    state = pickled.read_state(path)
    how = f"read with {pickled.READER}"
    sets = published.pickle_sets(path, state)
    for ws in sets:
        line, found = _describe_set(ws, str(path) if len(sets) == 1 else f"{path} [{ws.component}]")
        report.lines.append(line)  # its form says how it is read
        report.found += [found] if found else []
        report.unknown += found is None
    if sets:
        return
    line, found = _describe_other(path, pickled.header(state), str(path))
    if found is not None and found.kind == "text":
        try:
            tokenizer = umt5._wan_tokenizer(path).source
            line += f"; form: PyTorch pickle (Wan's names, converted); tokenizer: {tokenizer}"
        except CheckpointError:
            tried = " or ".join(str(path.parent / d / "spiece.model") for d in umt5.WAN_TOKENIZER_DIRS[:2])
            line += f"; form: PyTorch pickle (Wan's names, converted); no tokenizer beside it ({tried}): pass one"
            found = Found("other", found.label, path)
    report.lines.append(f"{line}; {how}")
    report.found += [found] if found else []
    report.unknown += found is None


def _describe_component_folder(folder: Path, report: Report, label: str) -> bool:
    """A folder with config.json naming a diffusers class (transformer/, vae/, text_encoder/); True if handled."""
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        return False
    try:
        cls = jsonfile.loads(cfg_file.read_text(encoding="utf-8")).get("_class_name", "")
    except (OSError, ValueError, AttributeError):
        return False
    component = {"WanTransformer3DModel": "dit", "WanModel": "dit", "AutoencoderKLWan": "vae"}.get(cls)
    if component is None:
        return False
    line, found = _describe_set(published.open_folder(folder, component), label)
    report.lines.append(line)
    report.found += [found] if found else []
    report.unknown += found is None
    return True


def _scan(folder: Path, report: Report, label: str, depth: int) -> None:
    handled = _describe_component_folder(folder, report, label)
    if not handled:
        for unit in published._folder_units(folder):
            _describe_unit(unit.path, report, str(unit.path))
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES:
            try:
                _describe_pickle(p, report)
            except CheckpointError as err:  # one unreadable pickle does not stop the folder's report
                report.lines.append(str(err))
                report.unknown += 1
    if depth > 0 and not handled:
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if _describe_release(sub, report):
                continue
            if _model_folder_kind(sub):
                _describe_model_folder(sub, report)
            else:
                _scan(sub, report, str(sub), depth - 1)


def _describe_release(folder: Path, report: Report) -> bool:
    """A Flash release folder (model_zoo/release.py); True if it is one."""
    if not helios.is_release(folder):
        return False
    lines, ok = describe_release(folder)
    report.lines += lines
    if ok:
        report.found.append(Found("model-folder", "Flash release", folder))
    else:
        report.unknown += 1
    return True


def _model_folder_kind(path: Path) -> str | None:
    return model_folder_kind(path)  # a Flash release was looked for first (_describe_release)


def _unreadable_config(folder: Path) -> str | None:
    """One line when the folder's config.json (what says how to load its weights) is there but is not a
    JSON object, else None."""
    cfg = folder / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = jsonfile.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # (UnicodeDecodeError is a ValueError)
        return f"{cfg}: not readable as JSON ({err}); the weights below are named from their tensors alone"
    if not isinstance(data, dict):
        return f"{cfg}: a {type(data).__name__}, not a JSON object; the weights below are named from their tensors alone"
    return None


def _missing(report: Report, folder: Path, config_unreadable: bool = False) -> None:
    """The 'missing:' line of a folder: what a renderer needs beside the DiTs found (and a readable
    config.json, when the folder has a broken one)."""
    dits = [f for f in report.found if f.kind == "dit"]
    if not dits:
        return
    has_vae = any(f.kind == "vae" for f in report.found) or published.find_vae(folder) is not None
    has_text = any(f.kind == "text" for f in report.found) or published.find_text_encoder(folder) is not None
    for d in dits:
        missing = []
        if "Flash-student" in d.label:
            if not any(f.kind == "gbuffer-encoder" for f in report.found):
                missing.append("G-buffer encoder")
            if not any(f.kind == "tiny-codec" for f in report.found):
                missing.append("tiny decoder")
        else:
            if not has_vae:
                missing.append(MISSING_VAE)
            if d.text_dim == published.UMT5_DIM and not has_text:
                missing.append(MISSING_TEXT)
        if config_unreadable:
            missing.append("a readable config.json (above)")
        article = "an" if d.label[0] in "aeiouAEIOU" else "a"
        which = f" ({d.where.name})" if len(dits) > 1 else ""
        if missing:
            report.lines.append(f"{folder}: {article} {d.label}{which}; missing: {', '.join(missing)}")
        else:
            report.lines.append(f"{folder}: {article} {d.label}{which}; nothing missing to render")


def _describe_model_folder(folder: Path, report: Report) -> None:
    """One of our model folders (config.json 'alaya-flash/flash' or 'alaya-flash/teacher')."""
    cfg_path = folder / "config.json"
    try:
        cfg = jsonfile.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{cfg_path}: not readable ({err})") from None
    kind = "flash" if cfg.get("format") == "alaya-flash/flash" else "teacher"
    roles = {**FLASH_ROLES, **FLASH_OPTIONAL_ROLES} if kind == "flash" else TEACHER_ROLES
    required = FLASH_ROLES if kind == "flash" else TEACHER_ROLES
    networks = cfg.get("networks") or {}
    text = cfg.get("text_encoder", "all-minilm-l6-v2")
    report.lines.append(f"{folder}: our {'Flash' if kind == 'flash' else 'teacher'} model folder "
                        f"({cfg.get('format')} v{cfg.get('version')}); text encoder {text}")
    missing = [f"{r} (not in config.json)" for r in required if r not in networks]
    ok = True
    for role, entry in networks.items():
        family = roles.get(role)
        weights = folder / f"{role}.safetensors"
        if family is None:
            report.lines.append(f"  {role}: unknown network name")
            ok = False
            continue
        if not weights.is_file():
            missing.append(f"{role} ({weights.name})")
            continue
        try:
            config = _config_from_entry(cfg_path, role, entry, family)
            own = registry.build_config(family, config, device="meta").state_dict()
            header = read_header(weights)
            mismatch = _mismatch({k: tuple(v.shape) for k, v in own.items()}, {k: tuple(s) for k, (s, _) in header.items()})
        except AlayaError as err:
            report.lines.append(f"  {role}: {err}")
            ok = False
            continue
        name = entry.get("config_name") if isinstance(entry, dict) else None
        label = COMPONENT.get(family, family)
        if family == "dit":
            label = "Flash-student DiT" if kind == "flash" else published.dit_kind(config)
        if mismatch:
            report.lines.append(f"  {role}: {weights.name} does not fit its config.json entry: {mismatch}")
            ok = False
            continue
        report.lines.append(f"  {role}: {label} ({name or 'unnamed config'}); {weights.name}, dtype {published.header_dtype(header)}")
    if text.startswith(published.UMT5_NAME + ":") and not Path(text.split(":", 1)[1]).exists():
        missing.append(f"text encoder ({text.split(':', 1)[1]} does not exist)")
    report.lines.append(f"  missing: {', '.join(missing)}" if missing else ("  nothing missing to render" if ok else "  see above"))
    if ok:
        report.found.append(Found("model-folder", f"our {kind} model folder", folder))


def identify_path(path: str | os.PathLike) -> Report:
    """Identify a weight file, an index, a shard, or a folder (see module docstring)."""
    path = Path(path)
    report = Report(str(path))
    if not path.exists():
        raise AlayaError(f"{path}: no such file or folder")
    if path.is_dir():
        if _describe_release(path, report):
            return report
        if _model_folder_kind(path):
            _describe_model_folder(path, report)
            return report
        broken = _unreadable_config(path)
        report.lines += [broken] if broken else []
        _scan(path, report, str(path), depth=1)
        if not report.lines:
            report.lines.append(f"{path}: no weight files here (.safetensors, .safetensors.index.json)")
        _missing(report, path, config_unreadable=broken is not None)
        return report
    if path.name.endswith(".index.json") or path.suffix == ".safetensors":
        _describe_unit(path, report)
        return report
    if pickled.is_pickle(path):
        _describe_pickle(path, report)
        return report
    refuse_non_safetensors(path)
    return report
