"""User-facing errors: one line, naming the file (and line) and what to do.

Every command-line entry point wraps its body in :func:`cli_main`, which turns a
:class:`UserError` into ``error: <message>`` on stderr and exit status 2, with no
traceback. Library code raises :class:`UserError` for bad input and lets real bugs
surface as ordinary exceptions; it never ends the process. (The fairseq command lines get the
same one-line errors from :mod:`rag_plugin.fairseq_hooks.excepthook`.)
"""
from __future__ import annotations

import functools
import re
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
    import difflib  # start-up: every command line imports this module; only an invalid choice needs difflib

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


def cli_main(func: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Decorator for ``main()`` functions: a :class:`UserError` (a usage error of a
    :class:`rag_plugin.cli.common.ArgumentParser` too) -> one line on stderr, exit 2."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs) -> int:
        try:
            rc = func(*args, **kwargs)
        except UserError as err:
            sys.stderr.write(f"error: {err.render()}\n")
            return 2
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted (rerun the same command to resume)\n")
            return 130
        return 0 if rc is None else int(rc)

    return wrapper


def is_refused_pickle(exc: BaseException) -> bool:
    """Whether ``exc`` is torch refusing (``weights_only=True``) to unpickle code."""
    import pickle  # start-up: every command line imports this module; only a refused checkpoint needs pickle

    return isinstance(exc, pickle.UnpicklingError) and "weights_only" in str(exc)


def exception_chain(exc: Optional[BaseException], depth: int = 8) -> Iterator[BaseException]:
    """``exc``, then the exception it was raised from or while handling, and so on (``depth`` at most)."""
    while exc is not None and depth > 0:
        yield exc
        exc = exc.__cause__ or exc.__context__
        depth -= 1


def user_error_in_chain(exc: Optional[BaseException]) -> Optional[BaseException]:
    """``exc`` itself, or the exception it was raised from or while handling, if that is a
    :class:`UserError` (or a refused pickle). fairseq re-raises some errors as a generic
    ``Exception`` (e.g. "Cannot load model parameters from checkpoint"): the user's problem is
    the original one."""
    for e in exception_chain(exc):
        if isinstance(e, UserError) or is_refused_pickle(e):
            return e
    return None
