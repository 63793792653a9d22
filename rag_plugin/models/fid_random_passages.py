"""Mixed-quality contexts for training Fusion-in-Decoder (``--fid-random-passages P``; Akimoto et al., EMNLP Findings
2023: a FiD trained only on good retrieval overfits to its quality; training contexts of mixed quality restore it).

In training only, with probability P per question, the lowest-ranked of its K retrieved passages is replaced by a
passage drawn uniformly from the store among those not already in its K. Its logit of p(z|x) is what the first
stage would have given it where the retriever can score any passage: dense retrieval, ``scale * q . d(z)`` from the
stored vector (differentiable in q like the others); otherwise (BM25, hybrid fusion, rows the batch forces) the
minimum of the question's K logits minus :data:`RANDOM_LOGIT_MARGIN`. The draws use torch's default generator, which
fairseq seeds per update (``--seed``), so runs reproduce; P = 0 draws nothing.
"""
from typing import List, Optional, Tuple

import numpy as np
import torch

from rag_plugin.core.scores import inner_products
from rag_plugin.retrieval.retriever import DenseRetriever

#: a random passage's logit below the question's weakest retrieved one where the retriever cannot score it
RANDOM_LOGIT_MARGIN = 1.0


def draw_outside(n: int, excluded: List[int]) -> Optional[int]:
    """A row drawn uniformly from ``range(n)`` minus ``excluded`` (None when nothing is left)."""
    banned = sorted(set(int(e) for e in excluded if 0 <= int(e) < n))
    if n - len(banned) < 1:
        return None
    row = int(torch.randint(n - len(banned), (1,)))
    for e in banned:  # the u-th row of the complement
        if row >= e:
            row += 1
    return row


def mix_random_passages(doc_scores: torch.Tensor, rows: torch.Tensor, p: float, n_passages: int,
                        retriever=None, queries: Optional[torch.Tensor] = None,
                        scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(doc_scores [B, K], rows Long[B, K]) with, for each question drawn with probability ``p``, its last passage
    replaced by a random one. ``retriever``/``queries`` [B, D]/``scale``: a dense retriever and the query vectors that
    scored the batch (the random passage scored ``scale * q . d``), or None (the margin rule)."""
    if p <= 0:
        return doc_scores, rows
    drawn = torch.rand(rows.size(0)) < p
    chosen, new_rows = [], []
    for i in drawn.nonzero().flatten().tolist():
        row = draw_outside(n_passages, rows[i].tolist())
        if row is not None:
            chosen.append(i)
            new_rows.append(row)
    if not chosen:
        return doc_scores, rows
    index = torch.tensor(chosen, dtype=torch.long)
    rows = rows.clone()
    rows[index.to(rows.device), -1] = torch.tensor(new_rows, dtype=rows.dtype, device=rows.device)
    index = index.to(doc_scores.device)
    if isinstance(retriever, DenseRetriever) and queries is not None:
        d = torch.from_numpy(retriever.doc_vectors(np.asarray(new_rows, dtype=np.int64))).to(queries.device)
        logits = inner_products(d.unsqueeze(1), queries.index_select(0, index.to(queries.device)), scale).squeeze(1)
    else:
        logits = doc_scores.index_select(0, index).min(1).values - RANDOM_LOGIT_MARGIN
    last = doc_scores[:, -1].index_put((index,), logits.to(doc_scores.dtype))
    return torch.cat([doc_scores[:, :-1], last.unsqueeze(1)], dim=1), rows


class QueryVectors:
    """``with QueryVectors(query_encoder) as q: ...``: ``q.value``, the encoder's last output in the block (the
    query vectors [B, D] that retrieval scored with; None when it did not run). The hook is removed on exit."""

    def __init__(self, encoder):
        self.encoder, self.value, self._handle = encoder, None, None

    def _keep(self, module, args, output):
        self.value = output

    def __enter__(self):
        if self.encoder is not None:
            self._handle = self.encoder.register_forward_hook(self._keep)
        return self

    def __exit__(self, *exc):
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        return False
