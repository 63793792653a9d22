"""rag-evaluate: score predictions against a KILT gold file; print a JSON object metric -> value.

    rag-evaluate --gold valid.jsonl --guess generate.out --task qa
    rag-evaluate --gold valid.jsonl --guess preds.jsonl \\
        --metrics em,f1,rprec,recall@5,answer_in_top5 --passages KNOWLEDGE_DIR --json-out scores.json

--guess is the stdout of fairseq-generate with the plugin (S-/T-/H-/D-/P- lines plus Z-N
provenance lines, N the 0-based index of the example in --gold) or a KILT JSONL file
({"id", "output": [{"answer", "provenance": [{"id", "title"?, "text"?}]}]}); --guess-format auto
tells them apart.

Metrics (values in percent): em, f1, bleu1, rougeL, bleu (sacrebleu BLEU-4), accuracy (FEVER
3-way), accuracy2 (FEVER 2-way: NOT ENOUGH INFO claims excluded), distinct<N>, rprec,
recall@<K>, precision@<K>, answer_in_top<K> (a gold answer in the title or text of one of the
top K passages; needs passage texts: --passages, unless the KILT guesses carry them).
Task defaults: qa: em,f1 | jeopardy: bleu1,distinct3 | msmarco: rougeL,bleu1,bleu,distinct3 |
fever: accuracy,accuracy2. Without --task or --metrics: em,f1. Q-BLEU-1 is not implemented
(see rag_plugin/evaluation/metrics.py: bleu1).
"""
import json
import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.evaluation.readers import FORMATS
from rag_plugin.evaluation.registry import TASKS, default_metrics, parse_metrics
from rag_plugin.evaluation.scoring import evaluate_files
from rag_plugin.util.errors import cli_main
from rag_plugin.util.io import atomic_write_json


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-evaluate", description=__doc__)
    p.add_argument("--gold", required=True, help="KILT JSONL gold file (ids, answers, provenance)")
    p.add_argument("--guess", required=True, help="fairseq-generate output or KILT JSONL predictions")
    p.add_argument("--task", choices=TASKS, help="pick the paper's metrics for this task")
    p.add_argument("--metrics", help="comma-separated metric names (overrides --task)")
    p.add_argument("--guess-format", choices=FORMATS, default="auto", help="the guess file's format")
    p.add_argument("--passages", help="knowledge-source directory or passages .jsonl/.tsv (answer_in_top<K>)")
    p.add_argument("--json-out", help="also write the JSON object here (atomically)")
    return p


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    names = parse_metrics(args.metrics) if args.metrics is not None else default_metrics(args.task)
    scores = evaluate_files(args.gold, args.guess, names, args.guess_format, args.passages)
    if args.json_out:
        atomic_write_json(args.json_out, scores)
    sys.stdout.write(json.dumps(scores, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
