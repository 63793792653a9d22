"""Watching retrieval while a RAG model trains: a warning when it collapses.

A query encoder that learns too fast (a generator trained from scratch at lr 1e-3 beside a
pretrained query encoder at the same rate) can collapse within a few updates: every question
retrieves the same few passages, p(z|x) stops depending on the question, and only a valid
``gold_doc_prob`` near 0 shows it. :class:`CollapseMonitor` watches two signals the criterion
reports and logs one warning per episode:

* training: the share of a batch's questions whose top-1 passage is the batch's most common
  top-1 passage (``top1_shared / nsentences``), at least ``share`` for ``patience`` batches in a row;
* validation: the mean p(gold passage | x) of a whole validation pass below ``gold_floor`` while
  most questions share one top-1 passage, or falling below ``fall`` x that of the previous pass.

The validation check reads the logging outputs as fairseq hands them to the task's ``reduce_metrics``
(:meth:`CollapseMonitor.observe_reduced`): summed over every rank of a distributed job (each rank validates
1/N of the valid set, and a rank out of batches adds zeros), so the pass, its mean and the decision are the
whole valid set's, the same on every rank, and rank 0 alone logs the warning. The criterion marks a
validation step's outputs with :data:`VALID_KEY`.
"""
import logging
from typing import Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

#: the logging-output key (the questions of the batch) a criterion adds in validation (the model in eval mode)
VALID_KEY = "valid_questions"

ADVICE = ("lower the query encoder's learning rate (--query-encoder-lr-scale, e.g. 3e-5 / --lr), "
          "or --freeze-query-encoder")


def top1_shared(doc_rows: Optional[torch.Tensor]) -> int:
    """How many questions of the batch have the batch's most common top-1 passage (0 without retrieval)."""
    if doc_rows is None or doc_rows.size(0) < 2:
        return 0
    _, counts = torch.unique(doc_rows[:, 0].cpu(), return_counts=True)
    return int(counts.max())


class CollapseMonitor:
    def __init__(self, share: float = 0.5, patience: int = 20, min_batch: int = 4, gold_floor: float = 0.01,
                 fall: float = 0.2):
        self.share, self.patience, self.min_batch = share, patience, min_batch
        self.gold_floor, self.fall = gold_floor, fall
        self.run = 0
        self.previous_gold: Optional[float] = None
        self._valid = {"gold": 0.0, "n_gold": 0.0, "shared": 0.0, "n": 0.0}

    def observe_train(self, stats: dict) -> None:
        """One training batch's logging output (``top1_shared``, ``nsentences``)."""
        n = float(stats.get("nsentences", 0) or 0)
        if n < self.min_batch or "top1_shared" not in stats:
            return
        self.run = self.run + 1 if float(stats["top1_shared"]) / n >= self.share else 0
        if self.run == self.patience:
            logger.warning("retrieval looks collapsed: for %d batches in a row, at least %d%% of a batch's questions "
                           "retrieved the same top passage (%s)", self.patience, round(100 * self.share), ADVICE)

    def observe_reduced(self, logging_outputs, pass_sizes) -> None:
        """A step's logging outputs as the task's ``reduce_metrics`` receives them (summed over the ranks); only
        validation's (:data:`VALID_KEY`) count. A pass is complete when its questions reach one of
        ``pass_sizes`` (the sizes of the valid sets)."""
        valid = [stats for stats in logging_outputs if VALID_KEY in stats]
        for stats in valid:
            self.observe_valid(stats)
        if valid and self.valid_count() in set(pass_sizes):
            self.end_valid()

    def observe_valid(self, stats: dict) -> None:
        """One validation batch's logging output (of one rank, or summed over the ranks)."""
        for key, name in (("gold", "gold_doc_prob"), ("n_gold", "n_with_gold"), ("shared", "top1_shared"),
                          ("n", "nsentences")):
            self._valid[key] += float(stats.get(name, 0) or 0)

    def valid_count(self) -> int:
        """Validation examples seen since the last completed pass."""
        return int(self._valid["n"])

    def end_valid(self) -> None:
        """A validation pass is complete: check it, and start counting the next."""
        v, self._valid = self._valid, {"gold": 0.0, "n_gold": 0.0, "shared": 0.0, "n": 0.0}
        if v["n_gold"] == 0:
            return
        gold = v["gold"] / v["n_gold"]
        shared = v["shared"] / max(v["n"], 1.0)
        previous, self.previous_gold = self.previous_gold, gold
        if not _first_rank():  # every rank decides alike (the sums are the job's); one says so
            return
        if gold < self.gold_floor and shared >= self.share:
            logger.warning("retrieval looks collapsed on the valid set: mean p(gold passage | x) %.4f, and %d%% of the "
                           "questions share one top passage within their batch (%s)", gold, round(100 * shared),
                           ADVICE)
        elif previous is not None and previous >= 5 * self.gold_floor and gold < self.fall * previous:
            logger.warning("retrieval is getting worse on the valid set: mean p(gold passage | x) fell from %.4f to "
                           "%.4f (%s)", previous, gold, ADVICE)


def _first_rank() -> bool:
    """Not a distributed job, or its rank 0."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
