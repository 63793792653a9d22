"""The two RAG marginals (Lewis et al. 2020, section 2.1), in log space.

This module is the single place where the paper's formulas live; the fairseq
criterion (training loss) and the generators (RAG-Token beam search,
RAG-Sequence Thorough/Fast rescoring) call it. Pure torch, no fairseq import.

Notation (shapes use these letters throughout)::

    B  batch size (questions; for beam search B may be batch*beam)
    K  retrieved documents per question (top-K)
    T  target length (positions that are scored)
    V  generator vocabulary size
    H  candidate hypotheses per question (RAG-Sequence decoding)

    doc_lp[b, k]          = log p_eta(z_k | x_b)                 (document log-prior)
    token_lp[b, k, t]     = log p_theta(y_t | x_b, z_k, y_<t)    (target-token log-prob)
    lprobs[b, k, t, v]    = log p_theta(v | x_b, z_k, y_<t)      (full generator output)
    target_mask[b, t]     = True where position t is scored (False = padding / ignored)

    RAG-Sequence  p(y|x) = sum_z p(z|x) prod_t p(y_t|x,z,y_<t)
    RAG-Token     p(y|x) = prod_t sum_z p(z|x) p(y_t|x,z,y_<t)

Conventions
-----------
* Everything is computed with ``logsumexp``; no probability is ever exponentiated
  before being summed, so very negative log-probs are exact.
* A document with log-prior ``-inf`` (masked out, probability zero) contributes
  nothing, whatever its generator log-probs are (``-inf``, garbage, even NaN):
  :func:`_add_log_prior` replaces the sum with ``-inf`` instead of relying on
  ``-inf + x``. At least one document per row must have a finite prior.
* Masked target positions are *selected away* with ``torch.where`` (never
  multiplied by 0), so ``-inf`` log-probs at padding give neither NaN values nor NaN
  gradients.
* Label smoothing follows the convention of the reference implementation
  (transformers' ``RagTokenForGeneration``/``RagSequenceForGeneration.get_nll``,
  and fairseq's historical ``label_smoothed_nll_loss``)::

        loss = (1 - eps) * nll + eps / V * smooth,   smooth = -sum_v log p(v)

  Note that current fairseq uses ``eps/(V-1)`` and ``(1 - eps - eps/(V-1))``;
  the difference is O(eps/V).
* Losses are per example (shape ``[B]``); the caller reduces (transformers' and
  fairseq's ``reduce`` sum over the batch).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    "doc_log_prior",
    "target_token_log_probs",
    "rag_sequence_nll",
    "rag_token_nll",
    "rag_token_marginal_lprobs",
    "rag_token_loss",
    "rag_sequence_loss",
    "rag_sequence_scores",
    "fast_decoding_seq_log_probs",
    "rag_token_doc_log_posterior",
    "rag_token_doc_posterior",
    "rag_sequence_doc_log_posterior",
    "doc_posterior_entropy",
    "top1_doc_prob",
]

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- helpers


def _expand_prior(doc_lp: Tensor, like: Tensor) -> Tensor:
    """View ``doc_lp [B,K]`` as ``[B,K,1,...,1]`` broadcastable against ``like [B,K,...]``."""
    if doc_lp.dim() != 2 or like.shape[:2] != doc_lp.shape:
        raise ValueError(
            f"doc_lp must be [B,K] matching the first two dims of a [B,K,...] tensor; "
            f"got doc_lp {tuple(doc_lp.shape)} and {tuple(like.shape)}"
        )
    return doc_lp.reshape(doc_lp.shape + (1,) * (like.dim() - 2))


def _add_log_prior(doc_lp: Tensor, x: Tensor) -> Tensor:
    """``doc_lp[b,k] + x[b,k,...]``, forced to ``-inf`` where the prior is ``-inf``.

    doc_lp: [B,K]; x: [B,K,...] -> [B,K,...]. A zero-probability document
    contributes exactly nothing to a later logsumexp over K, even if ``x`` is NaN
    or +inf there, and receives a zero (not NaN) gradient.
    """
    prior = _expand_prior(doc_lp, x)
    joint = prior + x
    # in place on the fresh sum (one pass, no second full-size tensor); autograd gives the
    # masked entries a zero gradient, as torch.where would
    return joint.masked_fill_(torch.isneginf(prior), NEG_INF)


def _check_target_mask(target_mask: Tensor, token_lp: Tensor) -> None:
    B, _, T = token_lp.shape
    if target_mask.dtype != torch.bool or tuple(target_mask.shape) != (B, T):
        raise ValueError(
            f"target_mask must be a bool tensor [B,T]=({B},{T}); "
            f"got {target_mask.dtype} {tuple(target_mask.shape)}"
        )


def _masked_sum_over_t(x: Tensor, target_mask: Tensor) -> Tensor:
    """Sum ``x [B,K,T]`` over T keeping only ``target_mask [B,T]`` positions -> [B,K]."""
    keep = target_mask.unsqueeze(1)
    return torch.where(keep, x, torch.zeros_like(x)).sum(-1)


# ----------------------------------------------------------------------------- prior


def doc_log_prior(doc_scores: Tensor, doc_mask: Optional[Tensor] = None) -> Tensor:
    """Document log-prior ``log p(z|x)``: log-softmax of retrieval scores over the top-K.

    Args:
        doc_scores: [B,K] float, inner products ``d(z)^T q(x)`` (differentiable).
        doc_mask:   optional bool [B,K]; False marks a missing/padded document, which
                    gets log-prior ``-inf`` (probability exactly 0).
    Returns:
        [B,K] log-probabilities; each row logsumexps to 0.
    Raises:
        ValueError if a row has every document masked (p(z|x) undefined).
    """
    if doc_scores.dim() != 2:
        raise ValueError(f"doc_scores must be [B,K]; got {tuple(doc_scores.shape)}")
    if doc_mask is not None:
        if doc_mask.dtype != torch.bool or doc_mask.shape != doc_scores.shape:
            raise ValueError(
                f"doc_mask must be bool {tuple(doc_scores.shape)}; "
                f"got {doc_mask.dtype} {tuple(doc_mask.shape)}"
            )
        if not bool(doc_mask.any(-1).all()):
            bad = (~doc_mask.any(-1)).nonzero().flatten().tolist()
            raise ValueError(f"every document is masked in batch row(s) {bad}")
        doc_scores = doc_scores.masked_fill(~doc_mask, NEG_INF)
    return torch.log_softmax(doc_scores, dim=-1)


# ----------------------------------------------------------------------------- training


def target_token_log_probs(lprobs: Tensor, target: Tensor) -> Tensor:
    """Gather the target token's log-prob under every document.

    Args:
        lprobs: [B,K,T,V] generator log-probs (log_softmax over V).
        target: Long [B,T], the token scored at each position (shared by all K docs).
    Returns:
        token_lp: [B,K,T], ``lprobs[b,k,t,target[b,t]]``. The index is an expanded
        view, so nothing of size [B,K,T,V] beyond ``lprobs`` itself is allocated.
    """
    B, K, T, _ = lprobs.shape
    if tuple(target.shape) != (B, T):
        raise ValueError(f"target must be [B,T]=({B},{T}); got {tuple(target.shape)}")
    index = target.view(B, 1, T, 1).expand(B, K, T, 1)
    return lprobs.gather(-1, index).squeeze(-1)


def rag_sequence_nll(token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor) -> Tensor:
    """RAG-Sequence negative log-likelihood.

    ``-log sum_k p(z_k|x) prod_{t in mask} p(y_t|x,z_k,y_<t)``
    ``= -logsumexp_k(doc_lp[:,k] + sum_t token_lp[:,k,t] * mask[:,t])``.

    Args: token_lp [B,K,T], doc_lp [B,K], target_mask bool [B,T].
    Returns: [B].
    """
    _check_target_mask(target_mask, token_lp)
    seq_lp = _masked_sum_over_t(token_lp, target_mask)  # [B,K]
    return -torch.logsumexp(_add_log_prior(doc_lp, seq_lp), dim=1)


def _rag_token_position_lp(token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor) -> Tensor:
    """``log sum_k p(z_k|x) p(y_t|x,z_k,y_<t)`` per position, 0 where masked. -> [B,T]."""
    _check_target_mask(target_mask, token_lp)
    keep = target_mask.unsqueeze(1)
    # Replace masked positions by 0 *before* the logsumexp: a column that is -inf for
    # every document would otherwise give NaN gradients even though it is discarded.
    safe = torch.where(keep, token_lp, torch.zeros_like(token_lp))
    pos_lp = torch.logsumexp(_add_log_prior(doc_lp, safe), dim=1)  # [B,T]
    return torch.where(target_mask, pos_lp, torch.zeros_like(pos_lp))


def rag_token_nll(token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor) -> Tensor:
    """RAG-Token negative log-likelihood.

    ``-sum_{t in mask} log sum_k p(z_k|x) p(y_t|x,z_k,y_<t)``
    ``= -sum_t mask[:,t] * logsumexp_k(doc_lp[:,k] + token_lp[:,k,t])``.

    Args: token_lp [B,K,T], doc_lp [B,K], target_mask bool [B,T].
    Returns: [B].
    """
    return -_rag_token_position_lp(token_lp, doc_lp, target_mask).sum(-1)


def rag_token_marginal_lprobs(lprobs: Tensor, doc_lp: Tensor) -> Tensor:
    """Document-marginalised next-token log-distribution (RAG-Token transition).

    ``log p'(v|x,y_<t) = logsumexp_k(log p(z_k|x) + log p(v|x,z_k,y_<t))``; this is
    what RAG-Token beam search scores at each step, and each row sums to 1 in
    probability space when every document's row does.

    Args:
        lprobs: [B,K,V] (one decoding step) or [B,K,T,V] (teacher forcing); any
                [B,K,...] layout works, the K axis (dim 1) is marginalised.
        doc_lp: [B,K].
    Returns:
        [B,V] or [B,T,V] (``lprobs`` without dim 1).
    """
    return torch.logsumexp(_add_log_prior(doc_lp, lprobs), dim=1)


def rag_token_loss(
    lprobs: Tensor, doc_lp: Tensor, target: Tensor, target_mask: Tensor, epsilon: float = 0.0
) -> Tuple[Tensor, Tensor]:
    """Label-smoothed RAG-Token loss; smoothing is applied to the *marginal* distribution.

    Per scored position t, with ``m = rag_token_marginal_lprobs(lprobs, doc_lp)``::

        nll_t    = -m[t, y_t]
        smooth_t = -sum_v m[t, v]
        loss     = sum_{t in mask} (1 - eps) * nll_t + eps / V * smooth_t

    (exactly transformers' ``RagTokenForGeneration.get_nll``). With ``epsilon == 0``
    the [B,T,V] marginal is never built: only the gathered [B,K,T] log-probs are used.

    Args: lprobs [B,K,T,V], doc_lp [B,K], target Long [B,T], target_mask bool [B,T],
          epsilon in [0,1).
    Returns: (loss [B], nll [B]); ``nll`` is the unsmoothed RAG-Token NLL.
    """
    token_lp = target_token_log_probs(lprobs, target)
    nll = rag_token_nll(token_lp, doc_lp, target_mask)
    if epsilon == 0.0:
        return nll, nll
    V = lprobs.size(-1)
    marginal = rag_token_marginal_lprobs(lprobs, doc_lp)  # [B,T,V]
    smooth_t = -marginal.sum(-1)  # [B,T]
    smooth = torch.where(target_mask, smooth_t, torch.zeros_like(smooth_t)).sum(-1)
    loss = (1.0 - epsilon) * nll + (epsilon / V) * smooth
    return loss, nll


def rag_sequence_loss(
    lprobs: Tensor,
    doc_lp: Tensor,
    target: Tensor,
    target_mask: Tensor,
    epsilon: float = 0.0,
    hf_compat: bool = False,
) -> Tuple[Tensor, Tensor]:
    """Label-smoothed RAG-Sequence loss, smoothing as in the reference implementation.

    The smoothing term is built like the NLL term, per document, then marginalised::

        nll    = -logsumexp_k(doc_lp[k] + sum_{t in mask} lprobs[k, t, y_t])
        smooth = -logsumexp_k(w * doc_lp[k] + sum_{t in mask} sum_v lprobs[k, t, v])
        loss   = (1 - eps) * nll + eps / V * smooth

    i.e. the "uniform target" log-likelihood of each document's sequence model, mixed
    over documents like the NLL. (This is the choice of transformers'
    ``RagSequenceForGeneration.get_nll``; a smoothed RAG-Sequence loss has no
    per-token form because the sum over documents sits outside the product.)

    ``w``: the prior enters once per document (``w = 1``) by default. transformers
    adds ``doc_lp`` to every vocabulary entry of its second target position before
    summing over V, so its smoothing term carries ``w = V``; ``hf_compat=True``
    reproduces that (for loss-value parity). Its other quirk -- the prior is dropped
    when that second position is padding -- is *not* reproduced (never happens for
    targets of >= 2 scored tokens). The NLL is identical in both modes.

    Args: lprobs [B,K,T,V], doc_lp [B,K], target Long [B,T], target_mask bool [B,T],
          epsilon in [0,1), hf_compat.
    Returns: (loss [B], nll [B]); ``nll`` is the unsmoothed RAG-Sequence NLL.
    """
    token_lp = target_token_log_probs(lprobs, target)
    nll = rag_sequence_nll(token_lp, doc_lp, target_mask)
    if epsilon == 0.0:
        return nll, nll
    V = lprobs.size(-1)
    vocab_sum = _masked_sum_over_t(lprobs.sum(-1), target_mask)  # [B,K]
    prior = doc_lp * V if hf_compat else doc_lp
    # _add_log_prior keeps masked documents at -inf (V * -inf stays -inf anyway).
    smooth = -torch.logsumexp(_add_log_prior(prior, vocab_sum), dim=1)
    loss = (1.0 - epsilon) * nll + (epsilon / V) * smooth
    return loss, nll


# ----------------------------------------------------------------------------- decoding


def rag_sequence_scores(seq_lp: Tensor, doc_lp: Tensor) -> Tensor:
    """Rescore RAG-Sequence candidates: ``log sum_k p(z_k|x) p(y_h|x,z_k)``.

    Thorough decoding: ``seq_lp[b,k,h] = log p(y_h|x,z_k)`` computed for every pair.
    Fast decoding: the same with ``-inf`` where hypothesis h was not in document k's
    beam (p(y|x,z) ~ 0; see :func:`fast_decoding_seq_log_probs`). A hypothesis that
    is ``-inf`` under every document scores ``-inf``.

    Args: seq_lp [B,K,H], doc_lp [B,K].
    Returns: [B,H].
    """
    return torch.logsumexp(_add_log_prior(doc_lp, seq_lp), dim=1)


def fast_decoding_seq_log_probs(seq_lp: Tensor, in_beam: Tensor) -> Tensor:
    """Fast-decoding ``seq_lp``: keep ``log p(y_h|x,z_k)`` only where h was in k's beam.

    Args:
        seq_lp:  [B,K,H] float; entries where ``in_beam`` is False are ignored (may be
                 anything, e.g. 0 or NaN if never computed).
        in_beam: bool [B,K,H], True where hypothesis h came out of document k's beam.
    Returns:
        [B,K,H] with ``-inf`` off-beam, ready for :func:`rag_sequence_scores`.
    """
    if in_beam.dtype != torch.bool or in_beam.shape != seq_lp.shape:
        raise ValueError(
            f"in_beam must be bool {tuple(seq_lp.shape)}; got {in_beam.dtype} {tuple(in_beam.shape)}"
        )
    return torch.where(in_beam, seq_lp, torch.full_like(seq_lp, NEG_INF))


# ----------------------------------------------------------------------------- posteriors & stats


def rag_token_doc_log_posterior(token_lp: Tensor, doc_lp: Tensor) -> Tensor:
    """Per-token document log-posterior of RAG-Token (the paper's Figure 2).

    ``log p(z_t = k | x, y) = log [p(z_k|x) p(y_t|x,z_k,y_<t)] - log sum_k' [...]``.

    Under RAG-Token the per-token latents z_1..z_T are a priori independent draws
    from p(z|x) and the generator's token t conditions on y_<t but not on z_<t, so
    the joint ``prod_t p(z_t|x) p(y_t|x,z_t,y_<t)`` factorises over t given y: the
    posterior of z_t given the *whole* output (the paper's ``p(z_i|x, y_i, y_-i)``)
    equals this per-position normalisation. (Verified against explicit enumeration
    of all K^T assignments in the tests.) Padding positions are returned as
    computed; the caller ignores them.

    Args: token_lp [B,K,T], doc_lp [B,K].
    Returns: [B,K,T], logsumexp over K is 0 at every position.
    """
    joint = _add_log_prior(doc_lp, token_lp)
    return joint - torch.logsumexp(joint, dim=1, keepdim=True)


def rag_token_doc_posterior(token_lp: Tensor, doc_lp: Tensor) -> Tensor:
    """``exp`` of :func:`rag_token_doc_log_posterior`: [B,K,T] probabilities over K."""
    return rag_token_doc_log_posterior(token_lp, doc_lp).exp()


def rag_sequence_doc_log_posterior(
    token_lp: Tensor, doc_lp: Tensor, target_mask: Tensor
) -> Tensor:
    """RAG-Sequence document log-posterior ``log p(z|x,y) ∝ p(z|x) prod_t p(y_t|x,z,y_<t)``.

    Args: token_lp [B,K,T], doc_lp [B,K], target_mask bool [B,T].
    Returns: [B,K], each row logsumexps to 0.
    """
    _check_target_mask(target_mask, token_lp)
    joint = _add_log_prior(doc_lp, _masked_sum_over_t(token_lp, target_mask))
    return joint - torch.logsumexp(joint, dim=1, keepdim=True)


def doc_posterior_entropy(doc_lp: Tensor) -> Tensor:
    """Entropy in nats of a distribution over documents given as log-probs.

    Works for the prior p(z|x) or any [B,K] log-posterior; zero-probability
    (``-inf``) documents contribute 0. Args: doc_lp [B,K]. Returns: [B].
    """
    # Substitute 0 for -inf *before* the product so neither value nor gradient is NaN.
    zero_prob = torch.isneginf(doc_lp)
    safe_lp = torch.where(zero_prob, torch.zeros_like(doc_lp), doc_lp)
    plogp = safe_lp.exp() * safe_lp
    return -torch.where(zero_prob, torch.zeros_like(plogp), plogp).sum(-1)


def top1_doc_prob(doc_lp: Tensor) -> Tensor:
    """Probability of the most likely document, ``max_k p(z_k|x)``. [B,K] -> [B]."""
    return doc_lp.max(dim=-1).values.exp()


# ----------------------------------------------------------------------------- per-token scores


def rag_token_positional_scores(token_lp: Tensor, doc_lp: Tensor) -> Tensor:
    """log p'(y_t | x, y<t) = logsumexp_k(doc_lp + token_lp): the RAG-Token transition.

    Args: token_lp [B,K,T], doc_lp [B,K]. Returns [B,T]; summing over the scored positions
    gives -rag_token_nll.
    """
    return torch.logsumexp(_add_log_prior(doc_lp, token_lp), dim=1)


def rag_sequence_positional_scores(token_lp: Tensor, doc_lp: Tensor) -> Tensor:
    """Chain-rule decomposition of the RAG-Sequence marginal into per-token scores.

    log p(y|x) = sum_t log p(y_t | x, y<t) with
    p(y_t | x, y<t) = sum_z p(z | x, y<t) p(y_t | x, z, y<t), where the document posterior
    p(z | x, y<t) is proportional to p(z|x) prod_{s<t} p(y_s | x, z, y<s). The terms
    telescope, so the sum over t is exactly ``logsumexp_k(doc_lp + sum_t token_lp)``.
    Rows of ``token_lp`` that are ``-inf`` (Fast decoding: y not in z's beam) drop out.

    Args: token_lp [B,K,T] (every position scored; pad the caller's way), doc_lp [B,K].
    Returns [B,T].
    """
    upto = torch.cumsum(token_lp, dim=-1)                           # sum_{s<=t}, [B,K,T]
    prefix = torch.cat([torch.zeros_like(upto[..., :1]), upto[..., :-1]], dim=-1)  # sum_{s<t}
    before = _add_log_prior(doc_lp, prefix)                        # log p(z) p(y<t|z)
    after = _add_log_prior(doc_lp, upto)                            # log p(z) p(y<=t|z)
    return torch.logsumexp(after, dim=1) - torch.logsumexp(before, dim=1)
