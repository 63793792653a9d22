"""Dropout whose mask costs a fraction of ``torch.nn.functional.dropout``'s on CPU.

On CPU, ``F.dropout`` draws its mask with ``bernoulli_``: about 9 ms for one [80, 40, 256]
activation of the benchmark's generator encoder (11 ns per element, 2 threads), 11-12% of a
whole RAG training step (profile in BENCHMARKS.md). Here the mask comes from 64-bit words of
torch's own generator (``random_``, so ``torch.manual_seed`` / fairseq's ``--seed`` make it
reproducible), cut into four 16-bit draws each: an element is kept when its draw is at least
``round(p * 2**16)``, and kept elements are scaled by ``1 / (1 - p')`` where ``p'`` is that
rounded probability, so the expectation is exactly the input, as with ``F.dropout``. The drop
probability differs from ``p`` by at most 2**-17 (0.1 -> 0.10000610). The backward multiplies
by the saved 1-byte mask, as ``F.dropout``'s does.

:func:`use_fast_dropout` swaps it into a fairseq model in place of ``FairseqDropout`` (same
``p``, same module names; no parameters, so checkpoints are unaffected). On other devices, and
for tensors too small for the mask to matter, it falls back to ``F.dropout``.
"""
import math

import torch
import torch.nn.functional as F
from fairseq.modules.fairseq_dropout import FairseqDropout

_BITS = 16
_LEVELS = 1 << _BITS
_MIN_ELEMENTS = 4096  # below this the bernoulli mask is already cheap


def keep_mask(shape, p: float, generator=None) -> tuple:
    """(bool mask of ``shape``, True = keep, each kept with probability 1 - p'; the scale 1 / (1 - p'))."""
    drop_levels = round(p * _LEVELS)
    if drop_levels >= _LEVELS:
        raise ValueError(f"dropout probability {p} rounds to 1 at {_BITS} bits")
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64)
    words.random_(-(1 << 63), None, generator=generator)  # the full 64-bit range, uniform
    draws = words.view(torch.int16)[:n].view(shape)       # uniform on [-2**15, 2**15)
    keep = draws >= (drop_levels - (1 << (_BITS - 1)))
    return keep, _LEVELS / (_LEVELS - drop_levels)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, keep, scale: float):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def fast_dropout(x: torch.Tensor, p: float, generator=None) -> torch.Tensor:
    """Training-mode dropout of ``x`` with probability ``p`` (see the module docstring)."""
    if p == 0:
        return x
    if (x.device.type != "cpu" or x.numel() < _MIN_ELEMENTS or not 0 < p < 1
            or round(p * _LEVELS) >= _LEVELS):  # p outside [0, 1] is F.dropout's ValueError
        return F.dropout(x, p=p, training=True)
    keep, scale = keep_mask(x.shape, p, generator)
    return _MaskedScale.apply(x, keep, scale)


class FastDropout(FairseqDropout):
    """``FairseqDropout`` with :func:`fast_dropout` in training (``inplace`` is not honoured:
    the output is always a new tensor, which is what every fairseq caller uses)."""

    def forward(self, x, inplace: bool = False):
        if self.p > 0 and (self.training or self.apply_during_inference):
            return fast_dropout(x, self.p)
        return x


def use_fast_dropout(model: torch.nn.Module) -> int:
    """Turn every ``FairseqDropout`` of ``model`` into a :class:`FastDropout`; returns how many."""
    n = 0
    for module in model.modules():
        if type(module) is FairseqDropout:
            module.__class__ = FastDropout
            n += 1
    return n
