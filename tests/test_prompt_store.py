"""The prompt store (model_zoo/prompt_store.py): a prompt encoded once is read back, with the bits
encoding it gives, by a later encoder that never loads MiniLM; a file that does not read back is
encoded again; the key follows the encoder's files and the device."""
import shutil

import pytest
import torch

from alaya_flash.model_zoo import bundle
from alaya_flash.model_zoo.prompt_store import StoredTextEncoder, encoder_key
from alaya_flash.model_zoo.text_encoder import MINILM, MINILM_TOKENS, context_tokens, default_model_dir
from conftest import ROOT

PROMPTS = ["a sunny street", "0", "a rainy night over a long and winding road, lamps on the left"]


def _not_loaded():
    raise AssertionError("the encoder was loaded")


def stored(folder, name=MINILM, load=None) -> StoredTextEncoder:
    return StoredTextEncoder(load or (lambda: bundle.load_text_encoder(name)), default_model_dir(), folder,
                             tokens=context_tokens(name))


@pytest.mark.parametrize("name", [MINILM, MINILM_TOKENS])
def test_a_stored_prompt_reads_back_the_bits_encoding_gives_without_loading_the_encoder(name, tmp_path):
    truth = bundle.load_text_encoder(name)
    first = stored(tmp_path, name)
    assert torch.equal(first(PROMPTS), truth(PROMPTS))
    later = stored(tmp_path, name, load=_not_loaded)  # a new process's: only the store to read
    assert torch.equal(later(PROMPTS), truth(PROMPTS))
    assert (later.text_dim, later.text_len) == (truth.text_dim, truth.text_len)
    for prompt in PROMPTS:  # what the light head reads
        assert all(torch.equal(a, b) for a, b in zip(later.states([prompt]), truth.states([prompt])))


def test_a_file_cut_short_is_encoded_again_and_written_whole(tmp_path):
    truth = bundle.load_text_encoder(MINILM)
    stored(tmp_path)(PROMPTS[:1])
    path = stored(tmp_path).path(PROMPTS[0])
    path.write_bytes(path.read_bytes()[:-100])
    assert torch.equal(stored(tmp_path)(PROMPTS[:1]), truth(PROMPTS[:1]))
    assert torch.equal(stored(tmp_path, load=_not_loaded)(PROMPTS[:1]), truth(PROMPTS[:1]))


def test_another_prompts_file_is_not_read_and_an_unwritable_store_only_costs_the_encoding(tmp_path):
    truth = bundle.load_text_encoder(MINILM)
    stored(tmp_path / "s")(PROMPTS[1:2])
    here, other = (stored(tmp_path / "s").path(p) for p in PROMPTS[:2])
    shutil.copyfile(other, here)  # PROMPTS[1]'s encoding where PROMPTS[0]'s would be
    with pytest.raises(AssertionError, match="was loaded"):
        stored(tmp_path / "s", load=_not_loaded)(PROMPTS[:1])
    (tmp_path / "blocked").write_text("a file where the store's folder would be")
    assert torch.equal(stored(tmp_path / "blocked")(PROMPTS), truth(PROMPTS))


def test_the_key_follows_the_encoders_files_and_the_device(tmp_path):
    folder = tmp_path / "enc"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (folder / name).write_bytes(name.encode())
    cpu = encoder_key(folder, torch.device("cpu"))
    assert encoder_key(folder, torch.device("cpu")) == cpu != encoder_key(folder, torch.device("cuda"))
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert encoder_key(folder, torch.device("cpu")) != cpu


def test_a_render_from_stored_prompts_loads_no_encoder_and_gives_the_same_frames(tmp_path, monkeypatch, capsys):
    """A model's encoder is behind the store: the second render (a new encoder, as a new process's) reads
    its prompts back, never loads MiniLM, and writes the same frames; with the store off it is MiniLM itself."""
    from alaya_flash.model_zoo.text_encoder import TextEncoder
    from alaya_flash.streaming.cli import main

    monkeypatch.setenv("ALAYA_FLASH_PROMPT_STORE", str(tmp_path / "store"))
    monkeypatch.chdir(ROOT)
    render = ["--quiet", "render", "samples/courtyard", "--prompt", "0: a store test\n2: its second prompt",
              "--frames", "5", "--size", "32", "--format", "png"]
    assert main(render + ["--out", str(tmp_path / "a")]) == 0
    assert len(list((tmp_path / "store").rglob("*.safetensors"))) == 2
    bundle._stored_text_encoder.cache_clear()
    monkeypatch.setattr(bundle, "load_text_encoder", lambda *a, **k: _not_loaded())
    assert main(render + ["--out", str(tmp_path / "b")]) == 0
    frames = sorted(p.name for p in (tmp_path / "a").glob("*.png"))
    assert len(frames) == 5 and [(tmp_path / "a" / f).read_bytes() for f in frames] == [
        (tmp_path / "b" / f).read_bytes() for f in frames]
    bundle._stored_text_encoder.cache_clear()
    monkeypatch.undo()
    monkeypatch.setenv("ALAYA_FLASH_PROMPT_STORE", "off")
    assert type(bundle.model_text_encoder(MINILM)) is TextEncoder
