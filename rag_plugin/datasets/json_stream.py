"""A streaming pull parser for one big JSON document (DPR's retriever JSON, TriviaQA's JSON,
MS-MARCO's columnar JSON, a JSON array of Jeopardy clues), holding one element at a time.

Elements are decoded with the C JSON scanner on a sliding text buffer; errors are one-line
:class:`~rag_plugin.util.errors.UserError` s naming the file and line. ``.gz`` files are read
through gzip.
"""
from __future__ import annotations

import json
import re
from typing import Iterator, Optional, Tuple

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import READ_ERRORS, PathLike, open_text, unreadable_file_error, utf8_error

_MAX_JSON_VALUE_CHARS = 512 << 20  # one element of a streamed JSON array/object

_WS = re.compile(r"[ \t\r\n]*")
_DECODER = json.JSONDecoder()


class JsonStream:
    """A pull parser for one big JSON document, holding one element at a time in memory.

    ``iter_array()`` yields ``(line, value)`` for the elements of an array; ``iter_object()``
    yields ``(line, key)`` and the caller then consumes the value (``value()``, or a nested
    ``iter_array()``/``iter_object()``). Elements are decoded with the C JSON scanner on a
    sliding buffer; errors name the file and line.
    """

    def __init__(self, path: PathLike, chunk_chars: int = 1 << 20):
        self.path = str(path)
        self._fh = open_text(path)
        self.buf = ""
        self.pos = 0
        self.line = 1
        self.eof = False
        self.chunk = chunk_chars

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- buffer
    def _more(self, min_chars: int = 0) -> bool:
        if self.eof:
            return False
        if self.pos:
            self.buf = self.buf[self.pos:]
            self.pos = 0
        if len(self.buf) > _MAX_JSON_VALUE_CHARS:
            raise self.error(f"a single JSON value is larger than {_MAX_JSON_VALUE_CHARS >> 20} MiB",
                             fix="is this the right file?")
        try:
            data = self._fh.read(max(self.chunk, min_chars))
        except UnicodeDecodeError:
            raise utf8_error(self.path) from None
        except READ_ERRORS as err:  # truncated or corrupt .gz
            raise unreadable_file_error(self.path, err) from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _advance(self, end: int) -> None:
        self.line += self.buf.count("\n", self.pos, end)
        self.pos = end

    def _skip_ws(self) -> None:
        while True:
            self._advance(_WS.match(self.buf, self.pos).end())
            if self.pos < len(self.buf) or not self._more():
                return

    def error(self, message: str, at: Optional[int] = None, fix: Optional[str] = None) -> UserError:
        line = self.line if at is None else self.line + self.buf.count("\n", self.pos, at)
        return UserError(message, path=self.path, line=line, fix=fix)

    # ---- tokens
    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file)."""
        self._skip_ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, char: str, what: str) -> None:
        got = self.peek()
        if got != char:
            raise self.error(f"expected {what}, found {got!r}" if got else f"expected {what}, "
                             "found the end of the file", fix="is this the right file?")
        self._advance(self.pos + 1)

    def value(self):
        """Decode the next complete JSON value."""
        self._skip_ws()
        if self.pos >= len(self.buf):
            raise self.error("unexpected end of file", fix="the file is truncated: re-download it")
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                truncated = err.msg.startswith("Unterminated string") or err.pos >= len(self.buf) - 16
                if self.eof or not truncated:
                    raise self.error(f"invalid JSON ({err.msg})", at=err.pos,
                                     fix="the file is damaged or not in the expected format") from None
            else:
                if end < len(self.buf) or self.eof:
                    self._advance(end)
                    return obj
            self._more(len(self.buf) - self.pos)  # grow geometrically: amortised linear

    def iter_array(self) -> Iterator[Tuple[int, object]]:
        self.expect("[", "a JSON array '['")
        if self.peek() == "]":
            self._advance(self.pos + 1)
            return
        while True:
            self._skip_ws()
            line = self.line
            yield line, self.value()
            nxt = self.peek()
            self._advance(self.pos + 1)
            if nxt == "]":
                return
            if nxt != ",":
                raise self.error(f"expected ',' or ']' after an array element, found {nxt!r}",
                                 fix="the file is damaged or truncated")

    def iter_object(self) -> Iterator[Tuple[int, str]]:
        self.expect("{", "a JSON object '{'")
        if self.peek() == "}":
            self._advance(self.pos + 1)
            return
        while True:
            if self.peek() != '"':
                raise self.error("expected a quoted object key", fix="the file is damaged")
            line = self.line
            key = self.value()
            self.expect(":", "':' after an object key")
            yield line, key  # the caller consumes the value here
            nxt = self.peek()
            self._advance(self.pos + 1)
            if nxt == "}":
                return
            if nxt != ",":
                raise self.error(f"expected ',' or '}}' after an object value, found {nxt!r}",
                                 fix="the file is damaged or truncated")

    def first_key(self) -> Optional[str]:
        """The first key of a top-level object (consumes the stream's start)."""
        self.expect("{", "a JSON object '{'")
        if self.peek() != '"':
            return None
        key = self.value()
        return key if isinstance(key, str) else None
