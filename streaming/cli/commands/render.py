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
Face folder, or Wan's .pth); --wan-dir names Wan-AI's Wan2.1-T2V-1.3B/ folder as downloaded, whose
Wan2.1_VAE.pth and models_t5_umt5-xxl-enc-bf16.pth (read tensors-only) stand in for both, as
AlayaRenderer's own inference loads them. Without --model the embedded default
Flash model renders. Sampler settings default to the model's own (config.json, or Wan's for a
published teacher: 50 steps, CFG 5, shift 5, windows of 81 frames, Wan's negative prompt).
The prompt may be a schedule keyed by pixel frame ('FRAME: prompt' per line). --light renders under a
given light (one light, or 'FRAME: light' keyframes the sun moves through) instead of the prompt's: a
Light node carrying it feeds the workflow's Refine node; a model whose refiner does not read the light
refuses it.

  alaya-flash render samples/courtyard --prompt "a sunny street" --light "bright_sunny,az=90,el=20" --out out/left.mp4
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import args as args_
from ....model_zoo.styles import ORIGINAL, STYLES
from ..args import out_path, parse_size

HELP = "render G-buffers + a prompt to video with a Flash model or a teacher (the render workflows)"
WORKFLOWS = Path(__file__).resolve().parents[3] / "workflows" / "api"
WORKFLOW = WORKFLOWS / "render-gbuffer-sequence.json"
TEACHER_WORKFLOW = WORKFLOWS / "render-teacher.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gbuffers", type=Path, help="G-buffer folder or .npy file (any layout Load G-Buffers reads)")
    parser.add_argument("--prompt", required=True, help="prompt, or lines 'FRAME: prompt' (a schedule)")
    parser.add_argument("--style", choices=list(STYLES), default=ORIGINAL, metavar="NAME",
                        help="AlayaRenderer's named styles (its styles.json), as its inference script applies them: the "
                             "prompt's content (before '; the scene is ...') is kept and its lighting part replaced; "
                             f"one of {', '.join(STYLES)} ({ORIGINAL}: the prompt as written)")
    parser.add_argument("--out", type=out_path, required=True, help="output file (mp4) or folder (png, exr, npy)")
    parser.add_argument("--format", choices=("mp4", "png", "exr", "npy"), default="mp4", help="output format")
    parser.add_argument("--model", type=args_.model_path, help=args_.SHIPPED_MODEL_HELP + ", a Flash release folder (transformer/, "
                        "transformer_partial.safetensors, ...), or a teacher folder or published teacher "
                        "file/folder (default: the embedded default Flash model)")
    parser.add_argument("--vae", type=Path, help="teacher: the Wan2.1 VAE file (default: the model's, or one next to it)")
    parser.add_argument("--text-encoder", type=Path, help="umT5-XXL file or folder for a teacher or a Flash release "
                        "(default: the model's, or one next to it)")
    parser.add_argument("--wan-dir", type=Path, metavar="DIR",
                        help="a Wan-AI folder as downloaded (Wan2.1-T2V-1.3B/): its Wan2.1_VAE.pth and "
                             "models_t5_umt5-xxl-enc-bf16.pth (tokenizer from its google/umt5-xxl/), read tensors-only, "
                             "stand in for --vae (a teacher) and --text-encoder where those are not given")
    parser.add_argument("--negative-prompt", help="teacher: the CFG negative prompt (default: the model's)")
    parser.add_argument("--cfg", type=args_.bounded(float, 1.0, 30.0), help="teacher: guidance scale (default: the model's)")
    parser.add_argument("--window-frames", type=args_.bounded(int, 1, 1001),
                        help="teacher: pixel frames per bidirectional window, 4k+1 (default: the model's)")
    args_.add_light_argument(parser, "; for a Flash model whose refiner reads the light (others refuse it)")
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
    from ...render.workflow import feed_light
    from .run import execute, load

    if args.format == "mp4" and args.out.is_dir():  # it wrote OUT.mp4 beside the folder, and said nothing
        raise AlayaError(f"{args.out}: is a folder, and an mp4 is a file: name the file (e.g. {args.out / 'render.mp4'}), "
                         "or pass --format png, exr or npy to write frames into a folder")
    if args.out.exists() and not args.overwrite:
        raise AlayaError(f"{args.out}: already exists; pass --overwrite to replace it")
    teacher = _is_teacher(args.model)
    if args.wan_dir is not None:
        _from_wan_dir(args, teacher)
    teacher_flags = [f for f in ("vae", "negative_prompt", "cfg", "window_frames") if getattr(args, f) is not None]
    if teacher_flags and not teacher:
        raise AlayaError(f"--{teacher_flags[0].replace('_', '-')} applies to a teacher; --model names a Flash model")
    if teacher and args.light is not None:
        raise AlayaError("--light: a teacher does not read a light (a Flash model whose refiner reads the light does)")
    h, w = args.size or (0, 0)
    # the workflow's nodes by role (their class: each render workflow has one of each), never by number
    g, prompt, save = "AlayaFlash_LoadGBuffers", "AlayaFlash_EncodePrompt", "Save"
    model_node = "AlayaFlash_LoadTeacherModel" if teacher else "AlayaFlash_LoadFlashModel"
    sampler = "AlayaFlash_TeacherSampler" if teacher else "AlayaFlash_FlashSampler"
    sets = [f"{g}.path={args.gbuffers.resolve()}", f"{g}.frames={args.frames}", f"{g}.width={w}", f"{g}.height={h}",
            f"{g}.conventions={args.conventions}", f"{g}.depth_range={args.depth_range}",
            f"{prompt}.text={args.prompt}", f"{prompt}.style={args.style}",
            f"{sampler}.seed={args.seed}", f"{sampler}.steps={args.steps or -1}",
            f"{save}.filename={args.out.resolve()}", f"{save}.format={args.format}", f"{save}.fps={args.fps}",
            f"{save}.overwrite={args.overwrite}"]
    sets += [f"{model_node}.text_encoder={args.text_encoder.resolve()}"] if args.text_encoder else []
    if teacher:
        sets += [f"{model_node}.model={args.model.resolve()}", f"{model_node}.window_frames={args.window_frames or -1}",
                 f"{sampler}.cfg={args.cfg or -1.0}"]
        sets += [f"{model_node}.vae={args.vae.resolve()}"] if args.vae else []
        sets += [f"{sampler}.negative_prompt={args.negative_prompt}"] if args.negative_prompt is not None else []
        wf, classes = load(TEACHER_WORKFLOW, sets)
    else:
        model, warning = model_choice(args.model)
        if warning:
            print(f"alaya-flash: warning: {warning}", file=sys.stderr)
        wf, classes = load(WORKFLOW, sets + [f"{model_node}.model={model}"])
        if args.light is not None:
            feed_light(wf, args.light, classes)  # a Light node into the workflow's Refine: the graph carries it
    from ..shots import outputs

    (written,) = outputs(wf)  # what Save writes: an mp4 gets its .mp4 suffix
    if written.exists() and not args.overwrite:
        raise AlayaError(f"{written}: already exists; pass --overwrite to replace it")
    stats = execute(wf, classes, args.quiet, label="render", light=args.light is not None)
    if not args.quiet:
        print(f"wrote {stats.frames} frames to {written} ({stats.fps:.2f} FPS overall)", file=sys.stderr)
    return 0


def _from_wan_dir(args, teacher: bool) -> None:
    """--vae (a teacher's) and --text-encoder from a Wan-AI folder, where not given."""
    from ....model_zoo.errors import AlayaError
    from ....model_zoo.published import WAN_T5_FILE, WAN_VAE_FILE

    folder = args.wan_dir
    if not folder.is_dir():
        raise AlayaError(f"--wan-dir {folder}: no such folder (Wan-AI's Wan2.1-T2V-1.3B/ as downloaded)")
    wanted = ([("vae", WAN_VAE_FILE)] if teacher else []) + [("text_encoder", WAN_T5_FILE)]
    for flag, name in wanted:
        if getattr(args, flag) is None:
            if not (folder / name).is_file():
                raise AlayaError(f"--wan-dir {folder}: no {name} here (a Wan-AI Wan2.1 folder holds it); "
                                 f"pass --{flag.replace('_', '-')} instead")
            setattr(args, flag, folder / name)


def _is_teacher(model: Path | None) -> bool:
    """--model names a teacher unless it is a Flash model folder (or absent: the default Flash model)."""
    from ....model_zoo.folders import is_model_folder
    from ....model_zoo.errors import AlayaError

    if model is None:
        return False
    if not model.exists():
        raise AlayaError(f"{model}: no such model file or folder")
    kind = is_model_folder(model) if model.is_dir() else None
    config = model / "config.json"
    if model.is_dir() and kind is None and config.is_file():  # neither ours nor a diffusers folder can hold bad JSON:
        from ....model_zoo import jsonfile                  # say so, not that a "teacher DiT" needs a VAE

        try:
            jsonfile.loads(config.read_text(encoding="utf-8", errors="replace"))
        except ValueError as err:
            raise AlayaError(f"{config}: malformed JSON ({err})") from None
    return kind != "flash"
