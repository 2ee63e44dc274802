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


# ---------------------------------------------------------------------------------------------
# pickles: tensors only (model_zoo/pickled.py, torch.load weights_only)


class RunsCode:
    """A pickle that, unpickled as such, runs a command: __reduce__ names os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


class EvalsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w')",))


def test_pickle_tensors_are_read_and_memory_mapped(tmp_path):
    from alaya_flash.model_zoo import pickled

    state = {"a.weight": torch.randn(3, 2, dtype=torch.bfloat16), "b": torch.arange(4)}
    torch.save(state, tmp_path / "w.pth")
    torch.save(state, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"state_dict": state}, tmp_path / "wrapped.ckpt")
    for name in ("w.pth", "legacy.pt", "wrapped.ckpt"):
        back = pickled.read_state(tmp_path / name)
        assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state), name
    assert pickled.header(pickled.read_state(tmp_path / "w.pth")) == {"a.weight": ((3, 2), "BF16"), "b": ((4,), "I64")}
    assert pickled.is_pickle(tmp_path / "w.pth")
    disguised = tmp_path / "w.safetensors"
    disguised.write_bytes((tmp_path / "w.pth").read_bytes())
    assert pickled.is_pickle(disguised)  # by its first bytes (torch's zip container)


def test_pickles_that_would_run_code_are_refused_and_nothing_runs(tmp_path):
    """A __reduce__ calling os.system (torch.save's zip format and a bare pickle) or eval is refused with one
    line naming what it asked for, and the command never runs."""
    import pickle

    from alaya_flash.model_zoo import pickled

    marker = tmp_path / "ran"
    torch.save({"w": torch.zeros(2), "x": RunsCode(marker)}, tmp_path / "zip.pth")
    (tmp_path / "bare.pth").write_bytes(pickle.dumps(RunsCode(marker), protocol=2))
    torch.save(EvalsCode(marker), tmp_path / "eval.pt")
    (tmp_path / "eval4.bin").write_bytes(pickle.dumps({"w": EvalsCode(marker)}, protocol=4))
    asked = {"zip.pth": "posix.system", "bare.pth": "posix.system", "eval.pt": "eval", "eval4.bin": "pickle opcode"}
    for name, what in asked.items():
        with pytest.raises(CheckpointError) as err:
            pickled.read_state(tmp_path / name)
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{tmp_path / name}: refused: ") and what in msg, msg
        assert "nothing in it is run" in msg
    assert not marker.exists()
    # tensors in something other than a state dict, and a file that is no pickle at all
    torch.save([torch.zeros(1)], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match=r"list.pth: expected a state dict \(names -> tensors\), got list"):
        pickled.read_state(tmp_path / "list.pth")
    torch.save({"w": torch.zeros(1), "step": 3}, tmp_path / "mixed.pth")
    with pytest.raises(CheckpointError, match="got 'step': int"):
        pickled.read_state(tmp_path / "mixed.pth")
    (tmp_path / "text.pth").write_text("hello")
    with pytest.raises(CheckpointError, match="text.pth: refused: not a tensors-only torch checkpoint"):
        pickled.read_state(tmp_path / "text.pth")
