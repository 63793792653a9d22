"""A knowledge source: passage store + frozen document vectors + FAISS index + manifest.

Directory layout (``KS_DIR``)::

    passages/        the passage store (see passages.py)
    vectors.npy      float32 [N, D] document vectors d(z), memory-mapped; the model
                     recomputes q.d from them so gradients reach the query encoder
    index.faiss      the MIPS index over the same vectors
    manifest.json    written LAST: encoder identity (and weights hash), dimension, pooling,
                     count, factory, passage-store hash. No manifest, no knowledge source.
    .build/          only while building: settings and finished embedding shards (resume)

The builder is resumable: embedding shards land atomically in ``.build/shards`` and a rerun
skips the finished ones (in the shard size they were made in). A half-built directory has no
manifest and cannot be loaded. What decides resume / up to date is the settings' fingerprint plus
the passage side of the encoder's identity (:func:`passage_side`: weights and vocabulary hashes,
max_length, pooling, ...): other weights behind the same ``--encoder`` are refused, never mixed.

Hooks of :func:`build_knowledge_source` for sources that are not (only) text files to embed:
``collection`` (passages from another reader, e.g. a Hugging Face dataset), ``precomputed``
(:class:`~rag_plugin.build.precomputed.PrecomputedVectors`: document vectors computed
elsewhere, placed by passage id, in place of an encoder) and ``BuildSettings.index_file`` (an
existing FAISS index over the same rows, checked and used instead of building one);
``BuildSettings.input_format`` says which generator input format the passages are
pre-tokenized for (see :mod:`rag_plugin.core.input_format`)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Union

import numpy as np

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text, sha256_file
from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.passages import PassageStore, read_collection

FORMAT = "rag_plugin.knowledge/1"
MANIFEST = "manifest.json"
BUILD_DIR = ".build"


@dataclass
class BuildSettings:
    """Everything that determines a knowledge source's content (a rerun must match)."""

    passages: Union[str, List[str]]   # one file, or several read in order as one collection
    encoder: str = "minilm"
    index_factory: str = "Flat"
    split_words: Optional[int] = None
    dict: Optional[str] = None
    bpe_model: Optional[str] = None
    gpt2_encoder_json: Optional[str] = None
    gpt2_vocab_bpe: Optional[str] = None
    train_size: int = 100_000
    seed: int = 0
    input_format: Optional[dict] = None  # InputFormat.identity() the passages are pre-tokenized for
    index_file: Optional[str] = None      # an existing FAISS index over these rows, used as is

    def fingerprint(self) -> dict:
        out = asdict(self)
        for key in ("input_format", "index_file"):  # absent when unset: older builds keep their fingerprint
            if out[key] is None:
                del out[key]
        if self.index_file:
            out["index_file_sha256"] = sha256_file(self.index_file)
            out["index_file"] = str(Path(self.index_file).resolve())
        if isinstance(self.passages, str):
            p = Path(self.passages)
            out["passages"] = str(p.resolve())
            out["passages_sha256"] = sha256_file(p)  # content, not mtime: a copied file still matches
        else:
            out["passages"] = [str(Path(p).resolve()) for p in self.passages]
            out["passages_sha256"] = [sha256_file(p) for p in self.passages]
        for key in ("dict", "bpe_model", "gpt2_encoder_json", "gpt2_vocab_bpe"):
            if out[key]:
                out[key + "_sha256"] = sha256_file(out[key])
                out[key] = str(Path(out[key]).resolve())
        return out


def passage_files(settings: BuildSettings) -> List[str]:
    return [settings.passages] if isinstance(settings.passages, str) else list(settings.passages)


#: Fields of an encoder's ``identity()`` that do not bear on its document vectors: names and paths
#: (the same weights may live elsewhere) and the query tower (which an index does not depend on).
NOT_PASSAGE_SIDE = frozenset({"kind", "name", "spec", "source", "shared_towers", "weights_sha256",
                              "query_weights_sha256"})

#: Keys a build adds to :meth:`BuildSettings.fingerprint` in ``.build/settings.json`` (and, but for
#: the shard size, in the manifest's ``build_settings``); absent from builds by older versions.
ENCODER_IDENTITY = "encoder_identity"
SHARD_SIZE = "shard_size"


def passage_side(identity: dict) -> dict:
    """The fields of an encoder identity that decide its document vectors (weights and vocabulary
    hashes, dim, pooling, normalize, max_length, passage_format, lowercase, ...)."""
    return {k: v for k, v in (identity or {}).items() if k not in NOT_PASSAGE_SIDE}


def _differences(old: dict, new: dict) -> List[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _describe_differences(old: dict, new: dict, there: str = "there", here: str = "here", most: int = 3) -> str:
    """``"max_length 256 there, 8 here; ..."`` for the keys that differ (long hashes shortened)."""
    def show(d, k):
        if k not in d:
            return "not recorded"
        v = d[k]
        return f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else json.dumps(v)

    keys = _differences(old, new)
    parts = [f"{k} {show(old, k)} {there}, {show(new, k)} {here}" for k in keys[:most]]
    if len(keys) > most:
        parts.append(f"{len(keys) - most} more")
    return "; ".join(parts)


def _settings_part(recorded: dict) -> dict:
    return {k: v for k, v in recorded.items() if k not in (ENCODER_IDENTITY, SHARD_SIZE)}


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
                                "else rebuild it with scripts/build_knowledge_source.py")


class KnowledgeSource:
    """A loaded, verified knowledge source (see the module docstring for the layout)."""

    def __init__(self, directory: str, mmap_index: bool = False):
        d = Path(directory)
        if not d.is_dir():
            raise UserError("knowledge source directory not found", path=str(d),
                            fix="build one with scripts/build_knowledge_source.py")
        mpath = d / MANIFEST
        if not mpath.is_file():
            hint = ("its build did not finish: rerun scripts/build_knowledge_source.py to resume"
                    if (d / BUILD_DIR).exists() else
                    "build one with scripts/build_knowledge_source.py")
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
        refuse_pickles(d)
        self.passages = PassageStore(str(d / "passages"))
        if len(self.passages) != count or self.passages.sha256 != self.manifest["passage_store"]["sha256"]:
            raise UserError(f"passage store ({len(self.passages)} passages) does not match the "
                            f"manifest ({count} passages)", path=str(d / "passages"),
                            fix="the directory mixes two builds: rebuild the knowledge source")
        vpath = d / "vectors.npy"
        try:
            self.vectors = np.load(vpath, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise UserError("document vectors missing", path=str(vpath),
                            fix="rebuild the knowledge source") from None
        except ValueError as err:
            if "allow_pickle" in str(err) or "Python objects" in str(err):
                raise UserError("document vectors hold Python objects (a pickle); they were not loaded",
                                path=str(vpath), fix="a knowledge source holds plain float32 arrays: "
                                "rebuild it, or get it from a source you trust") from None
            raise UserError("document vectors are corrupted or truncated", path=str(vpath),
                            fix="rebuild the knowledge source") from None
        if self.vectors.shape != (count, dim) or self.vectors.dtype != np.float32:
            raise UserError(f"document vectors have shape {self.vectors.shape}, the manifest says "
                            f"({count}, {dim})", path=str(vpath), fix="rebuild the knowledge source")
        self._mmap_index = mmap_index
        self._index = None

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
    def index(self):
        if self._index is None:
            path = self.directory / "index.faiss"
            index = faiss_index.read_index(str(path), mmap=self._mmap_index)
            if index.ntotal != len(self) or index.d != self.dim:
                raise UserError(f"index holds {index.ntotal} vectors of dimension {index.d}, the "
                                f"manifest says {len(self)} of {self.dim}", path=str(path),
                                fix="rebuild the knowledge source")
            self._index = index
        return self._index

    def set_search_params(self, nprobe: Optional[int] = None, ef_search: Optional[int] = None):
        faiss_index.set_search_params(self.index, nprobe=nprobe, ef_search=ef_search)

    def load_generator_tokenizer(self):
        """The generator tokenizer the passages were pre-tokenized with (copied into ``tokenizer/``)."""
        from rag_plugin.retrieval.tokenization import load_generator_tokenizer

        info = self.manifest.get("tokenizer")
        if not info:
            raise UserError("this knowledge source was built without a generator tokenizer", path=str(self.directory),
                            fix="rebuild it with --dict and --bpe-model (or the GPT-2 BPE files)")
        d = self.directory / "tokenizer"
        files = {k: str(d / v) for k, v in info["files"].items()}
        tok = load_generator_tokenizer(files["dict"], files.get("bpe_model"), files.get("gpt2_encoder_json"),
                                       files.get("gpt2_vocab_bpe"))
        if tok.dictionary_sha256() != self.passages.tokenizer_identity.get("dictionary_sha256"):
            raise UserError("tokenizer files do not match the pre-tokenized passages", path=str(d),
                            fix="rebuild the knowledge source")
        return tok

    def load_encoder(self):
        """The bi-encoder the documents were embedded with (its query tower initialises q)."""
        from rag_plugin.retrieval.encoders import load_encoder

        encoder = load_encoder(self.encoder_spec)
        self.check_encoder(encoder.identity(), what=f"encoder {self.encoder_spec!r}")
        return encoder

    def check_encoder(self, identity: dict, what: str = "the checkpoint's encoder") -> None:
        """Raise unless ``identity`` names the same document encoder as this index's."""
        mine = self.encoder_identity
        keys = ("dim", "pooling", "passage_weights_sha256")
        if any(identity.get(k) != mine.get(k) for k in keys if k in mine):
            raise UserError(f"{what} does not match the document encoder of this knowledge source "
                            f"({mine.get('name')}, dim {mine.get('dim')})",
                            path=str(self.directory / MANIFEST),
                            fix="use a knowledge source embedded with the same document encoder")


# ---------------------------------------------------------------------------------- building
def _read_json_or_none(path: Path):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _discard_unstarted_build_on_error(build):
    """A build into a new (or empty) directory that fails on bad input (:class:`UserError`)
    before any vector was computed removes what it created: after fixing the input, the same
    command starts afresh (no --restart, no "unfinished build with other settings")."""
    import functools

    @functools.wraps(build)
    def wrapper(out_dir, *args, **kwargs):
        out = Path(out_dir)
        fresh = not out.exists() or (out.is_dir() and not any(out.iterdir()))
        try:
            return build(out_dir, *args, **kwargs)
        except UserError:
            shards = out / BUILD_DIR / "shards"
            started = (out / MANIFEST).exists() or (shards.is_dir() and any(shards.glob("*.npy")))
            if fresh and out.is_dir() and not started:
                shutil.rmtree(out, ignore_errors=True)
            raise

    return wrapper


def _check_out_dir(out: Path, fingerprint: dict, restart: bool):
    """Decide what to do with ``out``: ('new', None), ('resume', the unfinished build's recorded
    settings) or ('done', the manifest); refuse foreign content and other settings. The encoder
    identity and shard size recorded with the settings are checked by the caller."""
    if not out.exists():
        return "new", None
    if not out.is_dir():
        raise UserError("output path exists and is not a directory", path=str(out),
                        fix="choose another --out")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return "new", None
    state = out / BUILD_DIR / "settings.json"
    if MANIFEST in entries:
        manifest = _read_json_or_none(out / MANIFEST)
        if manifest is None:
            raise UserError("output directory holds a knowledge source whose manifest is corrupted",
                            path=str(out / MANIFEST), fix="choose another --out or delete it first")
        recorded = manifest.get("build_settings")
        if isinstance(recorded, dict) and _settings_part(recorded) == fingerprint:
            return "done", manifest
        differs = _describe_differences(_settings_part(recorded), fingerprint) if isinstance(recorded, dict) else ""
        raise UserError("output directory already holds a knowledge source built with other "
                        f"settings{f' ({differs})' if differs else ''}", path=str(out),
                        fix="choose another --out or delete it first")
    if state.is_file():
        if restart:
            shutil.rmtree(out)
            return "new", None
        recorded = _read_json_or_none(state)
        if recorded is not None and _settings_part(recorded) == fingerprint:
            return "resume", recorded
        differs = _describe_differences(_settings_part(recorded), fingerprint) if recorded else ""
        raise UserError(f"output directory holds an unfinished build with other settings"
                        f"{f' ({differs})' if differs else ''}",
                        path=str(out), fix="rerun with the same settings, or add --restart to discard it")
    raise UserError("output directory is not empty and is not a knowledge source", path=str(out),
                    fix="choose a new or empty --out directory")


def _check_same_encoder(out: Path, mode: str, recorded: dict, identity: dict) -> None:
    """Refuse to call ``out`` up to date, or to resume it, when its vectors were (or began to be)
    made by an encoder whose passage side differs from ``identity`` (``passage_side``): new weights
    at the same path, another max_length, ... A finished source built by an older version is
    checked against the identity in its manifest; an unfinished one that recorded none, and has
    finished shards, cannot be checked and is refused."""
    if mode == "done":
        built = recorded.get("build_settings", {}).get(ENCODER_IDENTITY)
        built = passage_side(recorded.get("encoder") or {}) if built is None else built
        if _differences(built, identity):
            raise UserError("output directory holds a knowledge source embedded with another document encoder "
                            f"({_describe_differences(built, identity, 'there', 'now')})", path=str(out),
                            fix="choose another --out, or delete it first to rebuild it with this encoder")
        return
    started = recorded.get(ENCODER_IDENTITY)
    has_shards = any((out / BUILD_DIR / "shards").glob("*.npy"))
    if started is None and has_shards:
        raise UserError("output directory holds an unfinished build from an older version, which did not record "
                        "its document encoder: its finished vectors cannot be checked against this one",
                        path=str(out), fix="add --restart to discard it and start over")
    if started is not None and _differences(started, identity):
        raise UserError("output directory holds an unfinished build begun with another document encoder "
                        f"({_describe_differences(started, identity, 'then', 'now')}); resuming would mix "
                        "vectors of the two", path=str(out),
                        fix="rerun with the encoder it was begun with, or add --restart to discard it")


def _resume_shard_size(shards: Path, recorded: Optional[dict], requested: int, log) -> int:
    """The shard size a build continues with: the one its finished shards were made in (recorded
    with the settings; read off the first shard for builds by older versions), else ``requested``.
    The shard size is only the unit of resume, the vectors do not depend on it."""
    if not any(shards.glob("*.npy")):
        return requested  # nothing embedded yet: any shard size will do
    size = (recorded or {}).get(SHARD_SIZE)
    if size is None and (shards / f"{0:012d}.npy").is_file():
        size = int(np.load(shards / f"{0:012d}.npy", mmap_mode="r").shape[0])
    if size is None or int(size) == requested:
        return requested
    log(f"resuming with the unfinished build's shard size {size} (not {requested}): its finished "
        "shards are in that unit")
    return int(size)


def _check_shards(shards: Path, starts: List[int], shard_size: int, n: int, dim: Optional[int]) -> None:
    """Every finished shard must be one of this build's, of its size: else resuming would mix them."""
    expected = set(starts)
    for path in sorted(shards.glob("*.npy")):
        try:
            s = int(path.stem)
            shape = np.load(path, mmap_mode="r").shape
        except (ValueError, OSError, EOFError):
            s, shape = None, None
        if (s not in expected or len(shape) != 2 or shape[0] != min(shard_size, n - s)
                or (dim is not None and shape[1] != dim)):
            raise UserError(f"unfinished build holds a shard that does not fit it ({path.name}, for {n} "
                            f"passages in shards of {shard_size})", path=str(path),
                            fix="add --restart to discard the unfinished build and start over")


def _passage_key(pid: str, title: str, text: str) -> bytes:
    return hashlib.sha1(f"{pid}\0{title}\0{text}".encode("utf-8")).digest()


class _VectorReuse:
    """Vectors of unchanged passages (same id, title and text) from an existing knowledge source
    embedded with the same document encoder: only new or edited passages are embedded."""

    def __init__(self, directory: str, identity: dict):
        self.ks = KnowledgeSource(directory)
        self.ks.check_encoder(identity, what="the encoder of this build")
        # every passage-side setting, not only dim, pooling and weights: the same weights with
        # another max_length (or passage format, vocabulary, ...) make other vectors
        theirs, mine = passage_side(self.ks.encoder_identity), passage_side(identity)
        if _differences(theirs, mine):
            raise UserError("the encoder of this build does not match the document encoder of this knowledge "
                            f"source ({_describe_differences(theirs, mine, 'there', 'here')})",
                            path=str(self.ks.directory / MANIFEST),
                            fix="reuse vectors only from a knowledge source embedded with the same encoder "
                                "settings, or leave --reuse-vectors-from out")
        store = self.ks.passages
        self.row_of = {_passage_key(store.id(r), store.title(r), store.text(r)): r for r in range(len(store))}
        self.reused = 0

    def split(self, keys):
        """(positions found, their rows in the old source, positions to embed)."""
        found, rows, missing = [], [], []
        for i, key in enumerate(keys):
            row = self.row_of.get(key)
            if row is None:
                missing.append(i)
            else:
                found.append(i)
                rows.append(row)
        self.reused += len(found)
        return found, rows, missing


@_discard_unstarted_build_on_error
def build_knowledge_source(out_dir: str, settings: BuildSettings, encoder=None,
                           shard_size: int = 2048, batch_size: int = 64, restart: bool = False,
                           progress: bool = True, log=print, reuse_vectors_from: Optional[str] = None,
                           collection: Optional[Callable[[], Iterable]] = None, precomputed=None
                           ) -> KnowledgeSource:
    """Build (or resume building) a knowledge source in ``out_dir``.

    ``reuse_vectors_from``: an existing knowledge source with the same document encoder whose
    vectors are copied for unchanged passages (an updated collection re-embeds only what changed).
    ``collection``: a callable returning the passages (:class:`Passage` items) in place of
    reading ``settings.passages`` (which still name the input files, for the fingerprint).
    ``precomputed``: a :class:`~rag_plugin.build.precomputed.PrecomputedVectors`, document
    vectors computed elsewhere, in place of ``encoder``.
    """
    from rag_plugin.core.input_format import InputFormat
    from rag_plugin.retrieval.encoders import load_encoder
    from rag_plugin.retrieval.tokenization import load_generator_tokenizer

    if precomputed is not None and (encoder is not None or reuse_vectors_from):
        raise ValueError("precomputed vectors replace the encoder (and vector reuse)")
    out = Path(out_dir)
    for path in passage_files(settings):
        if not Path(path).is_file():
            raise UserError("passages file not found", path=path,
                            fix="pass --passages with .tsv (DPR layout) or .jsonl files")
    fingerprint = settings.fingerprint()
    mode, recorded = _check_out_dir(out, fingerprint, restart)
    identity = None  # the encoder's identity, computed once (it hashes the weights)
    if mode != "new" and precomputed is None:  # the vectors there must be this encoder's
        encoder = encoder if encoder is not None else load_encoder(settings.encoder)
        identity = encoder.identity()
        _check_same_encoder(out, mode, recorded, passage_side(identity))
    if mode == "done":
        log(f"{out}: knowledge source is up to date")
        return KnowledgeSource(str(out))
    tokenizer = None
    if settings.dict:
        tokenizer = load_generator_tokenizer(settings.dict, settings.bpe_model,
                                             settings.gpt2_encoder_json, settings.gpt2_vocab_bpe)
    elif settings.bpe_model or settings.gpt2_encoder_json:
        raise UserError("a subword model was given without the generator dictionary",
                        fix="pass --dict dict.txt as well")
    input_format = InputFormat.from_identity(settings.input_format)
    if input_format.name != "plugin" and tokenizer is None:
        raise UserError(f"the {input_format.name} input format is a way of pre-tokenizing passages: it needs the "
                        "generator's tokenizer", fix="pass --dict and the subword model files as well")
    if precomputed is None:
        encoder = encoder if encoder is not None else load_encoder(settings.encoder)
        identity = identity if identity is not None else encoder.identity()
        fingerprint = {**fingerprint, ENCODER_IDENTITY: passage_side(identity)}
    state = out / BUILD_DIR
    shards = state / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    if mode == "resume":
        shard_size = _resume_shard_size(shards, recorded, shard_size, log)
    atomic_write_json(state / "settings.json", {**fingerprint, SHARD_SIZE: shard_size})

    # 1. passages (re-read only if the store is not complete)
    store_dir = out / "passages"
    if (store_dir / "meta.json").is_file() and (state / "passages.done").is_file():
        store = PassageStore(str(store_dir))
        log(f"passage store: {len(store)} passages (already built)")
    else:
        passages = (collection() if collection is not None
                    else read_collection(passage_files(settings), settings.split_words))
        store = PassageStore.write(str(store_dir), passages,
                                   tokenizer=tokenizer, source={"file": fingerprint["passages"],
                                                                "split_words": settings.split_words},
                                   progress=progress, input_format=input_format)
        atomic_write_text(state / "passages.done", "ok\n")
        log(f"passage store: {len(store)} passages")

    # 2. embedding shards, each written atomically; finished ones are skipped
    n = len(store)
    starts = list(range(0, n, shard_size))
    _check_shards(shards, starts, shard_size, n, None if precomputed is not None else int(encoder.dim))
    todo = [s for s in starts if not (shards / f"{s:012d}.npy").is_file()]
    if precomputed is not None:  # vectors made elsewhere: placed into the shards by passage id
        if todo:
            precomputed.write_shards(store, shards, starts, shard_size, state / "aligned.npy", progress, log)
        else:
            precomputed.dim = int(np.load(shards / f"{starts[0]:012d}.npy", mmap_mode="r").shape[1])
        encoder, todo = precomputed, []
        identity = encoder.identity()
    dim = int(encoder.dim)
    if not getattr(settings, "index_file", None):  # refuse a bad --index-factory now, not after embedding
        faiss_index.check_factory(settings.index_factory, dim, n)
    reuse = _VectorReuse(reuse_vectors_from, identity) if reuse_vectors_from else None
    bar = None
    if progress and todo:
        from tqdm import tqdm
        bar = tqdm(total=n, initial=n - sum(min(shard_size, n - s) for s in todo),
                   desc="embedding", unit=" psg", mininterval=1.0, smoothing=0.1)
    t0 = time.perf_counter()
    for s in todo:
        e = min(s + shard_size, n)
        titles = [store.title(r) for r in range(s, e)]
        texts = [store.text(r) for r in range(s, e)]
        if reuse is None:
            vecs = np.asarray(encoder.encode_passages(titles, texts, batch_size=batch_size, progress=False),
                              dtype=np.float32)
        else:
            keys = [_passage_key(store.id(r), t, x) for r, t, x in zip(range(s, e), titles, texts)]
            found, old_rows, missing = reuse.split(keys)
            vecs = np.empty((e - s, dim), dtype=np.float32)
            if found:
                vecs[found] = reuse.ks.vectors[np.asarray(old_rows)]
            if missing:
                vecs[missing] = encoder.encode_passages([titles[i] for i in missing], [texts[i] for i in missing],
                                                        batch_size=batch_size, progress=False)
        if vecs.shape != (e - s, dim):
            raise RuntimeError(f"encoder returned {vecs.shape}, expected {(e - s, dim)}")
        with atomic_path(shards / f"{s:012d}.npy") as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, vecs, allow_pickle=False)
        if bar is not None:
            bar.update(e - s)
    if bar is not None:
        bar.close()
    embed_seconds = time.perf_counter() - t0
    if reuse is not None:
        log(f"reused the vectors of {reuse.reused} unchanged passages from {reuse_vectors_from}")

    # 3. all vectors in one memory-mappable array
    with atomic_path(out / "vectors.npy") as tmp:
        vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for s in starts:
            vectors[s:s + shard_size] = np.load(shards / f"{s:012d}.npy", allow_pickle=False)
        vectors.flush()
        del vectors
    vectors = np.load(out / "vectors.npy", mmap_mode="r")

    # 4. the index (or an existing one over the same rows: checked, then copied)
    if settings.index_file:
        from rag_plugin.build.precomputed import use_index_file

        index = use_index_file(settings.index_file, vectors, log)
        index_factory = f"imported {type(faiss_index._faiss().downcast_index(index)).__name__}"
        del index
        with atomic_path(out / "index.faiss") as tmp:
            shutil.copyfile(settings.index_file, tmp)
    else:
        index = faiss_index.build_index(vectors, settings.index_factory, train_size=settings.train_size,
                                        seed=settings.seed, progress=progress)
        index_factory = settings.index_factory
        faiss_index.write_index(index, str(out / "index.faiss"))

    # 5. the generator tokenizer travels with the passages it tokenized
    tok_files = {}
    if tokenizer is not None:
        tok_dir = out / "tokenizer"
        tok_dir.mkdir(exist_ok=True)
        for key in ("dict", "bpe_model", "gpt2_encoder_json", "gpt2_vocab_bpe"):
            src = getattr(settings, key)
            if src:
                name = {"dict": "dict.txt"}.get(key, Path(src).name)
                with atomic_path(tok_dir / name) as tmp:
                    shutil.copyfile(src, tmp)
                tok_files[key] = name

    # 6. the manifest, last
    manifest = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "count": n,
        "dim": dim,
        "metric": "inner_product",
        "index_factory": index_factory,
        "index_bytes": os.path.getsize(out / "index.faiss"),
        "encoder_spec": settings.encoder,
        "encoder": identity,
        "pooling": identity.get("pooling"),
        "passage_store": {"sha256": store.sha256, "count": n, "tokenizer": store.tokenizer_identity},
        "tokenizer": {"files": tok_files, **(store.tokenizer_identity or {})} if tok_files else None,
        "build_settings": fingerprint,
        "embedding_seconds": round(embed_seconds, 2),
    }
    atomic_write_json(out / MANIFEST, manifest)
    shutil.rmtree(state, ignore_errors=True)
    log(f"{out}: {n} passages, dim {dim}, index {index_factory}")
    return KnowledgeSource(str(out))
