"""The cross-encoder reranker (``--reranker cross``): a BERT reads the question and the passage together.

Each candidate is one sequence ``[CLS] question [SEP] title-and-text [SEP]``: the question as the batch carries it
(``RerankBatch.query_tokens``, the knowledge source's encoder tokens), the passage tokenized as that encoder
tokenizes passages (its passage format, ``joined`` or ``pair``) without its leading ``[CLS]``; token type 0 over the
question, 1 over the passage (all 0 for an encoder with one token type). A pair longer than ``max_length`` (the
knowledge encoder's, capped by the BERT's positions) is cut from the passage's end, keeping its final ``[SEP]``; the
question is kept whole (cut only where it would leave no room for a passage token).

The score is a correction added to the first stage's logit::

    score(x, z) = w . h_CLS(x, z) + b + first_stage(x, z)      (w, b start at zero; first_stage detached)

so at initialisation the reranker keeps the first stage's order and its p(z|x) exactly, and what it learns (through
the marginal, and through every ``--retriever-loss``, e.g. towards the reader's posterior with the PDist target) is
what reading the question and the passage together adds. The reason: a BERT bi-encoder checkpoint (the knowledge
source's encoder, DPR, MiniLM) has no trained cross-encoder head, and a randomly initialised head would reorder the
candidates at random until it is trained.

The BERT starts from ``--cross-encoder``: ``knowledge`` (default), a copy of the knowledge source's encoder's query
tower's BERT (its weights copied, never shared), or an encoder spec read with
:func:`~rag_plugin.retrieval.encoders.load_encoder` (its query tower's BERT), which must have the knowledge encoder's
vocabulary: the questions arrive in that encoder's tokens. The BERT and the head are the reranker's submodules (saved
with the model, trained by its optimizer); the BERT learns at the query encoder's learning-rate scale.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from rag_plugin.optim.lr_scale import resolved_scale, scale_learning_rate
from rag_plugin.reranking.base import RerankBatch, Reranker, register_reranker
from rag_plugin.retrieval.encoders.bert import BertModel
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError

#: pairs per BERT forward
CHUNK = 64


class _PassageIds(SharedOnCopy):
    """The knowledge encoder's passage tokenization, shared (not copied) when the model is deep-copied (EMA)."""

    def __init__(self, text_encoder):
        self.text_encoder = text_encoder

    def __call__(self, titles: Sequence[Optional[str]], texts: Sequence[str]) -> List[List[int]]:
        return self.text_encoder.tokenize_passages(titles, texts)


class CrossEncoderReranker(Reranker):
    """``bert`` reads ``[CLS] q [SEP] passage [SEP]``; score = ``head(h_CLS)`` + the first stage's logit (see the
    module docstring). ``text_encoder``: the knowledge source's :class:`~rag_plugin.retrieval.encoders.TextEncoder`
    (its tokenizer's ``[CLS]``/``[SEP]``, its passage tokenization, its ``max_length``). ``max_length``: the pair's
    length bound (default the text encoder's, capped by ``bert``'s positions). ``chunk``: pairs per forward."""

    name = "cross"
    trainable = True

    def __init__(self, bert: BertModel, text_encoder, max_length: Optional[int] = None, chunk: int = CHUNK):
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(bert.config.hidden_size, 1)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()
        self._passage_ids = _PassageIds(text_encoder)
        tokenizer = text_encoder.tokenizer
        self.cls_id, self.sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
        self.pad_id = text_encoder.pad_id
        limit = min(text_encoder.max_length, bert.config.max_position)
        self.max_length = limit if max_length is None else min(int(max_length), limit)
        if self.max_length < 4:
            raise ValueError(f"a pair length of {self.max_length} leaves no room for a question and a passage")
        self.chunk = int(chunk)
        self.passage_type = 1 if bert.config.type_vocab_size > 1 else 0

    # ---------------------------------------------------------------- inputs
    def pair_ids(self, question: Sequence[int], passage: Sequence[int]) -> Tuple[List[int], int]:
        """``question`` (``[CLS] q [SEP]``) and ``passage`` (``[CLS] p [SEP]``, as the knowledge encoder tokenizes it)
        -> (the pair's ids ``[CLS] q [SEP] p [SEP]`` within ``max_length``, the number of question tokens)."""
        question, passage = list(question), list(passage)
        room = self.max_length - 2  # the question leaves at least one passage token and the final [SEP]
        if len(question) > room:
            question = question[:room - 1] + question[-1:]
        if passage and passage[0] == self.cls_id:
            passage = passage[1:]
        if not passage or passage[-1] != self.sep_id:
            passage = passage + [self.sep_id]
        keep = self.max_length - len(question)
        if len(passage) > keep:
            passage = passage[:keep - 1] + passage[-1:]
        return question + passage, len(question)

    def pairs(self, model, batch: RerankBatch) -> List[Tuple[List[int], int]]:
        """The B x L pairs, row-major (question b's candidates l = 0..L-1 at b * L + l)."""
        if batch.query_tokens is None:
            raise ValueError("the cross-encoder reads the questions in the knowledge encoder's tokens: "
                             "RerankBatch.query_tokens is None")
        store = model.retriever.store
        flat = batch.rows.reshape(-1).tolist()
        passages = self._passage_ids([store.title(r) for r in flat], [store.text(r) for r in flat])
        tokens, mask = batch.query_tokens.cpu(), batch.query_mask
        mask = tokens.ne(self.pad_id) if mask is None else mask.cpu().bool()
        questions = [tokens[b][mask[b]].tolist() for b in range(tokens.shape[0])]
        width = batch.rows.shape[1]
        return [self.pair_ids(questions[i // width], p) for i, p in enumerate(passages)]

    def collate(self, pairs: Sequence[Tuple[List[int], int]], device) -> Tuple[torch.Tensor, ...]:
        """-> (input_ids, attention_mask, token_type_ids) LongTensor[N, longest] on ``device``."""
        longest = max(len(ids) for ids, _ in pairs)
        input_ids = torch.full((len(pairs), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(pairs), longest), dtype=torch.long)
        types = torch.zeros((len(pairs), longest), dtype=torch.long)
        for row, (ids, n_question) in enumerate(pairs):
            input_ids[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            mask[row, :len(ids)] = 1
            types[row, n_question:len(ids)] = self.passage_type
        return input_ids.to(device), mask.to(device), types.to(device)

    # ---------------------------------------------------------------- scores
    def pair_logits(self, pairs: Sequence[Tuple[List[int], int]]) -> torch.Tensor:
        """The head on each pair's [CLS] state: [N], float32 (float64 for a float64 model), in ``pairs``' order.
        Pairs of like length share a forward (``chunk`` at a time)."""
        device = self.head.weight.device
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]))
        parts = []
        for start in range(0, len(order), self.chunk):
            ids, mask, types = self.collate([pairs[i] for i in order[start:start + self.chunk]], device)
            cls_state = self.bert(ids, mask, types, first_token_only=True)[:, 0]
            parts.append(self.head(cls_state).squeeze(-1))
        logits = torch.cat(parts)
        logits = logits if logits.dtype == torch.float64 else logits.float()
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.as_tensor(order, dtype=torch.long)] = torch.arange(len(order))
        return logits[inverse.to(device)]

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:
        """[B, L] logits of p(z|x): the head's correction + the first stage's (detached) logit."""
        b, width = batch.rows.shape
        logits = self.pair_logits(self.pairs(model, batch)).view(b, width)
        first = batch.first_stage.detach()
        with torch.autocast(device_type=logits.device.type, enabled=False):
            return logits + first.to(logits.device, logits.dtype)


def bottom_layers(bert: BertModel, layers: int) -> BertModel:
    """``--cross-encoder-layers N``: the BERT's embeddings and its bottom N layers (0 or more than it has: all)."""
    total = len(bert.encoder.layer)
    if layers <= 0 or layers >= total:
        return bert
    bert.encoder.layer = bert.encoder.layer[:layers]
    bert.config = dataclasses.replace(bert.config, num_layers=layers)
    return bert


def cross_encoder_bert(spec: str, task) -> BertModel:
    """The BERT ``--cross-encoder`` names: a copy of the knowledge encoder's (``knowledge``) or a spec's query tower's
    BERT, which must share the knowledge encoder's vocabulary."""
    if spec in (None, "", "knowledge"):
        return copy.deepcopy(task.text_encoder.query_tower.bert_model)
    from rag_plugin.retrieval.encoders import load_encoder

    source = load_encoder(spec)
    expected = (getattr(task.knowledge, "encoder_identity", None) or {}).get("vocab_sha256")
    same = (source.identity()["vocab_sha256"] == expected if expected is not None
            else source.tokenizer.get_vocab(with_added_tokens=True)
            == task.text_encoder.tokenizer.get_vocab(with_added_tokens=True))
    if not same:
        raise UserError(f"--cross-encoder {spec!r} has another vocabulary than the knowledge source's encoder, whose "
                        "tokens the questions and passages arrive in",
                        fix="use --cross-encoder knowledge, or a checkpoint with the knowledge encoder's vocab.txt")
    return source.query_tower.bert_model


@register_reranker("cross")
def build_cross_encoder(model_cfg, task) -> CrossEncoderReranker:
    """``--reranker cross``: the BERT of ``--cross-encoder`` with a zero head, learning at the towers' lr scale."""
    if task.text_encoder is None:
        raise UserError("--reranker cross reads questions and passages with the knowledge source's encoder, and this "
                        "task has none loaded", fix="use a knowledge source built with a dense encoder, or another "
                        "--reranker")
    bert = bottom_layers(cross_encoder_bert(task.cfg.cross_encoder, task),
                         int(getattr(task.cfg, "cross_encoder_layers", 0) or 0))
    reranker = CrossEncoderReranker(bert, task.text_encoder)
    reranker.train()
    scale = resolved_scale(model_cfg.query_encoder_lr_scale, getattr(model_cfg, "lr", None))  # the towers' scale
    if scale != 1.0:
        scale_learning_rate(reranker.bert, scale)
    return reranker
