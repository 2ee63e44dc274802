"""Stage d: export trained networks as model folders (model_zoo/bundle.py's format).

    OUT/                 a Flash model: dit.safetensors (the student), gbuffer_encoder.safetensors,
                         decoder.safetensors (the slim tiny codec), config.json, and
                         refiner.safetensors when refiner_run names a `train refiner` run
    OUT/teacher/         the teacher: dit.safetensors (bidirectional DiT), vae.safetensors, config.json

Weights are stored in `dtype` (bfloat16 by default: half the bytes; the loaders cast on load).
The sampler settings written are the ones the student was trained for (chunk_frames).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..model_zoo.errors import AlayaError


@dataclass(frozen=True)
class ExportConfig:
    out: str = "model_zoo/default"
    student_run: str = "runs/student-dmd"  # the DiT to ship (a student-dmd or student-ode folder)
    teacher_run: str = "runs/teacher"
    codecs_run: str = "runs/codecs"
    vae_run: str = "runs/vae"
    refiner_run: str = ""  # a `train refiner` run to ship as the G-buffer refiner ("": none)
    # a second student run of the same DiT whose weights are averaged in: the shipped DiT is
    # (1 - blend_weight) * student_run's + blend_weight * blend_run's ("": student_run's alone)
    blend_run: str = ""
    blend_weight: float = 0.5
    dtype: str = "bfloat16"
    window_frames: int = 1  # rolling KV window (latent frames) of the shipped sampler: the chunk alone (docs/model-card.md, "Long streams")
    sink_frames: int = 1
    teacher_window_frames: int = 13  # pixel frames per teacher window
    teacher_cfg: float = 5.0  # the teacher's default guidance scale (the recipe: its ODE trajectories' scale)
    trained_size: tuple = (128, 128)
    max_megabytes: float = 50.0
    notes: str = ""
    seed: int = 0

    def validate(self):
        if self.dtype not in ("bfloat16", "float32", "float16"):
            raise AlayaError(f"export: dtype {self.dtype!r} is not bfloat16, float32 or float16")
        if self.blend_run and not 0 < self.blend_weight < 1:
            raise AlayaError(f"export: blend_weight {self.blend_weight} is not in (0, 1)")


@torch.no_grad()
def blend_students(student, student_run: str, blend_run: str, weight: float) -> None:
    """Average blend_run's DiT weights into `student` (loaded from student_run), in place, in float32:
    (1 - weight) * student + weight * blend. Both must be the same DiT reading the same text encoder."""
    from .common import run_chunk_frames, run_text_encoder
    from .teacher import load_dit

    other = load_dit(blend_run)
    if other.config != student.config:
        mine, theirs = asdict(student.config), asdict(other.config)
        differ = ", ".join(f"{k} {theirs[k]} against {mine[k]}" for k in mine if mine[k] != theirs[k])
        raise AlayaError(f"export: blend_run {blend_run}'s DiT is not student_run {student_run}'s: {differ}")
    theirs_chunk, mine_chunk = run_chunk_frames(blend_run), run_chunk_frames(student_run)
    if theirs_chunk != mine_chunk:  # the shipped sampler streams one chunk size: the one both learnt
        raise AlayaError(f"export: blend_run {blend_run} was trained with chunk_frames {theirs_chunk}, "
                         f"student_run {student_run} with {mine_chunk}")
    theirs_text, mine_text = run_text_encoder(blend_run), run_text_encoder(student_run)
    if theirs_text != mine_text:
        raise AlayaError(f"export: blend_run {blend_run} reads the text encoder {theirs_text!r}, "
                         f"student_run {student_run} {mine_text!r}")
    theirs = other.state_dict()
    for name, tensor in student.state_dict().items():
        if tensor.is_floating_point():
            tensor.copy_(torch.lerp(tensor.float(), theirs[name].float(), weight))


def run_export(cfg: ExportConfig, log, progress=None) -> int:
    from ..model_zoo import bundle
    from ..model_zoo.codecs import gbuffer_encoder, tiny
    from ..model_zoo.loading import load_strict, read_metadata
    from .codecs import load_vae
    from .common import final_weights, latest_checkpoint, run_chunk_frames, run_text_encoder
    from .light_reading import LIT_CONFIG, run_encoder
    from .teacher import load_dit

    dtype = getattr(torch, cfg.dtype)
    ckpt = latest_checkpoint(Path(cfg.codecs_run))
    if ckpt is None:
        raise AlayaError(f"{cfg.codecs_run}: no checkpoint here; run `alaya-flash train codecs` first")
    names = json.loads(read_metadata(ckpt)["extra"])
    codec = tiny.build(tiny.CONFIGS[names["tiny"]])
    load_strict(codec, final_weights(Path(cfg.codecs_run), "tiny"))
    genc = gbuffer_encoder.build(gbuffer_encoder.CONFIGS[names["gbuffer_encoder"]])
    load_strict(genc, final_weights(Path(cfg.codecs_run), "gbuffer_encoder"))
    student = load_dit(cfg.student_run)
    own = run_encoder(cfg.student_run)
    if own is not None:  # a light-reading student ships with the encoder it was trained beside
        genc, names["gbuffer_encoder"] = own, LIT_CONFIG
        log.info("export: the G-buffer encoder is %s's (%s)", cfg.student_run, LIT_CONFIG)
    if cfg.blend_run:
        blend_students(student, cfg.student_run, cfg.blend_run, cfg.blend_weight)
    chunk = run_chunk_frames(cfg.student_run)
    teacher = load_dit(cfg.teacher_run)
    vae = load_vae(cfg.vae_run)
    out = Path(cfg.out)
    size = tuple(cfg.trained_size)
    refiner, refiner_name = None, None
    if cfg.refiner_run:
        from .refiner import load_run

        refiner, refiner_name = load_run(cfg.refiner_run)
        refiner = refiner.to(dtype)
    flash = bundle.FlashModel(
        dit=student.to(dtype), gbuffer_encoder=genc.to(dtype), decoder=codec.to(dtype), refiner=refiner,
        settings=bundle.FlashSettings(chunk_frames=chunk, window_frames=cfg.window_frames, sink_frames=cfg.sink_frames),
        trained_size=size, text_encoder_name=run_text_encoder(cfg.student_run),
    )
    notes = cfg.notes or "alaya-flash default model, trained on this project's physics world (docs/model-card.md)"
    bundle.save_flash(flash, out, config_names={"gbuffer_encoder": names["gbuffer_encoder"], "decoder": names["tiny"],
                                                     "refiner": refiner_name},
                      notes=notes)
    t = bundle.TeacherModel(dit=teacher.to(dtype), vae=vae.to(dtype),
                            settings=bundle.TeacherSettings(window_frames=cfg.teacher_window_frames, cfg=cfg.teacher_cfg), trained_size=size)
    bundle.save_teacher(t, out / "teacher", notes=notes + " (teacher)")
    files = sorted(out.rglob("*.safetensors"))
    total = sum(f.stat().st_size for f in files) / 2**20
    for f in files:
        log.info("%s %.2f MB", f, f.stat().st_size / 2**20)
    log.info("exported %s: %.2f MB in all", out, total)
    if total > cfg.max_megabytes:
        raise AlayaError(f"export: {out} holds {total:.1f} MB of weights, over max_megabytes={cfg.max_megabytes}")
    return len(files)
