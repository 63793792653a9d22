"""Write a knowledge source's index in S shards (``rag-build-knowledge --num-shards S``): the layout is
described in :mod:`rag_plugin.retrieval.shards`.

Shard s holds the contiguous rows [s*N//S, (s+1)*N//S). Every shard is a copy of one template index whose
quantizer (IVF, PQ, SQ) was trained once on a sample of the whole collection (kept in
``.build/trained.faiss`` so a resumed build uses the same one), then given its rows: so a Flat shard set
returns exactly the unsharded index's results and an approximate one searches with the same codebooks.
HNSW graphs are built per shard. Each shard's files are written atomically and the shard is recorded done
in ``.build/index-shards/NNNNN.json`` (its manifest entry), so a rerun skips finished shards; a process of
a distributed build writes only the shards it owns.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import BUILD_DIR
from rag_plugin.retrieval.shards import ShardEntry, shard_dir
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json


def shard_bounds(n: int, num_shards: int) -> List[Tuple[int, int]]:
    """The row ranges [start, end) of ``num_shards`` contiguous shards of ``n`` rows (sizes differ by <= 1)."""
    if num_shards < 1:
        raise UserError(f"--num-shards must be at least 1, got {num_shards}", fix="use --num-shards 1 or more")
    if num_shards > n:
        raise UserError(f"--num-shards {num_shards} is more than the {n} passages", fix=f"use at most {n} shards")
    return [(s * n // num_shards, (s + 1) * n // num_shards) for s in range(num_shards)]


def _done_path(out: Path, number: int) -> Path:
    return out / BUILD_DIR / "index-shards" / f"{number:05d}.json"


def template_index(out: Path, vectors: np.ndarray, factory: str, train_size: int, seed: int):
    """The trained, empty index every shard copies (trained once, kept in ``.build/trained.faiss``)."""
    path = out / BUILD_DIR / "trained.faiss"
    if path.is_file():
        return faiss_index.read_index(str(path))
    template = faiss_index.trained_index(vectors, factory, train_size, seed)
    faiss_index.write_index(template, str(path))
    return template


def write_shard(out: Path, number: int, bounds: Tuple[int, int], vectors: np.ndarray, template,
                progress: bool) -> ShardEntry:
    """Shard ``number``'s vectors and index under ``out/shards/NNNNN/`` (each file atomically), recorded done."""
    done = _done_path(out, number)
    if done.is_file():
        return ShardEntry(number=number, **json.loads(done.read_text(encoding="utf-8")))
    start, end = bounds
    d = out / shard_dir(number)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / "vectors.npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, np.ascontiguousarray(vectors[start:end], dtype=np.float32), allow_pickle=False)
    index = _faiss_clone(template)
    faiss_index.add_vectors(index, vectors[start:end], f"index shard {number}", progress=progress)
    faiss_index.write_index(index, str(d / "index.faiss"))
    entry = ShardEntry.of_files(out, number, start, end)
    done.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(done, entry.to_json())
    return entry


def _faiss_clone(template):
    return faiss_index._faiss().clone_index(template)


def write_shards(out: Path, vectors: np.ndarray, factory: str, num_shards: int, train_size: int, seed: int,
                 progress: bool, log: Callable[[str], None], numbers: Optional[Iterable[int]] = None
                 ) -> List[ShardEntry]:
    """Write the shards ``numbers`` (default: all) of ``vectors`` cut into ``num_shards``; returns their entries."""
    bounds = shard_bounds(len(vectors), num_shards)
    template = template_index(out, vectors, factory, train_size, seed)
    entries = []
    for number in (range(num_shards) if numbers is None else numbers):
        entries.append(write_shard(out, number, bounds[number], vectors, template, progress))
    log(f"index shards: {', '.join(str(e.number) for e in entries)} of {num_shards} written")
    return entries


def finished_entries(out: Path, num_shards: int) -> List[ShardEntry]:
    """The entries of all ``num_shards`` shards, each recorded done (by whichever process wrote it)."""
    missing = [s for s in range(num_shards) if not _done_path(out, s).is_file()]
    if missing:
        raise UserError(f"index shards {missing[:5]} of {num_shards} are not written yet", path=str(out),
                        fix="rerun the same build command to finish them")
    return [ShardEntry(number=s, **json.loads(_done_path(out, s).read_text(encoding="utf-8")))
            for s in range(num_shards)]
