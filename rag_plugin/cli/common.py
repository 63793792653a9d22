"""What the plugin's command lines share: a parser whose usage errors are one line, a help
formatter that shows defaults, ``NAME=FILE`` pairs."""
from __future__ import annotations

import argparse
from typing import List, Tuple

from rag_plugin.util.errors import UserError, usage_error_message


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written (examples keep their lines) and every option's default, unless its help
    already says what the default is (``(default: the checkpoint's)``)."""

    def _get_help_string(self, action):
        if "(default:" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors (a missing or invalid argument) are one-line :class:`UserError` s
    (``error: ...``, exit 2 under :func:`rag_plugin.util.errors.cli_main`), and whose ``--help``
    shows every default. No global argparse state is changed."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's API
        raise UserError(usage_error_message(message), fix=f"see {self.prog} --help")


def parse_pairs(items: List[str], flag: str) -> List[Tuple[str, str]]:
    """``["A=x.jsonl", "B=y.txt"]`` -> ``[("A", "x.jsonl"), ...]``; names unique and non-empty."""
    out: List[Tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"{flag} {item!r} is not NAME=FILE", fix=f"write {flag} NAME=FILE")
        out.append((name.strip(), path.strip()))
    return out
