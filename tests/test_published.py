"""Published teacher / VAE files in every form users download, read strictly and lazily (model_zoo/published.py),
and `alaya-flash model identify` naming each form.

Small random networks are written by the tests in each layout (Wan-native single file, sharded +
index, ComfyUI prefixed, ComfyUI fp8-scaled, diffusers folders, a Wan repo folder, ComfyUI's models/
tree); each loads into our modules and gives the same outputs as the in-memory original. At full size,
on the meta device: diffusers' own key lists (tests/data/*.diffusers.keys.txt, dumped from diffusers'
WanTransformer3DModel and AutoencoderKLWan) convert to exactly our modules' names and shapes.
"""
import json
import shutil
from pathlib import Path

import pytest
import torch

from alaya_flash.model_zoo import convert, loading, published, registry
from alaya_flash.model_zoo.bundle import make_random_teacher, save_teacher
from alaya_flash.model_zoo.codecs.wan_vae import CONFIGS as VAE_CONFIGS
from alaya_flash.model_zoo.dit import CONFIGS as DIT_CONFIGS, DiTConfig, WanDiT
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.model_zoo.identify import identify_path
from alaya_flash.streaming.cli import main
from test_umt5 import spiece, state  # noqa: F401  (module-scoped fixtures: a tiny umT5 and its tokenizer)
from wan_helpers import write_diffsynth_checkpoint, write_wan_ai_folder

ROOT = Path(__file__).resolve().parents[1]

DATA = Path(__file__).resolve().parent / "data"
# A tiny teacher: 96 input channels, umT5-wide prompts (4096) padded to 512 tokens, as the real one.
TINY_TEACHER = DiTConfig(dim=32, ffn_dim=64, freq_dim=32, text_dim=4096, text_len=512, num_heads=2, num_layers=2)
SMALL_VAE = VAE_CONFIGS["wan2.1-vae-small"]
# diffusers' config.json of each (the fields diffusers writes; values as for the tiny networks)
DIFFUSERS_DIT_JSON = {"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.42.1", "patch_size": [1, 2, 2],
                      "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 96, "out_channels": 16,
                      "text_dim": 4096, "freq_dim": 32, "ffn_dim": 64, "num_layers": 2, "cross_attn_norm": True,
                      "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "image_dim": None, "added_kv_proj_dim": None,
                      "rope_max_seq_len": 1024, "pos_embed_seq_len": None}
DIFFUSERS_VAE_JSON = {"_class_name": "AutoencoderKLWan", "_diffusers_version": "0.42.1", "base_dim": 16, "z_dim": 16,
                      "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
                      "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": False}


@pytest.fixture(scope="module")
def dit():
    torch.manual_seed(0)
    model = WanDiT(TINY_TEACHER).eval()
    with torch.no_grad():  # the zero-initialised parts random too, so every tensor matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(1)
    return registry.build_config("wan-vae", SMALL_VAE).eval()


def dit_out(model):
    g = torch.Generator().manual_seed(2)
    x, p = torch.randn(1, 96, 2, 4, 4, generator=g), torch.randn(1, 5, 4096, generator=g)
    with torch.no_grad():
        return model(x.to(model.patch_embedding.weight.dtype), torch.tensor([300.0]), p).float()


def vae_out(model):
    g = torch.Generator().manual_seed(3)
    video = torch.rand(1, 3, 5, 16, 16, generator=g) * 2 - 1
    z = torch.randn(1, 16, 2, 2, 2, generator=g)
    return torch.cat([model.encode(video).float().flatten(), model.decode(z).float().flatten()])


def rounded(module, dtype):
    """A float32 copy of module whose weights went through dtype (what a bf16/fp16 file holds)."""
    copy = registry.build_config("dit" if isinstance(module, WanDiT) else "wan-vae", module.config)
    copy.load_state_dict({k: v.to(dtype).float() for k, v in module.state_dict().items()})
    return copy.eval()


def save(tensors, path, metadata=None):
    return loading.save_safetensors(tensors, path, metadata)


def write_sharded(state, folder: Path, stem="diffusion_pytorch_model", n=3) -> Path:
    keys = sorted(state)
    weight_map = {}
    for i in range(n):
        name = f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: state[k] for k in keys[i::n]}
        save(part, folder / name)
        weight_map.update({k: name for k in part})
    index = folder / f"{stem}.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index


def fp8_scaled(state, style="legacy", prefix=""):
    """ComfyUI's scaled fp8: each >= 2-D weight as e4m3fn with a per-tensor float32 scale; the rest bf16."""
    out = {}
    for k, v in state.items():
        if k.endswith(".weight") and v.ndim >= 2:
            scale = v.abs().max().float() / 448.0
            out[prefix + k] = (v.float() / scale).to(torch.float8_e4m3fn)
            layer = prefix + k[: -len(".weight")]
            if style == "legacy":
                out[layer + ".scale_weight"] = scale.reshape(())
                out[layer + ".scale_input"] = torch.ones(())
            else:
                out[layer + ".weight_scale"] = scale.reshape(())
                out[layer + ".comfy_quant"] = torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
        else:
            out[prefix + k] = v.to(torch.bfloat16)
    if style == "legacy":
        out[prefix + "scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def dequantized(module, fp8_state, prefix=""):
    """The float32 module a scaled-fp8 state dict stands for (stored value x scale)."""
    sd = {}
    for k in module.state_dict():
        v = fp8_state[prefix + k]
        layer = prefix + k[: -len(".weight")]
        scale = fp8_state.get(layer + ".scale_weight", fp8_state.get(layer + ".weight_scale"))
        sd[k] = v.float() * scale if scale is not None and k.endswith(".weight") else v.float()
    copy = registry.build_config("dit" if isinstance(module, WanDiT) else "wan-vae", module.config)
    copy.load_state_dict(sd)
    return copy.eval()


def identify_out(path, capsys):
    status = main(["model", "identify", str(path)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


# ---------------------------------------------------------------------------------------------
# each form loads strictly, identical outputs


def test_wan_native_single_files_load_identically(dit, vae, tmp_path, capsys):
    d = save(dit.state_dict(), tmp_path / "model.safetensors")  # the AlayaRenderer release's name, no metadata
    v = save(vae.state_dict(), tmp_path / "wan_2.1_vae.safetensors")
    back = published.load_dit(d, dtype=torch.float32)
    assert back.config == TINY_TEACHER  # text_len 512 inferred from the 4096-wide text embedding
    assert torch.equal(dit_out(back), dit_out(dit))
    assert torch.equal(vae_out(published.load_vae(v, dtype=torch.float32)), vae_out(vae))
    status, out = identify_out(d, capsys)
    assert status == 0 and "teacher DiT: unnamed config (in 96, dim 32, 2 layers" in out
    assert "form: single file; dtype: fp32" in out and "native names" in out
    status, out = identify_out(v, capsys)
    assert status == 0 and "Wan VAE (Wan2.1): wan2.1-vae-small (family wan-vae); native names; form: single file" in out


@pytest.mark.parametrize("dtype,label", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")])
def test_half_precision_files(dit, vae, tmp_path, capsys, dtype, label):
    d = save({k: v.to(dtype) for k, v in dit.state_dict().items()}, tmp_path / "dit.safetensors")
    v = save({k: t.to(dtype) for k, t in vae.state_dict().items()}, tmp_path / "vae.safetensors")
    assert torch.equal(dit_out(published.load_dit(d, dtype=torch.float32)), dit_out(rounded(dit, dtype)))
    assert torch.equal(vae_out(published.load_vae(v, dtype=torch.float32)), vae_out(rounded(vae, dtype)))
    same = published.load_dit(d, dtype=dtype)  # kept in the file's dtype
    assert same.patch_embedding.weight.dtype == dtype
    assert torch.equal(same.patch_embedding.weight, dit.patch_embedding.weight.to(dtype))
    assert f"dtype: {label}" in identify_out(d, capsys)[1]


def test_sharded_with_index(dit, tmp_path, capsys):
    index = write_sharded(dit.state_dict(), tmp_path)
    assert torch.equal(dit_out(published.load_dit(index, dtype=torch.float32)), dit_out(dit))
    shard = tmp_path / "diffusion_pytorch_model-00002-of-00003.safetensors"
    assert torch.equal(dit_out(published.load_dit(shard, dtype=torch.float32)), dit_out(dit))  # a shard: its whole set
    assert torch.equal(dit_out(published.load_dit(tmp_path, dtype=torch.float32)), dit_out(dit))  # the folder
    status, out = identify_out(index, capsys)
    assert status == 0 and "teacher DiT" in out and "form: sharded (3 files + index)" in out


def test_shard_problems_are_one_clear_line(dit, tmp_path, capsys):
    index = write_sharded(dit.state_dict(), tmp_path)
    lost = tmp_path / "diffusion_pytorch_model-00003-of-00003.safetensors"
    lost.rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(CheckpointError, match=r"index\.json: shard diffusion_pytorch_model-00003-of-00003\.safetensors is missing"):
        published.load_dit(index)
    status, out = identify_out(index, capsys)
    assert status == 2 and "shard diffusion_pytorch_model-00003-of-00003.safetensors is missing" in out
    assert len(out.strip().splitlines()) == 1
    (tmp_path / "elsewhere.safetensors").rename(lost)
    data = json.loads(index.read_text())
    data["weight_map"]["blocks.9.ffn.0.weight"] = lost.name  # the index maps a key the shard does not hold
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"00003\.safetensors: 1 tensors the index maps here are not in it \(e\.g\. blocks\.9\.ffn\.0\.weight\)"):
        published.load_dit(index)
    index.unlink()  # shards without their index
    with pytest.raises(CheckpointError, match="shard 1 of 3 without its index"):
        published.load_dit(tmp_path / "diffusion_pytorch_model-00001-of-00003.safetensors")


def test_comfyui_prefixed_checkpoint_with_its_vae(dit, vae, tmp_path, capsys):
    ckpt = {"model.diffusion_model." + k: v.to(torch.bfloat16) for k, v in dit.state_dict().items()}
    ckpt.update({"first_stage_model." + k: v.to(torch.bfloat16) for k, v in vae.state_dict().items()})
    path = save(ckpt, tmp_path / "checkpoints" / "teacher.safetensors")
    assert torch.equal(dit_out(published.load_dit(path, dtype=torch.float32)), dit_out(rounded(dit, torch.bfloat16)))
    assert torch.equal(vae_out(published.load_vae(path, dtype=torch.float32)), vae_out(rounded(vae, torch.bfloat16)))
    status, out = identify_out(path, capsys)
    assert status == 0
    assert "[dit]: teacher DiT" in out and "keys under 'model.diffusion_model.' (ComfyUI)" in out
    assert "[vae]: Wan VAE (Wan2.1): wan2.1-vae-small" in out and "keys under 'first_stage_model.' (ComfyUI)" in out


@pytest.mark.parametrize("style,prefix", [("legacy", ""), ("legacy", "model.diffusion_model."), ("comfy_quant", "")])
def test_comfyui_fp8_scaled(dit, tmp_path, capsys, style, prefix):
    state = fp8_scaled(dit.state_dict(), style, prefix)
    path = save(state, tmp_path / "teacher_fp8_scaled.safetensors")
    back = published.load_dit(path, dtype=torch.float32)
    want = dequantized(dit, state, prefix)
    assert torch.equal(dit_out(back), dit_out(want))  # exactly the dequantized weights
    err = (dit_out(back) - dit_out(dit)).abs().max() / dit_out(dit).abs().max()
    assert err < 0.1, err  # and within fp8's quantisation error of the original (measured: 0.04)
    status, out = identify_out(path, capsys)
    assert status == 0 and "fp8-scaled (ComfyUI)" in out and "dtype: fp8-scaled (fp8 e4m3fn; 27 tensors scaled, the rest bf16)" in out


def test_fp8_without_scales_is_refused(dit, tmp_path, capsys):
    state = {k: (v.to(torch.float8_e4m3fn) if v.ndim >= 2 else v) for k, v in dit.state_dict().items()}
    path = save(state, tmp_path / "teacher_fp8_e4m3fn.safetensors")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.cross_attn\.k\.weight is stored as fp8 e4m3fn without a scale "
                                              r"\(blocks\.0\.cross_attn\.k\.scale_weight\)"):
        published.load_dit(path)
    status, out = identify_out(path, capsys)
    assert status == 2 and "without a scale" in out


def test_diffusers_repo_folder_loads_the_teacher(dit, vae, tmp_path, capsys):
    root = tmp_path / "AlayaRenderer-Diffusers"
    (root / "transformer").mkdir(parents=True)
    (root / "vae").mkdir()
    (root / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"]}))
    (root / "transformer" / "config.json").write_text(json.dumps(DIFFUSERS_DIT_JSON))
    write_sharded(convert.wan_to_diffusers(dit.state_dict()), root / "transformer", n=2)
    (root / "vae" / "config.json").write_text(json.dumps(DIFFUSERS_VAE_JSON))
    save(convert.vae_wan_to_diffusers(vae.state_dict()), root / "vae" / "diffusion_pytorch_model.safetensors")
    teacher = published.load_teacher_files(root, dtype=torch.float32)
    assert teacher.dit.config == TINY_TEACHER  # from transformer/config.json
    assert torch.equal(dit_out(teacher.dit), dit_out(dit))
    assert torch.equal(vae_out(teacher.vae), vae_out(vae))
    assert teacher.settings.negative_prompt == published.WAN_NEGATIVE_PROMPT and teacher.settings.negative_prompt.startswith("色调艳丽")
    assert (teacher.settings.steps, teacher.settings.cfg, teacher.settings.shift, teacher.settings.window_frames) == (50, 5.0, 5.0, 81)
    assert teacher.text_encoder_name == "umt5-xxl"  # no text_encoder/ here: the name a renderer must resolve
    assert published.load_teacher_files(root, text_encoder="umt5-xxl:/x/umt5.safetensors").text_encoder_name == "umt5-xxl:/x/umt5.safetensors"
    status, out = identify_out(root, capsys)
    assert status == 0
    assert "teacher DiT: unnamed config" in out and "diffusers folder (transformer/: config.json + sharded (2 files + index))" in out
    assert "converted names" in out and "Wan VAE (Wan2.1): wan2.1-vae-small (family wan-vae); converted names" in out
    assert f"{root}: a teacher DiT; missing: text encoder (umT5-XXL, --text-encoder)" in out
    (root / "text_encoder").mkdir()
    (root / "text_encoder" / "config.json").write_text(json.dumps({"_class_name": "UMT5EncoderModel"}))
    assert published.load_teacher_files(root).text_encoder_name == f"umt5-xxl:{root / 'text_encoder'}"


def test_wan_ai_folder_as_downloaded_reads_its_pickles_tensors_only(dit, vae, state, spiece, tmp_path, capsys):  # noqa: F811
    """Wan-AI/Wan2.1-T2V-* as downloaded: config.json + the DiT as safetensors, the VAE and umT5 as pickles
    (Wan's own state dicts), the tokenizer in google/umt5-xxl/. The pickles are read tensors-only: the VAE
    equals the one it was saved from, umT5 finds its tokenizer, and `model identify` says what each is."""
    repo = write_wan_ai_folder(tmp_path / "Wan2.1-T2V", vae, state, spiece, dit=dit)
    back = published.load_dit(repo, dtype=torch.float32)
    assert back.config == TINY_TEACHER and torch.equal(dit_out(back), dit_out(dit))
    from_pickle = published.load_vae(repo / "Wan2.1_VAE.pth", dtype=torch.float32)
    assert torch.equal(vae_out(from_pickle), vae_out(vae))
    assert torch.equal(vae_out(published.load_vae(repo, dtype=torch.float32)), vae_out(vae))  # the folder names it
    teacher = published.load_teacher_files(repo, dtype=torch.float32)
    assert torch.equal(vae_out(teacher.vae), vae_out(vae))
    assert teacher.text_encoder_name == f"umt5-xxl:{repo / 'models_t5_umt5-xxl-enc-bf16.pth'}"
    status, out = identify_out(repo, capsys)
    assert status == 0 and "Wan repo folder (config.json + single file)" in out
    assert (f"{repo / 'Wan2.1_VAE.pth'}: Wan VAE (Wan2.1): wan2.1-vae-small (family wan-vae); native names; "
            "form: PyTorch pickle, read tensors-only (torch.load weights_only); dtype: fp32") in out
    assert (f"{repo / 'models_t5_umt5-xxl-enc-bf16.pth'}: umT5 text encoder: umt5-tiny (family umt5); converted names; "
            f"dtype: bf16; form: PyTorch pickle (Wan's names, converted); tokenizer: {repo / 'google/umt5-xxl/spiece.model'}; "
            "read with torch.load(weights_only=True): tensors only, no code run") in out
    assert f"{repo}: a teacher DiT; nothing missing to render" in out
    # without its tokenizer folder, umT5 cannot run: identify and the missing line say so
    (repo / "google" / "umt5-xxl" / "spiece.model").unlink()
    status, out = identify_out(repo, capsys)
    assert "no tokenizer beside it" in out and "missing: text encoder (umT5-XXL, --text-encoder)" in out


def test_a_pickle_that_runs_code_is_refused_wherever_it_is_read(dit, vae, state, spiece, tmp_path, capsys):  # noqa: F811
    """A Wan2.1_VAE.pth / umT5 .pth whose pickle calls os.system: one line naming it, exit 2, and nothing runs."""
    from test_loading import RunsCode

    marker = tmp_path / "ran"
    repo = write_wan_ai_folder(tmp_path / "Wan2.1-T2V", vae, state, spiece, dit=dit)
    torch.save({**vae.state_dict(), "x": RunsCode(marker)}, repo / "Wan2.1_VAE.pth")
    torch.save({"token_embedding.weight": torch.zeros(2, 2), "x": RunsCode(marker)}, repo / "models_t5_umt5-xxl-enc-bf16.pth")
    with pytest.raises(CheckpointError, match=r"Wan2.1_VAE.pth: refused: it asks for posix.system, which is code"):
        published.load_teacher_files(repo)
    from alaya_flash.model_zoo.umt5 import load_umt5

    with pytest.raises(CheckpointError, match=r"models_t5_umt5-xxl-enc-bf16.pth: refused: it asks for posix.system"):
        load_umt5(repo / "models_t5_umt5-xxl-enc-bf16.pth")
    assert main(["model", "identify", str(repo / "Wan2.1_VAE.pth")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused: it asks for posix.system" in err
    status, out = identify_out(repo, capsys)  # the folder's other files are still described
    assert "Wan2.1_VAE.pth: refused" in out and "Wan repo folder (config.json + single file)" in out
    assert not marker.exists()


def test_diffsynth_training_output_loads_strictly(dit, tmp_path, capsys):
    """AlayaRenderer's checkpoint is DiffSynth-Studio's training output (epoch-N.safetensors): the DiT's own
    parameter names with `pipe.dit.` removed, saved by accelerate (metadata {"format": "pt"}), bf16."""
    path = write_diffsynth_checkpoint(dit, tmp_path / "train" / "Wan2.1-T2V-1.3B_gbuffer" / "epoch-27.safetensors")
    back = published.load_dit(path, dtype=torch.float32)
    assert back.config == TINY_TEACHER and torch.equal(dit_out(back), dit_out(rounded(dit, torch.bfloat16)))
    status, out = identify_out(path, capsys)
    assert status == 0 and f"{path}: teacher DiT: unnamed config (in 96, dim 32, 2 layers" in out
    assert "native names; form: single file; dtype: bf16" in out
    # with --remove_prefix_in_ckpt cleared, DiffSynth keeps its pipeline's prefix
    kept = save({f"pipe.dit.{k}": v for k, v in dit.state_dict().items()}, tmp_path / "step-100.safetensors")
    assert torch.equal(dit_out(published.load_dit(kept, dtype=torch.float32)), dit_out(dit))
    # strictly: one tensor short is one line naming it; a LoRA output is named as such
    partial = {k: v for k, v in dit.state_dict().items() if k != "blocks.1.ffn.2.bias"}
    with pytest.raises(CheckpointError, match=r"epoch-1.safetensors: keys do not match the network: 1 missing \(blocks.1.ffn.2.bias\)"):
        published.load_dit(save(partial, tmp_path / "epoch-1.safetensors", {"format": "pt"}))
    lora = save({"blocks.0.self_attn.q.lora_A.default.weight": torch.zeros(4, 32),
                 "blocks.0.self_attn.q.lora_B.default.weight": torch.zeros(32, 4)}, tmp_path / "lora.safetensors")
    with pytest.raises(CheckpointError, match="lora.safetensors: a LoRA"):
        published.load_dit(lora)
    # at full size, DiffSynth's names for the AlayaRenderer teacher are exactly the 825 published ones (research/model.md 1.5)
    assert key_file("alayarenderer-teacher.keys.txt") == spec("alayarenderer-teacher")


def test_comfyui_models_tree_finds_vae_and_text_encoder(dit, vae, tmp_path, capsys):
    models = tmp_path / "ComfyUI" / "models"
    d = save({k: v.to(torch.bfloat16) for k, v in dit.state_dict().items()}, models / "diffusion_models" / "alayarenderer_bf16.safetensors")
    save({k: v.to(torch.bfloat16) for k, v in vae.state_dict().items()}, models / "vae" / "wan_2.1_vae.safetensors")
    text = save({"shared.weight": torch.zeros(64, 8), "encoder.block.0.layer.0.SelfAttention.q.weight": torch.zeros(8, 8)},
                models / "text_encoders" / "umt5_xxl_fp16.safetensors")
    save({"x": torch.zeros(1)}, models / "text_encoders" / "umt5_xxl_fp8_e4m3fn_scaled.safetensors")
    teacher = published.load_teacher_files(d, dtype=torch.float32)
    assert torch.equal(dit_out(teacher.dit), dit_out(rounded(dit, torch.bfloat16)))
    assert torch.equal(vae_out(teacher.vae), vae_out(rounded(vae, torch.bfloat16)))
    assert teacher.text_encoder_name == f"umt5-xxl:{text}"  # full precision before fp8
    status, out = identify_out(models, capsys)
    assert status == 0 and "nothing missing to render" in out
    assert "T5-style text encoder (vocab 64, width 8) (by its key names" in out
    (models / "vae" / "wan_2.1_vae.safetensors").unlink()
    status, out = identify_out(models / "diffusion_models", capsys)
    assert status == 0 and "missing: VAE (vae/wan_2.1_vae.safetensors or --vae)" in out and "text encoder (umT5" not in out


def test_our_model_folders_and_other_networks(tmp_path, capsys):
    folder = save_teacher(make_random_teacher("dit-tiny", "wan2.1-vae-small"), tmp_path / "teacher",
                          config_names={"dit": "dit-tiny", "vae": "wan2.1-vae-small"})
    status, out = identify_out(folder, capsys)
    assert status == 0 and "our teacher model folder (alaya-flash/teacher v1)" in out
    assert "vae: Wan VAE (wan2.1-vae-small); vae.safetensors, dtype fp32" in out and "nothing missing to render" in out
    assert torch.equal(published.load_teacher_files(folder, dtype=torch.float32).dit.patch_embedding.weight,
                       loading.read_state_dict(folder / "dit.safetensors")["patch_embedding.weight"])
    (folder / "vae.safetensors").unlink()
    status, out = identify_out(folder, capsys)
    assert status == 0 and "missing: vae (vae.safetensors)" in out
    # a Flash model folder whose config.json is broken: named, and the folder is not called ready to render
    flash_folder = tmp_path / "flash"
    shutil.copytree(ROOT / "model_zoo" / "default", flash_folder, ignore=shutil.ignore_patterns("teacher"))
    (flash_folder / "config.json").write_text("{not json")
    status, out = identify_out(flash_folder, capsys)
    assert f"{flash_folder / 'config.json'}: not readable as JSON (" in out
    assert "missing: a readable config.json (above)" in out and "nothing missing to render" not in out
    (flash_folder / "config.json").write_text("[1, 2]")
    status, out = identify_out(flash_folder, capsys)
    assert "config.json: a list, not a JSON object" in out
    taew = save(registry.build("taew-slim").state_dict(), tmp_path / "decoder.safetensors")
    status, out = identify_out(taew, capsys)
    assert status == 0 and "tiny decoder (TAEHV codec): taew-slim (family tiny-codec)" in out


def test_bad_inputs(tmp_path, capsys):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 40)
    status, out = identify_out(junk, capsys)
    assert status == 2 and "junk.safetensors: not a readable safetensors file" in out
    other = save({"foo.weight": torch.zeros(3, 3)}, tmp_path / "other.safetensors")
    status, out = identify_out(other, capsys)
    assert status == 1 and "other.safetensors: matches no known config; closest" in out
    status, out = identify_out(tmp_path / "nothing", capsys)
    assert status == 2 and "no such file or folder" in out
    with pytest.raises(CheckpointError, match="other.safetensors: not a Wan DiT"):
        published.load_dit(other)
    empty = tmp_path / "empty"
    empty.mkdir()
    report = identify_path(empty)
    assert report.status == 1 and report.describe() == f"{empty}: no weight files here (.safetensors, .safetensors.index.json)"


def test_strict_loading_names_file_and_key(dit, tmp_path):
    sd = dict(dit.state_dict())
    sd["blocks.0.ffn.0.weight"] = torch.zeros(65, 32)
    del sd["head.modulation"]
    path = save(sd, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError) as err:
        published.load_dit(path, config=TINY_TEACHER)
    msg = str(err.value)
    assert "bad.safetensors" in msg and "1 missing (head.modulation)" in msg
    assert "blocks.0.ffn.0.weight is 65x32, expected 64x32" in msg
    vsd = convert.vae_wan_to_diffusers(registry.build_config("wan-vae", SMALL_VAE).state_dict())
    vsd["decoder.up_blocks.0.resnets.0.conv9.weight"] = torch.zeros(1)
    vpath = save(vsd, tmp_path / "vae" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(CheckpointError, match=r"diffusion_pytorch_model.safetensors \(names converted from diffusers'\): keys do not match.*"
                                              r"1 unexpected \(decoder\.upsamples\.0\.conv9\.weight\)"):
        published.load_vae(vpath)


# ---------------------------------------------------------------------------------------------
# full size, meta device: diffusers' own names convert to exactly our modules'


def key_file(name):
    lines = [ln.split() for ln in (DATA / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return {k: tuple(int(d) for d in s.split("x")) for k, s in lines}


def spec(name):
    return {k: tuple(v.shape) for k, v in registry.build(name, device="meta").state_dict().items()}


def test_full_size_diffusers_teacher_and_vae_names_convert_to_ours():
    teacher = key_file("alayarenderer-teacher.diffusers.keys.txt")
    assert len(teacher) == 825 and convert.to_wan(teacher) == spec("alayarenderer-teacher")
    vae = key_file("wan2.1-vae.diffusers.keys.txt")
    assert len(vae) == 194 and convert.vae_to_wan(vae) == spec("wan2.1-vae")
    assert convert.vae_wan_to_diffusers(spec("wan2.1-vae")) == vae
    assert published.infer_vae_config(spec("wan2.1-vae")) == VAE_CONFIGS["wan2.1-vae"]
    # diffusers' configs of these two (their defaults, in_channels 96) give our configs
    full_dit = {**DIFFUSERS_DIT_JSON, "num_attention_heads": 12, "attention_head_dim": 128, "freq_dim": 256, "ffn_dim": 8960, "num_layers": 30}
    assert published.dit_config_from_json(full_dit, "x") == DIT_CONFIGS["alayarenderer-teacher"]
    assert published.vae_config_from_json({**DIFFUSERS_VAE_JSON, "base_dim": 96}, "x") == VAE_CONFIGS["wan2.1-vae"]
    assert published.dit_kind(DIT_CONFIGS["alayarenderer-teacher"]) == "teacher DiT (AlayaRenderer)"
    assert published.dit_kind(DIT_CONFIGS["wan2.1-t2v-1.3b"]) == "stock Wan T2V DiT 1.3B"


def test_full_size_published_layouts_check_on_headers_alone(tmp_path):
    """A diffusers-layout full-size teacher (names and shapes only, no data) passes the strict key check."""
    ws = published.WeightSet("dit", "x", "single file", "diffusers", "",
                             {convert.wan_name(k): published.TensorRef(tmp_path, k, s, "BF16")
                              for k, s in key_file("alayarenderer-teacher.diffusers.keys.txt").items()})
    assert published.config_of(ws) == DIT_CONFIGS["alayarenderer-teacher"]
    module = registry.build("alayarenderer-teacher", device="meta")
    loading.check_shapes(spec("alayarenderer-teacher"), ws.shapes(), "x")
    assert sum(p.numel() for p in module.parameters()) == 1_419_488_320


def test_vae_requires_wan21(tmp_path):
    with pytest.raises(CheckpointError, match="Wan2.2 VAE"):
        published.vae_config_from_json({**DIFFUSERS_VAE_JSON, "z_dim": 48, "is_residual": True}, "vae/config.json")
    with pytest.raises(AlayaError, match="no such file"):
        published.load_vae(tmp_path / "missing.safetensors")
