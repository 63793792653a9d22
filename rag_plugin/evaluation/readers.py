"""Readers for evaluation: gold KILT files and guess files, checked strictly.

Gold: KILT JSONL (``{"id", "input", "output": [{"answer", "provenance": [{"id"|"wikipedia_id"}]}]}``),
read with :func:`rag_plugin.data.kilt.read_kilt` (so record N here is record N there, the
index the fairseq task gives example N) plus, per gold output, its provenance ids as one
evidence set (KILT's retrieval metrics score each output's provenance as an alternative).

Guesses, in either format (``fmt="auto"`` tells them apart by the first non-blank line):

* KILT JSONL: ``{"id", "output": [{"answer": ..., "provenance": [{"id"|"wikipedia_id": ...,
  "text"?: ...}]}]}``, exactly one output per line, ids matching the gold file's (any order).
* fairseq-generate output of the plugin: lines ``S-N``/``T-N``/``H-N``/``D-N``/``P-N`` as
  fairseq prints them and ``Z-N<TAB>rank<TAB>p(z|x)<TAB>passage id<TAB>title`` provenance
  lines, N the 0-based index of the example in the gold file. The first ``D-N`` line is the
  prediction (``--nbest`` > 1 prints several, best first). Other fairseq lines (``A-``,
  ``E-``, ``I-``, ``W-``), fairseq's summary line and log lines are ignored; a line that
  starts like an ``S/T/H/D/P/Z`` line but is malformed is an error (file:line).

Every problem is a :class:`~rag_plugin.util.errors.UserError` naming the file (and line): missing
or extra ids, an index outside the gold file, duplicate records, an empty guess file,
malformed lines. Nothing is silently skipped.
"""
from __future__ import annotations

import inspect
import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from rag_plugin.data.kilt import read_kilt
from rag_plugin.util.errors import UserError
from rag_plugin.evaluation.metrics import answer_patterns
from rag_plugin.util.io import decoded_lines

FORMATS = ("auto", "kilt", "fairseq")
MAX_LISTED = 5  # ids named in an error message

KILT_GUESS_FIX = ('each line must be {"id": ..., "output": [{"answer": "...", '
                  '"provenance": [{"id": "..."}]}]}')


# ================================================================================== records
@dataclass
class GoldExample:
    id: str
    input: str
    answers: List[str]
    evidence_sets: List[List[str]]  # one list of provenance ids per gold output (may be empty)
    meta: dict = field(default_factory=dict)
    line: Optional[int] = None  # line in the gold file

    @property
    def provenance(self) -> List[str]:
        return [pid for s in self.evidence_sets for pid in s]

    @property
    def is_regex(self) -> bool:
        """The answers are regular expressions (CuratedTrec: ``meta.answer_is_regex``)."""
        return bool(self.meta.get("answer_is_regex"))

    @property
    def patterns(self) -> List[str]:
        """The answer patterns of a regex record (:func:`metrics.answer_patterns`)."""
        return answer_patterns(self.meta, self.answers)


@dataclass
class Guess:
    """One system output, aligned with a gold example."""

    id: str
    answer: Optional[str]  # None: the guess gave no answer (only retrieval can be scored)
    retrieved: List[str] = field(default_factory=list)  # passage ids, best first
    passage_texts: List[Optional[str]] = field(default_factory=list)  # parallel to retrieved
    doc_scores: List[Optional[float]] = field(default_factory=list)  # p(z|x), when given
    line: Optional[int] = None  # line of the guess file the answer came from


@dataclass
class FairseqExample:
    """What fairseq-generate printed for example N (see :func:`parse_fairseq_lines`)."""

    index: int
    first_line: int
    source: Optional[str] = None
    target: Optional[str] = None
    hypothesis: Optional[str] = None  # first D line (detokenized)
    hypothesis_line: Optional[int] = None
    hypothesis_score: Optional[float] = None
    pieces: Optional[str] = None  # first H line
    h_line: Optional[int] = None
    n_hypotheses: int = 0
    passages: Dict[int, Tuple[float, str, str]] = field(default_factory=dict)  # rank -> (p, id, title)

    def ranked_passages(self) -> List[Tuple[int, float, str, str]]:
        return [(r, *self.passages[r]) for r in sorted(self.passages)]


# ================================================================================== helpers
def _check_file(path: str, what: str, fix: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} not found", path=str(p), fix=fix)
    if not p.is_file():
        raise UserError(f"{what} is not a file", path=str(p), fix=fix)
    return p


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    """(line number, text without the line end); splits on ``\\n`` only."""
    with open(path, "rb") as fh:
        for lineno, text in decoded_lines(fh, path):
            yield lineno, text.rstrip("\r\n")


def _list_ids(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:MAX_LISTED])
    more = len(ids) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


# ================================================================================== gold
def _read_kilt_records(path: str):
    """read_kilt as the fairseq task reads evaluation splits: records with an empty question
    are kept (generation answers every line, so example N is record N), without the warning."""
    if "allow_empty_input" not in inspect.signature(read_kilt).parameters:
        return read_kilt(path, require_answers=True)
    kilt_logger = logging.getLogger(read_kilt.__module__)
    level = kilt_logger.level
    kilt_logger.setLevel(logging.ERROR)
    try:
        return read_kilt(path, require_answers=True, allow_empty_input=True)
    finally:
        kilt_logger.setLevel(level)


def read_gold(path: str) -> List[GoldExample]:
    """Read a KILT gold file: ids, answers (all aliases) and per-output provenance ids."""
    records = _read_kilt_records(path)
    # Second pass (the file is already validated by read_kilt): per-output evidence sets and
    # line numbers, in the same record order (read_kilt skips blank lines, so do we).
    extra: List[Tuple[int, List[List[str]]]] = []
    for lineno, line in _lines(Path(path)):
        if not line.strip():
            continue
        obj = json.loads(line)
        sets = []
        for out in obj.get("output") or []:
            ids = []
            for prov in out.get("provenance") or []:
                if isinstance(prov, dict):
                    pid = prov.get("id", prov.get("wikipedia_id"))
                    if pid is not None:
                        ids.append(str(pid).strip())
            sets.append(ids)
        extra.append((lineno, sets))
    if len(extra) != len(records):  # the file changed between the two passes
        raise UserError("gold file changed while it was read", path=path, fix="rerun")
    gold = [GoldExample(r.id, r.input, list(r.answers), sets, dict(r.meta or {}), lineno)
            for r, (lineno, sets) in zip(records, extra)]
    for g in gold:
        kept = g.meta.get("answer_pattern") if g.is_regex else None
        if kept is not None and not (isinstance(kept, str) and kept or isinstance(kept, list) and kept
                                     and all(isinstance(x, str) and x for x in kept)):
            raise UserError("meta.answer_pattern must be a non-empty pattern string or list of them",
                            path=path, line=g.line,
                            fix="rerun scripts/curatedtrec_targets.py on the prepare_curatedtrec.py output")
    return gold


# ================================================================================== guesses
def detect_format(path: str) -> str:
    """``kilt`` if the first non-blank line starts with ``{``, else ``fairseq``."""
    p = _check_file(path, "guess file", "pass --guess with a KILT JSONL or fairseq-generate output file")
    for _, line in _lines(p):
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
    return _align_fairseq(path, read_fairseq_generate(path), gold)


# ---------------------------------------------------------------------------------- KILT
def read_kilt_guesses(path: str) -> Dict[str, Guess]:
    """KILT JSONL guesses by id (exactly one output per line; provenance optional)."""
    p = _check_file(path, "guess file", "pass --guess with a KILT JSONL file of predictions")
    guesses: Dict[str, Guess] = {}
    for lineno, line in _lines(p):
        if not line.strip():
            continue
        where = dict(path=str(p), line=lineno)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserError(f"invalid JSON ({err.msg})", fix=KILT_GUESS_FIX, **where) from None
        if not isinstance(obj, dict):
            raise UserError("a line is not a JSON object", fix=KILT_GUESS_FIX, **where)
        if "id" not in obj or not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
            raise UserError("missing or invalid 'id'", fix=KILT_GUESS_FIX, **where)
        gid = str(obj["id"])
        if gid in guesses:
            raise UserError(f"duplicate id {gid!r} (first on line {guesses[gid].line})",
                            fix="give one prediction per id", **where)
        outputs = obj.get("output")
        if not isinstance(outputs, list) or len(outputs) != 1 or not isinstance(outputs[0], dict):
            raise UserError("'output' must be a list of exactly one object", fix=KILT_GUESS_FIX, **where)
        out = outputs[0]
        answer = out.get("answer")
        if answer is not None and not isinstance(answer, str):
            raise UserError("'answer' must be a string", fix=KILT_GUESS_FIX, **where)
        prov = out.get("provenance", [])
        if prov is None:
            prov = []
        if not isinstance(prov, list):
            raise UserError("'provenance' must be a list", fix=KILT_GUESS_FIX, **where)
        retrieved, texts, scores = [], [], []
        for i, item in enumerate(prov):
            if not isinstance(item, dict):
                raise UserError(f"provenance[{i}] is not an object", fix=KILT_GUESS_FIX, **where)
            pid = item.get("id", item.get("wikipedia_id"))
            if pid is None or isinstance(pid, (bool, dict, list)) or not str(pid).strip():
                raise UserError(f"provenance[{i}] has no 'id' or 'wikipedia_id'", fix=KILT_GUESS_FIX, **where)
            text = item.get("text")
            if text is not None and not isinstance(text, str):
                raise UserError(f"provenance[{i}].text must be a string", fix=KILT_GUESS_FIX, **where)
            score = item.get("score")
            if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
                raise UserError(f"provenance[{i}].score must be a number", fix=KILT_GUESS_FIX, **where)
            retrieved.append(str(pid).strip())
            texts.append(text)
            scores.append(None if score is None else float(score))
        guesses[gid] = Guess(gid, answer, retrieved, texts, scores, lineno)
    if not guesses:
        raise UserError("the guess file holds no predictions", path=str(p),
                        fix="pass a KILT JSONL file with one prediction per line")
    return guesses


def _align_kilt(path: str, guesses: Dict[str, Guess], gold: Sequence[GoldExample]) -> List[Guess]:
    gold_ids = [g.id for g in gold]
    missing = [i for i in gold_ids if i not in guesses]
    if missing:
        raise UserError(f"{len(missing)} of {len(gold_ids)} gold ids have no prediction: "
                        f"{_list_ids(missing)}", path=path,
                        fix="predict every example of the gold file (or pass the matching --gold)")
    known = set(gold_ids)
    extra = [i for i in guesses if i not in known]
    if extra:
        raise UserError(f"{len(extra)} predicted ids are not in the gold file: {_list_ids(extra)}",
                        path=path, fix="pass the gold file these predictions were made for")
    return [guesses[i] for i in gold_ids]


# ---------------------------------------------------------------------------------- fairseq
_RECORD_START = re.compile(r"[STHDPZ]-")
_RECORD = re.compile(r"([STHDPZ])-([0-9]+)\t", re.ASCII)
_OTHER_RECORD = re.compile(r"[A-Z]-[0-9]+\t", re.ASCII)  # A-/E-/I-/W-...: other fairseq output
_UINT = re.compile(r"[0-9]+", re.ASCII)
FAIRSEQ_FIX = "expected fairseq-generate lines S-N/T-N/H-N/D-N/P-N and Z-N<TAB>rank<TAB>p<TAB>id<TAB>title"


def _float(text: str, what: str, path: str, lineno: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{what} {text[:40]!r} is not a number", path=path, line=lineno,
                        fix=FAIRSEQ_FIX) from None


def parse_fairseq_lines(lines: Iterable[Tuple[int, str]], path: str = "<input>") -> Dict[int, FairseqExample]:
    """Parse (line number, line) pairs of fairseq-generate output into examples by index N."""
    examples: Dict[int, FairseqExample] = {}

    def bad(msg: str, lineno: int):
        return UserError(msg, path=path, line=lineno, fix=FAIRSEQ_FIX)

    for lineno, line in lines:
        line = line.rstrip("\r\n")
        if not _RECORD_START.match(line):
            continue  # log line, summary line, blank line
        m = _RECORD.match(line)
        if not m:
            if _OTHER_RECORD.match(line):
                continue
            raise bad(f"malformed {line[0]}- line (expected {line[0]}-<example index><TAB>...)", lineno)
        kind, index = m.group(1), int(m.group(2))
        rest = line[m.end():]
        ex = examples.get(index)
        if ex is None:
            ex = examples[index] = FairseqExample(index, lineno)
        if kind in "ST":
            if (ex.source if kind == "S" else ex.target) is not None:
                raise bad(f"second {kind}-{index} line (one per example expected)", lineno)
            if kind == "S":
                ex.source = rest
            else:
                ex.target = rest
        elif kind in "HD":
            parts = rest.split("\t", 1)
            score = _float(parts[0], f"{kind}-{index} score", path, lineno)
            text = parts[1] if len(parts) > 1 else ""
            if kind == "H":
                ex.n_hypotheses += 1
                if ex.pieces is None:
                    ex.pieces, ex.h_line = text, lineno
            elif ex.hypothesis is None:  # --nbest > 1: the first D line is the best one
                ex.hypothesis, ex.hypothesis_line, ex.hypothesis_score = text, lineno, score
        elif kind == "P":
            for tok in rest.split():
                _float(tok, f"P-{index} positional score", path, lineno)
        else:  # Z: rank, p(z|x), passage id, title
            parts = rest.split("\t", 3)
            if len(parts) < 3:
                raise bad(f"Z-{index} line has {len(parts)} of the fields rank, p(z|x), passage id, title",
                          lineno)
            rank_s, p_s, pid = parts[0], parts[1], parts[2].strip()
            title = parts[3] if len(parts) > 3 else ""
            if not _UINT.fullmatch(rank_s.strip()):
                raise bad(f"Z-{index} rank {rank_s[:40]!r} is not a non-negative integer", lineno)
            rank = int(rank_s)
            p = _float(p_s, f"Z-{index} p(z|x)", path, lineno)
            if not (math.isfinite(p) and -1e-4 <= p <= 1 + 1e-4):
                raise bad(f"Z-{index} p(z|x) = {p_s.strip()[:40]} is not a probability in [0, 1]", lineno)
            if not pid:
                raise bad(f"Z-{index} line has an empty passage id", lineno)
            old = ex.passages.get(rank)
            if old is not None and old[1] != pid:
                raise bad(f"Z-{index} rank {rank} given twice, for passages {old[1]!r} and {pid!r}", lineno)
            if old is None:
                ex.passages[rank] = (p, pid, title)
    return examples


def read_fairseq_generate(path: str) -> Dict[int, FairseqExample]:
    """Parse and check a fairseq-generate output file (see the module docstring)."""
    p = _check_file(path, "guess file", "pass --guess with the output of fairseq-generate")
    examples = parse_fairseq_lines(_lines(p), str(p))
    if not examples:
        raise UserError("no fairseq-generate records (S-/H-/D- lines) found", path=str(p),
                        fix="pass the stdout of fairseq-generate, or a KILT JSONL file of predictions")
    check_fairseq_examples(examples, str(p))
    return examples


def check_fairseq_examples(examples: Dict[int, FairseqExample], path: str) -> None:
    """Every example needs a D line; Z ranks must be 0..m-1."""
    for index in sorted(examples):
        ex = examples[index]
        if ex.hypothesis is None:
            what = "an H- line but no D- line" if ex.pieces is not None else "no D- line (hypothesis)"
            raise UserError(f"example {index} has {what}", path=path, line=ex.h_line or ex.first_line,
                            fix="keep fairseq-generate's D- lines (its full stdout)")
        ranks = sorted(ex.passages)
        if ranks and ranks != list(range(len(ranks))):
            raise UserError(f"example {index}: Z- ranks are {ranks[:8]}, expected 0..{len(ranks) - 1}",
                            path=path, line=ex.first_line, fix="print every retrieved passage, ranks from 0")


def _question_key(text: str) -> str:
    """A question reduced to its letters and digits, case and accents folded: fairseq's S- line shows
    the question after a trip through the generator's pieces (spacing, unknown characters, casing of
    an uncased tokenizer may change)."""
    import unicodedata

    folded = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in folded if c.isalnum())


def _check_sources(path: str, examples: Dict[int, "FairseqExample"], gold: Sequence[GoldExample]) -> None:
    """Predictions are matched to gold records by position: refuse a gold file whose questions are
    not the ones the S- lines show (another split of the same size, another order). A minority of
    differences is tolerated (a character the generator's vocabulary cannot spell)."""
    shown = [(i, examples[i]) for i in range(len(gold)) if examples[i].source is not None]
    off = [(i, ex) for i, ex in shown if _question_key(ex.source) != _question_key(gold[i].input)]
    if shown and len(off) * 2 > len(shown):
        i, ex = off[0]
        raise UserError(f"{len(off)} of {len(shown)} S- lines do not show their gold record's question, e.g. "
                        f"example {i}: {ex.source.strip()[:60]!r} against {gold[i].input.strip()[:60]!r} "
                        f"(record {gold[i].id!r})", path=path, line=ex.first_line,
                        fix="pass the gold file these predictions were generated from (the same split, in order)")


def _align_fairseq(path: str, examples: Dict[int, FairseqExample], gold: Sequence[GoldExample]) -> List[Guess]:
    n = len(gold)
    outside = sorted(i for i in examples if i >= n)
    if outside:
        ex = examples[outside[0]]
        raise UserError(f"example index {outside[0]} is outside the gold file ({n} records, "
                        f"indices 0..{n - 1})", path=path, line=ex.first_line,
                        fix="pass the gold file these predictions were generated from")
    missing = [gold[i].id for i in range(n) if i not in examples]
    if missing:
        raise UserError(f"{len(missing)} of {n} gold examples have no prediction, ids: {_list_ids(missing)}",
                        path=path, fix="generate for the whole gold split (or pass the matching --gold)")
    _check_sources(path, examples, gold)
    guesses = []
    for i, g in enumerate(gold):
        ex = examples[i]
        ranked = ex.ranked_passages()
        guesses.append(Guess(g.id, ex.hypothesis.strip(), [pid for _, _, pid, _ in ranked],
                             [None] * len(ranked), [p for _, p, _, _ in ranked], ex.hypothesis_line))
    return guesses


# ================================================================================== passages
def passage_texts(source: str, ids: Iterable[str]) -> Dict[str, str]:
    """Texts of the passages ``ids`` from a knowledge-source directory, a passage-store
    directory, or a ``.jsonl`` / ``.tsv`` passages file. Unknown ids raise :class:`UserError`."""
    from rag_plugin.retrieval.passages import PassageStore, read_passages

    wanted = set(ids)
    p = Path(source)
    found: Dict[str, str] = {}
    if p.is_dir():
        store_dir = p / "passages" if (p / "passages" / "meta.json").is_file() else p
        store = PassageStore(str(store_dir))
        for pid in sorted(wanted):
            found[pid] = store.text(store.row_of_id(pid))
        return found
    if not p.is_file():
        raise UserError("passages not found", path=source,
                        fix="pass --passages with a knowledge-source directory or a .jsonl/.tsv passages file")
    for passage in read_passages(source):
        if passage.id in wanted:
            found[passage.id] = passage.text
    missing = sorted(wanted - set(found))
    if missing:
        raise UserError(f"{len(missing)} retrieved passage ids are not in the passages file: "
                        f"{_list_ids(missing)}", path=source,
                        fix="pass the passages the system retrieved from")
    return found
