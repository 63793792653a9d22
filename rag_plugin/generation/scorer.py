"""Teacher-forced scores of given targets (``fairseq-generate --score-reference``).

Per-token scores are the model's own decomposition of log p(y|x): the RAG-Token
transition for ``rag_token``; the chain rule of the RAG-Sequence marginal for ``rag_seq``
(see :func:`rag_plugin.core.marginalization.rag_sequence_positional_scores`). The score is their
sum divided by the length, as fairseq's SequenceScorer reports it.
"""
import torch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import RagGeneratorBase


class RagScorer(RagGeneratorBase):
    def _generate(self, models, sample, **kwargs):
        rag = self.rag
        logits, extra = rag(**sample["net_input"])
        doc_lp = M.doc_log_prior(extra["doc_scores"].float())
        b, k = doc_lp.shape
        target = sample["target"]
        lprobs = torch.log_softmax(logits.float(), dim=-1).view(b, k, logits.size(1), -1)
        mask = target.ne(rag.pad)
        token_lp = M.target_token_log_probs(lprobs, target).masked_fill(~mask.unsqueeze(1), 0.0)
        if rag.variant == "sequence":
            positional = M.rag_sequence_positional_scores(token_lp, doc_lp)
        else:
            positional = M.rag_token_positional_scores(token_lp, doc_lp)
        return reference_hypotheses(target, positional, rag.pad), {"rows": extra["doc_rows"], "doc_lp": doc_lp}


def reference_hypotheses(target: torch.Tensor, positional: torch.Tensor, pad: int):
    """One hypothesis per target row in fairseq's form: the target without padding, its per-token scores
    (``positional`` [B, T]) and their sum divided by the length (fairseq's SequenceScorer)."""
    hypos = []
    for i, n in enumerate(target.ne(pad).sum(dim=1).tolist()):
        pos = positional[i, :n]
        hypos.append([{"tokens": target[i, :n], "score": pos.sum() / max(n, 1), "positional_scores": pos,
                       "alignment": None, "attention": None}])
    return hypos
