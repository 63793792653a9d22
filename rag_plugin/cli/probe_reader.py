"""``rag-probe-reader``: does a trained reader (RAG's generator or FiD) tell the passage that answers a question
from the other passages it reads?

    rag-probe-reader --checkpoint CKPT --data FILE.jsonl [--knowledge KS_DIR] [--n-docs 3] [--limit 200]
        [--batch-size 16] [--seed 0] [--json-out probe.json] [--device cuda]

FILE.jsonl: KILT-style records whose ``provenance`` names gold passages of the knowledge source (their ids, or
the id of a document split into ``<id>_<n>`` passages). For each such record (the first --limit), the answer is
scored teacher-forced with the reader reading: the gold passage alone; the gold passage among K-1 random
passages; among the K-1 best non-gold passages of the model's own retriever; K random passages. Printed: the
answer's NLL in nats under each, and the reader's weight on the gold passage (FiD: its share of the decoder's
cross-attention; RAG: its posterior under a uniform prior) against 1/K, a reader that cannot tell them apart.
Details: :mod:`rag_plugin.evaluation.reader_probe`.
"""
from __future__ import annotations

import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.devices import DEVICE_HELP
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_write_json


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-probe-reader", description=__doc__)
    p.add_argument("--checkpoint", required=True, help="a RAG or FiD checkpoint*.pt written by fairseq-train")
    p.add_argument("--data", required=True, help="KILT-style JSONL with answers and gold passage provenance")
    p.add_argument("--knowledge", default=None,
                   help="knowledge source (default: the one the checkpoint was trained with)")
    p.add_argument("--n-docs", type=int, default=3, help="K, the passages read in the mixed conditions (2 or more)")
    p.add_argument("--limit", type=int, default=200, help="probe the first N records that name a gold passage")
    p.add_argument("--batch-size", type=int, default=16, help="questions per forward pass")
    p.add_argument("--seed", type=int, default=0, help="seed of the random passages and of the gold passage's slot")
    p.add_argument("--json-out", default=None, help="also write the numbers as JSON to this file")
    p.add_argument("--device", default=None, help=f"where the model runs: {DEVICE_HELP}")
    return p


def format_table(result, label: str) -> str:
    from rag_plugin.evaluation.reader_probe import CONDITIONS  # start-up: imports torch and fairseq

    lines = [f"{label}: {result.n} questions, K = {result.k} (chance share {1 / result.k:.3f})"
             + (f"; {result.skipped} records skipped (no gold passage in the knowledge source)" if result.skipped
                else ""),
             f"{'condition':16s} {'answer NLL':>11s} {'gold share':>11s}"]
    for cond in CONDITIONS:
        share = result.gold_share.get(cond)
        lines.append(f"{cond:16s} {result.answer_nll[cond]:11.3f} {'-' if share is None else f'{share:.3f}':>11s}")
    return "\n".join(lines)


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    for flag, value, least in (("--n-docs", args.n_docs, 2), ("--limit", args.limit, 1),
                               ("--batch-size", args.batch_size, 1)):
        if value < least:
            raise UserError(f"{flag} {value}: must be at least {least}", fix=f"pass {flag} {least} or more")
    # start-up (--help needs none of them); and fairseq is imported quietly before the modules that import it
    from tqdm.auto import tqdm

    from rag_plugin.util.quiet_import import import_fairseq_quietly

    import_fairseq_quietly()  # before the modules below import fairseq (its import-time log lines otherwise)
    from rag_plugin.data.gold_rows import rows_by_passage_id
    from rag_plugin.data.kilt import read_kilt
    from rag_plugin.evaluation import reader_probe
    from rag_plugin.hub import RAG

    records = read_kilt(args.data)
    # as trained: a closed-book one is refused
    rag = RAG.from_pretrained(args.checkpoint, knowledge=args.knowledge, device=args.device)
    data = reader_probe.probe_questions(records, rows_by_passage_id(rag.task.knowledge.passages), args.limit)
    reader_probe.check(rag, data, args.n_docs)
    with tqdm(total=len(data), desc="probing", unit="question", mininterval=1.0) as bar:
        result = reader_probe.probe(rag, data, args.n_docs, args.batch_size, args.seed, progress=bar.update)
    print(format_table(result, args.checkpoint))
    if args.json_out:
        atomic_write_json(args.json_out, {"checkpoint": args.checkpoint, "data": args.data, **result.as_dict()})
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
