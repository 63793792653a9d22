"""The paper's evaluation metrics, as pure functions.

Every function returns a float in [0, 1]; callers (:mod:`rag_plugin.evaluation.scoring`) report percent.
Per-example functions take one prediction; corpus functions take lists. :func:`per_example`
turns a per-example function into a list of scores and :func:`mean` averages it.

Open-domain QA (Table 1): :func:`normalize_answer`, :func:`exact_match`, :func:`token_f1`
  (SQuAD / KILT normalisation; the maximum over all gold aliases).
Generation (Table 2): :func:`bleu1` (Jeopardy and MS-MARCO "B-1"), :func:`rouge_l` (MS-MARCO
  "R-L"), :func:`sacrebleu_corpus` (MS-MARCO corpus BLEU-4), :func:`distinct_ngram_ratio`
  (Table 5).
  Q-BLEU-1 is *not* implemented; see :func:`bleu1` for why.
Classification (Table 2, FEVER): :func:`label_accuracy` (3-way and 2-way).
Retrieval against gold provenance (KILT): :func:`r_precision`, :func:`recall_at_k`,
  :func:`precision_at_k`, and :func:`answer_in_top_k` (passage texts and titles).
Regular-expression answers (CuratedTrec, ``meta.answer_is_regex``): :func:`regex_exact_match`,
  :func:`regex_token_f1` and ``answer_in_top_k(..., regex=True)``, as DrQA and DPR score them.

Empty input lists raise ``ValueError`` (a caller bug: the readers never produce them).
"""
from __future__ import annotations

import math
import re
import string
import unicodedata
from collections import Counter
from functools import lru_cache
from typing import Callable, Iterable, List, Optional, Sequence, Union

GoldAliases = Union[str, Sequence[str]]

# ============================================================================ normalisation
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD / KILT answer normalisation.

    Lower case, remove ASCII punctuation, remove the articles *a*, *an*, *the* (as whole
    words), collapse runs of whitespace to one space and strip. Only ASCII punctuation is
    removed, as in the official SQuAD and KILT scripts, so scores stay comparable.
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _aliases(golds: GoldAliases) -> List[str]:
    if isinstance(golds, str):
        return [golds]
    golds = list(golds)
    if not golds:
        raise ValueError("no gold answer given")
    return golds


# ============================================================================ QA
def exact_match(pred: str, golds: GoldAliases) -> float:
    """1.0 if the normalised prediction equals any normalised gold alias, else 0.0."""
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in _aliases(golds)))


def _f1_one(pred_tokens: List[str], gold_tokens: List[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # both empty (e.g. "the" vs "a"): a match, as exact_match says; one empty: no overlap
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(pred: str, golds: GoldAliases) -> float:
    """SQuAD token F1 (bag of normalised tokens), the maximum over gold aliases.

    If both sides normalise to nothing the score is 1.0 (consistent with :func:`exact_match`);
    if only one does it is 0.0.
    """
    p = normalize_answer(pred).split()
    return max(_f1_one(p, normalize_answer(g).split()) for g in _aliases(golds))


# ============================================================================ regex answers
#: DrQA's ``regex_match_score`` flags (DPR's ``regex_match`` uses the same).
REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE


@lru_cache(maxsize=65536)
def compile_answer_pattern(pattern: str) -> Optional["re.Pattern"]:
    """``pattern`` compiled with :data:`REGEX_FLAGS`, or None if it is not a valid Python regex."""
    try:
        return re.compile(pattern, REGEX_FLAGS)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


def answer_patterns(meta: dict, answers: Sequence[str]) -> List[str]:
    """The answer patterns of a regex record: ``meta.answer_pattern`` (kept there by
    ``rag-curatedtrec-targets``, which puts concrete strings in the answers), else the
    answers themselves (as ``rag-prepare curatedtrec`` writes them)."""
    kept = meta.get("answer_pattern")
    if kept is None:
        return list(answers)
    return [kept] if isinstance(kept, str) else [str(x) for x in kept]


def _split_patterns(golds: GoldAliases, nfd: bool = False):
    """(compiled patterns, patterns that do not compile)."""
    compiled, literal = [], []
    for g in _aliases(golds):
        c = compile_answer_pattern(unicodedata.normalize("NFD", g) if nfd else g)
        if c is None:
            literal.append(g)
        else:
            compiled.append(c)
    return compiled, literal


def regex_exact_match(pred: str, patterns: GoldAliases) -> float:
    """Exact match against regular-expression answers (CuratedTrec), as DrQA's
    ``regex_match_score`` (which DPR and the RAG paper use for CuratedTrec) defines it:
    1.0 if some pattern, compiled with ``re.IGNORECASE | re.UNICODE | re.MULTILINE``,
    ``.match``-es the prediction as it is (no SQuAD normalisation), else 0.0.

    ``.match`` anchors at the start only, exactly as DrQA's: ``Charles\\s+Flint|Flint`` matches
    ``"charles  flint"`` and also ``"Flint, Michigan"``, but not ``"Mr Flint"``.

    A pattern that does not compile as a Python regex (``rag-prepare curatedtrec`` keeps such
    patterns verbatim and counts them in ``prepare.json``) is matched literally instead: it
    scores like an ordinary alias under :func:`exact_match`. DrQA scores it 0 for every
    prediction; matching the text literally is the more useful reading of a broken pattern.
    """
    compiled, literal = _split_patterns(patterns)
    if any(c.match(pred) is not None for c in compiled):
        return 1.0
    return exact_match(pred, literal) if literal else 0.0


def regex_token_f1(pred: str, patterns: GoldAliases) -> float:
    """Token F1 for regular-expression answers: equal to :func:`regex_exact_match`.

    No token F1 is defined against a pattern (a pattern has no bag of tokens to overlap
    with), so F1 on such records is reported as the regex exact match, 0 or 1.
    """
    return regex_exact_match(pred, patterns)


# ============================================================================ helpers
def per_example(fn: Callable[..., float], preds: Sequence, golds: Sequence, **kwargs) -> List[float]:
    """``[fn(p, g, **kwargs) for p, g in zip(preds, golds)]``, checking the lengths agree."""
    if len(preds) != len(golds):
        raise ValueError(f"{len(preds)} predictions but {len(golds)} gold entries")
    return [fn(p, g, **kwargs) for p, g in zip(preds, golds)]


def mean(values: Iterable[float]) -> float:
    values = list(values)
    if not values:
        raise ValueError("nothing to average")
    return math.fsum(values) / len(values)


def _check_corpus(preds: Sequence, refs: Sequence) -> None:
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} references")
    if not preds:
        raise ValueError("empty corpus")


def _ref_lists(refs: Sequence[GoldAliases]) -> List[List[str]]:
    return [_aliases(r) for r in refs]


# ============================================================================ generation
_TOK13A = []


def _tokenize_13a(text: str, lowercase: bool) -> List[str]:
    """sacrebleu's ``13a`` tokens (as its BLEU preprocesses a segment)."""
    if not _TOK13A:
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a  # start-up: rag-evaluate --help imports metrics

        _TOK13A.append(Tokenizer13a())
    if lowercase:
        text = text.lower()
    return _TOK13A[0](text.rstrip()).split()


def bleu1(preds: Sequence[str], refs: Sequence[GoldAliases], lowercase: bool = True) -> float:
    """Corpus BLEU-1 (the paper's "B-1" for Jeopardy question generation and MS-MARCO).

    Clipped unigram precision over the corpus times the brevity penalty, with several
    references per example allowed (a unigram is clipped to its largest count in any
    reference; the reference length is the closest one, the shorter on ties). Tokens come
    from sacrebleu's ``13a`` tokenizer, lower-cased by default. No smoothing: equal to
    ``sacrebleu.BLEU(max_ngram_order=1, smooth_method="none", lowercase=True)`` / 100.

    **Q-BLEU-1 is not implemented.** The paper reports Q-BLEU-1 (Nema & Khapra, 2018) for
    Jeopardy: ``delta * Answerability + (1 - delta) * BLEU-1``, where Answerability is an
    F-score of weighted precisions/recalls over four kinds of words (question-type words,
    relevant content words, named entities, function words). The weights ``w_i`` and
    ``delta`` are fitted to human judgements per dataset, and the paper uses the
    SQuAD-tuned values; neither paper states those values in a form we could check here,
    and the published reference script differs from the paper's formula (it detects named
    entities by capitalisation, averages per-component F-scores rather than precisions and
    recalls, and uses BLEU-1 with a brevity penalty for each component). Any number we
    produced would therefore not be the metric the paper reports, so we report BLEU-1 only.
    """
    _check_corpus(preds, refs)
    ref_lists = _ref_lists(refs)
    matches = hyp_len = ref_len = 0
    for pred, aliases in zip(preds, ref_lists):
        hyp = _tokenize_13a(pred, lowercase)
        ref_toks = [_tokenize_13a(r, lowercase) for r in aliases]
        max_ref = Counter()
        for rt in ref_toks:
            for tok, c in Counter(rt).items():
                if c > max_ref[tok]:
                    max_ref[tok] = c
        matches += sum(min(c, max_ref[tok]) for tok, c in Counter(hyp).items())
        hyp_len += len(hyp)
        closest = None
        for rt in ref_toks:
            n = len(rt)
            if closest is None or abs(len(hyp) - n) < abs(len(hyp) - closest) or \
                    (abs(len(hyp) - n) == abs(len(hyp) - closest) and n < closest):
                closest = n
        ref_len += closest
    if hyp_len == 0 or matches == 0:
        return 0.0
    bp = 1.0 if hyp_len >= ref_len else math.exp(1.0 - ref_len / hyp_len)
    return bp * matches / hyp_len


_ROUGE = {}


def _rouge_scorer():
    if "L" not in _ROUGE:
        from rouge_score import rouge_scorer  # start-up: ~0.7 s, for ROUGE-L only

        _ROUGE["L"] = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return _ROUGE["L"]


def rouge_l_one(pred: str, golds: GoldAliases) -> float:
    """ROUGE-L F-measure (rouge-score, Porter stemmer on), the maximum over references."""
    scorer = _rouge_scorer()
    return max(scorer.score(ref, pred)["rougeL"].fmeasure for ref in _aliases(golds))


def rouge_l(preds: Sequence[str], refs: Sequence[GoldAliases]) -> float:
    """Mean over examples of :func:`rouge_l_one` (the paper's MS-MARCO "R-L").

    rouge-score's default tokenizer keeps only ``[a-z0-9]`` runs after lower-casing, so text
    without such characters scores 0.
    """
    _check_corpus(preds, refs)
    return mean(per_example(rouge_l_one, preds, refs))


def sacrebleu_corpus(preds: Sequence[str], refs_lists: Sequence[GoldAliases], **bleu_kwargs) -> float:
    """sacrebleu corpus BLEU (default: BLEU-4, ``13a`` tokens, case-sensitive, ``exp``
    smoothing) divided by 100. Examples may have different numbers of references."""
    _check_corpus(preds, refs_lists)
    import sacrebleu  # start-up: for BLEU only

    ref_lists = _ref_lists(refs_lists)
    width = max(len(r) for r in ref_lists)
    streams = [[r[i] if i < len(r) else None for r in ref_lists] for i in range(width)]
    return sacrebleu.BLEU(**bleu_kwargs).corpus_score(list(preds), streams).score / 100.0


def distinct_ngram_ratio(texts: Sequence[str], n: int = 3) -> float:
    """Distinct n-grams / total n-grams across all generations (the paper's Table 5, n=3).

    Tokens are the lower-cased text split on whitespace; n-grams never cross generations.
    Texts shorter than ``n`` tokens contribute no n-grams; 0.0 if there are none at all.
    """
    if n < 1:
        raise ValueError("n must be positive")
    if not texts:
        raise ValueError("empty corpus")
    total = 0
    distinct = set()
    for text in texts:
        toks = text.lower().split()
        for i in range(len(toks) - n + 1):
            distinct.add(tuple(toks[i:i + n]))
            total += 1
    return len(distinct) / total if total else 0.0


# ============================================================================ FEVER
SUPPORTS, REFUTES, NEI = "SUPPORTS", "REFUTES", "NOT ENOUGH INFO"
FEVER_LABELS = (SUPPORTS, REFUTES, NEI)


def normalize_label(label: str) -> str:
    """Upper-case, ``_`` -> space, whitespace collapsed; ``NEI`` -> ``NOT ENOUGH INFO``.

    Anything else is returned as normalised (and then counts as a wrong prediction)."""
    s = " ".join(label.replace("_", " ").upper().split())
    return NEI if s == "NEI" else s


def label_accuracy(preds: Sequence[str], golds: Sequence[str], two_way: bool = False) -> float:
    """FEVER label accuracy.

    3-way (default): the fraction of claims whose predicted label equals the gold label
    (SUPPORTS / REFUTES / NOT ENOUGH INFO, compared after :func:`normalize_label`).

    2-way (``two_way=True``, the paper's FEVER-2): claims whose gold label is NOT ENOUGH INFO
    are **excluded** (the 2-way task is SUPPORTS vs REFUTES on the claims that have one of
    those labels; NEI is not merged into either class). A prediction of NOT ENOUGH INFO, or
    any string that is not a label, on a remaining claim counts as wrong.

    A gold label outside the three raises ``ValueError``; so does a 2-way evaluation with no
    SUPPORTS/REFUTES claim.
    """
    _check_corpus(preds, golds)
    correct = total = 0
    for pred, gold in zip(preds, golds):
        g = normalize_label(gold)
        if g not in FEVER_LABELS:
            raise ValueError(f"gold label {gold!r} is not one of {', '.join(FEVER_LABELS)}")
        if two_way and g == NEI:
            continue
        total += 1
        correct += normalize_label(pred) == g
    if total == 0:
        raise ValueError("no SUPPORTS/REFUTES claim to score 2-way accuracy on")
    return correct / total


# ============================================================================ retrieval
Ids = Sequence[str]
GoldIds = Union[Sequence[str], Sequence[Sequence[str]]]


def evidence_sets(gold_ids: GoldIds) -> List[frozenset]:
    """Gold provenance as a list of distinct, non-empty evidence sets.

    ``gold_ids`` is either a flat list of ids (one evidence set) or a list of lists (several
    alternative sets, one per gold output, as KILT has). Ids are compared as stripped strings.
    """
    items = list(gold_ids)
    if items and all(isinstance(x, str) for x in items):
        groups: List[Iterable[str]] = [items]
    else:
        groups = [[x] if isinstance(x, str) else x for x in items]
    sets: List[frozenset] = []
    for g in groups:
        s = frozenset(str(x).strip() for x in g)
        if s and s not in sets:
            sets.append(s)
    return sets


def _dedup(ids: Ids) -> List[str]:
    seen, out = set(), []
    for x in ids:
        x = str(x).strip()
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def r_precision(retrieved_ids: Ids, gold_ids: GoldIds) -> float:
    """R-precision (KILT): with R the size of a gold evidence set, the fraction of the first R
    distinct retrieved ids that are in it; the maximum over evidence sets. 0.0 if there is no
    gold provenance."""
    sets = evidence_sets(gold_ids)
    if not sets:
        return 0.0
    ranked = _dedup(retrieved_ids)
    return max(sum(x in s for x in ranked[:len(s)]) / len(s) for s in sets)


def _kilt_rank(retrieved_ids: Ids, sets: List[frozenset]) -> List[bool]:
    """Ranking in which each evidence set is one point (KILT's ``get_rank``).

    Walk the retrieved ids in order. An id in no (still incomplete) evidence set is a miss.
    An id in a set moves that set's point to this position; when its last id arrives the
    point becomes a hit. Points of sets still incomplete at the end are misses.
    """
    remaining = [set(s) for s in sets]
    rank: List[object] = []
    for x in retrieved_ids:
        x = str(x).strip()
        found = False
        for i, rem in enumerate(remaining):
            if x in rem:
                found = True
                key = ("set", i)
                if key in rank:
                    rank.remove(key)
                rem.discard(x)
                rank.append(True if not rem else key)
        if not found:
            rank.append(False)
    return [r is True for r in rank]


def recall_at_k(retrieved_ids: Ids, gold_ids: GoldIds, k: int) -> float:
    """Recall@k (KILT): the fraction of gold evidence sets complete within the first k points
    of the KILT ranking (an evidence set is one point, at the position of its last id). For
    single-id evidence sets this is the fraction of gold ids among the top-k retrieved.
    0.0 if there is no gold provenance."""
    if k < 1:
        raise ValueError("k must be positive")
    sets = evidence_sets(gold_ids)
    if not sets:
        return 0.0
    return sum(_kilt_rank(retrieved_ids, sets)[:k]) / len(sets)


def precision_at_k(retrieved_ids: Ids, gold_ids: GoldIds, k: int) -> float:
    """Precision@k (KILT): complete evidence sets within the first k ranking points, over k."""
    if k < 1:
        raise ValueError("k must be positive")
    sets = evidence_sets(gold_ids)
    if not sets:
        return 0.0
    return sum(_kilt_rank(retrieved_ids, sets)[:k]) / k


def answer_in_top_k(passage_texts: Sequence[Optional[str]], golds: GoldAliases, k: int,
                    regex: bool = False, titles: Optional[Sequence[Optional[str]]] = None) -> float:
    """1.0 if a normalised gold alias occurs in any of the first k passages, else 0.0.

    Both sides go through :func:`normalize_answer`; the alias must occur as a whole run of
    tokens (``"paris"`` is in ``"to paris by"`` but not in ``"comparison"``). Aliases that
    normalise to nothing are ignored.

    ``titles`` (parallel to ``passage_texts``): a passage holds the answer when its text or its
    title does. Each field is looked at on its own, so an alias never straddles the end of a
    title and the start of a text. Where the answer is a page's name (an entity whose passage is
    titled by it) the text often does not repeat it: without titles such a hit is missed.

    ``regex=True`` (CuratedTrec): the golds are patterns, and a passage holds the answer when a
    pattern (compiled as in :func:`compile_answer_pattern`) ``.search``-es its text (or title),
    both sides in Unicode NFD, as DPR's ``has_answer`` does with ``match_type="regex"``. A pattern
    that does not compile is looked for as a literal alias, as above (see :func:`regex_exact_match`).
    """
    if k < 1:
        raise ValueError("k must be positive")
    fields = _passage_fields(passage_texts, titles, k)
    if regex:
        compiled, literal = _split_patterns(golds, nfd=True)
        for field in fields:
            nfd = unicodedata.normalize("NFD", field)
            if any(c.search(nfd) is not None for c in compiled):
                return 1.0
        return answer_in_top_k(passage_texts, literal, k, titles=titles) if literal else 0.0  # as aliases
    needles = [f" {a} " for a in (normalize_answer(g) for g in _aliases(golds)) if a]
    for field in fields:
        hay = f" {normalize_answer(field)} "
        if any(n in hay for n in needles):
            return 1.0
    return 0.0


def _passage_fields(passage_texts: Sequence[Optional[str]], titles: Optional[Sequence[Optional[str]]],
                    k: int) -> List[str]:
    """The texts of the first k passages, each followed by its title when one is given."""
    texts = list(passage_texts)[:k]
    if titles is None:
        return [t or "" for t in texts]
    titles = list(titles)
    if len(titles) != len(passage_texts):
        raise ValueError(f"{len(titles)} titles for {len(passage_texts)} passages")
    fields: List[str] = []
    for text, title in zip(texts, titles):
        fields.append(text or "")
        if title:
            fields.append(title)
    return fields
