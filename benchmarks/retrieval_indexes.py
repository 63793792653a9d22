"""The retrieval benchmark's index part: FAISS factories built over a set of vectors, timed
(build, queries/s) and measured (bytes per passage, recall@k against the exact Flat top-k) for
each nprobe / efSearch setting."""
from __future__ import annotations

import statistics
import time
from typing import Dict, List, Tuple

import numpy as np
from retrieval_common import int_list, log, timed

DEFAULT_FACTORIES = "Flat;HNSW32;IVF{nlist},SQ8;IVF{nlist},PQ{m};IVF{nlist},PQ{m}np"
# PQ{m} (what build_index makes of "IVF..,PQ..") runs FAISS's polysemous training, a fixed ~1 min
# of single-threaded work per index that only serves Hamming pre-filtering (off by default);
# PQ{m}np skips it and searches identically. The synthetic collection uses np only.
DEFAULT_SYNTHETIC_FACTORIES = "Flat;HNSW32;IVF{nlist},SQ8;IVF{nlist},PQ{m}np"



def split_factories(text: str) -> List[str]:
    """``"Flat,HNSW32,IVF{nlist},SQ8"`` -> ["Flat", "HNSW32", "IVF{nlist},SQ8"]: a part that
    does not start a new index (Flat/HNSW/IVF/PQ/SQ/OPQ/PCA/IDMap/LSH) belongs to the previous one.
    Separate factories with ``;`` to avoid the guessing."""
    if ";" in text:
        return [f.strip() for f in text.split(";") if f.strip()]
    starts = ("Flat", "HNSW", "IVF", "PQ", "SQ", "OPQ", "PCA", "IDMap", "LSH", "NSG", "RFlat")
    out: List[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if out and not part.startswith(starts):
            out[-1] += "," + part
        elif (out and part.startswith(("SQ", "PQ", "Flat", "RFlat"))
              and out[-1].startswith(("IVF", "OPQ", "PCA", "IDMap")) and "," not in out[-1]):
            out[-1] += "," + part  # IVF256 + SQ8 -> IVF256,SQ8
        else:
            out.append(part)
    return out



def auto_nlist(n: int, train_size: int) -> int:
    """A power of two near 4*sqrt(n), with at least 39 training vectors per list."""
    target = min(4 * np.sqrt(n), min(n, train_size) / 39)
    return int(max(1, 2 ** int(np.floor(np.log2(max(target, 1))))))



def qps(index, queries: np.ndarray, k: int, batch: int, repeats: int) -> Tuple[float, np.ndarray]:
    """Median queries/s over ``repeats`` passes (batches of ``batch``) and the top-k rows."""
    from rag_plugin.retrieval.index import search

    rates, rows = [], None
    for _ in range(max(1, repeats)):
        out = []
        w0 = time.perf_counter()
        for s in range(0, len(queries), batch):
            out.append(search(index, queries[s:s + batch], k)[1])
        rates.append(len(queries) / (time.perf_counter() - w0))
        rows = np.concatenate(out)
    return statistics.median(rates), rows


def recall(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    hits = [len(set(a[:k].tolist()) & set(e[:k].tolist())) for a, e in zip(approx, exact, strict=True)]
    return float(np.mean(hits)) / k


def search_settings(factory: str, nlist: int, args) -> List[Tuple]:
    """The (parameter, value) pairs an index is searched with: efSearch for HNSW, nprobe (at most
    nlist) for IVF, none for the others."""
    if factory.startswith("HNSW"):
        return [("efSearch", e) for e in int_list(args.ef_search)]
    if factory.startswith("IVF") or ",IVF" in factory:
        return [("nprobe", p) for p in int_list(args.nprobe) if p <= nlist]
    return [(None, None)]


def bench_indexes(vectors: np.ndarray, queries: np.ndarray, args, label: str,
                  factories_text: str) -> List[Dict]:
    """One row per factory and search setting: build seconds, bytes per passage, queries/s and
    recall@k against the exact Flat top-k (Flat is built first, as the ground truth)."""
    from rag_plugin.retrieval.index import build_index, index_bytes, set_search_params

    n = len(vectors)
    nlist = args.nlist or auto_nlist(n, args.train_size)
    ks = sorted(set(int_list(args.recall_at)))
    rows: List[Dict] = []
    exact = None
    factories = split_factories(factories_text)
    if "Flat" not in factories:
        factories = ["Flat", *factories]  # the ground truth
    for template in factories:
        factory = template.format(nlist=nlist, m=args.pq_m)
        log(f"[{label}] building {factory} over {n} vectors")
        try:
            index, build_s, _ = timed(lambda f=factory: build_index(vectors, f, train_size=args.train_size,
                                                                    seed=args.seed, progress=n >= 50_000))
        except Exception as err:  # e.g. more IVF lists than vectors: report and go on
            if factory == "Flat":
                raise
            log(f"[{label}] {factory}: {err}")
            rows.append({"collection": label, "n": n, "factory": factory, "error": str(err)})
            continue
        size = index_bytes(index)
        for param, value in search_settings(factory, nlist, args):
            if param == "nprobe":
                set_search_params(index, nprobe=value)
            elif param == "efSearch":
                set_search_params(index, ef_search=value)
            rate, found = qps(index, queries, max(ks), args.batch_size, args.repeats)
            if factory == "Flat":
                exact = found
            row = {"collection": label, "n": n, "factory": factory, "param": param, "value": value,
                   "build_s": build_s, "bytes": size, "bytes_per_passage": size / n, "queries_per_s": rate}
            for k in ks:
                row[f"recall@{k}"] = recall(found, exact, k)
            rows.append(row)
        del index
    return rows
