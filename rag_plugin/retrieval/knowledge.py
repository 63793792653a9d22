"""A knowledge source, read side: passage store + frozen document vectors + FAISS index + manifest.

Directory layout (``KS_DIR``)::

    passages/        the passage store (see passages.py)
    vectors.npy      float32 [N, D] document vectors d(z), memory-mapped; the model
                     recomputes q.d from them so gradients reach the query encoder
    index.faiss      the MIPS index over the same vectors
    shards/          instead of the two above in a source built in S shards (see shards.py)
    tokenizer/       the generator tokenizer files the passages were pre-tokenized with (if any)
    manifest.json    written LAST: encoder identity (and weights hash), dimension, pooling,
                     count, factory, passage-store hash. No manifest, no knowledge source.
    .build/          only while building: settings and finished embedding shards (resume)

:class:`KnowledgeSource` loads and verifies such a directory. It is written by the builder,
:func:`rag_plugin.indexing.build_knowledge_source` (``rag-build-knowledge``), or imported with
vectors computed elsewhere (``rag-import-knowledge``). An imported source whose document encoder
is not known records ``"kind": "imported"`` as its ``encoder`` (with the vectors' dimension and
fingerprint), where the vectors came from (``imported_vectors``) and the query encoder to use
(``query_encoder``, loaded from ``encoder_spec``).

Every file is mapped read-only, so the processes of a node share one copy in the page cache: the passage
store and the vectors always, the FAISS index by default (``index_mode="private"`` reads a private copy,
:func:`rag_plugin.retrieval.index.read_index_as`). Files are never written in place: a rebuild writes new
files and renames them, so a process keeps reading what it opened.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import numpy as np

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.parts import IndexPart, LocalSearch, RowVectors
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.retrieval.shards import ShardEntry, check_shard_files, read_entries
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.retrieval.tokenization import GeneratorTokenizer, GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)

FORMAT = "rag_plugin.knowledge/1"
MANIFEST = "manifest.json"
BUILD_DIR = ".build"

#: ``encoder["kind"]`` of a source whose vectors were imported from an unknown document encoder.
IMPORTED = "imported"
#: Identity fields compared to tell whether two encoders make the same document vectors.
DOCUMENT_SIDE = ("dim", "pooling", "passage_weights_sha256")
#: Identity fields compared to tell whether a loaded query encoder is the one a source records.
QUERY_SIDE = ("dim", "pooling", "query_weights_sha256")


# ---------------------------------------------------------------------------------- loading
#: File names that hold (or usually hold) Python pickles, which can run code when loaded.
PICKLE_SUFFIXES = (".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib", ".npz")


def refuse_pickles(directory: Path) -> None:
    """A knowledge source holds arrays (``.npy``, raw ``.bin``/``.idx``), a FAISS file and JSON,
    never a pickle: refuse a directory that has one (it may come from an untrusted source, and
    nothing here would ever need to unpickle it)."""
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file() and path.name.lower().endswith(PICKLE_SUFFIXES):
            raise UserError("knowledge source holds a pickle file, which could run code when loaded; "
                            "nothing was loaded", path=str(path),
                            fix="a knowledge source needs no pickles: delete the file if you trust the source, "
                                "else rebuild it with rag-build-knowledge")


class KnowledgeSource(SharedOnCopy):
    """A loaded, verified knowledge source (see the module docstring for the layout)."""

    def __init__(self, directory: str, index_mode: str = faiss_index.SHARED, version: Optional[int] = None):
        """``directory``: the knowledge source (its current version is opened, and kept while this object
        lives: see :mod:`rag_plugin.retrieval.versions`); ``version``: another of its versions."""
        root = Path(directory)
        if not root.is_dir():
            raise UserError("knowledge source directory not found", path=str(root),
                            fix="build one with rag-build-knowledge")
        d, _ = versions.resolve(root, version)
        self.root = root
        mpath = d / MANIFEST
        if not mpath.is_file():
            hint = ("its build did not finish: rerun the same rag-build-knowledge (or rag-import-knowledge) "
                    "command to resume" if (d / BUILD_DIR).exists() else "build one with rag-build-knowledge")
            raise UserError("not a complete knowledge source (no manifest.json)", path=str(d),
                            fix=hint)
        try:
            self.manifest = json.loads(mpath.read_text(encoding="utf-8"))
            if self.manifest.get("format") != FORMAT:
                raise ValueError
            count, dim = int(self.manifest["count"]), int(self.manifest["dim"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise UserError("manifest is corrupted or of an unknown format", path=str(mpath),
                            fix="rebuild the knowledge source") from None
        self.directory = d
        self.version = int(self.manifest.get("version", 1))
        self._in_use = versions.InUse(d)  # a shared lock: rag-update-knowledge --keep leaves this version alone
        refuse_pickles(d)
        self.passages = PassageStore(str(d / "passages"))
        if len(self.passages) != count or self.passages.sha256 != self.manifest["passage_store"]["sha256"]:
            raise UserError(f"passage store ({len(self.passages)} passages) does not match the "
                            f"manifest ({count} passages)", path=str(d / "passages"),
                            fix="the directory mixes two builds: rebuild the knowledge source")
        self.shards = read_entries(self.manifest, str(mpath))
        if self.shards is None:
            self.vectors = _load_vectors(d / "vectors.npy", count, dim)
        else:
            self.vectors = RowVectors([(e.start, e.end) for e in self.shards], dim, self._shard_vectors)
        self.index_mode = index_mode
        self._parts = {}
        self._shard_arrays = {}
        self._search_params = {}

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return int(self.manifest["count"])

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def encoder_spec(self) -> str:
        return self.manifest["encoder_spec"]

    @property
    def encoder_identity(self) -> dict:
        return self.manifest["encoder"]

    @property
    def input_format(self):
        """The :class:`~rag_plugin.core.input_format.InputFormat` the passages were pre-tokenized for."""
        return self.passages.input_format

    @property
    def num_shards(self) -> int:
        return 1 if self.shards is None else len(self.shards)

    @property
    def index(self):
        """The FAISS index of an unsharded source (a sharded one has :meth:`part` per shard)."""
        if self.shards is not None:
            raise ValueError(f"{self.directory} is sharded ({len(self.shards)} shards): use part(i) or local_search()")
        return self.part(0).index

    def part(self, number: int) -> IndexPart:
        """Shard ``number`` (0 for an unsharded source), opened and checked on first use."""
        if number not in self._parts:
            if self.shards is None:
                path, start, vectors = self.directory / "index.faiss", 0, self.vectors
                rows, what = len(self), "index"
            else:
                entry = self.shards[number]
                vectors = self._shard_vectors(number)
                path, start, rows, what = self.directory / entry.index, entry.start, entry.rows, entry.describe()
            index, how = faiss_index.read_index_as(str(path), self.index_mode)
            if index.ntotal != rows or index.d != self.dim:
                raise UserError(f"{what} holds {index.ntotal} vectors of dimension {index.d}, the manifest says "
                                f"{rows} of {self.dim}", path=str(path), fix="rebuild the knowledge source")
            if self._search_params:
                faiss_index.set_search_params(index, **self._search_params)
            self._parts[number] = IndexPart(index, vectors, start, how, str(path))
        return self._parts[number]

    def local_search(self, numbers=None) -> LocalSearch:
        """Exact search over the shards ``numbers`` (default: all of them, merged) in this process."""
        numbers = range(self.num_shards) if numbers is None else numbers
        return LocalSearch([self.part(i) for i in numbers], len(self), self.dim, self.search_params.get("nprobe"))

    def reopened(self, version: Optional[int] = None) -> "KnowledgeSource":
        """The source's current version (or ``version``), opened afresh (after ``rag-update-knowledge``), with this
        one's index mode and search settings; refused unless it has the same document encoder and generator
        tokenizer."""
        fresh = KnowledgeSource(str(self.root), index_mode=self.index_mode, version=version)
        fresh.check_encoder(self.encoder_identity, what="the document encoder of the version open so far")
        if fresh.passages.tokenizer_identity != self.passages.tokenizer_identity:
            raise UserError(f"version {fresh.version} pre-tokenizes its passages with another generator vocabulary",
                            path=str(fresh.directory), fix="update knowledge sources with rag-update-knowledge only")
        if self._search_params:
            fresh.set_search_params(**self._search_params)
        return fresh

    def _shard_vectors(self, number: int) -> np.ndarray:
        if number not in self._shard_arrays:
            entry: ShardEntry = self.shards[number]
            check_shard_files(self.directory, entry)
            self._shard_arrays[number] = _load_vectors(self.directory / entry.vectors, entry.rows, self.dim,
                                                       entry.describe())
        return self._shard_arrays[number]

    @property
    def search_params(self) -> dict:
        """The IVF ``nprobe`` / HNSW ``ef_search`` set on every shard (:meth:`set_search_params`)."""
        return dict(self._search_params)

    def set_search_params(self, nprobe: Optional[int] = None, ef_search: Optional[int] = None):
        """IVF ``nprobe`` / HNSW ``efSearch`` for every shard (those opened now and those opened later);
        checked against the first shard now."""
        params = {k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search)) if v is not None}
        self.part(0)  # at least one shard open: a setting its index type lacks is refused here
        for part in self._parts.values():
            faiss_index.set_search_params(part.index, **params)
        self._search_params.update(params)

    def load_generator_tokenizer(self):
        """The generator tokenizer the passages were pre-tokenized with (copied into ``tokenizer/``)."""
        info = self.manifest.get("tokenizer")
        if not info:
            raise UserError("this knowledge source was built without a generator tokenizer", path=str(self.directory),
                            fix="rebuild it with --dict and --bpe-model (or the GPT-2 BPE files)")
        d = self.directory / "tokenizer"
        tok = GeneratorTokenizer(GeneratorTokenizerFiles.in_directory(d, info["files"]))
        if tok.dictionary_sha256() != self.passages.tokenizer_identity.get("dictionary_sha256"):
            raise UserError("tokenizer files do not match the pre-tokenized passages", path=str(d),
                            fix="rebuild the knowledge source")
        return tok

    @property
    def imported(self) -> bool:
        """Whether the document vectors were imported from an encoder this source does not know."""
        return self.encoder_identity.get("kind") == IMPORTED

    @property
    def query_encoder_identity(self) -> dict:
        """The identity of the query encoder to use (``encoder_spec``): recorded apart for imported
        vectors, else the document encoder's (one bi-encoder makes both)."""
        return self.manifest.get("query_encoder") or self.encoder_identity

    def load_encoder(self):
        """The query encoder of this source (``encoder_spec``; for a built source the bi-encoder the
        documents were embedded with), checked against the identity the manifest records."""
        from rag_plugin.retrieval.encoders import load_encoder  # start-up: torch; BM25 and the passages need none

        encoder = load_encoder(self.encoder_spec)
        what = f"encoder {self.encoder_spec!r}"
        if "query_encoder" in self.manifest:
            self._check_fields(encoder.identity(), self.manifest["query_encoder"], QUERY_SIDE, what,
                               "the query encoder this knowledge source was imported for",
                               "use the query encoder the vectors were imported for (or reimport them)")
        else:
            self.check_encoder(encoder.identity(), what=what)
        return encoder

    def check_encoder(self, identity: dict, what: str = "the checkpoint's encoder") -> None:
        """Raise unless ``identity`` names the same document encoder as this index's.

        Where either side is imported vectors of an unknown encoder (``kind: imported``) only the
        dimension can be checked (a warning says so when the identities differ)."""
        mine = self.encoder_identity
        if IMPORTED in (mine.get("kind"), (identity or {}).get("kind")):
            self._check_fields(identity, mine, ("dim",), what, "the document encoder of this knowledge source",
                               "use a knowledge source with vectors of the same dimension")
            if identity != mine:
                logger.warning("%s: the document encoder of imported vectors is unknown: only the dimension (%s) of "
                               "%s was checked", self.directory, mine.get("dim"), what)
            return
        self._check_fields(identity, mine, DOCUMENT_SIDE, what, "the document encoder of this knowledge source",
                           "use a knowledge source embedded with the same document encoder")

    def _check_fields(self, identity: dict, recorded: dict, keys, what: str, whose: str, fix: str) -> None:
        """Raise unless ``identity`` agrees with ``recorded`` on every one of ``keys`` that ``recorded`` has."""
        if any((identity or {}).get(k) != recorded.get(k) for k in keys if k in recorded):
            raise UserError(f"{what} does not match {whose} ({recorded.get('name')}, dim {recorded.get('dim')})",
                            path=str(self.directory / MANIFEST), fix=fix)


def _load_vectors(vpath: Path, count: int, dim: int, what: str = "document vectors") -> np.ndarray:
    """The memory map of a float32 [count, dim] ``.npy`` file, refused if missing, damaged or a pickle."""
    try:
        vectors = np.load(vpath, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{what} missing", path=str(vpath), fix="rebuild the knowledge source") from None
    except ValueError as err:
        if "allow_pickle" in str(err) or "Python objects" in str(err):
            raise UserError(f"{what} hold Python objects (a pickle); they were not loaded",
                            path=str(vpath), fix="a knowledge source holds plain float32 arrays: "
                            "rebuild it, or get it from a source you trust") from None
        raise UserError(f"{what} are corrupted or truncated", path=str(vpath),
                        fix="rebuild the knowledge source") from None
    if vectors.shape != (count, dim) or vectors.dtype != np.float32:
        raise UserError(f"{what} have shape {vectors.shape}, the manifest says ({count}, {dim})",
                        path=str(vpath), fix="rebuild the knowledge source")
    return vectors
