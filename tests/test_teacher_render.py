"""`alaya-flash render --model TEACHER` end to end, from files written in each published layout.

A tiny teacher (96 input channels, a umT5-tiny-wide prompt) and a small Wan VAE, with a tiny umT5
encoder and a real sentencepiece model, are written as users download them: Wan-native single
files with flags, ComfyUI's models/ tree (prefixed DiT, found VAE and text encoder), a sharded
index, and a diffusers repo (transformer/ + vae/ + text_encoder/ + tokenizer). Each renders the
bundled sample through the teacher workflow, and every layout gives the same frames; a ComfyUI
CONDITIONING (real tokens only, as ComfyUI's CLIPTextEncode gives) equals our umT5 path's context.
"""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from alaya_flash.model_zoo import convert, loading, registry
from alaya_flash.model_zoo.dit import DiTConfig, WanDiT
from alaya_flash.streaming.cli import main
from test_published import DIFFUSERS_VAE_JSON, SMALL_VAE, write_sharded
from test_umt5 import spiece, state, write_comfy, write_hf  # noqa: F401  (module-scoped fixtures)
from wan_helpers import write_diffsynth_checkpoint, write_wan_ai_folder

ROOT = Path(__file__).resolve().parents[1]
TEACHER = DiTConfig(dim=32, ffn_dim=64, freq_dim=32, text_dim=32, num_heads=2, num_layers=2)  # umt5-tiny is 32 wide
DIT_JSON = {"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], "num_attention_heads": 2,
            "attention_head_dim": 16, "in_channels": 96, "out_channels": 16, "text_dim": 32, "freq_dim": 32,
            "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-06}


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    dit = WanDiT(TEACHER).eval()
    with torch.no_grad():
        for p in dit.parameters():
            p.add_(torch.randn_like(p) * 0.05)
            p.copy_(p.to(torch.bfloat16).float())  # bf16 values: a bf16 file (DiffSynth's) holds them exactly
    torch.manual_seed(1)
    return dit, registry.build_config("wan-vae", SMALL_VAE).eval()


def layouts(root: Path, dit, vae, state, spiece) -> dict[str, list[str]]:  # noqa: F811
    """Write each layout under root; returns the render flags that name it."""
    wan = root / "wan"
    wan.mkdir()
    loading.save_safetensors(dit.state_dict(), wan / "model.safetensors")
    loading.save_safetensors(vae.state_dict(), wan / "Wan2.1_VAE.safetensors")
    write_comfy(wan / "umt5_tiny.safetensors", state, spiece)
    models = root / "ComfyUI" / "models"
    for d in ("diffusion_models", "vae", "text_encoders"):
        (models / d).mkdir(parents=True)
    loading.save_safetensors({f"model.diffusion_model.{k}": v for k, v in dit.state_dict().items()},
                             models / "diffusion_models" / "alayarenderer.safetensors")
    loading.save_safetensors(vae.state_dict(), models / "vae" / "wan_2.1_vae.safetensors")
    write_comfy(models / "text_encoders" / "umt5_xxl_fp16.safetensors", state, spiece)
    shards = root / "sharded"
    shards.mkdir()
    index = write_sharded(dit.state_dict(), shards, n=3)
    repo = root / "AlayaRenderer-Diffusers"
    for d in ("transformer", "vae"):
        (repo / d).mkdir(parents=True)
    (repo / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (repo / "transformer" / "config.json").write_text(json.dumps(DIT_JSON))
    write_sharded(convert.wan_to_diffusers(dit.state_dict()), repo / "transformer", n=2)
    (repo / "vae" / "config.json").write_text(json.dumps(DIFFUSERS_VAE_JSON))
    loading.save_safetensors(convert.vae_wan_to_diffusers(vae.state_dict()), repo / "vae" / "diffusion_pytorch_model.safetensors")
    write_hf(repo / "text_encoder", state, spiece)
    # AlayaRenderer's README layout (DiffSynth-Studio's): its checkpoint under models/train/, Wan-AI's
    # folder as downloaded under models/Wan-AI/ (the VAE and umT5 as pickles, the tokenizer in google/umt5-xxl/)
    diffsynth = root / "game_editing" / "models"
    checkpoint = write_diffsynth_checkpoint(dit, diffsynth / "train" / "Wan2.1-T2V-1.3B_gbuffer" / "epoch-27.safetensors")
    wan_ai = write_wan_ai_folder(diffsynth / "Wan-AI" / "Wan2.1-T2V-1.3B", vae, state, spiece)
    return {
        "wan-ai-folder": ["--model", str(checkpoint), "--wan-dir", str(wan_ai)],
        "diffsynth-layout": ["--model", str(checkpoint)],  # the Wan-AI folder found from the checkpoint's place
        "wan-single": ["--model", str(wan / "model.safetensors"), "--vae", str(wan / "Wan2.1_VAE.safetensors"),
                       "--text-encoder", str(wan / "umt5_tiny.safetensors")],
        "comfyui-tree": ["--model", str(models / "diffusion_models" / "alayarenderer.safetensors")],
        "sharded": ["--model", str(index), "--vae", str(wan / "Wan2.1_VAE.safetensors"),
                    "--text-encoder", str(models / "text_encoders" / "umt5_xxl_fp16.safetensors")],
        "diffusers": ["--model", str(repo)],
    }


def frames(folder: Path) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))])


@pytest.mark.slow
def test_the_teacher_renders_from_every_published_layout(nets, state, spiece, tmp_path, capsys):  # noqa: F811
    dit, vae = nets
    renders = {}
    for name, flags in layouts(tmp_path, dit, vae, state, spiece).items():
        out = tmp_path / "out" / name
        assert main(["--quiet", "render", str(ROOT / "samples" / "courtyard"), "--prompt", "a moonlit street",
                     "--out", str(out), "--format", "png", "--size", "32", "--frames", "5", "--steps", "2",
                     *flags]) == 0, capsys.readouterr().err
        renders[name] = frames(out)
    first = renders["wan-single"]
    assert first.shape == (5, 32, 32, 3) and first.std() > 0
    for name, got in renders.items():  # the same weights whatever the layout: the same frames
        assert np.array_equal(got, first), name
    out = tmp_path / "out" / "other-prompt"
    assert main(["--quiet", "render", str(ROOT / "samples" / "courtyard"), "--prompt", "a sunny beach",
                 "--out", str(out), "--format", "png", "--size", "32", "--frames", "5", "--steps", "2",
                 *layouts_flags(tmp_path)]) == 0
    assert not np.array_equal(frames(out), first)  # the umT5 prompt reaches the frames


def layouts_flags(root: Path) -> list[str]:
    wan = root / "wan"
    return ["--model", str(wan / "model.safetensors"), "--vae", str(wan / "Wan2.1_VAE.safetensors"),
            "--text-encoder", str(wan / "umt5_tiny.safetensors")]


def test_comfyui_conditioning_equals_our_umt5_context(nets, state, spiece, tmp_path):  # noqa: F811
    """ComfyUI's CLIPTextEncode (CLIPLoader type wan) gives the real tokens + </s> only, no padding;
    our umT5 path gives 512 zero-padded tokens. Through Encode Prompt and the DiT's text_len padding
    both become the same context."""
    from alaya_flash.model_zoo.umt5 import load_umt5
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
    from alaya_flash.nodes.models import TextHandle

    dit, _ = nets
    import dataclasses

    padded = WanDiT(dataclasses.replace(TEACHER, text_len=512)).eval()
    padded.load_state_dict(dit.state_dict())
    enc = load_umt5(write_comfy(tmp_path / "umt5.safetensors", state, spiece), dtype=torch.float32)
    ours = enc(["a moonlit street"])  # (1, 512, 32)
    comfy_cond = [[enc.encode(["a moonlit street"])[0][None], {}]]  # (1, n, 32): what ComfyUI hands over

    class Model:
        text_dim = 32

        def text_encoder(self):
            return enc

    (from_comfy,) = NODES["AlayaFlash_EncodePrompt"]().encode(TextHandle(Model()), "ignored", conditioning=comfy_cond)
    with torch.no_grad():
        a, b = padded.prepare_prompt(ours), padded.prepare_prompt(from_comfy.entries[0][2])
    for ka, kb in zip(a.keys + a.values, b.keys + b.values):
        torch.testing.assert_close(ka, kb, atol=1e-6, rtol=1e-6)


def test_the_teacher_sampler_releases_umt5_once_the_prompts_are_encoded(nets, state, spiece, tmp_path):  # noqa: F811
    """umT5-XXL is ~11 GB: the Teacher Sampler encodes the negative prompt (Encode Prompt ran before it)
    and releases the encoder's weights; a later prompt reads them back."""
    from alaya_flash.model_zoo import bundle
    from alaya_flash.nodes import NODE_CLASS_MAPPINGS as NODES
    from alaya_flash.streaming.values import PromptSchedule

    dit, vae = nets
    teacher = bundle.TeacherModel(dit, vae, text_encoder_name=f"umt5-xxl:{write_comfy(tmp_path / 'u.safetensors', state, spiece)}")
    enc = teacher.text_encoder()
    prompt = PromptSchedule.encode(enc, "a moonlit street")
    NODES["AlayaFlash_TeacherSampler"]().start_stream(teacher, prompt, "blurry", seed=0, steps=2, cfg=3.0, shift=-1.0)
    assert enc.released
    assert enc(["a moonlit street"]).shape == (1, 512, 32) and not enc.released


def test_wan_dir_that_lacks_its_files_is_one_line(nets, state, spiece, tmp_path, capsys):  # noqa: F811
    dit, vae = nets
    checkpoint = write_diffsynth_checkpoint(dit, tmp_path / "epoch-1.safetensors")
    args = ["render", str(ROOT / "samples" / "courtyard"), "--prompt", "x", "--out", str(tmp_path / "o.mp4"),
            "--model", str(checkpoint)]
    assert main([*args, "--wan-dir", str(tmp_path / "nowhere")]) == 2
    assert "--wan-dir" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([*args, "--wan-dir", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no Wan2.1_VAE.pth here" in err and "pass --vae instead" in err and err.count("\n") == 1
    assert not (tmp_path / "o.mp4").exists()
