"""Retrieve L, rerank, keep K: the stage every model retrieves through when it has a reranker.

Per batch of B questions::

    first, rows = first stage top-L (dense MIPS, BM25 rows from the dataset, or hybrid fusion)   [B, L]   no gradient
    s = reranker(rows)                                 [B, L]    without a graph, in eval mode (only the order is used)
    keep = the K best rows by s (ties: the first stage's order)
    logits = reranker(kept rows)                       [B, K]    with the graph while training: the logits of p(z|x)

The kept rows' scores are the reranker's, so the marginal NLL (and every ``--retriever-loss``) trains the reranker;
the first stage only proposes. Scoring L candidates without a graph and the K kept once more with one gives the same
gradient as a graph through all L (only the K kept values reach the loss), with the activations of K rows per
question instead of L. Out of training (or with the gradient off) the K scores are the first pass's.

Rows of -1 (an approximate index, or a BM25 list shorter than L) are scored as row 0 and then held below every real
row, so they are kept only where fewer than K real rows exist (their logit :data:`NO_ROW`, p(z|x) ~ 0).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Tuple

import torch

from rag_plugin.reranking.base import RerankBatch, Reranker

#: the logit of a missing row (-1): far below any real score, finite (no NaN in a softmax or its gradient)
NO_ROW = -1.0e4


def rerank(reranker: Reranker, model, batch: RerankBatch, k: int, grad: bool,
           keep_order_at_k: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """(logits [B, K] (at least float32), rows Long[B, K]) of the K best of ``batch``'s L candidates by ``reranker``.

    ``grad``: score the kept rows once more with a graph (training). ``keep_order_at_k``: with L == K keep the first
    stage's order instead of sorting (the trainable document encoder's re-scoring without --rerank-candidates, as it
    always was)."""
    missing = batch.rows.lt(0)
    if bool(missing.any()):
        batch = dataclasses.replace(batch, rows=batch.rows.clamp(min=0))
    width = batch.rows.size(1)
    if width < k:
        raise ValueError(f"{width} candidates for {k} documents")
    if width == k and keep_order_at_k:
        with torch.set_grad_enabled(grad):
            return _masked(_full(reranker(model, batch)), missing), batch.rows
    with torch.no_grad(), _selecting(model, reranker):
        scores = _masked(_full(reranker(model, batch)), missing)                    # [B, L]
    index = _top_k(scores, k)                                                          # [B, K]
    if not grad:
        return scores.gather(1, index), batch.rows.gather(1, index.to(batch.rows.device))
    kept = batch.select(index)
    with torch.enable_grad():
        logits = _full(reranker(model, kept))
    return _masked(logits, missing.gather(1, index.to(missing.device))), kept.rows


@contextlib.contextmanager
def _selecting(*modules):
    """The selection pass runs in eval mode (no dropout: the K kept are the best by the reranker itself, not by one
    draw of its dropout), each module's mode restored after."""
    modes = [(m, m.training) for m in modules if isinstance(m, torch.nn.Module)]
    try:
        for m, _ in modes:
            m.train(False)
        yield
    finally:
        for m, mode in modes:
            m.train(mode)


def _top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Positions of the ``k`` best scores per row, best first; equal scores in their first-stage order (a stable
    sort: ``topk`` leaves ties in an unspecified order)."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]


def _full(scores: torch.Tensor) -> torch.Tensor:
    """At least float32 (a reranker run in 16 bits is read in float32; float64 stays float64)."""
    return scores if scores.dtype in (torch.float32, torch.float64) else scores.float()


def _masked(scores: torch.Tensor, missing: torch.Tensor) -> torch.Tensor:
    if not bool(missing.any()):
        return scores
    return scores.masked_fill(missing.to(scores.device), NO_ROW)
