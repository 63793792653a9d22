"""The index-sharing benchmark's summaries and Markdown tables: memory and load time per mode and process count
(with the issue's targets), retrieval time per training batch, and the paper-scale table."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

MIB = 2 ** 20


def _delta(rank: Dict, key: str, when: str = "after_touch") -> int:
    return rank[when][key] - rank["before"][key]


def summarize_job(results: List[Dict], index_bytes: int) -> Dict:
    """One job (a mode at N processes): memory deltas per rank (after loading and a first search, minus before
    loading), load time, and the per-batch times (the slowest rank's, as a training step waits for it)."""
    out = {"world": len(results), "how": sorted({h for r in results for h in r["how"]}),
           "index_rows_per_rank": [r["index_rows"] for r in results],
           "load_s": [round(r["load_s"], 4) for r in results],
           "first_search_s": [round(r["first_search_s"], 4) for r in results],
           "peak_rss_mib": [round(r["peak_rss"] / MIB, 1) for r in results]}
    for key in ("Pss", "Private", "Anonymous", "Rss", "Pss_File"):
        out[f"{key}_mib"] = [round(_delta(r, key) / MIB, 1) for r in results]
    out["index_file_pss_mib"] = [round(r["index_file_pss"] / MIB, 1) for r in results]
    out["open_s"] = [round(r["open_s"], 4) for r in results]
    pss = [_delta(r, "Pss") for r in results]
    out["node_pss_mib"] = round(sum(pss) / MIB, 1)
    out["max_pss_fraction_of_index"] = max(pss) / index_bytes
    if results[0].get("batch_s"):
        per_batch = np.max(np.asarray([r["batch_s"] for r in results]), axis=0)
        out["batch_ms_median"] = float(np.median(per_batch) * 1e3)
        out["batch_ms_p90"] = float(np.percentile(per_batch, 90) * 1e3)
        out["batches"] = len(per_batch)
    if results[0].get("batch_cpu_s"):  # CPU seconds of the busiest rank: the wall time given a free core per rank
        busiest = np.max(np.asarray([r["batch_cpu_s"] for r in results]), axis=0)
        out["batch_cpu_ms_busiest_median"] = float(np.median(busiest) * 1e3)
    return out


def add_targets(collection: Dict) -> None:
    """The issue's targets, judged from the jobs of one collection (``collection['jobs'][mode][N]``)."""
    jobs, size = collection["jobs"], collection["index_bytes"]
    targets = {}
    for n, job in jobs.get("shared", {}).items():
        if n != "1":  # the bytes each process holds alone (Private): what one more process adds to the node
            added = float(np.mean(job["Private_mib"])) * MIB
            targets[f"mapped: added per extra process (its Private bytes), N={n}"] = {
                "value": added / size, "target": "< 0.05", "met": added / size < 0.05}
    for n, job in jobs.get("sharded", {}).items():
        frac = job["max_pss_fraction_of_index"]
        targets[f"sharded: index bytes per process / whole, N={n}"] = {
            "value": frac, "target": f"<= {1.1 / int(n):.3f}", "met": frac <= 1.1 / int(n)}
    r0, sh = jobs.get("rank0", {}).get("4"), jobs.get("sharded", {}).get("4")
    if r0 and sh and "batch_ms_median" in r0:
        ratio = sh["batch_ms_median"] / r0["batch_ms_median"]
        targets["sharded / rank-0-serves-all batch time, N=4 (median wall)"] = {
            "value": ratio, "target": "<= 0.5", "met": ratio <= 0.5}
    if r0 and sh and "batch_cpu_ms_busiest_median" in r0 and "batch_cpu_ms_busiest_median" in sh:
        ratio = sh["batch_cpu_ms_busiest_median"] / r0["batch_cpu_ms_busiest_median"]
        targets["sharded / rank-0-serves-all busiest rank's CPU per batch, N=4 (median)"] = {
            "value": ratio, "target": "<= 0.5", "met": ratio <= 0.5}
    collection["targets"] = targets


def _mean(xs) -> float:
    return float(np.mean(xs))


MODE_NAMES = {"private": "private copy per process", "shared": "mapped once per node",
              "sharded": "sharded (S = N, each maps 1 shard)", "rank0": "rank 0 holds a private copy, serves all"}


def memory_table(name: str, coll: Dict) -> List[str]:
    lines = ["", f"#### Memory and load time: {name} ({coll['count']:,} x {coll['dim']}, index "
                 f"{coll['index_bytes'] / MIB:,.0f} MiB)", "",
             "| mode | N | how read | Pss per process MiB (max) | Private per process MiB (max) | of which mapped "
             "index file Pss MiB (max) | node Pss MiB (sum) | max Pss / index | load s (max) | first search s (max) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode, by_n in coll["jobs"].items():
        for n, j in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {MODE_NAMES[mode]} | {n} | {'/'.join(j['how']) or '-'} | {max(j['Pss_mib']):,.1f} | "
                         f"{max(j['Private_mib']):,.1f} | {max(j['index_file_pss_mib']):,.1f} | "
                         f"{j['node_pss_mib']:,.1f} | "
                         f"{j['max_pss_fraction_of_index']:.3f} | {max(j['load_s']):.3f} | "
                         f"{max(j['first_search_s']):.3f} |")
    return lines


def timing_table(name: str, coll: Dict, batch: int, k: int) -> List[str]:
    lines = ["", f"#### Retrieval time per training batch: {name} ({batch} questions per rank, K={k}, with document "
                 "vectors; slowest rank per batch)", "",
             "| design | N | median ms | p90 ms | busiest rank's CPU ms (median) | batches | load avg before | same "
             "rows as private copies |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for mode, by_n in coll["jobs"].items():
        for n, j in sorted(by_n.items(), key=lambda kv: int(kv[0])):
            if "batch_ms_median" in j:
                same = j.get("same_rows_as_private")
                same = "-" if same is None else f"{same:.4f}"
                cpu = j.get("batch_cpu_ms_busiest_median")
                cpu = "-" if cpu is None else f"{cpu:.1f}"
                lines.append(f"| {MODE_NAMES[mode]} | {n} | {j['batch_ms_median']:.1f} | {j['batch_ms_p90']:.1f} | "
                             f"{cpu} | {j['batches']} | {j['loadavg_1m_before']:.1f} | {same} |")
    return lines


def targets_table(name: str, coll: Dict) -> List[str]:
    lines = ["", f"#### Targets: {name}", "", "| target | measured | wanted | met |", "|---|---:|---|---|"]
    for what, t in coll.get("targets", {}).items():
        lines.append(f"| {what} | {t['value']:.3f} | {t['target']} | {'yes' if t['met'] else 'NO'} |")
    return lines


def paper_table(paper: Dict) -> List[str]:
    a = paper["assumptions"]
    lines = ["", f"#### Paper scale on paper: {a['passages']:,} passages x {a['dim']} "
                 f"(from bytes/passage and recall measured at dim {paper['measured_dim']} on "
                 f"{paper['measured_n']:,} synthetic vectors)", "",
             f"Node: {a['usable_ram_gib']} GiB of RAM usable for the index, {a['ranks_per_node']} training ranks per "
             f"node; IVF with {paper['target_nlist']} lists. Disk = index + stored document vectors (`vectors.npy`, "
             f"{a['dim']} float32 = "
             f"{a['vectors_gib']:.1f} GiB, mapped, only the returned rows are read) + passage store "
             f"(~{a['passage_store_gib']:.1f} GiB at the demo's {a['passage_store_bytes_per_passage']:.0f} bytes/"
             "passage).", "",
             "| index | search | bytes/passage (dim " + str(a["dim"]) + ") | index GiB | disk GiB | RAM/node, "
             f"{a['ranks_per_node']} private copies GiB | ranks/node that fit with private copies | RAM/node, mapped "
             "once GiB | nodes (mapped once, or sharded by node) | measured as (dim " + str(paper["measured_dim"]) +
             ") | recall@1 | recall@5 | recall@20 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in paper["rows"]:
        lines.append(f"| {r['factory']} | {r['search']} | {r['bytes_per_passage']:,.0f} | {r['index_gib']:,.1f} | "
                     f"{r['disk_gib']:,.0f} | {r['private_ram_gib']:,.0f} | {r['private_ranks_fit']} | "
                     f"{r['mapped_ram_gib']:,.1f} | {r['nodes']} | {r['measured_as']} | {r['recall@1']:.3f} | "
                     f"{r['recall@5']:.3f} | {r['recall@20']:.3f} |")
    return lines
