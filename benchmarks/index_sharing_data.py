"""The index-sharing benchmark's data: the collections it loads (the demo knowledge source, a sharded copy of
it, a synthetic collection of millions of vectors and its shard sets) and the question vectors it searches with.

Everything derived is written under ``--work-dir`` (never beside the demo source) and reused by later runs:

* ``demo_s{S}/``: the demo knowledge source with its index in S shards (``rag_plugin.indexing.sharding``): the
  source's passage store and tokenizer copied, its manifest with the ``shards`` entries added (written last).
* ``synth{N}/``: ``vectors.npy`` (the demo's real vectors followed by jittered copies: a random real vector plus
  Gaussian noise of relative norm ``--jitter``, renormalised; the retrieval benchmark's recipe) and a Flat
  ``index.faiss`` over it; ``synth{N}_s{S}/``: the same cut in S shards. No passage store: these directories
  hold the index files only, plus ``bench.json`` (count, dim, recipe and, for a shard set, the shard entries).
* ``queries_{n}.npy``: real questions (nq_demo test, valid, train inputs, in that order) encoded with the demo
  source's query encoder.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
from retrieval_common import log
from retrieval_embedding import synthetic_collection

BENCH_META = "bench.json"


def shard_demo(demo: Path, work: Path, num_shards: int) -> Path:
    """``work/demo_s{S}``: the demo knowledge source with its Flat index in S shards (built once)."""
    from rag_plugin.indexing.sharding import write_shards

    out = work / f"demo_s{num_shards}"
    if (out / "manifest.json").is_file():
        return out
    log(f"writing {out} (the demo source's index in {num_shards} shards)")
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("passages", "tokenizer"):
        if (demo / sub).is_dir() and not (out / sub).exists():
            shutil.copytree(demo / sub, out / sub)
    manifest = json.loads((demo / "manifest.json").read_text(encoding="utf-8"))
    vectors = np.load(demo / "vectors.npy", mmap_mode="r")
    entries = write_shards(out, vectors, manifest["index_factory"], num_shards, 100_000, 0, False, log)
    manifest["shards"] = [e.to_json() for e in entries]
    manifest.pop("index_bytes", None)
    shutil.rmtree(out / ".build", ignore_errors=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return out


def synthetic_base(demo: Path, work: Path, total: int, jitter: float, seed: int) -> Path:
    """``work/synth{N}``: N vectors (the demo's real ones + jittered copies) and a Flat index (built once)."""
    from rag_plugin.retrieval import index as faiss_index

    out = work / f"synth{total}"
    if (out / BENCH_META).is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    real = np.load(demo / "vectors.npy")
    t0 = time.perf_counter()
    log(f"writing {out}: {len(real)} real + {total - len(real)} jittered vectors (jitter {jitter})")
    vectors = synthetic_collection(real, total, "jitter", jitter, seed)
    np.save(out / "vectors.npy", vectors, allow_pickle=False)
    del vectors
    vectors = np.load(out / "vectors.npy", mmap_mode="r")
    index = faiss_index.trained_index(vectors[:1000], "Flat")
    faiss_index.add_vectors(index, vectors, "synthetic Flat", progress=False)
    faiss_index.write_index(index, str(out / "index.faiss"))
    meta = {"count": int(total), "dim": int(vectors.shape[1]), "real": int(len(real)), "jitter": jitter,
            "seed": seed, "factory": "Flat", "index_bytes": (out / "index.faiss").stat().st_size,
            "seconds": time.perf_counter() - t0}
    (out / BENCH_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def synthetic_shards(base: Path, num_shards: int) -> Path:
    """``{base}_s{S}``: the synthetic collection's Flat index in S shards (``write_shards``; built once)."""
    from rag_plugin.indexing.sharding import write_shards

    out = Path(f"{base}_s{num_shards}")
    if (out / BENCH_META).is_file():
        return out
    log(f"writing {out} ({num_shards} shards)")
    out.mkdir(parents=True, exist_ok=True)
    vectors = np.load(base / "vectors.npy", mmap_mode="r")
    entries = write_shards(out, vectors, "Flat", num_shards, 100_000, 0, False, log)
    meta = json.loads((base / BENCH_META).read_text(encoding="utf-8"))
    meta["shards"] = [e.to_json() for e in entries]
    meta["index_bytes"] = sum(e.index_bytes for e in entries)
    shutil.rmtree(out / ".build", ignore_errors=True)
    (out / BENCH_META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out


def collection_info(directory: Path) -> Dict:
    """count, dim, index bytes (all shards) and shard count of a demo-like or synthetic directory."""
    if (directory / "manifest.json").is_file():
        m = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        shards = m.get("shards")
        size = (sum(int(e["index_bytes"]) for e in shards) if shards
                else (directory / "index.faiss").stat().st_size)
        return {"count": int(m["count"]), "dim": int(m["dim"]), "index_bytes": size,
                "num_shards": len(shards) if shards else 1, "kind": "knowledge source"}
    m = json.loads((directory / BENCH_META).read_text(encoding="utf-8"))
    return {"count": m["count"], "dim": m["dim"], "index_bytes": m["index_bytes"],
            "num_shards": len(m.get("shards") or [None]), "kind": "synthetic (index files only)"}


def load_questions_text(demo_dir: Path, n: int) -> List[str]:
    qs: List[str] = []
    for split in ("test", "valid", "train"):
        with open(demo_dir / "nq_demo" / f"{split}.jsonl", encoding="utf-8") as fh:
            qs += [json.loads(line)["input"] for line in fh if line.strip()]
        if len(qs) >= n:
            break
    if len(qs) < n:
        raise SystemExit(f"error: only {len(qs)} questions in {demo_dir}/nq_demo, {n} needed")
    return qs[:n]


def query_vectors(demo_ks: Path, demo_dir: Path, work: Path, n: int) -> np.ndarray:
    """``n`` real questions encoded with the demo source's query encoder (cached in ``work``)."""
    path = work / f"queries_{n}.npy"
    if path.is_file():
        return np.load(path)
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    encoder = KnowledgeSource(str(demo_ks)).load_encoder()
    questions = load_questions_text(demo_dir, n)
    t0 = time.perf_counter()
    vecs = np.ascontiguousarray(encoder.encode_queries(questions, batch_size=64), dtype=np.float32)
    log(f"encoded {n} questions in {time.perf_counter() - t0:.1f} s")
    np.save(path, vecs, allow_pickle=False)
    return vecs
