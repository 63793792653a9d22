"""Adapters that present a RAG model to fairseq's SequenceGenerator.

fairseq's beam search drives ``model.encoder.forward_torchscript(net_input)``,
``model.encoder.reorder_encoder_out(out, new_order)``, ``model.decoder.forward(tokens,
encoder_out, incremental_state)``, ``model.decoder.reorder_incremental_state_scripting`` and
``model.get_normalized_probs``. Rows of the search are questions (x beams); rows of the BART
generator are (question, document) pairs, question-major. The adapters translate one into
the other, so the generator's encoder runs once per pair and its incremental cache is
reordered together with the document dimension.
"""
from typing import Dict, List, Optional

import torch
import torch.nn as nn
from fairseq.models import FairseqEncoder, FairseqIncrementalDecoder

from rag_plugin import marginalization as M


def expand_order(new_order: torch.Tensor, k: int) -> torch.Tensor:
    """Question-row order [N] -> (question, document)-row order [N*K]."""
    return (new_order.unsqueeze(1) * k + torch.arange(k, device=new_order.device)).view(-1)


class RetrievingEncoder(FairseqEncoder):
    """Retrieves K documents per question and encodes the B*K generator inputs once.

    Keeps the last batch's retrieval (``last["rows"]`` [B, K], ``last["doc_lp"]`` [B, K])
    for provenance.
    """

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.last: Dict[str, Optional[torch.Tensor]] = {}

    def forward_torchscript(self, net_input: Dict[str, torch.Tensor]):
        return self.forward(**net_input)

    def forward(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None, fixed_doc_scores=None,
                **unused):
        encoder_out, doc_scores, rows = self.rag.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                        fixed_doc_scores)
        doc_lp = M.doc_log_prior(doc_scores.float())
        self.last = {"rows": rows, "doc_lp": doc_lp}
        encoder_out["doc_lp"] = [doc_lp]
        return encoder_out

    def reorder_encoder_out(self, encoder_out, new_order):
        doc_lp = encoder_out["doc_lp"][0]
        inner = {key: value for key, value in encoder_out.items() if key != "doc_lp"}
        out = self.rag.generator.encoder.reorder_encoder_out(inner, expand_order(new_order, doc_lp.size(1)))
        out["doc_lp"] = [doc_lp.index_select(0, new_order)]
        return out


class MarginalizingDecoder(FairseqIncrementalDecoder):
    """RAG-Token's transition: log sum_z p(z|x) p(y_t | x, z, y<t), one step at a time."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.n_docs = 1

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        doc_lp = encoder_out["doc_lp"][0]                                        # [N, K]
        n, k = doc_lp.shape
        self.n_docs = k
        prev = prev_output_tokens.repeat_interleave(k, dim=0) if k > 1 else prev_output_tokens
        logits, _ = self.rag.generator.decoder(prev, encoder_out=encoder_out, incremental_state=incremental_state)
        lprobs = torch.log_softmax(logits.float(), dim=-1)
        lprobs = lprobs.view(n, k, lprobs.size(1), lprobs.size(2))
        return M.rag_token_marginal_lprobs(lprobs, doc_lp), {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        self.rag.generator.decoder.reorder_incremental_state_scripting(
            incremental_state, expand_order(new_order, self.n_docs))

    def max_positions(self):
        return self.rag.max_decoder_positions()


class RagTokenSearchModel(nn.Module):
    """What SequenceGenerator sees for RAG-Token: outputs are marginal log-probabilities."""

    def __init__(self, rag):
        super().__init__()
        self.rag = rag
        self.encoder = RetrievingEncoder(rag)
        self.decoder = MarginalizingDecoder(rag)

    def max_decoder_positions(self):
        return self.rag.max_decoder_positions()

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        # renormalising is the identity at temperature 1 and tempers correctly otherwise
        lprobs = torch.log_softmax(net_output[0].float(), dim=-1)
        return lprobs if log_probs else lprobs.exp()


class CachedEncoder(FairseqEncoder):
    """Hands SequenceGenerator an encoder output computed beforehand (B*K pair rows)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag
        self.cached = None

    def forward_torchscript(self, net_input):
        return self.cached

    def reorder_encoder_out(self, encoder_out, new_order):
        return self.rag.generator.encoder.reorder_encoder_out(encoder_out, new_order)


class PairDecoder(FairseqIncrementalDecoder):
    """The plain BART decoder over (question, document) rows: p(y_t | x, z, y<t)."""

    def __init__(self, rag):
        super().__init__(rag.dictionary)
        self.rag = rag

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **unused):
        logits, _ = self.rag.generator.decoder(prev_output_tokens, encoder_out=encoder_out,
                                               incremental_state=incremental_state)
        return logits, {"attn": [None]}

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        self.rag.generator.decoder.reorder_incremental_state_scripting(incremental_state, new_order)

    def max_positions(self):
        return self.rag.max_decoder_positions()


class PerDocumentSearchModel(nn.Module):
    """What SequenceGenerator sees for RAG-Sequence: one independent beam per document."""

    def __init__(self, rag):
        super().__init__()
        self.rag = rag
        self.encoder = CachedEncoder(rag)
        self.decoder = PairDecoder(rag)

    def max_decoder_positions(self):
        return self.rag.max_decoder_positions()

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        lprobs = torch.log_softmax(net_output[0].float(), dim=-1)
        return lprobs if log_probs else lprobs.exp()


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
    target = torch.full((r, t), pad, dtype=torch.long)
    prev = torch.full((r, t), pad, dtype=torch.long)
    for i, y in enumerate(targets):
        target[i, : len(y)] = y
        prev[i, 0] = eos
        prev[i, 1: len(y)] = y[:-1]
    device = encoder_out["encoder_out"][0].device
    target, prev = target.to(device), prev.to(device)
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


class RagGeneratorBase:
    """What fairseq-generate calls: ``generate`` runs ``_generate`` in inference mode and hands
    back ordinary tensors; ``last_retrieval`` keeps the batch's documents for provenance."""

    def __init__(self, rag):
        self.rag = rag
        self.symbols_to_strip_from_output = {rag.bos, rag.eos}
        self.last_retrieval = {}

    def cuda(self):
        search = getattr(self, "search", None)
        if search is not None:
            search.cuda()
        return self

    def generate(self, models, sample, **kwargs):
        with torch.inference_mode():
            hypos = self._generate(models, sample, **kwargs)
        return ordinary_tensors(hypos)

    def _generate(self, models, sample, **kwargs):
        raise NotImplementedError
