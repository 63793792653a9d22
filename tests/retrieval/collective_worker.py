"""A process of a collective search test (tests/retrieval/test_collective.py), launched by torchrun.

    collective_worker.py KS_DIR QUERIES.npy OUT_DIR K PLACEMENT SIZES

Each rank takes its questions (SIZES: comma-separated batch sizes per rank, in rank order, may be 0) out
of QUERIES.npy, searches them with the job's collective searcher over the sharded KS_DIR (twice: the
second call with other batch sizes is what a next training step does), and writes its results to
OUT_DIR/rank{R}.npz with the shards it held and the private bytes of its process.
"""
import os
import sys

import numpy as np
import torch.distributed as dist

from rag_plugin.retrieval.collective import job_searcher
from rag_plugin.retrieval.knowledge import KnowledgeSource


def main(ks_dir, queries_path, out_dir, k, placement, sizes):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [int(s) for s in sizes.split(",")]
    assert len(sizes) == world, (sizes, world)
    queries = np.load(queries_path)
    start = sum(sizes[:rank])
    mine = queries[start:start + sizes[rank]]
    searcher = job_searcher(KnowledgeSource(ks_dir), placement)
    scores, rows, vectors = searcher.search(mine, int(k), with_vectors=True)
    again = searcher.search(queries[:rank + 1], int(k), with_vectors=False)  # another step, other sizes
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), scores=scores, rows=rows, vectors=vectors,
             again_scores=again[0], again_rows=again[1], held=np.asarray(sorted(searcher.held), dtype=np.int64))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
