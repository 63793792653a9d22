"""Criterion ``reader_cross_entropy``: a reader that reads all its documents at once (Fusion-in-Decoder)
trained with cross-entropy on the answer, as fairseq's ``label_smoothed_cross_entropy`` computes it, plus
``--retriever-loss`` (``adist``: the decoder's cross-attention over the passages as the
retriever's target) and the retriever's recall of the gold passages (``recall_at_K``).

``loss`` is the sum trained; ``nll_loss`` the answer's cross-entropy alone; ``retriever_loss`` logged apart
(see :mod:`rag_plugin.criterions.retriever_loss`). With ``--retriever-loss none`` it trains exactly as
``label_smoothed_cross_entropy`` (tested), and logs the retriever's recall where the data names gold passages.
"""
from dataclasses import dataclass
from typing import Optional

from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

from rag_plugin.criterions import retriever_loss as RL
from rag_plugin.util.interpolation import interpolated


@dataclass
class ReaderCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig, RL.RetrieverLossConfig):
    pass


@register_criterion("reader_cross_entropy", dataclass=ReaderCrossEntropyConfig)
class ReaderCrossEntropyCriterion(RL.AddsRetrieverLoss, LabelSmoothedCrossEntropyCriterion):

    def __init__(self, task, cfg: Optional[ReaderCrossEntropyConfig] = None):
        cfg = cfg if cfg is not None else ReaderCrossEntropyConfig()
        super().__init__(task, bool(interpolated(cfg, "sentence_avg", False)), cfg.label_smoothing,
                         cfg.ignore_prefix_size, cfg.report_accuracy)
        self.init_retriever_loss(cfg)

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        nsentences = sample["target"].size(0)
        sample_size = nsentences if self.sentence_avg else sample["ntokens"]
        extra = net_output[1]
        stats = {"nll_loss": nll_loss.data, "ntokens": sample["ntokens"], "nsentences": nsentences,
                 "sample_size": sample_size}
        if self.retriever_loss != "none" and extra.get("doc_rows") is not None:
            retriever = RL.retriever_loss(self.retriever_loss, extra, self.retriever_temperature,
                                          target_temperature=self.retriever_target_temperature)   # [B]
            loss = self.with_retriever_loss(loss, retriever.sum(), sample_size, nsentences)
            stats["retriever_loss"] = retriever.sum().data
        stats["loss"] = loss.data
        gold = sample.get("gold_rows")
        if gold is not None and extra.get("doc_rows") is not None:
            stats["n_with_gold"] = gold.ge(0).any(-1).sum().data
            stats.update(RL.retriever_stats(extra["doc_rows"], gold))
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            stats["n_correct"], stats["total"] = n_correct.data, total.data
        return loss, sample_size, stats

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        RL.log_retriever_metrics(logging_outputs, metrics)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
