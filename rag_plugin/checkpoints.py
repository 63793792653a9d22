"""Safe checkpoint loading under torch's ``weights_only=True``.

fairseq checkpoints hold omegaconf containers (and, for argparse-era models such as the
released BART, an ``argparse.Namespace``). Instead of switching safe loading off, the exact
types they need are allow-listed here; anything else in a pickle (a function, a class that
runs code on load) is refused by torch.
"""
from __future__ import annotations

import argparse
import collections
import typing
from pathlib import Path

import torch

from rag_plugin.errors import UserError


def checkpoint_safe_globals() -> list:
    """The types a fairseq checkpoint may contain besides tensors and builtin containers."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    return [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, typing.Any,
            dict, list, int, collections.defaultdict, argparse.Namespace]


def allow_fairseq_checkpoints() -> None:
    """Register the allow-list with torch (idempotent); fairseq's own loader then works.

    On a distributed resume rank 0 broadcasts the checkpoint with fairseq's tensor
    placeholders, which the other ranks unpickle: allowed too.
    """
    from fairseq.distributed.utils import _TensorPlaceholder

    torch.serialization.add_safe_globals(checkpoint_safe_globals() + [_TensorPlaceholder])


def safe_torch_load(path, map_location="cpu"):
    """``torch.load(weights_only=True)`` with the fairseq allow-list; one-line errors."""
    p = Path(path)
    if not p.is_file():
        raise UserError("checkpoint not found", path=str(p), fix="check the path")
    try:
        with torch.serialization.safe_globals(checkpoint_safe_globals()):
            return torch.load(p, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises UnpicklingError/RuntimeError for unsafe or bad files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            raise UserError("checkpoint refers to code that safe loading refuses "
                            f"({reason[:120]})", path=str(p),
                            fix="only load checkpoints from sources you trust, re-saved as plain tensors") from None
        raise UserError(f"checkpoint is unreadable or truncated ({reason[:120]})", path=str(p),
                        fix="re-download or re-save it") from None
