"""The retrieval benchmark's embedding part: MiniLM throughput of the plugin's encoder against
sentence-transformers on the same passages, the whole corpus's vectors (cached), and a synthetic
scale-up collection around them."""
from __future__ import annotations

import hashlib
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from retrieval_common import log, timed


def load_sentence_transformer(args) -> Tuple[Optional[object], Optional[str]]:
    """sentence-transformers' model on the plugin's local MiniLM folder, or why there is none."""
    if args.no_st:
        return None, None
    try:
        from sentence_transformers import SentenceTransformer

        from rag_plugin.retrieval.encoders import _minilm_dir

        model = SentenceTransformer(str(_minilm_dir()), device="cpu", local_files_only=True)
        model.eval()
        return model, None
    except ImportError as err:
        error = f"sentence_transformers not importable ({err})"
    except Exception as err:  # keep the plugin numbers even if ST cannot load the folder
        error = f"SentenceTransformer failed: {type(err).__name__}: {err}"
    log(error)
    return None, error


def timed_runs(encoders: Dict[str, Callable], n: int, repeats: int) -> Tuple[Dict[str, List[Dict]], Dict]:
    """``repeats`` timed runs of each encoder, interleaved (order alternating) so that load from other
    processes hits both alike; the runs by encoder, and each encoder's last vectors."""
    from tqdm import tqdm

    runs: Dict[str, List[Dict]] = {name: [] for name in ("plugin", "sentence_transformers")}
    vectors = {}
    jobs = []
    for r in range(repeats):
        pair = list(encoders.items())
        jobs += pair if r % 2 == 0 else pair[::-1]
    for name, fn in tqdm(jobs, desc=f"embedding {n} passages x{repeats}", unit="run"):
        load0 = os.getloadavg()[0]
        vecs, wall, cpu = timed(fn)
        runs[name].append({"wall_s": wall, "cpu_s": cpu, "passages_per_s": n / wall, "loadavg_1m_before": load0})
        vectors[name] = np.asarray(vecs, dtype=np.float32) if name != "plugin" else vecs
    return runs, vectors


def summary(runs: List[Dict], n: int) -> Optional[Dict]:
    if not runs:
        return None
    pps = [r["passages_per_s"] for r in runs]
    return {"median_passages_per_s": statistics.median(pps), "best_passages_per_s": max(pps),
            "median_cpu_s_per_1k": statistics.median(r["cpu_s"] for r in runs) * 1000 / n, "runs": runs}


def bench_embeddings(encoder, passages: List[Tuple[str, str]], args) -> Tuple[Dict, np.ndarray]:
    """Passages/s and CPU time of the plugin's ``encode_passages`` and, when importable,
    sentence-transformers' ``encode`` on the same strings; and how far apart their vectors are."""
    from rag_plugin.retrieval.encoders import _join_title

    titles = [t for t, _ in passages]
    texts = [x for _, x in passages]
    joined = [_join_title(t, x) for t, x in passages]
    n = len(passages)
    ids = encoder.tokenize_passages(titles, texts)
    n_tokens = sum(len(i) for i in ids)
    st_model, st_error = load_sentence_transformer(args)
    encoders = {"plugin": lambda: encoder.encode_passages(titles, texts, batch_size=args.batch_size, progress=False)}
    if st_model is not None:
        encoders["sentence_transformers"] = lambda: st_model.encode(
            joined, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False)
    # warm-up: one batch each
    encoder.encode_passages(titles[:args.batch_size], texts[:args.batch_size], batch_size=args.batch_size,
                            progress=False)
    if st_model is not None:
        st_model.encode(joined[:args.batch_size], batch_size=args.batch_size, show_progress_bar=False)
    runs, vectors = timed_runs(encoders, n, args.repeats)
    res = {"n_passages": n, "n_tokens": n_tokens, "mean_tokens": n_tokens / n,
           "truncated_at_max_length": sum(len(i) >= encoder.max_length for i in ids), "batch_size": args.batch_size,
           "repeats": args.repeats, "plugin": summary(runs["plugin"], n),
           "sentence_transformers": summary(runs["sentence_transformers"], n),
           "sentence_transformers_error": st_error}
    plugin_vecs, st_vecs = vectors["plugin"], vectors.get("sentence_transformers")
    if st_vecs is not None:
        res["max_abs_diff"] = float(np.abs(plugin_vecs - st_vecs).max())
        res["min_cosine"] = float((plugin_vecs * st_vecs).sum(1).min())
        p, s = res["plugin"], res["sentence_transformers"]
        res["ratio_plugin_over_st"] = p["median_passages_per_s"] / s["median_passages_per_s"]
        res["ratio_plugin_over_st_cpu"] = s["median_cpu_s_per_1k"] / p["median_cpu_s_per_1k"]
    if st_model is not None:
        res["sentence_transformers_max_seq_length"] = st_model.max_seq_length
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

