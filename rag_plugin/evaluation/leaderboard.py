"""Leaderboard logic: several systems scored on one gold file, as rows of metric -> value.

A row comes from a guess file (scored like ``rag-evaluate``) or from a file of values computed
before (``rag-evaluate --json-out`` or an earlier leaderboard's JSON). A closed-book system
retrieves nothing: its retrieval columns hold no value (``–`` in Markdown, ``null`` in JSON)
instead of failing the board. The columns are the metrics asked for, then any other metric that
a results file holds. The command line is :mod:`rag_plugin.cli.leaderboard`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from rag_plugin.evaluation.readers import FORMATS, read_gold, read_guesses
from rag_plugin.evaluation.registry import RETRIEVED, TASKS, canonical_metric, lookup, metric_label
from rag_plugin.evaluation.scoring import evaluate, has_retrieval
from rag_plugin.util.errors import UserError

Row = Dict[str, Optional[float]]  # metric -> value in percent; None: not applicable (closed book)
NamedPaths = List[Tuple[str, str]]
CONFIG_KEYS = {"gold", "task", "metrics", "passages", "guess_format", "systems", "results"}
RESULTS_FIX = "pass what rag-evaluate --json-out wrote"


# ================================================================================== config
def _named_paths(value, key: str, path_key: str, base: Path, cfg: str) -> NamedPaths:
    fix = f'"{key}" must be {{"NAME": "FILE", ...}} or [{{"name": "NAME", "{path_key}": "FILE"}}, ...]'
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for entry in value:
            if not isinstance(entry, dict) or set(entry) != {"name", path_key}:
                raise UserError(f"bad entry in {key!r}: {entry!r}", path=cfg, fix=fix)
            items.append((entry["name"], entry[path_key]))
    else:
        raise UserError(f"{key!r} has the wrong type", path=cfg, fix=fix)
    out = []
    for name, p in items:
        if not isinstance(name, str) or not name.strip() or not isinstance(p, str) or not p.strip():
            raise UserError(f"bad entry in {key!r}: {name!r}: {p!r}", path=cfg, fix=fix)
        out.append((name.strip(), str(base / p)))
    return out


def _read_json(path: str, what: str, fix: str):
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} not found", path=path, fix=fix)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"invalid JSON ({getattr(err, 'msg', err)})", path=path, fix=fix) from None


def _config_value(cfg: dict, key: str, path: str):
    value = cfg[key]
    if key in ("gold", "passages") and (not isinstance(value, str) or not value.strip()):
        raise UserError(f"{key!r} must be a path", path=path, fix="see rag-leaderboard --help")
    if key == "task" and value not in TASKS:
        raise UserError(f"unknown task {value!r}", path=path, fix=f"use one of {', '.join(TASKS)}")
    if key == "guess_format" and value not in FORMATS:
        raise UserError(f"unknown guess_format {value!r}", path=path, fix=f"use one of {', '.join(FORMATS)}")
    if key == "metrics" and not isinstance(value, (str, list)):
        raise UserError("'metrics' must be a string or a list", path=path, fix='e.g. "em,f1"')
    return str(Path(path).parent / value) if key in ("gold", "passages") else value


def read_config(path: str) -> dict:
    """A leaderboard config (see ``rag-leaderboard --help``): paths made relative to the config file;
    ``systems`` and ``results`` as lists of (name, path)."""
    cfg = _read_json(path, "config file", "pass --config with a JSON file (see rag-leaderboard --help)")
    if not isinstance(cfg, dict):
        raise UserError("the config must be a JSON object", path=path, fix="see rag-leaderboard --help")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise UserError(f"unknown config keys {unknown}", path=path,
                        fix=f"use only {', '.join(sorted(CONFIG_KEYS))}")
    out = {key: _config_value(cfg, key, path) for key in ("gold", "passages", "task", "guess_format", "metrics")
           if key in cfg}
    base = Path(path).parent
    out["systems"] = _named_paths(cfg.get("systems", {}), "systems", "guess", base, path)
    out["results"] = _named_paths(cfg.get("results", {}), "results", "results", base, path)
    return out


# ================================================================================== rows
def read_results(path: str, name: Optional[str] = None) -> Row:
    """A precomputed row: a JSON object metric -> number or null (canonical names where known), or
    the row ``name`` of a leaderboard JSON file ``{"systems": {name: {metric: value}}}``."""
    obj = _read_json(path, "results file", "pass --results NAME=FILE with a JSON file")
    if not isinstance(obj, dict) or not obj:
        raise UserError("results must be a non-empty JSON object metric -> value", path=path, fix=RESULTS_FIX)
    if set(obj) == {"systems"} and isinstance(obj["systems"], dict):  # a leaderboard JSON file
        if name not in obj["systems"] or not isinstance(obj["systems"][name], dict):
            raise UserError(f"this leaderboard file has no system {name!r}", path=path,
                            fix=f"use one of {sorted(obj['systems'])} as NAME in --results NAME=FILE")
        obj = obj["systems"][name]
    row: Row = {}
    for key, value in obj.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise UserError(f"value of {key!r} is not a finite number: {value!r}", path=path,
                            fix="results must map metric names to numbers (or null)")
        try:
            metric = canonical_metric(key)
        except UserError:
            metric = key  # a metric this plugin does not compute: keep it as named
        if metric in row:
            raise UserError(f"metric {key!r} given twice", path=path, fix="keep one value per metric")
        row[metric] = None if value is None else float(value)
    return row


def is_retrieval_metric(name: str) -> bool:
    return RETRIEVED in lookup(name)[0].needs


def score_system(gold, gold_path: str, guess_path: str, columns: Sequence[str], guess_format: str = "auto",
                 passages: Optional[str] = None) -> Row:
    """One row from a guess file. A system that retrieved nothing (closed book) gets ``None`` in the
    retrieval columns; every other column is scored as ``rag-evaluate`` scores it."""
    guesses = read_guesses(guess_path, gold, guess_format)
    skipped = [] if has_retrieval(guesses) else [c for c in columns if is_retrieval_metric(c)]
    scored = [c for c in columns if c not in skipped]
    values = evaluate(gold, guesses, scored, passages=passages, guess_path=guess_path, gold_path=gold_path) \
        if scored else {}
    return {c: values.get(c) for c in columns}


def build_rows(systems: NamedPaths, results: NamedPaths, columns: List[str], gold_path: Optional[str],
               guess_format: str = "auto", passages: Optional[str] = None) -> Dict[str, Row]:
    """Rows by system name, in the order given (systems, then results); ``columns`` gains every other
    metric a results file holds."""
    names = [n for n, _ in list(systems) + list(results)]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"system names used twice: {dupes}", fix="give every system its own name")
    rows: Dict[str, Row] = {}
    if systems:
        if not gold_path:
            raise UserError("--system needs --gold", fix="pass --gold FILE (or \"gold\" in --config)")
        gold = read_gold(gold_path)
        for name, guess in systems:
            rows[name] = score_system(gold, gold_path, guess, columns, guess_format, passages)
    for name, path in results:
        rows[name] = read_results(path, name)
        columns.extend(m for m in rows[name] if m not in columns)
    return {n: rows[n] for n in names}


# ================================================================================== rendering
def _cell(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown_table(rows: Dict[str, Row], columns: Sequence[str]) -> str:
    """One line per system; values with two decimals, ``–`` where a row has none."""
    header = "| System | " + " | ".join(metric_label(c) for c in columns) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in columns) + " |"
    lines = [header, rule]
    for name, row in rows.items():
        cells = [_cell(row.get(c)) for c in columns]
        lines.append("| " + name.replace("|", "\\|") + " | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def board_json(rows: Dict[str, Row]) -> dict:
    """``{"systems": {name: {metric: value or None}}}`` (None is JSON's null)."""
    return {"systems": rows}
