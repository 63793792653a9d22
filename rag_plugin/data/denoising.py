"""Denoising data for pretraining a generator from scratch (BART's objective, in miniature).

No pretrained seq2seq model ships offline, so the demo pretrains its tiny generator the way
BART was pretrained: reconstruct a passage from a corrupted copy (word deletion and span
deletion), which teaches the decoder to copy from its input. The records are KILT-style
(``input`` = corrupted passage, ``output`` = original), trained closed-book (``--n-docs 0``)
with the same task, and the checkpoint initialises RAG models via ``--generator-checkpoint``.
"""
import random
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


def pseudo_question_records(passages: Iterable[Passage], seed: int = 0, window: int = 30,
                            per_passage: int = 2) -> List[dict]:
    """Self-supervised questions about each passage, answered *from the retrieved passage*.

    Two kinds, half each (the second stage of the demo's pretraining, trained retrieval-augmented
    with one document, so the generator learns to read its document rather than to recall):

    - title (the inverse cloze task of ORQA): a run of 6-10 words of the passage -> its title;
    - continuation: 3-8 consecutive words of the passage -> the 1-4 words that follow them.

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
                n, m = rng.randint(3, 8), rng.randint(1, 4)
                start = rng.randrange(max(1, len(words) - n - m + 1))
                question = " ".join(words[start:start + n])
                answer, kind = " ".join(words[start + n:start + n + m]), "continuation"
                if not answer:
                    continue
            records.append({"id": f"pseudo:{kind}:{p.id}:{j}", "input": question,
                            "output": [{"answer": answer, "provenance": [{"id": p.id, "wikipedia_id": p.id,
                                                                           "title": p.title}]}]})
    rng.shuffle(records)
    return records
