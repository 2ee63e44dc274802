"""DiT weights: strict round trip, diffusers names converted on load, corrupt files refused, identify."""
import pytest
import torch

from alaya_flash.model_zoo import convert, dit, loading
from alaya_flash.model_zoo.errors import CheckpointError
from alaya_flash.model_zoo.identify import identify
from alaya_flash.model_zoo.precision import preferred_dtype
from alaya_flash.streaming.cli import main

TINY = dit.CONFIGS["dit-tiny"]


def tiny():
    torch.manual_seed(0)
    return dit.WanDiT(TINY).eval()


def outputs(model):
    g = torch.Generator().manual_seed(2)
    x, p = torch.randn(1, 96, 2, 4, 4, generator=g), torch.randn(1, 3, 16, generator=g)
    with torch.no_grad():
        return model(x, torch.tensor([300.0]), p)


def test_round_trip_with_config_in_metadata(tmp_path):
    model = tiny()
    path = dit.save(model, tmp_path / "tiny.safetensors", name="dit-tiny")
    meta = loading.read_metadata(path)
    assert meta["family"] == "dit" and meta["config_name"] == "dit-tiny"
    back = dit.load(path, dtype=torch.float32)
    assert back.config == TINY
    assert (outputs(back) - outputs(model)).abs().max() <= 1e-6
    assert dit.load(path, dtype=torch.bfloat16).patch_embedding.weight.dtype == torch.bfloat16
    assert dit.load(path).patch_embedding.weight.dtype == preferred_dtype("cpu")


def test_diffusers_names_convert_on_load(tmp_path):
    model = tiny()
    renamed = convert.wan_to_diffusers(model.state_dict())
    assert "blocks.0.attn1.to_out.0.weight" in renamed and "proj_out.weight" in renamed
    assert "condition_embedder.time_proj.weight" in renamed and "scale_shift_table" in renamed
    assert convert.naming(renamed) == "diffusers" and convert.naming(model.state_dict()) == "wan"
    path = loading.save_safetensors(renamed, tmp_path / "diffusers.safetensors")  # no metadata: shapes say
    back = dit.load(path, dtype=torch.float32)
    assert back.config == TINY
    assert (outputs(back) - outputs(model)).abs().max() <= 1e-6
    helios = {("norm_out.scale_shift_table" if k == "scale_shift_table" else "model." + k): v for k, v in renamed.items()}
    assert convert.to_wan(helios).keys() == model.state_dict().keys()


def test_corrupt_files_are_refused_with_offenders_named(tmp_path):
    sd = tiny().state_dict()
    bad = dict(sd)
    bad["blocks.0.self_attn.qq.weight"] = bad.pop("blocks.0.self_attn.q.weight")  # renamed
    del bad["head.modulation"]  # missing
    bad["blocks.1.ffn.0.weight"] = torch.zeros(65, 32)  # mis-shaped
    path = loading.save_safetensors(bad, tmp_path / "bad.safetensors", {"family": "dit"})
    with pytest.raises(CheckpointError) as err:
        dit.load(path, TINY)
    msg = str(err.value)
    assert "bad.safetensors" in msg
    assert "2 missing (blocks.0.self_attn.q.weight, head.modulation)" in msg
    assert "1 unexpected (blocks.0.self_attn.qq.weight)" in msg
    assert "blocks.1.ffn.0.weight is 65x32, expected 64x32" in msg


def test_identify_names_family_from_shapes_only(tmp_path, capsys):
    model = tiny()
    path = loading.save_safetensors(model.state_dict(), tmp_path / "teacher.safetensors")  # misleading name
    result = identify(path)
    assert result.matches == [("dit-tiny", "dit")] and not result.converted
    diffusers = loading.save_safetensors(convert.wan_to_diffusers(model.state_dict()), tmp_path / "d.safetensors")
    assert identify(diffusers).matches == [("dit-tiny", "dit")] and identify(diffusers).converted
    assert main(["model", "identify", str(path)]) == 0
    assert "dit-tiny (family dit); native names" in capsys.readouterr().out
    sd = model.state_dict()
    sd["patch_embedding.weight"] = torch.zeros(32, 16, 1, 2, 2)  # a 16-channel tiny: not a known config
    odd = loading.save_safetensors(sd, tmp_path / "odd.safetensors")
    assert main(["model", "identify", str(odd)]) == 1
    out = capsys.readouterr().out
    assert "matches no known config; closest dit-tiny" in out
    assert "patch_embedding.weight is 32x16x1x2x2, expected 32x96x1x2x2" in out


def test_infer_config_of_teacher_shapes_from_the_key_file():
    from conftest import ROOT

    lines = (ROOT / "tests/data/alayarenderer-teacher.keys.txt").read_text().splitlines()
    shapes = {n: tuple(int(d) for d in s.split("x")) for n, s in (l.split() for l in lines if not l.startswith("#"))}
    assert dit.infer_config(shapes) == dit.CONFIGS["alayarenderer-teacher"]
