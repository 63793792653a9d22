"""Document vectors and indexes made elsewhere, for the knowledge-source builder's hooks.

* :class:`PrecomputedVectors` -- vectors computed by someone else (DPR's released passage
  embeddings, the ``embeddings`` column of a Hugging Face knowledge dataset: read by
  :mod:`rag_plugin.indexing.vector_sources`), placed on the passage store's rows by passage id and
  written as the builder's embedding shards, in place of running an encoder.
* :func:`use_index_file` -- an existing FAISS index over the same rows (e.g. the one saved
  with a Hugging Face dataset), checked against the vectors and used instead of building one.

See :func:`rag_plugin.indexing.build_knowledge_source` (``precomputed=`` and
``BuildSettings.index_file``) and :func:`rag_plugin.indexing.import_knowledge.import_knowledge`.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path


def _id_hash(pid: str) -> int:
    return int.from_bytes(hashlib.blake2b(pid.encode("utf-8"), digest_size=8).digest(), "little")


class IdTable:
    """Passage id -> store row, as two sorted uint64/int64 arrays (16 bytes a passage)."""

    def __init__(self, store: PassageStore, progress: bool = False):
        n = len(store)
        hashes = np.empty(n, dtype=np.uint64)
        rows: Iterable[int] = range(n)
        if progress:
            rows = tqdm(rows, desc="index passage ids", unit=" psg", mininterval=1.0)
        for row in rows:
            hashes[row] = _id_hash(store.id(row))
        self.order = np.argsort(hashes, kind="stable")
        self.sorted = hashes[self.order]
        self.store = store
        self.fallback: Optional[Dict[str, int]] = None
        if n > 1 and bool(np.any(self.sorted[1:] == self.sorted[:-1])):  # a 64-bit collision: be exact
            self.fallback = {store.id(r): r for r in range(n)}

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """Rows (int64, -1 where unknown)."""
        if self.fallback is not None:
            return np.asarray([self.fallback.get(i, -1) for i in ids], dtype=np.int64)
        h = np.fromiter((_id_hash(i) for i in ids), dtype=np.uint64, count=len(ids))
        if not len(self.sorted):
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self.sorted, h)
        pos_c = np.minimum(pos, len(self.sorted) - 1)
        hit = self.sorted[pos_c] == h
        rows = np.where(hit, self.order[pos_c], -1).astype(np.int64)
        for j in np.flatnonzero(hit):  # confirm (a hash match of a foreign id is ~1e-12 likely)
            if self.store.id(int(rows[j])) != ids[j]:
                rows[j] = -1
        return rows


#: A callable returning ``(passage ids, float32 [B, D] vectors, source file)`` batches.
VectorBatches = Callable[[], Iterable[Tuple[Sequence[str], np.ndarray, str]]]


class PrecomputedVectors:
    """Document vectors computed elsewhere, used by the builder instead of an encoder.

    ``batches()`` yields ``(passage ids, vectors [B, D], source file)``; each vector lands on
    the store row of its passage id. Vectors of ids outside the collection are ignored
    (counted, logged); a passage without a vector, an id with two vectors and vectors of
    different sizes are errors. ``identity`` is the document encoder's identity for the
    manifest; its ``dim``, when given, must be the vectors'. ``manifest``: more manifest entries
    (:meth:`manifest_entries`). Duck-types the part of an encoder the builder uses (``dim``,
    ``identity()``).
    """

    def __init__(self, batches: VectorBatches, identity: dict, passages_path: Optional[str] = None,
                 missing_fix: str = "pass the vectors of every passage", manifest: Optional[dict] = None):
        self._batches = batches
        self._identity = dict(identity)
        self.dim: Optional[int] = None
        self.passages_path = passages_path
        self.missing_fix = missing_fix
        self._manifest = dict(manifest or {})

    def identity(self) -> dict:
        return {**self._identity, "dim": self._identity.get("dim", self.dim)}

    def manifest_entries(self) -> dict:
        """What the knowledge source's manifest records besides the encoder identity (where the
        vectors came from, the query encoder to use with them)."""
        return dict(self._manifest)

    def write_shards(self, store: PassageStore, shards: Path, starts: List[int], shard_size: int,
                     scratch: Path, progress: bool, log: Callable[[str], None]) -> None:
        """Align every vector to its store row (in ``scratch``, a memory map), then write the
        builder's missing shards ``shards/{start:012d}.npy`` atomically."""
        aligned = self._align(store, scratch, progress, log)
        for s in starts:
            target = shards / f"{s:012d}.npy"
            if not target.is_file():
                with atomic_path(target) as tmp:
                    with open(tmp, "wb") as fh:
                        np.save(fh, np.asarray(aligned[s:s + shard_size]), allow_pickle=False)
        del aligned
        scratch.unlink()

    def _align(self, store: PassageStore, scratch: Path, progress: bool, log: Callable[[str], None]) -> np.ndarray:
        """float32 [N, D] memory map at ``scratch``: row r holds the vector of the store's passage r."""
        n = len(store)
        table = IdTable(store, progress)
        filled = np.zeros(n, dtype=bool)
        aligned = None
        unknown, unknown_examples = 0, []
        first_source = None
        for ids, vecs, source in self._batches():
            first_source = first_source or source
            ids, vecs = self._checked(list(ids), vecs, source)
            if aligned is None:
                aligned = np.lib.format.open_memmap(scratch, mode="w+", dtype=np.float32, shape=(n, self.dim))
            rows = table.lookup(ids)
            known = rows >= 0
            if not known.all():
                unknown += int((~known).sum())
                unknown_examples += [ids[j] for j in np.flatnonzero(~known)[:5 - len(unknown_examples)]]
            krows = rows[known]
            if len(krows):
                uniq, counts = np.unique(krows, return_counts=True)
                dup_rows = np.concatenate([krows[filled[krows]], uniq[counts > 1]])
                if len(dup_rows):
                    raise UserError(f"passage id {store.id(int(dup_rows[0]))!r} has more than one vector",
                                    path=source, fix="pass each vectors shard once")
            aligned[krows] = vecs[known]
            filled[krows] = True
        if aligned is None:
            raise UserError("the vectors files hold no vectors", path=first_source, fix="check the files")
        self._check_complete(store, filled)
        if unknown:
            log(f"ignored {unknown} vectors whose ids are not in {self.passages_path or 'the passages'} "
                f"(e.g. {', '.join(unknown_examples)})")
        aligned.flush()
        return aligned

    def _checked(self, ids: List[str], vecs, source: str):
        """``(ids, float32 vectors)`` of one batch, of the shape and dimension of every other one."""
        vecs = np.asarray(vecs, dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != len(ids):
            raise UserError(f"vectors have shape {vecs.shape} for {len(ids)} ids", path=source,
                            fix="one vector per passage id")
        if self.dim is None:
            self.dim = int(vecs.shape[1])
            want = self._identity.get("dim")
            if want is not None and int(want) != self.dim:
                raise UserError(f"vectors have dimension {self.dim}, the encoder identity says {want}",
                                path=source, fix="name the encoder that made these vectors (--encoder-spec / "
                                                 "--encoder-identity)")
        if vecs.shape[1] != self.dim:
            raise UserError(f"vectors have dimension {vecs.shape[1]}, earlier ones {self.dim}", path=source,
                            fix="all vectors must come from the same encoder")
        return ids, vecs

    def _check_complete(self, store: PassageStore, filled: np.ndarray) -> None:
        missing = np.flatnonzero(~filled)
        if len(missing):
            examples = ", ".join(repr(store.id(int(r))) for r in missing[:5])
            raise UserError(f"{len(missing)} of {len(store)} passages have no vector, e.g. ids {examples}",
                            path=self.passages_path, fix=self.missing_fix)


def use_index_file(path: str, vectors: np.ndarray, log: Callable[[str], None] = print):
    """An existing FAISS index over ``vectors`` (same rows, same order), checked: same count and
    dimension, inner-product metric, and (where the index can reconstruct vectors) a spot check
    that its rows are the vectors' rows. Returns the loaded index."""
    faiss = faiss_index._faiss()
    index = faiss_index.read_index(path, shared=True)
    n, dim = vectors.shape
    if index.d != dim or index.ntotal != n:
        raise UserError(f"index holds {index.ntotal} vectors of dimension {index.d}, the passages are {n} "
                        f"with vectors of dimension {dim}", path=path,
                        fix="pass the index built over these passages in this order, or leave --faiss-index out")
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise UserError("index is not an inner-product (MIPS) index", path=path,
                        fix="leave --faiss-index out: an index is then built with --index-factory")
    sample = np.unique(np.linspace(0, n - 1, num=min(n, 8)).astype(np.int64))
    try:
        recon = np.stack([index.reconstruct(int(i)) for i in sample])
    except RuntimeError:  # this index type cannot reconstruct: the count and size checks stand
        log(f"{path}: rows not spot-checked (the index cannot reconstruct vectors)")
        return index
    own = np.asarray(vectors[sample], dtype=np.float32)
    dist = ((recon[:, None, :] - own[None, :, :]) ** 2).sum(-1)  # [sample, sample]
    if len(sample) > 1 and not np.array_equal(dist.argmin(1), np.arange(len(sample))):
        raise UserError("index rows are not in the order of the passages (spot check of reconstructed vectors)",
                        path=path, fix="pass the index built over these passages in this order")
    return index
