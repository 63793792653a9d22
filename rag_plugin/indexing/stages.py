"""The knowledge-source builder's stages other than embedding (see :mod:`rag_plugin.indexing.builder`
for their order): the checks before anything is written, the passage store (read, split and
pre-tokenized once), document vectors made elsewhere, the FAISS index, the generator tokenizer's
files, and the manifest, written last.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, List, Optional

import numpy as np

from rag_plugin.indexing.output_dir import resume_shard_size, shard_path, shards_dir
from rag_plugin.indexing.precomputed import use_index_file
from rag_plugin.indexing.settings import SHARD_SIZE, BuildSettings, passage_files
from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import BUILD_DIR, FORMAT, MANIFEST
from rag_plugin.retrieval.passages import PassageStore, read_collection
from rag_plugin.retrieval.tokenization import GeneratorTokenizer
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text


def check_passage_files(settings: BuildSettings) -> None:
    if settings.num_shards < 1:
        raise UserError(f"--num-shards must be at least 1, got {settings.num_shards}", fix="use --num-shards 1 or more")
    if settings.num_shards > 1 and settings.index_file:
        raise UserError("an existing FAISS index (--faiss-index) cannot be cut into shards",
                        fix="leave out --num-shards, or leave out --faiss-index to build sharded indexes")
    for path in passage_files(settings):
        if not Path(path).is_file():
            raise UserError("passages file not found", path=path,
                            fix="pass --passages with .tsv (DPR layout) or .jsonl files (optionally .gz)")


def load_pretokenization(settings: BuildSettings):
    """``(generator tokenizer or None, InputFormat)`` the passages are pre-tokenized with; refuses
    a subword model without its dictionary and a non-plugin input format without a tokenizer."""
    from rag_plugin.core.input_format import InputFormat  # start-up: torch; --help stays light

    files = settings.tokenizer
    tokenizer = GeneratorTokenizer(files) if files.dict or files.subword_model else None
    input_format = InputFormat.from_identity(settings.input_format)
    if input_format.name != "plugin" and tokenizer is None:
        raise UserError(f"the {input_format.name} input format is a way of pre-tokenizing passages: it needs the "
                        "generator's tokenizer", fix="pass --dict and the subword model files as well")
    return tokenizer, input_format


def start_build_state(out: Path, mode: str, recorded: Optional[dict], fingerprint: dict, shard_size: int,
                      log: Callable[[str], None]) -> int:
    """Create ``.build/shards`` and record the settings (with the shard size: a resumed build keeps
    its finished shards' one, which is returned)."""
    shards = shards_dir(out)
    shards.mkdir(parents=True, exist_ok=True)
    if mode == "resume":
        shard_size = resume_shard_size(shards, recorded, shard_size, log)
    atomic_write_json(out / BUILD_DIR / "settings.json", {**fingerprint, SHARD_SIZE: shard_size})
    return shard_size


def write_passage_store(out: Path, settings: BuildSettings, collection: Optional[Callable[[], Iterable]],
                        tokenizer, input_format, passages_source, progress: bool,
                        log: Callable[[str], None]) -> PassageStore:
    """The passage store in ``out/passages`` (re-read only if no earlier run completed it)."""
    store_dir = out / "passages"
    done = out / BUILD_DIR / "passages.done"
    if (store_dir / "meta.json").is_file() and done.is_file():
        store = PassageStore(str(store_dir))
        log(f"passage store: {len(store)} passages (already built)")
        return store
    passages = (collection() if collection is not None
                else read_collection(passage_files(settings), settings.split_words))
    store = PassageStore.write(str(store_dir), passages, tokenizer=tokenizer,
                               source={"file": passages_source, "split_words": settings.split_words},
                               progress=progress, input_format=input_format)
    atomic_write_text(done, "ok\n")
    log(f"passage store: {len(store)} passages")
    return store


def place_precomputed(precomputed, store: PassageStore, shards: Path, starts: List[int], shard_size: int,
                      todo: List[int], progress: bool, log: Callable[[str], None]) -> None:
    """Vectors made elsewhere (:class:`~rag_plugin.indexing.precomputed.PrecomputedVectors`) placed into
    the missing shards by passage id; with none missing, their dimension is read off the first."""
    if todo:
        precomputed.write_shards(store, shards, starts, shard_size, shards.parent / "aligned.npy", progress, log)
    else:
        precomputed.dim = int(np.load(shard_path(shards, starts[0]), mmap_mode="r").shape[1])


def write_index(out: Path, settings: BuildSettings, vectors: np.ndarray, progress: bool,
                log: Callable[[str], None]) -> str:
    """``out/index.faiss``: built with ``settings.index_factory``, or ``settings.index_file``
    checked against the vectors and copied. Returns the factory the manifest records."""
    if settings.index_file:
        index = use_index_file(settings.index_file, vectors, log)
        index_factory = f"imported {type(faiss_index._faiss().downcast_index(index)).__name__}"
        del index
        with atomic_path(out / "index.faiss") as tmp:
            shutil.copyfile(settings.index_file, tmp)
        return index_factory
    template = out / BUILD_DIR / TEMPLATE
    if template.is_file():  # a quantizer trained before (an update keeps its source's): not trained again
        index = faiss_index.read_index(str(template))
        faiss_index.add_vectors(index, vectors, f"index {settings.index_factory}", progress=progress)
    else:
        index = faiss_index.build_index(vectors, settings.index_factory, train_size=settings.train_size,
                                        seed=settings.seed, progress=progress)
    faiss_index.write_index(index, str(out / "index.faiss"))
    return settings.index_factory


#: ``.build/trained.faiss``: the empty, trained index the index (or every index shard) is a copy of
TEMPLATE = "trained.faiss"


def keep_template(out: Path, template) -> None:
    """Record ``template`` (an empty index with a trained quantizer) as the one to copy, unless a resumed
    build recorded it already."""
    path = out / BUILD_DIR / TEMPLATE
    if not path.is_file():
        empty = faiss_index._faiss().clone_index(template)
        empty.reset()
        faiss_index.write_index(empty, str(path))


def copy_tokenizer_files(out: Path, settings: BuildSettings, tokenizer) -> dict:
    """The generator tokenizer travels with the passages it tokenized (``out/tokenizer/``);
    returns ``{setting: file name}``."""
    files = {}
    if tokenizer is None:
        return files
    tok_dir = out / "tokenizer"
    tok_dir.mkdir(exist_ok=True)
    for key, src in settings.tokenizer.paths().items():
        name = {"dict": "dict.txt"}.get(key, Path(src).name)
        with atomic_path(tok_dir / name) as tmp:
            shutil.copyfile(src, tmp)
        files[key] = name
    return files


def write_manifest(out: Path, settings: BuildSettings, store: PassageStore, identity: dict, dim: int,
                   fingerprint: dict, index_factory: str, tok_files: dict, embed_seconds: float,
                   extra: Optional[dict] = None) -> None:
    """``out/manifest.json``, the last file written: what makes the directory a knowledge source.
    ``extra``: more entries (what imported vectors came from, their query encoder)."""
    n = len(store)
    manifest = {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "count": n,
        "dim": dim,
        "metric": "inner_product",
        "index_factory": index_factory,
        "encoder_spec": settings.encoder,
        "encoder": identity,
        "pooling": identity.get("pooling"),
        "passage_store": {"sha256": store.sha256, "count": n, "tokenizer": store.tokenizer_identity},
        "tokenizer": {"files": tok_files, **(store.tokenizer_identity or {})} if tok_files else None,
        "build_settings": fingerprint,
        "embedding_seconds": round(embed_seconds, 2),
        **(extra or {}),
    }
    atomic_write_json(out / MANIFEST, manifest)
