"""``--optimizer torch_adamw``: torch's AdamW with its fused kernel, for fairseq-train.

fairseq's ``adam`` steps each parameter tensor in a Python loop on a machine without CUDA
(its fused Adam needs apex and a GPU). torch's fused AdamW updates every tensor in one
kernel, on CPU as on GPU: half the time of fairseq's loop on 13M parameters, a third on 248M
(``benchmarks/optimizer_step.py``, BENCHMARKS.md). Same options and update as fairseq's
``adam``, which is AdamW too (decoupled weight decay, bias-corrected moments), except where
epsilon sits: fairseq adds it to sqrt(v) before the bias correction of v, torch after. Written
in fairseq's form, torch's epsilon is ``eps * sqrt(1 - beta2^t)``: at step t=1 with beta2 =
0.999 it is 32x smaller than fairseq's, and the two meet after ~1/(1 - beta2) steps. Updates
differ only where sqrt(v) is within a few orders of magnitude of epsilon, i.e. for gradients
below ~1e-5 (at eps 1e-8) in the first steps; tested both ways.

Optimizer state written by fairseq's ``adam`` does not load into ``torch_adamw`` (nor back):
resume across the switch with ``--reset-optimizer``. Not supported: ``--memory-efficient-fp16``
/ ``--memory-efficient-bf16`` (torch would keep Adam's moments in 16 bits; use ``--fp16`` /
``--bf16``, whose fp32 master weights work with it).
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
import torch.distributed as dist
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
    memory_efficient_fp16: bool = II("common.memory_efficient_fp16")
    memory_efficient_bf16: bool = II("common.memory_efficient_bf16")


def parse_betas(betas: Any) -> tuple:
    """``'(0.9, 0.98)'`` (the CLI's string), a list or a tuple -> (beta1, beta2), checked."""
    try:
        if isinstance(betas, str):
            parts = [float(x) for x in betas.strip().strip("()[]").split(",") if x.strip()]
        else:
            parts = [float(x) for x in (OmegaConf.to_container(betas) if OmegaConf.is_config(betas) else betas)]
    except (TypeError, ValueError):
        parts = []
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
        if any(getattr(cfg, name, False) is True for name in ("memory_efficient_fp16", "memory_efficient_bf16")):
            raise UserError("--optimizer torch_adamw does not support --memory-efficient-fp16/--memory-efficient-bf16",
                            fix="use --fp16 or --bf16 (fp32 master weights), or --optimizer adam")
        params = list(params)
        flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
        if not flat:
            raise UserError("torch_adamw got no parameters to train", fix="unfreeze part of the model")
        self._mode = {"fused": True, "foreach": None} if fusable(flat) else {"fused": None, "foreach": True}
        settings = self.optimizer_config
        for option, value in (("--lr", settings["lr"]), ("--adam-eps", settings["eps"]),
                              ("--weight-decay", settings["weight_decay"])):
            if not value >= 0.0:  # also catches NaN
                raise UserError(f"{option} {value} is not a number >= 0", fix=f"give {option} a value >= 0")
        self._optimizer = torch.optim.AdamW(params, **settings)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        """The settings, also applied over those stored in a checkpoint on resume (as fairseq does),
        the kernel choice included (so a state saved without the fused kernel resumes with it)."""
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {"lr": float(lr), "betas": parse_betas(self.cfg.adam_betas), "eps": self.cfg.adam_eps,
                "weight_decay": self.cfg.weight_decay, **self._mode}

    @property
    def supports_flat_params(self):
        return True

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        """fairseq's resume: the saved state, then ``optimizer_overrides`` (the current settings).
        A state of another optimizer (fairseq's ``adam`` under ``--fp16``, where fairseq's own
        check only sees the fp16 wrapper) is a one-line error."""
        groups = state_dict.get("param_groups", [])
        steps = [s.get("step") for s in state_dict.get("state", {}).values()]
        if any("decoupled_weight_decay" not in g and "fused" not in g for g in groups) \
                or any(not torch.is_tensor(s) for s in steps):
            raise UserError("the checkpoint's optimizer state was not written by --optimizer torch_adamw",
                            fix="resume with --reset-optimizer, or with the optimizer that wrote it")
        super().load_state_dict(state_dict, optimizer_overrides)
        for group in self.param_groups:  # fused steps keep their counter on the parameter's device
            for p in group["params"]:
                state = self.optimizer.state.get(p)
                if state and group.get("fused") and torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(device=p.device, dtype=torch.float32)

    def average_params(self):
        """``--use-bmuf``: average Adam's moments over the workers (as fairseq's adam does)."""
        world = float(dist.get_world_size())
        for state in self.optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key].div_(world)
                dist.all_reduce(state[key], op=dist.ReduceOp.SUM)

