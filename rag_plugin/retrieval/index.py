"""FAISS maximum-inner-product index: build from a factory string, search, save, load.

All indexes use ``METRIC_INNER_PRODUCT`` (the paper's MIPS): ``Flat`` is exact, ``HNSW32``
is a graph, ``IVF4096,SQ8`` is the paper's compressed form (8-bit scalar quantisation),
``IVF256,PQ32`` product quantisation. Quantizers are trained on a random sample of the
vectors. ``nprobe`` (IVF) and ``efSearch`` (HNSW) are set at search time.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from tqdm import tqdm

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path

logger = logging.getLogger(__name__)


def _faiss():
    import faiss  # start-up: FAISS (its libraries, its CPU-feature probing) only where an index is built or read

    return faiss


def set_faiss_threads(n: Optional[int] = None) -> None:
    """Use ``n`` threads in FAISS (default: the CPUs this process may run on)."""
    n = n or len(os.sched_getaffinity(0))
    _faiss().omp_set_num_threads(max(1, n))


def build_index(vectors: np.ndarray, factory: str, train_size: int = 100_000, seed: int = 0,
                add_batch: int = 65536, progress: bool = True):
    """Build an inner-product index over ``vectors`` [N, D] float32 from a factory string."""
    index = trained_index(vectors, factory, train_size, seed)
    add_vectors(index, vectors, f"index {factory}", add_batch, progress)
    return index


def trained_index(vectors: np.ndarray, factory: str, train_size: int = 100_000, seed: int = 0):
    """An empty inner-product index from a factory string, its quantizer (if any) trained on a random
    sample of at most ``train_size`` of ``vectors``: the template every shard of a collection is a copy of."""
    faiss = _faiss()
    n, dim = vectors.shape
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise UserError(f"FAISS cannot build index {factory!r}: {_faiss_reason(err)}",
                        fix="use e.g. Flat, HNSW32, IVF256,SQ8 or IVF256,PQ16") from None
    if not index.is_trained:
        _check_enough_to_train(index, factory, n)
        sample = vectors
        if n > train_size:
            rng = np.random.default_rng(seed)
            sample = vectors[np.sort(rng.choice(n, size=train_size, replace=False))]
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def add_vectors(index, vectors: np.ndarray, desc: str, add_batch: int = 65536, progress: bool = True) -> None:
    """Add ``vectors`` to ``index`` in batches (read from a memory map a batch at a time)."""
    n = len(vectors)
    bar = None
    if progress:
        bar = tqdm(total=n, desc=desc, unit=" vec", mininterval=1.0)
    for start in range(0, n, add_batch):
        chunk = np.ascontiguousarray(vectors[start:start + add_batch], dtype=np.float32)
        index.add(chunk)
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()


def _faiss_reason(err: RuntimeError) -> str:
    """FAISS's message without its C++ location ("Error in ... at file.cpp:123: what")."""
    text = " ".join(str(err).split())
    return text.rsplit(": ", 1)[-1] if " at " in text and ".cpp:" in text else (text or "invalid")


def check_factory(factory: str, dim: int, n: int) -> None:
    """Raise :class:`UserError` now, before hours of embedding, if :func:`build_index` would
    refuse ``factory`` for ``n`` vectors of dimension ``dim``."""
    faiss = _faiss()
    try:
        index = faiss.index_factory(int(dim), factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise UserError(f"FAISS cannot build index {factory!r} for dimension {dim}: {_faiss_reason(err)}",
                        fix="use e.g. Flat, HNSW32, IVF256,SQ8 or IVF256,PQ16 (PQ<m>: m must divide the "
                            "dimension)") from None
    if not index.is_trained:
        _check_enough_to_train(index, factory, n)


def _ivf_nlist(index) -> Optional[int]:
    faiss = _faiss()
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        return None
    return int(ivf.nlist)


def set_search_params(index, nprobe: Optional[int] = None, ef_search: Optional[int] = None) -> None:
    """Set IVF ``nprobe`` and/or HNSW ``efSearch`` where the index has them."""
    faiss = _faiss()
    params = faiss.ParameterSpace()
    if nprobe is not None:
        if _ivf_nlist(index) is None:
            raise UserError("--nprobe applies to IVF indexes only", fix="drop --nprobe")
        params.set_index_parameter(index, "nprobe", int(nprobe))
    if ef_search is not None:
        try:
            params.set_index_parameter(index, "efSearch", int(ef_search))
        except RuntimeError:
            raise UserError("--ef-search applies to HNSW indexes only", fix="drop --ef-search") from None


def search(index, queries: np.ndarray, k: int, threads: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Top-``k`` by inner product: (scores float32 [B, k], rows int64 [B, k]), best first.

    ``threads``: FAISS threads for this call only (default: FAISS's current setting).
    """
    if k < 1:
        raise UserError(f"k must be at least 1, got {k}", fix="ask for 1 or more passages")
    if k > index.ntotal:
        raise UserError(f"k={k} is larger than the collection ({index.ntotal} passages)",
                        fix=f"ask for at most {index.ntotal}")
    scores, rows = search_unchecked(index, queries, k, threads)
    _check_all_found(index, rows, k)
    return scores, rows


def search_unchecked(index, queries: np.ndarray, k: int, threads: Optional[int] = None
                     ) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`search` without the checks on ``k`` and on unfilled results (row -1): for one shard of a
    collection, whose caller asks for at most its size and checks the merged result."""
    if queries.ndim != 2 or queries.shape[1] != index.d:
        raise UserError(f"query vectors have dimension {queries.shape[-1]}, the index {index.d}",
                        fix="use the query encoder that matches the knowledge source's document encoder")
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if threads is None:
        return index.search(queries, k)
    faiss = _faiss()
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(max(1, int(threads)))
    try:
        return index.search(queries, k)
    finally:
        faiss.omp_set_num_threads(before)


def _check_all_found(index, rows: np.ndarray, k: int) -> None:
    """FAISS marks a result it could not fill with row -1 (score -3.4e38): an IVF index whose
    ``nprobe`` probed lists hold fewer than ``k`` vectors. Row -1 would read as the last passage
    everywhere downstream (numpy indexing), so it is refused here, for every caller."""
    check_all_found(rows, k, getattr(_ivf_of(index), "nprobe", None))


def check_all_found(rows: np.ndarray, k: int, nprobe: Optional[int] = None) -> None:
    """Refuse results with unfilled places (row -1); see :func:`_check_all_found`."""
    missing = rows < 0
    if missing.any():
        query = int(np.flatnonzero(missing.any(axis=1))[0])
        found = int((~missing[query]).sum())
        setting = f" with nprobe={nprobe}" if nprobe is not None else ""
        raise UserError(f"the index found only {found} of the k={k} passages asked for (query {query} of the "
                        f"batch){setting}: the probed lists hold too few vectors",
                        fix="raise --nprobe, or ask for fewer passages")


def _ivf_of(index):
    """The IVF layer of an index (through an ID map or a pre-transform), or None."""
    faiss = _faiss()
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


# Below this many multiply-adds (exact-search equivalent: queries x vectors x dimension, about
# 10 ms on one core) a search is not worth a parallel region.
SMALL_SEARCH = 100_000_000


def step_search_threads(index, n_queries: int, compute_threads: int) -> int:
    """FAISS threads for a search inside a training or decoding step.

    FAISS and torch each bring their own OpenMP runtime, whose threads spin for a while after
    every parallel region: on the cores torch is using, FAISS's threads only slow torch down.
    A small search runs on one thread; a large one on at most ``compute_threads``, the process's
    budget (:func:`rag_plugin.retrieval.threads.faiss_thread_budget`: torch's threads with the
    model on the CPU, the cores per local process with it on a GPU), and at most one thread per
    query, FAISS's unit of parallelism.
    """
    if n_queries * index.ntotal * index.d < SMALL_SEARCH:
        return 1
    return max(1, min(int(compute_threads), int(n_queries)))


def write_index(index, path: str) -> None:
    faiss = _faiss()
    with atomic_path(path) as tmp:
        faiss.write_index(index, str(tmp))


#: How :func:`read_index` loads an index: mapped so that every process on a node shares its pages, or a
#: private copy in this process's memory.
SHARED, PRIVATE = "shared", "private"


def read_index(path: str, shared: bool = False):
    """Read a FAISS index; ``shared=True`` maps it (:func:`map_index`), else a private copy."""
    index, _ = read_index_as(path, SHARED if shared else PRIVATE)
    return index


def read_index_as(path: str, mode: str = SHARED, warn=None):
    """``(index, how)``: the index at ``path`` read as ``mode`` (``"shared"`` or ``"private"``) and how it was
    actually read (``"shared"`` or ``"private"``).

    Shared: mapped read-only from the page cache, so N processes on a node hold one copy. FAISS has two
    flags: ``IO_FLAG_MMAP_IFC`` maps the codes of Flat, SQ, PQ and HNSW indexes (and, with ``IO_FLAG_MMAP``
    as well, those inside an ID map or a pre-transform), ``IO_FLAG_MMAP`` alone maps only IVF inverted
    lists, which refuse the combination ("mmap only supported for File objects"); so the combination is
    tried first, then ``IO_FLAG_MMAP_IFC`` alone. A FAISS without ``IO_FLAG_MMAP_IFC`` (older than 1.8) can
    share IVF lists only. Where no flag can map the index, ``warn`` (default: the logger) is told in one
    line and a private copy is read instead: never a crash."""
    faiss = _faiss()
    p = Path(path)
    if not p.is_file():
        raise UserError("FAISS index file missing", path=str(p),
                        fix="rebuild the knowledge source with rag-build-knowledge")
    if mode not in (SHARED, PRIVATE):
        raise ValueError(f"mode must be {SHARED!r} or {PRIVATE!r}, got {mode!r}")
    if mode == SHARED:
        for flags in _sharing_flags(faiss):
            try:
                return faiss.read_index(str(p), flags), SHARED
            except RuntimeError:
                continue
    try:
        index = faiss.read_index(str(p), 0)
    except RuntimeError:
        raise UserError("FAISS index file is corrupted or truncated", path=str(p),
                        fix="rebuild the knowledge source") from None
    if mode == SHARED:
        (warn or logger.warning)(f"{p}: FAISS {getattr(faiss, '__version__', '?')} cannot map a "
                                 f"{type(faiss.downcast_index(index)).__name__} index to share it between "
                                 "processes: this process holds a private copy")
    return index, PRIVATE


def _sharing_flags(faiss):
    """The FAISS read flags that map an index read-only, most sharing first."""
    read_only = faiss.IO_FLAG_READ_ONLY
    ifc = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    if ifc is None:
        return [faiss.IO_FLAG_MMAP | read_only]
    return [ifc | faiss.IO_FLAG_MMAP | read_only, ifc | read_only]


def index_bytes(index) -> int:
    """Serialized size of an index in bytes."""
    return int(_faiss().serialize_index(index).nbytes)


def _check_enough_to_train(index, factory: str, n: int) -> None:
    """An IVF index needs at least as many training vectors as it has lists."""
    nlist = _ivf_nlist(index)
    if nlist is not None and n < nlist:
        raise UserError(f"index {factory!r} needs at least {nlist} vectors to train its "
                        f"{nlist} lists, the collection has {n}",
                        fix=f"use fewer lists (e.g. IVF{max(1, int(np.sqrt(n)))},SQ8) or Flat")
