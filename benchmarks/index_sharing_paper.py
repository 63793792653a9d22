"""The index-sharing benchmark's paper-scale estimate: bytes per passage and recall@k against Flat measured on
(a prefix of) the synthetic collection with :func:`retrieval_indexes.bench_indexes`, projected to the paper's
21M passages x 768 dimensions.

Projection: an index's bytes per passage = its codes (Flat 4*d, SQ8 d, PQm m bytes) + what depends neither on the
dimension nor on the collection's size (measured minus codes minus IVF centroids: ids, HNSW links) + the IVF
centroids of ``--paper-nlist-target`` lists at the paper's dimension spread over its passages. A PQ index at 768
keeps the dims per sub-quantizer of the one measured at 384 (PQ32 at 384 -> PQ64 at 768); an IVF index is
assumed searched with the same fraction of its lists probed. The recall given is the one measured: recall on
jittered copies of 12k real vectors is a proxy, not Wikipedia's.
"""
from __future__ import annotations

import math
import re
from argparse import Namespace
from pathlib import Path
from typing import Dict, List

import numpy as np
from retrieval_common import log
from retrieval_indexes import auto_nlist, bench_indexes

GIB = 2 ** 30


def code_bytes(factory: str, dim: int) -> float:
    """Bytes of one vector's code, without ids or links."""
    pq = re.search(r"PQ(\d+)", factory)
    if pq:
        return float(pq.group(1))
    if "SQ8" in factory:
        return float(dim)
    return 4.0 * dim  # Flat, HNSW32 (flat codes)


def ivf_lists(factory: str) -> int:
    found = re.match(r"IVF(\d+)", factory)
    return int(found.group(1)) if found else 0


def at_dim(factory: str, measured_dim: int, dim: int, nlist: int) -> str:
    """The same index at ``dim``: PQ keeps its dims per sub-quantizer, IVF gets ``nlist`` lists."""
    pq = re.search(r"PQ(\d+)", factory)
    if pq:
        m = int(pq.group(1)) * dim // measured_dim
        factory = factory[:pq.start()] + f"PQ{m}" + factory[pq.end():]
    if ivf_lists(factory):
        factory = re.sub(r"^IVF\d+", f"IVF{nlist}", factory)
    return factory


def measure(vectors_path: Path, n: int, queries: np.ndarray, args) -> List[Dict]:
    """bench_indexes rows over the first ``n`` synthetic vectors (Flat first, as the ground truth)."""
    vectors = np.ascontiguousarray(np.load(vectors_path, mmap_mode="r")[:n], dtype=np.float32)
    ns = Namespace(nlist=args.paper_nlist, train_size=args.paper_train_size, recall_at="1,5,20", pq_m=48,
                   seed=0, ef_search=args.paper_ef_search, nprobe=args.paper_nprobe, batch_size=64, repeats=1)
    log(f"paper scale: measuring {args.paper_factories} over {n} synthetic vectors "
        f"(nlist {args.paper_nlist or auto_nlist(n, args.paper_train_size)})")
    return bench_indexes(vectors, queries, ns, f"synthetic {n}", args.paper_factories)


def project(rows: List[Dict], measured_dim: int, args, passage_store_bytes_per_passage: float) -> Dict:
    """The paper table: every measured (factory, search setting) row projected to ``args.paper_passages`` x
    ``args.paper_dim`` on nodes of ``args.node_ram_gib`` usable GiB running ``args.ranks_per_node`` ranks."""
    n, dim = args.paper_passages, args.paper_dim
    vectors_gib = n * dim * 4 / GIB
    store_gib = n * passage_store_bytes_per_passage / GIB
    nlist = args.paper_nlist_target or 2 ** round(math.log2(4 * math.sqrt(n)))
    out = []
    for r in rows:
        if "error" in r:
            continue
        lists = ivf_lists(r["factory"])
        overhead = (r["bytes_per_passage"] - code_bytes(r["factory"], measured_dim)
                    - lists * measured_dim * 4 / r["n"])
        factory = at_dim(r["factory"], measured_dim, dim, nlist)
        per_passage = code_bytes(factory, dim) + overhead + (nlist * dim * 4 / n if lists else 0)
        index_gib = per_passage * n / GIB
        search = f"{r['param']}={r['value']}" if r["param"] else "exact"
        if lists and r["param"] == "nprobe":
            search = f"{r['value'] / lists:.1%} of lists (nprobe={r['value']} of {lists})"
        out.append({"factory": factory, "measured_as": r["factory"], "search": search,
                    "bytes_per_passage_measured": r["bytes_per_passage"], "bytes_per_passage": per_passage,
                    "index_gib": index_gib, "disk_gib": index_gib + vectors_gib + store_gib,
                    "private_ram_gib": index_gib * args.ranks_per_node, "mapped_ram_gib": index_gib,
                    "nodes": max(1, math.ceil(index_gib / args.node_ram_gib)),
                    "private_ranks_fit": int(args.node_ram_gib // index_gib),
                    **{k: r[k] for k in r if k.startswith("recall@")}})
    return {"assumptions": {"passages": n, "dim": dim, "usable_ram_gib": args.node_ram_gib,
                            "ranks_per_node": args.ranks_per_node, "vectors_gib": vectors_gib,
                            "passage_store_gib": store_gib,
                            "passage_store_bytes_per_passage": passage_store_bytes_per_passage},
            "measured_dim": measured_dim, "measured_n": rows[0]["n"], "target_nlist": nlist, "measured": rows,
            "rows": out}
