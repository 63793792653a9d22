"""MS-MARCO v2.1 (NLG) converter (``rag-prepare msmarco``): input = the query, answers = the
well-formed answers where present, else the plain answers; ``No Answer Present.`` is skipped.

Two layouts are read: the release's JSON object of columns keyed by row number
(``train_v2.1.json``: ``{"query": {"0": ...}, "answers": {"0": [...]}, "wellFormedAnswers":
{"0": [...] | "[]"}, "passages": {...}, "query_id", "query_type"}``), whose columns are spilled
into an on-disk SQLite table and joined by row (bounded memory); and the JSONL written by
MS-MARCO's ``tojsonl.py`` (one ``{"answers", "passages", "query", "query_id", "query_type",
"wellFormedAnswers"}`` per line). The passages are not used (the paper retrieves from Wikipedia).
"""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Iterator, List, Optional

from rag_plugin.datasets.inputs import layout_error, sniff_format
from rag_plugin.datasets.inputs import progress as with_progress
from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.datasets.writer import (
    DatasetWriter,
    clean_answers,
    finish_with_carving,
    make_record,
    parse_size,
    plan_splits,
)
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl

MSMARCO_NO_ANSWER = "No Answer Present."
#: column of the release -> field of a row
MSMARCO_COLUMNS = {"query": "query", "answers": "answers", "wellFormedAnswers": "wfa",
                   "query_id": "qid", "query_type": "qtype"}
ACCEPTED = ("v2.1 columnar .json as released (train_v2.1.json, dev_v2.1.json)", "v2.1 JSONL of its tojsonl.py")
COLUMNS_FIX = "expected MS-MARCO v2.1 JSON (train_v2.1.json / dev_v2.1.json)"
JSONL_FIX = 'expected MS-MARCO v2.1 JSONL: {"query": ..., "answers": [...], "wellFormedAnswers": ..., ...} per line'
NO_ANSWERS = "no 'answers' column (the eval file ships without answers)"
NO_ANSWERS_FIX = "use train_v2.1.json and dev_v2.1.json; dev becomes the test split"


# ---------------------------------------------------------------------------------- columnar JSON
def _index_key(key: str, js: JsonStream, line: int) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise UserError(f"row key {key!r} is not a number", path=js.path, line=line,
                        fix="expected MS-MARCO v2.1 columnar JSON ({'query': {'0': ...}, ...})") from None


def _spill_columns(js: JsonStream, con: sqlite3.Connection, progress: bool) -> set:
    """Every known column of the document into table ``r``; returns the fields seen."""
    seen_cols = set()
    for _, col in js.iter_object():
        target = MSMARCO_COLUMNS.get(col)
        if target is None:  # passages and anything unknown: parse, discard
            if js.peek() == "{":
                for _, _k in with_progress(js.iter_object(), f"skip {col}", progress):
                    js.value()
            else:
                js.value()
            continue
        if js.peek() != "{":
            raise js.error(f"column {col!r} is not an object keyed by row", fix=COLUMNS_FIX)
        seen_cols.add(target)
        sql = (f"INSERT INTO r (k, {target}) VALUES (?, ?) "
               f"ON CONFLICT(k) DO UPDATE SET {target} = excluded.{target}")
        batch = []
        for kline, key in with_progress(js.iter_object(), f"read {col}", progress):
            batch.append((_index_key(key, js, kline), json.dumps(js.value(), ensure_ascii=False)))
            if len(batch) >= 20000:
                con.executemany(sql, batch)
                batch.clear()
        if batch:
            con.executemany(sql, batch)
    return seen_cols


def iter_msmarco(path: PathLike, workdir: PathLike, progress: bool = False) -> Iterator[dict]:
    """Rows of MS-MARCO v2.1's columnar JSON, joined by row key in an on-disk SQLite table
    (bounded memory); ``passages`` are parsed and discarded. Yields ``{"key", "query",
    "answers", "wfa", "qid", "qtype"}`` in key order."""
    db_path = Path(workdir) / f"msmarco-{os.getpid()}-{abs(hash(str(path)))}.sqlite"
    con = sqlite3.connect(str(db_path))
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE r (k INTEGER PRIMARY KEY, query TEXT, answers TEXT, wfa TEXT, qid TEXT, qtype TEXT)")
        with JsonStream(path) as js:
            if js.peek() != "{":
                raise js.error("not a JSON object", fix=COLUMNS_FIX)
            seen_cols = _spill_columns(js, con, progress)
        if "query" not in seen_cols:
            raise UserError("no 'query' column", path=str(path), fix=COLUMNS_FIX)
        if "answers" not in seen_cols and "wfa" not in seen_cols:
            raise UserError(NO_ANSWERS, path=str(path), fix=NO_ANSWERS_FIX)
        con.commit()
        fields = ("query", "answers", "wfa", "qid", "qtype")
        for k, *values in con.execute("SELECT k, query, answers, wfa, qid, qtype FROM r ORDER BY k"):
            yield {"key": k, **{f: None if v is None else json.loads(v) for f, v in zip(fields, values)}}
    finally:
        con.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(str(db_path) + suffix)
            except FileNotFoundError:
                pass


# ---------------------------------------------------------------------------------- JSONL
def iter_msmarco_jsonl(path: PathLike) -> Iterator[dict]:
    """Rows of the JSONL written by MS-MARCO's ``tojsonl.py``, in file order, as
    :func:`iter_msmarco` yields them (``key`` = the record's position, plus its ``line``)."""
    for i, (line, obj) in enumerate(iter_jsonl(path, fix=JSONL_FIX)):
        if "query" not in obj:
            raise UserError("record lacks 'query'", path=str(path), line=line, fix=JSONL_FIX)
        if "answers" not in obj and "wellFormedAnswers" not in obj:
            raise UserError(NO_ANSWERS.replace("column", "field"), path=str(path), line=line, fix=NO_ANSWERS_FIX)
        yield {"key": i, "line": line, "query": obj["query"], "answers": obj.get("answers"),
               "wfa": obj.get("wellFormedAnswers"), "qid": obj.get("query_id"), "qtype": obj.get("query_type")}


def msmarco_layout(path: PathLike) -> str:
    """``columns`` (the release's JSON) or ``jsonl`` (``tojsonl.py``); else a one-line error."""
    kind = sniff_format(path)
    if kind == "msmarco":
        return "columns"
    if kind == "jsonl":
        for _, first in iter_jsonl(path, fix=JSONL_FIX):
            if "query" in first and ({"answers", "wellFormedAnswers", "query_id", "passages"} & set(first)):
                return "jsonl"
            break
    raise layout_error(path, "MS-MARCO", ACCEPTED)


# ---------------------------------------------------------------------------------- converter
def _as_answer_list(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [] if value.strip() in ("", "[]") else [value]
    if isinstance(value, list):
        return [a for a in value if isinstance(a, str)]
    return []


def _row_answers(row: dict, use_well_formed: bool):
    """``(answers, well_formed)``, or ``(None, reason)`` for a row to skip."""
    wfa = clean_answers(_as_answer_list(row["wfa"]), drop=[MSMARCO_NO_ANSWER])
    if use_well_formed and wfa:
        return wfa, True
    answers = clean_answers(_as_answer_list(row["answers"]))
    if MSMARCO_NO_ANSWER in answers:
        answers = [a for a in answers if a != MSMARCO_NO_ANSWER]
        if not answers:
            return None, MSMARCO_NO_ANSWER
    return (answers, False) if answers else (None, "no answer")


def _write_rows(writer: DatasetWriter, part: str, role: str, path: PathLike, rows: Iterator[dict],
                use_well_formed: bool, well_formed_only: bool) -> None:
    for row in rows:
        query = row["query"]
        if not isinstance(query, str) or not query.strip():
            raise UserError(f"row {row['key']} has no query", path=str(path), line=row.get("line"),
                            fix="is this an MS-MARCO v2.1 file?")
        if well_formed_only and part != "test" and \
                not clean_answers(_as_answer_list(row["wfa"]), drop=[MSMARCO_NO_ANSWER]):
            writer.skip(part, "no well-formed answer")
            continue
        answers, well_formed = _row_answers(row, use_well_formed)
        if answers is None:
            writer.skip(part, well_formed)
            continue
        rid = str(row["qid"]) if row["qid"] is not None else f"msmarco-{role}-{row['key']}"
        meta = {"well_formed": well_formed}
        if row["qtype"] is not None:
            meta["query_type"] = row["qtype"]
        writer.write(part, make_record(rid, query.strip(), answers, meta=meta))


def convert_msmarco(out: PathLike, train: PathLike, dev: Optional[PathLike] = None,
                    test: Optional[PathLike] = None, *, use_well_formed: bool = True,
                    well_formed_only: bool = False, valid_from_train="0.1", seed: int = 0,
                    overwrite: bool = False, progress: bool = True) -> dict:
    """MS-MARCO v2.1 -> KILT-style splits: input = query, answers = the well-formed answers
    where present (``use_well_formed``), else the plain answers; ``No Answer Present.`` is
    skipped and counted. ``well_formed_only`` keeps, in train and valid, only queries with a
    well-formed answer (the NLG subset); it never filters the test split."""
    if well_formed_only and not use_well_formed:
        raise UserError("--well-formed-only needs the well-formed answers",
                        fix="drop --no-use-well-formed or --well-formed-only")
    plan, carve_valid = plan_splits(train, dev, test)
    if carve_valid:
        parse_size(valid_from_train)
    layouts = [msmarco_layout(path) for path, _, _ in plan]
    with DatasetWriter(out, overwrite=overwrite) as writer:
        for (path, part, role), layout in zip(plan, layouts):
            writer.source(part, path)
            rows = iter_msmarco(path, writer.workdir, progress) if layout == "columns" else \
                with_progress(iter_msmarco_jsonl(path), f"msmarco {role}", progress)
            _write_rows(writer, part, role, path, rows, use_well_formed, well_formed_only)
        info = {"dataset": "msmarco", "formats": {part: layout for (_, part, _), layout in zip(plan, layouts)},
                "options": {"use_well_formed": use_well_formed, "well_formed_only": well_formed_only,
                            "valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed}}
        return finish_with_carving(writer, carve_valid, valid_from_train, seed, info)
