"""What the evaluation readers produce: gold examples, guesses aligned with them, and the small
helpers the readers share (checking an input file, numbered lines, listing ids in a message)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

from rag_plugin.evaluation.metrics import answer_patterns
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import decoded_lines

MAX_LISTED = 5  # ids named in an error message


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
    passage_titles: List[Optional[str]] = field(default_factory=list)  # parallel to retrieved, when given


def check_file(path: str, what: str, fix: str) -> Path:
    """``path`` as a Path; :class:`UserError` if it is missing or not a file."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} not found", path=str(p), fix=fix)
    if not p.is_file():
        raise UserError(f"{what} is not a file", path=str(p), fix=fix)
    return p


def text_lines(path: Path) -> Iterator[Tuple[int, str]]:
    """(line number, text without the line end); splits on ``\\n`` only."""
    with open(path, "rb") as fh:
        for lineno, text in decoded_lines(fh, path):
            yield lineno, text.rstrip("\r\n")


def list_ids(ids: Sequence[str]) -> str:
    """The first :data:`MAX_LISTED` ids, quoted, and how many more there are."""
    ids = list(ids)
    shown = ", ".join(repr(i) for i in ids[:MAX_LISTED])
    more = len(ids) - MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")
