"""Retriever training losses (Izacard et al. 2022, "Atlas", section 2.2), on tensors.

Each loss trains the retriever's distribution over the K retrieved documents towards a target the
reader provides. The reader's side is always a constant (``detach``): only the retriever's scores,
hence the query encoder, receive gradients. Pure torch, no fairseq import; the criterion calls it
(:mod:`rag_plugin.criterions.retriever_loss`).

Notation as in :mod:`rag_plugin.core.marginalization` (B questions, K documents, T target positions)::

    s[b, k]          retriever logits (the model's doc scores: q.d times --doc-score-scale, or fused)
    p_T(z|x)         = softmax_k(s / T)       the retriever's distribution at temperature T
    seq_lp[b, k]     = log p(y|x,z_k) = sum_t log p(y_t|x,z_k,y<t)   the answer under one document alone
    token_lp[b,k,t]  = log p(y_t|x,z_k,y<t)
    doc_lp[b, k]     = log p(z|x)             the model's prior (T = 1), as the reader marginalises with it

The losses, per question ([B]); KL(p||q) = sum_k p_k (log p_k - log q_k), 0 where p_k = 0:

* ``pdist``  KL(softmax_k(seq_lp) || p_T). Atlas's perplexity distillation: the target is the
  posterior over documents given the answer *under a uniform prior*, p(z|x,y) oc p(y|x,z). (With
  the retriever's own prior in the target, p(z|x,y) oc p_T(z|x) p(y|x,z), the gradient with respect to
  s is exactly EMDR²'s, and for RAG-Sequence at T = 1 exactly the marginal NLL's own: nothing new
  would be learned. The target is independent of the retriever, a true distillation; tested.)
* ``adist``  KL(softmax_k(a) || p_T), ``a[b, k]`` the reader's cross-attention score of document k
  (FiD-KD's aggregated attention, handed in by a reader that computes it).
* ``emdr2``  -log sum_k p_T(z_k|x) p(y|x,z_k) (Atlas's form of EMDR², p(y|x,z) constant). Its
  minimum over the retriever is -log max_k p(y|x,z_k) (all mass on the best document); its gradient
  vanishes when p(y|x,z) is the same for every document (then the value is -log p(y|x,z)).
* ``loop``   KL(softmax_k(-log p(y|x,D\\z_k)) || p_T): leave-one-out perplexity distillation. A
  document whose removal lowers the answer's likelihood most gets the most weight. For RAG readers
  p(y|x,D\\z_k) needs no extra reader pass: it is the reader's own marginal over the other K-1
  documents with the prior renormalised over them (RAG-Sequence:
  sum_{z!=k} p(z|x) p(y|x,z) / sum_{z!=k} p(z|x); RAG-Token: the product over t of the same
  per-token mixture), computed from ``token_lp`` and ``doc_lp`` (the model's prior at T = 1).

With T the retriever's temperature, each KL is minimised (at 0) by s / T = target logits + constant:
T sets the scale of the scores the retriever learns, not what it ranks first. The distillation targets
(pdist, adist, loop) take a temperature of their own, T_t (Atlas's ``temperature_gold``; its example
recipes use 0.01 on both sides): the target is softmax_k(target logits / T_t); T_t < 1 sharpens it
(attention shares in [0, 1] are an almost uniform target at T_t = 1).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = ["LOSSES", "retriever_log_probs", "kl_from_target", "pdist_loss", "adist_loss", "emdr2_loss",
           "leave_one_out_log_likelihood", "loop_loss", "sequence_log_likelihood"]

#: the --retriever-loss choices that train the retriever
LOSSES = ("pdist", "adist", "emdr2", "loop")
NEG_INF = float("-inf")


def _check_scores(doc_scores: Tensor, other: Tensor, name: str) -> None:
    if doc_scores.dim() != 2 or tuple(other.shape[:2]) != tuple(doc_scores.shape):
        raise ValueError(f"doc_scores must be [B,K] and {name} [B,K,...] alike; got {tuple(doc_scores.shape)} "
                         f"and {tuple(other.shape)}")


def _positive(temperature: float) -> float:
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    return float(temperature)


def retriever_log_probs(doc_scores: Tensor, temperature: float = 1.0) -> Tensor:
    """log p_T(z|x) = log_softmax(s / T) over K: [B,K] -> [B,K] (``-inf`` scores stay at probability 0)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    return torch.log_softmax(doc_scores / temperature, dim=-1)


def kl_from_target(target_lp: Tensor, retriever_lp: Tensor) -> Tensor:
    """KL(target || retriever) per row, the target a constant: [B,K], [B,K] -> [B].

    Documents of target probability 0 contribute 0 (whatever the retriever says), with a 0 gradient."""
    target_lp = target_lp.detach()
    zero = torch.isneginf(target_lp)
    safe_t = torch.where(zero, torch.zeros_like(target_lp), target_lp)
    safe_r = torch.where(zero, torch.zeros_like(retriever_lp), retriever_lp)
    terms = safe_t.exp() * (safe_t - safe_r)
    return torch.where(zero, torch.zeros_like(terms), terms).sum(-1)


def _target(logits: Tensor, doc_scores: Tensor) -> Tensor:
    """log_softmax of target logits over K, documents the retriever excludes (score -inf) excluded too."""
    logits = logits.detach().to(doc_scores.dtype)
    logits = logits.masked_fill(torch.isneginf(doc_scores), NEG_INF)
    return torch.log_softmax(logits, dim=-1)


def sequence_log_likelihood(token_lp: Tensor, target_mask: Tensor) -> Tensor:
    """log p(y|x,z) = sum over scored positions of token_lp: [B,K,T], Bool[B,T] -> [B,K]."""
    keep = target_mask.unsqueeze(1)
    return torch.where(keep, token_lp, torch.zeros_like(token_lp)).sum(-1)


def pdist_loss(doc_scores: Tensor, seq_lp: Tensor, temperature: float = 1.0, target_temperature: float = 1.0
               ) -> Tensor:
    """Perplexity distillation: KL(softmax_k(log p(y|x,z_k) / T_t) || p_T(z|x)). [B,K], [B,K] -> [B]."""
    _check_scores(doc_scores, seq_lp, "seq_lp")
    return kl_from_target(_target(seq_lp / _positive(target_temperature), doc_scores),
                          retriever_log_probs(doc_scores, temperature))


def adist_loss(doc_scores: Tensor, attention_scores: Tensor, temperature: float = 1.0,
               target_temperature: float = 1.0) -> Tensor:
    """Attention distillation: KL(softmax_k(a_k / T_t) || p_T(z|x)), ``a`` the reader's cross-attention score per
    document [B,K]. -> [B]."""
    _check_scores(doc_scores, attention_scores, "attention_scores")
    return kl_from_target(_target(attention_scores / _positive(target_temperature), doc_scores),
                          retriever_log_probs(doc_scores, temperature))


def emdr2_loss(doc_scores: Tensor, seq_lp: Tensor, temperature: float = 1.0) -> Tensor:
    """EMDR² as Atlas writes it: -log sum_k p_T(z_k|x) p(y|x,z_k), p(y|x,z) a constant. [B,K], [B,K] -> [B]."""
    _check_scores(doc_scores, seq_lp, "seq_lp")
    retriever_lp = retriever_log_probs(doc_scores, temperature)
    joint = retriever_lp + seq_lp.detach().to(retriever_lp.dtype)
    joint = joint.masked_fill(torch.isneginf(retriever_lp), NEG_INF)  # excluded documents add nothing
    return -torch.logsumexp(joint, dim=-1)


def leave_one_out_log_likelihood(token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor, variant: str) -> Tensor:
    """log p(y | x, D \\ z_k) for each k: the RAG reader's marginal over the other K-1 documents, its prior
    renormalised over them. token_lp [B,K,T], doc_lp [B,K] (finite), target_mask Bool[B,T],
    variant ``sequence`` or ``token``. Returns [B,K] (a constant: no gradient)."""
    _check_scores(doc_lp, token_lp, "token_lp")
    k = doc_lp.size(1)
    if k < 2:
        raise ValueError("leaving one document out needs K >= 2 documents")
    if not bool(torch.isfinite(doc_lp).all()):
        raise ValueError("leave-one-out needs every document's prior finite")
    token_lp, doc_lp = token_lp.detach(), doc_lp.detach()
    drop = torch.eye(k, dtype=torch.bool, device=doc_lp.device)                      # [k (left out), z]
    prior = doc_lp.unsqueeze(1).masked_fill(drop, NEG_INF)                           # [B, k, z]
    norm = torch.logsumexp(prior, dim=-1)                                            # [B, k]
    if variant == "sequence":
        seq = sequence_log_likelihood(token_lp, target_mask)                         # [B, z]
        return torch.logsumexp(prior + seq.unsqueeze(1), dim=-1) - norm
    if variant != "token":
        raise ValueError(f"variant must be 'sequence' or 'token', got {variant!r}")
    keep = target_mask.unsqueeze(1)
    safe = torch.where(keep, token_lp, torch.zeros_like(token_lp))                   # [B, z, T]
    per_t = torch.logsumexp(prior.unsqueeze(-1) + safe.unsqueeze(1), dim=2)          # [B, k, T]
    per_t = per_t - norm.unsqueeze(-1)
    return torch.where(keep, per_t, torch.zeros_like(per_t)).sum(-1)


def loop_loss(doc_scores: Tensor, token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor, variant: str,
              temperature: float = 1.0, loo_lp: Optional[Tensor] = None, target_temperature: float = 1.0) -> Tensor:
    """Leave-one-out perplexity distillation: KL(softmax_k(-log p(y|x,D\\z_k)) || p_T(z|x)). -> [B].

    ``loo_lp``: the leave-one-out log-likelihoods if already computed (else from token_lp, doc_lp)."""
    if loo_lp is None:
        loo_lp = leave_one_out_log_likelihood(token_lp, doc_lp, target_mask, variant)
    _check_scores(doc_scores, loo_lp, "loo_lp")
    return kl_from_target(_target(-loo_lp / _positive(target_temperature), doc_scores),
                          retriever_log_probs(doc_scores, temperature))
