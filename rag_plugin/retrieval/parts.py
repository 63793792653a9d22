"""Exact top-k search over the index parts a process holds: the whole index of an unsharded knowledge
source, or some or all of a sharded one's shards (:mod:`rag_plugin.retrieval.shards`).

* :class:`IndexPart`: one FAISS index over the rows [start, end) and the stored vectors of those rows.
* :func:`merge_top_k`: candidates from several parts (or several processes) -> the exact top k, best first,
  ties broken by the lower row, so the result does not depend on how the collection was cut.
* :class:`LocalSearch`: search every part this process holds and merge; an unsharded source is one part.
* :class:`RowVectors`: the stored vectors of a sharded source read by row, opening a shard's file only
  when one of its rows is asked for.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.shared import SharedOnCopy

#: A place a search could not fill (FAISS's row -1, or a shard smaller than k)
NO_ROW = -1


class IndexPart(SharedOnCopy):
    """A FAISS index over the collection's rows [start, start + ntotal), with their stored vectors."""

    def __init__(self, index, vectors: np.ndarray, start: int, how: str, name: str):
        self.index, self.vectors, self.start, self.how, self.name = index, vectors, int(start), how, name

    @property
    def end(self) -> int:
        return self.start + int(self.index.ntotal)

    def search(self, queries: np.ndarray, k: int, threads: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """Top-min(k, size) of this part, padded to k with row -1: (scores [B, k], collection rows [B, k])."""
        take = min(int(k), int(self.index.ntotal))
        scores, ids = faiss_index.search_unchecked(self.index, queries, take, threads)
        rows = np.where(ids >= 0, ids.astype(np.int64) + self.start, NO_ROW)
        if take < k:
            pad = ((0, 0), (0, k - take))
            scores = np.pad(scores, pad, constant_values=-np.inf)
            rows = np.pad(rows, pad, constant_values=NO_ROW)
        return scores.astype(np.float32, copy=False), rows


def merge_top_k(scores: Sequence[np.ndarray], rows: Sequence[np.ndarray], k: int,
                vectors: Optional[Sequence[np.ndarray]] = None):
    """The exact top ``k`` of candidate lists [B, k_i] (scores, rows; unfilled places have row -1):
    best score first, equal scores by the lower row. Returns (scores [B, k], rows [B, k], vectors [B, k, D]
    or None); places that stay unfilled keep row -1."""
    s = np.concatenate(scores, axis=1)
    r = np.concatenate(rows, axis=1)
    missing = r < 0
    key_scores = np.where(missing, np.inf, -s.astype(np.float64))   # unfilled places last
    key_rows = np.where(missing, np.iinfo(np.int64).max, r)
    order = np.lexsort((key_rows, key_scores), axis=-1)[:, :k]
    top_s = np.take_along_axis(s, order, axis=1)
    top_r = np.take_along_axis(r, order, axis=1)
    top_v = None
    if vectors is not None:
        v = np.concatenate(vectors, axis=1)
        top_v = np.take_along_axis(v, order[:, :, None], axis=1)
    return top_s, top_r, top_v


def step_threads(parts: Sequence[IndexPart], n_queries: int, compute_threads: Optional[int]) -> Optional[int]:
    """FAISS threads for a search inside a training or decoding step (:func:`index.step_search_threads`,
    judged on the largest part)."""
    if compute_threads is None or not parts:
        return None
    largest = max(parts, key=lambda p: p.index.ntotal)
    return faiss_index.step_search_threads(largest.index, n_queries, compute_threads)


class LocalSearch(SharedOnCopy):
    """Exact top-k over the parts this process holds (all of the collection's, for a single process)."""

    def __init__(self, parts: List[IndexPart], count: int, dim: int, nprobe: Optional[int] = None):
        self.parts, self.count, self.dim, self.nprobe = parts, int(count), int(dim), nprobe

    def search(self, queries: np.ndarray, k: int, threads: Optional[int] = None,
               compute_threads: Optional[int] = None, with_vectors: bool = False):
        """(scores [B, k], rows [B, k], stored vectors [B, k, D] or None), best first."""
        scores, rows = self.search_parts(queries, k, threads, compute_threads)
        faiss_index.check_all_found(rows, k, self.nprobe)
        return scores, rows, (self.vectors_of(rows) if with_vectors else None)

    def search_parts(self, queries: np.ndarray, k: int, threads: Optional[int] = None,
                     compute_threads: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The merged top k of the parts held, unfilled places (row -1) left in."""
        if threads is None:
            threads = step_threads(self.parts, len(queries), compute_threads)
        found = [part.search(queries, k, threads) for part in self.parts]
        scores, rows, _ = merge_top_k([f[0] for f in found], [f[1] for f in found], k)
        return scores, rows

    def vectors_of(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of ``rows`` (any shape; row -1 gives zeros): float32 [*rows.shape, D]."""
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        out = np.zeros((flat.size, self.dim), dtype=np.float32)
        for part in self.parts:
            mine = np.flatnonzero((flat >= part.start) & (flat < part.end))
            if mine.size:
                local = flat[mine] - part.start
                order = np.argsort(local, kind="stable")  # sorted reads are kinder to a memory map
                out[mine[order]] = part.vectors[local[order]]
        return out.reshape(*np.shape(rows), self.dim)


class RowVectors(SharedOnCopy):
    """The stored vectors of a sharded source, indexed by collection row like the ``vectors.npy`` of an
    unsharded one (``vectors[rows]`` for an int array or a slice); each shard's file opened when first read."""

    dtype = np.dtype(np.float32)

    def __init__(self, bounds: List[Tuple[int, int]], dim: int, open_shard: Callable[[int], np.ndarray]):
        self.bounds, self.dim, self._open = bounds, int(dim), open_shard
        self.starts = np.asarray([b[0] for b in bounds], dtype=np.int64)

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.bounds[-1][1], self.dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows) -> np.ndarray:
        if isinstance(rows, slice):
            rows = np.arange(*rows.indices(len(self)))
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= len(self)):
            raise IndexError(f"row out of range 0..{len(self) - 1}")
        out = np.empty((flat.size, self.dim), dtype=np.float32)
        shard_of = np.searchsorted(self.starts, flat, side="right") - 1
        for s in np.unique(shard_of):
            mine = np.flatnonzero(shard_of == s)
            out[mine] = self._open(int(s))[flat[mine] - self.starts[s]]
        return out.reshape(*np.shape(rows), self.dim)
