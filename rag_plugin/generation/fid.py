"""Fusion-in-Decoder decoding: fairseq's own SequenceGenerator over the concatenated encoder states.

The model's encoder runs once per (question, passage) pair and the K encodings of a question are
concatenated (:meth:`rag_plugin.models.fid.FidModel.fused_encode`). The search then sees an ordinary
encoder-decoder whose encoder output has one row per question (K*L positions), handed to it through
:class:`~rag_plugin.generation.adapters.PerDocumentSearchModel`: that output is never copied per beam
(``reorder_encoder_out`` keeps one row per question and drops the questions that finish), and each
question's cross-attention keys and values are computed once for all its beams (fairseq's
query rows grouped over fewer key/value rows); only the decoder's self-attention cache follows the beams.

After the search, each hypothesis is teacher-forced once more to measure each passage's share of the
decoder's cross-attention (:mod:`rag_plugin.generation.fid_attention`), attached to the hypothesis as
``doc_attention`` [K] beside ``doc_rows`` and ``doc_log_prior`` (the retriever's p(z|x), for the record).
With ``--fid-score-bias`` the fused output also holds log p(z|x) (``fid_score_bias.PRIOR_KEY``): it follows the
search's reordering with the rest of the output, and every decoder call (the search's, teacher forcing's) adds
its bias to the cross-attention.
``--score-reference`` scores the given targets the same way (:class:`FidScorer`).
"""
from typing import List, Optional

import torch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import (
    PairDecoder,
    PerDocumentSearchModel,
    RagGeneratorBase,
    _bart_part,
    _teacher_forcing_rows,
)
from rag_plugin.generation.fid_attention import teacher_forced
from rag_plugin.generation.scorer import reference_hypotheses
from rag_plugin.util.errors import UserError


class FusedDecoder(PairDecoder):
    """The BART decoder over the fused encoder output (one row per question, its beams grouped), with
    ``--fid-score-bias``'s bias read from the output's prior, which follows the search's questions."""

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        logits, _ = self.rag.fused_decode(prev_output_tokens, _bart_part(encoder_out),
                                          incremental_state=incremental_state)
        return logits, {"attn": [None]}


class FidSearchModel(PerDocumentSearchModel):
    """What SequenceGenerator sees for FiD: the cached fused encoder output and :class:`FusedDecoder`."""

    def __init__(self, fid):
        super().__init__(fid)
        self.decoder = FusedDecoder(fid)


class _FidGeneratorBase(RagGeneratorBase):
    """Hypotheses with ``doc_attention`` (each passage's cross-attention share) besides the retrieval."""

    variant = "fid"

    def __init__(self, fid):
        super().__init__(fid)
        self._attention: List[List[torch.Tensor]] = []

    def generate(self, models, sample, **kwargs):
        hypos = super().generate(models, sample, **kwargs)
        for hyps, shares in zip(hypos, self._attention):
            for h, share in zip(hyps, shares):
                h["doc_attention"] = share.clone()
        self._attention = []
        return hypos

    def _encode(self, sample):
        ni = sample["net_input"]
        return self.rag.fused_encode(ni["src_tokens"], ni.get("query_tokens"), ni.get("query_mask"),
                                     ni.get("fixed_doc_rows"), ni.get("fixed_doc_scores"))


class FidGenerator(_FidGeneratorBase):
    """Beam search (greedy with ``--beam 1``, sampling, prefixes, ...: fairseq's own search and options)."""

    def __init__(self, task, fid, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
        super().__init__(fid)
        self.search_model = FidSearchModel(fid)
        self.search = task.build_search([self.search_model], args, extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                                        prefix_allowed_tokens_fn=self._sentence_ids.wrap(prefix_allowed_tokens_fn))

    def _generate(self, models, sample, **kwargs):
        encoder_out, doc_scores, rows = self._encode(sample)
        k = doc_scores.size(1)
        self.search_model.encoder.cached = encoder_out
        # as RAG-Token's: the search runs without "id" (its rows are not dataset ids), the function sees them
        self._sentence_ids.set(sample)
        search_sample = {key: value for key, value in sample.items() if key != "id"}
        try:
            hypos = self.search.generate([self.search_model], search_sample, **kwargs)
        finally:
            self.search_model.encoder.cached = None
        owner = torch.tensor([i for i, hyps in enumerate(hypos) for _ in hyps], dtype=torch.long)
        tokens = [h["tokens"] for hyps in hypos for h in hyps]
        shares = torch.zeros(0, k)
        if tokens:
            target, prev = _teacher_forcing_rows(tokens, max(len(t) for t in tokens), self.rag.pad, self.rag.eos)
            _, shares = teacher_forced(self.rag, encoder_out, owner, prev, target, k)
        self._attention = list(shares.cpu().split([len(hyps) for hyps in hypos]))
        return hypos, {"rows": rows, "doc_lp": M.doc_log_prior(doc_scores.float())}


class FidScorer(_FidGeneratorBase):
    """Teacher-forced scores of the given targets (``--score-reference``): the sum of log p(y_t | x, passages,
    y<t) over the target divided by its length, as fairseq's SequenceScorer reports it."""

    def _generate(self, models, sample, **kwargs):
        encoder_out, doc_scores, rows = self._encode(sample)
        target, prev = sample["target"], sample["net_input"]["prev_output_tokens"]
        b, k = doc_scores.shape
        token_lp, shares = teacher_forced(self.rag, encoder_out, torch.arange(b), prev, target, k)
        hypos = reference_hypotheses(target, token_lp, self.rag.pad)
        self._attention = [shares[i: i + 1].cpu() for i in range(b)]
        return hypos, {"rows": rows, "doc_lp": M.doc_log_prior(doc_scores.float())}


def build_fid_generator(task, fid, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
    """The task's ``build_generator`` for a FiD model; one-line errors for RAG's own decoding options."""
    if str(getattr(task.cfg, "rag_decoding", "thorough")) != "thorough":
        raise UserError(f"--rag-decoding {task.cfg.rag_decoding} chooses RAG-Sequence's decoding; a Fusion-in-Decoder "
                        "checkpoint (fid) decodes with fairseq's beam search over the fused passages",
                        fix="leave --rag-decoding out")
    if getattr(task.cfg, "doc_posterior_out", None):
        raise UserError("--doc-posterior-out writes RAG-Token's per-token document posterior; a Fusion-in-Decoder "
                        "checkpoint (fid) has none", fix="leave --doc-posterior-out out; --provenance-out lists each "
                                                        "passage's share of FiD's cross-attention")
    if getattr(args, "score_reference", False):
        if prefix_allowed_tokens_fn is not None:
            raise UserError("prefix_allowed_tokens_fn constrains a search; --score-reference does not search",
                            fix="leave prefix_allowed_tokens_fn out when scoring references")
        return FidScorer(fid)
    return FidGenerator(task, fid, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)


def attention_of(hypos) -> Optional[torch.Tensor]:
    """The best hypothesis's passage shares [B, K] (``doc_attention``), or None when the hypotheses carry none."""
    firsts = [hyps[0] for hyps in hypos if hyps]
    if not firsts or len(firsts) != len(hypos) or "doc_attention" not in firsts[0]:
        return None
    return torch.stack([h["doc_attention"] for h in firsts])
