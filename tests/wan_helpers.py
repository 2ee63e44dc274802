"""Published files written as users download them, for the tests: AlayaRenderer's DiffSynth-Studio
checkpoint, and Wan-AI's Wan2.1 folder with its pickles (tiny random networks)."""
import json
from pathlib import Path

import torch

from alaya_flash.model_zoo import loading
from test_umt5 import to_wan


def write_diffsynth_checkpoint(dit, path: Path) -> Path:
    """A DiffSynth-Studio training output as AlayaRenderer's is: `epoch-N.safetensors`, the DiT's state dict
    under Wan's own names with `pipe.dit.` removed (ModelLogger.save_model, --remove_prefix_in_ckpt), written
    by accelerate's save (safetensors, metadata {"format": "pt"}), in bf16."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.bfloat16) for k, v in dit.state_dict().items()}
    assert "patch_embedding.weight" in state and state["patch_embedding.weight"].shape[1] == 96
    return loading.save_safetensors(state, path, {"format": "pt"})


def write_wan_ai_folder(folder: Path, vae, state, spiece, dit=None) -> Path:  # noqa: F811
    """Wan-AI/Wan2.1-T2V-1.3B as downloaded: config.json + diffusion_pytorch_model.safetensors (the stock DiT,
    when given), Wan2.1_VAE.pth and models_t5_umt5-xxl-enc-bf16.pth (torch.save of Wan's own state dicts:
    Wan's VAE names; Wan's T5Encoder names in bf16), google/umt5-xxl/ (the tokenizer)."""
    (folder / "google" / "umt5-xxl").mkdir(parents=True)
    torch.save(vae.state_dict(), folder / "Wan2.1_VAE.pth")
    torch.save({k: v.to(torch.bfloat16) for k, v in to_wan(state, 2).items()}, folder / "models_t5_umt5-xxl-enc-bf16.pth")
    (folder / "google" / "umt5-xxl" / "spiece.model").write_bytes(spiece.read_bytes())
    (folder / "google" / "umt5-xxl" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    if dit is not None:
        (folder / "config.json").write_text(json.dumps({"_class_name": "WanModel", "dim": dit.config.dim, "eps": 1e-06,
                                                        "ffn_dim": dit.config.ffn_dim, "freq_dim": dit.config.freq_dim,
                                                        "in_dim": dit.config.in_dim, "model_type": "t2v",
                                                        "num_heads": dit.config.num_heads, "num_layers": dit.config.num_layers,
                                                        "out_dim": 16, "text_dim": dit.config.text_dim, "text_len": 512}))
        loading.save_safetensors(dit.state_dict(), folder / "diffusion_pytorch_model.safetensors")
    return folder
