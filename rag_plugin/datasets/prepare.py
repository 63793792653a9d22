"""Converters from the official dataset files to the plugin's task directories (no fairseq import).

Every converter writes a directory with ``train.jsonl``, ``valid.jsonl`` and ``test.jsonl``
(KILT style, read by :func:`rag_plugin.data.kilt.read_kilt`) plus ``prepare.json`` (sources,
options, counts and skipped records). One record per line::

    {"id": str, "input": str,
     "output": [{"answer": str, "provenance": [...]}, {"answer": alias}, ...],
     "meta": {...}}

every gold alias is its own ``{"answer": ...}`` entry; the provenance of a record (if any)
rides on its first entry.

Output is all-or-nothing: the splits are written into a hidden temporary directory beside
``--out`` and renamed onto it only when every split is complete and non-empty, so a failed
run leaves nothing behind. Inputs are streamed (large JSON arrays and MS-MARCO's columnar
JSON included) and may be gzip-compressed (``.gz``). Bad input raises
:class:`~rag_plugin.util.errors.UserError` naming the file and line.

Converters (one per dataset, see ``docs/datasets.md`` for the commands):

* :func:`convert_open_qa` -- NQ, TriviaQA, WebQuestions, CuratedTrec from DPR's qas CSV
  files, DPR's retriever-training JSON, KILT JSONL or TriviaQA's own JSON.
* :func:`convert_msmarco` -- MS-MARCO v2.1 (NLG) columnar JSON.
* :func:`convert_jeopardy` -- Jeopardy question generation from SearchQA's per-question JSON
  files or the raw ``JEOPARDY_QUESTIONS1.json``.
* :func:`convert_fever` -- FEVER from KILT JSONL or the original FEVER JSONL.
* :func:`import_precomputed_vectors` -- a knowledge source from DPR's ``psgs_w100.tsv`` and
  DPR's precomputed passage embeddings (``.pkl`` shards behind ``--trust-pickles``, or ``.npy``
  + ids), through the knowledge builder's ``precomputed`` hook.

Split convention (the paper's, Lewis et al. 2020): with ``--train``, ``--dev`` and ``--test``
the splits map one to one (dev -> ``valid``). When the official release has no labelled test
set (only train/dev), the dev file becomes ``test`` and ``valid`` is carved out of train by a
seeded random sample (``--valid-from-train N`` records, or a fraction ``0 < f < 1``).
"""
from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import gzip
import html
import io
import json
import os
import pickle
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_write_json, decoded_lines, utf8_error

PathLike = Union[str, os.PathLike]

FORMAT = "rag_plugin.prepared/1"
SPLITS = ("train", "valid", "test")
PREPARE_INFO = "prepare.json"

#: The paper's split sizes (Lewis et al. 2020, Table 7), for reference in summaries and docs.
PAPER_SPLIT_SIZES = {
    "nq": (79169, 8758, 3611),
    "triviaqa": (78786, 8838, 11314),
    "webquestions": (3418, 362, 2033),
    "curatedtrec": (635, 134, 635),
    "msmarco": (153726, 12468, 101093),
    "jeopardy": (97392, 13714, 26849),
    "fever": (145450, 10000, 10000),
    "fever-2way": (96966, 6666, 6666),
}

QA_DATASETS = ("nq", "triviaqa", "webquestions", "curatedtrec")
REGEX_DATASETS = frozenset({"curatedtrec"})
QA_FORMATS = ("auto", "dpr-qas", "dpr-json", "kilt", "triviaqa")

MSMARCO_NO_ANSWER = "No Answer Present."
FEVER_LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
NEI = "NOT ENOUGH INFO"

TRIVIAQA_TOP_KEYS = frozenset({"Data", "Domain", "Version", "Split", "VerifiedEval"})
MSMARCO_COLUMNS = {"query": "query", "answers": "answers", "wellFormedAnswers": "wfa",
                   "query_id": "qid", "query_type": "qtype"}

_MAX_JSON_VALUE_CHARS = 512 << 20  # one element of a streamed JSON array/object


# =====================================================================================
# Reading: text files (optionally gzipped), JSONL, streamed JSON
# =====================================================================================
def _is_gz(path: PathLike) -> bool:
    return str(path).lower().endswith(".gz")


def _require_file(path: PathLike, what: str = "input file") -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} not found", path=str(p), fix="check the path")
    if not p.is_file():
        raise UserError(f"{what} is not a file", path=str(p), fix="pass a file")
    return p


def _open_binary(path: PathLike):
    p = _require_file(path)
    return gzip.open(p, "rb") if _is_gz(p) else open(p, "rb")


def _open_text(path: PathLike, newline: Optional[str] = None):
    p = _require_file(path)
    if _is_gz(p):
        return gzip.open(p, "rt", encoding="utf-8-sig", newline=newline)
    return open(p, "r", encoding="utf-8-sig", newline=newline)


def _base_name(path: PathLike) -> str:
    name = Path(path).name.lower()
    return name[:-3] if name.endswith(".gz") else name


def iter_jsonl(path: PathLike, fix: str = "each line must be one JSON object"
               ) -> Iterator[Tuple[int, dict]]:
    """Yield ``(line_number, object)`` for each non-empty line; errors name file and line."""
    with _open_binary(path) as fh:
        for lineno, line in decoded_lines(fh, path):
            if lineno == 1:
                line = line.lstrip("\ufeff")
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"invalid JSON ({err.msg}, column {err.colno})", path=str(path),
                                line=lineno, fix=fix) from None
            if not isinstance(obj, dict):
                raise UserError("line is not a JSON object", path=str(path), line=lineno, fix=fix)
            yield lineno, obj


_WS = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()


class JsonStream:
    """A pull parser for one big JSON document, holding one element at a time in memory.

    ``iter_array()`` yields ``(line, value)`` for the elements of an array; ``iter_object()``
    yields ``(line, key)`` and the caller then consumes the value (``value()``, or a nested
    ``iter_array()``/``iter_object()``). Elements are decoded with the C JSON scanner on a
    sliding buffer; errors name the file and line.
    """

    def __init__(self, path: PathLike, chunk_chars: int = 1 << 20):
        self.path = str(path)
        self._fh = _open_text(path)
        self.buf = ""
        self.pos = 0
        self.line = 1
        self.eof = False
        self.chunk = chunk_chars

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- buffer
    def _more(self, min_chars: int = 0) -> bool:
        if self.eof:
            return False
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        if len(self.buf) > _MAX_JSON_VALUE_CHARS:
            raise self.error(f"a single JSON value is larger than {_MAX_JSON_VALUE_CHARS >> 20} MiB",
                             fix="is this the right file?")
        try:
            data = self._fh.read(max(self.chunk, min_chars))
        except UnicodeDecodeError:
            raise utf8_error(self.path) from None
        except (OSError, EOFError) as err:  # truncated or corrupt .gz
            raise self.error(f"cannot read ({err})", fix="re-download the file") from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _advance(self, end: int) -> None:
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end

    def _skip_ws(self) -> None:
        while True:
            self._advance(_WS.match(self.buf, self.pos).end())
            if self.pos < len(self.buf) or not self._more():
                return

    def error(self, message: str, at: Optional[int] = None, fix: Optional[str] = None) -> UserError:
        line = self.line if at is None else self.line + self.buf.count("\n", self.pos, at)
        return UserError(message, path=self.path, line=line, fix=fix)

    # ---- tokens
    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file)."""
        self._skip_ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, char: str, what: str) -> None:
        got = self.peek()
        if got != char:
            raise self.error(f"expected {what}, found {got!r}" if got else f"expected {what}, "
                             "found the end of the file", fix="is this the right file?")
        self._advance(self.pos + 1)

    def value(self):
        """Decode the next complete JSON value."""
        self._skip_ws()
        if self.pos >= len(self.buf):
            raise self.error("unexpected end of file", fix="the file is truncated: re-download it")
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                truncated = err.msg.startswith("Unterminated string") or err.pos >= len(self.buf) - 16
                if self.eof or not truncated:
                    raise self.error(f"invalid JSON ({err.msg})", at=err.pos,
                                     fix="the file is damaged or not in the expected format") from None
            else:
                if end < len(self.buf) or self.eof:
                    self._advance(end)
                    return obj
            self._more(len(self.buf) - self.pos)  # grow geometrically: amortised linear

    def iter_array(self) -> Iterator[Tuple[int, object]]:
        self.expect("[", "a JSON array '['")
        if self.peek() == "]":
            self._advance(self.pos + 1)
            return
        while True:
            self._skip_ws()
            line = self.line
            yield line, self.value()
            nxt = self.peek()
            self._advance(self.pos + 1)
            if nxt == "]":
                return
            if nxt != ",":
                raise self.error(f"expected ',' or ']' after an array element, found {nxt!r}",
                                 fix="the file is damaged or truncated")

    def iter_object(self) -> Iterator[Tuple[int, str]]:
        self.expect("{", "a JSON object '{'")
        if self.peek() == "}":
            self._advance(self.pos + 1)
            return
        while True:
            if self.peek() != '"':
                raise self.error("expected a quoted object key", fix="the file is damaged")
            line = self.line
            key = self.value()
            self.expect(":", "':' after an object key")
            yield line, key  # the caller consumes the value here
            nxt = self.peek()
            self._advance(self.pos + 1)
            if nxt == "}":
                return
            if nxt != ",":
                raise self.error(f"expected ',' or '}}' after an object value, found {nxt!r}",
                                 fix="the file is damaged or truncated")

    def first_key(self) -> Optional[str]:
        """The first key of a top-level object (consumes the stream's start)."""
        self.expect("{", "a JSON object '{'")
        if self.peek() != '"':
            return None
        key = self.value()
        return key if isinstance(key, str) else None


def sniff_format(path: PathLike) -> str:
    """'csv' | 'json-list' | 'triviaqa' | 'msmarco' | 'jsonl' | 'dir' for an input path."""
    p = Path(path)
    if p.is_dir():
        return "dir"
    _require_file(p)
    name = _base_name(p)
    if name.endswith((".csv", ".tsv", ".txt")):
        return "csv"
    with JsonStream(p, chunk_chars=1 << 16) as js:
        first = js.peek()
        if first == "[":
            return "json-list"
        if first == "{":
            key = js.first_key()
            if key in TRIVIAQA_TOP_KEYS:
                return "triviaqa"
            if key in MSMARCO_COLUMNS or key == "passages":
                return "msmarco"
            return "jsonl"
    raise UserError("unrecognised file: neither a TSV/CSV (.csv/.tsv) nor JSON / JSONL",
                    path=str(p), fix="check the file, or pass --format")


# =====================================================================================
# Writing: the all-or-nothing dataset directory
# =====================================================================================
def _progress(iterable, desc: str, enabled: bool, total: Optional[int] = None):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=" rec", mininterval=1.0, file=sys.stderr)


def parse_size(spec: Union[str, int, float], what: str = "--valid-from-train") -> Union[int, float]:
    """``'5000'`` -> 5000 records, ``'0.1'`` -> a fraction; anything else is an error."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        value = spec
    else:
        text = str(spec).strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise UserError(f"{what} must be a number of records or a fraction, got {spec!r}",
                                fix=f"e.g. {what} 5000 or {what} 0.1") from None
    if isinstance(value, float) and not (0.0 < value < 1.0):
        raise UserError(f"{what} fraction must be between 0 and 1, got {value}",
                        fix=f"e.g. {what} 0.1, or a whole number of records")
    if isinstance(value, int) and value < 1:
        raise UserError(f"{what} must be at least 1, got {value}")
    return value


def _resolve_size(spec: Union[int, float], n: int) -> int:
    return int(spec) if isinstance(spec, int) else max(1, int(round(spec * n)))


def make_record(rid: str, question: str, answers: Sequence[str], provenance: Sequence[dict] = (),
                meta: Optional[dict] = None) -> dict:
    """A KILT-style record: one ``{"answer"}`` entry per alias, provenance on the first."""
    output = [{"answer": a} for a in answers]
    if provenance:
        output[0]["provenance"] = list(provenance)
    record = {"id": rid, "input": question, "output": output}
    if meta:
        record["meta"] = meta
    return record


def clean_answers(answers: Iterable, drop: Iterable[str] = ()) -> List[str]:
    """Strip, drop empties (and ``drop``), de-duplicate keeping order."""
    dropped = set(drop)
    out: List[str] = []
    seen = set()
    for a in answers:
        if not isinstance(a, str):
            continue
        a = a.strip()
        if not a or a in dropped or a in seen:
            continue
        seen.add(a)
        out.append(a)
    return out


class DatasetWriter:
    """Writes the splits of one dataset into a temporary directory, renamed onto ``out`` last.

    Use as a context manager; any exception removes the temporary directory and leaves
    ``out`` untouched. ``write(part, record)`` appends to ``<part>.jsonl``; ``carve`` moves a
    seeded random sample of one part into others; ``finish`` checks that train/valid/test
    are non-empty, writes ``prepare.json`` and renames the directory into place.
    """

    def __init__(self, out: PathLike, overwrite: bool = False):
        self.out = Path(out)
        _check_output(self.out, overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)
        self.overwrite = overwrite
        self.counts: Counter = Counter()
        self.skipped: Dict[str, Counter] = {}
        self.sources: Dict[str, List[str]] = {}
        self.notes: List[str] = []
        self._files: Dict[str, io.TextIOBase] = {}
        self._ids: Dict[str, set] = {}
        self._done = False

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()

    @property
    def workdir(self) -> Path:
        """Scratch space inside the temporary directory (removed before the rename)."""
        d = self.tmp / ".work"
        d.mkdir(exist_ok=True)
        return d

    def source(self, part: str, path: PathLike) -> None:
        self.sources.setdefault(part, []).append(str(Path(path).resolve()))

    def write(self, part: str, record: dict) -> None:
        ids = self._ids.setdefault(part, set())
        rid = str(record["id"])
        if rid in ids:
            n = 2
            while f"{rid}#{n}" in ids:
                n += 1
            rid = f"{rid}#{n}"
            self.skip(part, "duplicate id (renamed with #N)")
        record["id"] = rid
        ids.add(rid)
        fh = self._files.get(part)
        if fh is None:
            fh = self._files[part] = open(self.tmp / f"{part}.jsonl", "w", encoding="utf-8", newline="\n")
        try:
            text = json.dumps(record, ensure_ascii=False)
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (valid JSON escape, not UTF-8): keep it escaped
            text = json.dumps(record, ensure_ascii=True)
        fh.write(text + "\n")
        self.counts[part] += 1

    def skip(self, part: str, reason: str, n: int = 1) -> None:
        self.skipped.setdefault(part, Counter())[reason] += n

    def _close(self, part: str) -> None:
        fh = self._files.pop(part, None)
        if fh is not None:
            fh.close()

    def carve(self, source: str, targets: Sequence[Tuple[str, Union[int, float]]], seed: int,
              rest: str, what: str = "--valid-from-train") -> None:
        """Move a seeded random sample of ``source`` into ``targets``; the remainder -> ``rest``."""
        self._close(source)
        n = self.counts.get(source, 0)
        sizes = [(name, _resolve_size(spec, n)) for name, spec in targets]
        total = sum(k for _, k in sizes)
        if total >= n:
            raise UserError(f"cannot take {total} records out of the {n} of {source!r}",
                            fix=f"lower {what}")
        chosen = random.Random(seed).sample(range(n), total)
        assign = bytearray(n)  # 0 -> rest, i -> targets[i - 1]
        at = 0
        for i, (_, k) in enumerate(sizes, 1):
            for idx in chosen[at:at + k]:
                assign[idx] = i
            at += k
        names = [rest] + [name for name, _ in sizes]
        for name in names:
            if name != rest and name in self.counts:
                raise RuntimeError(f"split {name!r} already written")
        outs = {i: open(self.tmp / (f".{rest}.carving" if i == 0 else f"{name}.jsonl"), "w",
                        encoding="utf-8", newline="\n") for i, name in enumerate(names)}
        counts = Counter()
        try:
            with open(self.tmp / f"{source}.jsonl", "r", encoding="utf-8", newline="\n") as fh:
                for idx, line in enumerate(fh):
                    outs[assign[idx]].write(line)
                    counts[assign[idx]] += 1
        finally:
            for fh in outs.values():
                fh.close()
        (self.tmp / f"{source}.jsonl").unlink()
        os.replace(self.tmp / f".{rest}.carving", self.tmp / f"{rest}.jsonl")
        del self.counts[source]
        for i, name in enumerate(names):
            self.counts[name] = counts[i]
        src = self.sources.pop(source, []) if source != rest else list(self.sources.get(source, []))
        if source != rest:
            self.sources.setdefault(rest, []).extend(src)
        for name, _ in sizes:
            self.sources.setdefault(name, []).extend(src)
        self.notes.append(f"{', '.join(f'{name} ({k})' for name, k in sizes)} carved from {source} "
                          f"with seed {seed}")

    def finish(self, info: dict) -> dict:
        for part in list(self._files):
            self._close(part)
        for split in SPLITS:
            if self.counts.get(split, 0) == 0:
                reasons = ", ".join(f"{k}: {v}" for k, v in (self.skipped.get(split) or {}).items())
                raise UserError(f"split {split!r} would be empty"
                                + (f" (skipped {reasons})" if reasons else ""),
                                path=", ".join(self.sources.get(split, [])) or None,
                                fix="check that file (a test file without answers cannot be a "
                                    "test split: pass the dev file as --dev instead)")
        extra = sorted(set(self.counts) - set(SPLITS))
        if extra:
            raise RuntimeError(f"unplaced parts {extra}")
        shutil.rmtree(self.tmp / ".work", ignore_errors=True)
        summary = {
            "format": FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **info,
            "counts": {s: self.counts[s] for s in SPLITS},
            "skipped": {p: dict(c) for p, c in self.skipped.items() if c},
            "sources": self.sources,
            "notes": self.notes,
        }
        atomic_write_json(self.tmp / PREPARE_INFO, summary)
        if self.out.exists():
            if any(self.out.iterdir()):
                old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
                os.replace(self.out, old)
                os.replace(self.tmp, self.out)
                shutil.rmtree(old, ignore_errors=True)
            else:
                self.out.rmdir()
                os.replace(self.tmp, self.out)
        else:
            os.replace(self.tmp, self.out)
        self._done = True
        return summary

    def abort(self) -> None:
        for part in list(self._files):
            try:
                self._close(part)
            except OSError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError("output path exists and is not a directory", path=str(out), fix="choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not (out / PREPARE_INFO).is_file():
            raise UserError("output directory is not empty and is not a prepared dataset", path=str(out),
                            fix="choose a new or empty --out directory")
        if not overwrite:
            raise UserError("output directory already holds a prepared dataset", path=str(out),
                            fix="choose another --out, or pass --overwrite to replace it")


def plan_splits(train: Optional[PathLike], dev: Optional[PathLike], test: Optional[PathLike]
                ) -> Tuple[List[Tuple[PathLike, str, str]], bool]:
    """``[(path, part, role)]`` and whether ``valid`` must be carved from train.

    role is the file's official name (train/dev/test), used in record ids.
    """
    if not train:
        raise UserError("no training file given", fix="pass --train FILE")
    if not dev and not test:
        raise UserError("no evaluation file given",
                        fix="pass --dev FILE (it becomes the test split; valid is carved from train) "
                            "and/or --test FILE")
    plan: List[Tuple[PathLike, str, str]] = [(train, "train", "train")]
    if dev and test:
        plan += [(dev, "valid", "dev"), (test, "test", "test")]
        return plan, False
    if dev:
        plan.append((dev, "test", "dev"))
    else:
        plan.append((test, "test", "test"))
    return plan, True


def _finish_with_carving(writer: DatasetWriter, carve_valid: bool, valid_from_train, seed: int,
                         info: dict) -> dict:
    if carve_valid:
        writer.carve("train", [("valid", parse_size(valid_from_train))], seed=seed, rest="train")
    return writer.finish(info)


# =====================================================================================
# Open-domain QA: NQ, TriviaQA, WebQuestions, CuratedTrec
# =====================================================================================
def parse_answer_list(text: str, path: PathLike, line: int) -> List[str]:
    """DPR's answers column: a Python (or JSON) list literal of strings."""
    s = text.strip()
    try:
        value = ast.literal_eval(s)  # literals only: no code runs
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        try:
            value = json.loads(s)
        except json.JSONDecodeError:
            raise UserError(f"answers column is not a list literal: {s[:60]!r}", path=str(path), line=line,
                            fix="each line must be question<TAB>['answer1', 'answer2'] (DPR qas format)") from None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise UserError("answers column must be a list of strings", path=str(path), line=line,
                        fix="each line must be question<TAB>['answer1', 'answer2'] (DPR qas format)")
    return list(value)


def iter_dpr_qas(path: PathLike) -> Iterator[Tuple[int, str, List[str], List[str]]]:
    """DPR's qas files: ``question<TAB>answers-list`` per line, no header, read like DPR does
    (``csv.reader(delimiter='\\t')``). Yields ``(line, question, answers, extra_columns)``."""
    csv.field_size_limit(min(sys.maxsize, 2 ** 31 - 1))
    with _open_text(path, newline="") as fh:
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
            line, prev = prev + 1, reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            if line == 1 and row[0].strip().lower() == "question" and len(row) > 1 \
                    and row[1].strip().lower().startswith("answer"):
                continue  # a header (DPR's files have none)
            if len(row) < 2:
                raise UserError(f"expected 2 tab-separated columns (question, answers), found {len(row)}",
                                path=str(path), line=line,
                                fix="each line must be question<TAB>['answer1', 'answer2'] (DPR qas format)")
            yield line, row[0].strip(), parse_answer_list(row[1], path, line), row[2:]


def _norm_passage_id(pid) -> str:
    s = str(pid).strip()
    return s[5:] if s.startswith("wiki:") else s


def iter_dpr_json(path: PathLike) -> Iterator[Tuple[int, str, List[str], List[dict]]]:
    """DPR's retriever-training JSON: ``[{question, answers, positive_ctxs: [{title, text,
    passage_id|psg_id, ...}], negative_ctxs, hard_negative_ctxs}, ...]`` (streamed).
    Yields ``(line, question, answers, provenance)``; positive contexts become provenance."""
    fix = 'expected DPR retriever JSON: [{"question": ..., "answers": [...], "positive_ctxs": [...]}, ...]'
    with JsonStream(path) as js:
        if js.peek() != "[":
            raise js.error("not a JSON array", fix=fix)
        for line, obj in js.iter_array():
            if not isinstance(obj, dict) or "question" not in obj or "answers" not in obj:
                raise UserError("element lacks 'question' or 'answers'", path=str(path), line=line, fix=fix)
            answers = obj["answers"]
            if isinstance(answers, str):
                answers = [answers]
            if not isinstance(answers, list) or not isinstance(obj["question"], str):
                raise UserError("'question' must be a string and 'answers' a list", path=str(path),
                                line=line, fix=fix)
            provenance, seen = [], set()
            for ctx in obj.get("positive_ctxs") or []:
                if not isinstance(ctx, dict):
                    continue
                pid = next((ctx[k] for k in ("passage_id", "psg_id", "id") if ctx.get(k) is not None), None)
                prov = {"title": ctx.get("title") or ""}
                if pid is not None:
                    prov = {"id": _norm_passage_id(pid), **prov}
                key = prov.get("id") or ("title", prov["title"])
                if key in seen:
                    continue
                seen.add(key)
                provenance.append(prov)
            yield line, obj["question"].strip(), answers, provenance


def iter_triviaqa(path: PathLike) -> Iterator[Tuple[int, dict]]:
    """TriviaQA's JSON (``{"Data": [{"QuestionId", "Question", "Answer": {...}}, ...], ...}``),
    streamed; yields ``(line, element)``."""
    fix = 'expected TriviaQA JSON: {"Data": [{"QuestionId": ..., "Question": ..., "Answer": {...}}, ...]}'
    with JsonStream(path) as js:
        if js.peek() != "{":
            raise js.error("not a JSON object", fix=fix)
        found = False
        for _, key in js.iter_object():
            if key != "Data":
                js.value()
                continue
            found = True
            if js.peek() != "[":
                raise js.error("'Data' is not a list", fix=fix)
            for line, q in js.iter_array():
                if not isinstance(q, dict) or "QuestionId" not in q:
                    raise UserError("element lacks 'QuestionId'", path=str(path), line=line, fix=fix)
                yield line, q
        if not found:
            raise UserError("no 'Data' list", path=str(path), fix=fix)


def triviaqa_answers(q: dict) -> List[str]:
    """``Answer.Value`` then ``Answer.Aliases`` (NormalizedAliases are lower-cased duplicates)."""
    ans = q.get("Answer") or {}
    if not isinstance(ans, dict):
        return []
    return clean_answers([ans.get("Value")] + list(ans.get("Aliases") or []))


def load_triviaqa_lookup(files: Sequence[PathLike], wanted: set, progress: bool = False
                         ) -> Dict[str, Tuple[str, List[str]]]:
    """QuestionId -> (question, answers) for the ``wanted`` ids, streaming TriviaQA files."""
    found: Dict[str, Tuple[str, List[str]]] = {}
    for f in files:
        for _, q in _progress(iter_triviaqa(f), f"read {Path(f).name}", progress):
            qid = str(q["QuestionId"])
            if qid in wanted and qid not in found:
                found[qid] = ((q.get("Question") or "").strip(), triviaqa_answers(q))
    return found


def _kilt_fields(obj: dict, path: PathLike, line: int) -> Tuple[str, str, List[str], List[dict]]:
    fix = 'expected KILT JSONL: {"id": ..., "input": ..., "output": [{"answer": ..., "provenance": [...]}]}'
    if "id" not in obj:
        raise UserError("record lacks 'id'", path=str(path), line=line, fix=fix)
    question = obj.get("input")
    if question is not None and not isinstance(question, str):
        raise UserError("'input' must be a string", path=str(path), line=line, fix=fix)
    outputs = obj.get("output") or []
    if not isinstance(outputs, list):
        raise UserError("'output' must be a list", path=str(path), line=line, fix=fix)
    answers, provenance, seen = [], [], set()
    for out in outputs:
        if not isinstance(out, dict):
            raise UserError("'output' must be a list of objects", path=str(path), line=line, fix=fix)
        if isinstance(out.get("answer"), str):
            answers.append(out["answer"])
        for prov in out.get("provenance") or []:
            if isinstance(prov, dict):
                key = json.dumps(prov, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    provenance.append(prov)
    return str(obj["id"]), (question or "").strip(), answers, provenance


def _qa_format(path: PathLike, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    kind = sniff_format(path)
    mapping = {"csv": "dpr-qas", "json-list": "dpr-json", "jsonl": "kilt", "triviaqa": "triviaqa"}
    if kind not in mapping:
        raise UserError(f"this looks like a {kind} file, not an open-domain QA file", path=str(path),
                        fix="pass DPR qas .csv, DPR retriever .json, KILT .jsonl or TriviaQA .json (or --format)")
    return mapping[kind]


def convert_open_qa(dataset: str, out: PathLike, train: PathLike, dev: Optional[PathLike] = None,
                    test: Optional[PathLike] = None, *, fmt: str = "auto",
                    triviaqa_questions: Sequence[PathLike] = (), valid_from_train="0.1", seed: int = 0,
                    keep_provenance: bool = True, overwrite: bool = False, progress: bool = True) -> dict:
    """NQ / TriviaQA / WebQuestions / CuratedTrec -> ``out/{train,valid,test}.jsonl``.

    Each input file may be in any supported format (detected per file unless ``fmt``):
    DPR qas CSV, DPR retriever JSON, KILT JSONL or TriviaQA JSON. CuratedTrec answers are
    regular expressions: kept verbatim, with ``meta.answer_is_regex = true``. KILT TriviaQA
    records without a question are filled from ``triviaqa_questions`` by id.
    """
    if dataset not in QA_DATASETS:
        raise UserError(f"unknown dataset {dataset!r}", fix=f"use one of {', '.join(QA_DATASETS)}")
    if fmt not in QA_FORMATS:
        raise UserError(f"unknown format {fmt!r}", fix=f"use one of {', '.join(QA_FORMATS)}")
    plan, carve_valid = plan_splits(train, dev, test)
    if carve_valid:
        parse_size(valid_from_train)
    formats = [(path, part, role, _qa_format(path, fmt)) for path, part, role in plan]
    for f in triviaqa_questions:
        _require_file(f, "TriviaQA questions file")

    # KILT TriviaQA ships without questions: collect the ids to fill in, then look them up.
    lookup: Dict[str, Tuple[str, List[str]]] = {}
    kilt_files = [(path, part) for path, part, _, f in formats if f == "kilt"]
    if kilt_files and dataset == "triviaqa":
        wanted: Dict[str, Tuple[PathLike, int]] = {}
        for path, _ in kilt_files:
            for line, obj in iter_jsonl(path):
                rid, question, answers, _ = _kilt_fields(obj, path, line)
                if not question or not clean_answers(answers):
                    wanted.setdefault(rid, (path, line))
        need_question = {}
        if wanted:
            if triviaqa_questions:
                lookup = load_triviaqa_lookup(triviaqa_questions, set(wanted), progress)
            for path, _ in kilt_files:
                for line, obj in iter_jsonl(path):
                    rid, question, _, _ = _kilt_fields(obj, path, line)
                    if not question and not (lookup.get(rid) or ("",))[0]:
                        need_question.setdefault(rid, (path, line))
        if need_question:
            (path0, line0) = next(iter(need_question.values()))
            examples = ", ".join(list(need_question)[:5])
            if not triviaqa_questions:
                raise UserError(f"{len(need_question)} records have no question ('input'), e.g. ids {examples}",
                                path=str(path0), line=line0,
                                fix="KILT ships TriviaQA without questions: pass --triviaqa-questions "
                                    "unfiltered-web-train.json unfiltered-web-dev.json (TriviaQA) to fill "
                                    "them in by QuestionId")
            raise UserError(f"{len(need_question)} records have no question and their ids are not in "
                            f"--triviaqa-questions, e.g. ids {examples}", path=str(path0), line=line0,
                            fix="pass the TriviaQA file(s) holding these QuestionIds (unfiltered-web-train.json "
                                "for KILT train, unfiltered-web-dev.json for KILT dev)")

    is_regex = dataset in REGEX_DATASETS
    regex_errors = Counter()
    with DatasetWriter(out, overwrite=overwrite) as writer:
        for path, part, role, f in formats:
            writer.source(part, path)
            if f == "dpr-qas":
                rows = ((line, f"{dataset}-{role}-{i}", q, a, [], {"extra_columns": extra} if extra else None)
                        for i, (line, q, a, extra) in enumerate(iter_dpr_qas(path)))
            elif f == "dpr-json":
                rows = ((line, f"{dataset}-{role}-{i}", q, a, p, None)
                        for i, (line, q, a, p) in enumerate(iter_dpr_json(path)))
            elif f == "triviaqa":
                rows = ((line, str(q["QuestionId"]), (q.get("Question") or "").strip(), triviaqa_answers(q), [],
                         None) for line, q in iter_triviaqa(path))
            else:  # kilt
                rows = _kilt_rows(path, lookup)
            for line, rid, question, answers, provenance, meta in _progress(rows, f"{dataset} {role}", progress):
                if not question:
                    raise UserError("empty question", path=str(path), line=line,
                                    fix="remove that record or give it a question")
                answers = clean_answers(answers)
                if not answers:
                    writer.skip(part, "no answer")
                    continue
                meta = dict(meta or {})
                if is_regex:
                    meta["answer_is_regex"] = True
                    for a in answers:
                        try:
                            re.compile(a)
                        except re.error:
                            regex_errors[part] += 1
                writer.write(part, make_record(rid, question, answers,
                                               provenance if keep_provenance else (), meta))
        for part, n in regex_errors.items():
            writer.notes.append(f"{part}: {n} answer patterns do not compile as Python regexes (kept verbatim)")
        info = {"dataset": dataset, "formats": {part: f for _, part, _, f in formats},
                "options": {"valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed,
                            "keep_provenance": keep_provenance,
                            "triviaqa_questions": [str(Path(p).resolve()) for p in triviaqa_questions]}}
        return _finish_with_carving(writer, carve_valid, valid_from_train, seed, info)


def _kilt_rows(path: PathLike, lookup: Dict[str, Tuple[str, List[str]]]):
    for line, obj in iter_jsonl(path):
        rid, question, answers, provenance = _kilt_fields(obj, path, line)
        filled = lookup.get(rid)
        meta = {}
        if filled is not None:
            if not question and filled[0]:
                question, meta["input_from"] = filled[0], "triviaqa"
            if not clean_answers(answers) and filled[1]:
                answers, meta["answers_from"] = filled[1], "triviaqa"
        yield line, rid, question, answers, provenance, meta or None


# =====================================================================================
# MS-MARCO (v2.1, NLG)
# =====================================================================================
def _index_key(key: str, js: JsonStream, line: int) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise UserError(f"row key {key!r} is not a number", path=js.path, line=line,
                        fix="expected MS-MARCO v2.1 columnar JSON ({'query': {'0': ...}, ...})") from None


def iter_msmarco(path: PathLike, workdir: PathLike, progress: bool = False) -> Iterator[dict]:
    """Rows of MS-MARCO v2.1's columnar JSON (``{"query": {"0": ...}, "answers": {"0": [...]},
    "wellFormedAnswers": {"0": [...] | "[]"}, "passages": {...}, "query_id", "query_type"}``).

    The columns are spilled into an on-disk SQLite table (bounded memory) and joined by row
    key; ``passages`` are parsed and discarded (the paper uses questions and answers only).
    Yields ``{"key", "query", "answers", "wfa", "qid", "qtype"}`` in key order.
    """
    fix = "expected MS-MARCO v2.1 JSON (train_v2.1.json / dev_v2.1.json)"
    db_path = Path(workdir) / f"msmarco-{os.getpid()}-{abs(hash(str(path)))}.sqlite"
    con = sqlite3.connect(str(db_path))
    try:
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("PRAGMA synchronous=OFF")
        con.execute("CREATE TABLE r (k INTEGER PRIMARY KEY, query TEXT, answers TEXT, wfa TEXT, qid TEXT, qtype TEXT)")
        seen_cols = set()
        with JsonStream(path) as js:
            if js.peek() != "{":
                raise js.error("not a JSON object", fix=fix)
            for line, col in js.iter_object():
                target = MSMARCO_COLUMNS.get(col)
                if target is None:  # passages and anything unknown: parse, discard
                    if js.peek() == "{":
                        for _, _k in _progress(js.iter_object(), f"skip {col}", progress):
                            js.value()
                    else:
                        js.value()
                    continue
                if js.peek() != "{":
                    raise js.error(f"column {col!r} is not an object keyed by row", fix=fix)
                seen_cols.add(target)
                sql = (f"INSERT INTO r (k, {target}) VALUES (?, ?) "
                       f"ON CONFLICT(k) DO UPDATE SET {target} = excluded.{target}")
                batch = []
                for kline, key in _progress(js.iter_object(), f"read {col}", progress):
                    batch.append((_index_key(key, js, kline), json.dumps(js.value(), ensure_ascii=False)))
                    if len(batch) >= 20000:
                        con.executemany(sql, batch)
                        batch.clear()
                if batch:
                    con.executemany(sql, batch)
        if "query" not in seen_cols:
            raise UserError("no 'query' column", path=str(path), fix=fix)
        if "answers" not in seen_cols and "wfa" not in seen_cols:
            raise UserError("no 'answers' column (the eval file ships without answers)", path=str(path),
                            fix="use train_v2.1.json and dev_v2.1.json; dev becomes the test split")
        con.commit()
        for k, query, answers, wfa, qid, qtype in con.execute(
                "SELECT k, query, answers, wfa, qid, qtype FROM r ORDER BY k"):
            yield {"key": k, "query": None if query is None else json.loads(query),
                   "answers": None if answers is None else json.loads(answers),
                   "wfa": None if wfa is None else json.loads(wfa),
                   "qid": None if qid is None else json.loads(qid),
                   "qtype": None if qtype is None else json.loads(qtype)}
    finally:
        con.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(str(db_path) + suffix)
            except FileNotFoundError:
                pass


def _as_answer_list(value) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [] if value.strip() in ("", "[]") else [value]
    if isinstance(value, list):
        return [a for a in value if isinstance(a, str)]
    return []


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
    for path, _, _ in plan:
        kind = sniff_format(path)
        if kind != "msmarco":
            raise UserError("not an MS-MARCO v2.1 JSON file", path=str(path),
                            fix="pass train_v2.1.json / dev_v2.1.json (optionally .gz)")
    with DatasetWriter(out, overwrite=overwrite) as writer:
        for path, part, role in plan:
            writer.source(part, path)
            for row in iter_msmarco(path, writer.workdir, progress):
                query = row["query"]
                if not isinstance(query, str) or not query.strip():
                    raise UserError(f"row {row['key']} has no query", path=str(path),
                                    fix="is this an MS-MARCO v2.1 file?")
                wfa = clean_answers(_as_answer_list(row["wfa"]), drop=[MSMARCO_NO_ANSWER])
                if well_formed_only and part != "test" and not wfa:
                    writer.skip(part, "no well-formed answer")
                    continue
                if use_well_formed and wfa:
                    answers, well_formed = wfa, True
                else:
                    answers, well_formed = clean_answers(_as_answer_list(row["answers"])), False
                    if MSMARCO_NO_ANSWER in answers:
                        answers = [a for a in answers if a != MSMARCO_NO_ANSWER]
                        if not answers:
                            writer.skip(part, MSMARCO_NO_ANSWER)
                            continue
                if not answers:
                    writer.skip(part, "no answer")
                    continue
                rid = str(row["qid"]) if row["qid"] is not None else f"msmarco-{role}-{row['key']}"
                meta = {"well_formed": well_formed}
                if row["qtype"] is not None:
                    meta["query_type"] = row["qtype"]
                writer.write(part, make_record(rid, query.strip(), answers, meta=meta))
        info = {"dataset": "msmarco",
                "options": {"use_well_formed": use_well_formed, "well_formed_only": well_formed_only,
                            "valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed}}
        return _finish_with_carving(writer, carve_valid, valid_from_train, seed, info)


# =====================================================================================
# Jeopardy question generation
# =====================================================================================
_BREAK_TAG = re.compile(r"<\s*(br|p|/p|div|/div|li)\b[^>]*>", re.IGNORECASE)
_TAG = re.compile(r"<[^>]*>")


def clean_jeopardy_text(text) -> str:
    """Strip the surrounding quotes of the scraped data, HTML tags and entities, backslash
    escapes of quotes, and collapse whitespace."""
    if text is None:
        return ""
    s = str(text).strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        s = s[1:-1]
    s = _TAG.sub("", _BREAK_TAG.sub(" ", s))  # inline tags (<a>, <i>) vanish; line breaks become spaces
    s = html.unescape(s)
    s = s.replace("\\'", "'").replace('\\"', '"')
    s = " ".join(s.split())
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"" and s.count(s[0]) == 2:
        s = s[1:-1].strip()
    return s


def _lower_keys(obj: dict) -> dict:
    return {str(k).lower(): v for k, v in obj.items()}


def iter_jeopardy(path: PathLike) -> Iterator[Tuple[str, int, str, dict]]:
    """Yield ``(file, line, id, item)`` from a SearchQA directory (one JSON object per file,
    recursively, sorted), the raw ``JEOPARDY_QUESTIONS1.json`` list (streamed) or JSONL."""
    fix = ('expected Jeopardy items {"category", "air_date", "question", "value", "answer", "round", '
           '"show_number"} (SearchQA per-question JSON files or JEOPARDY_QUESTIONS1.json)')
    kind = sniff_format(path)
    if kind == "dir":
        files = sorted(str(p) for p in Path(path).rglob("*.json") if p.is_file())
        if not files:
            raise UserError("no .json files in this directory", path=str(path),
                            fix="point at SearchQA's per-question JSON folder (e.g. train/)")
        for f in files:
            with _open_binary(f) as fh:
                raw = fh.read()
            try:
                obj = json.loads(raw.decode("utf-8-sig"))
            except UnicodeDecodeError:
                raise UserError("not valid UTF-8", path=f, fix="re-encode the file as UTF-8") from None
            except json.JSONDecodeError as err:
                raise UserError(f"invalid JSON ({err.msg})", path=f, line=err.lineno, fix=fix) from None
            if not isinstance(obj, dict):
                raise UserError("not a JSON object", path=f, line=1, fix=fix)
            yield f, 1, Path(f).stem, obj
    elif kind == "json-list":
        with JsonStream(path) as js:
            for i, (line, obj) in enumerate(js.iter_array()):
                if not isinstance(obj, dict):
                    raise UserError("array element is not an object", path=str(path), line=line, fix=fix)
                yield str(path), line, f"jeopardy-{i}", obj
    elif kind == "jsonl":
        for line, obj in iter_jsonl(path, fix=fix):
            yield str(path), line, str(obj.get("id", f"jeopardy-{line}")), obj
    else:
        raise UserError(f"this looks like a {kind} file, not Jeopardy data", path=str(path), fix=fix)


def _jeopardy_rows(writer: DatasetWriter, path: PathLike, part: str, progress: bool) -> None:
    writer.source(part, path)
    for f, line, rid, obj in _progress(iter_jeopardy(path), f"jeopardy {Path(path).name}", progress):
        item = _lower_keys(obj)
        if "question" not in item or "answer" not in item:
            raise UserError("item lacks 'question' (the clue) or 'answer'", path=f, line=line,
                            fix="expected Jeopardy items with 'question' and 'answer'")
        clue = clean_jeopardy_text(item["question"])
        answer = clean_jeopardy_text(item["answer"])
        if not clue or not answer:
            writer.skip(part, "empty clue or answer after cleaning")
            continue
        meta = {k: item[k] for k in ("category", "round", "value", "air_date", "show_number")
                if item.get(k) is not None}
        if "category" in meta:
            meta["category"] = clean_jeopardy_text(meta["category"])
        # the paper's task: generate the clue (a "Jeopardy question") from the answer entity
        writer.write(part, make_record(rid, answer, [clue], meta=meta))


def convert_jeopardy(out: PathLike, *, input: Optional[PathLike] = None, train: Optional[PathLike] = None,
                     dev: Optional[PathLike] = None, test: Optional[PathLike] = None, valid_size="0.1",
                     test_size="0.2", valid_from_train="0.1", seed: int = 0, overwrite: bool = False,
                     progress: bool = True) -> dict:
    """Jeopardy question generation: input = the answer entity, output = the clue.

    Either one unsplit ``input`` (split by ``seed`` into ``valid_size``/``test_size`` and the
    rest train) or ``train``/``dev``/``test`` (e.g. SearchQA's split folders).
    """
    if input is not None and (train or dev or test):
        raise UserError("give either --input (to split by seed) or --train/--dev/--test, not both")
    with DatasetWriter(out, overwrite=overwrite) as writer:
        if input is not None:
            vs, ts = parse_size(valid_size, "--valid-size"), parse_size(test_size, "--test-size")
            _jeopardy_rows(writer, input, "all", progress)
            writer.carve("all", [("valid", vs), ("test", ts)], seed=seed, rest="train",
                         what="--valid-size/--test-size")
            info = {"dataset": "jeopardy",
                    "options": {"valid_size": str(valid_size), "test_size": str(test_size), "seed": seed}}
            return writer.finish(info)
        plan, carve_valid = plan_splits(train, dev, test)
        if carve_valid:
            parse_size(valid_from_train)
        for path, part, _ in plan:
            _jeopardy_rows(writer, path, part, progress)
        info = {"dataset": "jeopardy",
                "options": {"valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed}}
        return _finish_with_carving(writer, carve_valid, valid_from_train, seed, info)


# =====================================================================================
# FEVER
# =====================================================================================
_FEVER_TITLE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
                "-COLON-": ":"}


def fever_title(page: str) -> str:
    """FEVER's wiki page id -> a Wikipedia title (``Nikolaj_Coster-Waldau`` -> ``Nikolaj Coster-Waldau``)."""
    s = str(page)
    for k, v in _FEVER_TITLE.items():
        s = s.replace(k, v)
    return s.replace("_", " ")


def _fever_label(label, path: PathLike, line: int) -> str:
    norm = " ".join(str(label).upper().replace("_", " ").split())
    if norm not in FEVER_LABELS:
        raise UserError(f"unknown FEVER label {label!r}", path=str(path), line=line,
                        fix=f"labels must be one of {', '.join(FEVER_LABELS)}")
    return norm


def _fever_rows(path: PathLike):
    """Yield ``(line, id, claim, label|None, provenance, meta)`` from original or KILT FEVER."""
    style = None
    for line, obj in iter_jsonl(path):
        this = "fever" if "claim" in obj else ("kilt" if "input" in obj else None)
        if this is None:
            raise UserError("record has neither 'claim' (FEVER) nor 'input' (KILT)", path=str(path), line=line,
                            fix='expected {"id", "claim", "label", "evidence"} or {"id", "input", "output"}')
        if style is None:
            style = this
        elif this != style:
            raise UserError(f"record is in {this} format, earlier ones in {style} format", path=str(path),
                            line=line, fix="do not mix original FEVER and KILT FEVER records in one file")
        if "id" not in obj:
            raise UserError("record lacks 'id'", path=str(path), line=line, fix="give every record an id")
        if style == "fever":
            claim = obj.get("claim")
            if not isinstance(claim, str):
                raise UserError("'claim' must be a string", path=str(path), line=line, fix="fix that record")
            label = obj.get("label")
            label = None if label is None else _fever_label(label, path, line)
            provenance, seen = [], set()
            for ev_set in obj.get("evidence") or []:
                for ev in ev_set or []:
                    if not isinstance(ev, (list, tuple)) or len(ev) < 4 or ev[2] is None:
                        continue
                    key = (ev[2], ev[3])
                    if key in seen:
                        continue
                    seen.add(key)
                    provenance.append({"title": fever_title(ev[2]), "wikipedia_title": ev[2], "sentence_id": ev[3]})
            meta = {"verifiable": obj["verifiable"]} if "verifiable" in obj else None
            yield line, str(obj["id"]), claim.strip(), label, provenance, meta
        else:
            rid, claim, answers, provenance = _kilt_fields(obj, path, line)
            labels = [_fever_label(a, path, line) for a in clean_answers(answers)]
            if len(set(labels)) > 1:
                raise UserError(f"record has conflicting labels {sorted(set(labels))}", path=str(path),
                                line=line, fix="fix that record")
            yield line, rid, claim, (labels[0] if labels else None), provenance, None


def convert_fever(out: PathLike, train: PathLike, dev: Optional[PathLike] = None, test: Optional[PathLike] = None,
                  *, two_way: bool = False, keep_provenance: bool = True, valid_from_train="0.1", seed: int = 0,
                  overwrite: bool = False, progress: bool = True) -> dict:
    """FEVER (KILT or original JSONL) -> input = claim, output = the label string
    (SUPPORTS / REFUTES / NOT ENOUGH INFO). ``two_way`` drops NOT ENOUGH INFO."""
    plan, carve_valid = plan_splits(train, dev, test)
    if carve_valid:
        parse_size(valid_from_train)
    with DatasetWriter(out, overwrite=overwrite) as writer:
        for path, part, role in plan:
            writer.source(part, path)
            for line, rid, claim, label, provenance, meta in _progress(_fever_rows(path), f"fever {role}", progress):
                if not claim:
                    raise UserError("empty claim", path=str(path), line=line, fix="remove that record")
                if label is None:
                    writer.skip(part, "no label")
                    continue
                if two_way and label == NEI:
                    writer.skip(part, "NOT ENOUGH INFO (--two-way)")
                    continue
                writer.write(part, make_record(rid, claim, [label], provenance if keep_provenance else (), meta))
        info = {"dataset": "fever-2way" if two_way else "fever",
                "options": {"two_way": two_way, "keep_provenance": keep_provenance,
                            "valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed}}
        return _finish_with_carving(writer, carve_valid, valid_from_train, seed, info)


# =====================================================================================
# Knowledge source from psgs_w100.tsv + precomputed DPR embeddings
# =====================================================================================
class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Refuses every global except what pickled numpy arrays need (defence in depth only:
    pickles stay behind --trust-pickles)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed (only numpy arrays are)")


def _vector_kind(path: PathLike) -> str:
    name = _base_name(path)
    if name.endswith((".pkl", ".pickle")):
        return "pickle"
    if name.endswith(".npy"):
        return "npy"
    raise UserError("unknown vectors file type", path=str(path),
                    fix="pass DPR's wikipedia_passages_*.pkl shards (with --trust-pickles) or .npy arrays (+ --ids)")


def check_vector_inputs(vector_files: Sequence[PathLike], ids_files: Optional[Sequence[PathLike]],
                        trust_pickles: bool) -> List[Tuple[str, Path, Optional[Path]]]:
    """``[(kind, vectors, ids)]``; refuses pickles without ``trust_pickles``."""
    if not vector_files:
        raise UserError("no vectors given", fix="pass --vectors FILE...")
    kinds = [(_vector_kind(v), _require_file(v, "vectors file")) for v in vector_files]
    pickles = [str(p) for k, p in kinds if k == "pickle"]
    if pickles and not trust_pickles:
        raise UserError(f"refusing to unpickle {len(pickles)} file(s): loading a pickle can run arbitrary code",
                        path=pickles[0],
                        fix="pass --trust-pickles only for files from a source you trust (e.g. DPR's own "
                            "release), or convert them to .npy + an ids file")
    npys = [p for k, p in kinds if k == "npy"]
    ids_files = list(ids_files or [])
    if len(ids_files) != len(npys):
        raise UserError(f"{len(npys)} .npy vectors file(s) but {len(ids_files)} --ids file(s)",
                        fix="give one ids file (one passage id per line, or a .npy of ids) per .npy, "
                            "in the same order")
    out, it = [], iter(ids_files)
    for kind, p in kinds:
        out.append((kind, p, _require_file(next(it), "ids file") if kind == "npy" else None))
    return out


def _iter_vector_batches(kind: str, path: Path, ids_path: Optional[Path], batch: int = 65536):
    """Yield ``(ids: list[str], vectors: float32 [B, D])`` from one vectors file."""
    import numpy as np

    if kind == "pickle":
        try:
            with _open_binary(path) as fh:
                data = _NumpyOnlyUnpickler(fh).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError) as err:
            raise UserError(f"cannot read the pickle ({err})", path=str(path),
                            fix="expected DPR's list of (passage id, numpy vector) pairs") from None
        if not isinstance(data, (list, tuple)):
            raise UserError("pickle does not hold a list of (id, vector) pairs", path=str(path),
                            fix="expected DPR's wikipedia_passages_*.pkl")
        for start in range(0, len(data), batch):
            chunk = data[start:start + batch]
            try:
                ids = [str(pid) for pid, _ in chunk]
                vecs = np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for _, v in chunk])
            except (TypeError, ValueError) as err:
                raise UserError(f"pickle entries {start}..{start + len(chunk) - 1} are not (id, vector) pairs "
                                f"of one size ({err})", path=str(path),
                                fix="expected DPR's wikipedia_passages_*.pkl") from None
            yield ids, vecs
        return
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise UserError(f"cannot read the .npy ({err})", path=str(path),
                        fix="save vectors with numpy.save (no object arrays)") from None
    if arr.ndim != 2:
        raise UserError(f"vectors array has shape {arr.shape}, expected [N, D]", path=str(path),
                        fix="save a 2-D array, one row per passage")
    if _base_name(ids_path).endswith(".npy"):
        try:
            ids_arr = np.load(ids_path, allow_pickle=False)
        except ValueError as err:
            raise UserError(f"cannot read the ids .npy ({err})", path=str(ids_path),
                            fix="save ids as an integer or unicode array") from None
        if ids_arr.ndim != 1 or len(ids_arr) != len(arr):
            raise UserError(f"ids array has shape {ids_arr.shape}, the vectors {arr.shape[0]} rows",
                            path=str(ids_path), fix="one id per vector row, in the same order")
        for start in range(0, len(arr), batch):
            yield ([str(x) for x in ids_arr[start:start + batch].tolist()],
                   np.asarray(arr[start:start + batch], dtype=np.float32))
        return
    with _open_text(ids_path) as fh:
        ids: List[str] = []
        start = 0
        for lineno, raw in enumerate(fh, 1):
            pid = raw.rstrip("\r\n")
            if not pid.strip():
                raise UserError("empty id", path=str(ids_path), line=lineno, fix="one passage id per line")
            if start + len(ids) >= len(arr):
                raise UserError(f"more ids than the {len(arr)} vector rows", path=str(ids_path), line=lineno,
                                fix="one id per vector row, in the same order")
            ids.append(pid.strip())
            if len(ids) == batch:
                yield ids, np.asarray(arr[start:start + batch], dtype=np.float32)
                start += batch
                ids = []
        if ids:
            yield ids, np.asarray(arr[start:start + len(ids)], dtype=np.float32)
            start += len(ids)
    if start != len(arr):
        raise UserError(f"{start} ids for {len(arr)} vector rows", path=str(ids_path),
                        fix="one id per vector row, in the same order")


def _load_identity(encoder_identity) -> Optional[dict]:
    if encoder_identity is None or isinstance(encoder_identity, dict):
        return encoder_identity
    text = str(encoder_identity)
    source = None
    if not text.lstrip().startswith("{"):
        source = _require_file(text, "encoder identity file")
        text = source.read_text(encoding="utf-8")
    try:
        ident = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"encoder identity is not valid JSON ({err.msg})", path=None if source is None else str(source),
                        fix="pass a JSON object, e.g. the 'encoder' entry of another knowledge source's manifest.json")
    if not isinstance(ident, dict):
        raise UserError("encoder identity must be a JSON object", fix="e.g. {\"name\": ..., \"dim\": 768, ...}")
    if isinstance(ident.get("encoder"), dict) and "format" in ident:  # a whole manifest.json
        ident = dict(ident["encoder"], spec=ident.get("encoder_spec"))
    return ident



def resolve_encoder_identity(encoder_identity: Optional[str], encoder_spec: Optional[str], what: str,
                             fix: str) -> Tuple[dict, str]:
    """The document encoder's identity for precomputed vectors and the encoder spec to record:
    from an --encoder-identity JSON, or built from --encoder-spec (which loads that encoder); a
    spec is required either way (``encoder_spec`` wins over the identity's)."""
    identity = _load_identity(encoder_identity)
    spec = encoder_spec or (identity or {}).get("spec")
    if not spec:
        raise UserError(f"no encoder spec: {what}", fix=fix)
    if identity is None:
        from rag_plugin.retrieval.encoders import load_encoder

        identity = load_encoder(spec).identity()
    return {**identity, "spec": identity.get("spec", spec)}, spec


def import_precomputed_vectors(out_dir: PathLike, passages: PathLike, vector_files: Sequence[PathLike],
                               ids_files: Optional[Sequence[PathLike]] = None, *, trust_pickles: bool = False,
                               encoder_spec: Optional[str] = None, encoder_identity=None,
                               index_factory: str = "Flat", train_size: int = 100_000, seed: int = 0,
                               dict_file: Optional[str] = None, bpe_model: Optional[str] = None,
                               gpt2_encoder_json: Optional[str] = None, gpt2_vocab_bpe: Optional[str] = None,
                               shard_size: int = 65536, restart: bool = False, progress: bool = True,
                               log: Callable[[str], None] = print, input_format=None,
                               index_file: Optional[str] = None):
    """Build a knowledge source from a passages file and precomputed document vectors.

    The knowledge-source builder does the work (:func:`rag_plugin.retrieval.knowledge.build_knowledge_source`,
    same layout, same resume rules) with its ``precomputed`` hook: the vectors are placed on the
    passage store's rows by passage id (:class:`~rag_plugin.build.precomputed.PrecomputedVectors`)
    instead of being embedded.

    The manifest's encoder identity is ``encoder_identity`` (a dict, a JSON string or file;
    a whole ``manifest.json`` works too) or, without it, the identity of the loaded
    ``encoder_spec``; ``encoder_spec`` (or the identity's ``spec``) is recorded as the spec the
    query encoder is loaded from. Vector ids have a ``wiki:`` prefix removed (newer DPR
    releases). Vectors for ids outside the passages file are ignored (counted); passages
    without a vector are an error listing a few ids. ``input_format`` (an
    :class:`~rag_plugin.core.input_format.InputFormat`) is the generator input format the passages
    are pre-tokenized for (default ``plugin``); ``index_file`` an existing FAISS index over the
    passages in file order, used instead of building one (``BuildSettings.index_file``).
    """
    from rag_plugin.retrieval import knowledge as ks
    from rag_plugin.build.precomputed import PrecomputedVectors

    _require_file(passages, "passages file")
    inputs = check_vector_inputs(vector_files, ids_files, trust_pickles)
    identity, spec = resolve_encoder_identity(
        encoder_identity, encoder_spec, "the manifest must name the encoder that made the vectors",
        "pass --encoder-spec (e.g. hf-dpr:PATH of DPR's ctx encoder), or an --encoder-identity JSON that has a 'spec'")
    if shard_size < 1:
        raise UserError(f"--shard-size must be positive, got {shard_size}")

    @dataclasses.dataclass
    class _ImportSettings(ks.BuildSettings):
        """The builder's settings plus what the vectors came from (part of the fingerprint)."""

        precomputed_vectors: list = dataclasses.field(default_factory=list)
        precomputed_identity: Optional[dict] = None

    settings = _ImportSettings(
        passages=str(passages), encoder=spec, index_factory=index_factory, split_words=None, dict=dict_file,
        bpe_model=bpe_model, gpt2_encoder_json=gpt2_encoder_json, gpt2_vocab_bpe=gpt2_vocab_bpe,
        train_size=train_size, seed=seed,
        input_format=None if input_format is None else input_format.identity(), index_file=index_file,
        precomputed_vectors=[{"kind": k, "file": str(p.resolve()), "bytes": p.stat().st_size,
                              **({"ids": str(i.resolve()), "ids_bytes": i.stat().st_size} if i else {})}
                             for k, p, i in inputs],
        precomputed_identity=identity)

    def batches():
        for kind, vpath, ipath in inputs:
            if kind == "pickle":
                log(f"warning: unpickling {vpath} (--trust-pickles): a pickle can run code when loaded; "
                    "use only files from a source you trust (loading is restricted to numpy arrays)")
            for ids, vecs in _progress(_iter_vector_batches(kind, vpath, ipath), f"import {vpath.name}", progress):
                yield [i[5:] if i.startswith("wiki:") else i for i in ids], vecs, str(vpath)

    vectors = PrecomputedVectors(batches, identity, passages_path=str(passages),
                                 missing_fix="pass every vectors shard (--vectors), or a passages file limited to "
                                             "the embedded ids; then rerun with --restart")
    return ks.build_knowledge_source(str(out_dir), settings, precomputed=vectors, shard_size=shard_size,
                                     restart=restart, progress=progress, log=log)


# =====================================================================================
# Command lines (the scripts in scripts/ are thin wrappers around these)
# =====================================================================================
def _common_args(p: argparse.ArgumentParser, splits: bool = True) -> None:
    p.add_argument("--out", required=True, help="output directory (new or empty; see --overwrite)")
    if splits:
        p.add_argument("--train", help="official training file")
        p.add_argument("--dev", help="official development file (becomes 'valid' with --test, else 'test')")
        p.add_argument("--test", help="official labelled test file")
        p.add_argument("--valid-from-train", default="0.1", metavar="N",
                       help="when there is no separate test file: records (N) or fraction (0<N<1) of train "
                            "carved out, with --seed, as the validation split (default: 0.1)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random split (default: 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared dataset in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _report(summary: dict, out: PathLike) -> None:
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


def qa_main(dataset: str, argv=None) -> int:
    names = {"nq": "Natural Questions", "triviaqa": "TriviaQA", "webquestions": "WebQuestions",
             "curatedtrec": "CuratedTrec"}
    p = argparse.ArgumentParser(
        description=f"Prepare {names[dataset]} for rag_plugin (KILT-style train/valid/test.jsonl). Inputs: DPR's "
                    "qas CSV (question<TAB>answer list), DPR's retriever JSON (positive_ctxs -> provenance), "
                    "KILT JSONL" + (" or TriviaQA JSON" if dataset == "triviaqa" else "") + "; detected per file.")
    _common_args(p)
    p.add_argument("--format", default="auto", choices=QA_FORMATS, help="input format (default: detect per file)")
    p.add_argument("--no-provenance", action="store_true",
                   help="drop provenance (KILT provenance names Wikipedia pages, not psgs_w100 passages)")
    if dataset == "triviaqa":
        p.add_argument("--triviaqa-questions", nargs="+", default=[], metavar="FILE",
                       help="TriviaQA JSON (unfiltered-web-train.json, unfiltered-web-dev.json) to fill in the "
                            "questions KILT's TriviaQA lacks, by QuestionId")
    args = p.parse_args(argv)
    summary = convert_open_qa(dataset, args.out, args.train, args.dev, args.test, fmt=args.format,
                              triviaqa_questions=getattr(args, "triviaqa_questions", []),
                              valid_from_train=args.valid_from_train, seed=args.seed,
                              keep_provenance=not args.no_provenance, overwrite=args.overwrite,
                              progress=not args.quiet)
    _report(summary, args.out)
    return 0


def msmarco_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Prepare MS-MARCO v2.1 (NLG) for rag_plugin: input = query, answers = well-formed answers "
                    "where present; 'No Answer Present.' is skipped (and counted).")
    _common_args(p)
    p.add_argument("--use-well-formed", action=argparse.BooleanOptionalAction, default=True,
                   help="use the well-formed answers where a query has them, as the paper does (default: on)")
    p.add_argument("--well-formed-only", action="store_true",
                   help="keep only queries with a well-formed answer in train and valid (the NLG subset)")
    args = p.parse_args(argv)
    summary = convert_msmarco(args.out, args.train, args.dev, args.test, use_well_formed=args.use_well_formed,
                              well_formed_only=args.well_formed_only, valid_from_train=args.valid_from_train,
                              seed=args.seed, overwrite=args.overwrite, progress=not args.quiet)
    _report(summary, args.out)
    return 0


def jeopardy_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Prepare Jeopardy question generation for rag_plugin: input = the answer entity, output = "
                    "the clue. Inputs: SearchQA per-question JSON folders, or JEOPARDY_QUESTIONS1.json.")
    _common_args(p)
    p.add_argument("--input", help="one unsplit file/folder, split by --seed into --valid-size/--test-size")
    p.add_argument("--valid-size", default="0.1", help="with --input: records or fraction for valid (default 0.1)")
    p.add_argument("--test-size", default="0.2", help="with --input: records or fraction for test (default 0.2)")
    args = p.parse_args(argv)
    summary = convert_jeopardy(args.out, input=args.input, train=args.train, dev=args.dev, test=args.test,
                               valid_size=args.valid_size, test_size=args.test_size,
                               valid_from_train=args.valid_from_train, seed=args.seed, overwrite=args.overwrite,
                               progress=not args.quiet)
    _report(summary, args.out)
    return 0


def fever_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Prepare FEVER for rag_plugin: input = claim, output = SUPPORTS / REFUTES / NOT ENOUGH INFO. "
                    "Inputs: original FEVER JSONL (train.jsonl, paper_dev.jsonl, paper_test.jsonl) or KILT FEVER.")
    _common_args(p)
    p.add_argument("--two-way", action="store_true", help="drop NOT ENOUGH INFO (FEVER-2-way)")
    p.add_argument("--no-provenance", action="store_true", help="drop evidence/provenance")
    args = p.parse_args(argv)
    summary = convert_fever(args.out, args.train, args.dev, args.test, two_way=args.two_way,
                            keep_provenance=not args.no_provenance, valid_from_train=args.valid_from_train,
                            seed=args.seed, overwrite=args.overwrite, progress=not args.quiet)
    _report(summary, args.out)
    return 0


def psgs_w100_main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description="Build a knowledge source from DPR's psgs_w100.tsv and DPR's precomputed passage embeddings "
                    "(no re-embedding): passages/ + vectors.npy + index.faiss + manifest.json.")
    p.add_argument("--passages", required=True, help="psgs_w100.tsv (id<TAB>text<TAB>title, with header) or .jsonl")
    p.add_argument("--vectors", nargs="+", required=True, metavar="FILE",
                   help="wikipedia_passages_*.pkl (needs --trust-pickles) and/or .npy [N, D] arrays")
    p.add_argument("--ids", nargs="+", default=[], metavar="FILE",
                   help="one per .npy, same order: passage ids (one per line, or a .npy of ids)")
    p.add_argument("--trust-pickles", action="store_true",
                   help="allow unpickling .pkl files (pickles can run code: only for files you trust)")
    p.add_argument("--out", required=True, help="knowledge source directory (new, empty, or an unfinished import)")
    p.add_argument("--encoder-spec", default=None,
                   help="spec of the encoder that made the vectors (e.g. hf-dpr:PATH); its identity goes into "
                        "the manifest unless --encoder-identity is given")
    p.add_argument("--encoder-identity", default=None, metavar="JSON",
                   help="encoder identity as inline JSON or a file (a manifest.json works); not loaded")
    p.add_argument("--index-factory", default="Flat", help="FAISS factory string (Flat, HNSW32, IVF4096,SQ8, ...)")
    p.add_argument("--train-size", type=int, default=100_000, help="vectors sampled to train the quantizer")
    p.add_argument("--dict", default=None, help="generator dictionary (fairseq dict.txt) to pre-tokenize passages")
    p.add_argument("--bpe-model", default=None, help="SentencePiece model of the generator")
    p.add_argument("--gpt2-encoder-json", default=None, help="GPT-2 BPE encoder.json (fairseq BART)")
    p.add_argument("--gpt2-vocab-bpe", default=None, help="GPT-2 BPE vocab.bpe (fairseq BART)")
    p.add_argument("--shard-size", type=int, default=65536, help="rows per vectors shard (the unit of resume)")
    p.add_argument("--input-format", default="plugin", metavar="plugin|hf|FILE",
                   help="generator input format the passages are pre-tokenized for: plugin (default), hf (the "
                        "reference RAG's 'title / text // question'), or the input_format.json of a converted "
                        "Hugging Face RAG checkpoint (scripts/convert_hf_rag.py)")
    p.add_argument("--threads", type=int, default=None, help="FAISS threads (default: all CPUs)")
    p.add_argument("--restart", action="store_true", help="discard an unfinished import in --out and start over")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    from rag_plugin.core.input_format import InputFormat
    from rag_plugin.retrieval.index import set_faiss_threads

    set_faiss_threads(args.threads)
    ks = import_precomputed_vectors(
        args.out, args.passages, args.vectors, args.ids, trust_pickles=args.trust_pickles,
        encoder_spec=args.encoder_spec, encoder_identity=args.encoder_identity, index_factory=args.index_factory,
        train_size=args.train_size, seed=args.seed, dict_file=args.dict, bpe_model=args.bpe_model,
        gpt2_encoder_json=args.gpt2_encoder_json, gpt2_vocab_bpe=args.gpt2_vocab_bpe, shard_size=args.shard_size,
        restart=args.restart, progress=not args.quiet, log=lambda m: print(m, file=sys.stderr),
        input_format=InputFormat.parse(args.input_format))
    print(f"wrote {args.out}: {len(ks)} passages, dim {ks.dim}, index {ks.manifest['index_factory']}",
          file=sys.stderr)
    return 0
