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
