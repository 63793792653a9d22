"""Denoising data for pretraining a generator from scratch (BART's objective, in miniature).

No pretrained seq2seq model ships offline, so the demo pretrains its tiny generator the way
BART was pretrained: reconstruct a passage from a corrupted copy (word deletion and span
deletion), which teaches the decoder to copy from its input. The records are KILT-style
(``input`` = corrupted passage, ``output`` = original), trained closed-book (``--n-docs 0``)
with the same task, and the checkpoint initialises RAG models via ``--generator-checkpoint``.
"""
import random
import re
from typing import Iterable, List

from rag_plugin.retrieval.passages import Passage


def corrupt(words: List[str], rng: random.Random, deletion: float = 0.15, span: int = 3) -> List[str]:
    """Delete each word with probability ``deletion``, and one span of up to ``span`` words."""
    kept = [w for w in words if rng.random() >= deletion] or words[:1]
    if len(kept) > span + 2:
        start = rng.randrange(len(kept) - span)
        del kept[start:start + rng.randint(1, span)]
    return kept


def denoising_records(passages: Iterable[Passage], seed: int = 0, max_words: int = 32) -> List[dict]:
    """One record per passage: input "title. corrupted text", output "title. text" (first words)."""
    rng = random.Random(seed)
    records = []
    for p in passages:
        words = p.text.split()[:max_words]
        if len(words) < 4:
            continue
        target = f"{p.title}. {' '.join(words)}" if p.title else " ".join(words)
        source = f"{p.title}. {' '.join(corrupt(words, rng))}" if p.title else " ".join(corrupt(words, rng))
        records.append({"id": f"denoise:{p.id}", "input": source, "output": [{"answer": target}]})
    rng.shuffle(records)
    return records


_CLAUSE_END = re.compile(r"[,;:.!?)\]\"]+$")
_OPENING = re.compile(r"^[(\[\"]+")


def clause_start(words: List[str], max_words: int = 4) -> str:
    """The first words of ``words`` up to the end of their clause (at most ``max_words``), the
    closing punctuation (and opening brackets or quotes) dropped; "" when the first word is only
    punctuation."""
    out = []
    for w in words[:max_words]:
        stripped = _OPENING.sub("", _CLAUSE_END.sub("", w))
        if stripped:
            out.append(stripped)
        if _CLAUSE_END.search(w) or not stripped:
            break
    return " ".join(out)


def pseudo_question_records(passages: Iterable[Passage], seed: int = 0, window: int = 30,
                            per_passage: int = 2) -> List[dict]:
    """Self-supervised questions about each passage, answered *from the retrieved passage*.

    Two kinds, half each (the second stage of the demo's pretraining, trained retrieval-augmented
    with one document, so the generator learns to read its document rather than to recall):

    - title (the inverse cloze task of ORQA): a run of 6-10 words of the passage -> its title;
    - continuation: ``What comes after "<3-8 consecutive words>"?`` -> the words that follow them,
      up to the end of their clause (the first word ending in , ; : . ! ? or a closing bracket,
      that punctuation dropped) and at most 4 words. The question says which kind it is, and the
      answer stops where the passage says, so the generator can learn both from the document:
      a title-only model is what it learns when the two kinds look alike. It is the skill a
      factoid question needs ("Its capital is Lobamba." -> "Lobamba").

    Only the first ``window`` words are used: what the generator sees of a passage after the
    question and title is cut to its positions. Provenance is the passage itself.
    """
    rng = random.Random(seed)
    records = []
    for p in passages:
        words = p.text.split()[:window]
        if len(words) < 8:
            continue
        for j in range(per_passage):
            if j % 2 == 0 and p.title:
                n = rng.randint(6, 10)
                start = rng.randrange(max(1, len(words) - n + 1))
                question, answer, kind = " ".join(words[start:start + n]), p.title, "title"
            else:
                n = rng.randint(3, 8)
                start = rng.randrange(max(1, len(words) - n))
                span, answer = words[start:start + n], clause_start(words[start + n:])
                if not answer:
                    continue
                question, kind = f'What comes after "{" ".join(span)}"?', "continuation"
            records.append({"id": f"pseudo:{kind}:{p.id}:{j}", "input": question,
                            "output": [{"answer": answer, "provenance": [{"id": p.id, "wikipedia_id": p.id,
                                                                           "title": p.title}]}]})
    rng.shuffle(records)
    return records
