"""A knowledge source in S index shards: their layout, their manifest entries and checks, and which
processes of a job hold which shard.

Layout of a sharded source (``rag-build-knowledge --num-shards S``; an unsharded one has ``index.faiss``
and ``vectors.npy`` at the top instead)::

    shards/00000/index.faiss   a complete FAISS index over the rows [start, end) of the collection
                               (FAISS ids 0 .. end-start-1: row = start + id)
    shards/00000/vectors.npy   float32 [end - start, D], the stored document vectors of those rows
    shards/00001/...           the next contiguous slice, and so on

The manifest lists each shard (:class:`ShardEntry`: row range, file names, sizes and sampled checksums,
:func:`rag_plugin.util.io.sampled_sha256`), so a shard that is missing, truncated or from another build is
refused by name when it is opened. The passage store stays whole (every process reads the passages of the
rows it is handed, from any shard).

:func:`assign_holders` decides which processes of a job hold (map and search) each shard.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import sampled_sha256

SHARDS_DIR = "shards"
#: Where a job's shards live: each process holds its own shards ("rank"), every process of a node holds
#: the node's shards and they split its searches ("node"), or every process holds every shard ("local").
PLACEMENTS = ("rank", "node", "local")


def shard_dir(number: int) -> str:
    """The directory of shard ``number``, relative to the knowledge source."""
    return f"{SHARDS_DIR}/{number:05d}"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest records it (paths relative to the knowledge source)."""

    number: int
    start: int
    end: int
    index: str
    vectors: str
    index_bytes: int
    index_checksum: str
    vectors_bytes: int
    vectors_checksum: str

    @property
    def rows(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"index shard {self.number} (rows {self.start}-{self.end - 1})"

    @classmethod
    def of_files(cls, directory, number: int, start: int, end: int) -> "ShardEntry":
        """The entry of shard ``number`` whose files were just written under ``directory``."""
        d = Path(directory)
        index, vectors = f"{shard_dir(number)}/index.faiss", f"{shard_dir(number)}/vectors.npy"
        return cls(number, start, end, index, vectors, (d / index).stat().st_size, sampled_sha256(d / index),
                   (d / vectors).stat().st_size, sampled_sha256(d / vectors))

    def to_json(self) -> dict:
        out = asdict(self)
        del out["number"]
        return out


def read_entries(manifest: dict, manifest_path: str) -> Optional[List[ShardEntry]]:
    """The shard entries of a manifest (None for an unsharded source), checked to tile the collection."""
    listed = manifest.get("shards")
    if listed is None:
        return None
    count = int(manifest["count"])
    try:
        entries = [ShardEntry(number=i, **{k: (int(v) if k in ("start", "end", "index_bytes", "vectors_bytes")
                                               else str(v)) for k, v in e.items()})
                   for i, e in enumerate(listed)]
    except (TypeError, ValueError, AttributeError):
        raise UserError("manifest lists shards in an unknown format", path=manifest_path,
                        fix="rebuild the knowledge source") from None
    expected = 0
    for e in entries:
        if e.start != expected or e.end <= e.start:
            raise UserError(f"manifest's {e.describe()} does not continue from row {expected}", path=manifest_path,
                            fix="rebuild the knowledge source")
        expected = e.end
    if not entries or expected != count:
        raise UserError(f"manifest's shards cover {expected} rows, the collection has {count}", path=manifest_path,
                        fix="rebuild the knowledge source")
    return entries


def check_shard_files(directory: Path, entry: ShardEntry) -> None:
    """Refuse a shard whose files are missing, truncated, or not the ones this manifest was written with."""
    for name, size, checksum in ((entry.index, entry.index_bytes, entry.index_checksum),
                                 (entry.vectors, entry.vectors_bytes, entry.vectors_checksum)):
        path = Path(directory) / name
        if not path.is_file():
            raise UserError(f"{entry.describe()} is missing", path=str(path),
                            fix="copy the shard from the machine that built it, or rebuild the knowledge source")
        actual = path.stat().st_size
        if actual != size:
            raise UserError(f"{entry.describe()} is {actual} bytes, the manifest says {size}: truncated or from "
                            "another build", path=str(path),
                            fix="copy the shard again, or rebuild the knowledge source")
        if sampled_sha256(path) != checksum:
            raise UserError(f"{entry.describe()} does not match the manifest checksum: it is from another build",
                            path=str(path), fix="copy this build's shard, or rebuild the knowledge source")


def assign_holders(num_shards: int, world_size: int, placement: str = "rank",
                   local_world_size: Optional[int] = None) -> List[List[int]]:
    """For each shard, the ranks that hold it (ascending): the ranks that map it and split its searches.

    ``rank``: shards in contiguous blocks over the ranks (S >= N: shard s on rank s*N//S, each rank holds
    S/N shards; S < N: rank r holds shard r*S//N, and the ranks sharing a shard split its queries).
    ``node``: the same over nodes (torchrun numbers the ranks of a node contiguously), every rank of a node
    holding all of the node's shards. ``local``: every rank holds every shard (no collective search).
    """
    if placement not in PLACEMENTS:
        raise UserError(f"unknown shard placement {placement!r}", fix=f"use one of {', '.join(PLACEMENTS)}")
    if num_shards < 1 or world_size < 1:
        raise ValueError("num_shards and world_size must be >= 1")
    if placement == "local":
        return [list(range(world_size)) for _ in range(num_shards)]
    if placement == "node":
        per_node = int(local_world_size or os.environ.get("LOCAL_WORLD_SIZE") or 0)
        if per_node < 1 or world_size % per_node:
            raise UserError(f"shard placement 'node' needs the same number of processes on every node (world size "
                            f"{world_size}, {per_node or 'unknown'} per node)",
                            fix="launch with torchrun (it sets LOCAL_WORLD_SIZE), or use --shard-placement rank")
        nodes = assign_holders(num_shards, world_size // per_node, "rank")
        return [[n * per_node + i for n in held for i in range(per_node)] for held in nodes]
    if num_shards >= world_size:
        return [[s * world_size // num_shards] for s in range(num_shards)]
    return [[r for r in range(world_size) if r * num_shards // world_size == s] for s in range(num_shards)]


def held_by(holders: List[List[int]], rank: int) -> List[int]:
    """The shards ``rank`` holds."""
    return [s for s, ranks in enumerate(holders) if rank in ranks]


def query_slice(holders: List[int], rank: int, total: int) -> slice:
    """The part of ``total`` gathered queries that ``rank`` searches in a shard held by ``holders``."""
    j, h = holders.index(rank), len(holders)
    return slice(j * total // h, (j + 1) * total // h)
