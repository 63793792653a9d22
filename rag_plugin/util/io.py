"""Atomic file output: nothing that looks complete is written before it is."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator, Tuple, Union

PathLike = Union[str, os.PathLike]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)  # mkstemp makes 0600; give what open(..., "w") would
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def atomic_write_text(path: PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def decoded_lines(fh, path) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of an open binary file, line ends kept; a line that is not
    UTF-8 is a one-line :class:`~rag_plugin.util.errors.UserError` naming the file and line."""
    from rag_plugin.util.errors import UserError

    for lineno, raw in enumerate(fh, 1):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"not valid UTF-8 at byte {err.start} of the line", path=str(path), line=lineno,
                            fix="re-encode the file as UTF-8") from None


def first_invalid_utf8_line(path: PathLike) -> Tuple[int, int]:
    """``(line number, byte offset in that line)`` of the first bytes of ``path`` (``.gz`` read
    through gzip) that are not UTF-8; ``(0, 0)`` if there are none. For readers that decode in
    large chunks and so cannot tell which line a decoding error is on."""
    import gzip

    opener = gzip.open if str(path).lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return lineno, err.start
    return 0, 0


def utf8_error(path: PathLike):
    """The one-line :class:`~rag_plugin.util.errors.UserError` for a file that is not UTF-8."""
    from rag_plugin.util.errors import UserError

    try:
        lineno, start = first_invalid_utf8_line(path)
    except (OSError, EOFError):
        lineno, start = 0, 0
    where = f" at byte {start} of the line" if lineno else ""
    return UserError(f"not valid UTF-8{where}", path=str(path), line=lineno or None,
                     fix="re-encode the file as UTF-8")


def sha256_file(path: PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            digest.update(block)
    return digest.hexdigest()
