"""Small pieces shared by ``scripts/evaluate.py`` and ``scripts/leaderboard.py``."""
from __future__ import annotations

import argparse
from typing import List, Tuple

from rag_plugin.util.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are one-line :class:`UserError` s (exit 2 via cli_main)."""

    def error(self, message: str):  # noqa: D401 - argparse's API
        raise UserError(message, fix=f"see {self.prog} --help")


def parse_pairs(items: List[str], flag: str) -> List[Tuple[str, str]]:
    """``["A=x.jsonl", "B=y.txt"]`` -> ``[("A", "x.jsonl"), ...]``; names unique and non-empty."""
    out: List[Tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"{flag} {item!r} is not NAME=FILE", fix=f"write {flag} NAME=FILE")
        out.append((name.strip(), path.strip()))
    return out
