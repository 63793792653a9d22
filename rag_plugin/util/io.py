"""File input and output shared by the whole plugin.

* Atomic output (:func:`atomic_path`, :func:`atomic_write_text`, :func:`atomic_write_json`):
  nothing that looks complete is written before it is.
* Input files, optionally gzip-compressed (``.gz``): :func:`require_file`, :func:`open_binary`,
  :func:`open_text`, :func:`decoded_lines`, :func:`utf8_error`.
* The one JSONL reader, :func:`iter_jsonl`: ``(line number, object)`` per non-blank line, every
  problem a one-line :class:`~rag_plugin.util.errors.UserError` naming the file and line.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import IO, Iterator, Optional, Tuple, Union

from rag_plugin.util.errors import UserError

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


def is_gzip(path: PathLike) -> bool:
    """Whether ``path`` names a gzip-compressed file (by its ``.gz`` suffix)."""
    return str(path).lower().endswith(".gz")


def require_file(path: PathLike, what: str = "input file", fix: Optional[str] = None) -> Path:
    """``path`` as a :class:`~pathlib.Path` if it is an existing file, else a one-line
    :class:`~rag_plugin.util.errors.UserError` saying which ``what`` is missing."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} not found", path=str(p), fix=fix or "check the path")
    if not p.is_file():
        raise UserError(f"{what} is not a file", path=str(p), fix=fix or "pass a file")
    return p


def open_binary(path: PathLike, what: str = "input file") -> IO[bytes]:
    """An existing file opened for binary reading, through gzip when it ends in ``.gz``."""
    p = require_file(path, what)
    return gzip.open(p, "rb") if is_gzip(p) else open(p, "rb")


def open_text(path: PathLike, newline: Optional[str] = None, what: str = "input file") -> IO[str]:
    """An existing UTF-8 file (a leading byte-order mark dropped) opened for text reading,
    through gzip when it ends in ``.gz``."""
    p = require_file(path, what)
    if is_gzip(p):
        return gzip.open(p, "rt", encoding="utf-8-sig", newline=newline)
    return open(p, "r", encoding="utf-8-sig", newline=newline)


def decoded_lines(fh, path) -> Iterator[Tuple[int, str]]:
    """``(line number, text)`` of an open binary file, line ends kept; a line that is not
    UTF-8 is a one-line :class:`~rag_plugin.util.errors.UserError` naming the file and line."""
    for lineno, raw in enumerate(fh, 1):
        try:
            yield lineno, raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(f"not valid UTF-8 at byte {err.start} of the line", path=str(path), line=lineno,
                            fix="re-encode the file as UTF-8") from None


JSONL_FIX = "each line must be one JSON object"


def iter_jsonl(path: PathLike, fix: str = JSONL_FIX, what: str = "input file") -> Iterator[Tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSONL file (``.gz`` read through
    gzip), streamed. A missing file, a line that is not UTF-8, not JSON or not a JSON object, and
    a damaged ``.gz`` are one-line :class:`~rag_plugin.util.errors.UserError` s naming the file
    and line; ``fix`` says what a line should look like, ``what`` what the file is."""
    with open_binary(path, what) as fh:
        try:
            for lineno, line in decoded_lines(fh, path):
                line = (line.lstrip("\ufeff") if lineno == 1 else line).strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise UserError(f"invalid JSON ({err.msg}, column {err.colno})", path=str(path),
                                    line=lineno, fix=fix) from None
                except RecursionError:
                    raise UserError("JSON nested too deeply", path=str(path), line=lineno, fix=fix) from None
                if not isinstance(obj, dict):
                    raise UserError("line is not a JSON object", path=str(path), line=lineno, fix=fix)
                yield lineno, obj
        except (OSError, EOFError, zlib.error) as err:  # a truncated or corrupt .gz
            raise unreadable_file_error(path, err) from None


#: what a truncated or corrupt compressed (or unreadable) input raises while it is read
READ_ERRORS = (OSError, EOFError, zlib.error)


def unreadable_file_error(path: PathLike, err: BaseException):
    """The one-line error for an input that broke while being read (a truncated or corrupt ``.gz``)."""
    if is_gzip(path):
        return UserError(f"not a readable gzip file ({err})", path=str(path),
                         fix="download it again, or pass the decompressed file")
    return UserError(f"cannot read ({err})", path=str(path), fix="check the file, or download it again")


def first_invalid_utf8_line(path: PathLike) -> Tuple[int, int]:
    """``(line number, byte offset in that line)`` of the first bytes of ``path`` (``.gz`` read
    through gzip) that are not UTF-8; ``(0, 0)`` if there are none. For readers that decode in
    large chunks and so cannot tell which line a decoding error is on."""
    opener = gzip.open if is_gzip(path) else open
    with opener(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return lineno, err.start
    return 0, 0


def utf8_error(path: PathLike):
    """The one-line :class:`~rag_plugin.util.errors.UserError` for a file that is not UTF-8."""
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


def replace_directory(tmp: PathLike, out: PathLike) -> None:
    """Move the finished directory ``tmp`` onto ``out``. An existing ``out`` is first moved aside (and removed
    after), so at every moment ``out`` is either the old directory or the new one, never a mix."""
    tmp, out = Path(tmp), Path(out)
    if out.is_dir() and any(out.iterdir()):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    if out.is_dir():
        out.rmdir()
    elif out.exists():
        out.unlink()
    os.replace(tmp, out)


@contextlib.contextmanager
def atomic_directory(out: PathLike) -> Iterator[Path]:
    """A fresh temporary directory beside ``out`` to write into, put in place of ``out`` when the block
    completes (:func:`replace_directory`); removed, leaving ``out`` untouched, when it raises."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        replace_directory(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sampled_sha256(path: PathLike, blocks: int = 16, block: int = 1 << 16) -> str:
    """SHA-256 of a file's size and of ``blocks`` blocks of ``block`` bytes spread evenly over it (the
    first and the last among them): reads at most 1 MiB whatever the size, so it can be checked every time
    a multi-gigabyte index shard is opened. It tells a shard from another build (other vectors, other
    rows) and a truncated or padded file; it does not prove every byte intact (``sha256_file`` does)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= blocks * block:
            digest.update(fh.read())
        else:
            for i in range(blocks):
                fh.seek((size - block) * i // (blocks - 1))
                digest.update(fh.read(block))
    return digest.hexdigest()
