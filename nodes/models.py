"""Model nodes: Load Flash Model, Load Teacher Model, Encode Prompt.

Loaders look in the project's model_zoo/ and, inside ComfyUI, in its model folders
(diffusion_models for model folders and teacher DiT files, vae for the Wan VAE, vae_approx for
TAEHV-style tiny decoders, text_encoders for MiniLM-style text encoder folders). "random:tiny" and
"random:small" build models with random weights (tests, benchmarks, trying a workflow out).
Each loader also outputs the model's parts as the handles the other nodes take, as ComfyUI's
checkpoint loader does (MODEL, CLIP, VAE).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model_zoo.runtime import BACKENDS
from ..model_zoo.styles import ORIGINAL, STYLES
from . import comfy
from .base import refuse, settings_line

CATEGORY = "alaya-flash/models"
FROM_MODEL = "(from model)"
RANDOM = {"random:tiny": ("dit-tiny", "gbuffer-encoder-slim", "taew-slim"),
          "random:small": ("dit-small", "gbuffer-encoder-slim", "taew-slim")}
RANDOM_TEACHER = {"random:tiny": ("dit-tiny", "wan2.1-vae-small"), "random:small": ("dit-small", "wan2.1-vae-small")}
DEVICES = ["auto", "cpu", "cuda"]
PRECISIONS = ["auto", "bf16", "fp32"]


@dataclass
class EncoderHandle:
    """ALAYA_GBUFFER_ENCODER: the Flash G-buffer encoder, or the teacher's Wan VAE (per window)."""

    kind: str  # "flash" | "teacher"
    module: Any
    window_frames: int = 81
    model: Any = None  # the Flash model it belongs to (the prompt's light for an encoder that reads the light)


@dataclass
class DecoderHandle:
    """ALAYA_DECODER: the tiny streaming decoder or the full Wan VAE."""

    kind: str  # "tiny" | "vae"
    module: Any


@dataclass
class RefinerHandle:
    """ALAYA_REFINER: the model's G-buffer refiner, or None when the model has none (Refine passes frames through);
    model: the Flash model it belongs to (its name, and the prompt's light for a refiner that reads the light)."""

    module: Any
    model: Any = None

    @property
    def name(self) -> str:
        return self.model.describe() if self.model is not None else "this model"


@dataclass
class TextHandle:
    """ALAYA_TEXT_ENCODER: prompt strings -> (B, L, text_dim) for a model."""

    model: Any  # FlashModel | TeacherModel

    @property
    def text_dim(self) -> int:
        return self.model.text_dim

    def __call__(self, prompts: list[str]):
        return self.model.text_encoder()(prompts)


def _flash_choices() -> list[str]:
    from ..model_zoo.folders import is_model_folder

    found = [n for n in comfy.list_entries("diffusion_models", folders=True)
             if is_model_folder(comfy.resolve("diffusion_models", n)) == "flash"]
    return found + list(RANDOM)


def _teacher_choices() -> list[str]:
    from ..model_zoo.folders import is_model_folder

    folders = [n for n in comfy.list_entries("diffusion_models", folders=True)
               if is_model_folder(comfy.resolve("diffusion_models", n)) == "teacher"]
    # published files: a single DiT .safetensors, a shard index, or a diffusers repo's transformer/ folder
    files = [n for n in comfy.list_entries("diffusion_models") + comfy.list_entries("diffusion_models", suffix=".index.json")
             if not (comfy.resolve("diffusion_models", n).parent / "config.json").exists() and not _is_shard(n)
             and not _is_light_head(comfy.resolve("diffusion_models", n))]
    return folders + files + list(RANDOM_TEACHER)


def _is_light_head(path) -> bool:
    """The pack's light head (model_zoo/light/), a safetensors file that is no DiT: not a teacher choice."""
    from ..model_zoo.errors import AlayaError
    from ..model_zoo.light_head import FORMAT
    from ..model_zoo.loading import read_metadata

    try:
        return path.suffix == ".safetensors" and read_metadata(path).get("format") == FORMAT
    except AlayaError:  # an unreadable file is listed, and loading it says what is wrong
        return False


def _is_shard(name: str) -> bool:
    """One shard of an index (diffusion_pytorch_model-00001-of-00003.safetensors): the index is listed instead."""
    import re

    return re.search(r"-\d{5}-of-\d{5}\.safetensors$", name) is not None


def _teacher_folder(path) -> bool:
    from ..model_zoo.folders import is_model_folder

    return path.is_dir() and is_model_folder(path) == "teacher"


def _check_entry(kind: str, name: str, what: str, allowed: tuple = ()) -> str | None:
    if name in allowed or comfy.resolve(kind, name) is not None:
        return None
    return f"{what} {name!r} not found (searched: {comfy.searched(kind)})"


def _text_choices() -> list[str]:
    """MiniLM-style folders (with tokenizer.json) and umT5 files (ComfyUI's umt5_xxl_*.safetensors) in text_encoders."""
    from pathlib import PurePosixPath

    found = comfy.list_entries("text_encoders", folders=False, suffix="tokenizer.json")
    files = comfy.list_entries("text_encoders") + comfy.list_entries("text_encoders", suffix=".pth")  # Wan's .pth: read tensors-only
    return [FROM_MODEL] + sorted({str(PurePosixPath(n).parent) for n in found} - {"."}) + files


def _common_inputs() -> dict:
    return {
        "device": (DEVICES, {"default": "auto", "tooltip": "auto: ComfyUI's device inside ComfyUI, else CUDA when present, else CPU."}),
        "precision": (PRECISIONS, {"default": "auto", "tooltip": "auto: bf16 on CUDA and on CPUs with fast bf16 (AMX), else fp32."}),
        "text_encoder": (_text_choices(), {"default": FROM_MODEL, "tooltip": "A text encoder in text_encoders: umT5-XXL (ComfyUI's umt5_xxl_*.safetensors, for published teachers) or a MiniLM-style folder; (from model): the model's own."}),
    }


def _text_override(model, name: str, device) -> None:
    if name == FROM_MODEL:
        return
    from ..model_zoo.errors import AlayaError
    from ..model_zoo.text_encoder import TextEncoder

    path = comfy.resolve("text_encoders", name)
    if path is None:
        raise AlayaError(f"text encoder {name!r} not found (searched: {comfy.searched('text_encoders')})")
    if path.is_file() or not (path / "tokenizer.json").exists():  # a umT5 file or folder (loaded on first prompt)
        from ..model_zoo.umt5 import text_dim_of

        width = text_dim_of(path)
        if width != model.text_dim:
            raise AlayaError(f"text encoder {name!r} gives {width}-wide embeddings, the model takes {model.text_dim}")
        model.text_encoder_name, model._text = f"umt5-xxl:{path.resolve()}", None
        return
    from ..model_zoo.text_encoder import context_tokens

    # a MiniLM-style folder feeds the model the context it was trained on (with word tokens or not)
    enc = TextEncoder.load(path, device=device, tokens=context_tokens(model.text_encoder_name))
    if enc.text_dim != model.text_dim:
        raise AlayaError(f"text encoder {name!r} gives {enc.text_dim}-wide embeddings, the model takes {model.text_dim}")
    model._text = enc


class LoadFlashModel:
    DESCRIPTION = ("Load a Flash model folder (config.json + dit / gbuffer_encoder / decoder safetensors, and the "
                   "G-buffer refiner when it has one) from the project's model_zoo or ComfyUI's diffusion_models; "
                   "optionally a TAEHV decoder from vae_approx.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("ALAYA_FLASH", "ALAYA_GBUFFER_ENCODER", "ALAYA_DECODER", "ALAYA_TEXT_ENCODER", "ALAYA_REFINER")
    RETURN_NAMES = ("model", "gbuffer_encoder", "decoder", "text_encoder", "refiner")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": (_flash_choices(), {"tooltip": "A Flash model folder, or random:tiny / random:small (random weights, for trying things out)."}),
            "decoder": ([FROM_MODEL] + comfy.list_entries("vae_approx"), {"default": FROM_MODEL, "tooltip": "A TAEHV-style tiny decoder (e.g. taew2_1.safetensors) from vae_approx, or the model's own."}),
            **_common_inputs(),
        }, "optional": {
            "backend": (list(BACKENDS), {"default": "auto", "tooltip": "Runtime of the networks: openvino (compiled for "
                        "the CPU, cached on disk; needs the openvino package), torch, or auto (the command's --backend, "
                        "else openvino where installed and on the CPU, else torch)."}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, model):
        # ComfyUI repeats a returned message on every input named here: one input, one message. The
        # decoder and text encoder (lists ComfyUI checks itself) are checked first thing in load().
        return _check_entry("diffusion_models", model, "Flash model", tuple(RANDOM)) or True

    @staticmethod
    def check_values(decoder=FROM_MODEL, text_encoder=FROM_MODEL) -> list[str | None]:
        """Checked first thing in load() and by the runner's validation (not ComfyUI's: see VALIDATE_INPUTS)."""
        return [_check_entry("vae_approx", decoder, "decoder", (FROM_MODEL,)),
                _check_entry("text_encoders", text_encoder, "text encoder", (FROM_MODEL,))]

    def load(self, model, decoder, device, precision, text_encoder, backend="auto"):
        # reading a model's files has no loop to check for cancel in: a worker thread reads them
        return comfy.interruptible(self._load, model, decoder, device, precision, text_encoder, backend)

    def _load(self, model, decoder, device, precision, text_encoder, backend="auto"):
        from ..model_zoo import bundle, folders, runtime

        refuse("Load Flash Model", self.check_values(decoder, text_encoder))
        dev = comfy.torch_device(device)
        dtype = comfy.torch_dtype(precision, dev)
        if model in RANDOM:
            flash = bundle.make_random_flash(*RANDOM[model], device=dev, dtype=dtype, refiner="gbuffer-refiner-16-prompt")
        else:
            path = comfy.resolve("diffusion_models", model)
            if path is None:
                from ..model_zoo.errors import AlayaError

                raise AlayaError(f"Flash model {model!r} not found (searched: {comfy.searched('diffusion_models')})")
            flash = folders.load_flash(path, dev, dtype)
        if decoder != FROM_MODEL:
            # the refiner learned this model's decoder's errors: another decoder's frames pass through unrefined
            flash.decoder = load_tiny_decoder(comfy.resolve("vae_approx", decoder), dev, dtype)
            flash.refiner = None
        _text_override(flash, text_encoder, dev)
        flash = runtime.accelerate(flash, backend)
        return (flash, EncoderHandle("flash", flash.gbuffer_encoder, model=flash), DecoderHandle("tiny", flash.decoder), TextHandle(flash),
                RefinerHandle(flash.refiner, flash))


def load_tiny_decoder(path, device, dtype):
    """A TAEHV-style checkpoint (e.g. taew2_1.safetensors): the config whose shapes match, loaded strictly."""
    from ..model_zoo.codecs import tiny
    from ..model_zoo.errors import CheckpointError
    from ..model_zoo.loading import load_strict, read_shapes

    shapes = read_shapes(path)
    for cfg in tiny.CONFIGS.values():
        codec = tiny.build(cfg)
        if {k: tuple(v.shape) for k, v in codec.state_dict().items()} == shapes:
            return load_strict(codec.to(dtype), path).to(device).eval().requires_grad_(False)
    codec = tiny.build(tiny.CONFIGS["taew2_1"])
    load_strict(codec, path)  # raises, naming the offending keys
    raise CheckpointError(f"{path}: not a tiny decoder checkpoint")  # pragma: no cover


class LoadTeacherModel:
    DESCRIPTION = ("Load the teacher (bidirectional DiT + full Wan VAE): a teacher model folder, or the published "
                   "AlayaRenderer/Wan files as users download them (a DiT .safetensors or shard index in "
                   "diffusion_models, Wan-native, diffusers-named, ComfyUI-prefixed or fp8-scaled; a diffusers or Wan "
                   "repo folder) with a Wan2.1 VAE from vae (or found next to the DiT) and umT5-XXL from text_encoders.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("ALAYA_TEACHER", "ALAYA_GBUFFER_ENCODER", "ALAYA_DECODER", "ALAYA_TEXT_ENCODER")
    RETURN_NAMES = ("model", "gbuffer_encoder", "decoder", "text_encoder")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": (_teacher_choices(), {"tooltip": "A teacher model folder, a published teacher DiT (file, shard index or repo folder), or random:tiny / random:small."}),
            "vae": ([FROM_MODEL] + comfy.list_entries("vae") + comfy.list_entries("vae", suffix=".pth"), {"default": FROM_MODEL, "tooltip": "A Wan2.1 VAE from the vae folder (.safetensors, or Wan's Wan2.1_VAE.pth, read tensors-only); (from model): the model folder's, or one found next to the DiT (a repo's vae/, ComfyUI's vae/wan_2.1_vae.safetensors, a Wan-AI folder's Wan2.1_VAE.pth)."}),
            "window_frames": ("INT", {"default": -1, "min": -1, "max": 1001, "step": 4, "tooltip": "Pixel frames per bidirectional window (4k+1; Wan: 81). -1: the model's trained value."}),
            **_common_inputs(),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, model):
        # One input, one message (ComfyUI repeats a message on every input named here); the rest is
        # checked first thing in load(), before anything is read.
        return _check_entry("diffusion_models", model, "teacher model", tuple(RANDOM_TEACHER)) or True

    @staticmethod
    def check_values(model, vae=FROM_MODEL, text_encoder=FROM_MODEL, window_frames=-1) -> list[str | None]:
        """Checked first thing in load() and by the runner's validation (not ComfyUI's: see VALIDATE_INPUTS)."""
        problems = [_check_entry("vae", vae, "VAE", (FROM_MODEL,)),
                    _check_entry("text_encoders", text_encoder, "text encoder", (FROM_MODEL,))]
        if window_frames != -1 and (not isinstance(window_frames, int) or window_frames < 1 or (window_frames - 1) % 4):
            problems.append(f"window_frames must be 4k+1 (e.g. 81) or -1 (the model's), got {window_frames}")
        path = comfy.resolve("diffusion_models", model) if model not in RANDOM_TEACHER else None
        if path is not None and vae == FROM_MODEL and not _teacher_folder(path):
            from ..model_zoo.published import find_vae

            if find_vae(path) is None:
                problems.append(f"teacher DiT {model!r} needs a VAE: none lies next to it; pick one from the vae folder")
        return problems

    def load(self, model, vae, window_frames, device, precision, text_encoder):
        return comfy.interruptible(self._load, model, vae, window_frames, device, precision, text_encoder)

    def _load(self, model, vae, window_frames, device, precision, text_encoder):
        import dataclasses

        from ..model_zoo import bundle
        from ..model_zoo.errors import AlayaError

        refuse("Load Teacher Model", self.check_values(model, vae, text_encoder, window_frames))
        dev = comfy.torch_device(device)
        dtype = comfy.torch_dtype(precision, dev)
        if model in RANDOM_TEACHER:
            teacher = bundle.make_random_teacher(*RANDOM_TEACHER[model], device=dev, dtype=dtype)
        else:
            path = comfy.resolve("diffusion_models", model)
            if path is None:
                raise AlayaError(f"teacher model {model!r} not found (searched: {comfy.searched('diffusion_models')})")
            from ..model_zoo.published import load_teacher_files

            # our teacher folders, published DiT files / shard indexes / diffusers and Wan repos
            vae_path = comfy.resolve("vae", vae) if vae != FROM_MODEL else None
            teacher = load_teacher_files(path, vae_path, device=dev, dtype=dtype)
        if window_frames != -1:
            teacher.settings = dataclasses.replace(teacher.settings, window_frames=window_frames)
        widget, window_frames = window_frames, teacher.settings.window_frames
        _text_override(teacher, text_encoder, dev)
        return {"ui": {"text": [settings_line({"window": window_frames}, {"window": widget})]},
                "result": (teacher, EncoderHandle("teacher", teacher.vae, window_frames), DecoderHandle("vae", teacher.vae),
                           TextHandle(teacher))}


class EncodePrompt:
    DESCRIPTION = ("Encode a prompt, or a schedule keyed by pixel frame ('0: a sunny street' / '48: a rainy night', "
                   "one entry per line), optionally restyled with one of AlayaRenderer's named styles. A ComfyUI "
                   "CONDITIONING input is used instead when its width fits the model.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("ALAYA_PROMPT",)
    RETURN_NAMES = ("prompt",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text_encoder": ("ALAYA_TEXT_ENCODER", {"tooltip": "From Load Flash Model or Load Teacher Model."}),
                "text": ("STRING", {"default": "a sunny street, photorealistic", "multiline": True, "tooltip": "One prompt, or lines 'FRAME: prompt' (the first at frame 0); each applies from that pixel frame on."}),
            },
            "optional": {
                "conditioning": ("CONDITIONING", {"tooltip": "ComfyUI conditioning whose width equals the model's text width (used instead of text)."}),
                "style": (list(STYLES), {"default": ORIGINAL, "tooltip": "AlayaRenderer's styles (its styles.json): keep the prompt's content (before '; the scene is ...') and replace its lighting part with the style's; original: the prompt as written."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, text):
        from ..model_zoo.errors import AlayaError
        from ..streaming.values import parse_schedule

        try:
            parse_schedule(text)
        except AlayaError as err:
            return str(err)
        return True

    def encode(self, text_encoder, text, conditioning=None, style=ORIGINAL):
        from ..model_zoo.errors import AlayaError
        from ..streaming.values import PromptSchedule

        if conditioning is not None:
            emb = conditioning[0][0]
            if emb.ndim != 3 or emb.shape[-1] != text_encoder.text_dim:
                raise AlayaError(f"Encode Prompt: CONDITIONING is {tuple(emb.shape)} wide, the model's text input is "
                                 f"{text_encoder.text_dim}; use the text widget instead")
            return (PromptSchedule.constant(emb[:1].float(), "(conditioning)"),)
        # loading the text encoder (importing transformers first) takes seconds with no loop to check
        # in: it runs on the pack's worker thread while this one checks for cancel
        return (comfy.interruptible(PromptSchedule.encode, text_encoder, text, style),)


NODES = {
    "AlayaFlash_LoadFlashModel": (LoadFlashModel, "Load Flash Model (Alaya Flash)"),
    "AlayaFlash_LoadTeacherModel": (LoadTeacherModel, "Load Teacher Model (Alaya Flash)"),
    "AlayaFlash_EncodePrompt": (EncodePrompt, "Encode Prompt (Alaya Flash)"),
}
