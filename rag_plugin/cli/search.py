"""rag-search: search a knowledge source; print one JSON object per hit, and optionally write KILT output.

    rag-search --knowledge DIR (--query TEXT | --queries FILE | --data-file DATA/test.jsonl) [-k 5] \\
        [--bm25 | --hybrid [--fusion rrf|weighted] [--rrf-k 60] [--fusion-weight 0.5]] [--kilt-out hits.kilt.jsonl] \\
        [--rerank maxsim|upr|cross] [--rerank-candidates L] [--path CHECKPOINT] [--device cpu|cuda]

Each printed line: {"query": <0-based question number>, "rank", "id", "title", "score", "text"}.

--kilt-out FILE writes one KILT record per question, {"id": <question id>, "input": question,
"output": [{"provenance": [{"id": passage id, "title", "score", "text"}, ...]}]} (best first), which
rag-evaluate scores directly:

    rag-search --knowledge KS --data-file DATA/test.jsonl -k 20 --kilt-out hits.jsonl > /dev/null
    rag-evaluate --gold DATA/test.jsonl --guess hits.jsonl --metrics rprec,recall@5,recall@20

Question ids are the --data-file's record ids (so they match the gold file), else the 0-based
question number.

--rerank {maxsim,upr,cross} reranks the first stage's --rerank-candidates L of each question and keeps the best -k
(scores: the reranker's logits); without --path only maxsim (the knowledge source's own encoder, late interaction),
with --path CHECKPOINT the checkpoint's model retrieves and reranks exactly as generation reads (its own first stage
and reranker; see rag_plugin/cli/search_rerank.py):

    rag-search --knowledge KS --data-file DATA/test.jsonl -k 5 --rerank maxsim --rerank-candidates 20 \\
        --kilt-out maxsim.jsonl > /dev/null
    rag-search --knowledge KS --data-file DATA/test.jsonl -k 5 --path CKPT/checkpoint_best.pt \\
        --kilt-out reranked.jsonl > /dev/null
    rag-evaluate --gold DATA/test.jsonl --guess reranked.jsonl --metrics recall@1,recall@5
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Tuple

from rag_plugin.cli import search_rerank
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
    # defaults None (the values below): --path refuses them when given (the checkpoint has its own first stage)
    p.add_argument("--fusion", choices=("rrf", "weighted"), default=None,
                   help="--hybrid: reciprocal rank fusion or min-max normalised weighted scores (default: rrf)")
    p.add_argument("--rrf-k", type=float, default=None, help="--fusion rrf: the k of 1 / (k + rank) (default: 60)")
    p.add_argument("--fusion-weight", type=float, default=None,
                   help="--fusion weighted: the dense side's weight (default: 0.5)")
    p.add_argument("--hybrid-candidates", type=int, default=None,
                   help="--hybrid: candidates from each side before fusing (default: 0, max(20, 2 x -k); with "
                        "--rerank max(20, 2 x L))")
    p.add_argument("--kilt-out", default=None, metavar="FILE",
                   help="also write the hits as KILT JSONL (one record per question) for rag-evaluate")
    search_rerank.add_options(p)
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


def _retriever(args, depth: int, knowledge=None):
    """The first stage, searched ``depth`` deep (-k, or L with --rerank); ``knowledge``: the source, opened."""
    from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever  # start-up: numpy, faiss, bm25s

    if args.bm25:
        return BM25Retriever(knowledge.passages) if knowledge is not None else BM25Retriever.from_dir(args.knowledge)
    if knowledge is None:
        dense = DenseRetriever.from_dir(args.knowledge, nprobe=args.nprobe, ef_search=args.ef_search,
                                        index_mode="private" if args.private_index else "shared")
    else:
        if args.nprobe is not None or args.ef_search is not None:
            knowledge.set_search_params(nprobe=args.nprobe, ef_search=args.ef_search)
        dense = DenseRetriever(knowledge)
    if not args.hybrid:
        return dense
    from rag_plugin.retrieval.hybrid import HybridRetriever  # start-up

    candidates = args.hybrid_candidates or max(20, 2 * depth)
    if candidates < depth:
        what = f"-k {args.k}" if depth == args.k else f"--rerank-candidates {depth}"
        raise UserError(f"--hybrid-candidates {candidates} is fewer than {what}",
                        fix=f"take at least {depth} candidates from each side (0: automatic)")
    return HybridRetriever(dense, BM25Retriever(dense.store), fusion=args.fusion or "rrf",
                           rrf_k=60.0 if args.rrf_k is None else args.rrf_k,
                           weight=0.5 if args.fusion_weight is None else args.fusion_weight,
                           candidates=min(candidates, len(dense.store)))


def _searcher(args):
    """What searches a batch of questions: ``search(questions) -> Retrieval`` of -k hits each."""
    if args.path is not None:
        return search_rerank.checkpoint_retrieval(args)
    if args.rerank is not None:
        return search_rerank.late_interaction(args, lambda knowledge, depth: _retriever(args, depth, knowledge))
    retriever = _retriever(args, args.k)
    return _Plain(retriever, args.k)


class _Plain:
    """The first stage alone: ``search(questions)`` -> its top -k."""

    def __init__(self, retriever, k: int):
        self.first_stage, self.k = retriever, k

    def search(self, questions):
        return self.first_stage.search(questions, self.k)


def _progress(total: int):
    """A progress bar on stderr for many questions (none for a few)."""
    from tqdm import tqdm  # start-up: not needed by --help

    return tqdm(total=total, desc="rag-search", unit=" q", mininterval=1.0, file=sys.stderr,
                disable=total < PROGRESS_FROM)


#: questions from which a progress bar is shown
PROGRESS_FROM = 200


def search(args, out, kilt) -> None:
    """Search every question; JSON lines to ``out``, KILT records to ``kilt`` (when not None)."""
    search_rerank.check_arguments(args)
    questions, ids = questions_and_ids(args)
    searcher = _searcher(args)
    with _progress(len(questions)) as bar:
        for start in range(0, len(questions), args.batch_size):
            batch = questions[start:start + args.batch_size]
            res = searcher.search(batch)
            for b, (rows, scores) in enumerate(zip(res.rows, res.scores)):
                found = hits(rows, scores, res.store)
                for h in found:
                    out.write(json.dumps({"query": start + b, **h}, ensure_ascii=False) + "\n")
                if kilt is not None:
                    kilt.write(json.dumps(kilt_record(ids[start + b], batch[b], found), ensure_ascii=False) + "\n")
            bar.update(len(batch))
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
