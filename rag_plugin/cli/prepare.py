"""rag-prepare DATASET: convert a paper dataset's official files to the task's format.

    rag-prepare nq --train NQ-open.train.jsonl --dev NQ-open.dev.jsonl --out data/nq
    rag-prepare triviaqa --train trivia-train.csv --dev trivia-dev.csv --test trivia-test.csv --out data/tqa
    rag-prepare webquestions --train webquestions.examples.train.json --dev webquestions.examples.test.json \\
        --out data/wq
    rag-prepare curatedtrec --train CuratedTrec-train.txt --dev CuratedTrec-test.txt --out data/ct
    rag-prepare msmarco --train train_v2.1.json.gz --dev dev_v2.1.json.gz --out data/msmarco
    rag-prepare jeopardy --input JEOPARDY_QUESTIONS1.json --out data/jeopardy
    rag-prepare fever --train train.jsonl --dev paper_dev.jsonl --test paper_test.jsonl --out data/fever

Writes DIR/{train,valid,test}.jsonl (KILT style) and DIR/prepare.json, all or nothing; inputs may
be gzip-compressed. `rag-prepare DATASET --help` lists a dataset's options; docs/datasets.md
describes the layouts each reads. psgs_w100 with DPR's vectors: `rag-import-knowledge`.
"""
from __future__ import annotations

import argparse
import sys
import textwrap

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.datasets.fever import convert_fever
from rag_plugin.datasets.jeopardy import convert_jeopardy
from rag_plugin.datasets.msmarco import convert_msmarco
from rag_plugin.datasets.open_qa import convert_open_qa
from rag_plugin.datasets.qa_layouts import QA_FORMATS
from rag_plugin.datasets.writer import PAPER_SPLIT_SIZES, SPLITS
from rag_plugin.util.errors import UserError, cli_main

QA_NAMES = {"nq": "Natural Questions", "triviaqa": "TriviaQA", "webquestions": "WebQuestions",
            "curatedtrec": "CuratedTrec"}
QA_LAYOUTS = {"nq": "DPR's qas .csv, DPR's retriever .json, KILT .jsonl or NQ-open's own .jsonl",
              "triviaqa": "DPR's qas .csv, DPR's retriever .json, KILT .jsonl or TriviaQA's own .json",
              "webquestions": "DPR's qas .csv, DPR's retriever .json or SEMPRE's webquestions.examples.*.json",
              "curatedtrec": "DPR's qas .csv, DPR's retriever .json or DrQA's CuratedTrec-*.txt (JSON lines); "
                             "the answers are regular expressions"}


def _described(text: str) -> str:
    """A sub-command's description wrapped by hand (the help formatter keeps text as written)."""
    return textwrap.fill(text, width=100)


def _common_args(p: argparse.ArgumentParser, splits: bool = True) -> None:
    p.add_argument("--out", required=True, help="output directory (new or empty; see --overwrite)")
    if splits:
        p.add_argument("--train", help="official training file")
        p.add_argument("--dev", help="official development file (becomes 'valid' with --test, else 'test')")
        p.add_argument("--test", help="official labelled test file")
        p.add_argument("--valid-from-train", default="0.1", metavar="N",
                       help="without a test file: records (N) or fraction (0<N<1) of train held out for validation")
    p.add_argument("--seed", type=int, default=0, help="seed of every random split")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared dataset in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_qa(sub, dataset: str) -> None:
    p = sub.add_parser(dataset, help=f"{QA_NAMES[dataset]} (open-domain QA)", description=_described(
        f"Prepare {QA_NAMES[dataset]} for rag_plugin (KILT-style train/valid/test.jsonl). Inputs, detected per "
        f"file: {QA_LAYOUTS[dataset]}."))
    _common_args(p)
    p.add_argument("--format", default="auto", choices=QA_FORMATS, help="input layout (auto: detect per file)")
    p.add_argument("--no-provenance", action="store_true",
                   help="drop provenance (KILT provenance names Wikipedia pages, not psgs_w100 passages)")
    if dataset == "triviaqa":
        p.add_argument("--triviaqa-questions", nargs="+", default=[], metavar="FILE",
                       help="TriviaQA JSON files that fill in the questions KILT's TriviaQA lacks")


def _add_msmarco(sub) -> None:
    p = sub.add_parser("msmarco", help="MS-MARCO v2.1 (NLG)", description=_described(
        "Prepare MS-MARCO v2.1 (NLG) for rag_plugin: input = query, answers = well-formed answers where present; "
        "'No Answer Present.' is skipped (and counted). Inputs: the columnar train/dev_v2.1.json(.gz) as released, "
        "or the JSONL of its tojsonl.py."))
    _common_args(p)
    p.add_argument("--use-well-formed", action=argparse.BooleanOptionalAction, default=True,
                   help="use the well-formed answers where a query has them, as the paper does")
    p.add_argument("--well-formed-only", action="store_true",
                   help="keep only queries with a well-formed answer in train and valid (the NLG subset)")


def _add_jeopardy(sub) -> None:
    p = sub.add_parser("jeopardy", help="Jeopardy question generation", description=_described(
        "Prepare Jeopardy question generation for rag_plugin: input = the answer entity, output = the clue. "
        "Inputs: SearchQA per-question JSON folders, JEOPARDY_QUESTIONS1.json, or JSONL of the same items."))
    _common_args(p)
    p.add_argument("--input", help="one unsplit file/folder, split by --seed into --valid-size/--test-size")
    p.add_argument("--valid-size", default="0.1", help="with --input: records or fraction for valid")
    p.add_argument("--test-size", default="0.2", help="with --input: records or fraction for test")


def _add_fever(sub) -> None:
    p = sub.add_parser("fever", help="FEVER fact verification (3-way or 2-way)", description=_described(
        "Prepare FEVER for rag_plugin: input = claim, output = SUPPORTS / REFUTES / NOT ENOUGH INFO. Inputs: "
        "original FEVER JSONL (train.jsonl, paper_dev.jsonl, paper_test.jsonl) or KILT FEVER."))
    _common_args(p)
    p.add_argument("--two-way", action="store_true", help="drop NOT ENOUGH INFO (FEVER-2-way)")
    p.add_argument("--no-provenance", action="store_true", help="drop evidence/provenance")


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-prepare", description=__doc__)
    sub = p.add_subparsers(dest="dataset", metavar="DATASET", required=True)
    for dataset in QA_NAMES:
        _add_qa(sub, dataset)
    _add_msmarco(sub)
    _add_jeopardy(sub)
    _add_fever(sub)
    return p


def _convert(args: argparse.Namespace) -> dict:
    common = dict(seed=args.seed, overwrite=args.overwrite, progress=not args.quiet)
    if args.dataset in QA_NAMES:
        return convert_open_qa(args.dataset, args.out, args.train, args.dev, args.test, fmt=args.format,
                               triviaqa_questions=getattr(args, "triviaqa_questions", []),
                               valid_from_train=args.valid_from_train, keep_provenance=not args.no_provenance,
                               **common)
    if args.dataset == "msmarco":
        return convert_msmarco(args.out, args.train, args.dev, args.test, use_well_formed=args.use_well_formed,
                               well_formed_only=args.well_formed_only, valid_from_train=args.valid_from_train,
                               **common)
    if args.dataset == "jeopardy":
        return convert_jeopardy(args.out, input=args.input, train=args.train, dev=args.dev, test=args.test,
                                valid_size=args.valid_size, test_size=args.test_size,
                                valid_from_train=args.valid_from_train, **common)
    return convert_fever(args.out, args.train, args.dev, args.test, two_way=args.two_way,
                         keep_provenance=not args.no_provenance, valid_from_train=args.valid_from_train, **common)


def report(summary: dict, out) -> None:
    """The counts (beside the paper's Table 7 sizes), skipped records and notes, on stderr."""
    counts = summary["counts"]
    line = f"wrote {out}: " + ", ".join(f"{s} {counts[s]}" for s in SPLITS)
    paper = PAPER_SPLIT_SIZES.get(summary.get("dataset", ""))
    if paper:
        line += f" (paper, Table 7: {'/'.join(map(str, paper))})"
    print(line, file=sys.stderr)
    for part, reasons in summary.get("skipped", {}).items():
        print(f"  {part}: " + ", ".join(f"{v} {k}" for k, v in reasons.items()), file=sys.stderr)
    for note in summary.get("notes", []):
        print(f"  note: {note}", file=sys.stderr)


@cli_main
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["psgs_w100"]:
        raise UserError("psgs_w100 with DPR's precomputed vectors is imported by rag-import-knowledge",
                        fix="rag-import-knowledge --passages psgs_w100.tsv.gz --vectors ... (see its --help)")
    args = build_parser().parse_args(argv)
    report(_convert(args), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
