"""``--optimizer torch_adamw``: torch's AdamW with its fused kernel, for fairseq-train.

fairseq's ``adam`` steps each parameter tensor in a Python loop on a machine without CUDA
(its fused Adam needs apex and a GPU). torch's fused AdamW updates every tensor in one
kernel on CPU as on GPU: about half the time of fairseq's loop on the benchmark's 13M
parameters (BENCHMARKS.md). Same hyper-parameters and update as fairseq's ``adam``, which
is AdamW too (decoupled weight decay); the one difference is where epsilon sits: fairseq
adds it to sqrt(v) before the bias correction, torch after (an epsilon of 1e-8 scaled by
at most sqrt(1 - beta2), invisible unless a gradient is ~1e-8).

Checkpoints written with ``adam`` resume with ``torch_adamw`` (and back) only with
``--reset-optimizer``: fairseq keeps optimizer state per optimizer class.
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from rag_plugin.errors import UserError

#: dtypes and devices torch's fused AdamW accepts; anything else steps with its foreach loop.
_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")


@dataclass
class TorchAdamWConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam, e.g. '(0.9, 0.98)'"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for Adam"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay (AdamW), as fairseq's adam"})
    lr: List[float] = II("optimization.lr")


def parse_betas(betas: Any) -> tuple:
    """``'(0.9, 0.98)'`` (the CLI's string), a list or a tuple -> (beta1, beta2), checked."""
    if isinstance(betas, str):
        try:
            parts = [float(x) for x in betas.strip().strip("()[]").split(",") if x.strip()]
        except ValueError:
            parts = []
    else:
        parts = [float(x) for x in (OmegaConf.to_container(betas) if OmegaConf.is_config(betas) else betas)]
    if len(parts) != 2 or not all(0.0 <= b < 1.0 for b in parts):
        raise UserError(f"--adam-betas {betas!r} is not two numbers in [0, 1)", fix="write e.g. --adam-betas '(0.9, 0.98)'")
    return tuple(parts)


def fusable(params: List[torch.Tensor]) -> bool:
    """Whether torch's fused kernel takes these parameters (one device type, float dtypes)."""
    return (all(p.dtype in _FUSED_DTYPES for p in params)
            and len({p.device.type for p in params}) == 1
            and params[0].device.type in _FUSED_DEVICES)


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    """fairseq wrapper of ``torch.optim.AdamW(fused=True)`` (foreach where fused can't run)."""

    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        params = list(params)
        flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
        if not flat:
            raise UserError("torch_adamw got no parameters to train", fix="unfreeze part of the model")
        mode = {"fused": True} if fusable(flat) else {"foreach": True}
        settings = self.optimizer_config
        for option, value in (("--lr", settings["lr"]), ("--adam-eps", settings["eps"]),
                              ("--weight-decay", settings["weight_decay"])):
            if not value >= 0.0:  # also catches NaN
                raise UserError(f"{option} {value} is negative", fix=f"give {option} a value >= 0")
        self._optimizer = torch.optim.AdamW(params, **settings, **mode)

    @property
    def optimizer_config(self):
        """Overrides of the settings stored in a checkpoint (fairseq resumes with the new ones)."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {"lr": float(lr), "betas": parse_betas(self.cfg.adam_betas), "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay}

    @property
    def supports_flat_params(self):
        return True
