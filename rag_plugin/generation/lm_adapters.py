"""Adapters that present a decoder-only RAG model (``rag_lm_token``, ``rag_lm_seq``) to fairseq's SequenceGenerator.

The search sees an encoder (retrieval: the pairs' contexts and log p(z|x), nothing run yet) and an incremental
decoder. On the decoder's first call each (question, passage) pair's context runs once through the LM into the
self-attention cache (:meth:`LMReader.start`), and the cache is copied to the rows that read it; every later step
runs only the newest token of each row at its own position (``context length + step``), and the cache follows the
beams as fairseq reorders them. No context is recomputed per step, per beam or per candidate.

* RAG-Token (:class:`LMTokenSearchModel`): the decoder's rows are (question, passage, beam); each step's K
  next-token distributions are mixed by p(z|x) (REPLUG's ensemble) with
  :func:`rag_plugin.core.marginalization.rag_token_marginal_lprobs`.
* RAG-Sequence (:class:`LMPairSearchModel`): one beam per (question, passage) pair, the plain LM.
* Thorough rescoring (:func:`score_lm_candidates`): each pair's context runs once, its cache is copied to the
  candidates scored under it, and their tokens run in one causal call.
"""
from typing import Dict, List, Optional, Set, Tuple

import torch
from fairseq.models import FairseqEncoder, FairseqIncrementalDecoder

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import SearchModel, _chunks, _pairs_to_score, _teacher_forcing_rows, grouped_order


def _started_rows(decoder, incremental_state, encoder_out, rows_per_context: int) -> torch.Tensor:
    """The context length of each decoder row; on the first step, first run every context once into the cache and
    copy it to its ``rows_per_context`` adjacent rows (its beams; RAG-Token: the beams of each (question, passage))."""
    lengths = _rows_state(decoder, incremental_state)
    if lengths is not None:
        return lengths
    reader = decoder.rag.reader
    contexts, context_lengths = encoder_out["context_tokens"][0], encoder_out["context_lengths"][0]
    reader.start(incremental_state, contexts, context_lengths)
    context_of_row = torch.arange(contexts.size(0), device=contexts.device).repeat_interleave(rows_per_context)
    reader.reorder(incremental_state, context_of_row)
    lengths = context_lengths.index_select(0, context_of_row)
    _set_rows_state(decoder, incremental_state, lengths)
    return lengths


def _rows_state(decoder, incremental_state) -> Optional[torch.Tensor]:
    state = decoder.get_incremental_state(incremental_state, "rows")
    return None if state is None else state["lengths"]


def _set_rows_state(decoder, incremental_state, lengths: torch.Tensor) -> None:
    decoder.set_incremental_state(incremental_state, "rows", {"lengths": lengths})


class LMRetrievingEncoder(FairseqEncoder):
    """Retrieves K passages per question and lays out the B*K contexts; its output carries them (for the decoder's
    first call) and ``doc_lp`` [N, K] per search row. The batch's retrieval waits in :meth:`take_retrieval`."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self._retrieval: Dict[str, Optional[torch.Tensor]] = {}

    def take_retrieval(self) -> Dict[str, Optional[torch.Tensor]]:
        retrieval, self._retrieval = self._retrieval, {}
        return retrieval

    def forward_torchscript(self, net_input):
        return self.forward(**net_input)

    def forward(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None, fixed_doc_scores=None,
                **unused):
        contexts, doc_scores, rows = self.rag.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                     fixed_doc_scores)
        doc_lp = M.doc_log_prior(doc_scores.float())
        # "encoder_out": what the reader "encoded", the pairs' contexts (as RagSequenceGenerator keeps them)
        self._retrieval = {"rows": rows, "doc_lp": doc_lp, "doc_scores": doc_scores, "encoder_out": contexts}
        return {"doc_lp": [doc_lp], "context_tokens": [contexts.tokens], "context_lengths": [contexts.lengths]}

    def reorder_encoder_out(self, encoder_out, new_order):
        out = dict(encoder_out)  # the contexts are read once, on the first step, in the pairs' own order
        out["doc_lp"] = [encoder_out["doc_lp"][0].index_select(0, new_order)]
        return out


class LMMarginalizingDecoder(FairseqIncrementalDecoder):
    """RAG-Token's transition over an LM: log sum_z p(z|x) p_LM(y_t | context(x, z), y<t), one step at a time."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.n_docs = 1
        self.beam = 1

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        doc_lp = encoder_out["doc_lp"][0]                                        # [N, K]
        n, k = doc_lp.shape
        self.n_docs, beam = k, self.beam
        b, t = n // beam, prev_output_tokens.size(1)
        lengths = _started_rows(self, incremental_state, encoder_out, beam)      # rows (question, passage, beam)
        last = prev_output_tokens[:, -1:].view(b, 1, beam, 1).expand(b, k, beam, 1).reshape(b * k * beam, 1)
        logits = self.rag.reader.extend(incremental_state, last, lengths, t - 1)  # [B*K*beam, 1, V]
        lprobs = torch.log_softmax(logits.float(), dim=-1).view(b, k, beam, logits.size(-1))
        question_lp = doc_lp.view(b, beam, k)[:, 0]
        marginal = M.rag_token_marginal_lprobs(lprobs, question_lp)              # [b, beam, V]
        return marginal.view(n, 1, -1), {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        order = grouped_order(new_order, self.n_docs, self.beam)
        self.rag.reader.reorder(incremental_state, order)
        lengths = _rows_state(self, incremental_state)
        if lengths is not None:
            _set_rows_state(self, incremental_state, lengths.index_select(0, order))

    def max_positions(self):
        return self.rag.max_decoder_positions()


class LMTokenSearchModel(SearchModel):
    """What SequenceGenerator sees for RAG-Token over an LM: outputs are marginal log-probabilities."""

    marginal = True

    def __init__(self, rag):
        super().__init__(rag, LMRetrievingEncoder(rag), LMMarginalizingDecoder(rag))


class LMCachedEncoder(FairseqEncoder):
    """Hands SequenceGenerator the pairs' contexts laid out beforehand (one search sentence per pair)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.cached = None

    def forward_torchscript(self, net_input):
        return {"context_tokens": [self.cached.tokens], "context_lengths": [self.cached.lengths]}

    def reorder_encoder_out(self, encoder_out, new_order):
        return encoder_out  # read once, on the first step, in the pairs' own order


class LMPairDecoder(FairseqIncrementalDecoder):
    """The plain LM over (question, passage) rows, each context run once: p(y_t | context(x, z), y<t)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.beam = 1

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        lengths = _started_rows(self, incremental_state, encoder_out, self.beam)   # rows (question, passage) x beam
        logits = self.rag.reader.extend(incremental_state, prev_output_tokens[:, -1:], lengths,
                                        prev_output_tokens.size(1) - 1)
        return logits, {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        self.rag.reader.reorder(incremental_state, new_order)
        lengths = _rows_state(self, incremental_state)
        if lengths is not None:
            _set_rows_state(self, incremental_state, lengths.index_select(0, new_order))

    def max_positions(self):
        return self.rag.max_decoder_positions()


class LMPairSearchModel(SearchModel):
    """What SequenceGenerator sees for RAG-Sequence over an LM: one independent beam per (question, passage)."""

    def __init__(self, rag):
        super().__init__(rag, LMCachedEncoder(rag), LMPairDecoder(rag))


def score_lm_candidates(rag, contexts, k: int, owner: torch.Tensor, tokens: List[torch.Tensor],
                        known: Optional[Dict[Tuple[int, int], torch.Tensor]] = None,
                        only: Optional[Set[Tuple[int, int]]] = None, max_cells: int = 16_000_000) -> torch.Tensor:
    """Thorough rescoring over an LM: log p(y_t | context(x, z), y<t) of every candidate under every passage of its
    question, [C, K, T] (as :func:`rag_plugin.generation.adapters.score_candidates`, whose ``known`` and ``only``
    mean the same). ``contexts``: the B*K pairs' (question-major). Pairs are taken in chunks as there (at most
    1.25 x the real rows, ``max_cells`` logits); each pair's context runs once per chunk and is held once."""
    t = max(len(y) for y in tokens)
    out = torch.zeros(len(tokens), k, t)
    known = known or {}
    for (ci, d), scores in known.items():
        out[ci, d, : len(scores)] = scores
    wanted = _pairs_to_score(owner, k, known, only)
    if not wanted:
        return out
    target, prev = _teacher_forcing_rows(tokens, t, rag.pad, rag.eos)
    order = sorted(wanted, key=lambda pair: (-len(wanted[pair]), pair))
    for pairs, longest in _chunks(order, wanted, t * len(rag.dictionary), 1.25, max_cells):
        _score_lm_chunk(rag, contexts, pairs, longest, wanted, (target, prev), out, k)
    return out


def _score_lm_chunk(rag, contexts, pairs: List[int], longest: int, wanted, forcing, out: torch.Tensor,
                    k: int) -> None:
    """Teacher-force the chunk's (pair, candidate) rows into ``out``. Every pair gets ``longest`` rows (a shorter
    list repeats its last candidate), so each context is held once for its rows (models/lm_prefix_cache.py)."""
    target, prev = forcing
    device = contexts.tokens.device
    index = torch.tensor(pairs, device=device)
    state: Dict[str, Dict[str, Optional[torch.Tensor]]] = {}
    rag.reader.start(state, contexts.tokens.index_select(0, index), contexts.lengths.index_select(0, index))
    rag.reader.reorder(state, torch.arange(len(pairs), device=device).repeat_interleave(longest))
    slots = torch.tensor([wanted[p][min(j, len(wanted[p]) - 1)] for p in pairs for j in range(longest)])
    lengths = contexts.lengths.index_select(0, index).repeat_interleave(longest)
    logits = rag.reader.extend(state, prev[slots].to(device), lengths, 0)
    tgt = target[slots].to(device)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    lp = lp.masked_fill(tgt.eq(rag.pad), 0.0).cpu().view(len(pairs), longest, -1)
    for i, p in enumerate(pairs):
        cands = wanted[p]
        out[torch.tensor(cands), p % k] = lp[i, : len(cands)]


def lm_teacher_forced_token_lp(rag, contexts, targets: List[torch.Tensor]) -> torch.Tensor:
    """log p(y_t | context, y<t) [R, T] of ``targets`` (R token tensors ending in </s>), target r read after context
    row r of ``contexts`` (0 beyond each target's length): one packed forward (the encoder-decoder reader's
    :func:`rag_plugin.generation.adapters.teacher_forced_token_lp`)."""
    t = max(len(y) for y in targets)
    target, prev = _teacher_forcing_rows(targets, t, rag.pad, rag.eos)
    device = contexts.tokens.device
    target, prev = target.to(device), prev.to(device)
    logits = rag.reader.teacher_forced(contexts.tokens, contexts.lengths, prev)
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return lp.masked_fill(target.eq(rag.pad), 0.0)
