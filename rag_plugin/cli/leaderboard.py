"""rag-leaderboard: evaluate several systems on one gold file; print a Markdown table (one row per system).

    rag-leaderboard --gold test.jsonl --task qa \\
        --system RAG-Token=token.out --system RAG-Seq=seq.out \\
        [--results BART=bart_scores.json] [--json-out board.json] [--md-out board.md]
    rag-leaderboard --config board.json [--json-out ...] [--md-out ...]

--system NAME=FILE: a guess file (fairseq-generate output or KILT JSONL), scored like
rag-evaluate. A system that retrieved nothing (closed book: no Z- lines, no provenance) has no
value in the retrieval columns (rprec, recall@<K>, precision@<K>, answer_in_top<K>): "–" in the
table, null in the JSON. --results NAME=FILE: a row already computed (a JSON object metric ->
value, e.g. what rag-evaluate --json-out wrote, or a leaderboard --json-out file, whose row NAME
is taken). --config: a JSON file

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
import sys

from rag_plugin.cli.common import ArgumentParser, parse_pairs
from rag_plugin.evaluation.leaderboard import board_json, build_rows, markdown_table, read_config
from rag_plugin.evaluation.readers import FORMATS
from rag_plugin.evaluation.registry import TASKS, default_metrics, parse_metrics
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_write_json, atomic_write_text


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-leaderboard", description=__doc__)
    p.add_argument("--gold", help="KILT JSONL gold file (needed to score --system files)")
    p.add_argument("--system", action="append", default=[], metavar="NAME=GUESS_FILE",
                   help="a system to score (repeatable)")
    p.add_argument("--results", action="append", default=[], metavar="NAME=METRICS_JSON",
                   help="an already-computed row (repeatable)")
    p.add_argument("--config", help="JSON config listing gold, task, metrics and systems")
    p.add_argument("--task", choices=TASKS, help="the paper's metrics for this task")
    p.add_argument("--metrics", help="comma-separated metric names (overrides --task)")
    p.add_argument("--guess-format", choices=FORMATS, default=None, help="the guess files' format (None: auto)")
    p.add_argument("--passages", help="knowledge-source directory or passages file (answer_in_top<K>)")
    p.add_argument("--json-out", help='write {"systems": {name: {metric: value}}} here')
    p.add_argument("--md-out", help="write the Markdown table here")
    return p


def _columns(metrics_spec, task, scores_systems: bool):
    if metrics_spec is not None:
        return parse_metrics(metrics_spec)
    if task is not None or scores_systems:
        return default_metrics(task)
    return []


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    cfg = read_config(args.config) if args.config else {"systems": [], "results": []}
    systems = cfg["systems"] + parse_pairs(args.system, "--system")
    results = cfg["results"] + parse_pairs(args.results, "--results")
    if not systems and not results:
        raise UserError("no system to rank", fix="pass --system NAME=GUESS_FILE, --results NAME=FILE or --config")
    metrics_spec = args.metrics if args.metrics is not None else cfg.get("metrics")
    columns = _columns(metrics_spec, args.task or cfg.get("task"), bool(systems))
    rows = build_rows(systems, results, columns, args.gold or cfg.get("gold"),
                      args.guess_format or cfg.get("guess_format", "auto"), args.passages or cfg.get("passages"))
    table = markdown_table(rows, columns)
    if args.json_out:
        atomic_write_json(args.json_out, board_json(rows))
    if args.md_out:
        atomic_write_text(args.md_out, table)
    sys.stdout.write(table)
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
