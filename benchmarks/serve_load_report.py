"""benchmarks/serve_load.py's verdicts against the issue's targets and its Markdown tables (BENCHMARKS.md's)."""
from __future__ import annotations

from typing import Dict, List

#: at the largest level, the service's throughput against the hub's one-at-a-time
SPEEDUP_TARGET = 3.0
RSS_DRIFT_PCT = 5.0
PRIVATE_INDEX_FRACTION = 0.05
MIB = 1 << 20


def _top_level(result: Dict, explain: bool = False):
    rows = [r for r in result.get("levels", []) if r["explain"] == explain]
    return max(rows, key=lambda r: r["clients"]) if rows else None


def index_share(worker: Dict, file_bytes: Dict[str, int]) -> Dict:
    """The worker's mappings of the FAISS index file(s) (``*.faiss``) summed, with their file size."""
    names = [n for n in worker["files"] if n.endswith(".faiss")]
    total = {f: sum(worker["files"][n][f] for n in names) for f in ("Rss", "Pss", "Shared_Clean", "Private_Clean",
                                                                    "Private_Dirty")}
    size = sum(b for n, b in file_bytes.items() if n.endswith(".faiss"))
    private = total["Private_Clean"] + total["Private_Dirty"]
    return {"mapped": bool(names), "file_bytes": size, **total, "Private": private,
            "private_fraction": private / size if size else None}


def verdicts(result: Dict) -> Dict:
    out = {}
    top, hub = _top_level(result), result.get("hub")
    if top and hub:
        speedup = top["throughput_qps"] / hub["throughput_qps"]
        out["throughput"] = {"target": f">= {SPEEDUP_TARGET:g}x the hub at {top['clients']} clients",
                             "speedup": round(speedup, 2), "met": speedup >= SPEEDUP_TARGET}
    load = result.get("load")
    if load:
        agree = load["agreement"]
        checks = {"no_5xx": load["server_errors"] == 0, "malformed_all_4xx": load["malformed_not_4xx"] == 0,
                  "no_connection_errors": load["connection_errors"] == 0,
                  "valid_all_200": load["unexpected_non_200"] == 0,
                  "rss_flat": abs(load["rss"].get("drift_pct", 0.0)) <= RSS_DRIFT_PCT and load["rss"]["samples"] > 0,
                  "answers_equal_hub": agree["compared"] > 0 and agree["equal"] == agree["compared"]}
        out["load"] = {**checks, "met": all(checks.values())}
    workers = result.get("workers")
    if workers:
        shares = [index_share(w, workers["file_bytes"]) for w in workers["workers"]]
        ok = bool(shares) and all(s["mapped"] and s["private_fraction"] is not None
                                  and s["private_fraction"] < PRIVATE_INDEX_FRACTION for s in shares)
        out["workers"] = {"target": f"each worker's private bytes of the index < {PRIVATE_INDEX_FRACTION:.0%} of it",
                          "workers": len(shares), "index_mapped": all(s["mapped"] for s in shares) and bool(shares),
                          "private_fractions": [s["private_fraction"] and round(s["private_fraction"], 4)
                                                for s in shares], "met": ok}
    exits = {name: s.get("exit_status") for name, s in result.get("servers", {}).items()}
    if workers:
        exits["workers"] = workers.get("exit_status")
    out["sigterm_exit_0"] = {"statuses": exits, "met": all(v == 0 for v in exits.values())}
    return out


def _level_rows(rows: List[Dict], hub_qps: float, label: str) -> List[str]:
    out = []
    for r in rows:
        speed = f"{r['throughput_qps'] / hub_qps:.2f}x" if hub_qps else ""
        out.append(f"| {label} | {r['clients']} | {'yes' if r['explain'] else 'no'} | {r['throughput_qps']:.1f} | "
                   f"{speed} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['mean_batch']:.2f} | "
                   f"{r['server_ms_mean']:.0f} | {r['server_cpu_pct']}% / {r['client_cpu_pct']}% | "
                   f"{r['load_avg']:.1f} |")
    return out


def report(result: Dict) -> str:
    lines: List[str] = []
    hub = result.get("hub")
    hub_qps = hub["throughput_qps"] if hub else 0.0
    if hub or result.get("levels") or result.get("nobatch"):
        lines += ["| server | clients | explain | q/s | vs hub | p50 ms | p99 ms | mean batch | in server ms | "
                  "CPU server / clients | load |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"]
        if hub:
            lines.append(f"| hub, one at a time ({hub['threads']} threads) | 1 | no | {hub_qps:.1f} | 1.00x | "
                         f"{hub['p50_ms']:.0f} | {hub['p99_ms']:.0f} | 1 | | | {hub['load_avg']:.1f} |")
        lines += _level_rows(result.get("levels", []), hub_qps, f"--max-batch {result['settings']['max_batch']}")
        lines += _level_rows(result.get("nobatch", []), hub_qps, "--max-batch 1")
    if hub and "engine" in hub:
        e = hub["engine"]
        lines += ["", f"The engine alone (no HTTP), ms per question: {e['batch']} questions one at a time / as one "
                      "batch", "", "| explain | alone | batched | gain |", "|---|---:|---:|---:|"]
        for name, label in (("plain", "no"), ("explain", "yes")):
            t = e[name]
            lines.append(f"| {label} | {t['ms_per_question_alone']:.1f} | {t['ms_per_question_batched']:.1f} | "
                         f"{t['batch_speedup']:.2f}x |")
    if result.get("load"):
        lines += ["", *_load_lines(result["load"])]
    if result.get("workers"):
        lines += ["", *_worker_lines(result["workers"])]
    if result.get("verdicts"):
        lines += ["", "Targets: " + "; ".join(f"{k} {'met' if v['met'] else 'MISSED'}"
                                              for k, v in result["verdicts"].items())]
    return "\n".join(lines)


def _load_lines(load: Dict) -> List[str]:
    rss, agree = load["rss"], load["agreement"]
    statuses = "; ".join(f"{kind}: " + ", ".join(f"{n} x {s}" for s, n in sorted(by.items()))
                         for kind, by in sorted(load["statuses"].items()))
    lat = load["latency"]
    return [f"Load test: {load['requests']} requests from {load['clients']} clients in {load['wall_s']} s "
            f"({load['throughput_rps']} requests/s); answers p50/p99 {lat['answer']['p50_ms']:.0f}/"
            f"{lat['answer']['p99_ms']:.0f} ms, searches {lat['search']['p50_ms']:.0f}/{lat['search']['p99_ms']:.0f} "
            "ms", "", f"Statuses: {statuses}", "",
            f"5xx: {load['server_errors']}; malformed not 4xx: {load['malformed_not_4xx']} of {load['malformed']}; "
            f"connection errors: {load['connection_errors']}; valid requests not 200: {load['unexpected_non_200']}",
            "", f"Server VmRSS ({rss.get('samples', 0)} samples): {rss.get('first_mib')} MiB at the start, "
            f"{rss.get('after_warmup_mib')} MiB after {rss.get('after_warmup_at_request')} requests, last 10% mean "
            f"{rss.get('last_10pct_mean_mib')} MiB (max {rss.get('max_mib')}): drift {rss.get('drift_pct')}%", "",
            f"Against the hub: {agree['equal']} of {agree['compared']} questions equal (answer, passage ids; max "
            f"|score diff| {agree['max_score_diff']:.2e}, max |p diff| {agree['max_prob_diff']:.2e})"]


def _worker_lines(w: Dict) -> List[str]:
    sizes = w["file_bytes"]
    lines = [f"`--workers 2` after {w['warm_requests']} requests (each a new connection); the knowledge source's "
             "mapped files per worker, MiB", "",
             "| worker | file | file size | Rss | Pss | Shared_Clean | Private_Clean | Private_Dirty |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, worker in enumerate(w["workers"]):
        if not worker["files"]:
            lines.append(f"| {i} (pid {worker['pid']}) | nothing of the knowledge source mapped | | | | | | |")
        for name, f in sorted(worker["files"].items(), key=lambda kv: -sizes.get(kv[0], 0)):
            if sizes.get(name, 0) < 1 << 16 and not name.endswith(".faiss"):
                continue  # the small passage-store index files: in the JSON
            lines.append(f"| {i} (pid {worker['pid']}) | {name} | {sizes[name] / MIB:.1f} | {f['Rss'] / MIB:.1f} | "
                         f"{f['Pss'] / MIB:.1f} | {f['Shared_Clean'] / MIB:.1f} | {f['Private_Clean'] / MIB:.1f} | "
                         f"{f['Private_Dirty'] / MIB:.1f} |")
    lines += ["", "| worker | CPU s | RSS | Pss | Private | Anonymous | index private / index size |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for i, worker in enumerate(w["workers"]):
        r, share = worker["rollup"], index_share(worker, sizes)
        frac = "not mapped" if not share["mapped"] else f"{100 * share['private_fraction']:.2f}%"
        lines.append(f"| {i} (pid {worker['pid']}) | {worker['cpu_s']} | {r['Rss'] / MIB:.0f} | {r['Pss'] / MIB:.0f} | "
                     f"{r['Private'] / MIB:.0f} | {r['Anonymous'] / MIB:.0f} | {frac} |")
    lines += ["", f"The supervisor maps of the knowledge source: {w['supervisor']['ks_mapped'] or 'nothing'}; this "
                  f"benchmark's process: {w['benchmark_process_maps_ks'] or 'nothing'}"]
    return lines
