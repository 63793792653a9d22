"""How many CPU threads each process of a fairseq command line uses (command-line path only).

torch takes every core of the machine per process. Several processes on one machine (torchrun's
ranks, or other jobs) then oversubscribe the cores, and on a busy 2-core machine a training step
ran 3x slower with 2 threads than with ``OMP_NUM_THREADS=1`` (issue 25). Without
``OMP_NUM_THREADS``, each process gets the cores it may run on divided by the processes torchrun
started on the node (``LOCAL_WORLD_SIZE``), and the choice is logged, with a hint when the
machine's load is already above its cores. (The FAISS threads of a step: :mod:`rag_plugin.retrieval.threads`.)
"""
import logging
import os

import torch

from rag_plugin.retrieval.threads import local_processes, threads_per_process, usable_cores

logger = logging.getLogger(__name__)


def choose_threads() -> int:
    """Set torch's intra-op threads for this process (unless ``OMP_NUM_THREADS`` says) and log them."""
    if os.environ.get("OMP_NUM_THREADS"):
        logger.info("torch threads: %d (OMP_NUM_THREADS)", torch.get_num_threads())
        return torch.get_num_threads()
    cores, local = usable_cores(), local_processes()
    n = threads_per_process(cores, local)
    torch.set_num_threads(n)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    hint = ""
    if load > cores:
        hint = (f"; the machine's load ({load:.1f}) is above its {cores} cores: on a shared machine "
                f"OMP_NUM_THREADS=1 can be several times faster")
    logger.info("torch threads: %d per process (%d cores, %d process(es) on this node; set OMP_NUM_THREADS to "
                "choose)%s", n, cores, local, hint)
    return n
