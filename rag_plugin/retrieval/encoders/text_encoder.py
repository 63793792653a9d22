"""TextEncoder: a tokenizer and two towers that turn questions and passages into vectors.

Tokenization (queries as ``[CLS] q [SEP]``; passages in the encoder's passage format),
batched encoding to float32 arrays, and :meth:`TextEncoder.identity`, the JSON record of
an encoder a knowledge source keeps (settings, vocabulary and weight hashes).

Passage input formats:

* ``"joined"`` (MiniLM, random by default): one sequence ``"{title}. {text}"``
  (``"{title} {text}"`` when the title already ends in punctuation; the bare text
  when the title is empty), ``[CLS] ... [SEP]``.
* ``"pair"`` (DPR): the pair ``[CLS] title [SEP] text [SEP]``, truncated longest
  first, with all token type ids 0 -- DPR trained and indexed with zero segment
  ids. An empty title gives the single sequence ``[CLS] text [SEP]``.

Queries are always single sequences. All token type ids are 0.

Where and how precisely the towers run when they embed: :meth:`TextEncoder.for_embedding` (a device; ``fp16``:
the forward in half precision under autocast, the vectors returned float32, the weights and so the identity
unchanged).
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from rag_plugin.retrieval.encoders.bert import BiEncoderTower
from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.retrieval.encoders.wordpiece import tokenizer_lowercases
from rag_plugin.util.errors import UserError

PASSAGE_FORMATS = ("joined", "pair")


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
        self.fp16 = False  # the forward in float16 when encoding (:meth:`for_embedding`)

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

    def for_embedding(self, device=None, fp16: bool = False) -> "TextEncoder":
        """Encode on ``device`` (both towers moved there; None: where they are), and with ``fp16`` in half
        precision: the towers' forward under float16 autocast (matrix products in float16, normalisations in
        float32), the vectors returned float32 as always. The weights stay float32, so the encoder's identity (its
        weight hashes) is unchanged; the vectors differ from float32 ones by float16 rounding. Returns self."""
        if device is not None:
            self.to(device)
        self.fp16 = bool(fp16)
        return self

    def precision(self, device):
        """The context the towers run in on ``device`` when encoding: float16 autocast with ``fp16``, else none."""
        if not self.fp16:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=torch.float16)

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
            return [(t, x) if t else x for t, x in zip(titles, texts, strict=True)]
        return [join_title(t, x) for t, x in zip(titles, texts, strict=True)]

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
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        out = np.empty((len(token_ids), tower.dim), dtype=np.float32)
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
        device = next(tower.parameters()).device
        was_training = tower.training
        tower.eval()
        try:
            with torch.inference_mode(), self.precision(device), tqdm(total=len(order), unit=unit.rstrip("s"),
                                                                      desc=f"encoding {unit}",
                                                                      disable=not progress) as bar:
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
            "lowercase": tokenizer_lowercases(self.tokenizer),
            "shared_towers": self.shared_towers,
            "vocab_sha256": hashlib.sha256(vocab_text.encode("utf-8")).hexdigest(),
            "weights_sha256": both,
            "passage_weights_sha256": passage_sha,
            "query_weights_sha256": query_sha,
        }


def join_title(title: Optional[str], text: str) -> str:
    """``"{title}. {text}"``; no extra period after punctuation; the text alone without a title."""
    title = (title or "").strip()
    if not title:
        return text
    return f"{title} {text}" if title[-1] in ".!?:;" else f"{title}. {text}"

