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

fairseq's trainer divides the gradients by the sample size (``multiply_grads``) and computes their
norm (``clip_grad_norm``, every update, with or without ``--clip-norm``) before each step: two
extra passes over every gradient and a Python loop of per-tensor norms. Here the division (and
the clipping coefficient) is kept as one pending factor that the fused kernel applies while it
reads the gradients anyway (its ``grad_scale``), and the norm comes from one dot product per
tensor, summed in float64, times that factor. The same update and norm as fairseq's sequence
(tested), the norm more accurate (see ``_squared_norm``); on bart.base + a BERT-base query
encoder fairseq's whole update takes a third less time (``benchmarks/optimizer_step.py``, BENCHMARKS.md).

Optimizer state written by fairseq's ``adam`` does not load into ``torch_adamw`` (nor back):
resume across the switch with ``--reset-optimizer``. Not supported: ``--memory-efficient-fp16``
/ ``--memory-efficient-bf16`` (torch would keep Adam's moments in 16 bits; use ``--fp16`` /
``--bf16``, whose float32 master weights it steps). Under ``--fp16`` / ``--bf16`` the master weights
keep the query/document encoders' weight decay x lr scale, and under ``--amp`` the gradients are
unscaled once: both through :mod:`rag_plugin.fairseq_hooks.mixed_precision`, on the command line
(where fairseq's ``--bf16`` also stops implying ``--tpu``).
"""
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from rag_plugin.util.errors import UserError

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
        raise UserError(f"--adam-betas {betas!r} is not two numbers in [0, 1)",
                        fix="write e.g. --adam-betas '(0.9, 0.98)'")
    return tuple(parts)


def fusable(params: List[torch.Tensor]) -> bool:
    """Whether torch's fused kernel takes these parameters (one device type, float dtypes)."""
    return (all(p.dtype in _FUSED_DTYPES for p in params)
            and len({p.device.type for p in params}) == 1
            and params[0].device.type in _FUSED_DEVICES)


def _squared_norm(grad: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of one gradient as a float64 scalar, by a BLAS dot product: on CPU about twice
    as fast as ``torch.norm`` and more accurate (torch's float32 norm of bart.base's 38.6M-entry
    embedding gradient is off by 3e-3 relative; by dot products no bart.base tensor is off by more
    than 5e-5; BENCHMARKS.md)."""
    flat = grad.detach().reshape(-1)
    if flat.is_complex():
        return torch.vdot(flat, flat).real.double()
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()
    return torch.dot(flat, flat).double()


def _decay_groups(params: list, weight_decay: float) -> list:
    """Parameters whose learning rate is scaled by reparametrisation (``--query-encoder-lr-scale``
    tags them with ``lr_scale``) get their own group with weight decay x that scale: AdamW's
    decoupled decay of the stored parameter is not scaled by the reparametrisation, so without it
    a query encoder at 0.03 x lr would decay at the full lr x weight decay, 33x what its lr promises."""
    if not weight_decay or not params or isinstance(params[0], dict):
        return params
    by_scale: Dict[float, list] = {}
    for p in params:
        by_scale.setdefault(float(getattr(p, "lr_scale", 1.0)), []).append(p)
    if len(by_scale) == 1 and 1.0 in by_scale:
        return params
    return [{"params": ps, "weight_decay": weight_decay * scale} for scale, ps in by_scale.items()]


class _AdamW(torch.optim.AdamW):
    """torch's AdamW that tells its fairseq wrapper when the gradients are cleared. fairseq's
    ``--amp`` wrapper clears them through this optimizer, not through ``TorchAdamW.zero_grad``;
    a pending factor must not outlive the gradients it was meant for (after an overflow the
    clipping coefficient is 0 or NaN: the retried update would not move, or poison every weight)."""

    def __init__(self, params, on_zero_grad, **settings):
        super().__init__(params, **settings)
        self._on_zero_grad = on_zero_grad

    def zero_grad(self, set_to_none: bool = True):
        self._on_zero_grad()
        super().zero_grad(set_to_none)


@register_optimizer("torch_adamw", dataclass=TorchAdamWConfig)
class TorchAdamW(FairseqOptimizer):
    """fairseq wrapper of ``torch.optim.AdamW(fused=True)`` (foreach where fused can't run)."""

    #: parameters tagged ``lr_scale`` decay at weight decay x that scale (:func:`_decay_groups`); fairseq's
    #: --fp16 master weights keep the tag for optimizers that say so (rag_plugin.fairseq_hooks.mixed_precision)
    decays_by_lr_scale = True

    def __init__(self, cfg: TorchAdamWConfig, params):
        super().__init__(cfg)
        if any(getattr(cfg, name, False) is True for name in ("memory_efficient_fp16", "memory_efficient_bf16")):
            raise UserError("--optimizer torch_adamw does not support --memory-efficient-fp16/--memory-efficient-bf16",
                            fix="use --fp16 (float32 master weights, any GPU) or --bf16 (float32 master weights, "
                                "GPUs with bfloat16: A100, H100, H200)")
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
        self._grad_factor = None  # pending multiplier of every gradient (None: 1), see the module docstring
        self._optimizer = _AdamW(_decay_groups(params, settings["weight_decay"]), self._drop_grad_factor, **settings)

    @property
    def optimizer_config(self) -> Dict[str, Any]:
        """The settings of this run. On resume fairseq keeps the checkpoint's (``--optimizer-overrides``
        replaces them; the lr comes from the scheduler), except the kernel choice, which is always
        this run's (``load_state_dict``)."""
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
        if len(groups) != len(self.param_groups):
            raise UserError(f"the checkpoint's optimizer state has {len(groups)} parameter group(s), this run "
                            f"{len(self.param_groups)} (--query-encoder-lr-scale with --weight-decay adds one)",
                            fix="resume with the options that wrote it, or with --reset-optimizer")
        super().load_state_dict(state_dict, optimizer_overrides)
        for group in self.param_groups:
            group.update(self._mode)  # this run's kernel: a state saved by the foreach fallback may resume fused
            for p in group["params"]:  # fused steps keep their counter on the parameter's device
                state = self.optimizer.state.get(p)
                if state and group.get("fused") and torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(device=p.device, dtype=torch.float32)

    # ------------------------------------------------------------------ gradients, deferred
    def _deferrable(self) -> bool:
        """Whether the gradients may carry a pending factor: dense gradients only, and no
        mixture-of-experts parameters (fairseq's norm leaves those out)."""
        return not any((p.grad is not None and p.grad.is_sparse) or hasattr(p, "expert") for p in self.params)

    def _drop_grad_factor(self) -> None:
        self._grad_factor = None

    def _apply_grad_factor(self) -> None:
        """Multiply the gradients by the pending factor now (where the fused kernel can't)."""
        factor, self._grad_factor = self._grad_factor, None
        if factor is not None:
            super().multiply_grads(factor)

    def _defer(self, c) -> None:
        """Fold ``c`` (a number or a tensor) into the pending factor."""
        self._grad_factor = c if self._grad_factor is None else self._grad_factor * c

    def multiply_grads(self, c):
        """Multiply every gradient by ``c``: recorded, applied by the next ``step``."""
        if not self._deferrable():
            self._apply_grad_factor()
            return super().multiply_grads(c)
        self._defer(c)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """The gradients' total L2 norm (pending factor included) as fairseq's ``clip_grad_norm_``
        returns it; with ``max_norm > 0`` the clipping coefficient joins the pending factor."""
        if not self._deferrable():
            self._apply_grad_factor()
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        params = list(self.params)
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return params[0].new_tensor(0.0) if params else torch.tensor(0.0)
        device = grads[0].device
        total = torch.stack([_squared_norm(g).to(device) for g in grads]).sum().sqrt().float()
        if self._grad_factor is not None:
            factor = self._grad_factor
            total = total * (factor.abs().to(total) if torch.is_tensor(factor) else abs(float(factor)))
        if aggregate_norm_fn is not None:
            total = aggregate_norm_fn(total)
        if max_norm > 0:
            self._defer((float(max_norm) / (total + 1e-6)).clamp_(max=1))
        return total

    def step(self, closure=None, scale=1.0, groups=None):
        """One AdamW step on the gradients times the pending factor (times 1/``scale``)."""
        if scale != 1.0:
            self.multiply_grads(1.0 / scale)
        factor, self._grad_factor = self._grad_factor, None
        if factor is None:
            return self.optimizer.step(closure)
        if not self._mode["fused"]:
            super().multiply_grads(factor)
            return self.optimizer.step(closure)
        # the fused kernel divides each gradient by grad_scale as it reads it
        device = next(iter(self.params)).device  # fused: one device
        inverse = 1.0 / (factor.detach().double() if torch.is_tensor(factor) else float(factor))
        self.optimizer.grad_scale = torch.as_tensor(inverse, dtype=torch.float32, device=device)
        try:
            return self.optimizer.step(closure)
        finally:
            del self.optimizer.grad_scale

    def zero_grad(self):
        super().zero_grad()  # fairseq's: every .grad to None, then the torch optimizer's (drops the factor)

    def average_params(self):
        """``--use-bmuf``: average Adam's moments over the workers (as fairseq's adam does)."""
        world = float(dist.get_world_size())
        for state in self.optimizer.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                state[key].div_(world)
                dist.all_reduce(state[key], op=dist.ReduceOp.SUM)

