"""Adapters that present a RAG model to fairseq's SequenceGenerator.

fairseq's beam search drives ``model.encoder.forward_torchscript(net_input)``,
``model.encoder.reorder_encoder_out(out, new_order)``, ``model.decoder.forward(tokens,
encoder_out, incremental_state)``, ``model.decoder.reorder_incremental_state_scripting`` and
``model.get_normalized_probs``. The adapters translate the search's rows into the rows of the
BART generator:

* The generator's encoder runs once per (question, document) pair, and its output is never
  copied per beam: the encoder output keeps one row per pair for the whole search, and the
  decoder's rows are grouped so that the ``beam`` rows reading the same pair are adjacent
  (RAG-Token: (question, document, beam); RAG-Sequence: (pair, beam), fairseq's own layout).
  fairseq's cross-attention then computes each pair's keys and values once (its "beamable"
  path: query rows grouped over fewer key/value rows) and they are never reordered; only the
  decoder's self-attention cache follows the beams. When finished questions leave the
  search, their pairs are dropped from the encoder output and the cross-attention cache.
* RAG-Sequence Thorough rescoring runs the same way: the candidates of a question are scored
  under each of its documents with the candidates of one pair adjacent, reusing the encoder
  output (:func:`score_candidates`).
"""
from typing import Dict, List, Optional, Set, Tuple

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder, FairseqIncrementalDecoder

from rag_plugin.core import marginalization as M

_SEARCH_KEYS = ("doc_lp", "beams")  # entries of the adapters' encoder output that are not BART's


def expand_order(new_order: torch.Tensor, k: int) -> torch.Tensor:
    """Question-row order [N] -> (question, document)-row order [N*K]."""
    return (new_order.unsqueeze(1) * k + torch.arange(k, device=new_order.device)).view(-1)


def grouped_order(new_order: torch.Tensor, k: int, beam: int) -> torch.Tensor:
    """Search-row order [N] (row = question * beam + b) -> order of the decoder's
    (question, document, beam) rows [N*K] (row = (question * K + document) * beam + b)."""
    if beam == 1:
        return expand_order(new_order, k)
    src = new_order.view(-1, beam)                                    # [B', beam] source search rows
    question = torch.div(src, beam, rounding_mode="floor")
    b = src - question * beam
    docs = torch.arange(k, device=new_order.device).view(1, k, 1)
    return ((question.unsqueeze(1) * k + docs) * beam + b.unsqueeze(1)).reshape(-1)


def kept_groups(new_order: torch.Tensor, beam: int) -> torch.Tensor:
    """The sentences (groups of ``beam`` search rows) that a reorder keeps, in order."""
    return torch.div(new_order.view(-1, beam)[:, 0], beam, rounding_mode="floor")


def _bart_part(encoder_out):
    return {key: value for key, value in encoder_out.items() if key not in _SEARCH_KEYS}


def _select_pairs(rag, encoder_out, pairs: torch.Tensor):
    """The generator's encoder output restricted to the given pair rows (adapter keys kept; a score-biased FiD's
    ``passage_log_prior`` [rows, K], which BART's encoder does not know, restricted to them too)."""
    out = rag.generator.encoder.reorder_encoder_out(_bart_part(encoder_out), pairs)
    out.update({key: encoder_out[key] for key in _SEARCH_KEYS if key in encoder_out})
    if encoder_out.get("passage_log_prior"):  # rag_plugin.generation.fid_score_bias.PRIOR_KEY
        prior = encoder_out["passage_log_prior"][0]
        out["passage_log_prior"] = [prior.index_select(0, pairs.to(prior.device))]
    return out


def reorder_decoder_cache(decoder, incremental_state, row_order: torch.Tensor,
                          pairs: Optional[torch.Tensor]) -> None:
    """Reorder a BART decoder's incremental state: self-attention buffers by decoder row
    (``row_order``); cross-attention buffers (one row per pair) only when pairs were dropped
    (``pairs``: the pair rows kept, or None when they all stay)."""
    for layer in decoder.layers:
        layer.self_attn.reorder_incremental_state(incremental_state, row_order)
        cross = getattr(layer, "encoder_attn", None)
        if cross is None or pairs is None:
            continue
        buffer = cross._get_input_buffer(incremental_state)
        if not buffer:
            continue
        for key, value in list(buffer.items()):
            if value is not None and value.size(0) != pairs.numel():
                buffer[key] = value.index_select(0, pairs)
        cross._set_input_buffer(incremental_state, buffer)


class RetrievingEncoder(FairseqEncoder):
    """Retrieves K documents per question and encodes the B*K generator inputs once.

    Its output keeps one row per (question, document) pair for the whole search, plus
    ``doc_lp`` [N, K] per search row. fairseq's search does not return the encoder's output: the
    batch's retrieval (``rows`` [B, K], ``doc_lp`` [B, K]) waits in :meth:`take_retrieval` for the
    generator, which returns it with the hypotheses.
    """

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.beam = 1
        self._retrieval: Dict[str, Optional[torch.Tensor]] = {}

    def take_retrieval(self) -> Dict[str, Optional[torch.Tensor]]:
        """The retrieval of the batch just encoded (once)."""
        retrieval, self._retrieval = self._retrieval, {}
        return retrieval

    def forward_torchscript(self, net_input: Dict[str, torch.Tensor]):
        return self.forward(**net_input)

    def forward(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None, fixed_doc_scores=None,
                **unused):
        encoder_out, doc_scores, rows = self.rag.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                        fixed_doc_scores)
        doc_lp = M.doc_log_prior(doc_scores.float())
        self._retrieval = {"rows": rows, "doc_lp": doc_lp, "doc_scores": doc_scores, "encoder_out": encoder_out}
        encoder_out["doc_lp"] = [doc_lp]
        return encoder_out

    def reorder_encoder_out(self, encoder_out, new_order):
        doc_lp = encoder_out["doc_lp"][0]                                        # [N, K]
        k = doc_lp.size(1)
        out = encoder_out
        if encoder_out.get("beams"):  # after SequenceGenerator's first call (questions -> beams)
            kept = kept_groups(new_order, self.beam)
            if kept.numel() * k != encoder_out["encoder_out"][0].size(1):  # finished questions left
                out = _select_pairs(self.rag, encoder_out, expand_order(kept, k))
        out = dict(out)
        out["doc_lp"] = [doc_lp.index_select(0, new_order)]
        out["beams"] = [new_order.new_full((1,), self.beam)]
        return out


class MarginalizingDecoder(FairseqIncrementalDecoder):
    """RAG-Token's transition: log sum_z p(z|x) p(y_t | x, z, y<t), one step at a time.

    The search's rows are (question, beam); the generator's decoder runs over (question,
    document, beam) rows, so each pair's cross-attention keys and values serve its beams.
    """

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.n_docs = 1
        self.beam = 1

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        doc_lp = encoder_out["doc_lp"][0]                                        # [N, K]
        n, k = doc_lp.shape
        beam = n * k // encoder_out["encoder_out"][0].size(1)                    # search rows per question
        self.n_docs, self.beam = k, beam
        b, t = n // beam, prev_output_tokens.size(1)
        prev = prev_output_tokens.view(b, 1, beam, t).expand(b, k, beam, t).reshape(b * k * beam, t)
        logits, _ = self.rag.generator.decoder(prev, encoder_out=_bart_part(encoder_out),
                                               incremental_state=incremental_state)
        lprobs = torch.log_softmax(logits.float(), dim=-1).view(b, k, beam * logits.size(1), logits.size(2))
        question_lp = doc_lp.view(b, beam, k)[:, 0]                              # the same for every beam
        marginal = M.rag_token_marginal_lprobs(lprobs, question_lp)              # [b, beam * T, V]
        return marginal.view(n, logits.size(1), logits.size(2)), {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        kept = kept_groups(new_order, self.beam)
        reorder_decoder_cache(self.rag.generator.decoder, incremental_state,
                              grouped_order(new_order, self.n_docs, self.beam), expand_order(kept, self.n_docs))

    def max_positions(self):
        return self.rag.max_decoder_positions()


def _normalized(logits: torch.Tensor, log_probs: bool, already_log_probs: bool):
    lprobs = logits if already_log_probs else torch.log_softmax(logits.float(), dim=-1)
    return lprobs if log_probs else lprobs.exp()


class SearchModel(nn.Module):
    """What SequenceGenerator sees of a RAG model: an ``encoder`` and a ``decoder`` adapter, the rows per sentence
    handed to both (:meth:`set_beam_size`), and the decoder's outputs normalised. ``marginal``: the decoder already
    outputs log-probabilities (RAG-Token's marginal), renormalised only under a temperature."""

    marginal = False

    def __init__(self, rag, encoder, decoder):
        super().__init__()
        self.rag = rag
        self.encoder = encoder
        self.decoder = decoder
        self.temperature = 1.0  # the generator's (RAG-Token sets it); at 1 the marginals are already normalised

    def set_beam_size(self, beam: int) -> None:
        """Called by SequenceGenerator with the rows per sentence (fairseq's beamable attention hook)."""
        for part in (self.encoder, self.decoder):
            if hasattr(part, "beam"):
                part.beam = int(beam)

    def max_decoder_positions(self):
        return self.rag.max_decoder_positions()

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        # renormalising is the identity at temperature 1 and tempers correctly otherwise
        return _normalized(net_output[0], log_probs, already_log_probs=self.marginal and self.temperature == 1.0)


class RagTokenSearchModel(SearchModel):
    """What SequenceGenerator sees for RAG-Token: outputs are marginal log-probabilities."""

    marginal = True

    def __init__(self, rag):
        super().__init__(rag, RetrievingEncoder(rag), MarginalizingDecoder(rag))


class CachedEncoder(FairseqEncoder):
    """Hands SequenceGenerator an encoder output computed beforehand: one row per pair, kept
    un-expanded through the search (``beams`` marks that the search has started)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.cached = None
        self.beam = 1

    def forward_torchscript(self, net_input):
        return self.cached

    def reorder_encoder_out(self, encoder_out, new_order):
        if not encoder_out.get("beams"):  # SequenceGenerator's first call: each pair -> its beams
            out = dict(encoder_out)
            out["beams"] = [new_order.new_full((1,), self.beam)]
            return out
        kept = kept_groups(new_order, self.beam)
        if kept.numel() == encoder_out["encoder_out"][0].size(1):
            return encoder_out
        return _select_pairs(self.rag, encoder_out, kept)


class PairDecoder(FairseqIncrementalDecoder):
    """The plain BART decoder over (question, document) rows: p(y_t | x, z, y<t)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.beam = 1

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        logits, _ = self.rag.generator.decoder(prev_output_tokens, encoder_out=_bart_part(encoder_out),
                                               incremental_state=incremental_state)
        return logits, {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        reorder_decoder_cache(self.rag.generator.decoder, incremental_state, new_order,
                              kept_groups(new_order, self.beam))

    def max_positions(self):
        return self.rag.max_decoder_positions()


class PerDocumentSearchModel(SearchModel):
    """What SequenceGenerator sees for RAG-Sequence: one independent beam per document."""

    def __init__(self, rag):
        super().__init__(rag, CachedEncoder(rag), PairDecoder(rag))


def score_candidates(rag, encoder_out, k: int, owner: torch.Tensor, tokens: List[torch.Tensor],
                     known: Optional[Dict[Tuple[int, int], torch.Tensor]] = None,
                     max_cells: int = 16_000_000, max_padding: float = 1.25,
                     only: Optional[Set[Tuple[int, int]]] = None) -> torch.Tensor:
    """Thorough rescoring: log p(y_t | x, z, y<t) of every candidate under every document of
    its question, [C, K, T] (T = longest candidate; 0 beyond each candidate's length).

    ``encoder_out`` holds one row per (question, document) pair (question-major), ``owner``
    Long[C] the question of each candidate, ``tokens`` the C candidates (each ending in </s>).
    ``known[(c, d)]``: per-token scores already computed for candidate c under document d
    (its beam found it); only the other (candidate, document) pairs run the decoder, as in
    the paper's Thorough decoding. ``only``: score just these (candidate, document) pairs (the
    others stay 0; RAG-Sequence Fast when its beams' scores are not the model's). Pairs are taken in
    chunks; a chunk runs the decoder once over
    rows grouped by pair, every pair's list padded to the chunk's longest (at most
    ``max_padding`` x the real rows, at most ``max_cells`` logits), so the cross-attention keys
    and values of a pair are computed once and shared by its candidates.
    """
    t = max(len(y) for y in tokens)
    out = torch.zeros(len(tokens), k, t)
    known = known or {}
    for (ci, d), scores in known.items():
        out[ci, d, : len(scores)] = scores
    wanted = _pairs_to_score(owner, k, known, only)       # pair row -> candidates to score under it
    if not wanted:
        return out
    target, prev = _teacher_forcing_rows(tokens, t, rag.pad, rag.eos)
    order = sorted(wanted, key=lambda pair: (-len(wanted[pair]), pair))
    vocab = len(rag.dictionary)
    for pairs, longest in _chunks(order, wanted, t * vocab, max_padding, max_cells):
        _score_chunk(rag, encoder_out, pairs, longest, wanted, (target, prev), out, k, max_cells // (t * vocab))
    return out


def _pairs_to_score(owner: torch.Tensor, k: int, known, only) -> Dict[int, List[int]]:
    """(question, document) pair row -> the candidates of that question still to be scored under it."""
    by_question: Dict[int, List[int]] = {}
    for i, q in enumerate(owner.tolist()):
        by_question.setdefault(q, []).append(i)
    wanted = {}
    for q, cands in by_question.items():
        for d in range(k):
            todo = [ci for ci in cands if (ci, d) not in known and (only is None or (ci, d) in only)]
            if todo:
                wanted[q * k + d] = todo
    return wanted


def _chunks(order: List[int], wanted: Dict[int, List[int]], cells_per_row: int, max_padding: float,
            max_cells: int):
    """``(pairs, longest list)`` chunks of ``order``: each chunk's lists padded to its longest stay within
    ``max_padding`` x the real rows and ``max_cells`` logits (a first pair always goes in)."""
    start = 0
    while start < len(order):
        longest = len(wanted[order[start]])
        end, real = start, 0
        while end < len(order):
            n = len(wanted[order[end]])
            rows = (end - start + 1) * longest
            if end > start and (rows > max_padding * (real + n) or rows * cells_per_row > max_cells):
                break
            real += n
            end += 1
        yield order[start:end], longest
        start = end


def _score_chunk(rag, encoder_out, pairs: List[int], longest: int, wanted, forcing, out: torch.Tensor, k: int,
                 max_rows: int) -> None:
    """Teacher-force the chunk's (pair, candidate) rows into ``out``; a single long list goes in slices."""
    target, prev = forcing
    t = target.size(1)
    device = encoder_out["encoder_out"][0].device
    enc = rag.generator.encoder.reorder_encoder_out(_bart_part(encoder_out), torch.tensor(pairs, device=device))
    step = max(1, max_rows // len(pairs))
    for lo in range(0, longest, step):
        hi = min(longest, lo + step)
        # rows (pair, slot); a shorter list repeats its last candidate
        rows = torch.tensor([wanted[p][min(j, len(wanted[p]) - 1)] for p in pairs for j in range(lo, hi)])
        logits, _ = rag.generator.decoder(prev[rows].to(device), encoder_out=enc)
        tgt = target[rows].to(device)
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        lp = lp.masked_fill(tgt.eq(rag.pad), 0.0).view(len(pairs), hi - lo, t).cpu()
        del logits
        for pi, p in enumerate(pairs):
            cands = wanted[p][lo:hi]
            if cands:
                out[torch.tensor(cands), p % k] = lp[pi, : len(cands)]


def _teacher_forcing_rows(targets: List[torch.Tensor], t: int, pad: int, eos: int):
    """Targets right-padded to ``t`` and the decoder inputs fairseq feeds for them
    (``</s> y1 ... y_{n-1}``): two Long[R, t] tensors."""
    target = torch.full((len(targets), t), pad, dtype=torch.long)
    prev = torch.full((len(targets), t), pad, dtype=torch.long)
    for i, y in enumerate(targets):
        target[i, : len(y)] = y
        prev[i, 0] = eos
        prev[i, 1: len(y)] = y[:-1]
    return target, prev


def teacher_forced_token_lp(rag, encoder_out, pair_rows: torch.Tensor, targets: List[torch.Tensor],
                            max_cells: int = 64_000_000) -> torch.Tensor:
    """log p(y_t | x, z, y<t) of given targets (each ending in </s>) under given pair rows.

    ``pair_rows`` Long[R] selects rows of ``encoder_out`` (question-major pair rows);
    ``targets`` R token tensors. Returns [R, T] (T = longest target), 0 beyond each length.
    Chunked so that no logits tensor exceeds ``max_cells`` floats.
    """
    pad, eos = rag.pad, rag.eos
    r = len(targets)
    t = max(len(x) for x in targets)
    target, prev = _teacher_forcing_rows(targets, t, pad, eos)
    device = encoder_out["encoder_out"][0].device
    target, prev, pair_rows = target.to(device), prev.to(device), pair_rows.to(device)
    vocab = len(rag.dictionary)
    step = max(1, max_cells // max(1, t * vocab))
    out = torch.zeros(r, t, device=device)
    encoder = rag.generator.encoder
    for start in range(0, r, step):
        sl = slice(start, start + step)
        enc = encoder.reorder_encoder_out(encoder_out, pair_rows[sl])
        logits, _ = rag.generator.decoder(prev[sl], encoder_out=enc)
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, target[sl].unsqueeze(-1)).squeeze(-1)
        out[sl] = lp.masked_fill(target[sl].eq(pad), 0.0)
    return out


def ordinary_tensors(hypos):
    """Copies of the hypotheses' tensors made outside inference mode (fairseq edits them in place)."""
    return [[{key: (value.clone() if torch.is_tensor(value) else value) for key, value in h.items()} for h in hyps]
            for hyps in hypos]


class SentenceIds:
    """The sample ids behind the rows of a search, for ``prefix_allowed_tokens_fn``.

    fairseq's prefix-constrained search calls ``fn(batch_id, tokens)`` with the row's entry of the
    sample's ``"id"`` (fairseq-generate: the dataset id). The RAG searches run without ``"id"``
    (their rows are (question, document) pairs, or diverse beam search would index its per-batch
    buffers with dataset ids), so fairseq passes the row number; :meth:`wrap` turns it back into
    the question's sample id (its position in the batch when the sample has no ``"id"``).
    """

    def __init__(self):
        self.ids: List[int] = []

    def set(self, sample, rows_per_sample: int = 1) -> None:
        ids = sample.get("id")
        ids = ids.tolist() if torch.is_tensor(ids) else list(range(sample["net_input"]["src_tokens"].size(0)))
        self.ids = [i for i in ids for _ in range(rows_per_sample)]

    def wrap(self, fn):
        if fn is None:
            return None

        def allowed(batch_id, tokens):
            return fn(self.ids[int(batch_id)], tokens)

        return allowed


def attach_retrieval(hypos, rows: Optional[torch.Tensor], doc_lp: torch.Tensor) -> None:
    """Give every hypothesis of sample i its question's documents: ``doc_rows`` (Long [K], passage-store
    rows; None closed book) and ``doc_log_prior`` ([K], log p(z|x)), in retrieval order."""
    for i, hyps in enumerate(hypos):
        for h in hyps:
            h["doc_rows"] = None if rows is None else rows[i]
            h["doc_log_prior"] = doc_lp[i]


def retrieval_of(hypos):
    """``(rows [B, K] or None, doc_lp [B, K])`` back from hypotheses that :func:`attach_retrieval` marked
    (None, None when they carry none)."""
    firsts = [hyps[0] for hyps in hypos if hyps]
    if len(firsts) != len(hypos) or not firsts or "doc_log_prior" not in firsts[0]:
        return None, None
    doc_lp = torch.stack([h["doc_log_prior"] for h in firsts])
    rows = None if firsts[0]["doc_rows"] is None else torch.stack([h["doc_rows"] for h in firsts])
    return rows, doc_lp


class RagGeneratorBase:
    """What fairseq-generate calls: ``generate`` runs ``_generate`` (which returns the hypotheses and the
    batch's retrieval) in inference mode and hands back hypotheses of ordinary tensors, each carrying
    its question's documents (:func:`attach_retrieval`)."""

    def __init__(self, rag):
        self.rag = rag
        self.symbols_to_strip_from_output = {rag.bos, rag.eos}
        self._sentence_ids = SentenceIds()
        #: with ``keep_retrieval`` (off: fairseq-generate would hold a batch's encoder output into the next), the
        #: last batch's retrieval (``rows``, ``doc_lp``, and where the generator has them ``doc_scores``, the
        #: logits, and ``encoder_out``, the B*K pairs encoded), for a caller that explains the answers
        #: (rag_plugin/serving/explain.py) without retrieving and encoding again; replaced by the next batch
        self.keep_retrieval = False
        self.last_retrieval: Dict[str, Optional[torch.Tensor]] = {}

    def cuda(self):
        search = getattr(self, "search", None)
        if search is not None:
            search.cuda()
        return self

    def generate(self, models, sample, **kwargs):
        with torch.inference_mode():
            hypos, retrieval = self._generate(models, sample, **kwargs)
        hypos = ordinary_tensors(hypos)
        self.last_retrieval = retrieval if self.keep_retrieval else {}
        rows, doc_lp = retrieval.get("rows"), retrieval.get("doc_lp")
        attach_retrieval(hypos, None if rows is None else rows.clone(), doc_lp.clone())
        return hypos

    def _generate(self, models, sample, **kwargs):
        raise NotImplementedError
