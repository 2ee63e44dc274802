"""The prompt encoder: checkpoint-faithful MiniLM equals sentence-transformers, and means meaning."""
import pytest
import torch

from alaya_flash.model_zoo.errors import AlayaError
from alaya_flash.model_zoo.text_encoder import TextEncoder, default_model_dir

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


def test_bad_inputs(encoder, tmp_path):
    with pytest.raises(AlayaError, match="list of prompt strings"):
        encoder.embed("not a list")
    with pytest.raises(AlayaError, match="model.safetensors is missing"):
        TextEncoder.load(tmp_path)
