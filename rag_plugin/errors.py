"""User-facing errors: one line, naming the file (and line) and what to do.

Every command-line entry point wraps its body in :func:`cli_main`, which turns a
:class:`UserError` into ``error: <message>`` on stderr and exit status 2, with no
traceback. Library code raises :class:`UserError` for bad input and lets real bugs
surface as ordinary exceptions.
"""
from __future__ import annotations

import functools
import sys
from typing import Callable, Optional


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


def cli_main(func: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Decorator for ``main()`` functions: UserError -> one line on stderr, exit 2."""

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


def _is_refused_pickle(exc_type, exc) -> bool:
    import pickle

    return issubclass(exc_type, pickle.UnpicklingError) and "weights_only" in str(exc)


def install_excepthook() -> None:
    """Make a :class:`UserError` escaping a fairseq entry point a one-line error, exit 2."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, UserError) or _is_refused_pickle(exc_type, exc):
            message = exc.render() if isinstance(exc, UserError) else (
                "a checkpoint refers to code that safe loading refuses (weights_only=True); it was not loaded "
                "(only load checkpoints from sources you trust)")
            sys.stderr.write(f"error: {message}\n")
            sys.stderr.flush()
            import os

            os._exit(2)
        previous(exc_type, exc, tb)

    if getattr(sys.excepthook, "_rag_plugin", False):
        return
    hook._rag_plugin = True
    sys.excepthook = hook
