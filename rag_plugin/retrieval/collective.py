"""Search a sharded knowledge source whose shards are spread over the processes of a torch.distributed job
(torchrun / fairseq's launcher; gloo on CPU, NCCL on GPU): :class:`CollectiveSearch`.

Per call, every rank of the group takes part (in a training step every rank retrieves for its batch):

1. the ranks all-gather their batch sizes, ``k`` and whether vectors are wanted (which must agree), then
   their question vectors, so every rank has the job's Q questions in rank order;
2. every rank searches the shards it holds (:func:`rag_plugin.retrieval.shards.assign_holders`) for its part
   of the questions (a shard held by h ranks: each searches Q/h of them) and merges its candidates per
   question: the top k of its shards, with each candidate's row, score and stored vector;
3. one all-to-all sends each rank the candidates for its own questions from every rank (B x k x (D + 2)
   numbers per rank and peer, nothing else), and each rank merges them into the exact top k, ties by row
   (:func:`rag_plugin.retrieval.parts.merge_top_k`).

No process holds the whole index; the result equals the unsharded index's (for Flat: ids and scores
exactly). The gradient path is unchanged: the model recomputes q.d from the returned vectors.
A rank that dies mid-collective makes the others' call fail (connection closed) or time out after the
process group's timeout (``--heartbeat-timeout`` under fairseq-train), with the one-line "lost contact" error.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.parts import NO_ROW, IndexPart, LocalSearch, merge_top_k, step_threads
from rag_plugin.retrieval.shards import assign_holders, held_by, query_slice
from rag_plugin.util.devices import current_cuda_device


def collective_device(backend: str):
    """Where the tensors of a collective over ``backend`` live: NCCL moves CUDA tensors only, and each rank's must be
    on its own GPU, the one fairseq set for it (``torch.cuda.current_device()``; not ``cuda:0``, nor ``LOCAL_RANK``'s,
    which fairseq's own launcher and SLURM never set); gloo (and the others) CPU tensors."""
    if str(backend).lower() == "nccl":
        return current_cuda_device()
    return torch.device("cpu")


class CollectiveSearch:
    """Exact top-k over shards held across a process group; every rank must call :meth:`search` together."""

    def __init__(self, held: Dict[int, IndexPart], holders: List[List[int]], count: int, dim: int,
                 group=None, nprobe: Optional[int] = None):
        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.held, self.holders = held, holders
        self.count, self.dim, self.nprobe = int(count), int(dim), nprobe
        self.local = LocalSearch(list(held.values()), count, dim, nprobe)
        self.parts = self.local.parts
        self.device = collective_device(dist.get_backend(group))

    def search(self, queries: np.ndarray, k: int, threads: Optional[int] = None,
               compute_threads: Optional[int] = None, with_vectors: bool = False):
        """(scores [B, k], rows [B, k], stored vectors [B, k, D] or None) for this rank's ``queries``."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        sizes = self._agree(len(queries), k, with_vectors)
        everyone = self._all_queries(queries, sizes)
        if threads is None:
            threads = step_threads(self.parts, len(everyone), compute_threads)
        scores, rows = self._search_held(everyone, k, threads)
        vectors = self.local.vectors_of(rows) if with_vectors else None
        mine = self._exchange(scores, rows, vectors, sizes)
        out_s, out_r, out_v = merge_top_k(mine[0], mine[1], k, mine[2] if with_vectors else None)
        faiss_index.check_all_found(out_r, k, self.nprobe)
        return out_s, out_r, out_v

    # ------------------------------------------------------------------ the three steps
    def _tensor(self, array: np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _agree(self, batch: int, k: int, with_vectors: bool) -> List[int]:
        """All-gather (batch, k, with_vectors); every rank must ask for the same k and vectors or not."""
        mine = self._tensor(np.asarray([batch, k, int(with_vectors)], dtype=np.int64))
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(gathered, mine, group=self.group)
        table = np.stack([g.cpu().numpy() for g in gathered])
        if (table[:, 1] != k).any() or (table[:, 2] != int(with_vectors)).any():
            raise RuntimeError(f"ranks disagree on k or on fetching vectors in a collective search: {table.tolist()}")
        return [int(b) for b in table[:, 0]]

    def _all_queries(self, queries: np.ndarray, sizes: List[int]) -> np.ndarray:
        """Every rank's questions, in rank order: [sum(sizes), D]."""
        most = max(sizes)
        padded = np.zeros((most, self.dim), dtype=np.float32)
        padded[:len(queries)] = queries
        mine = self._tensor(padded)
        gathered = [torch.empty_like(mine) for _ in range(self.world)]
        self.dist.all_gather(gathered, mine, group=self.group)
        return np.concatenate([g.cpu().numpy()[:n] for g, n in zip(gathered, sizes)])

    def _search_held(self, everyone: np.ndarray, k: int, threads: Optional[int]):
        """This rank's candidates for all questions: the top k of the shards it holds, searched for its
        part of the questions (row -1 elsewhere)."""
        total = len(everyone)
        scores = np.full((total, k), -np.inf, dtype=np.float32)
        rows = np.full((total, k), NO_ROW, dtype=np.int64)
        for number, part in self.held.items():
            part_slice = query_slice(self.holders[number], self.rank, total)
            if part_slice.stop <= part_slice.start:
                continue
            found_s, found_r = part.search(everyone[part_slice], k, threads)
            merged = merge_top_k([scores[part_slice], found_s], [rows[part_slice], found_r], k)
            scores[part_slice], rows[part_slice] = merged[0], merged[1]
        return scores, rows

    def _exchange(self, scores: np.ndarray, rows: np.ndarray, vectors: Optional[np.ndarray], sizes: List[int]):
        """All-to-all: send each rank the candidates for its questions; returns this rank's
        ([scores per peer], [rows per peer], [vectors per peer] or absent)."""
        total, k = rows.shape
        fields = [scores[:, :, None], rows.view(np.float32).reshape(total, k, 2)]  # int64 rows as 2 float32 words
        if vectors is not None:
            fields.append(vectors)
        packed = self._tensor(np.concatenate(fields, axis=2).astype(np.float32, copy=False))
        width = packed.shape[2]
        mine = sizes[self.rank]
        received = torch.empty((mine * self.world, k, width), dtype=torch.float32, device=packed.device)
        self.dist.all_to_all_single(received, packed, output_split_sizes=[mine] * self.world,
                                    input_split_sizes=sizes, group=self.group)
        got = received.cpu().numpy().reshape(self.world, mine, k, width)
        peer_scores = [got[p, :, :, 0] for p in range(self.world)]
        peer_rows = [np.ascontiguousarray(got[p, :, :, 1:3]).view(np.int64).reshape(mine, k)
                     for p in range(self.world)]
        if vectors is None:
            return peer_scores, peer_rows
        return peer_scores, peer_rows, [got[p, :, :, 3:] for p in range(self.world)]


def job_searcher(knowledge, placement: str = "rank", log=None):
    """The searcher for this process of a job: a :class:`CollectiveSearch` over the shards this rank holds
    when the knowledge source is sharded, torch.distributed is initialised with more than one process and
    ``placement`` is not ``local``; else None (the process searches every shard itself)."""
    if knowledge.num_shards == 1 or placement == "local":
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    holders = assign_holders(knowledge.num_shards, world, placement)
    held = {s: knowledge.part(s) for s in held_by(holders, rank)}
    if log is not None:
        log(f"rank {rank} of {world} holds index shards {sorted(held)} of {knowledge.num_shards} ({placement} "
            f"placement, {', '.join(sorted({p.how for p in held.values()}))})")
    return CollectiveSearch(held, holders, len(knowledge), knowledge.dim,
                            nprobe=knowledge.search_params.get("nprobe"))
