"""Readers for evaluation: the gold KILT file, guess files, passage texts; checked strictly.

Gold: KILT JSONL (``{"id", "input", "output": [{"answer", "provenance": [{"id"|"wikipedia_id"}]}]}``),
read once with :func:`rag_plugin.data.kilt.read_kilt` (so record N here is record N there, the
index the fairseq task gives example N), with, per gold output, its provenance ids as one
evidence set (KILT's retrieval metrics score each output's provenance as an alternative).

Guesses, in either format (``fmt="auto"`` tells them apart by the first non-blank line):

* KILT JSONL: ``{"id", "output": [{"answer": ..., "provenance": [{"id"|"wikipedia_id": ...,
  "title"?: ..., "text"?: ...}]}]}``, exactly one output per line, ids matching the gold file's
  (any order).
* fairseq-generate output of the plugin (:mod:`rag_plugin.evaluation.fairseq_output`).

Every problem is a :class:`~rag_plugin.util.errors.UserError` naming the file (and line): missing
or extra ids, an index outside the gold file, duplicate records, an empty guess file,
malformed lines. Nothing is silently skipped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from rag_plugin.data.kilt import read_kilt
from rag_plugin.evaluation.fairseq_output import align_fairseq, read_fairseq_generate
from rag_plugin.evaluation.records import GoldExample, Guess, check_file, list_ids, text_lines
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import iter_jsonl

FORMATS = ("auto", "kilt", "fairseq")

KILT_GUESS_FIX = ('each line must be {"id": ..., "output": [{"answer": "...", '
                  '"provenance": [{"id": "..."}]}]}')
ANSWER_PATTERN_FIX = "rerun rag-curatedtrec-targets on the rag-prepare curatedtrec output"


# ================================================================================== gold
def _read_kilt_records(path: str):
    """read_kilt as the fairseq task reads evaluation splits: records with an empty question
    are kept (generation answers every line, so example N is record N), without the warning."""
    return read_kilt(path, require_answers=True, allow_empty_input=True, warn_empty_input=False)


def _check_answer_pattern(g: GoldExample, path: str) -> None:
    kept = g.meta.get("answer_pattern") if g.is_regex else None
    if kept is None:
        return
    ok = isinstance(kept, str) and kept or \
        isinstance(kept, list) and kept and all(isinstance(x, str) and x for x in kept)
    if not ok:
        raise UserError("meta.answer_pattern must be a non-empty pattern string or list of them",
                        path=path, line=g.line, fix=ANSWER_PATTERN_FIX)


def read_gold(path: str) -> List[GoldExample]:
    """Read a KILT gold file: ids, answers (all aliases) and per-output provenance ids."""
    check_file(path, "gold file", "pass --gold with a KILT JSONL file, e.g. the test.jsonl rag-prepare wrote")
    records = _read_kilt_records(path)
    gold = [GoldExample(r.id, r.input, list(r.answers), [list(ids) for ids in r.evidence_sets], dict(r.meta or {}),
                        r.line) for r in records]
    for g in gold:
        _check_answer_pattern(g, path)
    return gold


# ================================================================================== guesses
def detect_format(path: str) -> str:
    """``kilt`` if the first non-blank line starts with ``{``, else ``fairseq``."""
    p = check_file(path, "guess file", "pass --guess with a KILT JSONL or fairseq-generate output file")
    for _, line in text_lines(p):
        if line.strip():
            return "kilt" if line.lstrip().startswith("{") else "fairseq"
    raise UserError("the guess file is empty", path=str(p),
                    fix="pass the output of fairseq-generate or a KILT JSONL file of predictions")


def read_guesses(path: str, gold: Sequence[GoldExample], fmt: str = "auto") -> List[Guess]:
    """Read a guess file and align it with ``gold``: the result has one :class:`Guess` per
    gold example, in gold order. Raises :class:`UserError` on any mismatch."""
    if fmt not in FORMATS:
        raise UserError(f"unknown guess format {fmt!r}", fix=f"use one of {', '.join(FORMATS)}")
    if not gold:
        raise UserError("the gold file holds no records")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "kilt":
        return _align_kilt(path, read_kilt_guesses(path), gold)
    return align_fairseq(path, read_fairseq_generate(path), gold)


# ---------------------------------------------------------------------------------- KILT
def _optional(item: dict, key: str, types, what: str, where: dict):
    value = item.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
        raise UserError(f"{what} must be a {'string' if types is str else 'number'}", fix=KILT_GUESS_FIX, **where)
    return value


def _kilt_provenance(prov, where: dict) -> Tuple[List[str], List[Optional[str]], List[Optional[str]], list]:
    """(ids, texts, titles, scores) of a KILT guess's provenance list."""
    if prov is None:
        prov = []
    if not isinstance(prov, list):
        raise UserError("'provenance' must be a list", fix=KILT_GUESS_FIX, **where)
    ids, texts, titles, scores = [], [], [], []
    for i, item in enumerate(prov):
        if not isinstance(item, dict):
            raise UserError(f"provenance[{i}] is not an object", fix=KILT_GUESS_FIX, **where)
        pid = item.get("id", item.get("wikipedia_id"))
        if pid is None or isinstance(pid, (bool, dict, list)) or not str(pid).strip():
            raise UserError(f"provenance[{i}] has no 'id' or 'wikipedia_id'", fix=KILT_GUESS_FIX, **where)
        ids.append(str(pid).strip())
        texts.append(_optional(item, "text", str, f"provenance[{i}].text", where))
        titles.append(_optional(item, "title", str, f"provenance[{i}].title", where))
        score = _optional(item, "score", (int, float), f"provenance[{i}].score", where)
        scores.append(None if score is None else float(score))
    return ids, texts, titles, scores


def _kilt_guess(obj: dict, lineno: int, where: dict) -> Guess:
    if "id" not in obj or not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
        raise UserError("missing or invalid 'id'", fix=KILT_GUESS_FIX, **where)
    outputs = obj.get("output")
    if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict):
        raise UserError("'output' must be a list of exactly one object", fix=KILT_GUESS_FIX, **where)
    answer = outputs[0].get("answer")
    if answer is not None and not isinstance(answer, str):
        raise UserError("'answer' must be a string", fix=KILT_GUESS_FIX, **where)
    ids, texts, titles, scores = _kilt_provenance(outputs[0].get("provenance", []), where)
    return Guess(str(obj["id"]), answer, retrieved=ids, passage_texts=texts, doc_scores=scores,
                 line=lineno, passage_titles=titles)


def read_kilt_guesses(path: str) -> Dict[str, Guess]:
    """KILT JSONL guesses by id (exactly one output per line; provenance optional)."""
    p = check_file(path, "guess file", "pass --guess with a KILT JSONL file of predictions")
    guesses: Dict[str, Guess] = {}
    for lineno, obj in iter_jsonl(p, fix=KILT_GUESS_FIX):
        where = dict(path=str(p), line=lineno)
        guess = _kilt_guess(obj, lineno, where)
        if guess.id in guesses:
            raise UserError(f"duplicate id {guess.id!r} (first on line {guesses[guess.id].line})",
                            fix="give one prediction per id", **where)
        guesses[guess.id] = guess
    if not guesses:
        raise UserError("the guess file holds no predictions", path=str(p),
                        fix="pass a KILT JSONL file with one prediction per line")
    return guesses


def _align_kilt(path: str, guesses: Dict[str, Guess], gold: Sequence[GoldExample]) -> List[Guess]:
    gold_ids = [g.id for g in gold]
    missing = [i for i in gold_ids if i not in guesses]
    if missing:
        raise UserError(f"{len(missing)} of {len(gold_ids)} gold ids have no prediction: "
                        f"{list_ids(missing)}", path=path,
                        fix="predict every example of the gold file (or pass the matching --gold)")
    known = set(gold_ids)
    extra = [i for i in guesses if i not in known]
    if extra:
        raise UserError(f"{len(extra)} predicted ids are not in the gold file: {list_ids(extra)}",
                        path=path, fix="pass the gold file these predictions were made for")
    return [guesses[i] for i in gold_ids]


# ================================================================================== passages
def passages_by_id(source: str, ids: Iterable[str]) -> Dict[str, Tuple[str, str]]:
    """``{id: (title, text)}`` of the passages ``ids`` from a knowledge-source directory, a
    passage-store directory, or a ``.jsonl`` / ``.tsv`` passages file. Unknown ids raise
    :class:`UserError`."""
    from rag_plugin.retrieval.passages import PassageStore, read_passages  # start-up: numpy, for --passages only

    wanted = set(ids)
    p = Path(source)
    found: Dict[str, Tuple[str, str]] = {}
    if p.is_dir():
        store_dir = p / "passages" if (p / "passages" / "meta.json").is_file() else p
        store = PassageStore(str(store_dir))
        for pid in sorted(wanted):
            row = store.row_of_id(pid)
            found[pid] = (store.title(row), store.text(row))
        return found
    if not p.is_file():
        raise UserError("passages not found", path=source,
                        fix="pass --passages with a knowledge-source directory or a .jsonl/.tsv passages file")
    for passage in read_passages(source):
        if passage.id in wanted:
            found[passage.id] = (passage.title, passage.text)
    missing = sorted(wanted - set(found))
    if missing:
        raise UserError(f"{len(missing)} retrieved passage ids are not in the passages file: "
                        f"{list_ids(missing)}", path=source,
                        fix="pass the passages the system retrieved from")
    return found
