"""What a metric reads: gold examples and the guesses aligned with them, and what is derived from
them once for every metric that needs it (retrieved passages as the documents gold provenance
names, FEVER labels, the titles and texts of the top-K retrieved passages)."""
from __future__ import annotations

import sys
from functools import cached_property
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rag_plugin.evaluation import metrics as M
from rag_plugin.evaluation.readers import passages_by_id
from rag_plugin.evaluation.records import GoldExample, Guess, list_ids
from rag_plugin.util.errors import UserError


def _split_base(pid: str) -> Optional[str]:
    """``<id>`` of a passage id ``<id>_<n>`` (rag-build-knowledge --split-words), else None."""
    base, _, n = pid.rpartition("_")
    return base if base and n.isdigit() else None


def split_from_documents(retrieved: Sequence[Sequence[str]], evidence: Sequence[Sequence[Sequence[str]]]) -> bool:
    """Whether, over the whole evaluation, the retrieved ids are passages split from the documents that
    gold provenance names: some retrieved id is ``<gold id>_<n>`` and none is a gold id itself."""
    gold_ids = {i for sets in evidence for ev in sets for i in ev}
    ids = {pid for row in retrieved for pid in row}
    return not (ids & gold_ids) and any(_split_base(pid) in gold_ids for pid in ids)


def document_ids(retrieved: Sequence[str], evidence_sets: Sequence[Sequence[str]],
                 split_documents: bool = False) -> List[str]:
    """Passage ids -> the document ids gold provenance uses, deduplicated in rank order.

    A passage split from a document (``<id>_<n>``, rag-build-knowledge --split-words) stands for
    its document ``<id>`` when gold provenance names the document. ``split_documents`` (the
    collection is split throughout: :func:`split_from_documents`): every ``<id>_<n>`` stands for
    ``<id>``, gold or not, so that two passages of one wrong document take one rank, as pages do in
    KILT's page-level ranking. Otherwise only the gold documents' passages are merged (an id like
    ``Apollo_11`` may be a document of its own).
    """
    gold_ids = {i for ev in evidence_sets for i in ev}
    out: List[str] = []
    for pid in retrieved:
        doc = pid
        if pid not in gold_ids:
            base = _split_base(pid)
            if base is not None and (split_documents or base in gold_ids):
                doc = base
        if doc not in out:
            out.append(doc)
    return out


class EvalInputs:
    """Gold examples and aligned guesses, with the views metrics read (computed at most once).

    ``passages`` (a knowledge-source directory or passages file) supplies passage titles and texts
    for ``answer_in_top<K>`` when the guesses carry no text; ``gold_path`` / ``guess_path`` name the
    files in error messages.
    """

    def __init__(self, gold: Sequence[GoldExample], guesses: Sequence[Guess], passages: Optional[str] = None,
                 guess_path: Optional[str] = None, gold_path: Optional[str] = None):
        if len(gold) != len(guesses) or any(g.id != p.id for g, p in zip(gold, guesses)):
            raise ValueError("guesses are not aligned with the gold examples")
        self.gold, self.guesses = list(gold), list(guesses)
        self.passages, self.guess_path, self.gold_path = passages, guess_path, gold_path

    @property
    def predictions(self) -> List[Optional[str]]:
        return [p.answer for p in self.guesses]

    @property
    def references(self) -> List[List[str]]:
        return [g.answers for g in self.gold]

    def qa_scores(self, plain: Callable[..., float], regex: Callable[..., float]) -> List[float]:
        """Per-example QA scores: ``regex(pred, patterns)`` for regex records (CuratedTrec), else
        ``plain(pred, answers)``."""
        return [regex(p.answer, g.patterns) if g.is_regex else plain(p.answer, g.answers)
                for p, g in zip(self.guesses, self.gold)]

    @cached_property
    def documents(self) -> List[List[str]]:
        """Per example, the retrieved passages as the documents gold provenance names
        (:func:`document_ids`), for R-precision, recall and precision."""
        split = split_from_documents([p.retrieved for p in self.guesses], [g.evidence_sets for g in self.gold])
        return [document_ids(p.retrieved, g.evidence_sets, split) for g, p in zip(self.gold, self.guesses)]

    def warn_beyond_retrieved(self, name: str, k: int) -> None:
        """A rank cutoff beyond every prediction's retrieved list counts the missing ranks as misses: say so."""
        longest = max((len(p.retrieved) for p in self.guesses), default=0)
        if k > longest:
            print(f"warning: {name} looks at {k} passages, and no prediction in {self.guess_path or 'the guesses'} "
                  f"retrieved more than {longest}: the missing ranks count as misses", file=sys.stderr)

    @cached_property
    def fever_labels(self) -> List[str]:
        """The gold FEVER label of every claim (one per record, one of the three)."""
        labels = []
        for g in self.gold:
            norm = {M.normalize_label(a) for a in g.answers}
            if len(norm) != 1:
                raise UserError(f"record {g.id!r} has several different labels {sorted(norm)}",
                                path=self.gold_path, line=g.line, fix="give each FEVER claim one label")
            (label,) = norm
            if label not in M.FEVER_LABELS:
                raise UserError(f"record {g.id!r}: {g.answers[0]!r} is not a FEVER label", path=self.gold_path,
                                line=g.line,
                                fix=f"labels are {', '.join(M.FEVER_LABELS)} (use --task fever on FEVER data)")
            labels.append(label)
        return labels

    def top_passages(self, k: int) -> List[Tuple[List[Optional[str]], List[Optional[str]]]]:
        """Per example, (titles, texts) of the first k retrieved passages: from the guess file where
        it gives a passage's text (with its title, if given), else from ``passages``."""
        need = {pid for p in self.guesses for pid, t in zip(p.retrieved[:k], p.passage_texts[:k]) if t is None}
        if need and self.passages is None:
            raise UserError(f"answer_in_top{k} needs passage texts, and {len(need)} retrieved passages "
                            f"have none in the guess file (e.g. {list_ids(sorted(need))})", path=self.guess_path,
                            fix="pass --passages with the knowledge-source directory or passages file")
        lookup: Dict[str, Tuple[str, str]] = passages_by_id(self.passages, need) if need else {}
        out = []
        for p in self.guesses:
            titles = p.passage_titles or [None] * len(p.retrieved)
            pairs = [(title, text) if text is not None else lookup[pid]
                     for pid, text, title in zip(p.retrieved[:k], p.passage_texts[:k], titles[:k])]
            out.append(([title for title, _ in pairs], [text for _, text in pairs]))
        return out
