"""How many CPU threads a process may give FAISS (and torch): the cores it may run on, shared by the processes of
its job on the node.

:func:`faiss_thread_budget` decides the threads of a FAISS search inside a training or decoding step (and of a
build's index):

* the model on the CPU: torch's intra-op threads. The search runs between torch's operations on the same cores,
  and FAISS's OpenMP threads on cores torch is using only slow torch down (issue 25);
* the model on a GPU (any device but the CPU): the CPU cores are free for the search, so its budget is the cores
  this process may run on (``os.sched_getaffinity``) divided by the processes of the job on this node
  (:func:`local_processes`). torch's thread count says nothing there: torchrun sets ``OMP_NUM_THREADS=1`` for
  several processes, which left every in-step search of a large index on one thread with the cores idle.

The decision is logged once per process (and again only if it changes).
"""
from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

_logged: set = set()


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; all of them where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def threads_per_process(cores: int, local_processes: int) -> int:
    return max(1, cores // max(1, local_processes))


def local_processes(on_gpu: bool = False) -> int:
    """The processes of this job on this node: torchrun's ``LOCAL_WORLD_SIZE``; else, in an initialised
    torch.distributed job on GPUs, one per GPU of the node up to the job's size (fairseq's own launcher spawns
    ``min(GPUs, world size)`` processes, as it does under SLURM with one task per node); else 1."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local:
        return max(1, int(local))
    if not on_gpu:
        return 1
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    world = dist.get_world_size()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(1, min(gpus, world) if gpus else world)


def faiss_thread_budget(device) -> int:
    """The threads FAISS may use in this process when the model (or encoder) computes on ``device`` (a
    ``torch.device`` or its name): see the module docstring."""
    device = torch.device(device)
    if device.type == "cpu":
        n = torch.get_num_threads()
        why = "torch's threads: the search shares the cores with the model on the CPU"
    else:
        cores, local = usable_cores(), local_processes(on_gpu=True)
        n = threads_per_process(cores, local)
        why = f"the model is on {device.type}: {cores} cores, {local} process(es) of the job on this node"
    key = (device.type, n)
    if key not in _logged:
        _logged.add(key)
        logger.info("FAISS search threads: %d (%s)", n, why)
    return n
