"""Training and distillation recipes: physics-world data -> codecs -> teacher DiT -> few-step student -> bundle.

Each stage is `alaya-flash train STAGE --config FILE.json` (streaming/cli/commands/train.py); the
config is the stage's dataclass below, written as JSON (unknown keys are refused). Stages in
order, each reading the previous stages' output folders:

    data         physics-world clips, every lighting preset, train / held-out splits   (data.py)
    vae          codec teacher: small Wan VAE on ground truth and G-buffer images       (codecs.py)
    codecs       distilled slim tiny codec + 5-branch G-buffer encoder                   (codecs.py)
    teacher      bidirectional flow-matching DiT on G-buffer latents + text               (teacher.py)
    student-ode  block-causal few-step student, ODE regression on teacher trajectories   (student.py)
    student-dmd  self-rollout with the rolling KV cache + distribution matching (DMD)     (student.py)
    student-rollout  self-rollout over whole clips, regressed onto the ground truth       (student.py)
    decoder      the tiny decoder adapted to the student's streamed latents               (decoder.py)
    refiner      the G-buffer refiner fitted to an exported model's own frames          (refiner.py)
    text-anchor  the student's and refiner's prompt MLPs refitted so paraphrases land on their preset (text_anchor.py)
    light-head   prompt -> Light: nearest lighting preset and the sun's side, from every preset's wordings (light_head.py)
    export       one safetensors per network + bundle JSON                               (export.py)
    import       an exported model folder back into run folders, to fine-tune it       (import_model.py)

Nothing at inference time imports this package; it imports the networks and streaming's data.
"""
from __future__ import annotations

import importlib

# stage -> (module, config class name, run function name)
STAGES: dict[str, tuple[str, str, str]] = {
    "data": ("data", "DataConfig", "run_data"),
    "vae": ("codecs", "VAEStageConfig", "run_vae"),
    "codecs": ("codecs", "CodecStageConfig", "run_codecs"),
    "teacher": ("teacher", "TeacherStageConfig", "run_teacher"),
    "student-ode": ("student", "ODEStageConfig", "run_ode"),
    "student-dmd": ("student", "DMDStageConfig", "run_dmd"),
    "student-rollout": ("student", "RolloutStageConfig", "run_rollout"),
    "decoder": ("decoder", "DecoderStageConfig", "run_decoder"),
    "refiner": ("refiner", "RefinerStageConfig", "run_refiner"),
    "text-anchor": ("text_anchor", "TextAnchorConfig", "run_text_anchor"),
    "light-head": ("light_head", "LightHeadStageConfig", "run_light_head"),
    "export": ("export", "ExportConfig", "run_export"),
    "import": ("import_model", "ImportConfig", "run_import"),
}


def stage(name: str):
    """(config class, run function) of a stage; run(config, log, progress) -> steps reached."""
    module_name, cls, fn = STAGES[name]
    module = importlib.import_module(f".{module_name}", __package__)
    return getattr(module, cls), getattr(module, fn)
