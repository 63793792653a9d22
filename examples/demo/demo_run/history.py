"""RESULTS.json across runs: a run of some systems (run_demo.py --systems) replaces their rows and keeps the others'.
Every row, K-sweep point, the hot-swap test and the Jeopardy scores name the run that made them (``"run"``: its id,
the date it ended); ``runs`` says what each run was: date, machine, command, systems, settings, its pretrained
generator (sha256 of the checkpoint: rows from different generators did not start alike) and its step timings.
A RESULTS.json written before runs were recorded is read as one run, the one its top-level date, machine and
command describe."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional

from omegaconf import DictConfig

from demo_run.selection import JEOPARDY, known_systems

#: the sections a run writes whole (when it ran them), beside the systems' rows and the K sweep
SECTIONS = ("hot_swap", "jeopardy")
#: the top-level keys of a RESULTS.json written before runs were recorded: they described its one run
LEGACY_KEYS = ("date", "machine", "command", "timings_s", "total_s")


def file_sha256(path: Path, length: int = 12) -> Optional[str]:
    """The first ``length`` hex digits of ``path``'s sha256 (None if it is not a file)."""
    if not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:length]


def row_system(row: str, stages: DictConfig) -> str:
    """The trained system a RESULTS row belongs to (``rag_seq`` is rag_seq_thorough's copy)."""
    run = stages.generate.test.get(row)
    return str(run.system) if run is not None else row


def load_previous(path: Path, stages: DictConfig) -> Dict:
    """The RESULTS.json at ``path`` with every part naming its run ({} if there is none)."""
    if not path.is_file():
        return {}
    results = json.loads(path.read_text())
    if "runs" in results:
        return results
    run = results.get("date") or "earlier run"
    systems = {row_system(row, stages) for row in results.get("systems", {})} | (
        {JEOPARDY} if results.get("jeopardy") else set())
    record = {"date": run, "machine": results.get("machine"), "command": results.get("command"),
              "systems": [name for name in known_systems(stages) if name in systems],
              "pretrained_sha256": None, "timings_s": results.get("timings_s", {}), "total_s": results.get("total_s")}
    migrated = {"runs": {run: record},
                "systems": {name: {**row, "run": run} for name, row in results.get("systems", {}).items()},
                "k_sweep": {name: [{**point, "run": run} for point in points]
                            for name, points in results.get("k_sweep", {}).items()}}
    for section in SECTIONS:
        if results.get(section):
            migrated[section] = {**results[section], "run": run}
    return migrated


def stamp(results: Dict, run: str) -> Dict:
    """This run's results with every part naming ``run``."""
    stamped = {"systems": {name: {**row, "run": run} for name, row in results.get("systems", {}).items()},
               "k_sweep": {name: [{**point, "run": run} for point in points]
                           for name, points in results.get("k_sweep", {}).items()}}
    for section in SECTIONS:
        if results.get(section):
            stamped[section] = {**results[section], "run": run}
    return stamped


def _ordered_rows(stages: DictConfig) -> List[str]:
    """The rows RESULTS.json may hold, in stages.yaml's order (``rag_seq``: rag_seq_thorough's copy, last)."""
    return [*stages.generate.test, "rag_seq"]


def merge(previous: Dict, current: Dict, run: str, record: Dict, stages: DictConfig) -> Dict:
    """``previous`` (:func:`load_previous`) with this run's results (``current``, from the steps) on top: a row, a
    system's K sweep or a section this run made replaces the earlier one; rows of systems stages.yaml no longer has
    are dropped, and so is a run none of whose results are left."""
    new = stamp(current, run)
    old_rows, new_rows = previous.get("systems", {}), new["systems"]
    merged: Dict = {"systems": {name: new_rows.get(name, old_rows.get(name)) for name in _ordered_rows(stages)
                                if name in new_rows or name in old_rows}}
    old_sweep, new_sweep = previous.get("k_sweep", {}), new["k_sweep"]
    merged["k_sweep"] = {name: new_sweep.get(name, old_sweep.get(name)) for name in stages.generate.k_sweep.systems
                         if name in new_sweep or name in old_sweep}
    for section in SECTIONS:
        if new.get(section) or previous.get(section):
            merged[section] = new.get(section) or previous[section]
    runs = {**previous.get("runs", {}), run: record}
    used = runs_used(merged)
    merged["runs"] = {name: rec for name, rec in runs.items() if name in used}
    return merged


def runs_used(results: Dict) -> List[str]:
    """The runs whose results ``results`` holds, oldest first (by their ids, the dates they ended)."""
    used = {row["run"] for row in results.get("systems", {}).values()}
    used |= {point["run"] for points in results.get("k_sweep", {}).values() for point in points}
    used |= {results[section]["run"] for section in SECTIONS if results.get(section)}
    return sorted(used)


def unique_run_id(date: str, previous: Dict) -> str:
    """The run's id: the date it ended, made unique among ``previous``'s runs."""
    run, n = date, 2
    while run in previous.get("runs", {}):
        run, n = f"{date} ({n})", n + 1
    return run
