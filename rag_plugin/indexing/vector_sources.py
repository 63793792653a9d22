"""Where document vectors computed elsewhere come from: the readers behind ``rag-import-knowledge``.

Two sources, one interface (:class:`HuggingFaceDataset`, :class:`DPRVectorFiles`): ``passage_files``
(fingerprinted by the builder), ``collection`` (the passages, or None when the builder reads
``passage_files`` itself), ``batches()`` (``(passage ids, float32 [B, D] vectors, file)`` for
:class:`~rag_plugin.indexing.precomputed.PrecomputedVectors`), ``provenance()`` (what the manifest
records as ``imported_vectors``) and ``settings_fields()`` (what the build fingerprint adds).

* a Hugging Face knowledge dataset with columns ``title``, ``text``, ``embeddings`` (and
  optionally ``id``), as transformers' ``use_own_knowledge_dataset.py`` makes it or as ``wiki_dpr``
  ships: a ``Dataset.save_to_disk`` folder (``state.json`` + ``data-*.arrow``), ``.arrow`` files,
  or ``.parquet`` files (a file or a folder of them). Read with ``pyarrow`` (``datasets`` is not
  needed); passages keep the dataset's row order and ids (the ``id`` column, else the row number --
  the reference retriever's document ids);
* DPR's ``psgs_w100.tsv`` (``id<TAB>text<TAB>title``, also ``.tsv.gz``) with DPR's embedding
  pickles (``wikipedia_passages_*.pkl``: a list of ``(id, numpy vector)``; only behind
  ``trust_pickles``, and even then unpickled with numpy arrays as the only allowed globals) or
  ``.npy`` arrays with one ids file each (one id a line, or a ``.npy`` of ids). Ids lose a
  ``wiki:`` prefix (newer DPR releases).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import pickle
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from tqdm import tqdm

from rag_plugin.retrieval.passages import Passage
from rag_plugin.util.errors import UserError

REQUIRED_COLUMNS = ("title", "text", "embeddings")


def files_fingerprint(files: Sequence[Path]) -> str:
    """sha256 over the files' names and sizes (cheap for a 60 GB dataset; a changed file changes it)."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{Path(f).name}\t{Path(f).stat().st_size}\n".encode("utf-8"))
    return digest.hexdigest()


def _files_record(files: Sequence[Path]) -> List[dict]:
    return [{"file": str(Path(f).resolve()), "bytes": Path(f).stat().st_size} for f in files]


# ================================================================================ Hugging Face
def _pyarrow():
    try:
        import pyarrow as pa  # optional: pyarrow (the hf extra)
    except ImportError:
        raise UserError("reading a Hugging Face dataset (.arrow/.parquet) needs pyarrow", fix="pip install pyarrow, "
                        "or import psgs_w100.tsv + .npy vectors + ids (--passages/--vectors/--ids)") from None
    return pa


def dataset_files(path: str) -> Tuple[str, List[Path]]:
    """``("arrow" | "parquet", files in row order)`` of a dataset path (see the module docstring)."""
    p = Path(path)
    if p.is_file():
        return _kind(p), [p]
    if not p.is_dir():
        raise UserError("dataset not found", path=str(p), fix="pass a save_to_disk folder, .arrow or .parquet files")
    state = p / "state.json"
    if state.is_file():
        try:
            names = [f["filename"] for f in json.loads(state.read_text(encoding="utf-8"))["_data_files"]]
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise UserError("unreadable state.json (expected datasets' save_to_disk layout)", path=str(state)) from None
        files = [p / n for n in names]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise UserError("dataset file listed in state.json is missing", path=str(missing[0]))
        return "arrow", files
    for kind in ("parquet", "arrow"):
        files = sorted(f for f in p.rglob(f"*.{kind}") if f.is_file())
        if files:
            return kind, files
    raise UserError("no dataset files (state.json, *.arrow or *.parquet) in the folder", path=str(p))


def _kind(p: Path) -> str:
    if p.name.endswith(".parquet"):
        return "parquet"
    if p.name.endswith(".arrow"):
        return "arrow"
    raise UserError("unknown dataset file type", path=str(p), fix="pass .arrow or .parquet files (or a folder)")


def _read_error(err: Exception, path: Path) -> UserError:
    return UserError(f"cannot read the dataset file ({str(err).splitlines()[0][:160]})", path=str(path))


def _record_batches(kind: str, path: Path, columns: Optional[Sequence[str]] = None):
    """Record batches of one file (``columns``: the ones to read, where the format allows)."""
    pa = _pyarrow()
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq  # optional: pyarrow (the hf extra)

            yield from pq.ParquetFile(str(path)).iter_batches(batch_size=8192, columns=columns)
            return
        try:
            yield from pa.ipc.open_stream(pa.memory_map(str(path), "r"))
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    except (pa.ArrowException, OSError) as err:
        raise _read_error(err, path) from None


def _schema_names(kind: str, path: Path) -> List[str]:
    pa = _pyarrow()
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq  # optional: pyarrow (the hf extra)

            return list(pq.ParquetFile(str(path)).schema_arrow.names)
        try:
            return list(pa.ipc.open_stream(pa.memory_map(str(path), "r")).schema.names)
        except pa.ArrowInvalid:
            return list(pa.ipc.open_file(pa.memory_map(str(path), "r")).schema.names)
    except (pa.ArrowException, OSError) as err:
        raise _read_error(err, path) from None


def check_columns(kind: str, files: Sequence[Path]) -> bool:
    """Whether the dataset has an ``id`` column; raises if ``title``/``text``/``embeddings`` are missing."""
    has_id = None
    for f in files:
        names = _schema_names(kind, f)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise UserError(f"dataset has no column(s) {', '.join(missing)} (columns: {', '.join(names)})",
                            path=str(f), fix="a RAG knowledge dataset has title, text and embeddings columns")
        if has_id is not None and has_id != ("id" in names):
            raise UserError("some dataset files have an id column and others not", path=str(f))
        has_id = "id" in names
    return bool(has_id)


def _embeddings(column, path: Path) -> np.ndarray:
    pa = _pyarrow()
    if column.null_count:
        raise UserError("some passages have no embedding", path=str(path))
    if pa.types.is_fixed_size_list(column.type):
        dim = column.type.list_size
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = np.asarray(column.value_lengths())
        dim = int(lengths[0]) if len(lengths) else 0
        if len(lengths) and not (lengths == dim).all():
            raise UserError("embeddings have different lengths", path=str(path))
    else:
        raise UserError(f"embeddings column has type {column.type}, expected a list of floats", path=str(path))
    values = column.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float32).reshape(len(column), dim)


class HuggingFaceDataset:
    """A Hugging Face knowledge dataset (see the module docstring) as a source of passages and vectors."""

    missing_fix = "every row of the dataset needs its embedding"

    def __init__(self, path: str):
        self.path = Path(path)
        self.kind, self.files = dataset_files(path)
        self.has_id = check_columns(self.kind, self.files)
        self.name = self.path.name
        self.passages_path = str(path)
        self.passage_files = [str(f) for f in self.files]
        self.fingerprint = files_fingerprint(self.files)

    def collection(self) -> Iterator[Passage]:
        """Every row, in order (none skipped: row r of the store is row r of the dataset)."""
        row, seen = 0, set()
        columns = ["id", "title", "text"] if self.has_id else ["title", "text"]
        for f in self.files:
            for batch in _record_batches(self.kind, f, columns):
                cols = {name: batch.column(batch.schema.get_field_index(name)).to_pylist() for name in columns}
                for i in range(batch.num_rows):
                    pid = str(cols["id"][i]) if self.has_id else str(row)
                    if pid in seen:
                        raise UserError(f"duplicate passage id {pid!r}", path=str(f), fix="make passage ids unique")
                    seen.add(pid)
                    yield Passage(pid, cols["title"][i] or "", cols["text"][i] or "")
                    row += 1

    def batches(self):
        """``(ids, vectors [B, D], file)`` batches, ids as :meth:`collection` gives them."""
        row = 0
        columns = ["id", "embeddings"] if self.has_id else ["embeddings"]
        for f in self.files:
            for batch in _record_batches(self.kind, f, columns):
                vecs = _embeddings(batch.column(batch.schema.get_field_index("embeddings")), f)
                if self.has_id:
                    ids = [str(x) for x in batch.column(batch.schema.get_field_index("id")).to_pylist()]
                else:
                    ids = [str(r) for r in range(row, row + batch.num_rows)]
                row += batch.num_rows
                yield ids, vecs, str(f)

    def provenance(self) -> dict:
        """The dataset: its files, their fingerprint, and ``datasets``' own (``state.json``), if saved by it."""
        state = self.path / "state.json" if self.path.is_dir() else None
        hf_fingerprint = None
        if state is not None and state.is_file():
            hf_fingerprint = json.loads(state.read_text(encoding="utf-8")).get("_fingerprint")
        return {"from": "huggingface-dataset", "dataset": str(self.path.resolve()), "format": self.kind,
                "files": _files_record(self.files), "fingerprint": self.fingerprint,
                "datasets_fingerprint": hf_fingerprint}

    def settings_fields(self, identity: dict) -> dict:
        return {"dataset_kind": self.kind, "precomputed_identity": identity}


# ================================================================================ DPR files
class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Refuses every global except what pickled numpy arrays need (defence in depth only:
    pickles stay behind --trust-pickles)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed (only numpy arrays are)")


def _is_gz(path) -> bool:
    return str(path).lower().endswith(".gz")


def _base_name(path) -> str:
    name = Path(path).name.lower()
    return name[:-3] if name.endswith(".gz") else name


def require_file(path, what: str = "input file") -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} not found", path=str(p), fix="check the path")
    if not p.is_file():
        raise UserError(f"{what} is not a file", path=str(p), fix="pass a file")
    return p


def vector_kind(path) -> str:
    name = _base_name(path)
    if name.endswith((".pkl", ".pickle")):
        return "pickle"
    if name.endswith(".npy"):
        return "npy"
    raise UserError("unknown vectors file type", path=str(path),
                    fix="pass DPR's wikipedia_passages_*.pkl shards (with --trust-pickles) or .npy arrays (+ --ids)")


def check_vector_inputs(vector_files: Sequence, ids_files: Optional[Sequence],
                        trust_pickles: bool) -> List[Tuple[str, Path, Optional[Path]]]:
    """``[(kind, vectors, ids)]``; refuses pickles without ``trust_pickles``."""
    if not vector_files:
        raise UserError("no vectors given", fix="pass --vectors FILE...")
    kinds = [(vector_kind(v), require_file(v, "vectors file")) for v in vector_files]
    pickles = [str(p) for k, p in kinds if k == "pickle"]
    if pickles and not trust_pickles:
        raise UserError(f"refusing to unpickle {len(pickles)} file(s): loading a pickle can run arbitrary code",
                        path=pickles[0],
                        fix="pass --trust-pickles only for files from a source you trust (e.g. DPR's own "
                            "release), or convert them to .npy + an ids file")
    npys = [p for k, p in kinds if k == "npy"]
    ids_files = list(ids_files or [])
    if len(ids_files) != len(npys):
        raise UserError(f"{len(npys)} .npy vectors file(s) but {len(ids_files)} --ids file(s)",
                        fix="give one ids file (one passage id per line, or a .npy of ids) per .npy, "
                            "in the same order")
    out, it = [], iter(ids_files)
    for kind, p in kinds:
        out.append((kind, p, require_file(next(it), "ids file") if kind == "npy" else None))
    return out


def _pickle_batches(path: Path, batch: int):
    """DPR's pickled list of ``(passage id, vector)``, unpickled with numpy arrays as the only globals."""
    try:
        with (gzip.open(path, "rb") if _is_gz(path) else open(path, "rb")) as fh:
            data = _NumpyOnlyUnpickler(fh).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError, OSError) as err:
        raise UserError(f"cannot read the pickle ({err})", path=str(path),
                        fix="expected DPR's list of (passage id, numpy vector) pairs") from None
    if not isinstance(data, (list, tuple)):
        raise UserError("pickle does not hold a list of (id, vector) pairs", path=str(path),
                        fix="expected DPR's wikipedia_passages_*.pkl")
    for start in range(0, len(data), batch):
        chunk = data[start:start + batch]
        try:
            ids = [str(pid) for pid, _ in chunk]
            vecs = np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for _, v in chunk])
        except (TypeError, ValueError) as err:
            raise UserError(f"pickle entries {start}..{start + len(chunk) - 1} are not (id, vector) pairs "
                            f"of one size ({err})", path=str(path),
                            fix="expected DPR's wikipedia_passages_*.pkl") from None
        yield ids, vecs


def _npy_ids_batches(arr: np.ndarray, ids_path: Path, batch: int):
    """An ids ``.npy`` (one id per row of ``arr``)."""
    try:
        ids_arr = np.load(ids_path, allow_pickle=False)
    except ValueError as err:
        raise UserError(f"cannot read the ids .npy ({err})", path=str(ids_path),
                        fix="save ids as an integer or unicode array") from None
    if ids_arr.ndim != 1 or len(ids_arr) != len(arr):
        raise UserError(f"ids array has shape {ids_arr.shape}, the vectors {arr.shape[0]} rows",
                        path=str(ids_path), fix="one id per vector row, in the same order")
    for start in range(0, len(arr), batch):
        yield ([str(x) for x in ids_arr[start:start + batch].tolist()],
               np.asarray(arr[start:start + batch], dtype=np.float32))


def _text_ids_batches(arr: np.ndarray, ids_path: Path, batch: int):
    """An ids text file (one id a line, ``.gz`` read through gzip) for the rows of ``arr``."""
    opener = gzip.open if _is_gz(ids_path) else open
    start, ids = 0, []
    with opener(ids_path, "rt", encoding="utf-8-sig") as fh:
        for lineno, raw in enumerate(fh, 1):
            pid = raw.rstrip("\r\n")
            if not pid.strip():
                raise UserError("empty id", path=str(ids_path), line=lineno, fix="one passage id per line")
            if start + len(ids) >= len(arr):
                raise UserError(f"more ids than the {len(arr)} vector rows", path=str(ids_path), line=lineno,
                                fix="one id per vector row, in the same order")
            ids.append(pid.strip())
            if len(ids) == batch:
                yield ids, np.asarray(arr[start:start + batch], dtype=np.float32)
                start, ids = start + batch, []
    if ids:
        yield ids, np.asarray(arr[start:start + len(ids)], dtype=np.float32)
        start += len(ids)
    if start != len(arr):
        raise UserError(f"{start} ids for {len(arr)} vector rows", path=str(ids_path),
                        fix="one id per vector row, in the same order")


def iter_vector_batches(kind: str, path: Path, ids_path: Optional[Path], batch: int = 65536):
    """Yield ``(ids: list[str], vectors: float32 [B, D])`` from one vectors file."""
    if kind == "pickle":
        yield from _pickle_batches(path, batch)
        return
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise UserError(f"cannot read the .npy ({err})", path=str(path),
                        fix="save vectors with numpy.save (no object arrays)") from None
    if arr.ndim != 2:
        raise UserError(f"vectors array has shape {arr.shape}, expected [N, D]", path=str(path),
                        fix="save a 2-D array, one row per passage")
    if _base_name(ids_path).endswith(".npy"):
        yield from _npy_ids_batches(arr, ids_path, batch)
    else:
        yield from _text_ids_batches(arr, ids_path, batch)


class DPRVectorFiles:
    """DPR's passages file with its precomputed vectors (see the module docstring)."""

    missing_fix = ("pass every vectors shard (--vectors), or a passages file limited to the embedded ids; then "
                   "rerun with --restart")
    collection = None  # the builder reads the passages file itself

    def __init__(self, passages: str, vector_files: Sequence, ids_files: Sequence, trust_pickles: bool,
                 progress: bool = False, log: Callable[[str], None] = print):
        self.passages = require_file(passages, "passages file")
        self.inputs = check_vector_inputs(vector_files, ids_files, trust_pickles)
        self.progress, self.log = progress, log
        self.name = self.passages.name
        self.passages_path = str(passages)
        self.passage_files = str(passages)
        self.files = [f for _, v, i in self.inputs for f in ((v, i) if i else (v,))]
        self.fingerprint = files_fingerprint(self.files)

    def batches(self):
        for kind, vpath, ipath in self.inputs:
            if kind == "pickle":
                self.log(f"warning: unpickling {vpath} (--trust-pickles): a pickle can run code when loaded; "
                         "use only files from a source you trust (loading is restricted to numpy arrays)")
            batches = iter_vector_batches(kind, vpath, ipath)
            if self.progress:
                batches = tqdm(batches, desc=f"import {vpath.name}", unit=" batch", mininterval=1.0)
            for ids, vecs in batches:
                yield [i[5:] if i.startswith("wiki:") else i for i in ids], vecs, str(vpath)

    def provenance(self) -> dict:
        return {"from": "dpr-vectors", "passages": str(self.passages.resolve()), "files": _files_record(self.files),
                "fingerprint": self.fingerprint}

    def settings_fields(self, identity: dict) -> dict:
        return {"precomputed_vectors": [{"kind": k, "file": str(p.resolve()), "bytes": p.stat().st_size,
                                         **({"ids": str(i.resolve()), "ids_bytes": i.stat().st_size} if i else {})}
                                        for k, p, i in self.inputs],
                "precomputed_identity": identity}
