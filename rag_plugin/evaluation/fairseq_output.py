"""fairseq-generate output of the plugin as guesses: parsing, checking, aligning with the gold file.

Lines ``S-N``/``T-N``/``H-N``/``D-N``/``P-N`` as fairseq prints them and
``Z-N<TAB>rank<TAB>p(z|x)<TAB>passage id<TAB>title`` provenance lines, N the 0-based index of the
example in the gold file. The first ``D-N`` line is the prediction (``--nbest`` > 1 prints several,
best first). Other fairseq lines (``A-``, ``E-``, ``I-``, ``W-``), fairseq's summary line and log
lines are ignored; a line that starts like an ``S/T/H/D/P/Z`` line but is malformed is a
:class:`~rag_plugin.util.errors.UserError` naming the file and line.
"""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from rag_plugin.evaluation.records import GoldExample, Guess, check_file, list_ids, text_lines
from rag_plugin.util.errors import UserError

_RECORD_START = re.compile(r"[STHDPZ]-")
_RECORD = re.compile(r"([STHDPZ])-([0-9]+)\t", re.ASCII)
_OTHER_RECORD = re.compile(r"[A-Z]-[0-9]+\t", re.ASCII)  # A-/E-/I-/W-...: other fairseq output
_UINT = re.compile(r"[0-9]+", re.ASCII)
FAIRSEQ_FIX = "expected fairseq-generate lines S-N/T-N/H-N/D-N/P-N and Z-N<TAB>rank<TAB>p<TAB>id<TAB>title"


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


class _Line:
    """One record line being parsed: where it is, for error messages."""

    def __init__(self, path: str, lineno: int, kind: str, index: int, rest: str):
        self.path, self.lineno, self.kind, self.index, self.rest = path, lineno, kind, index, rest

    def error(self, message: str) -> UserError:
        return UserError(message, path=self.path, line=self.lineno, fix=FAIRSEQ_FIX)

    def number(self, text: str, what: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise self.error(f"{what} {text[:40]!r} is not a number") from None


def _add_source_or_target(ex: FairseqExample, line: _Line) -> None:
    attr = "source" if line.kind == "S" else "target"
    if getattr(ex, attr) is not None:
        raise line.error(f"second {line.kind}-{line.index} line (one per example expected)")
    setattr(ex, attr, line.rest)


def _add_hypothesis(ex: FairseqExample, line: _Line) -> None:
    parts = line.rest.split("\t", 1)
    score = line.number(parts[0], f"{line.kind}-{line.index} score")
    text = parts[1] if len(parts) > 1 else ""
    if line.kind == "H":
        ex.n_hypotheses += 1
        if ex.pieces is None:
            ex.pieces, ex.h_line = text, line.lineno
    elif ex.hypothesis is None:  # --nbest > 1: the first D line is the best one
        ex.hypothesis, ex.hypothesis_line, ex.hypothesis_score = text, line.lineno, score


def _check_positional_scores(ex: FairseqExample, line: _Line) -> None:
    for tok in line.rest.split():
        line.number(tok, f"P-{line.index} positional score")


def _add_passage(ex: FairseqExample, line: _Line) -> None:
    """A Z line: rank, p(z|x), passage id, title."""
    parts = line.rest.split("\t", 3)
    z = f"Z-{line.index}"
    if len(parts) < 3:
        raise line.error(f"{z} line has {len(parts)} of the fields rank, p(z|x), passage id, title")
    rank_s, p_s, pid = parts[0], parts[1], parts[2].strip()
    title = parts[3] if len(parts) > 3 else ""
    if not _UINT.fullmatch(rank_s.strip()):
        raise line.error(f"{z} rank {rank_s[:40]!r} is not a non-negative integer")
    rank = int(rank_s)
    p = line.number(p_s, f"{z} p(z|x)")
    if not (math.isfinite(p) and -1e-4 <= p <= 1 + 1e-4):
        raise line.error(f"{z} p(z|x) = {p_s.strip()[:40]} is not a probability in [0, 1]")
    if not pid:
        raise line.error(f"{z} line has an empty passage id")
    old = ex.passages.get(rank)
    if old is not None and old[1] != pid:
        raise line.error(f"{z} rank {rank} given twice, for passages {old[1]!r} and {pid!r}")
    if old is None:
        ex.passages[rank] = (p, pid, title)


_HANDLERS = {"S": _add_source_or_target, "T": _add_source_or_target, "H": _add_hypothesis,
             "D": _add_hypothesis, "P": _check_positional_scores, "Z": _add_passage}


def parse_fairseq_lines(lines: Iterable[Tuple[int, str]], path: str = "<input>") -> Dict[int, FairseqExample]:
    """Parse (line number, line) pairs of fairseq-generate output into examples by index N."""
    examples: Dict[int, FairseqExample] = {}
    for lineno, text in lines:
        text = text.rstrip("\r\n")
        if not _RECORD_START.match(text):
            continue  # log line, summary line, blank line
        m = _RECORD.match(text)
        if not m:
            if _OTHER_RECORD.match(text):
                continue
            raise UserError(f"malformed {text[0]}- line (expected {text[0]}-<example index><TAB>...)",
                            path=path, line=lineno, fix=FAIRSEQ_FIX)
        line = _Line(path, lineno, m.group(1), int(m.group(2)), text[m.end():])
        ex = examples.get(line.index)
        if ex is None:
            ex = examples[line.index] = FairseqExample(line.index, lineno)
        _HANDLERS[line.kind](ex, line)
    return examples


def read_fairseq_generate(path: str) -> Dict[int, FairseqExample]:
    """Parse and check a fairseq-generate output file (see the module docstring)."""
    p = check_file(path, "guess file", "pass --guess with the output of fairseq-generate")
    examples = parse_fairseq_lines(text_lines(p), str(p))
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
    folded = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in folded if c.isalnum())


def _check_sources(path: str, examples: Dict[int, FairseqExample], gold: Sequence[GoldExample]) -> None:
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


def align_fairseq(path: str, examples: Dict[int, FairseqExample], gold: Sequence[GoldExample]) -> List[Guess]:
    """One :class:`Guess` per gold example, in gold order: example N is gold record N."""
    n = len(gold)
    outside = sorted(i for i in examples if i >= n)
    if outside:
        ex = examples[outside[0]]
        raise UserError(f"example index {outside[0]} is outside the gold file ({n} records, "
                        f"indices 0..{n - 1})", path=path, line=ex.first_line,
                        fix="pass the gold file these predictions were generated from")
    missing = [gold[i].id for i in range(n) if i not in examples]
    if missing:
        raise UserError(f"{len(missing)} of {n} gold examples have no prediction, ids: {list_ids(missing)}",
                        path=path, fix="generate for the whole gold split (or pass the matching --gold)")
    _check_sources(path, examples, gold)
    guesses = []
    for i, g in enumerate(gold):
        ex = examples[i]
        ranked = ex.ranked_passages()
        guesses.append(Guess(g.id, ex.hypothesis.strip(), retrieved=[pid for _, _, pid, _ in ranked],
                             passage_texts=[None] * len(ranked), doc_scores=[p for _, p, _, _ in ranked],
                             line=ex.hypothesis_line, passage_titles=[title for _, _, _, title in ranked]))
    return guesses
