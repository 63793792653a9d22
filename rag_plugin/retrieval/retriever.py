"""Retrievers behind one protocol, :class:`Retriever`: a passage ``store``, ``search(questions, k) -> Retrieval``
(rows, scores, and for dense retrieval the stored vectors) for scripts, and ``retrieve(queries, k, scale,
candidates)`` for a model: the logits of p(z|x) with their gradient in the model's query vectors, and the rows.

* :class:`DenseRetriever`: query encoder + FAISS MIPS index + passage store (the paper's
  DPR retriever). A model hands it the query vectors of its trainable query encoder; it searches the index
  and returns scale x q.d(z) from the stored document vectors of the hits (the gradient reaches q, never d).
* :class:`BM25Retriever`: lexical BM25 (bm25s) over the same passage store (the paper's
  BM25 ablation, Table 6): fixed scores, nothing to train. A model's candidates come with its dataset.
* :class:`~rag_plugin.retrieval.hybrid.HybridRetriever`: the two fused.

A re-indexed knowledge source is just another retriever handed to the model (``RagModel.use_retrieval``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import numpy as np
import torch

from rag_plugin.core.scores import inner_products
from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.retrieval.threads import faiss_thread_budget
from rag_plugin.util.errors import UserError

#: a batch's candidates that come with its dataset (BM25 and hybrid): rows Long[B, L] and their scores [B, L]
FixedCandidates = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class Retrieval:
    """Top-k results for a batch of B questions (rows and scores best first)."""

    rows: np.ndarray      # int64 [B, k], passage-store rows
    scores: np.ndarray    # float32 [B, k], retrieval scores (inner products or BM25)
    store: PassageStore
    vectors: Optional[np.ndarray] = None  # float32 [B, k, D], the stored d(z) of the hits (dense, on request)

    def ids(self) -> List[List[str]]:
        return [[self.store.id(int(r)) for r in row] for row in self.rows]

    def titles(self) -> List[List[str]]:
        return [[self.store.title(int(r)) for r in row] for row in self.rows]

    def texts(self) -> List[List[str]]:
        return [[self.store.text(int(r)) for r in row] for row in self.rows]

    def passage_tokens(self):
        """Generator token ids per hit: list (B) of lists (k) of (title_ids, text_ids)."""
        return [[(self.store.title_tokens(int(r)), self.store.text_tokens(int(r))) for r in row]
                for row in self.rows]


@runtime_checkable
class Retriever(Protocol):
    """What the task, the model and the scripts use of any retriever."""

    #: whether the scores come from a query encoder a model can train (dense) or are fixed (BM25)
    trainable: bool

    @property
    def store(self) -> PassageStore:
        """The passages the rows index (ids, titles, texts, pre-tokenized generator ids)."""

    def search(self, questions: Sequence[str], k: int) -> Retrieval:
        """Top-``k`` passages of each question, best first."""

    def retrieve(self, queries: Optional[torch.Tensor], k: int, scale: float,
                 candidates: Optional[FixedCandidates] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """A model's retrieval of a batch: (logits of p(z|x) [B, k], float32, differentiable in ``queries``; rows
        Long[B, k]), best first. ``queries``: the model's query vectors [B, D] (None without a query encoder);
        ``scale``: the model's --doc-score-scale; ``candidates``: what the batch's dataset fixed (BM25, hybrid)."""


def _check_k(k: int, n: int) -> None:
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", fix="ask for 1 or more passages")
    if k > n:
        raise UserError(f"k={k} is larger than the collection ({n} passages)",
                        fix=f"ask for at most {n}")


class DenseRetriever(SharedOnCopy):
    """MIPS over a knowledge source with a (query) encoder.

    ``searcher``: what searches the index: by default this process searches every shard itself
    (:meth:`KnowledgeSource.local_search`); in a distributed job, a
    :class:`~rag_plugin.retrieval.collective.CollectiveSearch` over the shards the ranks hold."""

    trainable = True

    def __init__(self, knowledge: KnowledgeSource, encoder=None, searcher=None):
        self.knowledge = knowledge
        # open and check the index first: a damaged one fails before a model loads
        self.searcher = searcher if searcher is not None else knowledge.local_search()
        self.encoder = encoder if encoder is not None else knowledge.load_encoder()
        if int(self.encoder.dim) != knowledge.dim:
            raise UserError(f"encoder dimension {self.encoder.dim} does not match the index's "
                            f"{knowledge.dim}", path=str(knowledge.directory),
                            fix="use the encoder the knowledge source was built with")

    @classmethod
    def from_dir(cls, directory: str, nprobe: Optional[int] = None, ef_search: Optional[int] = None,
                 index_mode: str = faiss_index.SHARED) -> "DenseRetriever":
        ks = KnowledgeSource(directory, index_mode=index_mode)
        if nprobe is not None or ef_search is not None:
            ks.set_search_params(nprobe=nprobe, ef_search=ef_search)
        return cls(ks)

    @property
    def store(self) -> PassageStore:
        return self.knowledge.passages

    def search_vectors(self, queries: np.ndarray, k: int, threads: Optional[int] = None,
                       compute_threads: Optional[int] = None, with_vectors: bool = False) -> Retrieval:
        """Search with precomputed query vectors [B, D]. ``threads``: FAISS threads for this call;
        ``compute_threads``: instead, the threads of the computation the search runs inside (a training
        or decoding step), from which the FAISS threads are chosen (:func:`index.step_search_threads`).
        ``with_vectors``: also return the stored vectors of the hits."""
        _check_k(k, len(self.knowledge))
        queries = np.asarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.knowledge.dim:
            raise UserError(f"query vectors have dimension {queries.shape[-1]}, the index {self.knowledge.dim}",
                            fix="use the query encoder that matches the knowledge source's document encoder")
        scores, rows, vectors = self.searcher.search(queries, k, threads=threads, compute_threads=compute_threads,
                                                     with_vectors=with_vectors)
        return Retrieval(rows=rows.astype(np.int64), scores=scores, store=self.store, vectors=vectors)

    def search(self, questions: Sequence[str], k: int, batch_size: int = 64) -> Retrieval:
        questions = list(questions)
        _check_k(k, len(self.knowledge))
        q = self.encoder.encode_queries(questions, batch_size=batch_size)
        return self.search_vectors(np.asarray(q, dtype=np.float32), k)

    def retrieve(self, queries: Optional[torch.Tensor], k: int, scale: float,
                 candidates: Optional[FixedCandidates] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """MIPS with the model's query vectors; the logits scale x q.d from the hits' stored vectors (frozen), in
        float32 under --fp16/--amp too (:func:`~rag_plugin.core.scores.inner_products`). ``candidates`` given (rows
        forced by the caller, scored as given): those, no search."""
        if candidates is not None:
            rows, scores = candidates
            return scores[:, :k].float(), rows[:, :k]
        if queries is None:
            raise UserError("dense retrieval searches with query vectors, and none were given",
                            fix="pass the questions' query tokens (the task's datasets hold them)")
        found = self.search_vectors(queries.detach().float().cpu().numpy(), k,
                                    compute_threads=faiss_thread_budget(queries.device), with_vectors=True)
        d = torch.from_numpy(found.vectors).to(queries.device)                   # [B, k, D] float32
        return inner_products(d, queries, scale), torch.from_numpy(found.rows)

    def doc_vectors(self, rows: np.ndarray) -> np.ndarray:
        """Stored document vectors d(z) of ``rows``: float32 [*rows.shape, D] (frozen)."""
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        order = np.argsort(flat, kind="stable")  # sorted reads are kinder to a memory map
        out = np.empty((flat.size, self.knowledge.dim), dtype=np.float32)
        out[order] = self.knowledge.vectors[flat[order]]
        return out.reshape(*np.shape(rows), self.knowledge.dim)


class BM25Retriever(SharedOnCopy):
    """BM25 (Lucene variant, k1=1.5, b=0.75) over titles and texts of a passage store."""

    trainable = False

    def __init__(self, store: PassageStore, k1: float = 1.5, b: float = 0.75,
                 progress: bool = False):
        import bm25s  # start-up: only BM25 retrieval pays for it

        self._store = store
        corpus = [f"{t} {x}" for t, x in store.iter_titles_texts()]
        tokens = bm25s.tokenize(corpus, stopwords="en", show_progress=progress)
        self._bm25 = bm25s.BM25(k1=k1, b=b)
        self._bm25.index(tokens, show_progress=progress)

    @property
    def store(self) -> PassageStore:
        return self._store

    @classmethod
    def from_dir(cls, directory: str) -> "BM25Retriever":
        return cls(KnowledgeSource(directory).passages)

    def search(self, questions: Sequence[str], k: int, batch_size: int = 0) -> Retrieval:
        import bm25s  # start-up: only BM25 retrieval pays for it

        _check_k(k, len(self.store))
        tokens = bm25s.tokenize(list(questions), stopwords="en", show_progress=False)
        rows, scores = self._bm25.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return Retrieval(rows=np.asarray(rows, dtype=np.int64),
                         scores=np.asarray(scores, dtype=np.float32), store=self.store)

    def retrieve(self, queries: Optional[torch.Tensor], k: int, scale: float,
                 candidates: Optional[FixedCandidates] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The batch's BM25 rows and scores, fixed per question by its dataset: the scores are the logits of p(z|x)
        as they are (the paper's BM25 ablation; ``scale`` is the dense retriever's)."""
        if candidates is None:
            raise UserError("BM25 retrieval reads each question's passages from its dataset; this batch has none",
                            fix="build the batch with the task's build_dataset (it searches BM25 per question)")
        rows, scores = candidates
        return scores[:, :k].float(), rows[:, :k]
