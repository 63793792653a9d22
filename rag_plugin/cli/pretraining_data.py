"""rag-pretraining-data: self-supervised pretraining records (train/valid KILT JSONL) from a
knowledge source's passages.

    rag-pretraining-data --knowledge KS_DIR --out DIR [--objective denoise|pseudo-questions|lm]
        [--valid 200] [--max-words 32] [--seed 0]

denoise: reconstruct a corrupted passage (BART's objective in miniature), trained closed book;
pseudo-questions: a run of a passage's words -> its title, or the words that follow them, trained
with retrieval; lm: the passages as a language model reads them (``title </s> text``, one per line, in the
knowledge source's generator tokens), binarized for fairseq's own ``language_modeling`` task (train/valid
.bin/.idx and dict.txt), to pretrain a decoder-only reader (rag_lm_*). Then pretrain a generator and start RAG
models from it:

    fairseq-train DIR --task retrieval_augmented --knowledge KS_DIR --n-docs 0 ... --save-dir PRE
    fairseq-train DATA ... --generator-checkpoint PRE/checkpoint_last.pt
    fairseq-train DIR --task language_modeling --arch transformer_lm_rag_tiny --sample-break-mode eos \
        --user-dir rag_plugin ... --save-dir PRE_LM                                      (--objective lm)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_write_text


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-pretraining-data", description=__doc__)
    p.add_argument("--knowledge", required=True, help="knowledge source directory")
    p.add_argument("--out", required=True, help="output directory (train.jsonl, valid.jsonl)")
    p.add_argument("--valid", type=int, default=200, help="records held out for validation")
    p.add_argument("--max-words", type=int, default=32, help="words of each passage to reconstruct (denoise)")
    p.add_argument("--seed", type=int, default=0, help="seed of the corruption, the questions and the shuffle")
    p.add_argument("--objective", choices=("denoise", "pseudo-questions", "lm"), default="denoise",
                   help="denoise (reconstruct corrupted passages), pseudo-questions (a run of words -> title) or "
                        "lm (the passages, binarized for fairseq's language_modeling task)")
    return p


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rag_plugin.datasets.denoising import denoising_records, pseudo_question_records  # start-up: numpy
    from rag_plugin.retrieval.knowledge import KnowledgeSource  # start-up: numpy; --help stays light

    knowledge = KnowledgeSource(args.knowledge)
    if args.objective == "lm":
        from rag_plugin.datasets.lm_passages import write_lm_passages

        train, valid = write_lm_passages(knowledge, Path(args.out), args.valid, args.seed)
        print(f"{args.out}: {train} train, {valid} valid passages (fairseq language_modeling data)")
        return 0
    store = knowledge.passages
    passages = (store.passage(r) for r in range(len(store)))
    if args.objective == "denoise":
        records = denoising_records(passages, args.seed, args.max_words)
    else:
        records = pseudo_question_records(passages, args.seed)
    if len(records) <= args.valid:
        raise UserError(f"only {len(records)} usable passages for {args.valid} validation records",
                        path=args.knowledge, fix="lower --valid")
    out = Path(args.out)
    for name, rows in (("valid", records[: args.valid]), ("train", records[args.valid:])):
        atomic_write_text(out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{out}: {len(records) - args.valid} train, {args.valid} valid records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
