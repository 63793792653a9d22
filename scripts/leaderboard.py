#!/usr/bin/env python
"""Evaluate several systems on one gold file; print a Markdown table (one row per system).

    python scripts/leaderboard.py --gold test.jsonl --task qa \\
        --system RAG-Token=token.out --system RAG-Seq=seq.out \\
        [--results BART=bart_scores.json] [--json-out board.json] [--md-out board.md]
    python scripts/leaderboard.py --config board.json [--json-out ...] [--md-out ...]

--system NAME=FILE: a guess file (fairseq-generate output or KILT JSONL), scored like
scripts/evaluate.py. --results NAME=FILE: a row already computed (a JSON object metric ->
value, e.g. what scripts/evaluate.py --json-out wrote, or a leaderboard --json-out file, whose
row NAME is taken). --config: a JSON file

    {"gold": "test.jsonl", "task": "qa", "metrics": "em,f1", "passages": "KNOWLEDGE_DIR",
     "guess_format": "auto", "systems": {"RAG-Token": "token.out"},
     "results": {"BART": "bart_scores.json"}}

(every key optional; "systems"/"results" may also be lists of {"name", "guess"|"results"};
relative paths are relative to the config file). Command-line flags override the config's
values and add to its systems.

Columns: the metrics asked for (--metrics, else --task's defaults, else em,f1), then any
other metric found in --results files. Values are percent. The JSON output is
{"systems": {name: {metric: value}}}; both outputs are written atomically.
"""
import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.cli.common import ArgumentParser, parse_pairs
from rag_plugin.evaluation.readers import FORMATS, read_gold
from rag_plugin.evaluation.scoring import (TASKS, canonical_metric, default_metrics, evaluate_files,
                                           metric_label, parse_metrics)
from rag_plugin.util.io import atomic_write_json, atomic_write_text

CONFIG_KEYS = {"gold", "task", "metrics", "passages", "guess_format", "systems", "results"}


def _named_paths(value, key: str, path_key: str, base: Path, cfg: str) -> List[Tuple[str, str]]:
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


def read_config(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError("config file not found", path=path, fix="pass --config with a JSON file")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"invalid JSON ({getattr(err, 'msg', err)})", path=path,
                        fix="see scripts/leaderboard.py --help for the config format") from None
    if not isinstance(cfg, dict):
        raise UserError("the config must be a JSON object", path=path, fix="see --help")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise UserError(f"unknown config keys {unknown}", path=path,
                        fix=f"use only {', '.join(sorted(CONFIG_KEYS))}")
    base = p.parent
    out: dict = {}
    for key in ("gold", "passages"):
        if key in cfg:
            if not isinstance(cfg[key], str) or not cfg[key].strip():
                raise UserError(f"{key!r} must be a path", path=path, fix="see --help")
            out[key] = str(base / cfg[key])
    if "task" in cfg:
        if cfg["task"] not in TASKS:
            raise UserError(f"unknown task {cfg['task']!r}", path=path, fix=f"use one of {', '.join(TASKS)}")
        out["task"] = cfg["task"]
    if "guess_format" in cfg:
        if cfg["guess_format"] not in FORMATS:
            raise UserError(f"unknown guess_format {cfg['guess_format']!r}", path=path,
                            fix=f"use one of {', '.join(FORMATS)}")
        out["guess_format"] = cfg["guess_format"]
    if "metrics" in cfg:
        if not isinstance(cfg["metrics"], (str, list)):
            raise UserError("'metrics' must be a string or a list", path=path, fix='e.g. "em,f1"')
        out["metrics"] = cfg["metrics"]
    out["systems"] = _named_paths(cfg.get("systems", {}), "systems", "guess", base, path)
    out["results"] = _named_paths(cfg.get("results", {}), "results", "results", base, path)
    return out


def read_results(path: str, name: Optional[str] = None) -> Dict[str, float]:
    """A precomputed row: a JSON object metric -> number (canonical names where known), or
    the row ``name`` of a leaderboard JSON file ``{"systems": {name: {metric: value}}}``."""
    p = Path(path)
    if not p.is_file():
        raise UserError("results file not found", path=path, fix="pass --results NAME=FILE with a JSON file")
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"invalid JSON ({getattr(err, 'msg', err)})", path=path,
                        fix="pass what scripts/evaluate.py --json-out wrote") from None
    if not isinstance(obj, dict) or not obj:
        raise UserError("results must be a non-empty JSON object metric -> value", path=path,
                        fix="pass what scripts/evaluate.py --json-out wrote")
    if set(obj) == {"systems"} and isinstance(obj["systems"], dict):  # a leaderboard JSON file
        if name not in obj["systems"] or not isinstance(obj["systems"][name], dict):
            raise UserError(f"this leaderboard file has no system {name!r}", path=path,
                            fix=f"use one of {sorted(obj['systems'])} as NAME in --results NAME=FILE")
        obj = obj["systems"][name]
    row: Dict[str, float] = {}
    for key, value in obj.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"value of {key!r} is not a finite number: {value!r}", path=path,
                            fix="results must map metric names to numbers")
        try:
            name = canonical_metric(key)
        except UserError:
            name = key  # a metric this plugin does not compute: keep it as named
        if name in row:
            raise UserError(f"metric {key!r} given twice", path=path, fix="keep one value per metric")
        row[name] = float(value)
    return row


def _cell(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown_table(rows: Dict[str, Dict[str, float]], columns: List[str]) -> str:
    header = "| System | " + " | ".join(metric_label(c) for c in columns) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in columns) + " |"
    lines = [header, rule]
    for name, row in rows.items():
        cells = [_cell(row.get(c)) for c in columns]
        lines.append("| " + name.replace("|", "\\|") + " | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@cli_main
def main(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gold", help="KILT JSONL gold file (needed to score --system files)")
    p.add_argument("--system", action="append", default=[], metavar="NAME=GUESS_FILE",
                   help="a system to score (repeatable)")
    p.add_argument("--results", action="append", default=[], metavar="NAME=METRICS_JSON",
                   help="an already-computed row (repeatable)")
    p.add_argument("--config", help="JSON config listing gold, task, metrics and systems")
    p.add_argument("--task", choices=TASKS, help="the paper's metrics for this task")
    p.add_argument("--metrics", help="comma-separated metric names (overrides --task)")
    p.add_argument("--guess-format", choices=FORMATS, default=None, help="default: auto")
    p.add_argument("--passages", help="knowledge-source directory or passages file (answer_in_top<K>)")
    p.add_argument("--json-out", help='write {"systems": {name: {metric: value}}} here')
    p.add_argument("--md-out", help="write the Markdown table here")
    args = p.parse_args(argv)

    cfg = read_config(args.config) if args.config else {"systems": [], "results": []}
    gold_path = args.gold or cfg.get("gold")
    task = args.task or cfg.get("task")
    metrics_spec = args.metrics if args.metrics is not None else cfg.get("metrics")
    guess_format = args.guess_format or cfg.get("guess_format", "auto")
    passages = args.passages or cfg.get("passages")
    systems = cfg["systems"] + parse_pairs(args.system, "--system")
    results = cfg["results"] + parse_pairs(args.results, "--results")
    if not systems and not results:
        raise UserError("no system to rank", fix="pass --system NAME=GUESS_FILE, --results NAME=FILE or --config")
    names = [n for n, _ in systems + results]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"system names used twice: {dupes}", fix="give every system its own name")

    if metrics_spec is not None:
        columns = parse_metrics(metrics_spec)
    elif task is not None or systems:
        columns = default_metrics(task)
    else:
        columns = []

    rows: Dict[str, Dict[str, float]] = {}
    if systems:
        if not gold_path:
            raise UserError("--system needs --gold", fix="pass --gold FILE (or \"gold\" in --config)")
        gold = read_gold(gold_path)
        for name, guess in systems:
            rows[name] = evaluate_files(gold_path, guess, columns, guess_format, passages, gold=gold)
    for name, path in results:
        rows[name] = read_results(path, name)
        for metric in rows[name]:
            if metric not in columns:
                columns.append(metric)

    rows = {n: rows[n] for n in names}  # config's systems first, then --system, then results
    table = markdown_table(rows, columns)
    if args.json_out:
        atomic_write_json(args.json_out, {"systems": rows})
    if args.md_out:
        atomic_write_text(args.md_out, table)
    sys.stdout.write(table)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
