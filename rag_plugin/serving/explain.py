"""Why a model answered what it did: each passage's posterior given the answer, and RAG-Token's per-token posterior
over the passages (the paper's Figure 2), by teacher-forcing the answer through the decoder over every (question,
passage) pair the generator encoded.

``posterior`` p(z | x, y) ∝ p(z | x) p(y | x, z) is the passage's share of the whole answer (RAG-Sequence's own
posterior); ``token_posterior`` p(z | x, y_t, y<t) is RAG-Token's, per answer token. Both with the marginalisation
of :mod:`rag_plugin.core.marginalization`."""
from typing import List, Optional

import torch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import teacher_forced_token_lp
from rag_plugin.generation.lm_adapters import lm_teacher_forced_token_lp


def token_texts(tokenizer, tokens: List[int], eos: int) -> List[str]:
    """The answer's tokens as the text each adds (they concatenate to the decoded answer); ``</s>`` for the end."""
    out, before = [], ""
    for t in range(len(tokens)):
        if tokens[t] == eos:
            out.append("</s>")
            continue
        now = tokenizer.decode(tokens[: t + 1])
        last = t + 1 == len(tokens) or tokens[t + 1] == eos
        if not last and (now.endswith("\ufffd") or not now.startswith(before)):
            out.append("")  # a character split over byte tokens (BPE): the token that completes it adds it
            continue
        out.append(now[len(before):] if now.startswith(before) else now)
        before = now
    return out


@torch.inference_mode()
def posteriors(rag, encoder_out: dict, doc_lp: torch.Tensor, best: List[torch.Tensor], token_level: bool):
    """(posterior [B, K], token posterior [B, K, T] or None) of each question's answer ``best[i]`` (ending in
    ``</s>``) over the K passages the generator read: ``encoder_out``, the B*K (question, passage) pairs as the
    generator encoded them (its ``last_retrieval``; a decoder-only reader's: their contexts), ``doc_lp`` [B, K] their
    log p(z|x)."""
    b, k = doc_lp.shape
    targets = [best[i] for i in range(b) for _ in range(k)]
    if getattr(rag, "decoder_only", False):  # rag_lm_*: the pairs' contexts, read by the LM
        lp = lm_teacher_forced_token_lp(rag, encoder_out, targets).view(b, k, -1).cpu().float()
    else:
        lp = teacher_forced_token_lp(rag, encoder_out, torch.arange(b * k), targets).view(b, k, -1).cpu().float()
    t = lp.size(-1)
    mask = torch.tensor([[j < len(best[i]) for j in range(t)] for i in range(b)])
    doc_lp = doc_lp.cpu().float()
    seq = M.rag_sequence_doc_log_posterior(lp, doc_lp, mask).exp()
    tok: Optional[torch.Tensor] = M.rag_token_doc_posterior(lp, doc_lp) if token_level else None
    return seq, tok
