"""Strict safetensors loading: round trip, and refusal with offenders named."""
import pytest
import torch
from torch import nn

from alaya_flash.model_zoo import loading
from alaya_flash.model_zoo.errors import CheckpointError


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def test_round_trip_and_metadata(tmp_path):
    net = small_net()
    path = loading.save_safetensors(net.state_dict(), tmp_path / "w.safetensors", {"config": {"dim": 8}})
    assert not list(tmp_path.glob("*.tmp"))
    assert loading.read_metadata(path)["config"] == '{"dim": 8}'
    assert loading.read_shapes(path) == {"0.weight": (8, 4), "0.bias": (8,), "2.weight": (2, 8), "2.bias": (2,)}
    with torch.device("meta"):
        other = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    loading.load_strict(other, path)
    x = torch.randn(3, 4)
    assert torch.equal(other(x), net(x))
    assert loading.spec_lines(net) == ["0.bias 8", "0.weight 8x4", "2.bias 2", "2.weight 2x8"]


def test_refuses_renamed_missing_misshaped(tmp_path):
    sd = small_net().state_dict()
    bad = dict(sd)
    bad["0.wieght"] = bad.pop("0.weight")
    bad["2.bias"] = torch.zeros(3)
    del bad["2.weight"]
    path = loading.save_safetensors(bad, tmp_path / "bad.safetensors")
    with pytest.raises(CheckpointError) as err:
        loading.load_strict(small_net(), path)
    msg = str(err.value)
    assert "bad.safetensors" in msg
    assert "2 missing (0.weight, 2.weight)" in msg
    assert "1 unexpected (0.wieght)" in msg
    assert "2.bias is 3, expected 2" in msg


def test_refuses_non_safetensors_and_corrupt(tmp_path):
    pt = tmp_path / "w.pt"
    pt.write_bytes(b"\x80\x04pickle")
    with pytest.raises(CheckpointError, match="only .safetensors"):
        loading.read_state_dict(pt)
    bad = tmp_path / "c.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="c.safetensors: not a readable safetensors file"):
        loading.read_state_dict(bad)
