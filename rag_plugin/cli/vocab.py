"""rag-vocab: a generator vocabulary trained on your own passages: a SentencePiece model (unigram, with
byte fallback: a character outside it is spelled in UTF-8 byte pieces rather than <unk>) and the
fairseq dictionary that goes with it.

    rag-vocab --passages passages.jsonl [more.tsv ...] --out VOCAB_DIR [--size 8000]
        [--questions DATA/train.jsonl ...]

Writes VOCAB_DIR/spm.model, spm.vocab (SentencePiece's piece<TAB>score list) and dict.txt (one line per
piece, in the model's order, without the <unk>/<s>/</s> that fairseq adds itself), then vocab.json
(what it was trained on) last. The training text is each passage's title and text, and the questions
and answers of the KILT files given with --questions. Then build the knowledge source with it:

    rag-build-knowledge --passages passages.jsonl --out KS_DIR \\
        --dict VOCAB_DIR/dict.txt --bpe-model VOCAB_DIR/spm.model

A small corpus cannot fill a large vocabulary: the error then names the largest --size it can.
The same input and options give the same files.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Sequence

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_write_json


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-vocab", description=__doc__)
    p.add_argument("--passages", required=True, nargs="+",
                   help="the passages the knowledge source is built from: DPR-layout .tsv or .jsonl (also .gz)")
    p.add_argument("--out", required=True, help="output directory (spm.model, spm.vocab, dict.txt, vocab.json)")
    p.add_argument("--size", type=int, default=8000, help="vocabulary size (pieces, the 256 byte pieces included)")
    p.add_argument("--questions", nargs="*", default=[],
                   help="KILT JSONL files whose questions and answers are also trained on (e.g. DATA/train.jsonl)")
    p.add_argument("--model-type", choices=("unigram", "bpe"), default="unigram", help="SentencePiece model type")
    p.add_argument("--seed", type=int, default=0, help="SentencePiece's random seed")
    p.add_argument("--threads", type=int, default=2, help="SentencePiece training threads")
    return p


def training_text(passage_files: Sequence[str], question_files: Sequence[str]) -> List[str]:
    """The lines SentencePiece trains on: titles, passage texts, then questions and answers."""
    from rag_plugin.data.kilt import read_kilt  # start-up: --help needs neither (numpy for the passages)
    from rag_plugin.retrieval.passages import read_collection

    lines: List[str] = []
    for passage in read_collection(list(passage_files)):
        lines += [passage.title, passage.text]
    for path in question_files:
        for record in read_kilt(path):
            lines += [record.input, *record.answers]
    return [line for text in lines for line in text.split("\n") if line.strip()]


def train(lines: List[str], out: Path, args) -> int:
    """spm.model, spm.vocab and dict.txt under ``out``; the number of dict.txt lines."""
    from rag_plugin.datasets.vocab import train_spm, write_fairseq_dict_from_spm  # start-up (sentencepiece)

    try:
        train_spm(lines, out / "spm.model", out / "spm.vocab", vocab_size=args.size, model_type=args.model_type,
                  seed=args.seed, num_threads=args.threads)
    except UserError as err:
        too_high = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", err.message)
        if too_high:
            most = too_high.group(1)
            raise UserError(f"--size {args.size} is more pieces than this text holds (at most {most})",
                            fix=f"use --size {most} or less, or add text: more passages or --questions") from None
        raise
    return write_fairseq_dict_from_spm(out / "spm.model", out / "dict.txt")


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.size < 1:
        raise UserError(f"--size must be positive, got {args.size}", fix="use e.g. --size 8000")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError("--out is a file, not a directory", path=str(out), fix="name a directory")
    lines = training_text(args.passages, args.questions)
    print(f"training SentencePiece ({args.model_type}, {args.size} pieces, byte fallback) on {len(lines)} lines",
          flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").unlink(missing_ok=True)  # written last: its presence means the rest is complete
    symbols = train(lines, out, args)
    atomic_write_json(out / "vocab.json", {
        "passages": [str(Path(p).resolve()) for p in args.passages],
        "questions": [str(Path(p).resolve()) for p in args.questions],
        "size": args.size, "model_type": args.model_type, "seed": args.seed, "byte_fallback": True,
        "training_lines": len(lines), "dict_symbols": symbols})
    print(f"{out}: spm.model, spm.vocab, dict.txt ({symbols} symbols)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
