"""Knowledge sources from passages whose embeddings were computed elsewhere, without re-embedding.

Two input forms:

* a Hugging Face knowledge dataset with columns ``title``, ``text``, ``embeddings`` (and
  optionally ``id``), as transformers' ``use_own_knowledge_dataset.py`` makes it or as the
  ``wiki_dpr`` dataset ships: a ``Dataset.save_to_disk`` folder (``state.json`` +
  ``data-*.arrow``), ``.arrow`` files, or ``.parquet`` files (a file or a folder of them). Read
  with ``pyarrow`` (``datasets`` is not needed); passages keep the dataset's row order and ids
  (the ``id`` column, else the row number -- the reference retriever's document ids). Its FAISS
  index (``dataset.get_index("embeddings").save(...)``) may be reused (``--faiss-index``):
  checked against the vectors, then copied;
* DPR's ``psgs_w100.tsv`` (``id<TAB>text<TAB>title``) with DPR's embedding pickles
  (``--trust-pickles``) or ``.npy`` arrays + ids files (see
  :func:`rag_plugin.datasets.prepare.import_precomputed_vectors`).

Both go through the knowledge builder (:func:`~rag_plugin.retrieval.knowledge.build_knowledge_source`:
same layout, manifest last, resumable) with its ``collection``/``precomputed`` hooks. With
``rag_checkpoint`` (a folder written by ``scripts/convert_hf_rag.py``) the query encoder spec,
the generator tokenizer and the input format default to the converted model's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from rag_plugin.util.errors import UserError
from rag_plugin.retrieval.passages import Passage

REQUIRED = ("title", "text", "embeddings")


def _pyarrow():
    try:
        import pyarrow as pa
    except ImportError:
        raise UserError("reading a Hugging Face dataset (.arrow/.parquet) needs pyarrow", fix="pip install pyarrow, "
                        "or import psgs_w100.tsv + .npy vectors + ids (--passages/--vectors/--ids)") from None
    return pa


def dataset_files(path: str) -> Tuple[str, List[Path]]:
    """``("arrow" | "parquet", files in row order)`` of a dataset path (see the module docstring)."""
    p = Path(path)
    if p.is_file():
        kind = _kind(p)
        return kind, [p]
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


def _batches(kind: str, path: Path, columns: Optional[Sequence[str]] = None):
    """Record batches of one file (``columns``: the ones to read, where the format allows)."""
    pa = _pyarrow()
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(str(path)).iter_batches(batch_size=8192, columns=columns)
            return
        source = pa.memory_map(str(path), "r")
        try:
            reader = pa.ipc.open_stream(source)
            yield from reader
        except pa.ArrowInvalid:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"cannot read the dataset file ({str(err).splitlines()[0][:160]})", path=str(path)) from None


def _schema_names(kind: str, path: Path) -> List[str]:
    pa = _pyarrow()
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return list(pq.ParquetFile(str(path)).schema_arrow.names)
        try:
            return list(pa.ipc.open_stream(pa.memory_map(str(path), "r")).schema.names)
        except pa.ArrowInvalid:
            return list(pa.ipc.open_file(pa.memory_map(str(path), "r")).schema.names)
    except (pa.ArrowException, OSError) as err:
        raise UserError(f"cannot read the dataset file ({str(err).splitlines()[0][:160]})", path=str(path)) from None


def check_columns(kind: str, files: Sequence[Path]) -> bool:
    """Whether the dataset has an ``id`` column; raises if ``title``/``text``/``embeddings`` are missing."""
    has_id = None
    for f in files:
        names = _schema_names(kind, f)
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise UserError(f"dataset has no column(s) {', '.join(missing)} (columns: {', '.join(names)})",
                            path=str(f), fix="a RAG knowledge dataset has title, text and embeddings columns")
        if has_id is not None and has_id != ("id" in names):
            raise UserError("some dataset files have an id column and others not", path=str(f))
        has_id = "id" in names
    return bool(has_id)


def _vectors(column, path: Path) -> np.ndarray:
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


def iter_passages(kind: str, files: Sequence[Path], has_id: bool) -> Iterator[Passage]:
    """Every row, in order (none skipped: row r of the store is row r of the dataset)."""
    row, seen = 0, set()
    columns = ["id", "title", "text"] if has_id else ["title", "text"]
    for f in files:
        for batch in _batches(kind, f, columns):
            cols = {name: batch.column(batch.schema.get_field_index(name)).to_pylist() for name in columns}
            for i in range(batch.num_rows):
                pid = str(cols["id"][i]) if has_id else str(row)
                if pid in seen:
                    raise UserError(f"duplicate passage id {pid!r}", path=str(f), fix="make passage ids unique")
                seen.add(pid)
                yield Passage(pid, cols["title"][i] or "", cols["text"][i] or "")
                row += 1


def iter_vectors(kind: str, files: Sequence[Path], has_id: bool):
    """``(ids, vectors [B, D], file)`` batches for :class:`~rag_plugin.build.precomputed.PrecomputedVectors`."""
    row = 0
    columns = ["id", "embeddings"] if has_id else ["embeddings"]
    for f in files:
        for batch in _batches(kind, f, columns):
            vecs = _vectors(batch.column(batch.schema.get_field_index("embeddings")), f)
            if has_id:
                ids = [str(x) for x in batch.column(batch.schema.get_field_index("id")).to_pylist()]
            else:
                ids = [str(r) for r in range(row, row + batch.num_rows)]
            row += batch.num_rows
            yield ids, vecs, str(f)


def import_hf_knowledge(out_dir: str, dataset: Optional[str] = None, passages: Optional[str] = None,
                        vectors: Sequence[str] = (), ids: Sequence[str] = (), trust_pickles: bool = False,
                        faiss_index: Optional[str] = None, rag_checkpoint: Optional[str] = None,
                        encoder_spec: Optional[str] = None, encoder_identity=None, dict_file: Optional[str] = None,
                        bpe_model: Optional[str] = None, gpt2_encoder_json: Optional[str] = None,
                        gpt2_vocab_bpe: Optional[str] = None, input_format: Optional[str] = None,
                        index_factory: str = "Flat", train_size: int = 100_000, seed: int = 0,
                        shard_size: int = 65536, restart: bool = False, progress: bool = True, log=print):
    """Import a knowledge source (see the module docstring); returns the loaded KnowledgeSource."""
    from rag_plugin.datasets import prepare
    from rag_plugin.core.input_format import InputFormat
    from rag_plugin.retrieval import knowledge as ks
    from rag_plugin.build.precomputed import PrecomputedVectors

    if (dataset is None) == (passages is None):
        raise UserError("pass either --dataset (a Hugging Face dataset) or --passages with --vectors (DPR's TSV)")
    if rag_checkpoint:
        from rag_plugin.conversion.hf_rag import read_conversion

        rec = read_conversion(rag_checkpoint)
        encoder_spec = encoder_spec or rec["encoder_spec"]
        if not (dict_file or bpe_model or gpt2_encoder_json):
            dict_file, gpt2_encoder_json = rec["files"]["dict"], rec["files"]["gpt2_encoder_json"]
            gpt2_vocab_bpe = rec["files"]["gpt2_vocab_bpe"]
        input_format = input_format or rec["input_format_file"]
    fmt = InputFormat.parse(input_format)
    if faiss_index is not None and not Path(faiss_index).is_file():
        raise UserError("FAISS index file not found", path=faiss_index, fix="check --faiss-index")
    common = dict(encoder_spec=encoder_spec, encoder_identity=encoder_identity, index_factory=index_factory,
                  train_size=train_size, seed=seed, dict_file=dict_file, bpe_model=bpe_model,
                  gpt2_encoder_json=gpt2_encoder_json, gpt2_vocab_bpe=gpt2_vocab_bpe, shard_size=shard_size,
                  restart=restart, progress=progress, log=log, input_format=fmt, index_file=faiss_index)
    if passages is not None:
        return prepare.import_precomputed_vectors(out_dir, passages, list(vectors), list(ids),
                                                  trust_pickles=trust_pickles, **common)
    if vectors or ids:
        raise UserError("--vectors/--ids go with --passages; a dataset holds its own embeddings")

    kind, files = dataset_files(dataset)
    has_id = check_columns(kind, files)
    identity, spec = prepare.resolve_encoder_identity(
        encoder_identity, encoder_spec, "the manifest must name the query encoder for these vectors",
        "pass --rag-checkpoint DIR (a converted RAG model), --encoder-spec hf-dpr:DIR, or an --encoder-identity "
        "JSON that has a 'spec'")
    if shard_size < 1:
        raise UserError(f"--shard-size must be positive, got {shard_size}")

    @dataclasses.dataclass
    class _DatasetSettings(ks.BuildSettings):
        """The builder's settings plus what the vectors came from (part of the fingerprint)."""

        dataset_kind: str = ""
        precomputed_identity: Optional[dict] = None

    settings = _DatasetSettings(
        passages=[str(f) for f in files], encoder=spec, index_factory=index_factory, split_words=None,
        dict=dict_file, bpe_model=bpe_model, gpt2_encoder_json=gpt2_encoder_json, gpt2_vocab_bpe=gpt2_vocab_bpe,
        train_size=train_size, seed=seed, input_format=fmt.identity(), index_file=faiss_index,
        dataset_kind=kind, precomputed_identity=identity)
    precomputed = PrecomputedVectors(lambda: iter_vectors(kind, files, has_id), identity, passages_path=str(dataset),
                                     missing_fix="every row of the dataset needs its embedding")
    return ks.build_knowledge_source(str(out_dir), settings, collection=lambda: iter_passages(kind, files, has_id),
                                     precomputed=precomputed, shard_size=shard_size, restart=restart,
                                     progress=progress, log=log)
