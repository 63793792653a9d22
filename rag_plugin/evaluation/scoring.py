"""Evaluation of aligned gold/guess lists on registered metrics (:mod:`rag_plugin.evaluation.registry`).

Every value is reported in percent (the metric's [0, 1] value times 100, rounded to 4 decimals), as
the paper reports EM, BLEU, ROUGE, accuracy and the distinct-n-gram ratio and KILT reports retrieval.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from rag_plugin.evaluation import metrics as M
from rag_plugin.evaluation.inputs import EvalInputs
from rag_plugin.evaluation.readers import read_gold, read_guesses
from rag_plugin.evaluation.records import GoldExample, Guess, list_ids
from rag_plugin.evaluation.registry import ANSWERS, PROVENANCE, RETRIEVED, canonical_metric, lookup
from rag_plugin.util.errors import UserError


def needs_of(metric_names: Sequence[str]) -> set:
    """Everything the metrics ``metric_names`` need from the inputs."""
    return set().union(*(lookup(n)[0].needs for n in metric_names))


def check_inputs(x: EvalInputs, needs: set) -> None:
    """:class:`UserError` if the files lack what the metrics need: answers, gold provenance, retrieval."""
    if ANSWERS in needs:
        no_answer = [p.id for p in x.guesses if p.answer is None]
        if no_answer:
            raise UserError(f"{len(no_answer)} predictions have no 'answer': {list_ids(no_answer)}",
                            path=x.guess_path,
                            fix="give every prediction an answer, or ask only for retrieval metrics")
    if PROVENANCE in needs:
        no_gold = [g.id for g in x.gold if not M.evidence_sets(g.evidence_sets)]
        if no_gold:
            raise UserError(f"{len(no_gold)} gold records have no provenance: {list_ids(no_gold)}",
                            path=x.gold_path, fix="retrieval metrics need gold provenance ids for every record")
    if RETRIEVED in needs and not has_retrieval(x.guesses):
        raise UserError("the predictions hold no retrieved passages (no Z- lines / provenance)",
                        path=x.guess_path,
                        fix="generate with the plugin's provenance output, or drop the retrieval metrics")


def has_retrieval(guesses: Sequence[Guess]) -> bool:
    """Whether any guess lists retrieved passages (a closed-book system's do not)."""
    return any(p.retrieved for p in guesses)


def evaluate(gold: Sequence[GoldExample], guesses: Sequence[Guess], metric_names: Sequence[str],
             passages: Optional[str] = None, guess_path: Optional[str] = None,
             gold_path: Optional[str] = None) -> Dict[str, float]:
    """Score ``guesses`` (aligned with ``gold``) on ``metric_names``; values in percent.

    ``passages`` (a knowledge-source directory or passages file) supplies passage titles and texts
    for ``answer_in_top<K>`` when the guesses carry none. Raises :class:`UserError` when a metric
    cannot be computed from what the files hold (no answers, no provenance, bad FEVER labels).
    """
    x = EvalInputs(gold, guesses, passages, guess_path, gold_path)
    if not gold:
        raise UserError("nothing to evaluate: the gold file holds no records", path=gold_path)
    names = [canonical_metric(n) for n in metric_names]
    check_inputs(x, needs_of(names))
    out: Dict[str, float] = {}
    for name in names:
        metric, number = lookup(name)
        out[name] = round(100.0 * metric.compute(x, number), 4)
    return out


def evaluate_files(gold_path: str, guess_path: str, metric_names: Sequence[str], guess_format: str = "auto",
                   passages: Optional[str] = None,
                   gold: Optional[Sequence[GoldExample]] = None) -> Dict[str, float]:
    """Read ``guess_path`` (and ``gold_path`` unless ``gold`` is given) and :func:`evaluate`."""
    if gold is None:
        gold = read_gold(gold_path)
    guesses = read_guesses(guess_path, gold, guess_format)
    return evaluate(gold, guesses, metric_names, passages=passages, guess_path=guess_path, gold_path=gold_path)

