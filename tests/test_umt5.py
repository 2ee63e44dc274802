"""umT5 prompt encoder (model_zoo/umt5.py): every file form, Wan's tokenization, Wan's padding.

No downloads: the tokenizer is a small sentencepiece model trained here on a few hundred generated
lines, the encoders are the tiny config with random weights written by the tests in each form, and
the full-size umT5-XXL is only ever built on the meta device.
"""
import html
import io
import json
import logging
import random

import pytest
import torch

from alaya_flash.model_zoo import registry, umt5
from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.model_zoo.loading import save_safetensors
from alaya_flash.streaming.cli import main

sentencepiece = pytest.importorskip("sentencepiece")

TIED = "encoder.embed_tokens.weight"
LINEARS = ("layer.0.SelfAttention.q", "layer.0.SelfAttention.k", "layer.0.SelfAttention.v", "layer.0.SelfAttention.o",
           "layer.1.DenseReluDense.wi_0", "layer.1.DenseReluDense.wi_1", "layer.1.DenseReluDense.wo")
PROMPTS = [
    "a moonlit night, cold blue light",
    "Café in der Straße, 東京の夜景 — naïve façade!",
    "",
    "  rainy\tstreet \n with   reflections  ",
    "neon &amp; rain, &lt;glow&gt;",
    "москва ночью, снег",
]
LONG = " ".join(["the old stone bridge over a misty river at golden hour"] * 60)  # > 512 tokens

# Wan 2.1's T5Encoder names (wan/modules/t5.py, encoder only) for layer i, written out here
# independently of the loader's table.
WAN_LAYER = {
    "blocks.{i}.norm1.weight": "encoder.block.{i}.layer.0.layer_norm.weight",
    "blocks.{i}.attn.q.weight": "encoder.block.{i}.layer.0.SelfAttention.q.weight",
    "blocks.{i}.attn.k.weight": "encoder.block.{i}.layer.0.SelfAttention.k.weight",
    "blocks.{i}.attn.v.weight": "encoder.block.{i}.layer.0.SelfAttention.v.weight",
    "blocks.{i}.attn.o.weight": "encoder.block.{i}.layer.0.SelfAttention.o.weight",
    "blocks.{i}.pos_embedding.embedding.weight": "encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight",
    "blocks.{i}.norm2.weight": "encoder.block.{i}.layer.1.layer_norm.weight",
    "blocks.{i}.ffn.gate.0.weight": "encoder.block.{i}.layer.1.DenseReluDense.wi_0.weight",
    "blocks.{i}.ffn.fc1.weight": "encoder.block.{i}.layer.1.DenseReluDense.wi_1.weight",
    "blocks.{i}.ffn.fc2.weight": "encoder.block.{i}.layer.1.DenseReluDense.wo.weight",
}
WAN_TOP = {"token_embedding.weight": "shared.weight", "norm.weight": "encoder.final_layer_norm.weight"}


def to_wan(state: dict, layers: int) -> dict:
    out = {wan: state[hf] for wan, hf in WAN_TOP.items()}
    for i in range(layers):
        out.update({wan.format(i=i): state[hf.format(i=i)] for wan, hf in WAN_LAYER.items()})
    return out


# ---------------------------------------------------------------------------------------------
# fixtures: a real sentencepiece model, tiny random weights, the forms written from them


def _corpus() -> list[str]:
    rng = random.Random(0)
    words = ("the a an of in on at under over night day moonlit sunny afternoon morning evening street city road "
             "forest river bridge mountain snow rain fog mist neon glow light shadow cold warm blue golden pink cyan "
             "red green stone brick glass metal wood old new wet dry bright dark hard soft misty hour sky cloud").split()
    foreign = "café naïve Straße façade über 東京 夜景 雨 街 москва ночью снег 서울 야경 città Ελλάδα".split()
    return [" ".join(rng.choice(words if rng.random() < 0.8 else foreign) for _ in range(rng.randint(3, 16)))
            + rng.choice(["", ",", ".", "!", " —"]) for _ in range(400)]


@pytest.fixture(scope="module")
def spiece(tmp_path_factory):
    """A unigram sentencepiece model with umT5's special ids (pad 0, eos 1, unk 2), byte fallback."""
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=buf, model_type="unigram", vocab_size=480,
        hard_vocab_limit=False, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, byte_fallback=True,
        character_coverage=1.0, num_threads=1, minloglevel=2)
    path = tmp_path_factory.mktemp("tok") / "spiece.model"
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture(scope="module")
def state():
    """umt5-tiny weights, fp16-representable (so every form stores them exactly), tied alias dropped."""
    torch.manual_seed(0)
    model = registry.build("umt5-tiny")
    return {k: v.detach().half().float() for k, v in model.state_dict().items() if k != TIED}


def _reference_model(state):
    model = registry.build("umt5-tiny")
    model.load_state_dict({**state, TIED: state["shared.weight"]}, strict=True)
    return model.eval()


def wan_clean(text: str) -> str:
    """Wan's HuggingfaceTokenizer(clean='whitespace'), restated: basic_clean then whitespace_clean."""
    import ftfy
    import regex

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip()


def wan_tokenizer_of(spiece):
    """Wan's tokenizer for this sentencepiece model: Wan's HuggingfaceTokenizer is transformers'
    AutoTokenizer of google/umt5-xxl (T5's tokenizer), built here the same way from spiece.model
    (transformers converts it with protobuf)."""
    pytest.importorskip("google.protobuf")
    from transformers import AutoTokenizer

    folder = spiece.parent / "wan-tokenizer"
    folder.mkdir(exist_ok=True)
    (folder / "spiece.model").write_bytes(spiece.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))
    tok = AutoTokenizer.from_pretrained(str(folder))
    # Wan: tokenizer(clean(text), padding='max_length', truncation=True, max_length=512, add_special_tokens=True)
    return lambda text: tok(wan_clean(text), truncation=True, max_length=512, add_special_tokens=True).input_ids


def reference(state, spiece, prompts):
    """Wan's T5EncoderModel on the tiny weights: Wan's tokenizer's ids (ending </s>), padded to 512 with a
    mask, the encoder run on all 512, the real tokens kept and the rest zeroed (as Wan's DiT pads)."""
    wan_ids = wan_tokenizer_of(spiece)
    model = _reference_model(state)
    out = torch.zeros(len(prompts), 512, 32)
    for row, p in enumerate(prompts):
        ids = wan_ids(p)
        batch = torch.zeros(1, 512, dtype=torch.long)
        batch[0, : len(ids)] = torch.tensor(ids)
        mask = (torch.arange(512) < len(ids)).long()[None]
        with torch.no_grad():
            hidden = model(input_ids=batch, attention_mask=mask).last_hidden_state
        out[row, : len(ids)] = hidden[0, : len(ids)]
    return out


def write_comfy(path, state, spiece, dtype=torch.float16):
    tensors = {k: v.to(dtype) for k, v in state.items()}
    tensors["spiece_model"] = torch.frombuffer(bytearray(spiece.read_bytes()), dtype=torch.uint8)
    return save_safetensors(tensors, path)


def quantise(w: torch.Tensor):
    scale = w.abs().max() / 448.0  # e4m3fn's largest finite value
    return (w / scale).to(torch.float8_e4m3fn), scale.reshape(()).float()


def write_comfy_fp8(path, state, spiece, style="legacy", drop_scales=False):
    """ComfyUI's scaled fp8: legacy (`scaled_fp8` marker, `.scale_weight`, `.scale_input`) or the newer
    `.weight_scale` + `.comfy_quant` JSON; non-linear tensors stay fp16. Returns the dequantised state."""
    tensors, dequantised = {}, {}
    for k, v in state.items():
        layer = k.removesuffix(".weight")
        if layer.endswith(LINEARS):
            w8, scale = quantise(v)
            tensors[k] = w8
            dequantised[k] = w8.float() * scale
            if drop_scales:
                continue
            if style == "legacy":
                tensors[f"{layer}.scale_weight"] = scale
                tensors[f"{layer}.scale_input"] = torch.ones(())
            else:
                tensors[f"{layer}.weight_scale"] = scale
                tensors[f"{layer}.comfy_quant"] = torch.tensor(list(json.dumps({"format": "float8_e4m3fn"}).encode()), dtype=torch.uint8)
        else:
            tensors[k] = v.half()
            dequantised[k] = v.half().float()
    if style == "legacy":
        tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    tensors["spiece_model"] = torch.frombuffer(bytearray(spiece.read_bytes()), dtype=torch.uint8)
    save_safetensors(tensors, path)
    return dequantised


HF_CONFIG = {"architectures": ["UMT5ForConditionalGeneration"], "model_type": "umt5", "vocab_size": 512, "d_model": 32,
             "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
             "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128, "layer_norm_epsilon": 1e-6,
             "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}


def write_hf(folder, state, spiece, tokenizer_beside=True):
    """A Hugging Face folder: config.json, two shards + index (a full model: decoder and lm_head too), spiece.model."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    extra = {"decoder.final_layer_norm.weight": torch.ones(32), "lm_head.weight": torch.zeros(512, 32)}
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": {k: state[k] for k in keys[: len(keys) // 2]},
              "model-00002-of-00002.safetensors": {**{k: state[k] for k in keys[len(keys) // 2:]}, **extra}}
    weight_map = {}
    for name, tensors in shards.items():
        save_safetensors(tensors, folder / name)
        weight_map.update({k: name for k in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer_beside:
        (folder / "spiece.model").write_bytes(spiece.read_bytes())
        (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer", "extra_ids": 0}))
    return folder


@pytest.fixture(scope="module")
def want(state, spiece):
    return reference(state, spiece, PROMPTS)


@pytest.fixture(scope="module")
def comfy_file(tmp_path_factory, state, spiece):
    return write_comfy(tmp_path_factory.mktemp("comfy") / "umt5_tiny_fp16.safetensors", state, spiece)


# ---------------------------------------------------------------------------------------------
# umT5-XXL names and shapes, every form, at full size on the meta device


def _xxl_forms():
    meta = registry.build("umt5-xxl", device="meta")
    full = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    comfy = {k: s for k, s in full.items() if k != TIED}
    fp8 = dict(comfy, spiece_model=(4_300_000,), scaled_fp8=(0,))
    for k in comfy:
        if k.removesuffix(".weight").endswith(LINEARS):
            layer = k.removesuffix(".weight")
            fp8[f"{layer}.scale_weight"] = ()
            fp8[f"{layer}.scale_input"] = ()
    hf = dict(comfy, **{"decoder.block.0.layer.0.SelfAttention.q.weight": (4096, 4096), "lm_head.weight": (256384, 4096)})
    encoder_only = {k: s for k, s in full.items() if k != "shared.weight"}  # safetensors kept only the alias
    wan = to_wan(comfy, 24)
    return full, {"comfy-fp16": dict(comfy, spiece_model=(4_300_000,)), "comfy-fp8-scaled": fp8, "hf-full-model": hf,
                  "hf-encoder-alias-only": encoder_only, "wan-pth": wan}


def test_xxl_every_form_maps_onto_the_meta_model():
    full, forms = _xxl_forms()
    assert len(full) == 243 and full["shared.weight"] == (256384, 4096)
    assert full["encoder.block.23.layer.0.SelfAttention.relative_attention_bias.weight"] == (32, 64)  # one per layer
    assert full["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"] == (10240, 4096)
    assert sum(torch.Size(s).numel() for k, s in full.items() if k != TIED) == 5_680_910_336
    for name, shapes in forms.items():
        names = umt5.from_wan(shapes) if name == "wan-pth" else shapes
        assert umt5.model_shapes(names) == full, name
        assert umt5.infer_config(umt5.model_shapes(names)) == umt5.CONFIGS["umt5-xxl"], name
    with pytest.raises(CheckpointError, match="not Wan 2.1's umT5 encoder keys .*blocks.0.extra"):
        umt5.from_wan({**forms["wan-pth"], "blocks.0.extra.weight": (1,)})


def test_spec_and_list_cli(capsys):
    assert main(["model", "spec", "umt5-xxl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 243 and "shared.weight 256384x4096" in lines
    assert "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight 32x64" in lines
    assert main(["model", "list"]) == 0
    out = capsys.readouterr().out
    assert "umt5-xxl\tumt5" in out and "umt5-tiny\tumt5" in out


def test_identify_names_the_comfy_file(comfy_file, capsys):
    assert main(["model", "identify", str(comfy_file)]) == 0
    assert "umt5-tiny (family umt5)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# tokenization: Wan's cleaning, sentencepiece's ids, 512 at most


def test_tokens_equal_wans_tokenizer(comfy_file, spiece, caplog):
    """Our ids are those of Wan's tokenizer (transformers' T5 tokenizer); for ordinary text, sentencepiece's."""
    enc = umt5.load_umt5(comfy_file, dtype=torch.float32)
    wan_ids = wan_tokenizer_of(spiece)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spiece))
    prompts = PROMPTS + ["😀 emoji and ＦＵＬＬＷＩＤＴＨ", "\u00a0\u3000spaces\u2003of\u2028all kinds\u0085"]
    for prompt, ids in zip(prompts, enc.tokenize(prompts)):
        assert ids == wan_ids(prompt), prompt
        pieces = sp.encode(wan_clean(prompt))
        if not any(sp.is_byte(i) for i in pieces):  # every character in the vocabulary
            assert ids == pieces + [1], prompt
    assert enc.tokenize([""]) == [[1]]  # the empty prompt is its end token
    with caplog.at_level(logging.WARNING, logger="alaya_flash.model_zoo.umt5"):
        (ids,) = enc.tokenize([LONG])
    full = sp.encode(wan_clean(LONG))
    assert len(full) + 1 > 512 and ids == full[:511] + [1] == wan_ids(LONG) and len(ids) == 512
    assert f"a prompt of {len(full) + 1} tokens is cut to 512" in caplog.text


def test_special_token_text_and_unknown_characters_as_wans_tokenizer(spiece):
    """A prompt that spells `</s>`, `<pad>` or `<unk>` gets those tokens (ids 1, 0, 2), as in Wan's tokenizer,
    not their letters; a run of characters outside the vocabulary is one `<unk>`, not UTF-8 byte pieces
    (sentencepiece's byte fallback). Both checked against transformers' tokenizer of the same model."""
    tok = umt5.SentencePieceTokenizer.from_file(spiece)
    wan_ids = wan_tokenizer_of(spiece)
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spiece))
    assert tok(["</s>", "<pad>", "<unk>"]) == [[1, 1], [0, 1], [2, 1]]
    cases = ["a moonlit night </s> snow", "a </s>night<pad> x <unk>", "</s></s><unk><pad>", "  </s>  ", "a<pad>b",
             "snow ☃☃ and 😀 here", "x☃y", "☃<unk>☃", "q☃ ☃q", "</s", "<pad >", "<s> night", "Ελλάδα ✓ città",
             "the night</s>" + " misty river" * 300]
    for text in cases:
        assert tok([text])[0] == wan_ids(text), text
    assert 1 in tok(["night </s> snow"])[0][:-1] and 1 not in sp.encode("night </s> snow")  # sentencepiece spells it
    snowmen = tok(["☃☃"])[0]
    assert snowmen.count(2) == 1 and any(sp.is_byte(i) for i in sp.encode("☃☃"))


def test_whitespace_clean_matches_wan():
    regex = pytest.importorskip("regex")
    odd = "".join(chr(c) for c in range(0x3001) if regex.match(r"\s", chr(c)) or chr(c).isspace())
    for text in [f"a{odd}b", " \x1c\x1dx\x1f ", "caf\u00c3\u00a9 &amp;amp; “quotes”", "ｆｕｌｌ\twidth"]:
        assert umt5.clean_prompt(text) == wan_clean(text), repr(text)


# ---------------------------------------------------------------------------------------------
# every form gives Wan's output


def test_comfy_fp16_equals_wan(comfy_file, want):
    enc = umt5.load_umt5(comfy_file, dtype=torch.float32)
    got = enc(PROMPTS)
    assert got.shape == (len(PROMPTS), 512, 32) and got.dtype == torch.float32
    assert torch.allclose(got, want, atol=1e-5)
    n = len(enc.tokenize([PROMPTS[0]])[0])
    assert got[0, n:].abs().max() == 0 and got[0, n - 1].abs().max() > 0  # zero after the real tokens
    assert enc.text_dim == 32 and enc.encode([PROMPTS[0]])[0].shape == (n, 32)


def test_hf_sharded_folder_equals_wan(tmp_path, state, spiece, want):
    folder = write_hf(tmp_path / "umt5", state, spiece)
    assert torch.allclose(umt5.load_umt5(folder, dtype=torch.float32)(PROMPTS), want, atol=1e-5)
    by_index = umt5.load_umt5(folder / "model.safetensors.index.json", dtype=torch.float32)
    assert torch.allclose(by_index(PROMPTS[:1]), want[:1], atol=1e-5)
    # diffusers' layout: text_encoder/ (weights) beside tokenizer/ (spiece.model)
    te = write_hf(tmp_path / "wan-diffusers" / "text_encoder", state, spiece, tokenizer_beside=False)
    (tmp_path / "wan-diffusers" / "tokenizer").mkdir()
    (tmp_path / "wan-diffusers" / "tokenizer" / "spiece.model").write_bytes(spiece.read_bytes())
    assert torch.allclose(umt5.load_umt5(te, dtype=torch.float32)(PROMPTS[:2]), want[:2], atol=1e-5)


def test_wan_pth_converted_equals_wan(tmp_path, state, spiece, want, capsys):
    pth = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save(to_wan(state, 2), pth)
    out = tmp_path / "umt5_tiny.safetensors"
    assert main(["model", "convert", str(pth), str(out), "--tokenizer", str(spiece)]) == 0
    assert str(out) in capsys.readouterr().out
    assert torch.allclose(umt5.load_umt5(out, dtype=torch.float32)(PROMPTS), want, atol=1e-5)
    # the tokenizer may also come from its folder (Wan's google/umt5-xxl)
    assert main(["model", "convert", str(pth), str(tmp_path / "b.safetensors"), "--tokenizer", str(spiece.parent)]) == 0


@pytest.mark.parametrize("style", ["legacy", "comfy_quant"])
def test_fp8_scaled_within_quantisation_error(tmp_path, state, spiece, want, style):
    """Dequantised exactly (weight * scale): equal, within float rounding, to the reference run on the
    dequantised weights. Against the fp16 weights the difference is e4m3's rounding (3 mantissa bits,
    up to 1/16 of each weight): measured 4.6% of the output's norm (relative L2) on these weights,
    asserted below 10%."""
    path = tmp_path / "umt5_tiny_fp8_e4m3fn_scaled.safetensors"
    dequantised = write_comfy_fp8(path, state, spiece, style)
    got = umt5.load_umt5(path, dtype=torch.float32)(PROMPTS)
    assert torch.allclose(got, reference(dequantised, spiece, PROMPTS), atol=1e-5)
    rel = (got - want).norm() / want.norm()
    assert 0 < rel < 0.10, rel


def test_dtype_and_device_cast(comfy_file, want):
    enc = umt5.load_umt5(comfy_file, dtype=torch.bfloat16)  # Wan's t5_dtype, the default
    assert enc.model.shared.weight.dtype == torch.bfloat16
    assert umt5.load_umt5(comfy_file).model.shared.weight.dtype == torch.bfloat16
    got = enc(PROMPTS)
    assert got.dtype == torch.float32 and (got - want).norm() / want.norm() < 0.05


# ---------------------------------------------------------------------------------------------
# the padding convention, the DiT, the cache, release, the bundle's name


def test_batch_padding_and_the_dit(comfy_file, want):
    from alaya_flash.model_zoo.dit import DiTConfig, WanDiT

    enc = umt5.load_umt5(comfy_file, dtype=torch.float32)
    singles = torch.cat([enc([p]) for p in PROMPTS])
    assert torch.allclose(singles, want, atol=1e-5)  # batched (padded to the longest) == one at a time
    torch.manual_seed(0)
    dit = WanDiT(DiTConfig(dim=32, ffn_dim=64, freq_dim=32, text_dim=32, num_heads=2, num_layers=2, text_len=512)).eval()
    (tokens,) = enc.encode([PROMPTS[1]])
    with torch.no_grad():
        short, padded = dit.prepare_prompt(tokens[None]), dit.prepare_prompt(enc([PROMPTS[1]]))
    for a, b in zip(short.keys + short.values, padded.keys + padded.values):
        assert torch.equal(a, b)  # real tokens only or padded to 512: the same context in the DiT


def test_release_reloads(comfy_file, want):
    enc = umt5.load_umt5(comfy_file, dtype=torch.float32)
    first = enc(PROMPTS[:2])
    enc.release()
    assert enc.released and enc.model is None and not enc._cache
    assert torch.equal(enc(PROMPTS[:2]), first) and not enc.released
    bare = umt5.UMT5Encoder(enc.model, enc.tokenizer)
    bare.release()
    with pytest.raises(AlayaError, match="released"):
        bare(["x"])


def test_bundle_names_a_umt5_file(comfy_file, tmp_path):
    from alaya_flash.model_zoo import bundle

    name = f"umt5-xxl:{comfy_file}"
    assert name in bundle.TEXT_ENCODERS and "umt5-xxl:" not in bundle.TEXT_ENCODERS
    assert "all-minilm-l6-v2" in bundle.TEXT_ENCODERS and "bert" not in bundle.TEXT_ENCODERS
    enc = bundle.load_text_encoder(name)
    assert isinstance(enc, umt5.UMT5Encoder) and enc(["a"]).shape == (1, 512, 32)
    flash = bundle.make_random_flash(text_encoder=name)
    assert flash.dit.config.text_dim == 32 and flash.text_encoder() is enc
    bundle.save_flash(flash, tmp_path / "m")  # a model folder's config.json names the file
    assert bundle.load_flash_folder(tmp_path / "m", dtype=torch.float32).text_encoder_name == name
    with pytest.raises(AlayaError, match="unknown"):
        bundle.load_text_encoder("umt5-small:/x")


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the file or key


def test_refuses_what_is_no_umt5_form(tmp_path, state):
    other = save_safetensors({"blocks.0.self_attn.q.weight": torch.zeros(4, 4)}, tmp_path / "dit.safetensors")
    with pytest.raises(CheckpointError, match=r"dit.safetensors: none of the umT5 forms: no shared.weight"):
        umt5.load_umt5(other)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="junk.safetensors: not a readable safetensors file"):
        umt5.load_umt5(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty: none of the umT5 forms: no model.safetensors"):
        umt5.load_umt5(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="nowhere.safetensors: no such umT5 file"):
        umt5.load_umt5(tmp_path / "nowhere.safetensors")
    t5 = write_hf(tmp_path / "t5", state, tmp_path / "x", tokenizer_beside=False)
    (t5 / "config.json").write_text(json.dumps(dict(HF_CONFIG, model_type="t5")))
    with pytest.raises(CheckpointError, match="config.json: model_type is 't5', expected 'umt5'"):
        umt5.load_umt5(t5)
    short = {k: v for k, v in state.items() if "block.1.layer.1.DenseReluDense.wo" not in k}
    with pytest.raises(CheckpointError, match=r"1 missing \(encoder.block.1.layer.1.DenseReluDense.wo.weight\)"):
        umt5.load_umt5(save_safetensors(short, tmp_path / "short.safetensors"), tokenizer=None)


def test_refuses_a_missing_shard(tmp_path, state, spiece):
    folder = write_hf(tmp_path / "umt5", state, spiece)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: shard model-00002-of-00002.safetensors "
                                              r"\(holding .* and \d+ more\) is missing"):
        umt5.load_umt5(folder)


def test_refuses_a_tokenizer_of_another_vocabulary(tmp_path, state, spiece):
    for rows in (256, 2048):  # fewer rows than pieces; far more rows than pieces
        wrong = dict(state, **{"shared.weight": torch.zeros(rows, 32)})
        path = write_comfy(tmp_path / f"rows{rows}.safetensors", wrong, spiece)
        with pytest.raises(CheckpointError, match=rf"the tokenizer has \d+ pieces but .*rows{rows}.safetensors's "
                                                  rf"embedding \(shared.weight\) has {rows} rows"):
            umt5.load_umt5(path)
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="bad.model: not a sentencepiece model"):
        umt5.load_umt5(write_comfy(tmp_path / "ok.safetensors", state, spiece), tokenizer=bad)
    no_tok = save_safetensors({k: v.half() for k, v in state.items()}, tmp_path / "no_tok.safetensors")
    with pytest.raises(CheckpointError, match="no_tok.safetensors: no tokenizer: the file has no spiece_model"):
        umt5.load_umt5(no_tok)
    assert umt5.load_umt5(no_tok, dtype=torch.float32, tokenizer=spiece)(["a"]).shape == (1, 512, 32)


def test_refuses_fp8_without_scales(tmp_path, state, spiece):
    path = tmp_path / "unscaled.safetensors"
    write_comfy_fp8(path, state, spiece, drop_scales=True)
    with pytest.raises(CheckpointError, match=r"unscaled.safetensors: encoder.block.0.layer.0.SelfAttention.[qkvo].weight is "
                                              r"stored as F8_E4M3 with no scale"):
        umt5.load_umt5(path)
    odd = tmp_path / "odd_quant.safetensors"
    write_comfy_fp8(odd, state, spiece, style="comfy_quant")
    from safetensors.torch import load_file

    tensors = load_file(str(odd))
    key = "encoder.block.0.layer.0.SelfAttention.q.comfy_quant"
    tensors[key] = torch.tensor(list(json.dumps({"format": "nvfp4"}).encode()), dtype=torch.uint8)
    save_safetensors(tensors, odd)
    with pytest.raises(CheckpointError, match="SelfAttention.q.weight is quantised as 'nvfp4'"):
        umt5.load_umt5(odd)


def test_wan_pth_loads_directly_tensors_only(tmp_path, state, spiece, want, monkeypatch):
    """Wan's models_t5_umt5-xxl-enc-bf16.pth is read as it is (no convert step): tensors only, every
    torch.load with weights_only=True, the tokenizer from google/umt5-xxl/ beside it or given."""
    pth = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save(to_wan(state, 2), pth)
    loads = []
    real_load = torch.load

    def checked_load(*args, **kwargs):
        loads.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", checked_load)
    assert torch.allclose(umt5.load_umt5(pth, dtype=torch.float32, tokenizer=spiece)(PROMPTS), want, atol=1e-5)
    with pytest.raises(CheckpointError, match="models_t5_umt5-xxl-enc-bf16.pth: no tokenizer beside it .*google/umt5-xxl/spiece.model"):
        umt5.load_umt5(pth)
    (tmp_path / "google" / "umt5-xxl").mkdir(parents=True)
    (tmp_path / "google" / "umt5-xxl" / "spiece.model").write_bytes(spiece.read_bytes())
    assert torch.allclose(umt5.load_umt5(pth, dtype=torch.float32)(PROMPTS[:2]), want[:2], atol=1e-5)
    assert umt5.text_dim_of(pth) == 32
    from alaya_flash.model_zoo import bundle

    assert torch.allclose(bundle.load_text_encoder(f"umt5-xxl:{pth}")(PROMPTS[:1]), want[:1], atol=0.05)  # bf16
    # a pickle under another name is told apart by its content; a folder's pickle is passed as itself
    disguised = tmp_path / "disguised.safetensors"
    disguised.write_bytes(pth.read_bytes())
    assert torch.allclose(umt5.load_umt5(disguised, dtype=torch.float32, tokenizer=spiece)(PROMPTS[:1]), want[:1], atol=1e-5)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "pytorch_model.bin").write_bytes(pth.read_bytes())
    with pytest.raises(CheckpointError, match="only the pickle pytorch_model.bin: pass that file itself"):
        umt5.load_umt5(tmp_path / "folder")
    with pytest.raises(CheckpointError, match="not a pickle"):
        umt5.load_umt5(write_comfy(tmp_path / "ok.safetensors", state, spiece), tokenizer=pth)
    assert loads and all(w is True for w in loads)


def test_convert_refuses_bad_input(tmp_path, state, spiece, capsys):
    pth = tmp_path / "enc.pth"
    torch.save(to_wan(state, 2), pth)
    assert main(["model", "convert", str(pth), str(tmp_path / "o.safetensors")]) == 2
    assert "Wan's .pth carries no tokenizer; pass --tokenizer" in capsys.readouterr().err
    torch.save({**to_wan(state, 2), "head.weight": torch.zeros(1)}, pth)
    assert main(["model", "convert", str(pth), str(tmp_path / "o.safetensors"), "--tokenizer", str(spiece)]) == 2
    assert "not Wan 2.1's umT5 encoder keys (head.weight)" in capsys.readouterr().err
    torch.save({"weights": [1, 2]}, pth)
    assert main(["model", "convert", str(pth), str(tmp_path / "o.safetensors"), "--tokenizer", str(spiece)]) == 2
    assert "expected a state dict" in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()
