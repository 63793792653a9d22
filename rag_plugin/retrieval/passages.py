"""Passage store: read a collection once, keep titles, texts and generator token ids on disk.

Readers accept DPR's ``psgs_w100.tsv`` layout (``id<TAB>text<TAB>title`` with a header line)
and JSONL (``{"id", "title", "text"}`` per line), either gzip-compressed (``psgs_w100.tsv.gz``,
``.jsonl.gz``: read through gzip, as downloaded), optionally splitting documents into
``split_words``-word passages (the paper's 100-word unit). The store keeps, per passage row:
its id, title, text, and the generator's token ids for title and text (pre-tokenized once),
as ragged arrays in memory-mapped files (``<field>.bin`` data + ``<field>.idx`` int64
offsets). No training or decoding step ever re-tokenizes a passage string.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import READ_ERRORS, atomic_directory, atomic_write_json, iter_jsonl, unreadable_file_error

STORE_FORMAT = "rag_plugin.passages/1"
STRING_FIELDS = ("ids", "titles", "texts")
TOKEN_FIELDS = ("title_tokens", "text_tokens")


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str


# ---------------------------------------------------------------------------------- readers
def _is_gzip(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The file's lines as bytes (a ``.gz`` file decompressed); a damaged gzip file is a UserError."""
    if not path.is_file():
        raise UserError("passages file not found", path=str(path),
                        fix="pass --passages with a .tsv (DPR layout) or .jsonl file (optionally .gz)")
    if not _is_gzip(path):
        with open(path, "rb") as fh:
            yield from fh
        return
    try:
        with gzip.open(path, "rb") as fh:
            yield from fh
    except READ_ERRORS as err:
        raise unreadable_file_error(path, err) from None


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"not valid UTF-8 at byte {err.start} of the line", path=str(path),
                        line=lineno, fix="re-encode the file as UTF-8") from None


#: DPR reads psgs_w100.tsv with ``csv.reader(f, delimiter="\\t")``: Python's default dialect otherwise
#: (a field that starts with ``"`` is quoted, ``""`` inside it is one ``"``, and it may hold tabs and
#: newlines; a quote inside an unquoted field is literal). Every column is read by those rules.
TSV_DIALECT = dict(delimiter="\t", quotechar='"', doublequote=True, skipinitialspace=False, strict=False)


def _read_tsv(path: Path) -> Iterator[Tuple[int, Passage]]:
    where = {"line": 0}

    def decoded_lines():
        for raw in _raw_lines(path):
            where["line"] += 1
            yield _decode(raw, path, where["line"])

    reader = csv.reader(decoded_lines(), **TSV_DIALECT)
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, 2**31 - 1))  # a whole document in one field is fine
    try:
        while True:
            first = where["line"] + 1  # the line this record starts on
            try:
                parts = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                raise UserError(f"not a valid tab-separated row ({err})", path=str(path), line=first,
                                fix="fix or remove that row") from None
            if first == 1:
                _check_tsv_header(parts, path)
                continue
            if not parts:
                continue  # a blank line
            if len(parts) != 3:
                spans = (f"; the row runs over lines {first}-{where['line']}: a field that starts with a "
                         "quote (\") ends only at the next lone quote" if where["line"] > first else "")
                raise UserError(f"expected 3 tab-separated columns (id, text, title), found {len(parts)}"
                                + spans, path=str(path), line=first,
                                fix="fix or remove that row; a quote that starts a field opens CSV quoting: "
                                    "quote the whole field and double the quotes inside it")
            pid, text, title = parts
            yield first, Passage(pid.strip(), title, text)
    finally:
        csv.field_size_limit(limit)


def _check_tsv_header(parts: List[str], path: Path) -> None:
    if parts != ["id", "text", "title"]:
        raise UserError(f"header is {parts!r}, expected ['id', 'text', 'title']", path=str(path), line=1,
                        fix="use DPR's psgs_w100.tsv layout: id<TAB>text<TAB>title, with that header")


def _read_jsonl(path: Path) -> Iterator[Tuple[int, Passage]]:
    fix = 'each line must be {"id": ..., "title": ..., "text": ...}'
    for lineno, obj in iter_jsonl(path, fix=fix, what="passage file"):
        missing = [k for k in ("id", "text") if k not in obj]
        if missing:
            raise UserError(f"missing field(s) {', '.join(missing)}", path=str(path), line=lineno, fix=fix)
        title = obj.get("title") or ""
        if not isinstance(obj["text"], str) or not isinstance(title, str):
            raise UserError("fields 'title' and 'text' must be strings", path=str(path),
                            line=lineno, fix="fix that line")
        yield lineno, Passage(str(obj["id"]), title, obj["text"])


def split_passage(p: Passage, words: int) -> List[Passage]:
    """Split a document into consecutive ``words``-word passages (ids ``<id>_<n>``)."""
    tokens = p.text.split()
    if len(tokens) <= words:
        return [p]
    return [Passage(f"{p.id}_{n}", p.title, " ".join(tokens[i:i + words]))
            for n, i in enumerate(range(0, len(tokens), words))]


def read_passages(path: str, split_words: Optional[int] = None) -> Iterator[Passage]:
    """Stream passages from a ``.tsv`` (DPR layout) or ``.jsonl`` file (either one ``.gz``), checking as it goes.

    Raises :class:`UserError` (file and line) on malformed rows, non-UTF-8 bytes, empty or
    duplicate ids and empty collections.
    """
    for _, passage in _read_passages(path, split_words):
        yield passage


def _read_passages(path: str, split_words: Optional[int] = None) -> Iterator[Tuple[int, Passage]]:
    """:func:`read_passages` with the line (the first line of the row) each passage comes from."""
    p = Path(path)
    name = p.name.lower()
    name = name[:-3] if name.endswith(".gz") else name
    if name.endswith((".tsv", ".tsv.txt")):
        rows = _read_tsv(p)
    elif name.endswith((".jsonl", ".json")):
        rows = _read_jsonl(p)
    else:
        raise UserError("unknown passages format", path=path,
                        fix="use a .tsv file (DPR layout: id, text, title) or a .jsonl file, optionally .gz")
    if split_words is not None and split_words <= 0:
        raise UserError(f"--split-words must be positive, got {split_words}",
                        fix="use e.g. --split-words 100 (the paper's passages), or leave it out")
    seen: set = set()
    pieces: set = set()  # ids made by splitting ("<id>_<n>") must not collide with any other
    count = 0
    for lineno, passage in rows:
        if not passage.id:
            raise UserError("empty passage id", path=path, line=lineno, fix="give every passage an id")
        if passage.id in seen:
            raise UserError(f"duplicate passage id {passage.id!r}", path=path, line=lineno,
                            fix="make passage ids unique")
        seen.add(passage.id)
        if not passage.text.strip() and not passage.title.strip():
            continue  # nothing to retrieve; an empty passage would only add noise
        for piece in (split_passage(passage, split_words) if split_words else [passage]):
            if split_words:
                if piece.id in pieces or (piece.id != passage.id and piece.id in seen):
                    raise UserError(f"splitting makes passage id {piece.id!r}, which another passage has",
                                    path=path, line=lineno, fix="rename that passage, or do not split")
                pieces.add(piece.id)
            count += 1
            yield lineno, piece
    if count == 0:
        raise UserError("the passages file holds no passages", path=path,
                        fix="point --passages at a non-empty collection")


def read_numbered_passages(path: str, split_words: Optional[int] = None) -> Iterator[Tuple[int, Passage]]:
    """``(line number, passage)`` of a passage file (as :func:`read_passages` reads it)."""
    return _read_passages(path, split_words)


def read_collection(paths: Sequence[str], split_words: Optional[int] = None) -> Iterator[Passage]:
    """Several passage files read in order as one collection (ids unique across all of them, a
    file given twice included)."""
    owner: Dict[str, int] = {}  # id -> position of its file in ``paths``
    for k, path in enumerate(paths):
        for lineno, passage in _read_passages(path, split_words):
            first = owner.setdefault(passage.id, k)
            if first != k:
                again = ("; the same file is given twice" if Path(paths[first]).resolve() == Path(path).resolve()
                         else "")
                raise UserError(f"duplicate passage id {passage.id!r}: it also appears in {paths[first]}{again}",
                                path=path, line=lineno,
                                fix="make passage ids unique across the files, and pass each file once")
            yield passage


# ---------------------------------------------------------------------------------- ragged arrays
class _RaggedWriter:
    def __init__(self, directory: Path, name: str, dtype):
        self.dtype = np.dtype(dtype)
        self.data = open(directory / f"{name}.bin", "wb")
        self.offsets: List[int] = [0]

    def append(self, values) -> None:
        arr = np.asarray(values, dtype=self.dtype)
        self.data.write(arr.tobytes())
        self.offsets.append(self.offsets[-1] + arr.size)

    def append_bytes(self, raw: bytes) -> None:
        self.data.write(raw)
        self.offsets.append(self.offsets[-1] + len(raw))

    def close(self, directory: Path, name: str) -> None:
        self.data.flush()
        os.fsync(self.data.fileno())
        self.data.close()
        np.asarray(self.offsets, dtype=np.int64).tofile(directory / f"{name}.idx")


class _RaggedReader:
    def __init__(self, directory: Path, name: str, dtype):
        self.offsets = np.fromfile(directory / f"{name}.idx", dtype=np.int64)
        size = os.path.getsize(directory / f"{name}.bin")
        dtype = np.dtype(dtype)
        if size != int(self.offsets[-1]) * dtype.itemsize:
            raise UserError(f"{name}.bin is {size} bytes, its index expects "
                            f"{int(self.offsets[-1]) * dtype.itemsize}", path=str(directory),
                            fix="the passage store is damaged: rebuild the knowledge source")
        self.data = (np.memmap(directory / f"{name}.bin", dtype=dtype, mode="r")
                     if size else np.zeros(0, dtype=dtype))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> np.ndarray:
        return self.data[self.offsets[row]:self.offsets[row + 1]]


# ---------------------------------------------------------------------------------- the store
class PassageStore(SharedOnCopy):
    """Random access by row to passage ids, titles, texts and generator token ids."""

    def __init__(self, directory: str):
        d = Path(directory)
        meta_path = d / "meta.json"
        if not meta_path.is_file():
            raise UserError("no passage store here (meta.json missing)", path=str(d),
                            fix="build it with rag-build-knowledge")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError("passage store metadata is corrupted", path=str(meta_path),
                            fix="rebuild the knowledge source") from None
        if self.meta.get("format") != STORE_FORMAT:
            raise UserError(f"unknown passage store format {self.meta.get('format')!r}",
                            path=str(meta_path), fix="rebuild the knowledge source")
        self.directory = d
        try:
            self._strings = {f: _RaggedReader(d, f, np.uint8) for f in STRING_FIELDS}
            self._tokens = {f: _RaggedReader(d, f, np.int32) for f in TOKEN_FIELDS}
        except FileNotFoundError as err:
            raise UserError(f"passage store file missing: {Path(err.filename).name}", path=str(d),
                            fix="rebuild the knowledge source") from None
        n = int(self.meta["count"])
        for reader in list(self._strings.values()) + list(self._tokens.values()):
            if len(reader) != n:
                raise UserError(f"passage store files disagree on the count ({len(reader)} vs {n})",
                                path=str(d), fix="rebuild the knowledge source")
        self._row_of_id: Optional[Dict[str, int]] = None

    def __len__(self) -> int:
        return int(self.meta["count"])

    @property
    def sha256(self) -> str:
        return self.meta["sha256"]

    @property
    def tokenizer_identity(self) -> Optional[dict]:
        return self.meta.get("tokenizer")

    @property
    def input_format(self):
        """The :class:`~rag_plugin.core.input_format.InputFormat` the token fields were made for."""
        # start-up: core.input_format imports torch; rag-vocab and rag-evaluate --passages read passages without it
        from rag_plugin.core.input_format import InputFormat

        return InputFormat.from_identity(self.meta.get("input_format"))

    def _string(self, field: str, row: int) -> str:
        return self._strings[field][row].tobytes().decode("utf-8")

    def id(self, row: int) -> str:
        return self._string("ids", row)

    def title(self, row: int) -> str:
        return self._string("titles", row)

    def text(self, row: int) -> str:
        return self._string("texts", row)

    def passage(self, row: int) -> Passage:
        return Passage(self.id(row), self.title(row), self.text(row))

    def title_tokens(self, row: int) -> np.ndarray:
        return self._tokens["title_tokens"][row]

    def text_tokens(self, row: int) -> np.ndarray:
        return self._tokens["text_tokens"][row]

    def row_of_id(self, pid: str) -> int:
        if self._row_of_id is None:
            self._row_of_id = {self.id(i): i for i in range(len(self))}
        try:
            return self._row_of_id[pid]
        except KeyError:
            raise UserError(f"passage id {pid!r} is not in the store", path=str(self.directory)) from None

    def iter_titles_texts(self, start: int = 0, end: Optional[int] = None):
        end = len(self) if end is None else end
        for row in range(start, end):
            yield self.title(row), self.text(row)

    # ------------------------------------------------------------------ writing
    @staticmethod
    def write(directory: str, passages: Iterable[Passage], tokenizer=None,
              source: Optional[dict] = None, batch_size: int = 512,
              progress: bool = True, input_format=None) -> "PassageStore":
        """Write a store atomically: into a temporary directory beside it, then put in its place.

        ``tokenizer`` (a :class:`~rag_plugin.retrieval.tokenization.GeneratorTokenizer`) pre-
        tokenizes titles and texts; without it the token fields are empty (BM25/dense search
        only, no generation). ``input_format`` (an :class:`~rag_plugin.core.input_format.InputFormat`,
        default ``plugin``) decides which strings are pre-tokenized; it is recorded in the store.
        """
        from rag_plugin.core.input_format import InputFormat  # start-up (torch)

        fmt = input_format or InputFormat()
        final = Path(directory)
        with atomic_directory(final) as tmp:
            writer = _StoreWriter(tmp, tokenizer, fmt)
            bar = None
            if progress:
                from tqdm import tqdm  # start-up: only a build writes a store
                bar = tqdm(desc="passages", unit=" psg", mininterval=1.0)
            try:
                for batch in _batched(passages, batch_size):
                    writer.add(batch)
                    if bar is not None:
                        bar.update(len(batch))
            except BaseException:
                writer.abandon()
                raise
            finally:
                if bar is not None:
                    bar.close()
            writer.close(source)
        return PassageStore(str(final))


def _batched(items: Iterable, size: int) -> Iterator[list]:
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class _StoreWriter:
    """The files of a passage store being written into ``directory``, and the store's content hash."""

    def __init__(self, directory: Path, tokenizer, input_format):
        self.directory, self.tokenizer, self.input_format = directory, tokenizer, input_format
        self.strings = {f: _RaggedWriter(directory, f, np.uint8) for f in STRING_FIELDS}
        self.tokens = {f: _RaggedWriter(directory, f, np.int32) for f in TOKEN_FIELDS}
        self.digest = hashlib.sha256()
        self.count = 0

    def add(self, batch: List[Passage]) -> None:
        if self.tokenizer is not None:
            pieces = [self.input_format.passage_strings(p.title, p.text) for p in batch]
            title_ids = self.tokenizer.encode_batch([t for t, _ in pieces])
            text_ids = self.tokenizer.encode_batch([x for _, x in pieces])
        else:
            title_ids = text_ids = [[] for _ in batch]
        for p, t_ids, x_ids in zip(batch, title_ids, text_ids):
            for field, value in (("ids", p.id), ("titles", p.title), ("texts", p.text)):
                raw = value.encode("utf-8")
                self.strings[field].append_bytes(raw)
                self.digest.update(len(raw).to_bytes(8, "little"))
                self.digest.update(raw)
            self.tokens["title_tokens"].append(t_ids)
            self.tokens["text_tokens"].append(x_ids)
            self.digest.update(np.asarray(t_ids, dtype=np.int32).tobytes())
            self.digest.update(np.asarray(x_ids, dtype=np.int32).tobytes())
        self.count += len(batch)

    def abandon(self) -> None:
        for w in list(self.strings.values()) + list(self.tokens.values()):
            w.data.close()

    def close(self, source: Optional[dict]) -> None:
        """Finish the files and write ``meta.json`` (count, content hash, tokenizer, input format)."""
        for name, w in list(self.strings.items()) + list(self.tokens.items()):
            w.close(self.directory, name)
        meta = {"format": STORE_FORMAT, "count": self.count, "sha256": self.digest.hexdigest(),
                "tokenizer": self.tokenizer.identity() if self.tokenizer is not None else None,
                "source": source or {}}
        if self.tokenizer is not None and self.input_format.identity() is not None:
            meta["input_format"] = self.input_format.identity()
        atomic_write_json(self.directory / "meta.json", meta)


def gather_tokens(store: PassageStore, rows: Sequence[int], field: str = "text_tokens") -> List[np.ndarray]:
    getter = store.text_tokens if field == "text_tokens" else store.title_tokens
    return [getter(int(r)) for r in rows]
