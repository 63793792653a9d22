"""Open-domain QA converter: Natural Questions, TriviaQA, WebQuestions, CuratedTrec ->
``out/{train,valid,test}.jsonl`` (``rag-prepare nq|triviaqa|webquestions|curatedtrec``).

Each input file may be in any layout of :mod:`rag_plugin.datasets.qa_layouts` (DPR qas TSV, DPR
retriever JSON, KILT JSONL, NQ-open / DrQA JSON lines, WebQuestions' SEMPRE JSON, TriviaQA JSON),
detected per file unless ``fmt`` says which. CuratedTrec's answers are regular expressions: kept
verbatim with ``meta.answer_is_regex = true`` (``rag-curatedtrec-targets`` then derives concrete
training targets).
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional, Sequence

from rag_plugin.datasets.inputs import progress as with_progress
from rag_plugin.datasets.kilt_records import Lookup, Row
from rag_plugin.datasets.qa_layouts import QA_FORMATS, detect_qa_format, qa_rows
from rag_plugin.datasets.triviaqa import kilt_triviaqa_lookup
from rag_plugin.datasets.writer import (
    DatasetWriter,
    clean_answers,
    finish_with_carving,
    make_record,
    parse_size,
    plan_splits,
)
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, require_file

QA_DATASETS = ("nq", "triviaqa", "webquestions", "curatedtrec")
QA_NAMES = {"nq": "NQ", "triviaqa": "TriviaQA", "webquestions": "WebQuestions", "curatedtrec": "CuratedTrec"}
REGEX_DATASETS = frozenset({"curatedtrec"})


def convert_open_qa(dataset: str, out: PathLike, train: PathLike, dev: Optional[PathLike] = None,
                    test: Optional[PathLike] = None, *, fmt: str = "auto",
                    triviaqa_questions: Sequence[PathLike] = (), valid_from_train="0.1", seed: int = 0,
                    keep_provenance: bool = True, overwrite: bool = False, progress: bool = True) -> dict:
    """NQ / TriviaQA / WebQuestions / CuratedTrec -> ``out/{train,valid,test}.jsonl``; returns
    the summary written to ``out/prepare.json``.

    Each input file may be in any supported layout (detected per file unless ``fmt``). KILT
    TriviaQA records without a question are filled from ``triviaqa_questions`` by id.
    """
    if dataset not in QA_DATASETS:
        raise UserError(f"unknown dataset {dataset!r}", fix=f"use one of {', '.join(QA_DATASETS)}")
    if fmt not in QA_FORMATS:
        raise UserError(f"unknown format {fmt!r}", fix=f"use one of {', '.join(QA_FORMATS)}")
    plan, carve_valid = plan_splits(train, dev, test)
    if carve_valid:
        parse_size(valid_from_train)
    formats = [(path, part, role, fmt if fmt != "auto" else detect_qa_format(path, QA_NAMES[dataset]))
               for path, part, role in plan]
    for f in triviaqa_questions:
        require_file(f, "TriviaQA questions file")
    lookup: Lookup = {}
    kilt_files = [path for path, _, _, f in formats if f == "kilt"]
    if kilt_files and dataset == "triviaqa":  # KILT ships TriviaQA without questions
        lookup = kilt_triviaqa_lookup(kilt_files, triviaqa_questions, progress)

    with DatasetWriter(out, overwrite=overwrite) as writer:
        regex_errors: Counter = Counter()
        for path, part, role, f in formats:
            writer.source(part, path)
            rows = with_progress(qa_rows(f, path, f"{dataset}-{role}", lookup), f"{dataset} {role}", progress)
            regex_errors[part] += _write_rows(writer, part, path, rows, dataset in REGEX_DATASETS, keep_provenance)
        for part, n in regex_errors.items():
            if n:
                writer.notes.append(f"{part}: {n} answer patterns do not compile as Python regexes (kept verbatim)")
        info = {"dataset": dataset, "formats": {part: f for _, part, _, f in formats},
                "options": {"valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed,
                            "keep_provenance": keep_provenance,
                            "triviaqa_questions": [str(Path(p).resolve()) for p in triviaqa_questions]}}
        return finish_with_carving(writer, carve_valid, valid_from_train, seed, info)


def _write_rows(writer: DatasetWriter, part: str, path: PathLike, rows: Iterable[Row], is_regex: bool,
                keep_provenance: bool) -> int:
    """Write the records of one input file into ``part``; returns how many of their answer
    patterns do not compile (``is_regex`` only)."""
    not_compiling = 0
    for line, rid, question, answers, provenance, meta in rows:
        if not question:
            raise UserError("empty question", path=str(path), line=line, fix="remove that record or give it a question")
        answers = clean_answers(answers)
        if not answers:
            writer.skip(part, "no answer")
            continue
        meta = dict(meta or {})
        if is_regex:
            meta["answer_is_regex"] = True
            not_compiling += sum(not _compiles(a) for a in answers)
        writer.write(part, make_record(rid, question, answers, provenance if keep_provenance else (), meta))
    return not_compiling


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True
