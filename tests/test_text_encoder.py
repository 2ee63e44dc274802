"""The prompt encoder: checkpoint-faithful MiniLM equals sentence-transformers, and means meaning."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError, CheckpointError
from alaya_flash.model_zoo.loading import read_shapes
from alaya_flash.model_zoo.text_encoder import TextEncoder, _position_ids_checked, default_model_dir

DATA = Path(__file__).parent / "data"
# The prompts of data/minilm-l6-v2-reference.safetensors: embeddings recorded from the hand-written
# BERT this encoder replaced (transformers' BertModel now); the two agreed within 2e-7.
RECORDED_PROMPTS = [
    "a bright sunny afternoon with hard shadows",
    "midday under a clear sky, strong sunlight",
    "a moonlit night, cold blue light",
    "neon-lit cyberpunk street at night, pink and cyan glow",
    "",
    "A",
    "Café in Straße, 東京の夜景, москва ночью — naïve façade!",
    "rainy   street\twith\nreflections",
    " ".join(["a long winding road through the misty forest at dawn"] * 40),  # > 256 tokens: truncated
    "UPPER case Prompt With Numbers 1234 and symbols #@!",
]

PROMPTS = [
    "a bright sunny afternoon with hard shadows",
    "midday under a clear sky, strong sunlight",
    "a moonlit night, cold blue light",
    "neon-lit cyberpunk street at night, pink and cyan glow",
]


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder.load()


def test_matches_sentence_transformers(encoder):
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(default_model_dir()), device="cpu")
    want = ref.encode(PROMPTS, convert_to_tensor=True, normalize_embeddings=True)
    got = encoder.embed(PROMPTS)
    assert torch.allclose(got, want, atol=1e-5)


def test_paraphrases_are_nearest(encoder):
    e = encoder.embed(PROMPTS)
    sim = e @ e.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[0, 3]
    assert sim[2, 3] < sim[0, 1]


def test_context_shape_and_cache(encoder):
    ctx = encoder(["a moonlit night", "a moonlit night"])
    assert ctx.shape == (2, 1, encoder.text_dim)
    assert torch.equal(ctx[0], ctx[1])
    small = TextEncoder(encoder.model, encoder.tokenizer, cache_size=2)
    out = small(["a", "b", "c"])  # more prompts than the cache holds still works
    assert out.shape == (3, 1, 384) and len(small._cache) == 2


def test_word_token_context_starts_with_the_sentence_embedding(encoder):
    """all-minilm-l6-v2+tokens: the sentence embedding, then each token's unit output, zeros after the
    prompt; the same prompt alone or in a batch gives the same context; a long prompt keeps its first
    CONTEXT_TOKENS tokens after the sentence embedding of all of it."""
    from alaya_flash.model_zoo.text_encoder import CONTEXT_TOKENS, sentence_embedding

    tokens = TextEncoder(encoder.model, encoder.tokenizer, tokens=CONTEXT_TOKENS)
    assert tokens.text_len == 1 + CONTEXT_TOKENS
    ctx = tokens(PROMPTS[:2] + [RECORDED_PROMPTS[8]])
    assert ctx.shape == (3, 1 + CONTEXT_TOKENS, 384)
    assert torch.equal(ctx[:, 0], encoder(PROMPTS[:2] + [RECORDED_PROMPTS[8]])[:, 0])
    assert torch.equal(sentence_embedding(ctx), ctx[:, 0])
    n = len(encoder.tokenizer.encode(PROMPTS[0]).ids)  # [CLS] ... [SEP]
    norms = ctx[0, 1:].norm(dim=-1)
    assert torch.allclose(norms[:n], torch.ones(n), atol=1e-5) and not norms[n:].any()
    assert ctx[2, 1:].norm(dim=-1).min() > 0.99  # a prompt of 256 tokens fills every slot
    assert torch.equal(tokens([PROMPTS[1]])[0], ctx[1])


def test_word_tokens_tell_apart_the_sides_the_sentence_embedding_merges(encoder):
    """Captions that differ only in the sun's side: pooled they nearly coincide, at the side's token
    they differ about as much as two presets' sentence embeddings (docs/text-encoder.md)."""
    from alaya_flash.model_zoo.text_encoder import CONTEXT_TOKENS
    from alaya_flash.streaming.world.traced.presets import TRACED_PRESETS, caption

    tokens = TextEncoder(encoder.model, encoder.tokenizer, tokens=CONTEXT_TOKENS)
    left, right = tokens([caption(TRACED_PRESETS["bright_sunny"], "street", side) for side in ("left", "right")])
    pooled = float((left[0] - right[0]).norm())
    words = float((left[1:] - right[1:]).norm(dim=-1).max())
    presets = tokens([caption(TRACED_PRESETS[name], "street", "left") for name in ("bright_sunny", "sunset_dramatic")])
    assert pooled < 0.05 and words > 10 * pooled and words > 0.5 * float((presets[0, 0] - presets[1, 0]).norm())


def test_bad_inputs(encoder, tmp_path):
    with pytest.raises(AlayaError, match="list of prompt strings"):
        encoder.embed("not a list")
    with pytest.raises(AlayaError, match="model.safetensors is missing"):
        TextEncoder.load(tmp_path)


def test_equals_the_recorded_embeddings(encoder):
    from safetensors.torch import load_file

    want = load_file(str(DATA / "minilm-l6-v2-reference.safetensors"))["embeddings"]
    assert torch.allclose(encoder.embed(RECORDED_PROMPTS), want, atol=1e-5)
    assert torch.allclose(torch.cat([encoder.embed([p]) for p in RECORDED_PROMPTS]), want, atol=1e-5)


def test_transformers_bert_every_weight_used(encoder):
    from transformers import BertModel

    assert isinstance(encoder.model, BertModel) and encoder.text_dim == 384
    stored = set(read_shapes(default_model_dir() / "model.safetensors"))
    assert stored - {"embeddings.position_ids"} == set(encoder.model.state_dict())  # strict: none missing, none left
    check = _position_ids_checked(Path("model.safetensors"))
    assert check({"embeddings.position_ids": torch.arange(512)[None], "x": torch.ones(1)}).keys() == {"x"}
    with pytest.raises(CheckpointError, match="model.safetensors: embeddings.position_ids is not 0, 1, 2"):
        check({"embeddings.position_ids": torch.arange(512).flip(0)})


def test_refuses_a_non_bert_folder(tmp_path):
    shutil.copy(default_model_dir() / "tokenizer.json", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(CheckpointError, match="config.json: model_type is 't5'; this text encoder reads BERT"):
        TextEncoder.load(tmp_path)
