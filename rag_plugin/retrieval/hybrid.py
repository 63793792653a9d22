"""Hybrid retrieval: dense (MIPS) and BM25 candidates fused, the fused score the logit of p(z|x).

For each question, ``L`` candidates come from each side (the dense list searched with the query vector,
the BM25 list from the question's words; BM25 hits of score 0, which share no word with the question, are
dropped). Their union ``C`` (at most 2L passages) is scored, and the K best are kept:

* ``rrf``: f(z) = (k + 1) / 2 x [1 / (k + rank_dense(z)) + 1 / (k + rank_bm25(z))], a side's term 0 where
  z is not in its list (reciprocal rank fusion, Cormack et al. 2009, divided by its largest value
  2 / (k + 1) so that f lies in [0, 1]);
* ``weighted``: f(z) = w x dense_norm(z) + (1 - w) x bm25_norm(z), each side min-max normalised per
  question: the dense scores q.d over the whole union C (every candidate's stored vector is at hand, so
  its q.d is exact), the BM25 scores over the BM25 list (a dense-only candidate gets 0, the list's least).

The logit of p(z|x) is ``scale x f(z)``. How the query encoder keeps its gradient:

* ``weighted`` is a differentiable function of the query vector q (through q.d and the min-max
  normaliser): the logit *is* ``scale x f(z)``, gradients exact (finite differences agree, tested). The
  best and the worst candidate have normalised dense scores pinned at 1 and 0; the gradient moves them
  through the normaliser, relative to the others, which is all a softmax sees.
* ``rrf`` depends on q only through ranks, piecewise constant: its exact gradient is 0 almost
  everywhere, and the query encoder would learn nothing. The logit is
  ``scale x f(z) + (s(z) - stop_grad(s(z)))`` with s(z) = --doc-score-scale x q.d, dense RAG's own logit:
  the value is the fused score, the gradient the one dense RAG gives its query encoder for the same
  p(z|x) and loss (a straight-through estimator). What the query encoder learns improves the dense
  list, which is what enters the fusion.

Pure numpy for the candidate sets and rank arithmetic; torch for the logits. No fairseq import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from rag_plugin.core.scores import inner_products
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.retrieval.retriever import FixedCandidates, Retrieval
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.retrieval.threads import faiss_thread_budget
from rag_plugin.util.errors import UserError

FUSIONS = ("rrf", "weighted")


@dataclass
class Candidates:
    """The union of a batch's dense and BM25 candidates, [B, C], padded with row -1."""

    rows: np.ndarray         # int64 [B, C], passage-store rows; -1 pads
    dense_rank: np.ndarray   # int64 [B, C], 1-based rank in the dense list; 0 where not in it
    bm25_rank: np.ndarray    # int64 [B, C], 1-based rank in the BM25 list; 0 where not in it
    bm25_score: np.ndarray   # float64 [B, C], BM25 score; nan where not in the BM25 list

    @property
    def valid(self) -> np.ndarray:
        return self.rows >= 0


def union_candidates(dense_rows: np.ndarray, bm25_rows: np.ndarray, bm25_scores: np.ndarray) -> Candidates:
    """The dense list in its order, then the BM25 hits (score > 0) that are not in it, in theirs."""
    dense_rows = np.asarray(dense_rows, dtype=np.int64)
    bm25_rows, bm25_scores = np.asarray(bm25_rows, dtype=np.int64), np.asarray(bm25_scores, dtype=np.float64)
    b, l_dense = dense_rows.shape
    width = l_dense + bm25_rows.shape[1]
    rows = np.full((b, width), -1, dtype=np.int64)
    dense_rank = np.zeros((b, width), dtype=np.int64)
    bm25_rank = np.zeros((b, width), dtype=np.int64)
    bm25_score = np.full((b, width), np.nan)
    for i in range(b):
        where = {}
        for j, r in enumerate(dense_rows[i]):
            if r >= 0 and int(r) not in where:
                where[int(r)] = len(where)
                rows[i, where[int(r)]], dense_rank[i, where[int(r)]] = r, j + 1
        for j, (r, s) in enumerate(zip(bm25_rows[i], bm25_scores[i])):
            if r < 0 or not s > 0:
                continue
            if int(r) not in where:
                where[int(r)] = len(where)
                rows[i, where[int(r)]] = r
            bm25_rank[i, where[int(r)]], bm25_score[i, where[int(r)]] = j + 1, s
    used = max(1, int((rows >= 0).sum(1).max()))
    return Candidates(rows[:, :used], dense_rank[:, :used], bm25_rank[:, :used], bm25_score[:, :used])


def rrf_scores(cands: Candidates, k: float = 60.0) -> np.ndarray:
    """Reciprocal rank fusion divided by its largest value 2 / (k + 1): [B, C] in [0, 1] (0 at padding)."""
    def side(rank):
        return np.where(rank > 0, 1.0 / (k + np.maximum(rank, 1)), 0.0)

    return (side(cands.dense_rank) + side(cands.bm25_rank)) * (k + 1) / 2.0


def minmax_bm25(cands: Candidates) -> np.ndarray:
    """BM25 scores min-max normalised over each question's BM25 list: [B, C] in [0, 1], 0 where not in it
    (and where the list's scores are all equal)."""
    s = cands.bm25_score
    present = ~np.isnan(s)
    lo = np.where(present, s, np.inf).min(1, keepdims=True)
    hi = np.where(present, s, -np.inf).max(1, keepdims=True)
    span = hi - lo
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(present & (span > 0), (s - lo) / np.where(span > 0, span, 1.0), 0.0)
    return out


def minmax_torch(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Min-max normalisation over each row's valid entries (differentiable; 0 where invalid or all equal)."""
    lo = x.masked_fill(~valid, float("inf")).min(-1, keepdim=True).values
    hi = x.masked_fill(~valid, float("-inf")).max(-1, keepdim=True).values
    span = hi - lo
    ok = valid & (span > 0)
    return torch.where(ok, (x - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(x))


def fused_logits(dense_logits: torch.Tensor, cands: Candidates, fusion: str, rrf_k: float = 60.0,
                 weight: float = 0.5, scale: float = 10.0) -> torch.Tensor:
    """The logit of p(z|x) of every candidate, [B, C] (-inf at padding), from the dense logits
    s = doc_score_scale x q.d of the candidates [B, C] (with their gradient). See the module docstring."""
    valid = torch.from_numpy(cands.valid).to(dense_logits.device)
    if fusion == "rrf":
        fused = torch.from_numpy(rrf_scores(cands, rrf_k)).to(dense_logits)
        logits = scale * fused + (dense_logits - dense_logits.detach())
    elif fusion == "weighted":
        bm25 = torch.from_numpy(minmax_bm25(cands)).to(dense_logits)
        logits = scale * (weight * minmax_torch(dense_logits, valid) + (1.0 - weight) * bm25)
    else:
        raise UserError(f"unknown --fusion {fusion!r}", fix=f"use one of {', '.join(FUSIONS)}")
    return logits.masked_fill(~valid, float("-inf"))


def top_k(logits: torch.Tensor, cands: Candidates, k: int) -> Tuple[torch.Tensor, np.ndarray]:
    """The k best candidates of each question, best first (ties: the dense list's order first):
    (logits [B, k] with their gradient, rows int64 [B, k])."""
    if int(cands.valid.sum(1).min()) < k:
        raise UserError(f"fewer than {k} hybrid candidates for a question", fix="raise --hybrid-candidates")
    order = torch.argsort(logits.detach(), dim=-1, descending=True, stable=True)[:, :k]
    rows = np.take_along_axis(cands.rows, order.cpu().numpy(), axis=1)
    return logits.gather(1, order), rows


class HybridRetriever(SharedOnCopy):
    """Dense + BM25 retrieval fused (see the module docstring): a :class:`~rag_plugin.retrieval.retriever.
    Retriever` whose query encoder (the dense side's) a model can train."""

    trainable = True

    def __init__(self, dense, bm25, fusion: str = "rrf", rrf_k: float = 60.0, weight: float = 0.5,
                 scale: float = 10.0, candidates: int = 20):
        if fusion not in FUSIONS:
            raise UserError(f"unknown --fusion {fusion!r}", fix=f"use one of {', '.join(FUSIONS)}")
        if not 0.0 <= weight <= 1.0:
            raise UserError(f"--fusion-weight {weight} is outside [0, 1]", fix="give the dense side's weight in [0, 1]")
        self.dense, self.bm25 = dense, bm25
        self.fusion, self.rrf_k, self.weight, self.scale = fusion, float(rrf_k), float(weight), float(scale)
        self.candidates = int(candidates)

    @property
    def store(self) -> PassageStore:
        return self.dense.store

    def bm25_candidates(self, questions: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """The BM25 list of each question (fixed: computed once per dataset): rows int64 [B, L], scores [B, L]."""
        found = self.bm25.search(list(questions), self.candidates)
        return found.rows, found.scores

    def fuse(self, q: torch.Tensor, bm25_rows: np.ndarray, bm25_scores: np.ndarray, k: int,
             doc_score_scale: float = 1.0, compute_threads: Optional[int] = None) -> Tuple[torch.Tensor, np.ndarray]:
        """Search the dense side with the query vectors q [B, D] (a model's query encoder output, with its
        gradient), fuse with the BM25 lists, keep k: (logits [B, k] differentiable in q, rows int64 [B, k])."""
        found = self.dense.search_vectors(q.detach().float().cpu().numpy(), self.candidates,
                                          compute_threads=compute_threads)
        cands = union_candidates(found.rows, bm25_rows, bm25_scores)
        vectors = self.dense.doc_vectors(np.where(cands.valid, cands.rows, 0))           # [B, C, D] frozen
        d = torch.from_numpy(vectors).to(q.device)
        dense_logits = inner_products(d, q, doc_score_scale)  # float32 (float64 stays float64) under --amp too
        logits = fused_logits(dense_logits, cands, self.fusion, self.rrf_k, self.weight, self.scale)
        return top_k(logits, cands, k)

    def retrieve(self, queries: Optional[torch.Tensor], k: int, scale: float,
                 candidates: Optional[FixedCandidates] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """A model's retrieval: the batch's BM25 lists (``candidates``, fixed by its dataset: see
        :meth:`bm25_candidates`) fused with the dense side searched with the model's query vectors."""
        if candidates is None:
            raise UserError("hybrid retrieval fuses each question's BM25 list, which comes with its dataset; this "
                            "batch has none", fix="build the batch with the task's build_dataset")
        rows, scores = candidates
        logits, hits = self.fuse(queries.float(), rows.cpu().numpy(), scores.cpu().numpy(), k, scale,
                                 compute_threads=faiss_thread_budget(queries.device))
        return logits, torch.from_numpy(hits)

    def search(self, questions: Sequence[str], k: int, batch_size: int = 64) -> Retrieval:
        """Top-``k`` fused passages of each question with the dense side's own query encoder; ``scores`` are the
        fused logits."""
        questions = list(questions)
        q = torch.from_numpy(np.asarray(self.dense.encoder.encode_queries(questions, batch_size=batch_size),
                                        dtype=np.float32))
        rows, scores = self.bm25_candidates(questions)
        with torch.no_grad():
            logits, hits = self.fuse(q, rows, scores, k)
        return Retrieval(rows=hits, scores=logits.float().numpy(), store=self.store)
