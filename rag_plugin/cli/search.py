"""rag-search: search a knowledge source; print one JSON object per hit, and optionally write KILT output.

    rag-search --knowledge DIR (--query TEXT | --queries FILE | --data-file DATA/test.jsonl) [-k 5] \\
        [--bm25 | --hybrid [--fusion rrf|weighted] [--rrf-k 60] [--fusion-weight 0.5]] [--kilt-out hits.kilt.jsonl]

Each printed line: {"query": <0-based question number>, "rank", "id", "title", "score", "text"}.

--kilt-out FILE writes one KILT record per question, {"id": <question id>, "input": question,
"output": [{"provenance": [{"id": passage id, "title", "score", "text"}, ...]}]} (best first), which
rag-evaluate scores directly:

    rag-search --knowledge KS --data-file DATA/test.jsonl -k 20 --kilt-out hits.jsonl > /dev/null
    rag-evaluate --gold DATA/test.jsonl --guess hits.jsonl --metrics rprec,recall@5,recall@20

Question ids are the --data-file's record ids (so they match the gold file), else the 0-based
question number.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Tuple

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_path, decoded_lines


def read_questions(path: str) -> List[str]:
    """One question per line (line N is question N - 1); an empty line is an error."""
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


def questions_and_ids(args) -> Tuple[List[str], List[str]]:
    """``(questions, their ids)`` from --query, --queries or --data-file."""
    if args.query is not None:
        if not args.query.strip():
            raise UserError("empty --query", fix="give a question")
        return [args.query], ["0"]
    if args.queries is not None:
        questions = read_questions(args.queries)
        return questions, [str(i) for i in range(len(questions))]
    from rag_plugin.data.kilt import read_kilt  # start-up: dataclasses and logging, not needed by --help

    records = read_kilt(args.data_file, require_answers=False)
    return [r.input for r in records], [r.id for r in records]


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-search", description=__doc__)
    p.add_argument("--knowledge", required=True, help="knowledge source directory")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--query", help="one question")
    g.add_argument("--queries", help="file with one question per line")
    g.add_argument("--data-file", metavar="JSONL",
                   help="KILT data file (e.g. DATA/test.jsonl): its questions ('input'), under its ids")
    p.add_argument("-k", type=int, default=5, help="passages per question")
    p.add_argument("--batch-size", type=int, default=64, help="questions encoded and searched at once")
    p.add_argument("--nprobe", type=int, default=None, help="IVF lists to visit")
    p.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    p.add_argument("--private-index", action="store_true",
                   help="read a private copy of the FAISS index instead of the shared read-only mapping")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--bm25", action="store_true", help="BM25 over the passage texts instead of the dense index")
    which.add_argument("--hybrid", action="store_true",
                       help="fuse dense and BM25 candidates (as --retriever hybrid does)")
    p.add_argument("--fusion", choices=("rrf", "weighted"), default="rrf",
                   help="--hybrid: reciprocal rank fusion or min-max normalised weighted scores")
    p.add_argument("--rrf-k", type=float, default=60.0, help="--fusion rrf: the k of 1 / (k + rank)")
    p.add_argument("--fusion-weight", type=float, default=0.5, help="--fusion weighted: the dense side's weight")
    p.add_argument("--hybrid-candidates", type=int, default=0,
                   help="--hybrid: candidates from each side before fusing (0: max(20, 2 x -k))")
    p.add_argument("--kilt-out", default=None, metavar="FILE",
                   help="also write the hits as KILT JSONL (one record per question) for rag-evaluate")
    return p


def hits(rows, scores, store) -> List[dict]:
    """One question's hits, best first (rows an approximate index could not fill, -1, left out)."""
    return [{"rank": rank, "id": store.id(int(row)), "title": store.title(int(row)),
             "score": round(float(score), 6), "text": store.text(int(row))}
            for rank, (row, score) in enumerate(zip(rows, scores)) if row >= 0]


def kilt_record(qid: str, question: str, found: List[dict]) -> dict:
    """A KILT guess record (what :func:`rag_plugin.evaluation.readers.read_kilt_guesses` reads)."""
    provenance = [{"id": h["id"], "title": h["title"], "score": h["score"], "text": h["text"]} for h in found]
    return {"id": qid, "input": question, "output": [{"provenance": provenance}]}


def _retriever(args):
    from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever  # start-up: numpy, faiss, bm25s

    if args.bm25:
        return BM25Retriever.from_dir(args.knowledge)
    dense = DenseRetriever.from_dir(args.knowledge, nprobe=args.nprobe, ef_search=args.ef_search,
                                    index_mode="private" if args.private_index else "shared")
    if not args.hybrid:
        return dense
    from rag_plugin.retrieval.hybrid import HybridRetriever  # start-up

    candidates = args.hybrid_candidates or max(20, 2 * args.k)
    if candidates < args.k:
        raise UserError(f"--hybrid-candidates {candidates} is fewer than -k {args.k}",
                        fix=f"take at least {args.k} candidates from each side (0: automatic)")
    return HybridRetriever(dense, BM25Retriever(dense.store), fusion=args.fusion, rrf_k=args.rrf_k,
                           weight=args.fusion_weight, candidates=min(candidates, len(dense.store)))


def search(args, out, kilt) -> None:
    """Search every question; JSON lines to ``out``, KILT records to ``kilt`` (when not None)."""
    questions, ids = questions_and_ids(args)
    retriever = _retriever(args)
    for start in range(0, len(questions), args.batch_size):
        batch = questions[start:start + args.batch_size]
        res = retriever.search(batch, args.k)
        for b, (rows, scores) in enumerate(zip(res.rows, res.scores)):
            found = hits(rows, scores, res.store)
            for h in found:
                out.write(json.dumps({"query": start + b, **h}, ensure_ascii=False) + "\n")
            if kilt is not None:
                kilt.write(json.dumps(kilt_record(ids[start + b], batch[b], found), ensure_ascii=False) + "\n")
    out.flush()


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.kilt_out is None:
        search(args, sys.stdout, None)
        return 0
    with atomic_path(args.kilt_out) as tmp, open(tmp, "w", encoding="utf-8") as kilt:
        search(args, sys.stdout, kilt)
    print(f"wrote {args.kilt_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
