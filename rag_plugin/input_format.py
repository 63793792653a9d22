"""The generator's input for one (question, document) pair: the single definition.

    <s> question </s> title </s> passage </s>

built from pre-tokenized ids, at most ``max_len`` tokens. The passage is cut at its end so
the question is never cut (unless the question alone exceeds the budget, in which case it is
truncated, with a warning, keeping room for nothing else). With no document (closed book):
``<s> question </s>``.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)
_warned = {"question": False}


def pair_input(question: np.ndarray, title: Optional[np.ndarray], text: Optional[np.ndarray],
               bos: int, eos: int, max_len: int) -> np.ndarray:
    q = question
    if len(q) + 2 > max_len:
        if not _warned["question"]:
            logger.warning("a question of %d tokens exceeds the generator's %d positions: truncated",
                           len(q), max_len)
            _warned["question"] = True
        q = q[: max_len - 2]
    parts = [np.array([bos], dtype=np.int64), q.astype(np.int64, copy=False), np.array([eos], dtype=np.int64)]
    if title is not None:
        budget = max_len - (len(q) + 2)
        title = title[: max(0, budget - 2)]
        budget -= len(title) + 1
        if budget > 1:
            parts += [title.astype(np.int64, copy=False), np.array([eos], dtype=np.int64),
                      text[: budget - 1].astype(np.int64, copy=False), np.array([eos], dtype=np.int64)]
    return np.concatenate(parts)


def batch_inputs(questions: Sequence[np.ndarray], docs: Optional[Sequence[Sequence[tuple]]],
                 bos: int, eos: int, pad: int, max_len: int):
    """Generator inputs for B questions x K documents, question-major.

    ``docs[b][k] = (title_ids, text_ids)``; ``docs=None`` gives closed-book inputs.
    Returns ``src_tokens`` Long[B*K, S] (right-padded) and ``src_lengths`` Long[B*K].
    """
    rows: List[np.ndarray] = []
    for b, q in enumerate(questions):
        if docs is None:
            rows.append(pair_input(q, None, None, bos, eos, max_len))
        else:
            rows.extend(pair_input(q, t, x, bos, eos, max_len) for t, x in docs[b])
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.from_numpy(r)
    return out, lengths
