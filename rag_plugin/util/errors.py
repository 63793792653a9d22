"""User-facing errors: one line, naming the file (and line) and what to do.

Every command-line entry point wraps its body in :func:`cli_main`, which turns a
:class:`UserError` into ``error: <message>`` on stderr and exit status 2, with no
traceback. Library code raises :class:`UserError` for bad input and lets real bugs
surface as ordinary exceptions.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Callable, Iterator, Optional


class UserError(Exception):
    """A problem with the user's input that the user can fix.

    ``path``/``line`` locate the offending input; ``fix`` says what to do. The
    rendered message is always a single line.
    """

    def __init__(self, message: str, path: Optional[str] = None, line: Optional[int] = None,
                 fix: Optional[str] = None):
        self.message = message
        self.path = None if path is None else str(path)
        self.line = line
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path + (f":{self.line}" if self.line is not None else "") + ": "
        text = where + self.message
        if self.fix:
            text += f" ({self.fix})"
        return " ".join(text.split())  # always one line


def usage_error_message(message: str) -> str:
    """argparse's message, shortened: an ``invalid choice`` names close matches, not every choice."""
    import difflib
    import re

    m = re.match(r"(argument \S+: invalid choice: '(.*?)') \(choose from (.*)\)$", message, re.S)
    if not m:
        return message
    choices = re.findall(r"'([^']*)'", m.group(3))
    close = difflib.get_close_matches(m.group(2), choices, n=3, cutoff=0.6)
    if close:
        return f"{m.group(1)} (did you mean {' or '.join(close)}?)"
    if len(choices) <= 8:
        return f"{m.group(1)} (choose from {', '.join(choices)})"
    return f"{m.group(1)} ({len(choices)} choices)"


def _raise_usage_error(parser, message: str):
    raise UserError(usage_error_message(message), fix=f"see {parser.prog} --help")


@contextlib.contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """While active, argparse usage errors (missing or invalid arguments) raise :class:`UserError`
    instead of printing the usage text: one line, exit status 2 under :func:`cli_main`."""
    import argparse

    previous = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _raise_usage_error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = previous


def cli_main(func: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Decorator for ``main()`` functions: UserError (argparse usage errors included) -> one
    line on stderr, exit 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs) -> int:
        try:
            with one_line_usage_errors():
                rc = func(*args, **kwargs)
        except UserError as err:
            sys.stderr.write(f"error: {err.render()}\n")
            return 2
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted (rerun the same command to resume)\n")
            return 130
        return 0 if rc is None else int(rc)

    return wrapper


def _is_refused_pickle(exc_type, exc) -> bool:
    import pickle

    return issubclass(exc_type, pickle.UnpicklingError) and "weights_only" in str(exc)


def _chain(exc: Optional[BaseException], depth: int = 8) -> Iterator[BaseException]:
    """``exc``, then the exception it was raised from or while handling, and so on (``depth`` at most)."""
    while exc is not None and depth > 0:
        yield exc
        exc = exc.__cause__ or exc.__context__
        depth -= 1


def _user_error_in_chain(exc: Optional[BaseException]) -> Optional[BaseException]:
    """``exc`` itself, or the exception it was raised from or while handling, if that is a
    :class:`UserError` (or a refused pickle). fairseq re-raises some errors as a generic
    ``Exception`` (e.g. "Cannot load model parameters from checkpoint"): the user's problem is
    the original one."""
    for e in _chain(exc):
        if isinstance(e, UserError) or _is_refused_pickle(type(e), e):
            return e
    return None


#: What torch.distributed's backends say when another rank is gone (its process died, its
#: connection dropped) or did not answer within the process group's timeout.
_LOST_RANK_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "Timed out waiting", "remote worker crashing", "Socket Timeout", "ECONNRESET")


def _lost_rank_error(exc: Optional[BaseException]) -> Optional[BaseException]:
    for e in _chain(exc):  # also when fairseq's heartbeat SIGINT came on top of it
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


def missing_accelerator_message(exc: BaseException) -> Optional[str]:
    """A one-line message if fairseq failed for want of the accelerator an option asks for:
    ``--fp16`` puts the optimizer's float32 master weights on CUDA, ``--bf16`` and
    ``--memory-efficient-bf16`` imply ``--tpu``; without them fairseq stops with an assertion
    or an attribute error deep in its trainer."""
    for e in _chain(exc):
        if isinstance(e, AssertionError) and "not compiled with CUDA" in str(e):
            return ("--fp16 needs CUDA, which this torch build lacks: fairseq keeps the float32 master weights on "
                    "the GPU (on the CPU leave --fp16 out and train in float32)")
        if isinstance(e, AttributeError) and "xla_device" in str(e):
            return ("fairseq's --bf16 and --memory-efficient-bf16 imply --tpu and need torch_xla (on a GPU use "
                    "--fp16; on the CPU leave them out)")
    return None


#: --replace-unk with rag_plugin: (what, what to do); fairseq-generate fails on it before the task sees it
REPLACE_UNK = ("--replace-unk copies source words through an alignment, which RAG does not produce",
               "leave --replace-unk out")


def unsupported_option_message(exc: BaseException) -> Optional[str]:
    """A one-line message if fairseq-generate failed on an option that rag_plugin does not support
    before the plugin could refuse it: ``--replace-unk`` stops at fairseq's assertion that the
    dataset is raw text, or (``--dataset-impl raw``) in ``load_align_dict`` opening a file named
    after the option's value (``@@ `` when given without one)."""
    for e in _chain(exc):
        if isinstance(e, AssertionError) and "--replace-unk requires" in str(e):
            return f"{REPLACE_UNK[0]} ({REPLACE_UNK[1]})"
        tb = e.__traceback__
        while isinstance(e, OSError) and tb is not None:
            if tb.tb_frame.f_code.co_name == "load_align_dict":
                return f"{REPLACE_UNK[0]} ({REPLACE_UNK[1]})"
            tb = tb.tb_next
    return None


def _write_and_exit(message: str, status: int) -> None:
    # torch.distributed wraps sys.excepthook and points sys.stderr at a buffer while the hook
    # runs; the process ends here, so write to the real stderr.
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"error: {message}\n")
    stream.flush()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(status)


def install_excepthook() -> None:
    """Make a :class:`UserError` escaping a fairseq entry point a one-line error, exit 2; a
    collective failing because another rank died: one line, exit 1; fairseq failing for want of
    the accelerator an option asks for (:func:`missing_accelerator_message`), or on an option the
    plugin does not support (:func:`unsupported_option_message`): one line, exit 2."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        cause = _user_error_in_chain(exc)
        if cause is not None:
            message = cause.render() if isinstance(cause, UserError) else (
                "a checkpoint refers to code that safe loading refuses (weights_only=True); it was not loaded "
                "(only load checkpoints from sources you trust)")
            _write_and_exit(message, 2)
        lost = lost_rank_message(exc) if exc is not None else None
        if lost is not None:
            _write_and_exit(lost, 1)
        accelerator = missing_accelerator_message(exc) if exc is not None else None
        if accelerator is not None:
            _write_and_exit(accelerator, 2)
        unsupported = unsupported_option_message(exc) if exc is not None else None
        if unsupported is not None:
            _write_and_exit(unsupported, 2)
        previous(exc_type, exc, tb)

    if getattr(sys.excepthook, "_rag_plugin", False):
        return
    hook._rag_plugin = True
    sys.excepthook = hook


def install_fairseq_usage_errors() -> None:
    """fairseq's command lines (``fairseq-train`` ...) report a bad argument in one line
    (``error: argument --arch/-a: invalid choice: 'x' (did you mean ...?)``), exit 2, instead of
    the whole usage text and a list of every registered architecture. Other parsers unchanged."""
    import argparse

    current = argparse.ArgumentParser.error
    if getattr(current, "_rag_plugin", False):
        return

    def error(parser, message):
        if not str(parser.prog).startswith("fairseq"):
            return current(parser, message)
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"error: {usage_error_message(message)} (see {parser.prog} --help)\n")
        stream.flush()
        sys.exit(2)

    error._rag_plugin = True
    argparse.ArgumentParser.error = error
