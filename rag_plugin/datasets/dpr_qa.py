"""DPR's open-QA files: the qas TSV files (``nq-test.csv``: ``question<TAB>['answer', ...]``) and
the retriever-training JSON (``nq-train.json``: ``[{"question", "answers", "positive_ctxs", ...}]``).

Both are streamed; a bad line is a one-line :class:`~rag_plugin.util.errors.UserError` naming
the file and line. DPR's positive contexts become provenance ``{"id": psgs_w100 id, "title"}``.
"""
from __future__ import annotations

import ast
import csv
import json
import sys
from typing import Iterator, List, Tuple

from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import READ_ERRORS, PathLike, open_text, unreadable_file_error, utf8_error

QAS_FIX = "each line must be question<TAB>['answer1', 'answer2'] (DPR qas format)"
JSON_FIX = 'expected DPR retriever JSON: [{"question": ..., "answers": [...], "positive_ctxs": [...]}, ...]'


def parse_answer_list(text: str, path: PathLike, line: int) -> List[str]:
    """DPR's answers column: a Python (or JSON) list literal of strings."""
    s = text.strip()
    try:
        value = ast.literal_eval(s)  # literals only: no code runs
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        try:
            value = json.loads(s)
        except (json.JSONDecodeError, RecursionError):
            raise UserError(f"answers column is not a list literal: {s[:60]!r}", path=str(path), line=line,
                            fix=QAS_FIX) from None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise UserError("answers column must be a list of strings", path=str(path), line=line, fix=QAS_FIX)
    return list(value)


def _tsv_rows(path: PathLike) -> Iterator[Tuple[int, List[str]]]:
    """``(line, row)`` of a tab-separated file read like DPR reads it (``csv.reader``)."""
    csv.field_size_limit(min(sys.maxsize, 2 ** 31 - 1))
    with open_text(path, newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        prev = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                raise UserError(f"unreadable TSV row ({err})", path=str(path), line=reader.line_num,
                                fix="fix that line") from None
            except UnicodeDecodeError:
                raise utf8_error(path) from None
            except READ_ERRORS as err:  # a truncated or corrupt .gz
                raise unreadable_file_error(path, err) from None
            line, prev = prev + 1, reader.line_num
            yield line, row


def iter_dpr_qas(path: PathLike) -> Iterator[Tuple[int, str, List[str], List[str]]]:
    """DPR's qas files: ``question<TAB>answers-list`` per line, no header, read like DPR does
    (``csv.reader(delimiter='\\t')``). Yields ``(line, question, answers, extra_columns)``."""
    for line, row in _tsv_rows(path):
        if not row or all(not c.strip() for c in row):
            continue
        if line == 1 and row[0].strip().lower() == "question" and len(row) > 1 \
                and row[1].strip().lower().startswith("answer"):
            continue  # a header (DPR's files have none)
        if len(row) < 2:
            raise UserError(f"expected 2 tab-separated columns (question, answers), found {len(row)}",
                            path=str(path), line=line, fix=QAS_FIX)
        yield line, row[0].strip(), parse_answer_list(row[1], path, line), row[2:]


def norm_passage_id(pid) -> str:
    """A DPR passage id as psgs_w100 writes it (a ``wiki:`` prefix of newer releases removed)."""
    s = str(pid).strip()
    return s[5:] if s.startswith("wiki:") else s


def positive_provenance(contexts) -> List[dict]:
    """DPR's ``positive_ctxs`` -> provenance ``[{"id", "title"}]``, duplicates dropped."""
    provenance, seen = [], set()
    for ctx in contexts or []:
        if not isinstance(ctx, dict):
            continue
        pid = next((ctx[k] for k in ("passage_id", "psg_id", "id") if ctx.get(k) is not None), None)
        prov = {"title": ctx.get("title") or ""}
        if pid is not None:
            prov = {"id": norm_passage_id(pid), **prov}
        key = prov.get("id") or ("title", prov["title"])
        if key in seen:
            continue
        seen.add(key)
        provenance.append(prov)
    return provenance


def iter_dpr_json(path: PathLike) -> Iterator[Tuple[int, str, List[str], List[dict]]]:
    """DPR's retriever-training JSON: ``[{question, answers, positive_ctxs: [{title, text,
    passage_id|psg_id, ...}], negative_ctxs, hard_negative_ctxs}, ...]`` (streamed).
    Yields ``(line, question, answers, provenance)``; positive contexts become provenance."""
    with JsonStream(path) as js:
        if js.peek() != "[":
            raise js.error("not a JSON array", fix=JSON_FIX)
        for line, obj in js.iter_array():
            if not isinstance(obj, dict) or "question" not in obj or "answers" not in obj:
                raise UserError("element lacks 'question' or 'answers'", path=str(path), line=line, fix=JSON_FIX)
            answers = obj["answers"]
            if isinstance(answers, str):
                answers = [answers]
            if not isinstance(answers, list) or not isinstance(obj["question"], str):
                raise UserError("'question' must be a string and 'answers' a list", path=str(path),
                                line=line, fix=JSON_FIX)
            yield line, obj["question"].strip(), answers, positive_provenance(obj.get("positive_ctxs"))
