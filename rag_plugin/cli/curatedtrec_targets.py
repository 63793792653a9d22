"""rag-curatedtrec-targets: concrete training targets for CuratedTrec's regular-expression answers
(the paper's preprocessing).

    rag-curatedtrec-targets --data DIR --knowledge KS_DIR [-k 1000] [--out OUT_DIR] [--splits train valid] [--bm25]

For every record of DIR/{split}.jsonl with meta.answer_is_regex (rag-prepare curatedtrec), retrieves
the top-k passages for its question from the knowledge source (its own dense retriever, or BM25)
and makes the string that most frequently matches the pattern its first answer; if nothing
matches, the pattern's literal expansions (alternations enumerated, optional parts both ways,
non-deterministic parts a space) become its answers. The pattern stays in meta.answer_pattern
(evaluation keeps matching it); meta.target_from says "retrieved" or "regex_expansion". The test
split is left as it is unless --splits names it. Writes OUT_DIR/{split}.jsonl (default: DIR, in
place), copies DIR's other files to OUT_DIR, and OUT_DIR/curatedtrec_targets.json with the counts;
every file atomically. Prints that summary as JSON.
"""
from __future__ import annotations

import json
import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-curatedtrec-targets", description=__doc__)
    p.add_argument("--data", required=True, help="directory with {train,valid,test}.jsonl (rag-prepare curatedtrec)")
    p.add_argument("--knowledge", required=True, help="knowledge source directory (rag-build-knowledge)")
    p.add_argument("-k", type=int, default=1000, help="passages retrieved per question (the paper: 1000)")
    p.add_argument("--out", default=None, help="output directory (default: --data, rewritten in place)")
    p.add_argument("--splits", nargs="+", default=["train", "valid"], help="splits to rewrite")
    p.add_argument("--bm25", action="store_true", help="retrieve with BM25 instead of the dense index")
    p.add_argument("--batch-size", type=int, default=64, help="questions retrieved at once")
    p.add_argument("--max-expansions", type=int, default=64, help="cap on a pattern's literal expansions")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rag_plugin.datasets.curatedtrec import derive_targets  # start-up: not needed by --help

    summary = derive_targets(args.data, args.knowledge, k=args.k, out=args.out, splits=args.splits,
                             bm25=args.bm25, batch_size=max(1, args.batch_size),
                             max_expansions=args.max_expansions, progress=not args.quiet)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
