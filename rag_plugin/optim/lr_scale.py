"""The retriever towers' learning-rate scale: a reparametrisation, and the state-dict conversions it implies.

A pretrained query encoder learns at a small multiple of ``--lr`` beside a generator trained from scratch
(``--query-encoder-lr-scale``; the trainable document encoder of ``--train-doc-encoder`` follows it). fairseq's
optimizers and lr schedulers set one lr for every parameter group, so the scale is not a parameter group: each
trainable weight is stored as ``weight / scale`` and computed as ``scale x stored`` (:func:`scale_learning_rate`),
so that an optimizer step of size lr on the stored tensor moves the weight by ``scale x lr``. Adam's update is
invariant to the gradient's scale, so scaling gradients would not do this.

In a state dict a scaled weight ``X.W`` is kept as ``X.parametrizations.W.original`` (= weight / scale). This module
is the one place that knows that key: :func:`plain_state` / :func:`plain_module_state` resolve it to the weights
computed with, :func:`scaled_state` converts plain weights (a converted model, one trained at scale 1) into it.
Torch only: no fairseq import, so that building a knowledge source can read a checkpoint's towers.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import torch
from torch.nn.utils import parametrize

from rag_plugin.util.errors import UserError

#: the query encoder's learning rate in the paper (Appendix B: 3e-5 for the whole model)
QUERY_ENCODER_LR = 3e-5
#: how a scaled weight ``X.W`` is named in a state dict: ``X`` + MARKER + ``W`` + ORIGINAL
MARKER = ".parametrizations."
ORIGINAL = ".original"


class Scaled(torch.nn.Module):
    """weight = scale * stored: an optimizer step of size lr on ``stored`` moves the weight by scale * lr."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, stored):
        return stored * self.scale

    def right_inverse(self, weight):
        return weight / self.scale


def resolved_scale(scale: float, lr=None) -> float:
    """``--query-encoder-lr-scale`` with 0 resolved to min(1, 3e-5 / --lr) (1 when ``lr`` is not known: None, an
    unresolved ``${optimization.lr}``, ...). ``lr``: a number or fairseq's list of them (the first is used)."""
    scale = float(scale or 0.0)
    if scale < 0:
        raise UserError(f"--query-encoder-lr-scale must be positive (or 0: automatic), got {scale}",
                        fix="use --freeze-query-encoder to keep it fixed")
    if scale > 0:
        return scale
    try:
        first = float(lr if isinstance(lr, (int, float)) else lr[0])
    except (TypeError, ValueError, IndexError, KeyError):
        return 1.0
    return min(1.0, QUERY_ENCODER_LR / first) if first > 0 else 1.0


def scale_learning_rate(module: torch.nn.Module, scale: float) -> None:
    """Give every trainable parameter of ``module`` an effective learning rate of ``scale`` x lr (see the module
    docstring), and tag it ``lr_scale`` for the optimizers that also scale its decoupled weight decay."""
    if scale <= 0:
        raise UserError(f"--query-encoder-lr-scale must be positive, got {scale}",
                        fix="use --freeze-query-encoder to keep it fixed")
    for sub in list(module.modules()):
        for name, param in list(sub.named_parameters(recurse=False)):
            if param.requires_grad:
                parametrize.register_parametrization(sub, name, Scaled(scale))
                # AdamW's decoupled decay (stored *= 1 - lr * wd) is not scaled by the reparametrisation:
                # the tag lets an optimizer give these parameters weight decay x scale (torch_adamw does)
                getattr(sub.parametrizations, name).original.lr_scale = scale


def is_scaled_key(key: str) -> bool:
    """Whether a state-dict key holds a scaled weight's stored tensor (``X.parametrizations.W.original``)."""
    return MARKER in key and key.endswith(ORIGINAL)


def has_scaled_keys(keys: Iterable[str]) -> bool:
    return any(MARKER in k for k in keys)


def plain_key(key: str) -> str:
    """``X.parametrizations.W.original`` -> ``X.W``."""
    head, rest = key.split(MARKER, 1)
    return f"{head}.{rest[:-len(ORIGINAL)]}"


def plain_state(state: Dict[str, torch.Tensor], scale: float) -> Dict[str, torch.Tensor]:
    """A (sub-)state dict with the reparametrisation resolved: ``X.parametrizations.W.original`` -> ``X.W`` =
    original x scale (the weight the model computes with); other keys as they are."""
    out = {}
    for key, value in state.items():
        if is_scaled_key(key):
            out[plain_key(key)] = value * scale
        elif MARKER not in key:
            out[key] = value
    return out


def plain_module_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """``module``'s state dict as a module without parametrisations would have it: the effective weights, in float32
    whatever the module's dtype (the stored weights upcast, then scaled: as :func:`plain_state` computes them from a
    checkpoint's float32 copy, so that the two hash alike)."""
    out = {}
    for key, value in module.state_dict().items():
        if MARKER not in key:
            out[key] = value.detach().float() if value.is_floating_point() else value.detach()
        elif key.endswith(ORIGINAL):
            head, rest = key.split(MARKER, 1)
            name = rest[:-len(ORIGINAL)]
            weight = value.detach().float()
            for parametrization in module.get_submodule(head).parametrizations[name]:
                weight = parametrization(weight)
            out[f"{head}.{name}"] = weight
    return out


def scaled_state(state: Dict[str, torch.Tensor], target_keys: Iterable[str], scale: float) -> Dict[str, torch.Tensor]:
    """``state`` for a model whose state-dict keys are ``target_keys``: each plain ``X.W`` the target holds as a
    scaled ``X.parametrizations.W.original`` becomes that key, = weight / scale (a converted checkpoint, or one
    trained at scale 1, fine-tuned at another --lr). Other keys as they are."""
    moved = {}
    for key in target_keys:
        if is_scaled_key(key) and key not in state and plain_key(key) in state:
            moved[plain_key(key)] = (key, state[plain_key(key)] / scale)
    if not moved:
        return state
    out = {k: v for k, v in state.items() if k not in moved}
    out.update(dict(moved.values()))
    return out


def plain_where(state: Dict[str, torch.Tensor], target_keys: Iterable[str], scale: float) -> Dict[str, torch.Tensor]:
    """``state`` for a model whose state-dict keys are ``target_keys``: each scaled ``X.parametrizations.W.original``
    the target holds as a plain ``X.W`` becomes that key, = original x scale (a tower trained, now fixed: a
    ``--reranker`` added at generation fixes the first stage's query encoder). Other keys as they are."""
    targets = set(target_keys)
    moved = {key: plain_key(key) for key in state
             if is_scaled_key(key) and key not in targets and plain_key(key) in targets}
    if not moved:
        return state
    out = {k: v for k, v in state.items() if k not in moved}
    out.update({plain: state[key] * scale for key, plain in moved.items()})
    return out


def checkpoint_scale(cfg: Optional[dict]) -> float:
    """The scale a checkpoint's model was built with, from its saved config (``model.lr`` is saved as the
    unresolved ``${optimization.lr}``: resolved here from ``optimization.lr``)."""
    cfg = cfg or {}
    model = cfg.get("model") or {}
    lr = (cfg.get("optimization") or {}).get("lr", model.get("lr"))
    return resolved_scale(model.get("query_encoder_lr_scale", 0.0), lr)
