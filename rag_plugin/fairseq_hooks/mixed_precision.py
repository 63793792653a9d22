"""fairseq 0.12's mixed precision, made correct for the plugin (installed on the command-line path only).

* ``--amp``: fairseq's ``AMPOptimizer`` unscales the gradients twice. Its ``clip_grad_norm`` unscales
  them through the torch optimizer, its ``step`` hands the grad scaler the fairseq optimizer, a
  different object, which the scaler has not seen unscaled: it divides them by the loss scale again.
  Adam's update is scale-free only far above its epsilon: over 4 steps on gradients of ~3e-6 (eps 1e-8)
  the weights moved 0.71x / 0.27x / 0.05x / 0.006x as far as without AMP with ``torch_adamw`` at loss
  scale 2^7 / 2^10 / 2^13 / 2^16, 0.14x / 0.02x / 0.003x / 0.0003x with fairseq's ``adam``, and the
  scale doubles every 2,000 clean steps: training stalls. Here the norm unscales the object
  that ``step`` hands the scaler, once (fairseq's ``adam`` and ``torch_adamw`` alike). The scaler
  also takes ``--amp-init-scale`` and ``--amp-scale-window`` (fairseq gave it ``--fp16-init-scale``,
  and ``--amp-init-scale`` as the window).
* ``--fp16`` / ``--bf16`` (``FP16Optimizer``, float32 master weights): the master copies carry the
  ``lr_scale`` tag of the parameters they copy (the query and document encoders',
  :func:`rag_plugin.optim.lr_scale.scale_learning_rate`), so that an optimizer that gives those
  parameters weight decay x their lr scale (``torch_adamw``) still does. A flat master tensor holds
  parameters of every scale and cannot: when the optimizer would decay them apart, the master weights
  are kept unflattened, as with ``--fp16-no-flatten-grads`` (logged). The parameter groups, and so the
  optimizer states, are then those of a float32 run: a state saved by either loads into the other
  (fairseq-train itself still compares the wrapper's class name on resume: ``--reset-optimizer`` to
  switch a run between float32 and ``--fp16`` / ``--bf16``).
* ``--memory-efficient-fp16`` / ``--memory-efficient-bf16`` update 16-bit weights in place, with no
  float32 copy: the steps of a tower that learns at a small multiple of ``--lr`` (3e-5 beside a
  generator at 1e-3) are about one float16 step of its weights and round away (bfloat16: all of
  them). Refused with a one-line error while such a tower trains.
* ``--bf16`` on a GPU (or the CPU): fairseq's option parsing makes ``--bf16`` imply ``--tpu``, so
  without torch_xla it fails, and a bfloat16 GPU (A100, H100, H200) had ``--fp16`` only. Here
  ``--bf16`` no longer implies ``--tpu`` (an explicit ``--tpu`` still asks for one): the trainer
  casts the model to bfloat16 on its own device and keeps float32 master weights, no loss scale.
  ``--bf16`` with ``--fp16`` or ``--amp`` is a one-line error.

Retrieval scores stay float32 under all of them (:mod:`rag_plugin.core.scores`).
"""
import functools
import logging
import sys

import torch
from fairseq import options
from fairseq.optim import OPTIMIZER_REGISTRY
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer, _FP16OptimizerMixin
from omegaconf import OmegaConf, open_dict

from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)


def _installed(owner, name: str) -> bool:
    attr = getattr(owner, name)
    return getattr(getattr(attr, "__func__", attr), "_rag_plugin", False)


def _mark(func, plain):
    func._rag_plugin = True
    func._plain = plain  # fairseq's own, for the tests that show what the hook changes
    return func


# ---------------------------------------------------------------------------------------------- --amp
def amp_grad_scaler(common) -> "torch.amp.GradScaler":
    """The CUDA grad scaler of ``--amp`` with fairseq's own options: ``--amp-init-scale`` and, when
    given, ``--amp-scale-window`` clean steps before the scale doubles (torch's 2000 otherwise). Like
    fairseq's, it disables itself (with torch's warning) where CUDA is not available."""
    settings = {"init_scale": float(getattr(common, "amp_init_scale", 2 ** 7))}
    window = getattr(common, "amp_scale_window", None)
    if window is not None:
        settings["growth_interval"] = int(window)
    return torch.amp.GradScaler("cuda", **settings)


def _amp_clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
    """The gradients' norm, unscaled once: by the grad scaler, through the object that ``step`` hands it
    (the fairseq optimizer), so that ``step`` finds them unscaled and does not divide them again."""
    self.scaler.unscale_(self.fp32_optimizer)
    norm = self.fp32_optimizer.clip_grad_norm(max_norm, aggregate_norm_fn)
    if not torch.isfinite(norm).all():
        next_scale = self.next_loss_scale
        if next_scale <= self.min_loss_scale:
            raise FloatingPointError(
                f"AMP: the loss scale would fall to {next_scale}, not above --min-loss-scale {self.min_loss_scale}: "
                f"the loss is probably exploding (lower --lr, or train in float32)")
        logger.info("AMP: overflow detected, the loss scale goes down to %s", next_scale)
    return norm


def fix_amp_optimizer() -> None:
    """Patch fairseq's ``AMPOptimizer``: one unscale per step, the ``--amp-*`` scaler options, and a
    one-line error for ``--amp`` with ``--bf16``. Idempotent."""
    if _installed(AMPOptimizer, "clip_grad_norm"):
        return
    plain_init = AMPOptimizer.__init__
    plain_build = AMPOptimizer.__dict__["build_optimizer"].__func__

    @functools.wraps(plain_init)
    def __init__(self, cfg, params, fp32_optimizer, **kwargs):
        plain_init(self, cfg, params, fp32_optimizer, **kwargs)
        self._grad_scaler = amp_grad_scaler(cfg.common)

    @functools.wraps(plain_build)
    def build_optimizer(cls, cfg, params, **kwargs):
        if getattr(cfg.common, "bf16", False):
            raise UserError("--amp with --bf16: the trainer would cast the weights to bfloat16 and --amp keeps no "
                            "float32 copy of them", fix="use --bf16 alone (float32 master weights, no loss scale "
                                                        "needed) or --amp alone")
        return plain_build(cls, cfg, params, **kwargs)

    AMPOptimizer.__init__ = _mark(__init__, plain_init)
    AMPOptimizer.build_optimizer = classmethod(_mark(build_optimizer, plain_build))
    AMPOptimizer.clip_grad_norm = _mark(_amp_clip_grad_norm, AMPOptimizer.clip_grad_norm)


# ------------------------------------------------------------------------------------- --fp16 / --bf16
def lr_scales(params) -> set:
    """The learning-rate scales that :func:`~rag_plugin.optim.lr_scale.scale_learning_rate` tagged ``params``
    with (1.0 for an untagged parameter)."""
    return {float(getattr(p, "lr_scale", 1.0)) for p in params}


def decays_apart(optimizer_cfg, params) -> bool:
    """Whether the optimizer of ``optimizer_cfg`` gives ``params`` weight decays by their lr scale
    (``torch_adamw`` with ``--weight-decay`` over parameters of more than one scale)."""
    optimizer = OPTIMIZER_REGISTRY.get(getattr(optimizer_cfg, "_name", None))
    return (getattr(optimizer, "decays_by_lr_scale", False)
            and float(getattr(optimizer_cfg, "weight_decay", 0.0) or 0.0) != 0.0
            and len(lr_scales(params)) > 1)


def _set_no_flatten(common) -> None:
    if OmegaConf.is_config(common):
        with open_dict(common):
            common.fp16_no_flatten_grads = True
    else:
        common.fp16_no_flatten_grads = True


def fix_fp16_master_weights() -> None:
    """Patch fairseq's ``FP16Optimizer``: master weights keep the ``lr_scale`` tag, and are not flattened
    where a flat tensor would lose it. Idempotent."""
    if _installed(_FP16OptimizerMixin, "build_fp32_params"):
        return
    plain_fp32 = _FP16OptimizerMixin.__dict__["build_fp32_params"].__func__
    plain_build = FP16Optimizer.__dict__["build_optimizer"].__func__

    @functools.wraps(plain_fp32)
    def build_fp32_params(cls, args, params, flatten=True):
        fp32_params = plain_fp32(cls, args, params, flatten=flatten)
        if not flatten:
            for p, p32 in zip(params, fp32_params):
                if hasattr(p, "lr_scale"):
                    p32.lr_scale = p.lr_scale
        return fp32_params

    @functools.wraps(plain_build)
    def build_optimizer(cls, cfg, params, **kwargs):
        params = list(params)
        flatten = not getattr(cfg.common, "fp16_no_flatten_grads", False) and not getattr(cfg.common, "bf16", False)
        if flatten and decays_apart(cfg.optimizer, params):
            scales = ", ".join(f"{s:.3g}" for s in sorted(lr_scales(params)))
            logger.info("--fp16: float32 master weights not flattened (as with --fp16-no-flatten-grads): the "
                        "parameters learn at %s x --lr and --optimizer %s decays each at its own scale",
                        scales, cfg.optimizer._name)
            _set_no_flatten(cfg.common)
        return plain_build(cls, cfg, params, **kwargs)

    _FP16OptimizerMixin.build_fp32_params = classmethod(_mark(build_fp32_params, plain_fp32))
    FP16Optimizer.build_optimizer = classmethod(_mark(build_optimizer, plain_build))


def refuse_memory_efficient_scaled_towers() -> None:
    """Patch fairseq's ``MemoryEfficientFP16Optimizer``: refused while a tower learns at a fraction of
    ``--lr`` (its updates of 16-bit weights round away). Idempotent."""
    if _installed(MemoryEfficientFP16Optimizer, "build_optimizer"):
        return
    plain_build = MemoryEfficientFP16Optimizer.__dict__["build_optimizer"].__func__

    @functools.wraps(plain_build)
    def build_optimizer(cls, cfg, params, **kwargs):
        params = list(params)
        small = sorted(s for s in lr_scales(params) if s < 1.0)
        common = cfg.common
        asked = getattr(common, "memory_efficient_fp16", False) or getattr(common, "memory_efficient_bf16", False)
        if small and asked:
            option = "--memory-efficient-bf16" if getattr(common, "memory_efficient_bf16", False) \
                else "--memory-efficient-fp16"
            raise UserError(f"{option} updates the weights in 16 bits with no float32 copy: the query/document "
                            f"encoders learn at {small[0]:.3g} x --lr, steps that round away in 16 bits",
                            fix="use --fp16 or --bf16 (float32 master weights)")
        return plain_build(cls, cfg, params, **kwargs)

    MemoryEfficientFP16Optimizer.build_optimizer = classmethod(_mark(build_optimizer, plain_build))


# ------------------------------------------------------------------------------------------- --bf16
def _given(argv, *flags) -> bool:
    return any(a in flags or a.split("=", 1)[0] in flags for a in argv)


def bf16_without_tpu() -> None:
    """Patch fairseq's ``options.parse_args_and_arch``: ``--bf16`` (``--memory-efficient-bf16``) no
    longer implies ``--tpu``; ``--bf16`` with ``--fp16`` is a one-line error. Idempotent."""
    plain = options.parse_args_and_arch
    if getattr(plain, "_rag_plugin_bf16", False):
        return

    @functools.wraps(plain)
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False,
                            modify_parser=None):
        argv = sys.argv[1:] if input_args is None else [str(a) for a in input_args]
        bf16 = _given(argv, "--bf16", "--memory-efficient-bf16")
        if bf16 and _given(argv, "--fp16", "--memory-efficient-fp16"):
            raise UserError("--bf16 and --fp16 together", fix="choose one: --bf16 on GPUs that have it (A100, H100, "
                                                              "H200), --fp16 elsewhere")
        result = plain(parser, input_args, parse_known, suppress_defaults, modify_parser)
        args = result[0] if parse_known else result
        if bf16 and getattr(args, "tpu", False) and not _given(argv, "--tpu"):
            args.tpu = False
        return result

    parse_args_and_arch._rag_plugin_bf16 = True
    parse_args_and_arch._plain = plain
    options.parse_args_and_arch = parse_args_and_arch


def install_mixed_precision() -> None:
    """Every patch of this module (idempotent)."""
    fix_amp_optimizer()
    fix_fp16_master_weights()
    refuse_memory_efficient_scaled_towers()
    bf16_without_tpu()
