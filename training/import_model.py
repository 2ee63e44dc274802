"""Stage `import`: an exported model folder back into run folders, so later stages can continue it.

Rebuilding the default from nothing takes about five hours here; fine-tuning it (another
student-rollout or decoder run, new wordings, your own data) needs only the run folders those
stages read. `train import --set model=model_zoo/default --set out=runs/imported` writes

    OUT/vae/       the teacher's VAE (its latent statistics are already folded in: identity stats)
    OUT/codecs/    the tiny codec and the G-buffer encoder
    OUT/teacher/   the teacher DiT (only when the model folder has teacher/)
    OUT/student/   the Flash DiT, with the chunk size it streams with
    OUT/refiner/   the G-buffer refiner (only when the model has one)

each as one checkpoint in the stages' format, networks only (no optimizer state: they are inputs to
later stages, not runs to resume). `train export` of these folders gives the same weights back.
Run again on an `out` imported from the same model (the same sha256 of its files), it does nothing,
so recipe scripts can rerun it; an `out` holding anything else is refused.
The weights are the model's (bfloat16 in the default), held in float32.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..model_zoo.errors import AlayaError

IMPORTED_STEP = 0  # the step recorded in imported checkpoints (caches made from them record it)


@dataclass(frozen=True)
class ImportConfig:
    model: str = "model_zoo/default"  # a Flash model folder (with teacher/ beside it, as export writes)
    out: str = "runs/imported"
    seed: int = 0

    def validate(self):
        if not (Path(self.model) / "config.json").is_file():
            raise AlayaError(f"import: {self.model} is not a model folder (no config.json)")


def run_import(cfg: ImportConfig, log, progress=None) -> int:
    import json

    from ..model_zoo import bundle, folders
    from ..model_zoo.codecs import gbuffer_encoder, tiny
    from ..model_zoo.loading import save_safetensors
    from .codecs import LATENT_STATS
    from .common import save_checkpoint

    model, out = Path(cfg.model), Path(cfg.out)
    fingerprint = model_fingerprint(model)
    if _imported_sha256(out) == fingerprint:  # a recipe run again: the same weights are already there
        log.info("%s already holds %s (sha256 %s...): nothing to import", out, model, fingerprint[:12])
        return 0
    raw = json.loads((model / "config.json").read_text())
    names = {role: raw["networks"][role].get("config_name") for role in ("decoder", "gbuffer_encoder")}
    if names["decoder"] not in tiny.CONFIGS or names["gbuffer_encoder"] not in gbuffer_encoder.CONFIGS:
        raise AlayaError(f"{model / 'config.json'}: the codecs' config_name must be a named config "
                         f"(decoder {names['decoder']!r}, gbuffer_encoder {names['gbuffer_encoder']!r}); "
                         "the codecs stage trains named configs only")
    flash = folders.load_flash(model, dtype=torch.float32)
    written = []

    def write(run: str, nets: dict, extra: dict) -> Path:
        existing = sorted((out / run).glob("ckpt-*.safetensors"))
        if existing:
            raise AlayaError(f"{existing[0]}: already there, from another model or an older import; import into "
                             "an empty folder (out)")
        path = save_checkpoint(out / run / f"ckpt-{IMPORTED_STEP:06d}.safetensors", IMPORTED_STEP, nets, {}, cfg,
                               {**extra, "imported_from": str(model), "imported_sha256": fingerprint})
        written.append(path)
        log.info("wrote %s", path)
        return path

    dit_extra = {"dit_config": asdict(flash.dit.config), "chunk_frames": flash.settings.chunk_frames,
                 "text_encoder": flash.text_encoder_name}
    write("student", {"dit": flash.dit}, dit_extra)
    write("codecs", {"tiny": flash.decoder, "gbuffer_encoder": flash.gbuffer_encoder},
          {"tiny": names["decoder"], "gbuffer_encoder": names["gbuffer_encoder"]})
    if flash.refiner is not None:
        write("refiner", {"refiner": flash.refiner}, {"refiner": raw["networks"]["refiner"].get("config_name")})
    if (model / "teacher" / "config.json").is_file():
        teacher = bundle.load_teacher(model / "teacher", dtype=torch.float32)
        write("teacher", {"dit": teacher.dit}, {"dit_config": asdict(teacher.dit.config)})
        write("vae", {"vae": teacher.vae}, {"vae_config": asdict(teacher.vae.config)})
        z = teacher.vae.config.z_dim  # the exported VAE has its statistics folded in: identity ones
        save_safetensors({"mean": torch.zeros(z), "std": torch.ones(z)}, out / "vae" / LATENT_STATS,
                         {"samples": 0, "step": IMPORTED_STEP})
    else:
        log.info("%s has no teacher/: no vae or teacher folder written", model)
    return len(written)


def model_fingerprint(model: Path) -> str:
    """sha256 over a model folder's config and weights (teacher/ included), by relative name."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(p for p in model.rglob("*") if p.suffix in (".json", ".safetensors") and p.is_file()):
        h.update(str(path.relative_to(model)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _imported_sha256(out: Path) -> str | None:
    """The fingerprint every checkpoint in `out` was imported from, when they all agree; else None."""
    import json

    from ..model_zoo.loading import read_metadata

    found = {json.loads(read_metadata(p).get("extra", "{}")).get("imported_sha256")
             for p in out.glob("*/ckpt-*.safetensors")}
    return found.pop() if len(found) == 1 else None
