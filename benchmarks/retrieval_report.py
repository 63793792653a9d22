"""The retrieval benchmark's report: its results as Markdown tables (embedding throughput, query
encoding, and one table per index collection)."""
from __future__ import annotations

from typing import Dict, List


def embedding_table(result: Dict) -> List[str]:
    e = result["embedding"]
    loads = [r["loadavg_1m_before"] for key in ("plugin", "sentence_transformers")
             for r in ((e.get(key) or {}).get("runs") or [])]
    lines = [f"### Embedding throughput ({e['n_passages']} passages, mean {e['mean_tokens']:.0f} "
             f"tokens, batch {e['batch_size']}, {result['threads']} threads, median of "
             f"{e['repeats']})", "",
             "| encoder | passages/s (median) | passages/s (best) | CPU s / 1k passages |",
             "|---|---:|---:|---:|"]
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
    if loads:
        lines += ["", f"1-minute load average before the timed runs: {min(loads):.1f} to {max(loads):.1f} "
                      f"(on {result['machine']['nproc']} CPUs)"]
    q = result.get("query_encoding")
    if q:
        lines += ["", f"Query encoding (`encode_queries`, {q['n']} questions, batch {e['batch_size']}): "
                      f"{q['queries_per_s']:.0f} queries/s"]
    return lines


def index_table(label: str, rows: List[Dict], n_queries: int, batch_size: int) -> List[str]:
    ks = [c for c in rows[0] if c.startswith("recall@")]
    lines = ["", f"### Indexes: {label} ({rows[0]['n']:,} vectors, {n_queries} queries, batch {batch_size})", "",
             "| index | search param | build s | bytes/passage | queries/s | " + " | ".join(ks) + " |",
             "|---|---|---:|---:|---:|" + "---:|" * len(ks)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['factory']} | failed: {r['error']} | | | |" + " |" * len(ks))
            continue
        param = f"{r['param']}={r['value']}" if r["param"] else "exact"
        lines.append(f"| {r['factory']} | {param} | {r['build_s']:.2f} | {r['bytes_per_passage']:.0f} "
                     f"| {r['queries_per_s']:,.0f} | " + " | ".join(f"{r[k]:.3f}" for k in ks) + " |")
    return lines


def markdown(result: Dict) -> str:
    lines = embedding_table(result)
    for label, rows in result["indexes"].items():
        if rows:
            lines += index_table(label, rows, result["n_queries"], result["embedding"]["batch_size"])
    return "\n".join(lines)
