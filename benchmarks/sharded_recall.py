#!/usr/bin/env python
"""Recall of approximate indexes cut into S shards, against the same index unsharded and against exact search.

    python benchmarks/sharded_recall.py --knowledge data/demo/ks --synthetic 200000 --json-out runs/sharded_recall.json

A benchmark, not a test: it reports only. The collection is the knowledge source's stored vectors, plus
(``--synthetic N``) jittered copies up to N vectors (a random real vector plus Gaussian noise of relative norm
``--jitter``, renormalised: a proxy, not real passages). Queries are ``--queries`` of the stored vectors plus
noise. Shards are built as ``rag-build-knowledge --num-shards S`` builds them (rag_plugin.indexing.sharding: one
template trained on a sample of the whole collection, copied per shard, each given its contiguous rows) and
searched as one process searches them (rag_plugin.retrieval.parts.LocalSearch: every shard, exact merge).
Reported per factory, search setting and S: recall@k of the sharded search against the unsharded index of the
same type (how much sharding changes the results) and against exact Flat search (what each keeps), and the
bytes per passage.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.parts import IndexPart, LocalSearch

SETTINGS = {"IVF": [("nprobe", 8), ("nprobe", 32)], "HNSW": [("ef_search", 64), ("ef_search", 256)]}


def collection(args) -> np.ndarray:
    real = np.asarray(KnowledgeSource(args.knowledge).vectors, dtype=np.float32)
    if args.synthetic <= len(real):
        return real
    rng = np.random.default_rng(0)
    picks = real[rng.integers(0, len(real), size=args.synthetic - len(real))]
    noise = rng.standard_normal(picks.shape).astype(np.float32)
    noise *= args.jitter * np.linalg.norm(picks, axis=1, keepdims=True) / np.linalg.norm(noise, axis=1, keepdims=True)
    jittered = picks + noise
    jittered /= np.linalg.norm(jittered, axis=1, keepdims=True)
    return np.concatenate([real, jittered.astype(np.float32)])


def sharded(vectors: np.ndarray, factory: str, shards: int, train_size: int):
    template = faiss_index.trained_index(vectors, factory, train_size)
    parts = []
    for s in range(shards):
        start, end = s * len(vectors) // shards, (s + 1) * len(vectors) // shards
        index = faiss_index._faiss().clone_index(template)
        faiss_index.add_vectors(index, vectors[start:end], "", progress=False)
        parts.append(IndexPart(index, vectors[start:end], start, "private", f"shard {s}"))
    return parts


def recall(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([len(set(x) & set(y)) / len(y) for x, y in zip(a, b)]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--knowledge", default="data/demo/ks")
    p.add_argument("--synthetic", type=int, default=200_000)
    p.add_argument("--jitter", type=float, default=0.5)
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--factories", nargs="+", default=["IVF1024,SQ8", "HNSW32", "HNSW32,SQ8", "IVF1024,PQ48"])
    p.add_argument("--train-size", type=int, default=100_000)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    faiss_index.set_faiss_threads()
    x = collection(args)
    rng = np.random.default_rng(1)
    q = x[rng.integers(0, len(x), size=args.queries)] + 0.05 * rng.standard_normal((args.queries, x.shape[1]))
    q = q.astype(np.float32)
    exact = faiss_index.search(faiss_index.build_index(x, "Flat", progress=False), q, args.k)[1]
    rows = []
    for factory in args.factories:
        whole = faiss_index.build_index(x, factory, train_size=args.train_size, progress=False)
        nbytes = faiss_index.index_bytes(whole)
        kind = "IVF" if factory.startswith("IVF") else "HNSW" if factory.startswith("HNSW") else None
        by_shards = {s: sharded(x, factory, s, args.train_size) for s in args.shards}
        for name, value in SETTINGS.get(kind, [(None, None)]):
            params = {name: value} if name else {}
            faiss_index.set_search_params(whole, **params)
            one = faiss_index.search(whole, q, args.k)[1]
            rows.append({"factory": factory, "setting": f"{name}={value}" if name else "", "shards": 1,
                         "bytes_per_passage": nbytes / len(x), "recall_vs_unsharded": 1.0,
                         "recall_vs_exact": recall(one, exact)})
            for s, parts in by_shards.items():
                for part in parts:
                    faiss_index.set_search_params(part.index, **params)
                t0 = time.perf_counter()
                got = LocalSearch(parts, len(x), x.shape[1]).search(q, args.k)[1]
                rows.append({"factory": factory, "setting": rows[-1]["setting"], "shards": s,
                             "bytes_per_passage": sum(faiss_index.index_bytes(pt.index) for pt in parts) / len(x),
                             "recall_vs_unsharded": recall(got, one), "recall_vs_exact": recall(got, exact),
                             "search_seconds": time.perf_counter() - t0})
            for r in rows[-1 - len(by_shards):]:
                print(f"| {r['factory']} | {r['setting']} | {r['shards']} | {r['bytes_per_passage']:.1f} | "
                      f"{r['recall_vs_unsharded']:.4f} | {r['recall_vs_exact']:.4f} |", flush=True)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"collection": len(x), "dim": int(x.shape[1]), "k": args.k,
                                                   "queries": args.queries, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
