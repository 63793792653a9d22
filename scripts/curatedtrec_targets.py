#!/usr/bin/env python
"""Concrete training targets for CuratedTrec's regular-expression answers (the paper's preprocessing).

    python scripts/curatedtrec_targets.py --data DIR --knowledge KS_DIR [-k 1000] [--out OUT_DIR]
        [--splits train valid] [--bm25]

For every record of DIR/{split}.jsonl with ``meta.answer_is_regex`` (scripts/prepare_curatedtrec.py),
retrieves the top-k passages for its question from the knowledge source (its own dense retriever,
or BM25) and makes the string that most frequently matches the pattern its first answer; if
nothing matches, the pattern's literal expansions (alternations enumerated, optional parts both
ways, non-deterministic parts a space) become its answers. The pattern stays in
``meta.answer_pattern`` (evaluation keeps matching it); ``meta.target_from`` says "retrieved" or
"regex_expansion". The test split is left as it is unless --splits names it. Writes
OUT_DIR/{split}.jsonl (default: DIR, in place), copies DIR's other files to OUT_DIR, and
OUT_DIR/curatedtrec_targets.json with the counts; every file atomically.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from rag_plugin.util.errors import cli_main  # noqa: E402


@cli_main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="directory with {train,valid,test}.jsonl (prepare_curatedtrec.py)")
    p.add_argument("--knowledge", required=True, help="knowledge source directory (scripts/build_knowledge_source.py)")
    p.add_argument("-k", type=int, default=1000, help="passages retrieved per question (default 1000, as the paper)")
    p.add_argument("--out", default=None, help="output directory (default: --data, rewritten in place)")
    p.add_argument("--splits", nargs="+", default=["train", "valid"], help="splits to rewrite (default: train valid)")
    p.add_argument("--bm25", action="store_true", help="retrieve with BM25 instead of the dense index")
    p.add_argument("--batch-size", type=int, default=64, help="questions retrieved at once")
    p.add_argument("--max-expansions", type=int, default=64, help="cap on a pattern's literal expansions")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    from rag_plugin.datasets.curatedtrec import derive_targets

    summary = derive_targets(args.data, args.knowledge, k=args.k, out=args.out, splits=args.splits,
                             bm25=args.bm25, batch_size=max(1, args.batch_size),
                             max_expansions=args.max_expansions, progress=not args.quiet)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
