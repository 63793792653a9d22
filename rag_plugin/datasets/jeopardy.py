"""Jeopardy question generation converter (``rag-prepare jeopardy``): input = the answer entity,
output = the clue (the paper's task: generate a "Jeopardy question" from its answer).

Inputs: SearchQA's per-question JSON folders (``train/``, ``val/``, ``test/``), the raw J! Archive
dump ``JEOPARDY_QUESTIONS1.json`` (split by seed), or JSONL of the same items. Clues and answers
are cleaned of the scrape's quotes, HTML tags and entities.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Iterator, Optional, Tuple

from rag_plugin.datasets.inputs import layout_error, sniff_format
from rag_plugin.datasets.inputs import progress as with_progress
from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.datasets.writer import DatasetWriter, finish_with_carving, make_record, parse_size, plan_splits
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import READ_ERRORS, PathLike, is_gzip, iter_jsonl, open_binary, unreadable_file_error

JEOPARDY_FIX = ('expected Jeopardy items {"category", "air_date", "question", "value", "answer", "round", '
                '"show_number"} (SearchQA per-question JSON files or JEOPARDY_QUESTIONS1.json)')
ACCEPTED = ("SearchQA per-question .json folders", "JEOPARDY_QUESTIONS1.json (a JSON array)",
            "JSONL of the same items")

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


def _searchqa_items(path: PathLike) -> Iterator[Tuple[str, int, str, dict]]:
    """SearchQA's folder: one JSON object per file (``.json`` or ``.json.gz``), recursively, sorted."""
    files = sorted(str(p) for pattern in ("*.json", "*.json.gz") for p in Path(path).rglob(pattern) if p.is_file())
    if not files:
        raise UserError("no .json files in this directory", path=str(path),
                        fix="point at SearchQA's per-question JSON folder (e.g. train/)")
    for f in files:
        try:
            with open_binary(f) as fh:
                raw = fh.read()
        except READ_ERRORS as err:  # a truncated or corrupt .gz
            raise unreadable_file_error(f, err) from None
        try:
            obj = json.loads(raw.decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise UserError("not valid UTF-8", path=f, fix="re-encode the file as UTF-8") from None
        except json.JSONDecodeError as err:
            raise UserError(f"invalid JSON ({err.msg})", path=f, line=err.lineno, fix=JEOPARDY_FIX) from None
        if not isinstance(obj, dict):
            raise UserError("not a JSON object", path=f, line=1, fix=JEOPARDY_FIX)
        yield f, 1, Path(f[:-3] if is_gzip(f) else f).stem, obj


def iter_jeopardy(path: PathLike) -> Iterator[Tuple[str, int, str, dict]]:
    """Yield ``(file, line, id, item)`` from a SearchQA directory (one JSON object per file,
    recursively, sorted), the raw ``JEOPARDY_QUESTIONS1.json`` list (streamed) or JSONL."""
    kind = sniff_format(path)
    if kind == "dir":
        yield from _searchqa_items(path)
    elif kind == "json-list":
        with JsonStream(path) as js:
            for i, (line, obj) in enumerate(js.iter_array()):
                if not isinstance(obj, dict):
                    raise UserError("array element is not an object", path=str(path), line=line, fix=JEOPARDY_FIX)
                yield str(path), line, f"jeopardy-{i}", obj
    elif kind == "jsonl":
        for line, obj in iter_jsonl(path, fix=JEOPARDY_FIX):
            yield str(path), line, str(obj.get("id", f"jeopardy-{line}")), obj
    else:
        raise layout_error(path, "Jeopardy", ACCEPTED)


def _jeopardy_rows(writer: DatasetWriter, path: PathLike, part: str, progress: bool) -> None:
    writer.source(part, path)
    for f, line, rid, obj in with_progress(iter_jeopardy(path), f"jeopardy {Path(path).name}", progress):
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
        return finish_with_carving(writer, carve_valid, valid_from_train, seed, info)
