"""Encoder specs (``KIND[:ARG][,key=value...]``) and the registry of the loaders behind them.

A family of encoders is one module with one decorated loader::

    @register_encoder("minilm", usage="minilm[:DIR]")
    def load_minilm(arg: str, options: EncoderOptions) -> TextEncoder: ...

:func:`load_encoder` parses a spec, finds its kind's loader and records the spec on the
encoder it returns. A loader reads its settings with :class:`EncoderOptions`, which
refuses unknown keys and badly typed values with one-line errors naming the spec.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, Optional, Tuple

from rag_plugin.retrieval.encoders.text_encoder import TextEncoder
from rag_plugin.util.errors import UserError

#: kind -> (loader, usage); filled by :func:`register_encoder`.
_LOADERS: Dict[str, Tuple[Callable[..., TextEncoder], str]] = {}


def register_encoder(kind: str, usage: str) -> Callable:
    """Decorator: ``loader(arg, options: EncoderOptions) -> TextEncoder`` serves specs of ``kind``;
    ``usage`` (e.g. ``"dpr:CKPT[,vocab=FILE]"``) is shown when a spec is wrong."""
    kind = kind.lower()

    def register(loader: Callable[..., TextEncoder]) -> Callable[..., TextEncoder]:
        if kind in _LOADERS and _LOADERS[kind][0] is not loader:
            raise ValueError(f"encoder kind {kind!r} is registered twice")
        _LOADERS[kind] = (loader, usage)
        return loader

    return register


def registered_kinds() -> Tuple[str, ...]:
    """The kinds :func:`load_encoder` accepts, sorted."""
    return tuple(sorted(_LOADERS))


def spec_help() -> str:
    """``use minilm[:DIR], ... or random:...``: the usage of every registered kind."""
    usages = [usage for _, usage in (_LOADERS[kind] for kind in registered_kinds())]
    if len(usages) < 2:
        return "use " + "".join(usages)
    return "use " + ", ".join(usages[:-1]) + " or " + usages[-1]


def load_encoder(spec: str) -> TextEncoder:
    """Build a :class:`TextEncoder` from a spec (see :mod:`rag_plugin.retrieval.encoders`).
    Local files only."""
    kind, arg, options = parse_spec(spec)
    if kind not in _LOADERS:
        raise UserError(f"unknown encoder spec {spec!r}: the kinds are {', '.join(registered_kinds())}",
                        fix=spec_help())
    loader, _ = _LOADERS[kind]
    encoder = loader(arg, EncoderOptions(options, spec))
    encoder.spec = spec
    return encoder


def parse_spec(spec: str) -> Tuple[str, str, Dict[str, str]]:
    """``"kind:arg,k=v,..."`` -> (kind, arg, options). For ``random`` the argument is empty
    and every ``k=v`` is an option."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty encoder spec {spec!r}", fix=spec_help())
    match = re.match(r"([A-Za-z][\w-]*)(?:([:,])(.*))?$", spec.strip(), re.S)
    if match is None:
        raise UserError(f"unknown encoder spec {spec!r}", fix=spec_help())
    kind, sep, rest = match.group(1), match.group(2), match.group(3) or ""
    parts = [p for p in rest.split(",") if p]
    arg = ""
    if sep == ":" and parts and "=" not in parts[0]:
        arg = parts.pop(0)
    options = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise UserError(f"bad option {part!r} in encoder spec {spec!r}", fix="write key=value")
        options[key.strip()] = value.strip()
    return kind.strip().lower(), arg, options


class EncoderOptions:
    """The ``key=value`` options of one spec; a loader takes each it knows, then calls
    :meth:`done` so that any left over is an error."""

    def __init__(self, options: Dict[str, str], spec: str):
        self.options = dict(options)
        self.spec = spec

    def text(self, key: str, default: Optional[str]) -> Optional[str]:
        """The option's string, or ``default``."""
        return self.options.pop(key, default)

    def integer(self, key: str, default: Optional[int]) -> Optional[int]:
        """The option as an int, or ``default``."""
        if key not in self.options:
            return default
        try:
            return int(self.options.pop(key))
        except ValueError:
            raise UserError(f"option {key} in encoder spec {self.spec!r} must be an integer") from None

    def flag(self, key: str, default: bool) -> bool:
        """The option as a bool (1/true/yes/on, 0/false/no/off), or ``default``."""
        if key not in self.options:
            return default
        value = self.options.pop(key).lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise UserError(f"option {key} in encoder spec {self.spec!r} must be 0 or 1")

    def done(self, allowed: str) -> None:
        """Every option was taken; ``allowed`` (e.g. ``"vocab, heads, max_length"``) is the fix."""
        if self.options:
            raise UserError(f"unknown option(s) {', '.join(sorted(self.options))} in encoder spec "
                            f"{self.spec!r}", fix=f"allowed here: {allowed}")
