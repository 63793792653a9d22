"""Safe checkpoint loading under torch's ``weights_only=True``.

fairseq checkpoints hold omegaconf containers (and, for argparse-era models such as the
released BART, an ``argparse.Namespace``). Instead of switching safe loading off, the exact
types they need are allow-listed here; anything else in a pickle (a function, a class that
runs code on load) is refused by torch. The one allow-list and the one safe loader of the plugin:
encoders, converters, the hub and the fairseq command-line hooks all load through here.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import typing
from pathlib import Path
from typing import Iterator

import torch

from rag_plugin.util.errors import UserError


def checkpoint_safe_globals() -> list:
    """The types a fairseq checkpoint may contain besides tensors and builtin containers."""
    from omegaconf import DictConfig, ListConfig
    from omegaconf.base import ContainerMetadata, Metadata
    from omegaconf.nodes import AnyNode

    return [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, typing.Any,
            dict, list, int, collections.defaultdict, argparse.Namespace]


@contextlib.contextmanager
def checkpoint_types_allowed() -> Iterator[None]:
    """While active, ``torch.load(weights_only=True)`` (fairseq's own loader too) accepts the types of
    :func:`checkpoint_safe_globals`; torch's global allow-list is left as it was."""
    with torch.serialization.safe_globals(checkpoint_safe_globals()):
        yield


def safe_torch_load(path, map_location="cpu"):
    """``torch.load(weights_only=True)`` with the fairseq allow-list; one-line errors."""
    p = Path(path)
    if not p.is_file():
        raise UserError("checkpoint not found", path=str(p), fix="check the path")
    try:
        with torch.serialization.safe_globals(checkpoint_safe_globals()):
            return torch.load(p, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises UnpicklingError/RuntimeError for unsafe or bad files
        raise checkpoint_load_error(p, err) from None


def torch_load_reason(err: BaseException) -> str:
    """The informative part of torch's message for a file it could not or would not load."""
    import re

    text = " ".join(str(err).split())
    refused = re.search(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)", text)
    if refused:
        return f"it refers to {refused.group(1)}"
    first = text.split(". ")[0] if text else type(err).__name__
    return first[:160]


def checkpoint_load_error(path, err: BaseException) -> UserError:
    """The one-line error for a checkpoint torch could not (or would not) unpickle."""
    import pickle

    reason = torch_load_reason(err)
    if isinstance(err, pickle.UnpicklingError) and ("weights_only" in str(err) or "Unsupported global" in str(err)):
        return UserError(f"checkpoint refers to code that safe loading refuses ({reason}); nothing in it was run",
                         path=str(path),
                         fix="only load checkpoints from sources you trust, re-saved as plain tensors")
    return UserError(f"checkpoint is unreadable or truncated ({reason})", path=str(path),
                     fix="re-save it, or use another checkpoint (to resume: copy the newest complete "
                         "checkpoint*.pt of the save dir onto checkpoint_last.pt)")
