"""KILT JSONL as a converter input (``nq-dev-kilt.jsonl``, ``triviaqa-dev_id-kilt.jsonl``,
``fever-dev-kilt.jsonl``): a record's id, question, answers and provenance.

Records are read with :func:`rag_plugin.util.io.iter_jsonl`; a bad record is a one-line
:class:`~rag_plugin.util.errors.UserError` naming the file and line.
"""
from __future__ import annotations

import json
from typing import Dict, Iterator, List, Optional, Tuple

from rag_plugin.datasets.writer import clean_answers
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl

KILT_FIX = 'expected KILT JSONL: {"id": ..., "input": ..., "output": [{"answer": ..., "provenance": [...]}]}'

#: A converter's row: ``(line, id, question, answers, provenance, meta)``.
Row = Tuple[int, str, str, List[str], List[dict], Optional[dict]]
#: Question id -> (question, answers), to fill in what KILT's TriviaQA leaves out.
Lookup = Dict[str, Tuple[str, List[str]]]


def kilt_fields(obj: dict, path: PathLike, line: int) -> Tuple[str, str, List[str], List[dict]]:
    """``(id, question, answers, provenance)`` of a KILT record; provenance de-duplicated."""
    if "id" not in obj:
        raise UserError("record lacks 'id'", path=str(path), line=line, fix=KILT_FIX)
    question = obj.get("input")
    if question is not None and not isinstance(question, str):
        raise UserError("'input' must be a string", path=str(path), line=line, fix=KILT_FIX)
    outputs = obj.get("output") or []
    if not isinstance(outputs, list):
        raise UserError("'output' must be a list", path=str(path), line=line, fix=KILT_FIX)
    answers, provenance, seen = [], [], set()
    for out in outputs:
        if not isinstance(out, dict):
            raise UserError("'output' must be a list of objects", path=str(path), line=line, fix=KILT_FIX)
        if isinstance(out.get("answer"), str):
            answers.append(out["answer"])
        for prov in out.get("provenance") or []:
            if isinstance(prov, dict):
                key = json.dumps(prov, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    provenance.append(prov)
    return str(obj["id"]), (question or "").strip(), answers, provenance


def kilt_rows(path: PathLike, lookup: Lookup) -> Iterator[Row]:
    """KILT records; a missing question or answers is filled from ``lookup`` (TriviaQA's own
    files, by id) and ``meta`` says so."""
    for line, obj in iter_jsonl(path, fix=KILT_FIX):
        rid, question, answers, provenance = kilt_fields(obj, path, line)
        filled = lookup.get(rid)
        meta = {}
        if filled is not None:
            if not question and filled[0]:
                question, meta["input_from"] = filled[0], "triviaqa"
            if not clean_answers(answers) and filled[1]:
                answers, meta["answers_from"] = filled[1], "triviaqa"
        yield line, rid, question, answers, provenance, meta or None
