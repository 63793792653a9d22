"""Fusion-in-Decoder's teacher-forced scores and each passage's share of the decoder's cross-attention.

The share is FiD-KD's passage score (Izacard & Grave, "Distilling Knowledge from Reader to Retriever"):
the decoder's cross-attention probabilities averaged over layers, heads and the answer's tokens, summed
over each passage's positions in the concatenated encoder output, normalised over the K passages.
Padding positions get no attention, so the K shares sum to 1 before normalising, up to rounding.
"""
from typing import List, Tuple

import torch

from rag_plugin.generation.fid_score_bias import select_prior


class CrossAttentionRecorder:
    """Records the head-averaged cross-attention probabilities [R, T, S] of every decoder layer during
    one decoder call (``with CrossAttentionRecorder(decoder) as rec: decoder(...)``; then ``rec.layers``).

    fairseq's decoder keeps one layer's attention (its alignment layer); each layer's cross-attention
    module is asked for its weights per head and their mean over heads is kept here. The
    hooks are on this decoder's modules only and are removed on exit."""

    def __init__(self, decoder):
        self.modules = [layer.encoder_attn for layer in decoder.layers if getattr(layer, "encoder_attn", None)]
        self.layers: List[torch.Tensor] = []
        self._handles = []

    @staticmethod
    def _ask_for_weights(module, args, kwargs):
        # per head ([heads, R, T, S]), as the decoder asks its alignment layer: its own result stays as it was
        kwargs = dict(kwargs, need_weights=True, need_head_weights=True)
        return args, kwargs

    def _keep(self, module, args, output):
        self.layers.append(output[1].float().mean(0))

    def __enter__(self):
        for m in self.modules:
            self._handles.append(m.register_forward_pre_hook(self._ask_for_weights, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._keep))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


def passage_shares(attention: torch.Tensor, target_mask: torch.Tensor, k: int) -> torch.Tensor:
    """FiD-KD's passage scores from cross-attention averaged over layers and heads.

    ``attention`` [R, T, K*L] (the encoder positions of passage j are j*L ... j*L+L-1), ``target_mask``
    Bool[R, T] (the answer's tokens). Returns [R, K], each row summing to 1."""
    mask = target_mask.to(attention.dtype).unsqueeze(-1)
    per_token = (attention * mask).sum(1) / mask.sum(1).clamp(min=1)          # [R, K*L] mean over the answer
    per_passage = per_token.view(per_token.size(0), k, -1).sum(-1)           # [R, K]
    return per_passage / per_passage.sum(-1, keepdim=True).clamp(min=1e-30)


def teacher_forced(fid, encoder_out, question_rows: torch.Tensor, prev: torch.Tensor, target: torch.Tensor,
                   k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """log p(y_t | x, passages, y<t) [R, T] (0 at padding) and the passage shares [R, K] of R targets.

    ``encoder_out``: the fused encoder output (one row per question, :func:`rag_plugin.models.fid.fuse_encodings`);
    ``question_rows`` Long[R] its row for each target; ``prev``/``target`` Long[R, T] the decoder's input and
    the target (padded with ``fid.pad``). A score-biased FiD's prior (``fid_score_bias.PRIOR_KEY``) follows the rows.
    """
    device = encoder_out["encoder_out"][0].device
    question_rows, prev, target = question_rows.to(device), prev.to(device), target.to(device)
    enc = select_prior(encoder_out, fid.generator.encoder.reorder_encoder_out(encoder_out, question_rows),
                       question_rows)
    with CrossAttentionRecorder(fid.generator.decoder) as rec:
        logits, _ = fid.fused_decode(prev, enc)  # with --fid-score-bias's bias where the output holds the prior
    mask = target.ne(fid.pad)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    attention = torch.stack(rec.layers).mean(0)                                  # [R, T, K*L]
    return lp.masked_fill(~mask, 0.0), passage_shares(attention, mask, k)
