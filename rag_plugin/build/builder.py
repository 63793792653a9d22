"""Build (or resume building) a knowledge source: passages -> (split) -> pre-tokenize -> embed in
resumable shards -> FAISS index -> manifest, last.

:func:`build_knowledge_source` is the sequence of stages (:mod:`~rag_plugin.build.stages`,
:mod:`~rag_plugin.build.embedding`); what may be resumed or is up to date is decided by
:mod:`~rag_plugin.build.output_dir` from the settings' fingerprint plus the passage side of the
encoder's identity (:mod:`~rag_plugin.build.settings`): other weights behind the same
``--encoder`` are refused, never mixed.

Hooks for sources that are not (only) text files to embed: ``collection`` (passages from another
reader, e.g. a Hugging Face dataset), ``precomputed``
(:class:`~rag_plugin.build.precomputed.PrecomputedVectors`: document vectors computed elsewhere,
placed by passage id, in place of an encoder) and ``BuildSettings.index_file`` (an existing FAISS
index over the same rows, checked and used instead of building one); ``BuildSettings.input_format``
says which generator input format the passages are pre-tokenized for (see
:mod:`rag_plugin.core.input_format`).
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

from rag_plugin.build import stages
from rag_plugin.build.embedding import VectorReuse, embed_shards, gather_vectors
from rag_plugin.build.output_dir import (
    check_out_dir,
    check_same_encoder,
    check_shards,
    discard_unstarted_build_on_error,
    shard_path,
    shards_dir,
)
from rag_plugin.build.settings import ENCODER_IDENTITY, BuildSettings, passage_side
from rag_plugin.build.sharding import write_shards
from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import BUILD_DIR, KnowledgeSource
from rag_plugin.retrieval.passages import PassageStore


@dataclass
class _Run:
    """One build's output directory and options, as the stages after the checks need them."""

    out: Path
    settings: BuildSettings
    shard_size: int
    batch_size: int
    progress: bool
    log: Callable[[str], None]
    index_template: object = None


@dataclass
class _Vectors:
    """What the embedding stage hands on: the vectors' memory map and the identity of their encoder."""

    array: np.ndarray
    identity: dict
    seconds: float


@discard_unstarted_build_on_error
def build_knowledge_source(out_dir: str, settings: BuildSettings, encoder=None,
                           shard_size: int = 2048, batch_size: int = 64, restart: bool = False,
                           progress: bool = True, log=print, reuse_vectors_from: Optional[str] = None,
                           collection: Optional[Callable[[], Iterable]] = None, precomputed=None,
                           index_template=None, manifest_extra: Optional[dict] = None) -> KnowledgeSource:
    """Build (or resume building) a knowledge source in ``out_dir``.

    ``reuse_vectors_from``: an existing knowledge source with the same document encoder whose
    vectors are copied for unchanged passages (an updated collection re-embeds only what changed).
    ``collection``: a callable returning the passages (:class:`Passage` items) in place of
    reading ``settings.passages`` (which still name the input files, for the fingerprint).
    ``precomputed``: a :class:`~rag_plugin.build.precomputed.PrecomputedVectors`, document
    vectors computed elsewhere, in place of ``encoder``.
    ``index_template``: an empty FAISS index whose quantizer is already trained (an update keeps its
    source's), copied and given the vectors instead of training one. ``manifest_extra``: more manifest entries.
    """
    if precomputed is not None and (encoder is not None or reuse_vectors_from):
        raise ValueError("precomputed vectors replace the encoder (and vector reuse)")
    out = Path(out_dir)
    stages.check_passage_files(settings)
    fingerprint = settings.fingerprint()
    mode, recorded = check_out_dir(out, fingerprint, restart)
    encoder, identity = _check_existing_vectors(out, mode, recorded, settings, encoder, precomputed)
    if mode == "done":
        log(f"{out}: knowledge source is up to date")
        return KnowledgeSource(str(out))
    tokenizer, input_format = stages.load_pretokenization(settings)
    if precomputed is None:
        encoder, identity = _encoder_and_identity(settings, encoder, identity)
        fingerprint = {**fingerprint, ENCODER_IDENTITY: passage_side(identity)}
    shard_size = stages.start_build_state(out, mode, recorded, fingerprint, shard_size, log)
    run = _Run(out, settings, shard_size, batch_size, progress, log, index_template)
    store = stages.write_passage_store(out, settings, collection, tokenizer, input_format, fingerprint["passages"],
                                       progress, log)
    if precomputed is not None:
        vectors = _place_vectors(run, store, precomputed)
    else:
        vectors = _embed_vectors(run, store, encoder, identity, reuse_vectors_from)
    index_factory, index_extra = _write_index(run, vectors.array)
    tok_files = stages.copy_tokenizer_files(out, settings, tokenizer)
    extra = {**(precomputed.manifest_entries() if precomputed is not None else {}), **index_extra,
             **(manifest_extra or {})}
    dim = int(vectors.array.shape[1])
    stages.write_manifest(out, settings, store, vectors.identity, dim, fingerprint, index_factory, tok_files,
                          vectors.seconds, extra)
    shutil.rmtree(out / BUILD_DIR, ignore_errors=True)
    shards = f" in {settings.num_shards} shards" if settings.num_shards > 1 else ""
    log(f"{out}: {len(store)} passages, dim {dim}, index {index_factory}{shards}")
    return KnowledgeSource(str(out))


def _write_index(run: _Run, vectors: np.ndarray) -> Tuple[str, dict]:
    """The index (one file, or ``settings.num_shards`` shards): its factory and the manifest entries it adds."""
    settings = run.settings
    if run.index_template is not None:
        stages.keep_template(run.out, run.index_template)
    if settings.num_shards == 1:
        factory = stages.write_index(run.out, settings, vectors, run.progress, run.log)
        return factory, {"index_bytes": (run.out / "index.faiss").stat().st_size}
    entries = write_shards(run.out, vectors, settings.index_factory, settings.num_shards, settings.train_size,
                           settings.seed, run.progress, run.log)
    return settings.index_factory, {"index_bytes": sum(e.index_bytes for e in entries),
                                    "shards": [e.to_json() for e in entries]}


def _vectors_file(settings: BuildSettings) -> str:
    """Where the gathered vectors go: ``vectors.npy`` of the source, or a scratch file when they are cut into
    index shards (each shard keeps its own rows)."""
    return "vectors.npy" if settings.num_shards == 1 else f"{BUILD_DIR}/vectors.npy"


def _encoder_and_identity(settings: BuildSettings, encoder, identity: Optional[dict]) -> Tuple[object, dict]:
    """The document encoder (``settings.encoder`` unless given) and its identity, computed once
    (it hashes the weights)."""
    from rag_plugin.retrieval.encoders import load_encoder

    encoder = encoder if encoder is not None else load_encoder(settings.encoder)
    return encoder, identity if identity is not None else encoder.identity()


def _check_existing_vectors(out: Path, mode: str, recorded: Optional[dict], settings: BuildSettings, encoder,
                            precomputed) -> Tuple[object, Optional[dict]]:
    """The vectors already in ``out`` (a finished source, an unfinished build) must be this
    encoder's: returns the encoder and identity used for the check (identity None when there was none)."""
    if mode == "new" or precomputed is not None:
        return encoder, None
    encoder, identity = _encoder_and_identity(settings, encoder, None)
    check_same_encoder(out, mode, recorded, passage_side(identity))
    return encoder, identity


def _shards(run: _Run, store: PassageStore, dim: Optional[int]) -> Tuple[List[int], List[int]]:
    """``(start rows of every shard, those not yet made)``, the finished ones checked to fit."""
    n, shards = len(store), shards_dir(run.out)
    starts = list(range(0, n, run.shard_size))
    check_shards(shards, starts, run.shard_size, n, dim)
    return starts, [s for s in starts if not shard_path(shards, s).is_file()]


def _check_factory(run: _Run, dim: int, n: int) -> None:
    if not run.settings.index_file:  # refuse a bad --index-factory now, not after embedding
        faiss_index.check_factory(run.settings.index_factory, dim, n)


def _embed_vectors(run: _Run, store: PassageStore, encoder, identity: dict,
                   reuse_vectors_from: Optional[str]) -> _Vectors:
    """Embed the missing shards with ``encoder``, then gather every shard into ``vectors.npy``."""
    starts, todo = _shards(run, store, int(encoder.dim))
    dim, shards = int(encoder.dim), shards_dir(run.out)
    _check_factory(run, dim, len(store))
    reuse = VectorReuse(reuse_vectors_from, identity) if reuse_vectors_from else None
    seconds = embed_shards(store, shards, todo, run.shard_size, encoder, run.batch_size, reuse, run.progress)
    if reuse is not None:
        run.log(f"reused the vectors of {reuse.reused} unchanged passages from {reuse_vectors_from}")
    return _Vectors(gather_vectors(run.out, shards, starts, run.shard_size, len(store), dim,
                                   _vectors_file(run.settings)), identity, seconds)


def _place_vectors(run: _Run, store: PassageStore, precomputed) -> _Vectors:
    """Place vectors made elsewhere into the missing shards by passage id, then gather them."""
    starts, todo = _shards(run, store, None)
    shards = shards_dir(run.out)
    stages.place_precomputed(precomputed, store, shards, starts, run.shard_size, todo, run.progress, run.log)
    dim = int(precomputed.dim)
    _check_factory(run, dim, len(store))
    return _Vectors(gather_vectors(run.out, shards, starts, run.shard_size, len(store), dim,
                                   _vectors_file(run.settings)), precomputed.identity(), 0.0)
