#!/usr/bin/env python
"""Search a knowledge source; print one JSON object per hit.

    python scripts/search.py --knowledge DIR (--query TEXT | --queries FILE) [-k 5] [--bm25]

Each line: {"query": <0-based question line>, "rank", "id", "title", "score", "text"}.
"""
import argparse
import json
import sys
from pathlib import Path

from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import decoded_lines


def read_questions(path: str):
    p = Path(path)
    if not p.is_file():
        raise UserError("questions file not found", path=path, fix="pass --queries with one question per line")
    questions = []
    with open(p, "rb") as fh:
        for lineno, line in decoded_lines(fh, path):
            line = line.rstrip("\r\n")
            if not line.strip():
                raise UserError("empty question", path=path, line=lineno,
                                fix="remove the empty line (line numbers are the query ids)")
            questions.append(line)
    if not questions:
        raise UserError("the questions file is empty", path=path, fix="put one question per line")
    return questions


@cli_main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--knowledge", required=True, help="knowledge source directory")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--query", help="one question")
    g.add_argument("--queries", help="file with one question per line")
    p.add_argument("-k", type=int, default=5, help="passages per question (default 5)")
    p.add_argument("--batch-size", type=int, default=64, help="questions encoded and searched at once")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists to visit")
    p.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    p.add_argument("--bm25", action="store_true", help="BM25 over the passage texts instead of the dense index")
    args = p.parse_args(argv)

    from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever

    if args.query is not None:
        if not args.query.strip():
            raise UserError("empty --query", fix="give a question")
        questions = [args.query]
    else:
        questions = read_questions(args.queries)
    if args.bm25:
        retriever = BM25Retriever.from_dir(args.knowledge)
    else:
        retriever = DenseRetriever.from_dir(args.knowledge, nprobe=args.nprobe, ef_search=args.ef_search)
    out = sys.stdout
    for start in range(0, len(questions), args.batch_size):
        batch = questions[start:start + args.batch_size]
        res = retriever.search(batch, args.k)
        for b, (rows, scores) in enumerate(zip(res.rows, res.scores)):
            for rank, (row, score) in enumerate(zip(rows, scores)):
                if row < 0:
                    continue  # an approximate index found fewer than k
                row = int(row)
                out.write(json.dumps({"query": start + b, "rank": rank, "id": res.store.id(row),
                                      "title": res.store.title(row), "score": round(float(score), 6),
                                      "text": res.store.text(row)}, ensure_ascii=False) + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
