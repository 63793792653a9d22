"""Which torch device a process computes on: the ``--device`` options of the command lines and the hub, and the
GPU of a rank.

A rank's GPU is the one fairseq selected for it (``torch.cuda.set_device(cfg.distributed_training.device_id)``,
whichever launcher started it: torchrun, fairseq's own spawn, SLURM), read back with
``torch.cuda.current_device()``: never ``LOCAL_RANK``, which only torchrun sets (under fairseq's launcher or SLURM
every rank read 0 and put its work on the first GPU).
"""
from __future__ import annotations

from typing import Optional

from rag_plugin.util.errors import UserError

#: what ``--device`` accepts, for help texts
DEVICE_HELP = ("cpu, cuda (this process's current GPU) or cuda:N; default: cuda when a GPU is available, else "
               "cpu")


def current_cuda_device():
    """``cuda:<torch.cuda.current_device()>``: the GPU this process (rank) was given."""
    import torch  # start-up: the command lines' --help imports this module for DEVICE_HELP

    return torch.device("cuda", torch.cuda.current_device())


def model_device(model):
    """The device of ``model``'s first parameter (cpu for a model without any)."""
    import torch  # start-up (DEVICE_HELP)

    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def resolve_device(name: Optional[str], option: str = "--device"):
    """The ``torch.device`` that ``name`` asks for: None or ``auto``: this process's GPU when CUDA is available,
    else the CPU; ``cuda``: this process's current GPU; ``cuda:N``: that one. A GPU asked for where there is none
    (or not that many) is a one-line :class:`UserError`."""
    import torch  # start-up (DEVICE_HELP)

    text = "auto" if name is None else str(name).strip().lower()
    if text == "auto":
        return current_cuda_device() if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UserError(f"{option} {name!r} is not a device", fix="use cpu, cuda or cuda:N") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise UserError(f"{option} {name}: CUDA is not available here (no GPU, or a torch built without CUDA)",
                        fix=f"leave {option} out or pass {option} cpu")
    if device.index is None:
        return current_cuda_device()
    if device.index >= torch.cuda.device_count():
        raise UserError(f"{option} {name}: this machine has {torch.cuda.device_count()} GPU(s)",
                        fix=f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return device
