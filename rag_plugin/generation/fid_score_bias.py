"""FiD that sees retrieval (Akimoto et al., EMNLP Findings 2023): the passage's retrieval log-probability added to
the decoder's cross-attention logits over that passage's positions.

Per question b, passage k (positions k*L ... k*L+L-1 of the fused encoder output) and every decoder layer and head::

    logits[b, h, t, s] = q . key_s / sqrt(d)  +  w * log p(z_k | x)        for s in passage k
    log p(z | x)       = log_softmax(doc_scores[b])                          the retriever's (or reranker's) logits
    w                  = 1 / --fid-attention-temperature, or exp(score_bias_log_weight) (learned, starts at 1)

so that the attention a passage gets is scaled by p(z_k|x)^w before it is renormalised: softmax(a + w log p).
Padding positions stay masked (fairseq masks them after the hook). fairseq's cross-attention calls
``apply_sparse_mask(attn_weights, tgt_len, src_len, bsz)`` on the logits before the padding mask and the softmax
(its non-fused path, which cross-attention always takes: ``static_kv``); :class:`ScoreBias` overrides that method
on each cross-attention module of one decoder for the duration of one decoder call. The logits' rows are ordered
(key/value row, beams, heads): one key/value row per question, its beams grouped (fairseq's beamable attention) or
one query row per key/value row (training, teacher forcing).

The fused encoder output carries the log-prior under :data:`PRIOR_KEY` ([B, K], one row per question) so that it
follows the search's reordering and its finished questions (``adapters._select_pairs``); a decoder call reads it
back with :func:`score_bias`.
"""
import contextlib
from typing import Dict, List, Optional, Union

import torch

#: the fused encoder output's entry with log p(z|x) [B, K] of a score-biased FiD (absent for plain FiD)
PRIOR_KEY = "passage_log_prior"
#: log p(z|x) below this (a -inf logit) biases as this: w * -inf would be NaN at w = 0
LOG_PRIOR_FLOOR = -1e4

Weight = Union[float, torch.Tensor]


def position_bias(log_prior: torch.Tensor, weight: Weight, src_len: int) -> torch.Tensor:
    """``w * log p(z_k|x)`` repeated over each passage's L positions: [B, K] -> [B, K*L] (``src_len`` = K*L)."""
    k = log_prior.size(1)
    if src_len % k:
        raise ValueError(f"{src_len} encoder positions do not split into {k} passages")
    log_prior = log_prior.to(torch.promote_types(log_prior.dtype, torch.float32))
    bias = weight * log_prior.clamp(min=LOG_PRIOR_FLOOR)
    return bias.repeat_interleave(src_len // k, dim=1)


class ScoreBias:
    """``with ScoreBias(decoder, bias): decoder(...)``: every cross-attention layer of ``decoder`` adds ``bias``
    [R, S] (one row per key/value row of the call, one value per encoder position) to its logits. The override is on
    the module instances and removed on exit, an exception's too."""

    def __init__(self, decoder, bias: torch.Tensor):
        self.modules = [layer.encoder_attn for layer in decoder.layers if getattr(layer, "encoder_attn", None)]
        self.bias = bias
        self._saved: List[Optional[object]] = []

    def _override(self, module):
        original = module.apply_sparse_mask
        heads = module.num_heads

        def apply_sparse_mask(attn_weights, tgt_len: int, src_len: int, bsz: int):
            attn_weights = original(attn_weights, tgt_len, src_len, bsz)
            rows = self.bias.size(0)
            if self.bias.size(1) != src_len or attn_weights.size(0) % (rows * heads):
                raise ValueError(f"cross-attention logits {tuple(attn_weights.shape)} do not match the score bias "
                                 f"{tuple(self.bias.shape)} with {heads} heads")
            grouped = attn_weights.reshape(rows, -1, heads, tgt_len, src_len)  # (kv row, beams, heads, T, S)
            bias = self.bias.to(attn_weights.dtype).view(rows, 1, 1, 1, src_len)
            return (grouped + bias).view(attn_weights.shape)

        return apply_sparse_mask

    def __enter__(self):
        for m in self.modules:
            self._saved.append(m.__dict__.get("apply_sparse_mask"))
            m.apply_sparse_mask = self._override(m)
        return self

    def __exit__(self, *exc):
        for m, saved in zip(self.modules, self._saved):
            if saved is None:
                del m.apply_sparse_mask  # the class's method again
            else:
                m.apply_sparse_mask = saved
        self._saved = []
        return False


def score_bias(decoder, encoder_out: Dict[str, List[torch.Tensor]], weight: Optional[Weight]):
    """The context of one decoder call over ``encoder_out`` (fused, one row per question): :class:`ScoreBias` with
    ``weight * log p(z|x)`` from ``encoder_out[PRIOR_KEY]``; nothing when there is no prior or no weight (plain
    FiD)."""
    prior = encoder_out.get(PRIOR_KEY)
    if not prior or weight is None:
        return contextlib.nullcontext()
    src_len = encoder_out["encoder_out"][0].size(0)
    return ScoreBias(decoder, position_bias(prior[0], weight, src_len))


def with_prior(encoder_out: dict, log_prior: torch.Tensor) -> dict:
    """``encoder_out`` with log p(z|x) [B, K] under :data:`PRIOR_KEY`."""
    out = dict(encoder_out)
    out[PRIOR_KEY] = [log_prior]
    return out


def select_prior(encoder_out: dict, selected: dict, rows: torch.Tensor) -> dict:
    """``selected`` (``encoder_out`` reordered to ``rows`` by BART's encoder, which drops keys it does not know)
    with the prior's rows too, when ``encoder_out`` has one."""
    prior = encoder_out.get(PRIOR_KEY)
    if not prior:
        return selected
    return with_prior(selected, prior[0].index_select(0, rows.to(prior[0].device)))
