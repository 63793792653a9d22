"""Bounded waits between ranks in fairseq's distributed training.

fairseq creates its process group without a timeout, so torch's default applies (30 minutes
for gloo): a rank that hangs, or whose machine drops off the network, keeps the others waiting
in a collective for that long. fairseq's ``--heartbeat-timeout N`` ("kill the job if no progress
is made in N seconds") only interrupts Python code, not a wait inside gloo. With the plugin
loaded, ``--heartbeat-timeout N`` also becomes the process group's timeout: a collective that
waits more than N seconds for another rank fails, and the rank exits with a one-line message
(:func:`rag_plugin.fairseq_hooks.excepthook.lost_rank_message`). A rank that dies outright (its connections
close) is noticed at the next collective without waiting for any timeout.

Choose N above the longest time one rank may legitimately make the others wait (a validation
pass, writing a checkpoint). A one-line error on one rank (bad input only it reads) stops every
rank with that same line at once (:mod:`rag_plugin.fairseq_hooks.rank_errors`).

``--ddp-backend pytorch_ddp`` (``c10d``) on the CPU: fairseq hands torch's DistributedDataParallel
``device_ids=[device_id]`` whatever the device, which torch refuses for a module on the CPU ("device_ids
and output_device arguments only work with single-device/multiple-device GPU modules"). With the plugin
loaded, a module on the CPU is wrapped without them (what torch asks for a CPU module); on a GPU nothing
changes. So ``--cpu --ddp-backend pytorch_ddp`` trains with torch's DDP (gloo), as on GPUs with NCCL.
"""
import datetime
import functools

import torch.distributed as dist
from fairseq.distributed import utils as distributed_utils
from fairseq.models import distributed_fairseq_model

from rag_plugin.fairseq_hooks import excepthook, rank_errors


def _with_timeout(create, seconds: float):
    """``create`` (init_process_group, new_group) with ``timeout`` defaulting to ``seconds``."""

    @functools.wraps(create)
    def wrapper(*args, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = datetime.timedelta(seconds=seconds)
        return create(*args, **kwargs)

    wrapper._rag_plugin_plain = create
    return wrapper


def _stop_relayed(line: str) -> None:
    """End this rank with another rank's one-line error."""
    excepthook.stop_process(line, 2, relayed=True)


def bound_collective_waits() -> None:
    """Make fairseq's ``--heartbeat-timeout`` the timeout of its process groups: the world group
    and the groups fairseq makes later with ``new_group`` (data parallel, which its all-reduces
    use); once they are set up, start the relay of one-line errors between ranks
    (:mod:`rag_plugin.fairseq_hooks.rank_errors`). Idempotent."""
    plain = distributed_utils.distributed_init
    if getattr(plain, "_rag_plugin", False):
        return

    @functools.wraps(plain)
    def distributed_init(cfg):
        training = getattr(cfg, "distributed_training", cfg)
        seconds = getattr(training, "heartbeat_timeout", -1) or -1
        if seconds > 0:
            for name in ("init_process_group", "new_group"):
                create = getattr(dist, name)
                setattr(dist, name, _with_timeout(getattr(create, "_rag_plugin_plain", create), seconds))
        rank = plain(cfg)
        rank_errors.start_relay(_stop_relayed)  # a one-line error on one rank stops every rank with that line
        return rank

    distributed_init._rag_plugin = True
    distributed_utils.distributed_init = distributed_init


def _ddp_for_module(ddp_class):
    """``ddp_class`` (torch's DistributedDataParallel) as fairseq calls it, with ``device_ids`` and
    ``output_device`` left out for a module whose parameters are all on the CPU."""

    @functools.wraps(ddp_class)
    def create(module, *args, **kwargs):
        devices = {p.device.type for p in module.parameters()}
        if devices == {"cpu"}:
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
        return ddp_class(module, *args, **kwargs)

    create._rag_plugin_plain = ddp_class
    return create


def torch_ddp_on_cpu() -> None:
    """Let fairseq wrap a CPU model in torch's DistributedDataParallel (``--cpu --ddp-backend pytorch_ddp``).
    Idempotent."""
    current = distributed_fairseq_model.DistributedDataParallel
    if getattr(current, "_rag_plugin_plain", None) is not None:
        return
    distributed_fairseq_model.DistributedDataParallel = _ddp_for_module(current)
