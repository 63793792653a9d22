#!/usr/bin/env python
"""``rag-train`` (fairseq-train with the plugin and its command-line hooks) that also records, for every update,
the norm of the update (|theta_after - theta_before| over every trainable parameter, in float64), the loss scale
of the --fp16 / --amp wrapper, and whether the update was skipped (no weight moved: an overflow), as JSON lines in
``$GPU_CHECK_UPDATES``. Run by gpu_check.py; the command line is fairseq-train's.
"""
import json
import math
import os
import sys

import fairseq_cli.train  # noqa: F401  (first: it sets up fairseq's log format before fairseq is imported)
import torch
from fairseq.trainer import Trainer

from rag_plugin.cli.fairseq_commands import train

OUT = os.environ["GPU_CHECK_UPDATES"]


def _loss_scale(trainer):
    scaler = getattr(trainer.optimizer, "scaler", None)
    if scaler is None:
        return None
    if hasattr(scaler, "get_scale"):  # --amp: torch's GradScaler
        return float(scaler.get_scale())
    return float(scaler.loss_scale)  # --fp16: fairseq's DynamicLossScaler


def _snapshot(trainer):
    return [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]


def _update_norm(before, trainer) -> float:
    after = [p.detach() for p in trainer.model.parameters() if p.requires_grad]
    total = sum(float((a.double() - b.double()).pow(2).sum()) for a, b in zip(after, before))
    return math.sqrt(total)


_train_step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    before = _snapshot(self)
    scale = _loss_scale(self)
    result = _train_step(self, samples, raise_oom)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    norm = _update_norm(before, self)
    record = {"num_updates": self.get_num_updates(), "update_norm": norm, "skipped": norm == 0.0,
              "loss_scale_before": scale, "loss_scale_after": _loss_scale(self),
              "dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}
    with open(OUT, "a") as fh:
        fh.write(json.dumps(record) + "\n")
    return result


Trainer.train_step = train_step

if __name__ == "__main__":
    sys.exit(train())
