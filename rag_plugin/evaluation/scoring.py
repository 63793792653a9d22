"""Metric names, per-task defaults, and evaluation of aligned gold/guess lists.

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
* ``answer_in_top<K>`` (Ans@K): a gold answer occurs in one of the top-K retrieved passages
  (regex records: a pattern ``.search``-es a passage, as DPR's ``has_answer``).

Every value is reported in percent (the metric's [0, 1] value times 100, rounded to 4
decimals), as the paper reports EM, BLEU, ROUGE, accuracy and the distinct-n-gram ratio and
KILT reports retrieval.
"""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from rag_plugin.util.errors import UserError
from rag_plugin.evaluation import metrics as M
from rag_plugin.evaluation.readers import GoldExample, Guess, MAX_LISTED, passage_texts

TASK_DEFAULTS: Dict[str, List[str]] = {
    "qa": ["em", "f1"],  # Table 1 (open-domain QA): EM; F1 as KILT reports it
    "jeopardy": ["bleu1", "distinct3"],  # Table 2 (B-1; Q-BLEU-1 is not implemented), Table 5
    "msmarco": ["rougeL", "bleu1", "bleu", "distinct3"],  # Table 2 (R-L, B-1), corpus BLEU, Table 5
    "fever": ["accuracy", "accuracy2"],  # Table 2 (FVR3, FVR2 label accuracy)
}
TASKS = tuple(TASK_DEFAULTS)

_FIXED = {"em": "em", "f1": "f1", "bleu1": "bleu1", "rougel": "rougeL", "bleu": "bleu",
          "accuracy": "accuracy", "accuracy2": "accuracy2", "rprec": "rprec"}
_PARAM = re.compile(r"(distinct|recall@|precision@|answer_in_top)([0-9]+)", re.ASCII)
KNOWN = ("em, f1, bleu1, rougeL, bleu, accuracy, accuracy2, distinct<N>, rprec, recall@<K>, "
         "precision@<K>, answer_in_top<K>")
TEXT_METRICS = ("em", "f1", "bleu1", "rougeL", "bleu", "accuracy", "accuracy2", "distinct")
RETRIEVAL_METRICS = ("rprec", "recall@", "precision@", "answer_in_top")

_LABELS = {"em": "EM", "f1": "F1", "bleu1": "B-1", "rougeL": "R-L", "bleu": "BLEU",
           "accuracy": "FVR3", "accuracy2": "FVR2", "rprec": "R-Prec"}
_PARAM_LABELS = {"distinct": "Dist-{}", "recall@": "R@{}", "precision@": "P@{}", "answer_in_top": "Ans@{}"}


def canonical_metric(name: str) -> str:
    """The canonical spelling of a metric name; :class:`UserError` if unknown."""
    key = name.strip().lower()
    if key in _FIXED:
        return _FIXED[key]
    m = _PARAM.fullmatch(key)
    if m and int(m.group(2)) >= 1:
        return f"{m.group(1)}{int(m.group(2))}"
    raise UserError(f"unknown metric {name.strip()!r}", fix=f"use one of: {KNOWN}")


def parse_metrics(spec) -> List[str]:
    """``"em,f1"`` or ``["em", "f1"]`` -> canonical names, duplicates dropped, order kept."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: List[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UserError(f"metric names must be strings, got {item!r}", fix=f"use: {KNOWN}")
        if not item.strip():
            continue
        name = canonical_metric(item)
        if name not in out:
            out.append(name)
    if not out:
        raise UserError("no metric given", fix=f"pass --metrics with some of: {KNOWN}")
    return out


def default_metrics(task: Optional[str]) -> List[str]:
    if task is None:
        return list(TASK_DEFAULTS["qa"])
    if task not in TASK_DEFAULTS:
        raise UserError(f"unknown task {task!r}", fix=f"use one of {', '.join(TASKS)}")
    return list(TASK_DEFAULTS[task])


def metric_label(name: str) -> str:
    """Column header for a metric (the paper's abbreviations)."""
    if name in _LABELS:
        return _LABELS[name]
    m = _PARAM.fullmatch(name)
    if m:
        return _PARAM_LABELS[m.group(1)].format(m.group(2))
    return name


def _param(name: str) -> int:
    return int(_PARAM.fullmatch(name).group(2))


def _ids(items) -> str:
    ids = list(items)
    shown = ", ".join(repr(i) for i in ids[:MAX_LISTED])
    return shown + (f" and {len(ids) - MAX_LISTED} more" if len(ids) > MAX_LISTED else "")


# ================================================================================== evaluate
def evaluate(gold: Sequence[GoldExample], guesses: Sequence[Guess], metric_names: Sequence[str],
             passages: Optional[str] = None, guess_path: Optional[str] = None,
             gold_path: Optional[str] = None) -> Dict[str, float]:
    """Score ``guesses`` (aligned with ``gold``) on ``metric_names``; values in percent.

    ``passages`` (a knowledge-source directory or passages file) supplies passage texts for
    ``answer_in_top<K>`` when the guesses carry none. Raises :class:`UserError` when a metric
    cannot be computed from what the files hold (no answers, no provenance, bad FEVER labels).
    """
    if len(gold) != len(guesses) or any(g.id != p.id for g, p in zip(gold, guesses)):
        raise ValueError("guesses are not aligned with the gold examples")
    if not gold:
        raise UserError("nothing to evaluate: the gold file holds no records", path=gold_path)
    names = [canonical_metric(n) for n in metric_names]

    if any(n.startswith(TEXT_METRICS) for n in names):
        no_answer = [p.id for p in guesses if p.answer is None]
        if no_answer:
            raise UserError(f"{len(no_answer)} predictions have no 'answer': {_ids(no_answer)}",
                            path=guess_path, fix="give every prediction an answer, or ask only for retrieval metrics")
    if any(n.startswith(RETRIEVAL_METRICS) for n in names):
        no_gold = [g.id for g in gold if not M.evidence_sets(g.evidence_sets)]
        if no_gold:
            raise UserError(f"{len(no_gold)} gold records have no provenance: {_ids(no_gold)}",
                            path=gold_path, fix="retrieval metrics need gold provenance ids for every record")
        if not any(p.retrieved for p in guesses):
            raise UserError("the predictions hold no retrieved passages (no Z- lines / provenance)",
                            path=guess_path,
                            fix="generate with the plugin's provenance output, or drop the retrieval metrics")

    docs = guesses  # retrieved passages as the documents gold provenance names (R-precision, recall, precision)
    if any(n.startswith(RETRIEVAL_METRICS) for n in names):
        split = split_from_documents([p.retrieved for p in guesses], [g.evidence_sets for g in gold])
        docs = [replace(p, retrieved=document_ids(p.retrieved, g.evidence_sets, split)) for g, p in zip(gold, guesses)]
    preds = [p.answer for p in guesses]
    refs = [g.answers for g in gold]
    out: Dict[str, float] = {}
    longest = max((len(p.retrieved) for p in guesses), default=0)
    for name in names:
        if name.startswith(("recall@", "precision@")) and _param(name) > longest:
            print(f"warning: {name} looks at {_param(name)} passages, and no prediction in {guess_path or 'the guesses'} "
                  f"retrieved more than {longest}: the missing ranks count as misses", file=sys.stderr)
        if name == "em":
            value = M.mean(_qa_scores(M.exact_match, M.regex_exact_match, preds, gold))
        elif name == "f1":
            value = M.mean(_qa_scores(M.token_f1, M.regex_token_f1, preds, gold))
        elif name == "bleu1":
            value = M.bleu1(preds, refs)
        elif name == "rougeL":
            value = M.rouge_l(preds, refs)
        elif name == "bleu":
            value = M.sacrebleu_corpus(preds, refs)
        elif name in ("accuracy", "accuracy2"):
            labels = _fever_labels(gold, gold_path)
            if name == "accuracy2" and all(label == M.NEI for label in labels):
                raise UserError("no SUPPORTS or REFUTES claim for 2-way accuracy", path=gold_path,
                                fix="drop accuracy2: every claim is NOT ENOUGH INFO")
            value = M.label_accuracy(preds, labels, two_way=name == "accuracy2")
        elif name.startswith("distinct"):
            value = M.distinct_ngram_ratio(preds, _param(name))
        elif name == "rprec":
            value = M.mean(M.r_precision(p.retrieved, g.evidence_sets) for g, p in zip(gold, docs))
        elif name.startswith("recall@"):
            k = _param(name)
            value = M.mean(M.recall_at_k(p.retrieved, g.evidence_sets, k) for g, p in zip(gold, docs))
        elif name.startswith("precision@"):
            k = _param(name)
            value = M.mean(M.precision_at_k(p.retrieved, g.evidence_sets, k) for g, p in zip(gold, docs))
        elif name.startswith("answer_in_top"):
            k = _param(name)
            texts = _top_texts(guesses, k, passages, guess_path)
            value = M.mean(M.answer_in_top_k(texts[p.id], g.patterns if g.is_regex else g.answers, k,
                                             regex=g.is_regex) for g, p in zip(gold, guesses))
        else:  # pragma: no cover - canonical_metric admits nothing else
            raise AssertionError(name)
        out[name] = round(100.0 * value, 4)
    return out


def _qa_scores(plain, regex, preds: Sequence[str], gold: Sequence[GoldExample]) -> List[float]:
    """Per-example QA scores: ``regex(pred, patterns)`` for regex records (CuratedTrec), else
    ``plain(pred, answers)``."""
    return [regex(p, g.patterns) if g.is_regex else plain(p, g.answers) for p, g in zip(preds, gold)]


def _split_base(pid: str) -> Optional[str]:
    """``<id>`` of a passage id ``<id>_<n>`` (scripts/build_knowledge_source.py --split-words), else None."""
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

    A passage split from a document (``<id>_<n>``, scripts/build_knowledge_source.py
    --split-words) stands for its document ``<id>`` when gold provenance names the document.
    ``split_documents`` (the collection is split throughout: :func:`split_from_documents`): every
    ``<id>_<n>`` stands for ``<id>``, gold or not, so that two passages of one wrong document take
    one rank, as pages do in KILT's page-level ranking. Otherwise only the gold documents' passages
    are merged (an id like ``Apollo_11`` may be a document of its own).
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


def _fever_labels(gold: Sequence[GoldExample], gold_path: Optional[str]) -> List[str]:
    labels = []
    for g in gold:
        norm = {M.normalize_label(a) for a in g.answers}
        if len(norm) != 1:
            raise UserError(f"record {g.id!r} has several different labels {sorted(norm)}",
                            path=gold_path, line=g.line, fix="give each FEVER claim one label")
        (label,) = norm
        if label not in M.FEVER_LABELS:
            raise UserError(f"record {g.id!r}: {g.answers[0]!r} is not a FEVER label", path=gold_path,
                            line=g.line, fix=f"labels are {', '.join(M.FEVER_LABELS)} (use --task fever on FEVER data)")
        labels.append(label)
    return labels


def _top_texts(guesses: Sequence[Guess], k: int, passages: Optional[str],
               guess_path: Optional[str]) -> Dict[str, List[Optional[str]]]:
    need = {pid for p in guesses for pid, t in zip(p.retrieved[:k], p.passage_texts[:k]) if t is None}
    if need and passages is None:
        raise UserError(f"answer_in_top{k} needs passage texts, and {len(need)} retrieved passages "
                        f"have none in the guess file (e.g. {_ids(sorted(need))})", path=guess_path,
                        fix="pass --passages with the knowledge-source directory or passages file")
    lookup = passage_texts(passages, need) if need else {}
    return {p.id: [t if t is not None else lookup[pid]
                   for pid, t in zip(p.retrieved[:k], p.passage_texts[:k])] for p in guesses}


def evaluate_files(gold_path: str, guess_path: str, metric_names: Sequence[str], guess_format: str = "auto",
                   passages: Optional[str] = None,
                   gold: Optional[Sequence[GoldExample]] = None) -> Dict[str, float]:
    """Read ``guess_path`` (and ``gold_path`` unless ``gold`` is given) and :func:`evaluate`."""
    from rag_plugin.evaluation.readers import read_gold, read_guesses

    if gold is None:
        gold = read_gold(gold_path)
    guesses = read_guesses(guess_path, gold, guess_format)
    return evaluate(gold, guesses, metric_names, passages=passages, guess_path=guess_path, gold_path=gold_path)
