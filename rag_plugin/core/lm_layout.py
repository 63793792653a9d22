"""The decoder-only reader's rows: the single definition of what a language model reads for one (question, passage).

One row per (question, passage) pair, the passage first (REPLUG's and RA-DIT's order: the passage is a prefix of
the LM's own text)::

    </s> title </s> passage </s> question | </s> answer </s>
    \\____________ context _____________/   \\__ the target's decoder input and target (target_layout) __/

``</s>`` is the separator: fairseq's language models start (and end) every sequence with it, and a converted GPT-2's
``</s>`` *is* ``<|endoftext|>``. The context ends with the question; the answer's decoder start (``</s>``, as in every
plugin target) follows it, so the teacher-forced row is ``context + prev_output_tokens`` and the logits at the answer's
positions are the generator's ``[T, V]`` of an encoder-decoder reader: the criterion and the marginalisation of
:mod:`rag_plugin.core.marginalization` read them unchanged. Closed book (no passage): ``</s> question``.

Length: a context holds at most ``budget`` tokens (the model's ``--max-source-positions``, and no more than the LM's
positions leave beside ``--max-target-positions`` for the answer). A passage that does not fit is cut from its end
(its text first, then its title); the question and the answer are never cut, and a question that does not fit even
alone is a one-line error.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from rag_plugin.util.errors import UserError


def lm_context(question: np.ndarray, title: Optional[np.ndarray], text: Optional[np.ndarray], eos: int,
               budget: int) -> np.ndarray:
    """The context of one pair (the module docstring), at most ``budget`` tokens."""
    q = np.asarray(question, dtype=np.int64)
    if len(q) + 1 > budget:
        raise UserError(f"a question of {len(q)} tokens does not fit the decoder-only reader's context of {budget} "
                        f"tokens (with its separator)",
                        fix="raise --max-source-positions (within the LM's positions less --max-target-positions), "
                            "or shorten the question")
    sep = np.array([eos], dtype=np.int64)
    if title is None:
        return np.concatenate([sep, q])
    room = budget - len(q) - 2  # </s> passage </s> question (the passage: title </s> text)
    passage = np.concatenate([np.asarray(title, dtype=np.int64), sep, np.asarray(text, dtype=np.int64)])
    if room < len(passage):
        passage = passage[: max(room, 0)]
    if len(passage) == 0:
        return np.concatenate([sep, q])  # no room for any of the passage
    return np.concatenate([sep, passage, sep, q])


def lm_contexts(questions: Sequence[np.ndarray], docs: Optional[Sequence[Sequence[Tuple[np.ndarray, np.ndarray]]]],
                eos: int, pad: int, budget: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Contexts of B questions x K passages, question-major: ``tokens`` Long[B*K, C] right-padded and
    ``lengths`` Long[B*K]. ``docs[b][k] = (title_ids, text_ids)``; ``docs=None``: closed book (one row each)."""
    rows: List[np.ndarray] = []
    for b, q in enumerate(questions):
        if docs is None:
            rows.append(lm_context(q, None, None, eos, budget))
        else:
            rows.extend(lm_context(q, title, text, eos, budget) for title, text in docs[b])
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    out = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.from_numpy(r)
    return out, lengths


def packed_rows(contexts: torch.Tensor, lengths: torch.Tensor, prev: torch.Tensor, pad: int):
    """Each context followed at once by its decoder input: ``tokens`` Long[N, C+T] (right-padded), the positions
    ``answer_at`` Long[N, T] where the decoder input's tokens sit (and the logits of the target are read)."""
    n, c = contexts.shape
    t = prev.size(1)
    col = torch.arange(c + t, device=contexts.device).unsqueeze(0)            # [1, C+T]
    length = lengths.to(contexts.device).unsqueeze(1)                          # [N, 1]
    in_context = col < length
    from_prev = (col >= length) & (col < length + t)
    ctx = contexts.gather(1, col.clamp(max=c - 1).expand(n, -1))
    nxt = prev.gather(1, (col - length).clamp(min=0, max=t - 1))
    tokens = torch.where(in_context, ctx, torch.where(from_prev, nxt, torch.full_like(ctx, pad)))
    answer_at = length + torch.arange(t, device=contexts.device).unsqueeze(0)  # [N, T]
    return tokens, answer_at
