"""What every reranker sees and returns.

A reranker scores the L candidates of each of B questions: ``scores = reranker(batch)`` [B, L], float32, the logits of
p(z|x) (the marginal and every ``--retriever-loss`` train it through them, so they keep their graph in training). The
stage (:mod:`rag_plugin.reranking.stage`) keeps the best K of the L by these scores. Rows of -1 (an approximate index
or a short BM25 list could not fill them) are never asked about: the stage hands only real rows.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch
from torch import nn

#: the registered reranker names (``--reranker``); ``doc_encoder`` is the trainable document encoder's re-scoring
#: (``--train-doc-encoder``), chosen by that option, not by ``--reranker``
RERANKERS = ("maxsim", "upr", "cross")


@dataclass
class RerankBatch:
    """The B questions of a batch and their L candidates, as the stage hands them to a reranker."""

    #: Long[B, L] passage-store rows, best first by the first stage
    rows: torch.Tensor
    #: [B, L] float32, the first stage's logits of the rows (detached: the first stage only proposes)
    first_stage: torch.Tensor
    #: Long[B, S] the questions in the generator's tokens (padded with the generator's pad)
    src_tokens: torch.Tensor
    #: Long[B, Q] the questions in the knowledge source's encoder tokens ([CLS] q [SEP], padded), or None
    query_tokens: Optional[torch.Tensor] = None
    #: Bool[B, Q], True at the query tokens, or None
    query_mask: Optional[torch.Tensor] = None
    #: [B, D] the model's query vectors (dense and hybrid; with their graph in training), or None
    query_vectors: Optional[torch.Tensor] = None

    def select(self, index: torch.Tensor) -> "RerankBatch":
        """The same questions with the candidates ``index`` Long[B, K] picks (positions along L)."""
        return dataclasses.replace(self, rows=self.rows.gather(1, index.to(self.rows.device)),
                                   first_stage=self.first_stage.gather(1, index.to(self.first_stage.device)))


class Reranker(nn.Module):
    """A reranker: ``forward(model, batch) -> [B, L]`` float32 logits of p(z|x) (see the module docstring).

    ``model`` is the RAG/FiD model it serves (the reader as reranker scores with its generator; the document encoder
    with its towers); a reranker's own weights are its submodules (saved with the model, trained by its optimizer)."""

    #: the ``--reranker`` name
    name: str = ""
    #: whether the reranker has weights that learn (its gradient through the marginal and the retriever losses)
    trainable: bool = True

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:  # pragma: no cover - the protocol
        raise NotImplementedError


#: ``--reranker`` name -> builder ``(model_cfg, task) -> Reranker``, filled by the scorers' modules
BUILDERS: Dict[str, Callable] = {}


def register_reranker(name: str):
    """Class or function decorator: ``name``'s builder ``(model_cfg, task) -> Reranker``."""
    def wrap(builder):
        BUILDERS[name] = builder
        return builder
    return wrap
