"""What a converter's input file is: its layout sniffed from its name and first bytes, the first
record of a JSONL file or JSON array (layouts are told apart by their fields), the one-line error
for a layout no converter reads, and progress bars over records.

Every input may be gzip-compressed (``.gz``): the name is judged without the suffix and the
content is read through gzip.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl, require_file

#: Top-level keys of TriviaQA's own JSON (``{"Data": [...], "Domain", "Version", ...}``).
TRIVIAQA_TOP_KEYS = frozenset({"Data", "Domain", "Version", "Split", "VerifiedEval"})
#: Columns of MS-MARCO v2.1's JSON (``{"query": {"0": ...}, "answers": {"0": [...]}, ...}``).
MSMARCO_TOP_KEYS = frozenset({"query", "answers", "wellFormedAnswers", "query_id", "query_type", "passages"})

KINDS = ("dir", "csv", "json-list", "triviaqa", "msmarco", "jsonl", "unknown")


def base_name(path: PathLike) -> str:
    """The file name, lower-cased, without a ``.gz`` suffix."""
    name = Path(path).name.lower()
    return name[:-3] if name.endswith(".gz") else name


def sniff_format(path: PathLike) -> str:
    """The kind of an input path, one of :data:`KINDS`.

    ``dir`` (a folder), ``csv`` (a ``.csv``/``.tsv`` file, or a ``.txt`` file that does not start
    with ``{``), ``json-list`` (a JSON array), ``triviaqa`` (TriviaQA's JSON object), ``msmarco``
    (MS-MARCO's JSON object of columns keyed by row), ``jsonl`` (one JSON object per line: KILT,
    NQ-open, DrQA's ``.txt``, MS-MARCO's ``tojsonl.py`` output, FEVER, ...), ``unknown`` (none of
    these: the caller names the layouts it accepts, see :func:`layout_error`).
    """
    p = Path(path)
    if p.is_dir():
        return "dir"
    require_file(p)
    name = base_name(p)
    if name.endswith((".csv", ".tsv")):
        return "csv"
    with JsonStream(p, chunk_chars=1 << 16) as js:
        first = js.peek()
        if name.endswith(".txt") and first != "{":
            return "csv"
        if first == "[":
            return "json-list"
        if first == "{":
            return _object_kind(js)
    return "unknown"


def _object_kind(js: JsonStream) -> str:
    """``triviaqa``, ``msmarco`` (columns: the first key's value is an object) or ``jsonl``."""
    key = js.first_key()
    if key in TRIVIAQA_TOP_KEYS:
        return "triviaqa"
    if key in MSMARCO_TOP_KEYS:
        js.expect(":", "':' after an object key")
        if js.peek() == "{":
            return "msmarco"
    return "jsonl"


def first_record(path: PathLike, kind: str) -> Optional[object]:
    """The first element of a ``json-list`` or the first object of a ``jsonl`` file (None if
    there is none); reading errors name the file and line."""
    if kind == "jsonl":
        for _, obj in iter_jsonl(path):
            return obj
        return None
    if kind == "json-list":
        with JsonStream(path, chunk_chars=1 << 16) as js:
            for _, element in js.iter_array():
                return element
        return None
    raise ValueError(f"no records to look at in a {kind!r} input")


def layout_error(path: PathLike, what: str, accepted: Sequence[str], fix: str = "is this the right file?") -> UserError:
    """The one-line error for an input in none of the layouts a converter reads."""
    return UserError(f"not a recognised {what} layout (accepted: {', '.join(accepted)})", path=str(path), fix=fix)


def progress(iterable, desc: str, enabled: bool, total: Optional[int] = None):
    """``iterable`` behind a tqdm progress bar on stderr when ``enabled``."""
    if not enabled:
        return iterable
    from tqdm import tqdm  # start-up: rag-prepare --help imports this module (the layouts it lists)

    return tqdm(iterable, desc=desc, total=total, unit=" rec", mininterval=1.0, file=sys.stderr)
