"""What a criterion adds for ``--retriever-loss`` and for the retriever's recall: its options
(:class:`RetrieverLossConfig`, on the dataclass of every criterion that adds the loss, as ``label_smoothing`` is on
fairseq's), the loss from a model's output (the math is :mod:`rag_plugin.core.retriever_losses`), the recall@K of
the gold passages, and their logging (``retriever_loss``, ``recall_at_K``).

A criterion (an :class:`AddsRetrieverLoss`) calls :func:`retriever_loss` with what it has computed anyway
(the per-document target log-probs of a RAG reader), adds ``weight x loss x sample_size / nsentences`` to its
summed loss (:meth:`AddsRetrieverLoss.with_retriever_loss`: after fairseq divides by the sample size, the
retriever loss enters as its mean per question), and puts :func:`retriever_stats` into its logging output.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from rag_plugin.core import retriever_losses as R
from rag_plugin.core.net_output import ATTENTION_KEY
from rag_plugin.util.errors import UserError

RETRIEVER_LOSSES = ("none", "pdist", "adist", "emdr2", "loop")


@dataclass
class RetrieverLossConfig(FairseqDataclass):
    retriever_loss: ChoiceEnum(list(RETRIEVER_LOSSES)) = field(default="none", metadata={
        "help": "a loss training the retriever towards the reader (Atlas): pdist, adist (FiD), emdr2 or loop"})
    retriever_loss_weight: float = field(default=1.0, metadata={
        "help": "weight of --retriever-loss (its mean per question) in the loss trained"})
    retriever_loss_start: int = field(default=0, metadata={
        "help": "the retriever loss joins the loss trained from this update on (logged only before)"})
    retriever_temperature: float = field(default=1.0, metadata={
        "help": "--retriever-loss compares its target with softmax(doc scores / this)"})
    retriever_target_temperature: float = field(default=1.0, metadata={
        "help": "the distillation target (pdist, adist, loop) is softmax(target logits / this)"})
    retriever_loss_only: bool = field(default=False, metadata={
        "help": "train on --retriever-loss alone (the reader's loss logged, not trained): with --freeze-generator "
                "and pdist, REPLUG's LM-supervised retrieval"})


def check_loss_options(cfg) -> None:
    """The retriever-loss options alone: one-line errors naming the option."""
    if str(cfg.retriever_loss) == "none":
        return
    if not float(cfg.retriever_loss_weight) >= 0:
        raise UserError(f"--retriever-loss-weight {cfg.retriever_loss_weight} is negative", fix="use a weight >= 0")
    if int(cfg.retriever_loss_start) < 0:
        raise UserError(f"--retriever-loss-start {cfg.retriever_loss_start} is negative",
                        fix="give the update the retriever loss starts at (0: from the first)")
    if not float(cfg.retriever_temperature) > 0:
        raise UserError(f"--retriever-temperature {cfg.retriever_temperature} must be positive", fix="e.g. 1")
    if not float(cfg.retriever_target_temperature) > 0:
        raise UserError(f"--retriever-target-temperature {cfg.retriever_target_temperature} must be positive",
                        fix="e.g. 1 or 0.1")
    if getattr(cfg, "retriever_loss_only", False) and int(cfg.retriever_loss_start) > 0:
        raise UserError("--retriever-loss-only trains nothing before --retriever-loss-start",
                        fix="leave --retriever-loss-start at 0 with --retriever-loss-only")


class AddsRetrieverLoss:
    """What a criterion that adds ``--retriever-loss`` shares (``marginal_nll``, ``reader_cross_entropy``): its
    options, read once from the criterion's config, the update the task hands it each step
    (``--retriever-loss-start``), and the weighted addition to its loss."""

    def init_retriever_loss(self, cfg: RetrieverLossConfig) -> None:
        check_loss_options(cfg)
        self.retriever_loss = str(cfg.retriever_loss)
        self.retriever_loss_weight = float(cfg.retriever_loss_weight)
        self.retriever_temperature = float(cfg.retriever_temperature)
        self.retriever_target_temperature = float(cfg.retriever_target_temperature)
        self.retriever_loss_start = int(cfg.retriever_loss_start)
        #: --retriever-loss-only: the reader's loss joins with weight 0 (logged; every parameter still gets a gradient)
        self.retriever_loss_only = bool(getattr(cfg, "retriever_loss_only", False))
        if self.retriever_loss_only and self.retriever_loss == "none":
            raise UserError("--retriever-loss-only needs a --retriever-loss to train", fix="add --retriever-loss pdist")
        self.update_num = 0

    def set_update(self, update_num: int) -> None:
        """The task's train_step: the update about to be trained (for --retriever-loss-start)."""
        self.update_num = int(update_num)

    def with_retriever_loss(self, loss: torch.Tensor, retriever: torch.Tensor, sample_size, nsentences: int):
        """``loss`` + weight x ``retriever`` x sample_size / nsentences from --retriever-loss-start on (before, the
        retriever loss is only logged): fairseq divides by sample_size, so its mean per question enters.

        Before the start it joins with weight 0: the parts only it trains (FiD's query encoder) get a zero
        gradient rather than none, as in every step. torch's DistributedDataParallel (``--ddp-backend
        pytorch_ddp``, ``find_unused_parameters=False``) stops at the next update on a parameter without one,
        and fairseq's ``legacy_ddp`` fills zeros in anyway: the optimizer sees the same gradients either way.
        With ``--retriever-loss-only`` the reader's loss joins with weight 0 in the same way."""
        if self.update_num < self.retriever_loss_start:
            return loss + retriever * 0.0
        if self.retriever_loss_only:
            loss = loss * 0.0
        return loss + retriever * (self.retriever_loss_weight * sample_size / max(nsentences, 1))


def retriever_loss(name: str, extra: dict, temperature: float, token_lp: Optional[torch.Tensor] = None,
                   doc_lp: Optional[torch.Tensor] = None, target_mask: Optional[torch.Tensor] = None,
                   variant: Optional[str] = None, target_temperature: float = 1.0) -> torch.Tensor:
    """Per-question retriever loss [B]. ``extra``: the model's output extras (``doc_scores`` [B, K], the
    retriever's logits with their gradient; for adist ``doc_attention_scores`` [B, K]). RAG readers hand
    ``token_lp`` [B, K, T] (log p(y_t|x,z,y<t)), ``doc_lp`` [B, K] (the model's prior), ``target_mask`` and
    ``variant`` (``token``/``sequence``, for loop)."""
    scores = extra["doc_scores"].float()
    if name == "adist":
        attention = extra.get(ATTENTION_KEY)
        if attention is None:
            raise UserError("--retriever-loss adist needs the reader's cross-attention scores over documents, and "
                            "this model's output has none", fix="use --retriever-loss pdist, emdr2 or loop")
        return R.adist_loss(scores, attention.float(), temperature, target_temperature)
    if token_lp is None:
        raise UserError(f"--retriever-loss {name} needs the reader's likelihood of the answer under each document, "
                        f"which this criterion does not compute", fix="use --criterion marginal_nll with a RAG model")
    if name == "loop":
        return R.loop_loss(scores, token_lp, doc_lp, target_mask, variant, temperature,
                           target_temperature=target_temperature)
    seq_lp = R.sequence_log_likelihood(token_lp, target_mask)
    if name == "pdist":
        return R.pdist_loss(scores, seq_lp, temperature, target_temperature)
    if name == "emdr2":
        return R.emdr2_loss(scores, seq_lp, temperature)
    raise ValueError(f"unknown retriever loss {name!r}")


def gold_hits(doc_rows: torch.Tensor, gold_rows: torch.Tensor) -> torch.Tensor:
    """Bool [B]: a gold passage of the question is among its retrieved rows (gold rows pad with -1)."""
    same = doc_rows.to(gold_rows.device).unsqueeze(-1) == gold_rows.unsqueeze(1)   # [B, K, G]
    return (same & gold_rows.ge(0).unsqueeze(1)).any(-1).any(-1)


def retriever_stats(doc_rows: Optional[torch.Tensor], gold_rows: Optional[torch.Tensor]) -> dict:
    """Logging-output entries for the recall@K of the gold passages: ``gold_hits_at_K`` (summed over the
    questions that have a gold passage in the knowledge source; their count is the criterion's
    ``n_with_gold``). Empty without retrieval or gold passages."""
    if doc_rows is None or gold_rows is None:
        return {}
    named = gold_rows.ge(0).any(-1)
    return {f"gold_hits_at_{doc_rows.size(1)}": (gold_hits(doc_rows, gold_rows) & named).sum().data}


def log_retriever_metrics(logging_outputs, metrics) -> None:
    """``retriever_loss`` (bits per question, as fairseq logs losses) and ``recall_at_K`` (share of the
    questions with a gold passage whose K retrieved passages hold one)."""
    def total(key):
        return sum(float(log.get(key, 0)) for log in logging_outputs)

    nsent = total("nsentences")
    if any("retriever_loss" in log for log in logging_outputs):
        metrics.log_scalar("retriever_loss", total("retriever_loss") / max(nsent, 1) / math.log(2), nsent, round=4)
    n_gold = total("n_with_gold")
    keys = sorted({k for log in logging_outputs for k in log if k.startswith("gold_hits_at_")})
    for key in keys:
        if n_gold > 0:
            metrics.log_scalar(f"recall_at_{key[len('gold_hits_at_'):]}", total(key) / n_gold, n_gold, round=4)
