"""Safe loading of torch files under ``weights_only=True``: the plugin's one allow-list and one loader.

fairseq checkpoints hold omegaconf containers (and, for argparse-era models such as the
released BART, an ``argparse.Namespace``); the original DPR code's checkpoints hold an
``argparse.Namespace`` or, Hydra-era, omegaconf containers. Instead of switching safe loading
off, the exact types they need are allow-listed here (:func:`checkpoint_safe_globals`), and only
for the duration of a load (:func:`checkpoint_types_allowed`): torch's process-wide allow-list is
left alone. Anything else in a pickle (a function, a class that runs code on load) is refused by
torch, and :func:`checkpoint_load_error` turns the refusal into a one-line error. Encoders,
converters, the hub and the fairseq command-line hooks all load through here.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import pickle
import re
import typing
from pathlib import Path
from typing import Iterator

import torch

from rag_plugin.util.errors import UserError

#: What to do about a file whose pickle refers to code.
UNTRUSTED_FIX = "only load checkpoints from sources you trust, re-saved as plain tensors"
#: What to do about a checkpoint torch cannot read (the default: fairseq checkpoints, the hub).
UNREADABLE_CHECKPOINT_FIX = ("re-save it, or use another checkpoint (to resume: copy the newest complete "
                             "checkpoint*.pt of the save dir onto checkpoint_last.pt)")


def checkpoint_safe_globals() -> list:
    """The types a checkpoint may contain besides tensors and builtin containers: ``argparse.Namespace``
    and the omegaconf containers (left out where omegaconf is not installed: nothing then needs them)."""
    allowed = [dict, list, int, collections.defaultdict, argparse.Namespace]
    try:  # optional dependency: omegaconf comes with fairseq
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode
    except ImportError:
        return allowed
    return allowed + [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, typing.Any]


@contextlib.contextmanager
def checkpoint_types_allowed() -> Iterator[None]:
    """While active, ``torch.load(weights_only=True)`` (fairseq's own loader too) accepts the types of
    :func:`checkpoint_safe_globals`; torch's global allow-list is left as it was."""
    with torch.serialization.safe_globals(checkpoint_safe_globals()):
        yield


def safe_torch_load(path, map_location="cpu", what: str = "checkpoint",
                    fix_unreadable: str = UNREADABLE_CHECKPOINT_FIX):
    """``torch.load(weights_only=True)`` with the allow-list; a missing, unreadable or unsafe file is a
    one-line :class:`UserError` naming it. ``what`` names the file in the messages ("checkpoint",
    "DPR checkpoint", ...); ``fix_unreadable`` says what to do about a file torch cannot read."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} not found", path=str(p), fix="check the path")
    try:
        with checkpoint_types_allowed():
            return torch.load(p, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises UnpicklingError/RuntimeError/EOFError... for unsafe or bad files
        raise checkpoint_load_error(p, err, what, fix_unreadable) from None


_REFUSED_GLOBAL = re.compile(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)")


def torch_load_reason(err: BaseException) -> str:
    """The informative part of torch's message for a file it could not or would not load."""
    message = str(err)
    refused = _REFUSED_GLOBAL.search(" ".join(message.split()))
    if refused:
        return f"it refers to {refused.group(1)}"
    message = message.partition("WeightsUnpickler error:")[2] or message  # past torch's weights_only advice
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0].split(". ")[0][:160] if lines else type(err).__name__


def refers_to_code(err: BaseException) -> bool:
    """Whether torch refused a pickle for a global (code or a type) outside the allow-list, as opposed
    to failing to read the file."""
    return isinstance(err, pickle.UnpicklingError) and "GLOBAL" in str(err)


def checkpoint_load_error(path, err: BaseException, what: str = "checkpoint",
                          fix_unreadable: str = UNREADABLE_CHECKPOINT_FIX) -> UserError:
    """The one-line error for a torch file (``what``) that torch could not, or would not, unpickle."""
    reason = torch_load_reason(err)
    if refers_to_code(err):
        return UserError(f"{what} refers to code that safe loading refuses ({reason}); refused to load, "
                         "nothing in it was run", path=str(path), fix=UNTRUSTED_FIX)
    return UserError(f"cannot read {what}: unreadable or truncated ({reason})", path=str(path),
                     fix=fix_unreadable)


def checkpoint_task_options(path: str) -> dict:
    """The task options a checkpoint was trained with (``--reranker``, ``--retriever``, ``--n-docs``...)."""
    return checkpoint_config_section(path, "task")


def checkpoint_config_section(path: str, section: str) -> dict:
    """One section of a checkpoint's config (``task``, ``model``...), read from its config alone: the tensors stay on
    disk (mapped), under the plugin's allow-list. A missing, damaged or unsafe file is a one-line
    :class:`UserError`."""
    if not Path(path).is_file():
        raise UserError("checkpoint not found", path=path, fix="pass the path of a checkpoint*.pt")
    try:
        with checkpoint_types_allowed():
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:  # a file of torch's legacy format cannot be mapped: read it whole
                if "zipfile" not in str(err):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)
        return dict((state.get("cfg") or {})[section])
    except UserError:
        raise
    except Exception as err:  # torch: UnpicklingError / RuntimeError / EOFError; no config: KeyError, TypeError
        raise checkpoint_load_error(path, err) from None
