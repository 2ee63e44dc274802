"""Render a G-buffer sequence to video: a Flash model (the standard render workflow, workflows/api/
render-gbuffer-sequence.json) or a teacher (workflows/api/render-teacher.json: 50 steps, CFG, the full Wan VAE).

  alaya-flash render samples/courtyard --prompt "a sunny street" --out out/render.mp4
  alaya-flash render samples/courtyard --prompt "0: dawn
8: dusk" --out frames/ --format png --model model_zoo/default
  alaya-flash render clip/ --prompt "a sunny street" --out out/teacher.mp4 \
      --model AlayaRenderer/model.safetensors --vae wan_2.1_vae.safetensors --text-encoder umt5_xxl_fp16.safetensors

--model is a Flash model folder, a Flash release folder (docs/model.md, "The Flash release"; umT5-XXL
from --text-encoder or found beside it), or a teacher: one of our teacher folders, or the published files as
users download them (a DiT .safetensors or shard index, Wan-native, diffusers-named, ComfyUI-prefixed
or fp8-scaled; a diffusers or Wan repo folder). A published teacher takes the Wan2.1 VAE from --vae
(else the one next to it) and umT5-XXL from --text-encoder (ComfyUI's text_encoders/ file, a Hugging
Face folder, or a .pth converted by `alaya-flash model convert`). Without --model the embedded default
Flash model renders. Sampler settings default to the model's own (config.json, or Wan's for a
published teacher: 50 steps, CFG 5, shift 5, windows of 81 frames, Wan's negative prompt).
The prompt may be a schedule keyed by pixel frame ('FRAME: prompt' per line).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ..args import out_path, parse_size

HELP = "render G-buffers + a prompt to video with a Flash model or a teacher (the render workflows)"
WORKFLOWS = Path(__file__).resolve().parents[3] / "workflows" / "api"
WORKFLOW = WORKFLOWS / "render-gbuffer-sequence.json"
TEACHER_WORKFLOW = WORKFLOWS / "render-teacher.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gbuffers", type=Path, help="G-buffer folder or .npy file (any layout Load G-Buffers reads)")
    parser.add_argument("--prompt", required=True, help="prompt, or lines 'FRAME: prompt' (a schedule)")
    parser.add_argument("--out", type=out_path, required=True, help="output file (mp4) or folder (png, exr, npy)")
    parser.add_argument("--format", choices=("mp4", "png", "exr", "npy"), default="mp4", help="output format")
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + ", a Flash release folder (transformer/, "
                        "transformer_partial.safetensors, ...), or a teacher folder or published teacher "
                        "file/folder (default: the embedded default Flash model)")
    parser.add_argument("--vae", type=Path, help="teacher: the Wan2.1 VAE file (default: the model's, or one next to it)")
    parser.add_argument("--text-encoder", type=Path, help="umT5-XXL file or folder for a teacher or a Flash release "
                        "(default: the model's, or one next to it)")
    parser.add_argument("--negative-prompt", help="teacher: the CFG negative prompt (default: the model's)")
    parser.add_argument("--cfg", type=args_.bounded(float, 1.0, 30.0), help="teacher: guidance scale (default: the model's)")
    parser.add_argument("--window-frames", type=args_.bounded(int, 1, 1001),
                        help="teacher: pixel frames per bidirectional window, 4k+1 (default: the model's)")
    parser.add_argument("--seed", type=args_.SEED, default=0, help="noise seed (same seed, same frames)")
    parser.add_argument("--steps", type=args_.STEPS, help="denoising passes per chunk (default: the model's trained value)")
    parser.add_argument("--size", type=parse_size, metavar="N|WxH", help="resize the input (multiples of 8)")
    parser.add_argument("--frames", type=args_.FRAMES, default=0, help="frames to render (0: all)")
    parser.add_argument("--fps", type=args_.FPS, default=16.0, help="output frame rate (mp4)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.add_argument("--conventions", choices=("auto", "alaya", "blender", "unreal", "unity"), default="auto",
                        help="which engine wrote float EXR passes; auto detects it from pass names (docs/gbuffers.md, Engines)")
    parser.add_argument("--depth-range", default="0.5", metavar="NEAR[:FAR]|auto",
                        help="depth shown brightest in the 8-bit depth (scene units), or auto from the data; "
                             ":FAR makes anything farther background")
    args_.add_cpu_arguments(parser)


def model_choice(model: Path | None) -> tuple[str, str | None]:
    """(value for Load Flash Model's 'model', a warning or None)."""
    from ....model_zoo.bundle import has_default_flash

    if model is not None:
        return str(model.resolve()), None
    if has_default_flash():
        return "default", None
    return "random:tiny", "no default Flash model ships yet: rendering with a tiny model with RANDOM weights (pass --model DIR)"


def run(args) -> int:
    from ....model_zoo.errors import AlayaError
    from .run import execute, load

    if args.out.exists() and not args.overwrite:
        raise AlayaError(f"{args.out}: already exists; pass --overwrite to replace it")
    teacher = _is_teacher(args.model)
    teacher_flags = [f for f in ("vae", "negative_prompt", "cfg", "window_frames") if getattr(args, f) is not None]
    if teacher_flags and not teacher:
        raise AlayaError(f"--{teacher_flags[0].replace('_', '-')} applies to a teacher; --model names a Flash model")
    h, w = args.size or (0, 0)
    sets = [f"1.path={args.gbuffers.resolve()}", f"1.frames={args.frames}", f"1.width={w}", f"1.height={h}",
            f"3.text={args.prompt}", f"5.seed={args.seed}", f"5.steps={args.steps or -1}",
            f"Save.filename={args.out.resolve()}", f"Save.format={args.format}", f"Save.fps={args.fps}",
            f"Save.overwrite={args.overwrite}", f"1.conventions={args.conventions}",
            f"1.depth_range={args.depth_range}"]
    if teacher:
        sets += [f"2.model={args.model.resolve()}", f"2.window_frames={args.window_frames or -1}", f"5.cfg={args.cfg or -1.0}"]
        sets += [f"2.vae={args.vae.resolve()}"] if args.vae else []
        sets += [f"2.text_encoder={args.text_encoder.resolve()}"] if args.text_encoder else []
        sets += [f"5.negative_prompt={args.negative_prompt}"] if args.negative_prompt is not None else []
        wf, classes = load(TEACHER_WORKFLOW, sets)
    else:
        model, warning = model_choice(args.model)
        if warning:
            print(f"alaya-flash: warning: {warning}", file=sys.stderr)
        sets += [f"2.text_encoder={args.text_encoder.resolve()}"] if args.text_encoder else []
        wf, classes = load(WORKFLOW, sets + [f"2.model={model}"])
    from ..shots import outputs

    (written,) = outputs(wf)  # what Save writes: an mp4 gets its .mp4 suffix
    if written.exists() and not args.overwrite:
        raise AlayaError(f"{written}: already exists; pass --overwrite to replace it")
    stats = execute(wf, classes, args.quiet, label="render")
    if not args.quiet:
        print(f"wrote {stats.frames} frames to {written} ({stats.fps:.2f} FPS overall)", file=sys.stderr)
    return 0


def _is_teacher(model: Path | None) -> bool:
    """--model names a teacher unless it is a Flash model folder (or absent: the default Flash model)."""
    from ....model_zoo.bundle import is_model_folder
    from ....model_zoo.errors import AlayaError

    if model is None:
        return False
    if not model.exists():
        raise AlayaError(f"{model}: no such model file or folder")
    return not (model.is_dir() and is_model_folder(model) == "flash")
