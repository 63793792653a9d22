"""Concrete training targets for regular-expression answers (CuratedTrec).

CuratedTrec's answers are patterns (``meta.answer_is_regex``, written verbatim by
``rag-prepare curatedtrec``). A generator must not be trained to write a pattern. The
paper (Lewis et al. 2020, appendix "CuratedTrec preprocessing") retrieves the top 1000
documents for each question and uses the string that most frequently matches the pattern as
the supervision target; if nothing matches, it generates the pattern's expansions, replacing
non-deterministic parts with a whitespace. This module does both:

* :func:`most_frequent_match`: case-insensitive ``finditer`` of the pattern(s) over the
  retrieved passages' titles and texts; the most frequent matched string (compared case- and
  whitespace-insensitively) wins, ties going to the one found first in rank order.
* :func:`expand_pattern`: the pattern's literal expansions, from Python's own regex parser.
* :func:`derive_targets`: rewrites a prepared data directory (``rag-curatedtrec-targets``).

A rewritten record keeps its pattern(s) in ``meta.answer_pattern`` (a list) and
``meta.answer_is_regex`` (so evaluation still matches the pattern), and says where its
target came from in ``meta.target_from``: ``"retrieved"`` or ``"regex_expansion"``.
"""
import json
import logging
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

try:  # Python >= 3.11 (sre_parse is deprecated there)
    import re._constants as _C
    import re._parser as _P
except ImportError:  # pragma: no cover - older Pythons
    import sre_constants as _C
    import sre_parse as _P

from tqdm import tqdm

from rag_plugin.data.kilt import read_kilt
from rag_plugin.evaluation.metrics import answer_patterns, compile_answer_pattern
from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json, iter_jsonl

logger = logging.getLogger(__name__)

MAX_EXPANSIONS = 64
SUMMARY = "curatedtrec_targets.json"
_SPACE = " "  # what a non-deterministic part of a pattern becomes
_REPEATS = {_C.MAX_REPEAT, _C.MIN_REPEAT} | ({_C.POSSESSIVE_REPEAT} if hasattr(_C, "POSSESSIVE_REPEAT") else set())
_MAX_BOUNDED = 4  # a bounded repeat {lo,hi} with hi above this is treated as non-deterministic


# ================================================================================== expansion
def _dedup(items: Iterable[str], cap: int) -> List[str]:
    out, seen = [], set()
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
            if len(out) >= cap:
                break
    return out


def _product(left: List[str], right: List[str], cap: int) -> List[str]:
    return _dedup((a + b for a in left for b in right), cap)


def _expand_items(items, cap: int) -> List[str]:
    out = [""]
    for op, av in items:
        out = _product(out, _expand_one(op, av, cap), cap)
    return out


def _expand_one(op, av, cap: int) -> List[str]:
    if op is _C.LITERAL:
        return [chr(av)]
    if op is _C.IN:
        # a class of listed characters is an alternation (the parser itself turns ``4|5`` into
        # ``[45]``): enumerated. Ranges, categories (\d, \s) and negated classes: a space.
        if all(o is _C.LITERAL for o, _ in av):
            return _dedup((chr(c) for _, c in av), cap)
        return [_SPACE]
    if op is _C.BRANCH:
        return _dedup((s for branch in av[1] for s in _expand_items(branch, cap)), cap)
    if op is _C.SUBPATTERN:
        return _expand_items(av[-1], cap)
    if op in _REPEATS:
        lo, hi, sub = av
        if hi is _C.MAXREPEAT or hi > _MAX_BOUNDED:
            return [_SPACE]  # unbounded (or long) repeat: non-deterministic
        once = _expand_items(sub, cap)
        counts = range(lo, hi + 1)
        if op is not _C.MIN_REPEAT:
            counts = reversed(counts)  # greedy: the longest first, as the pattern would match
        out: List[str] = []
        for n in counts:
            seq = [""]
            for _ in range(n):
                seq = _product(seq, once, cap)
            out.extend(seq)
        return _dedup(out, cap)
    if op in (_C.AT, _C.ASSERT, _C.ASSERT_NOT):
        return [""]  # zero-width: anchors, \b, lookarounds
    return [_SPACE]  # ANY, NOT_LITERAL, back-references, conditionals, ...


def expand_pattern(pattern: str, cap: int = MAX_EXPANSIONS) -> List[str]:
    """The literal strings ``pattern`` stands for, the paper's fallback target heuristic.

    Parsed with Python's own regex parser (``re._parser``, ``sre_parse`` before 3.11):
    alternations are enumerated (a class of listed characters such as ``[45]`` is one: the
    parser turns ``4|5`` into it), optional parts and short bounded repeats both ways (the
    greedy reading first), and non-deterministic parts (``.``, classes with ranges or
    categories such as ``\\s`` or ``\\d``, negated classes, unbounded repeats such as ``+`` and
    ``*``, back-references) become a space. Anchors and lookarounds vanish. Whitespace is then
    collapsed and stripped; empty and duplicate strings are dropped; at most ``cap`` strings, in
    the pattern's order. A pattern that does not parse stands for itself (literally).
    """
    try:
        parsed = _P.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        parsed = None
    raw = [pattern] if parsed is None else _expand_items(list(parsed), cap)
    return _dedup((s for s in (" ".join(r.split()) for r in raw) if s), cap)


# ================================================================================== matching
def _pattern_for_search(pattern: str):
    compiled = compile_answer_pattern(pattern)
    return compiled if compiled is not None else re.compile(re.escape(pattern), re.IGNORECASE | re.UNICODE)


def match_counts(patterns: Sequence[str], texts: Iterable[str]) -> List[Tuple[str, int]]:
    """Matches of ``patterns`` in ``texts`` (in rank order): ``[(surface form, count)]``, most
    frequent first, ties in order of first occurrence. Matches are compared case-insensitively
    with whitespace collapsed; the surface form is the first one seen. Empty matches are ignored.
    A pattern that does not compile is searched for literally."""
    compiled = [_pattern_for_search(p) for p in patterns]
    counts: Counter = Counter()
    first: Dict[str, Tuple[int, str]] = {}
    for text in texts:
        if not text:
            continue
        for c in compiled:
            for m in c.finditer(text):
                surface = " ".join(m.group(0).split())
                if not surface:
                    continue
                key = surface.casefold()
                counts[key] += 1
                if key not in first:
                    first[key] = (len(first), surface)
    order = sorted(counts, key=lambda key: (-counts[key], first[key][0]))
    return [(first[key][1], counts[key]) for key in order]


def most_frequent_match(patterns: Sequence[str], texts: Iterable[str]) -> Optional[str]:
    """The string that most frequently matches ``patterns`` in ``texts`` (see :func:`match_counts`),
    or None if nothing matches."""
    found = match_counts(patterns, texts)
    return found[0][0] if found else None


def passage_texts(titles: Sequence[str], texts: Sequence[str]) -> List[str]:
    """Title and text of each retrieved passage, in rank order, searched separately (a match does
    not run from a title into its text)."""
    out = []
    for title, text in zip(titles, texts):
        out.extend([title or "", text or ""])
    return out


# ================================================================================== records
def record_patterns(obj: dict) -> Optional[List[str]]:
    """The answer patterns of a regex record (``meta.answer_pattern`` when targets were already
    derived, else its answers); None for a record whose answers are not patterns."""
    meta = obj.get("meta") or {}
    if not meta.get("answer_is_regex"):
        return None
    return answer_patterns(meta, [o["answer"] for o in obj.get("output") or []
                                  if isinstance(o, dict) and isinstance(o.get("answer"), str) and o["answer"].strip()])


def rewrite_record(obj: dict, patterns: List[str], answers: List[str], target_from: str) -> dict:
    """``obj`` with ``answers`` as its outputs and the patterns kept in its meta. Provenance is
    kept: on the first answer when the record had one output, else as answer-less outputs."""
    old = [o for o in obj.get("output") or [] if isinstance(o, dict)]
    outputs = [{"answer": a} for a in answers]
    if len(old) == 1:
        outputs[0] = {**{k: v for k, v in old[0].items() if k != "answer"}, "answer": answers[0]}
    else:
        outputs += [{k: v for k, v in o.items() if k != "answer"} for o in old if o.get("provenance")]
    meta = dict(obj.get("meta") or {})
    meta.update(answer_is_regex=True, answer_pattern=list(patterns), target_from=target_from)
    return {**obj, "output": outputs, "meta": meta}


def _read_split(path: Path) -> List[Tuple[int, dict]]:
    read_kilt(str(path), require_answers=True, allow_empty_input=True)  # checks the file (errors: file:line)
    return list(iter_jsonl(path))


# ================================================================================== rewrite
_COUNTS = ("records", "regex_records", "retrieved", "regex_expansion", "dropped_no_target", "patterns_not_compiling")


def _split_paths(data_dir: Path, k: int, max_expansions: int, splits: Sequence[str]) -> Dict[str, Path]:
    """The checked arguments of :func:`derive_targets`: ``{split: data_dir/split.jsonl}``."""
    if not data_dir.is_dir():
        raise UserError("data directory not found", path=str(data_dir),
                        fix="pass --data with the output directory of rag-prepare curatedtrec")
    if k < 1:
        raise UserError(f"-k must be at least 1, got {k}", fix="retrieve 1 or more passages (the paper: 1000)")
    if max_expansions < 1:
        raise UserError(f"--max-expansions must be at least 1, got {max_expansions}", fix="use e.g. 64")
    if not splits:
        raise UserError("no split given", fix="pass --splits, e.g. --splits train valid")
    paths = {s: data_dir / f"{s}.jsonl" for s in splits}
    for split, path in paths.items():
        if not path.is_file():
            raise UserError(f"split {split!r} not found", path=str(path),
                            fix=f"--splits names files DATA/<split>.jsonl; {data_dir} holds "
                                f"{', '.join(sorted(p.stem for p in data_dir.glob('*.jsonl'))) or 'none'}")
    return paths


def _target(patterns: List[str], titles, texts, max_expansions: int) -> Tuple[Optional[List[str]], str]:
    """``(answers, target_from)`` of one regex record from its retrieved passages; ``(None, "")``
    when there is neither a match nor a literal expansion."""
    best = most_frequent_match(patterns, passage_texts(titles, texts))
    if best is not None:
        return [best], "retrieved"
    expansions = _dedup((e for p in patterns for e in expand_pattern(p, max_expansions)), max_expansions)
    return (expansions, "regex_expansion") if expansions else (None, "")


def _derive_split(split: str, path: Path, rows: List[Tuple[int, dict]], retriever, k: int, batch_size: int,
                  max_expansions: int, progress: bool) -> Tuple[List[dict], Counter]:
    """The records of one split with concrete targets (records without any dropped), and the counts."""
    todo = [(i, p) for i, p in ((i, record_patterns(obj)) for i, (_, obj) in enumerate(rows)) if p]
    counts = Counter(records=len(rows), regex_records=len(todo))
    new_objs = [obj for _, obj in rows]
    batches = range(0, len(todo), batch_size)
    if progress and todo:
        batches = tqdm(batches, desc=f"{split}: retrieve top-{k}", unit=" batch", mininterval=1.0, file=sys.stderr)
    dropped = set()
    for start in batches:
        chunk = todo[start:start + batch_size]
        found = retriever.search([rows[i][1].get("input") or "" for i, _ in chunk], k)
        for (i, patterns), titles, texts in zip(chunk, found.titles(), found.texts()):
            counts["patterns_not_compiling"] += sum(compile_answer_pattern(p) is None for p in patterns)
            answers, target_from = _target(patterns, titles, texts, max_expansions)
            if answers is None:
                dropped.add(i)
                counts["dropped_no_target"] += 1
                logger.warning("%s:%d: no match and no literal expansion of %s: record dropped",
                               path, rows[i][0], patterns)
                continue
            new_objs[i] = rewrite_record(rows[i][1], patterns, answers, target_from)
            counts[target_from] += 1
    written = [obj for i, obj in enumerate(new_objs) if i not in dropped]
    if rows and not written:
        raise UserError(f"no record of {split} has a target left", path=str(path),
                        fix="check the patterns, or retrieve more passages with a larger -k")
    return written, counts


def _write_outputs(data_dir: Path, out_dir: Path, written: Dict[str, List[dict]], summary: dict) -> None:
    """``out_dir/{split}.jsonl``, the data directory's other files when ``out_dir`` is elsewhere,
    and the summary; every file atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if out_dir.resolve() != data_dir.resolve():
        for f in sorted(data_dir.iterdir()):
            if f.is_file() and f.name not in {f"{s}.jsonl" for s in written} | {SUMMARY}:
                with atomic_path(out_dir / f.name) as tmp:
                    shutil.copyfile(f, tmp)
    for split, objs in written.items():
        with atomic_path(out_dir / f"{split}.jsonl") as tmp:
            with open(tmp, "w", encoding="utf-8") as fh:
                for obj in objs:
                    fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
    atomic_write_json(out_dir / SUMMARY, summary)


def derive_targets(data: str, knowledge: str, k: int = 1000, out: Optional[str] = None,
                   splits: Sequence[str] = ("train", "valid"), bm25: bool = False, batch_size: int = 64,
                   max_expansions: int = MAX_EXPANSIONS, progress: bool = True, retriever=None) -> dict:
    """Rewrite the regex records of ``data/{split}.jsonl`` (for ``splits``) so that their first
    answer is a concrete string: the most frequent match in the top-``k`` passages retrieved
    from ``knowledge`` (its own dense retriever, or BM25), else the first expansion of the
    pattern (the other expansions become extra aliases). Records without a target at all (a
    pattern that expands to nothing, like ``\\d+``, and no match) are dropped and counted.

    Writes ``out/{split}.jsonl`` (``out`` defaults to ``data``: in place, which loses nothing
    since the patterns are kept in ``meta.answer_pattern``), copies the directory's other files
    when ``out`` is elsewhere, and writes ``out/curatedtrec_targets.json`` (the counts). Every
    file is written atomically. Returns that summary.
    """
    data_dir = Path(data)
    paths = _split_paths(data_dir, k, max_expansions, splits)
    rows = {s: _read_split(p) for s, p in paths.items()}
    if retriever is None and any(record_patterns(obj) for r in rows.values() for _, obj in r):
        retriever = BM25Retriever.from_dir(knowledge) if bm25 else DenseRetriever.from_dir(knowledge)
    n_passages = len(retriever.store) if retriever is not None else None
    k_used = min(k, n_passages) if n_passages else k
    if n_passages is not None and k > n_passages:
        logger.warning("-k %d is larger than the knowledge source (%d passages): retrieving all of them", k, n_passages)
    summary = {"data": str(data_dir.resolve()), "knowledge": str(Path(knowledge).resolve()),
               "retriever": "bm25" if bm25 else "dense", "k": k_used, "max_expansions": max_expansions,
               "splits": {}}
    written: Dict[str, List[dict]] = {}
    for split, split_rows in rows.items():
        written[split], counts = _derive_split(split, paths[split], split_rows, retriever, k_used, batch_size,
                                               max_expansions, progress)
        summary["splits"][split] = {key: counts[key] for key in _COUNTS}
    _write_outputs(data_dir, Path(out) if out else data_dir, written, summary)
    return summary
