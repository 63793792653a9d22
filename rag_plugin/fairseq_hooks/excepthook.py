"""One-line errors for the fairseq command lines (installed on the command-line path only).

fairseq's mains let exceptions escape to the interpreter. With the plugin loaded by a fairseq
command line, an uncaught exception whose cause is the user's (a :class:`UserError`, a pickle
refused by safe loading), a rank lost in a collective, or fairseq refusing its options (a 16-bit option without
its hardware, an option the plugin does not support, any of fairseq's own assertions:
:mod:`.option_errors`) ends the process with one line on stderr (exit 2; 1 for a lost rank or an assertion that
names no option) instead of a traceback. Everything else goes to the previous hook unchanged.
"""
import contextlib
import logging
import os
import sys
import threading
from typing import Optional

from rag_plugin.fairseq_hooks import rank_errors
from rag_plugin.fairseq_hooks.option_errors import OPTION_MESSAGES, fairseq_assertion_line
from rag_plugin.util.errors import UserError, exception_chain, user_error_in_chain

#: What torch.distributed's backends say when another rank is gone (its process died, its
#: connection dropped) or did not answer within the process group's timeout.
_LOST_RANK_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "Timed out waiting", "remote worker crashing", "Socket Timeout", "ECONNRESET")


def _lost_rank_error(exc: Optional[BaseException]) -> Optional[BaseException]:
    for e in exception_chain(exc):  # also when fairseq's heartbeat SIGINT came on top of it
        names = {cls.__name__ for cls in type(e).__mro__}
        if names & {"RuntimeError", "DistError", "DistBackendError", "DistNetworkError"} and \
                any(sign in str(e) for sign in _LOST_RANK_SIGNS):
            return e
    return None


def lost_rank_message(exc: BaseException) -> Optional[str]:
    """A one-line message if ``exc`` is a collective failing because another rank is gone."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    exc = _lost_rank_error(exc)
    if exc is None:
        return None
    text = str(exc)
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else type(exc).__name__
    first = first.split("] ", 1)[-1].split(". ")[0]  # drop gloo's "[file.cc:123]" prefix and its advice
    if len(first) > 160:
        first = first[:157] + "..."
    return (f"rank {dist.get_rank()} of {dist.get_world_size()}: lost contact with another rank ({first}) "
            f"(a rank died or hangs: see its log; fix it, then rerun the same command to resume from "
            f"checkpoint_last.pt)")


#: one last line per process: the main thread's hook or the error relay's thread (rank_errors), not both
#: (reentrant: an error inside stop_process itself must not deadlock its own thread)
_stopping = threading.RLock()


def stop_process(message: str, status: int, relayed: bool = False) -> None:
    """End the process with ``error: message`` on stderr and exit ``status``. In a distributed job an exit-2 line
    of this rank's own is first published for the other ranks, which stop with the same line
    (:mod:`rag_plugin.fairseq_hooks.rank_errors`); ``relayed``: the line is another rank's."""
    _stopping.acquire()  # never released: the process ends here
    if status == 2 and not relayed:
        rank_errors.publish(message)
    # torch.distributed wraps sys.excepthook and points sys.stderr at a buffer while the hook
    # runs; the process ends here, so write to the real stderr.
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"error: {message}\n")
    stream.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        logging.shutdown()  # flush the log handlers: os._exit skips them
    rank_errors.finish(wait=status == 2)  # a line every rank writes: wait for the others to have (bounded)
    # os._exit: under torch.distributed a plain exit can hang in the process group's teardown;
    # this hook runs only on a fairseq command line (never in a library user's process)
    os._exit(status)


def install_excepthook() -> None:
    """Make a :class:`UserError` escaping a fairseq entry point a one-line error, exit 2; a
    collective failing because another rank died: one line, exit 1; fairseq failing for want of
    the accelerator an option asks for, on an option the plugin does not support, on a resume with other
    precision options or at an assertion that options reach (:data:`OPTION_MESSAGES`): one line, exit 2; any
    other assertion of fairseq's own code: one line saying what it asserted and where (exit 2 when it names an
    option, 1 otherwise)."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        cause = user_error_in_chain(exc)
        if cause is not None:
            message = cause.render() if isinstance(cause, UserError) else (
                "a checkpoint refers to code that safe loading refuses (weights_only=True); it was not loaded "
                "(only load checkpoints from sources you trust)")
            stop_process(message, 2)
        lost = lost_rank_message(exc) if exc is not None else None
        if lost is not None:
            relayed = rank_errors.relayed_line()  # the rank gone stopped on a one-line error: the same line
            if relayed is not None:
                stop_process(relayed, 2, relayed=True)
            stop_process(lost, 1)
        for option_message in OPTION_MESSAGES if exc is not None else ():
            message = option_message(exc)
            if message is not None:
                stop_process(message, 2)
        line = fairseq_assertion_line(exc) if exc is not None else None
        if line is not None:
            stop_process(*line)
        previous(exc_type, exc, tb)

    if getattr(sys.excepthook, "_rag_plugin", False):
        return
    hook._rag_plugin = True
    sys.excepthook = hook
