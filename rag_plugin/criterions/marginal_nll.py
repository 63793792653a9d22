"""Criterion ``marginal_nll``: the paper's training objective, -log p(y|x) marginalised over
the top-K retrieved documents (RAG-Sequence or RAG-Token, as the model says).

Reports fairseq's usual ``loss``/``nll_loss`` (base 2, per target token) and, as retrieval
health, the entropy of p(z|x), the mean top-1 document probability, the share of a batch's
questions that retrieve the batch's most common top passage (``top1_share``: near 1 when
retrieval collapses; see :mod:`rag_plugin.criterions.retrieval_health`) and, where the data
names gold passages, the mean p(gold passage | x) over the retrieved documents and the retriever's
recall@K of them (``recall_at_K``).

With ``--retriever-loss`` (see :mod:`rag_plugin.criterions.retriever_loss`), the retriever loss
computed from this criterion's per-document target log-probs is added with its weight and logged apart
(``retriever_loss``); ``loss`` is the sum trained, ``nll_loss`` the marginal NLL alone.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from omegaconf import II

from rag_plugin.core import marginalization as M
from rag_plugin.criterions import retriever_loss as RL
from rag_plugin.criterions.retrieval_health import VALID_KEY, top1_shared
from rag_plugin.util.errors import UserError
from rag_plugin.util.interpolation import interpolated


@dataclass
class MarginalNLLConfig(RL.RetrieverLossConfig):
    label_smoothing: float = field(default=0.0, metadata={"help": "epsilon for label smoothing (0 = none)"})
    sentence_avg: bool = II("optimization.sentence_avg")
    best_checkpoint_metric: str = II("checkpoint.best_checkpoint_metric")
    target_format: str = II("task.target_format")


def doc_log_prior_of(net_output) -> torch.Tensor:
    """log p(z|x) [B, K] from a RAG model's output (zeros [B, 1] for closed book)."""
    return M.doc_log_prior(net_output[1]["doc_scores"].float())


def gold_doc_prob(doc_lp: torch.Tensor, doc_rows, gold_rows) -> torch.Tensor:
    """Sum of p(z|x) over retrieved documents that are gold passages: [B] (0 if none retrieved)."""
    if doc_rows is None or gold_rows is None:
        return doc_lp.new_zeros(doc_lp.size(0))
    same = doc_rows.to(gold_rows.device).unsqueeze(-1) == gold_rows.unsqueeze(1)           # [B, K, G]
    hit = (same & gold_rows.ge(0).unsqueeze(1)).any(-1)  # [B, K]; gold rows pad with -1, never a hit
    return (doc_lp.exp() * hit.to(doc_lp)).sum(-1)


@register_criterion("marginal_nll", dataclass=MarginalNLLConfig)
class MarginalNLLCriterion(RL.AddsRetrieverLoss, FairseqCriterion):

    def __init__(self, task, cfg: Optional[MarginalNLLConfig] = None):
        super().__init__(task)
        cfg = cfg if cfg is not None else MarginalNLLConfig()
        self.eps = float(cfg.label_smoothing)
        # fairseq's --sentence-avg: gradients averaged per example, not per token
        self.sentence_avg = bool(interpolated(cfg, "sentence_avg", False))
        self.best_checkpoint_metric = str(interpolated(cfg, "best_checkpoint_metric", "loss"))
        # --target-format hf: transformers' RAG-Sequence objective, its label-smoothing term included
        self.hf_target = str(interpolated(cfg, "target_format", "plugin")) == "hf"
        self.init_retriever_loss(cfg)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll, doc_lp, lprobs = self.marginal(model, net_output, sample)
        ntokens = sample["ntokens"]
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else ntokens
        retriever = None
        if self.retriever_loss != "none" and net_output[1].get("doc_rows") is not None:
            retriever = self.compute_retriever_loss(model, net_output, sample, doc_lp, lprobs)
            loss = self.with_retriever_loss(loss, retriever, sample_size, nsentences)
        stats = {
            "loss": loss.sum().data if reduce else loss.data,
            "nll_loss": nll.sum().data,
            "ntokens": ntokens,
            "nsentences": nsentences,
            "sample_size": sample_size,
            "doc_entropy": M.doc_posterior_entropy(doc_lp).sum().data,
            "top1_doc_prob": M.top1_doc_prob(doc_lp).sum().data,
            "top1_shared": top1_shared(net_output[1].get("doc_rows")),  # rows live on the host: no device sync
        }
        if retriever is not None:
            stats["retriever_loss"] = retriever.sum().data
        if not model.training:  # a validation step's: the valid-set collapse check counts them (retrieval_health)
            stats[VALID_KEY] = nsentences
        gold = sample.get("gold_rows")
        if (not model.training and self.best_checkpoint_metric == "gold_doc_prob"
                and (gold is None or net_output[1].get("doc_rows") is None)):
            what = ("this model retrieves nothing (--n-docs 0)" if net_output[1].get("doc_rows") is None
                    else "this valid set names none that is in the knowledge source")
            raise UserError(f"--best-checkpoint-metric gold_doc_prob needs retrieved documents and gold passages "
                            f"(provenance) in the valid set; {what}",
                            fix="choose another --best-checkpoint-metric (e.g. loss), or add provenance to the "
                                "valid set")
        if gold is not None and net_output[1].get("doc_rows") is not None:
            stats["gold_doc_prob"] = gold_doc_prob(doc_lp, net_output[1]["doc_rows"], gold).sum().data
            stats["n_with_gold"] = gold.ge(0).any(-1).sum().data  # a tensor like the others: no device sync
            stats.update(RL.retriever_stats(net_output[1]["doc_rows"], gold))
        return (loss.sum() if reduce else loss), sample_size, stats

    def compute_loss(self, model, net_output, sample):
        """Per-example (loss [B], nll [B], doc_lp [B, K])."""
        return self.marginal(model, net_output, sample)[:3]

    def marginal(self, model, net_output, sample):
        """(loss [B], nll [B], doc_lp [B, K], lprobs [B, K, T, V]): the marginal and what it was computed from."""
        doc_lp = doc_log_prior_of(net_output)
        b, k = doc_lp.shape
        logits = net_output[0]
        lprobs = torch.log_softmax(logits.float(), dim=-1).view(b, k, logits.size(1), logits.size(2))
        target = sample["target"]
        mask = target.ne(self.padding_idx)
        if model.variant == "sequence":
            loss, nll = M.rag_sequence_loss(lprobs, doc_lp, target, mask, epsilon=self.eps, hf_compat=self.hf_target)
        else:
            loss, nll = M.rag_token_loss(lprobs, doc_lp, target, mask, epsilon=self.eps)
        return loss, nll, doc_lp, lprobs

    def compute_retriever_loss(self, model, net_output, sample, doc_lp, lprobs):
        """--retriever-loss per question [B], from the marginal's own log-probs (the target's
        [B, K, T] gathered from them again: nothing next to the [B, K, T, V] log-softmax)."""
        target = sample["target"]
        token_lp = M.target_token_log_probs(lprobs, target)
        return RL.retriever_loss(self.retriever_loss, net_output[1], self.retriever_temperature, token_lp=token_lp,
                                 doc_lp=doc_lp, target_mask=target.ne(self.padding_idx), variant=model.variant,
                                 target_temperature=self.retriever_target_temperature)

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return sum(float(log.get(key, 0)) for log in logging_outputs)

        ntokens, nsent, sample_size = total("ntokens"), total("nsentences"), total("sample_size")
        # as fairseq's cross_entropy: loss per sample_size (per example under --sentence-avg), nll per token
        metrics.log_scalar("loss", total("loss") / max(sample_size, 1) / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / max(ntokens, 1) / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: 2 ** meters["nll_loss"].avg)
        metrics.log_scalar("doc_entropy", total("doc_entropy") / max(nsent, 1), nsent, round=3)
        metrics.log_scalar("top1_doc_prob", total("top1_doc_prob") / max(nsent, 1), nsent, round=3)
        metrics.log_scalar("top1_share", total("top1_shared") / max(nsent, 1), nsent, round=3)
        n_gold = total("n_with_gold")
        if n_gold > 0:
            metrics.log_scalar("gold_doc_prob", total("gold_doc_prob") / n_gold, n_gold, round=4)
        RL.log_retriever_metrics(logging_outputs, metrics)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
