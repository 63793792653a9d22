"""One error line on every rank: a one-line error that stops one rank of a distributed job stops them all.

A :class:`~rag_plugin.util.errors.UserError` (or another exit-2 error of :mod:`.excepthook`) raised on one rank
only (an input only its shard holds, a file only its node lacks) used to end that rank with its line while the
others, waiting for it in their next collective, stopped with "lost contact with another rank" (or, if it
hung, after the process group's timeout). With the plugin's command-line hooks, fairseq's
``distributed_init`` starts an :class:`ErrorRelay` on every rank of a job of two or more: the failing rank
publishes its line in the job's store (the c10d key-value store torch.distributed was set up with: torchrun's,
``env://``'s or ``tcp://``'s, served by rank 0's process) before it exits; every rank polls the store once per
:data:`POLL_SECONDS` from a daemon thread and, on seeing another rank's line, writes the same ``error: ...``
line and exits 2, wherever its main thread is (a collective, a forward pass). Every rank then waits until
all have written the line (at most :data:`WAIT_SECONDS`): torchrun's agent ends the other ranks as soon as
one exits, and rank 0's process serves the store. A rank whose collective fails first (its peer gone) looks
in the store too, and writes the relayed line rather than "lost contact".
"""
import atexit
import logging
import threading
import time
from typing import Callable, Optional

import torch.distributed as dist

logger = logging.getLogger(__name__)

#: the line of the first rank that stopped on a one-line error
ERROR_KEY = "rag_plugin/error_line"
#: a counter: the ranks that took the publisher's place (the first to add is the publisher)
PUBLISHERS_KEY = "rag_plugin/error_publishers"
#: a counter: the ranks that have written their last line
STOPPED_KEY = "rag_plugin/stopped_ranks"
#: a counter: the ranks other than 0 that are done with the store
LEFT_KEY = "rag_plugin/left_ranks"
#: a counter: the ranks other than 0 that have stopped watching at the end of a run
CLOSED_KEY = "rag_plugin/closed_ranks"
#: how often each rank looks for another rank's line
POLL_SECONDS = 1.0
#: how long rank 0, at the end of a run, waits for the other ranks to stop watching
CLOSE_SECONDS = 10.0
#: how long the publishing rank waits for the others to have written the line before it exits
WAIT_SECONDS = 15.0

_relay: Optional["ErrorRelay"] = None


class ErrorRelay:
    """The store side of one rank: :meth:`publish`, :meth:`published`, :meth:`finish`, and a watching thread that
    calls ``stop(line)`` with another rank's line (the excepthook's end of the process, handed in by
    :mod:`.distributed`: the hook itself publishes through this module)."""

    def __init__(self, store, rank: int, world: int, stop: Callable[[str], None], poll: float = POLL_SECONDS,
                 wait: float = WAIT_SECONDS):
        self.store, self.rank, self.world, self.poll, self.wait = store, int(rank), int(world), poll, wait
        self.stop = stop
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rag_plugin-error-relay", daemon=True)
        self.publisher = False

    def start(self) -> "ErrorRelay":
        self._thread.start()
        atexit.register(self.close)  # before the interpreter tears the store down under the thread
        return self

    def close(self) -> None:
        """At the end of a run: stop watching. Rank 0 leaves last (at most :data:`CLOSE_SECONDS` later), so that
        no rank still watching calls a store that rank 0's process no longer serves."""
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll + 5.0)
        try:
            if self.rank != 0:
                self.store.add(CLOSED_KEY, 1)
                return
            deadline = time.monotonic() + CLOSE_SECONDS
            while int(self.store.add(CLOSED_KEY, 0)) < self.world - 1 and time.monotonic() < deadline:
                time.sleep(0.05)
        except Exception:  # the store is gone
            pass

    def publish(self, line: str) -> None:
        """Make ``line`` the job's error line, unless another rank's is already (the first one stays)."""
        if int(self.store.add(PUBLISHERS_KEY, 1)) == 1:
            self.publisher = True  # first: this rank's own thread must not take the line for another's
            self.store.set(ERROR_KEY, line)

    def published(self) -> Optional[str]:
        """The job's error line, if a rank has published one (does not wait)."""
        if not self.store.check([ERROR_KEY]):
            return None
        return self.store.get(ERROR_KEY).decode("utf-8", "replace")

    def finish(self, wait: bool) -> None:
        """This rank has written its last line. ``wait`` (the line is the job's): wait for every rank to have
        written it (torchrun's agent ends the other ranks once one exits), then leave; rank 0, whose process
        serves the store of an ``env://`` or ``tcp://`` job, leaves last (a store gone under a rank's last
        call makes torch print a stack trace). At most :data:`WAIT_SECONDS` in all."""
        deadline = time.monotonic() + self.wait
        stopped = int(self.store.add(STOPPED_KEY, 1))
        while wait and stopped < self.world and time.monotonic() < deadline:
            time.sleep(0.05)
            stopped = int(self.store.add(STOPPED_KEY, 0))
        if self.rank != 0:
            self.store.add(LEFT_KEY, 1)  # this rank's last call to the store
            return
        while wait and int(self.store.add(LEFT_KEY, 0)) < self.world - 1 and time.monotonic() < deadline:
            time.sleep(0.05)

    def _watch(self) -> None:
        while not self._closed.wait(self.poll):
            try:
                line = self.published()
            except Exception:  # the store is gone (rank 0 ended): nothing more can be relayed
                return
            if line is not None and not self.publisher:
                self.stop(line)
                return


def start_relay(stop: Callable[[str], None]) -> Optional[ErrorRelay]:
    """Start this rank's relay (after torch.distributed is initialised; a world of one needs none); ``stop(line)``
    ends the process with another rank's line."""
    global _relay
    if _relay is not None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return _relay
    try:  # a private name of torch's, which another torch may lack: imported where that is caught
        from torch.distributed.distributed_c10d import _get_default_store

        store = _get_default_store()
    except Exception as err:  # another torch: the ranks stop as before ("lost contact")
        logger.warning("one error line on every rank is off: no store to relay it (%s)", err)
        return None
    _relay = ErrorRelay(store, dist.get_rank(), dist.get_world_size(), stop).start()
    return _relay


def current() -> Optional[ErrorRelay]:
    """This process's relay, or None (no distributed job, or not the command line)."""
    return _relay


def publish(line: str) -> None:
    """Publish this rank's error line (a no-op without a relay; a store that fails is ignored)."""
    if _relay is None:
        return
    try:
        _relay.publish(line)
    except Exception:  # the store's host is gone: the others will see "lost contact"
        pass


def relayed_line() -> Optional[str]:
    """Another rank's published error line, or None (no relay, none published, or the store gone)."""
    if _relay is None:
        return None
    try:
        return _relay.published()
    except Exception:
        return None


def finish(wait: bool) -> None:
    """This rank has written its last line (see :meth:`ErrorRelay.finish`)."""
    if _relay is None:
        return
    try:
        _relay.finish(wait)
    except Exception:  # the store is gone
        pass
