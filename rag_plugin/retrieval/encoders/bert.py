"""A plain-torch BERT and the bi-encoder tower built on it.

:class:`BertConfig` (sizes, read from a Hugging Face ``config.json`` or off a state dict),
the post-LayerNorm BERT layers with Hugging Face's parameter names, :class:`BertModel`
(no pooler), and :class:`BiEncoderTower` (BERT -> CLS or mean pooling -> optional projection
-> optional L2 normalisation), the module each side of a retrieval encoder is.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from rag_plugin.util.errors import UserError

POOLINGS = ("cls", "mean")


@dataclass
class BertConfig:
    """Sizes of a BERT encoder (names follow the paper; see :meth:`from_hf` for HF's)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise UserError(f"hidden size {self.hidden_size} is not a multiple of "
                            f"the number of attention heads {self.num_heads}")
        if self.hidden_act not in _ACTIVATIONS:
            raise UserError(f"unsupported hidden_act {self.hidden_act!r}",
                            fix=f"use one of {', '.join(sorted(_ACTIVATIONS))}")

    @classmethod
    def from_hf(cls, cfg: Mapping, source: Optional[os.PathLike] = None) -> "BertConfig":
        """Build from a Hugging Face ``config.json`` dict (BERT or DPR)."""
        try:
            return cls._from_hf(cfg)
        except KeyError as err:
            raise UserError(f"config lacks the field {err.args[0]!r}", path=source,
                            fix="use the config.json written with the weights") from None
        except (TypeError, ValueError) as err:
            raise UserError(f"bad config: {err}", path=source) from None

    @classmethod
    def _from_hf(cls, cfg: Mapping) -> "BertConfig":
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            intermediate_size=int(cfg["intermediate_size"]),
            max_position=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            hidden_act=str(cfg.get("hidden_act", "gelu")),
            hidden_dropout=float(cfg.get("hidden_dropout_prob", 0.1)),
            attention_dropout=float(cfg.get("attention_probs_dropout_prob", 0.1)),
        )

    def to_hf(self) -> Dict:
        """The Hugging Face ``config.json`` fields for this configuration."""
        return {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position,
            "type_vocab_size": self.type_vocab_size,
            "layer_norm_eps": self.layer_norm_eps,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "initializer_range": 0.02,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
        }

    @classmethod
    def infer(cls, state: Mapping[str, torch.Tensor], num_heads: Optional[int] = None,
              source: Optional[str] = None) -> "BertConfig":
        """Read the sizes off a (prefix-free) BERT state dict.

        The number of heads is not visible in the shapes: it defaults to
        ``hidden_size // 64`` (every published BERT/DPR checkpoint).
        """
        try:
            vocab, hidden = state["embeddings.word_embeddings.weight"].shape
            max_position = state["embeddings.position_embeddings.weight"].shape[0]
            type_vocab = state["embeddings.token_type_embeddings.weight"].shape[0]
            inter = state["encoder.layer.0.intermediate.dense.weight"].shape[0]
        except KeyError as err:
            raise UserError(f"not a BERT state dict: key {err.args[0]!r} is missing", path=source) from None
        layers = 1 + max(int(m.group(1)) for k in state
                         if (m := re.match(r"encoder\.layer\.(\d+)\.", k)))
        if num_heads is None:
            if hidden % 64:
                raise UserError(f"cannot infer the number of attention heads for hidden "
                                f"size {hidden}", path=source, fix="add heads=N to the spec")
            num_heads = hidden // 64
        return cls(vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=num_heads,
                   intermediate_size=inter, max_position=max_position, type_vocab_size=type_vocab)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": _gelu_tanh, "gelu_pytorch_tanh": _gelu_tanh,
                "relu": F.relu}


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, LayerNorm, dropout."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids``, ``token_type_ids``: LongTensor[B, L] -> FloatTensor[B, L, H]."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)[None]
             + self.token_type_embeddings(token_type_ids))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head attention projections; the product runs in ``scaled_dot_product_attention``."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_dropout

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, length, h = x.shape
        return x.view(b, length, self.num_heads, h // self.num_heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], queries: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        """``x``: [B, L, H]; ``mask``: BoolTensor[B, 1, 1, L] (True = attend) -> [B, L', H]: attention
        of ``queries`` ([B, L', H], default ``x``) over ``x``."""
        queries = x if queries is None else queries
        q, k, v = self._split(self.query(queries)), self._split(self.key(x)), self._split(self.value(x))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0)
        return out.transpose(1, 2).reshape(queries.shape)


class BertSelfOutput(nn.Module):
    """Attention output projection with residual and post-LayerNorm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], queries: Optional[torch.Tensor] = None
                ) -> torch.Tensor:
        queries = x if queries is None else queries
        return self.output(self.self(x, mask, queries), queries)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = _ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    """Feed-forward output projection with residual and post-LayerNorm."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], first_token_only: bool = False
                ) -> torch.Tensor:
        """[B, L, H] -> [B, L, H], or [B, 1, H] (position 0 alone) with ``first_token_only``."""
        x = self.attention(x, mask, x[:, :1] if first_token_only else None)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], first_token_only: bool = False,
                start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Layers ``start`` to ``stop`` (all by default) on ``x``. ``first_token_only``: the last layer of
        the stack computes position 0 alone (its keys and values still read every position): what CLS
        pooling uses, at a fraction of the last layer's cost."""
        last = len(self.layer) - 1
        stop = len(self.layer) if stop is None else stop
        for i in range(start, stop):
            x = self.layer[i](x, mask, first_token_only and i == last)
        return x


class BertModel(nn.Module):
    """Post-LN BERT encoder without pooler; parameter names match Hugging Face's BertModel."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, first_token_only: bool = False,
                stop: Optional[int] = None) -> torch.Tensor:
        """``input_ids``: LongTensor[B, L]; ``attention_mask``: [B, L] (1 = token, 0 = pad);
        ``token_type_ids``: LongTensor[B, L] or None (zeros) -> hidden states FloatTensor[B, L, H]
        ([B, 1, H], position 0's, with ``first_token_only``; see :meth:`BertEncoder.forward`);
        ``stop``: the states after the embeddings and the first ``stop`` layers only.
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask, first_token_only, stop=stop)

    def continue_from(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int,
                      first_token_only: bool = False) -> torch.Tensor:
        """The remaining layers on ``hidden`` [B, L, H], the states after the first ``start`` layers
        (``forward(..., stop=start)``): the same result as ``forward`` from the start."""
        mask = attention_mask.bool()[:, None, None, :]
        return self.encoder(hidden, mask, first_token_only, start=start)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float = 0.02) -> None:
        """BERT initialisation (normal(0, std) matrices, zero biases, unit LayerNorm), seeded."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()


class BiEncoderTower(nn.Module):
    """One side of a bi-encoder: BERT -> pooling -> optional projection -> optional L2 norm.

    Attribute names mirror DPR's ``DPREncoder`` (``bert_model``, ``encode_proj``), so a
    Hugging Face DPR state dict without its ``question_encoder.``/``ctx_encoder.`` prefix
    loads directly.
    """

    def __init__(self, cfg: BertConfig, pooling: str = "cls", normalize: bool = False,
                 projection_dim: int = 0):
        super().__init__()
        if pooling not in POOLINGS:
            raise UserError(f"unknown pooling {pooling!r}", fix=f"use one of {', '.join(POOLINGS)}")
        self.bert_model = BertModel(cfg)
        self.pooling = pooling
        self.normalize = bool(normalize)
        self.encode_proj = nn.Linear(cfg.hidden_size, projection_dim) if projection_dim > 0 else None

    @property
    def dim(self) -> int:
        """Size D of the output vectors."""
        if self.encode_proj is not None:
            return self.encode_proj.out_features
        return self.bert_model.config.hidden_size

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``hidden``: [B, L, H], ``attention_mask``: [B, L] -> [B, H].

        ``cls`` takes position 0 (DPR); ``mean`` averages the non-padding positions
        (sentence-transformers).
        """
        if self.pooling == "cls":
            return hidden[:, 0]
        m = attention_mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """LongTensor[B, L] x3 -> FloatTensor[B, D]."""
        # CLS pooling reads position 0 alone: the last layer computes nothing else
        hidden = self.bert_model(input_ids, attention_mask, token_type_ids, first_token_only=self.pooling == "cls")
        return self._head(hidden, attention_mask)

    def lower_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     token_type_ids: Optional[torch.Tensor] = None, layers: int = 0) -> torch.Tensor:
        """The hidden states after the embeddings and the first ``layers`` layers: FloatTensor[B, L, H]."""
        return self.bert_model(input_ids, attention_mask, token_type_ids, stop=layers)

    def forward_from(self, hidden: torch.Tensor, attention_mask: torch.Tensor, start: int) -> torch.Tensor:
        """The tower's vectors [B, D] from :meth:`lower_states` ``(..., layers=start)``: the layers above, the
        pooling, projection and norm (what :meth:`forward` computes, from a cache of the lower layers)."""
        hidden = self.bert_model.continue_from(hidden, attention_mask, start,
                                               first_token_only=self.pooling == "cls")
        return self._head(hidden, attention_mask)

    def _head(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.pool(hidden, attention_mask)
        if self.encode_proj is not None:
            out = self.encode_proj(out)
        if self.normalize:
            out = F.normalize(out, p=2, dim=-1)
        return out


def new_tower(cfg: BertConfig, pooling: str, normalize: bool, projection_dim: int = 0
               ) -> BiEncoderTower:
    """A tower with uninitialised CPU storage (built on the meta device: no RNG use)."""
    with torch.device("meta"):
        tower = BiEncoderTower(cfg, pooling, normalize, projection_dim)
    return tower.to_empty(device="cpu")
