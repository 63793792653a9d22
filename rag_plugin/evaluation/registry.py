"""The metric registry: every metric registered once, with its name, column label, kind, what it
needs from the inputs and its function; metric names, labels and the task defaults read it.

Metric names (case-insensitive on input; canonical spelling first, then the column label):

* ``em`` (EM): exact match, the maximum over gold aliases (SQuAD normalisation). Records whose
  answers are regular expressions (``meta.answer_is_regex``, CuratedTrec) are scored as DrQA and
  DPR score them: a pattern ``.match``-es the raw prediction (``metrics.regex_exact_match``).
* ``f1`` (F1): token F1, the maximum over gold aliases; for regex records it equals their EM
  (no token F1 is defined against a pattern).
* ``bleu1`` (B-1): corpus BLEU-1, 13a tokens, lower-cased. Not Q-BLEU-1 (see ``metrics.bleu1``).
* ``rougeL`` (R-L): ROUGE-L F (stemmed), the maximum over references, averaged.
* ``bleu`` (BLEU): sacrebleu corpus BLEU-4 with its defaults.
* ``accuracy`` (FVR3): FEVER 3-way label accuracy.
* ``accuracy2`` (FVR2): FEVER 2-way label accuracy (NOT ENOUGH INFO claims excluded).
* ``distinct<N>`` (Dist-N): distinct / total N-grams over all predictions (Table 5: N=3).
* ``rprec`` (R-Prec): KILT R-precision against the gold provenance.
* ``recall@<K>`` (R@K), ``precision@<K>`` (P@K): KILT recall / precision at K.
* ``answer_in_top<K>`` (Ans@K): a gold answer occurs in the text or the title of one of the top-K
  retrieved passages (regex records: a pattern ``.search``-es it, as DPR's ``has_answer``).

Adding a metric is one :func:`register` call: a :class:`Metric` whose function takes the
:class:`~rag_plugin.evaluation.inputs.EvalInputs` and the name's number (``None`` for a fixed
name) and returns a value in [0, 1].
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from rag_plugin.evaluation import metrics as M
from rag_plugin.evaluation.inputs import EvalInputs
from rag_plugin.util.errors import UserError

TEXT, RETRIEVAL = "text", "retrieval"
# what a metric needs from the inputs (checked by scoring.evaluate before any metric runs, or by
# the input's view when the metric reads it)
ANSWERS = "answers"              # every guess has an answer
PROVENANCE = "gold provenance"   # every gold record has provenance ids
RETRIEVED = "retrieved passages"  # the guesses list retrieved passages
PASSAGE_TEXTS = "passage texts"  # titles and texts of retrieved passages (guess file or --passages)
FEVER_LABELS = "FEVER labels"    # every gold record has one FEVER label


@dataclass(frozen=True)
class Metric:
    """One metric. A ``parameter`` (``"N"``, ``"K"``) makes ``name`` a prefix: ``recall@`` with
    parameter ``K`` is spelled ``recall@<K>`` and ``recall@5`` passes 5 to ``compute``; ``label``
    then holds ``{}`` for the number."""

    name: str
    label: str
    kind: str
    needs: FrozenSet[str]
    compute: Callable[[EvalInputs, Optional[int]], float]
    parameter: Optional[str] = None

    @property
    def spelling(self) -> str:
        return f"{self.name}<{self.parameter}>" if self.parameter else self.name


_METRICS: Dict[str, Metric] = {}  # lower-cased name (or prefix) -> metric
_PARAMETERISED = re.compile(r"(?!)")  # matches nothing until a parameterised metric is registered


def register(metric: Metric) -> Metric:
    """Add ``metric`` to the registry; its name (or prefix) must be new."""
    global _PARAMETERISED
    key = metric.name.lower()
    if key in _METRICS:
        raise ValueError(f"metric {metric.name!r} is registered twice")
    if metric.kind not in (TEXT, RETRIEVAL):
        raise ValueError(f"metric {metric.name!r}: kind must be {TEXT!r} or {RETRIEVAL!r}")
    _METRICS[key] = metric
    prefixes = sorted((re.escape(k) for k, m in _METRICS.items() if m.parameter), key=len, reverse=True)
    _PARAMETERISED = re.compile(f"({'|'.join(prefixes)})([0-9]+)", re.ASCII)
    return metric


def known_metrics() -> str:
    """Every metric's spelling, for messages and help texts."""
    return ", ".join(m.spelling for m in _METRICS.values())


def lookup(name: str) -> Tuple[Metric, Optional[int]]:
    """The metric a name spells and its number (``None`` for a fixed name); :class:`UserError` if unknown."""
    key = name.strip().lower()
    metric = _METRICS.get(key)
    if metric is not None and metric.parameter is None:
        return metric, None
    m = _PARAMETERISED.fullmatch(key)
    if m and int(m.group(2)) >= 1:
        return _METRICS[m.group(1)], int(m.group(2))
    raise UserError(f"unknown metric {name.strip()!r}", fix=f"use one of: {known_metrics()}")


def canonical_metric(name: str) -> str:
    """The canonical spelling of a metric name; :class:`UserError` if unknown."""
    metric, number = lookup(name)
    return metric.name if number is None else f"{metric.name}{number}"


def parse_metrics(spec) -> List[str]:
    """``"em,f1"`` or ``["em", "f1"]`` -> canonical names, duplicates dropped, order kept."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: List[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UserError(f"metric names must be strings, got {item!r}", fix=f"use: {known_metrics()}")
        if not item.strip():
            continue
        name = canonical_metric(item)
        if name not in out:
            out.append(name)
    if not out:
        raise UserError("no metric given", fix=f"pass --metrics with some of: {known_metrics()}")
    return out


def metric_label(name: str) -> str:
    """Column header for a metric (the paper's abbreviations); a name not registered is its own label."""
    try:
        metric, number = lookup(name)
    except UserError:
        return name
    return metric.label.format(number) if number is not None else metric.label


# ================================================================================== the metrics
def _em(x: EvalInputs, _: None) -> float:
    return M.mean(x.qa_scores(M.exact_match, M.regex_exact_match))


def _f1(x: EvalInputs, _: None) -> float:
    return M.mean(x.qa_scores(M.token_f1, M.regex_token_f1))


def _accuracy2(x: EvalInputs, _: None) -> float:
    if all(label == M.NEI for label in x.fever_labels):
        raise UserError("no SUPPORTS or REFUTES claim for 2-way accuracy", path=x.gold_path,
                        fix="drop accuracy2: every claim is NOT ENOUGH INFO")
    return M.label_accuracy(x.predictions, x.fever_labels, two_way=True)


def _ranked(fn: Callable[..., float], name: str) -> Callable[[EvalInputs, int], float]:
    """A KILT rank metric at cutoff k, averaged over examples."""
    def compute(x: EvalInputs, k: int) -> float:
        x.warn_beyond_retrieved(f"{name}{k}", k)
        return M.mean(fn(docs, g.evidence_sets, k) for g, docs in zip(x.gold, x.documents))
    return compute


def _answer_in_top(x: EvalInputs, k: int) -> float:
    return M.mean(M.answer_in_top_k(texts, g.patterns if g.is_regex else g.answers, k, regex=g.is_regex,
                                    titles=titles) for g, (titles, texts) in zip(x.gold, x.top_passages(k)))


_TEXT = frozenset({ANSWERS})
_RANKS = frozenset({PROVENANCE, RETRIEVED})
register(Metric("em", "EM", TEXT, _TEXT, _em))
register(Metric("f1", "F1", TEXT, _TEXT, _f1))
register(Metric("bleu1", "B-1", TEXT, _TEXT, lambda x, _: M.bleu1(x.predictions, x.references)))
register(Metric("rougeL", "R-L", TEXT, _TEXT, lambda x, _: M.rouge_l(x.predictions, x.references)))
register(Metric("bleu", "BLEU", TEXT, _TEXT, lambda x, _: M.sacrebleu_corpus(x.predictions, x.references)))
register(Metric("accuracy", "FVR3", TEXT, _TEXT | {FEVER_LABELS},
                lambda x, _: M.label_accuracy(x.predictions, x.fever_labels)))
register(Metric("accuracy2", "FVR2", TEXT, _TEXT | {FEVER_LABELS}, _accuracy2))
register(Metric("distinct", "Dist-{}", TEXT, _TEXT, lambda x, n: M.distinct_ngram_ratio(x.predictions, n),
                parameter="N"))
register(Metric("rprec", "R-Prec", RETRIEVAL, _RANKS,
                lambda x, _: M.mean(M.r_precision(d, g.evidence_sets) for g, d in zip(x.gold, x.documents))))
register(Metric("recall@", "R@{}", RETRIEVAL, _RANKS, _ranked(M.recall_at_k, "recall@"), parameter="K"))
register(Metric("precision@", "P@{}", RETRIEVAL, _RANKS, _ranked(M.precision_at_k, "precision@"), parameter="K"))
register(Metric("answer_in_top", "Ans@{}", RETRIEVAL, _RANKS | {PASSAGE_TEXTS}, _answer_in_top, parameter="K"))


# ================================================================================== task defaults
TASK_DEFAULTS: Dict[str, List[str]] = {
    "qa": ["em", "f1"],  # Table 1 (open-domain QA): EM; F1 as KILT reports it
    "jeopardy": ["bleu1", "distinct3"],  # Table 2 (B-1; Q-BLEU-1 is not implemented), Table 5
    "msmarco": ["rougeL", "bleu1", "bleu", "distinct3"],  # Table 2 (R-L, B-1), corpus BLEU, Table 5
    "fever": ["accuracy", "accuracy2"],  # Table 2 (FVR3, FVR2 label accuracy)
}
TASKS = tuple(TASK_DEFAULTS)


def default_metrics(task: Optional[str]) -> List[str]:
    """The paper's metrics for ``task`` (``None``: open-domain QA's)."""
    if task is None:
        return list(TASK_DEFAULTS["qa"])
    if task not in TASK_DEFAULTS:
        raise UserError(f"unknown task {task!r}", fix=f"use one of {', '.join(TASKS)}")
    return list(TASK_DEFAULTS[task])
