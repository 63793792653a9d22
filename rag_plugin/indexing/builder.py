"""Build (or resume building) a knowledge source: passages -> (split) -> pre-tokenize -> embed in
resumable shards -> FAISS index -> manifest, last.

:func:`build_knowledge_source` is the sequence of stages (:mod:`~rag_plugin.indexing.stages`,
:mod:`~rag_plugin.indexing.embedding`); what may be resumed or is up to date is decided by
:mod:`~rag_plugin.indexing.output_dir` from the settings' fingerprint plus the passage side of the
encoder's identity (:mod:`~rag_plugin.indexing.settings`): other weights behind the same
``--encoder`` are refused, never mixed.

Three small objects say what a build does: :class:`BuildSettings` what the source holds (its
fingerprint), :class:`BuildOptions` how the build runs (chunk and batch sizes, restart, progress, log,
the processes it is split over) and :class:`BuildHooks` what it takes besides text files to embed with
``settings.encoder``: an encoder object, vectors to reuse, ``collection`` (passages from another
reader, e.g. a Hugging Face dataset), ``precomputed``
(:class:`~rag_plugin.indexing.precomputed.PrecomputedVectors`: document vectors computed elsewhere,
placed by passage id, in place of an encoder), an update's trained quantizer and more manifest
entries. ``BuildSettings.index_file`` is an existing FAISS index over the same rows, checked and used
instead of building one; ``BuildSettings.input_format`` says which generator input format the passages
are pre-tokenized for (see :mod:`rag_plugin.core.input_format`).

``BuildOptions.group`` (:class:`~rag_plugin.indexing.distributed.BuildGroup`): the processes of a torchrun job
the build is split over. Rank 0 does the checks, the passage store, gathering the vectors and the manifest; every rank
embeds its share of the missing chunks and builds the index shards it owns. One process is the same
sequence with no one to wait for.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Tuple

import numpy as np

from rag_plugin.indexing import stages
from rag_plugin.indexing.distributed import (
    BuildGroup,
    ChunkProgress,
    check_same_directory,
    embed_share,
    shard_builders,
    share,
    write_job_token,
)
from rag_plugin.indexing.embedding import VectorReuse, embed_shards, gather_vectors
from rag_plugin.indexing.output_dir import (
    check_out_dir,
    check_same_encoder,
    check_shards,
    discard_unstarted_build_on_error,
    shard_path,
    shards_dir,
)
from rag_plugin.indexing.settings import ENCODER_IDENTITY, BuildSettings, describe_differences, passage_side
from rag_plugin.indexing.sharding import finished_entries, shard_bounds, template_index, write_shards
from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import BUILD_DIR, KnowledgeSource
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.util.errors import UserError


@dataclass
class BuildOptions:
    """How a build runs; none of it decides the source's content."""

    shard_size: int = 2048  # passages per embedding chunk: the unit of resume and of a distributed build's work
    batch_size: int = 64  # encoder batch size
    restart: bool = False  # discard an unfinished build in the output directory and start over
    progress: bool = True  # progress bars (rank 0 only)
    log: Callable[[str], None] = print  # where progress lines go (rank 0 only)
    group: Optional[BuildGroup] = None  # the processes the build is split over (None: this one)


@dataclass
class BuildHooks:
    """What a build takes besides text files to embed with ``settings.encoder`` (see the module docstring)."""

    encoder: object = None  # a loaded document encoder in place of settings.encoder
    reuse_vectors_from: Optional[str] = None  # a source with the same encoder: vectors of unchanged passages copied
    collection: Optional[Callable[[], Iterable]] = None  # the passages, in place of reading settings.passages
    precomputed: object = None  # PrecomputedVectors made elsewhere, in place of an encoder
    index_template: object = None  # an empty FAISS index with a trained quantizer (an update keeps its source's)
    manifest_extra: Optional[dict] = None  # more manifest entries

    def check(self, group: BuildGroup) -> None:
        if self.precomputed is not None and (self.encoder is not None or self.reuse_vectors_from):
            raise ValueError("precomputed vectors replace the encoder (and vector reuse)")
        if self.precomputed is not None and group.world > 1:
            raise ValueError("precomputed vectors are placed by one process: build with one")


@dataclass
class _Run:
    """One build's output directory and options, as the stages after the checks need them."""

    out: Path
    settings: BuildSettings
    shard_size: int
    batch_size: int
    progress: bool
    log: Callable[[str], None]
    group: BuildGroup
    index_template: object = None  # an update's trained quantizer (BuildHooks)


@dataclass
class _Plan:
    """What rank 0 decided before any vector is made, sent to every rank: the embedding chunks (their size,
    all their starts, those not yet made) and the encoder identity the vectors are made with."""

    done: bool
    shard_size: int = 0
    batch_size: int = 0
    starts: Tuple[int, ...] = ()
    todo: Tuple[int, ...] = ()
    identity: Optional[dict] = None
    token: str = ""


@dataclass
class _Prepared:
    """What rank 0 keeps from the checks for the stages after the index."""

    fingerprint: dict
    tokenizer: object
    store: PassageStore
    encoder: object


@dataclass
class _Vectors:
    """What the embedding stage hands on: the vectors' memory map and the identity of their encoder."""

    array: np.ndarray
    identity: dict
    seconds: float


def build_knowledge_source(out_dir: str, settings: BuildSettings, options: Optional[BuildOptions] = None,
                           hooks: Optional[BuildHooks] = None) -> KnowledgeSource:
    """Build (or resume building) a knowledge source in ``out_dir``: ``settings`` say what it holds,
    ``options`` how the build runs, ``hooks`` what it takes besides text files to embed (see the module
    docstring). Only rank 0 of ``options.group`` logs and shows progress."""
    options, hooks = options or BuildOptions(), hooks or BuildHooks()
    group = options.group or BuildGroup()
    hooks.check(group)
    options = replace(options, group=group, progress=options.progress and group.is_main,
                      log=options.log if group.is_main else _quiet)
    build = _build if group.is_main else _build.__wrapped__  # rank 0 alone cleans up after bad input
    return build(out_dir, settings, options, hooks)


def _quiet(message: str) -> None:
    """The log of the ranks other than 0."""


@discard_unstarted_build_on_error
def _build(out_dir, settings: BuildSettings, options: BuildOptions, hooks: BuildHooks) -> KnowledgeSource:
    """The stages, in order, each on rank 0 or on every rank (``options.group``, :class:`BuildGroup`)."""
    out, group = Path(out_dir), options.group
    prepared, plan = group.on_main(lambda: _prepare(out, settings, options, hooks))
    if plan.done:
        return KnowledgeSource(str(out))
    run = _Run(out, settings, plan.shard_size, plan.batch_size, options.progress, options.log, group,
               hooks.index_template)
    if hooks.precomputed is not None:
        vectors = _place_vectors(run, prepared.store, hooks.precomputed)
    else:
        vectors = _embed_vectors(run, plan, prepared, hooks.encoder, hooks.reuse_vectors_from)
    index_factory, index_extra = _write_index(run, vectors.array)
    group.on_main(lambda: (_finish(run, prepared, vectors, index_factory, index_extra, hooks), None))
    return KnowledgeSource(str(out))


def _prepare(out: Path, settings: BuildSettings, options: BuildOptions,
             hooks: BuildHooks) -> Tuple[Optional[_Prepared], _Plan]:
    """Rank 0, before any vector is made: the checks, the build state, the passage store and the plan."""
    precomputed, encoder, log = hooks.precomputed, hooks.encoder, options.log
    stages.check_passage_files(settings)
    fingerprint = settings.fingerprint()
    mode, recorded = check_out_dir(out, fingerprint, options.restart)
    encoder, identity = _check_existing_vectors(out, mode, recorded, settings, encoder, precomputed)
    if mode == "done":
        log(f"{out}: knowledge source is up to date")
        return None, _Plan(done=True)
    tokenizer, input_format = stages.load_pretokenization(settings)
    if precomputed is None:
        encoder, identity = _encoder_and_identity(settings, encoder, identity)
        fingerprint = {**fingerprint, ENCODER_IDENTITY: passage_side(identity)}
    shard_size = stages.start_build_state(out, mode, recorded, fingerprint, options.shard_size, log)
    store = stages.write_passage_store(out, settings, hooks.collection, tokenizer, input_format,
                                       fingerprint["passages"], options.progress, log)
    shard_bounds(len(store), settings.num_shards)  # more index shards than passages: refused before embedding
    starts, todo = _chunks(out, store, shard_size, None if precomputed is not None else int(encoder.dim))
    if precomputed is None:
        _check_factory(settings, int(encoder.dim), len(store))
    token = write_job_token(out) if options.group.world > 1 else ""
    plan = _Plan(False, shard_size, options.batch_size, tuple(starts), tuple(todo), identity, token)
    return _Prepared(fingerprint, tokenizer, store, encoder), plan


def _finish(run: _Run, prepared: _Prepared, vectors: _Vectors, index_factory: str, index_extra: dict,
            hooks: BuildHooks) -> None:
    """Rank 0, last: the tokenizer files, the manifest, and the build state removed."""
    out, settings, store = run.out, run.settings, prepared.store
    tok_files = stages.copy_tokenizer_files(out, settings, prepared.tokenizer)
    extra = {**(hooks.precomputed.manifest_entries() if hooks.precomputed is not None else {}), **index_extra,
             **(hooks.manifest_extra or {})}
    dim = int(vectors.array.shape[1])
    stages.write_manifest(out, settings, store, vectors.identity, dim, prepared.fingerprint, index_factory,
                          tok_files, vectors.seconds, extra)
    shutil.rmtree(out / BUILD_DIR, ignore_errors=True)
    shards = f" in {settings.num_shards} shards" if settings.num_shards > 1 else ""
    by = f" (built by {run.group.world} processes)" if run.group.world > 1 else ""
    run.log(f"{out}: {len(store)} passages, dim {dim}, index {index_factory}{shards}{by}")


def _write_index(run: _Run, vectors: np.ndarray) -> Tuple[str, dict]:
    """The index (one file, or ``settings.num_shards`` shards): its factory and the manifest entries it adds.
    One file is built by rank 0; shards by their builders (:func:`shard_builders`) from one template index
    trained by rank 0."""
    settings, group = run.settings, run.group
    if run.index_template is not None:  # an update's trained quantizer, kept in .build/trained.faiss
        group.on_main(lambda: (stages.keep_template(run.out, run.index_template), None))
    if settings.num_shards == 1:
        _, factory = group.on_main(lambda: (None, stages.write_index(run.out, settings, vectors, run.progress,
                                                                     run.log)))
        return factory, {"index_bytes": (run.out / "index.faiss").stat().st_size}
    group.on_main(lambda: (template_index(run.out, vectors, settings.index_factory, settings.train_size,
                                          settings.seed), None))
    mine = [s for s, rank in enumerate(shard_builders(settings.num_shards, group.world)) if rank == group.rank]
    group.each(lambda: (_write_my_shards(run, vectors, mine), None))
    _, entries = group.on_main(lambda: (None, finished_entries(run.out, settings.num_shards)))
    return settings.index_factory, {"index_bytes": sum(e.index_bytes for e in entries),
                                    "shards": [e.to_json() for e in entries]}


def _write_my_shards(run: _Run, vectors: np.ndarray, numbers: List[int]) -> None:
    settings = run.settings
    if numbers:
        write_shards(run.out, vectors, settings.index_factory, settings.num_shards, settings.train_size,
                     settings.seed, run.progress, run.log, numbers=numbers)


def _vectors_file(settings: BuildSettings) -> str:
    """Where the gathered vectors go: ``vectors.npy`` of the source, or a scratch file when they are cut into
    index shards (each shard keeps its own rows)."""
    return "vectors.npy" if settings.num_shards == 1 else f"{BUILD_DIR}/vectors.npy"


def _encoder_and_identity(settings: BuildSettings, encoder, identity: Optional[dict]) -> Tuple[object, dict]:
    """The document encoder (``settings.encoder`` unless given) and its identity, computed once
    (it hashes the weights)."""
    from rag_plugin.retrieval.encoders import load_encoder  # start-up: torch; --help stays light

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


def _chunks(out: Path, store: PassageStore, shard_size: int, dim: Optional[int]) -> Tuple[List[int], List[int]]:
    """``(start rows of every embedding chunk, those not yet made)``, the finished ones checked to fit."""
    n, shards = len(store), shards_dir(out)
    starts = list(range(0, n, shard_size))
    check_shards(shards, starts, shard_size, n, dim)
    return starts, [s for s in starts if not shard_path(shards, s).is_file()]


def _check_factory(settings: BuildSettings, dim: int, n: int) -> None:
    if not settings.index_file:  # refuse a bad --index-factory now, not after embedding
        faiss_index.check_factory(settings.index_factory, dim, n)


def _join_embedding(run: _Run, plan: _Plan, encoder, reuse_vectors_from: Optional[str]):
    """Every rank: its encoder (ranks other than 0 load theirs and check it makes rank 0's vectors) and
    vector reuse. Returns ``((encoder, reuse), None)``."""
    group = run.group
    if not group.is_main:
        check_same_directory(run.out, plan.token, group)
        encoder, identity = _encoder_and_identity(run.settings, encoder, None)
        mine, main = passage_side(identity), passage_side(plan.identity)
        if mine != main:
            raise UserError(f"rank {group.rank} of {group.world} has another document encoder than rank 0 "
                            f"({describe_differences(main, mine, 'on rank 0', 'here')})",
                            fix="give every node the same encoder files at the same path")
    reuse = VectorReuse(reuse_vectors_from, plan.identity) if reuse_vectors_from else None
    return (encoder, reuse), None


def _embed_vectors(run: _Run, plan: _Plan, prepared: Optional[_Prepared], encoder,
                   reuse_vectors_from: Optional[str]) -> _Vectors:
    """Every rank embeds its share of the missing chunks; then rank 0 gathers every chunk into one array."""
    group, shards = run.group, shards_dir(run.out)
    encoder = prepared.encoder if group.is_main else encoder
    (encoder, reuse), _ = group.each(lambda: _join_embedding(run, plan, encoder, reuse_vectors_from))
    store = prepared.store if group.is_main else PassageStore(str(run.out / "passages"))
    n, dim = len(store), int(encoder.dim)

    def embed_chunk(start: int) -> None:
        embed_shards(store, shards, [start], run.shard_size, encoder, run.batch_size, reuse, progress=False)

    progress = ChunkProgress(shards, plan.todo, run.shard_size, n, run.progress)

    def embed_mine():
        seconds = embed_share(share(plan.todo, group), embed_chunk, progress)
        return None, (seconds, reuse.reused if reuse is not None else 0)

    _, done = group.each(embed_mine)
    progress.close()
    if reuse is not None:
        run.log(f"reused the vectors of {sum(d[1] for d in done)} unchanged passages from {reuse_vectors_from}")
    array, _ = group.on_main(lambda: (gather_vectors(run.out, shards, list(plan.starts), run.shard_size, n, dim,
                                                     _vectors_file(run.settings)), None))
    if not group.is_main:
        array = np.load(run.out / _vectors_file(run.settings), mmap_mode="r")
    return _Vectors(array, plan.identity, max(d[0] for d in done))


def _place_vectors(run: _Run, store: PassageStore, precomputed) -> _Vectors:
    """Place vectors made elsewhere into the missing chunks by passage id, then gather them (one process)."""
    starts, todo = _chunks(run.out, store, run.shard_size, None)
    shards = shards_dir(run.out)
    stages.place_precomputed(precomputed, store, shards, starts, run.shard_size, todo, run.progress, run.log)
    dim = int(precomputed.dim)
    _check_factory(run.settings, dim, len(store))
    return _Vectors(gather_vectors(run.out, shards, starts, run.shard_size, len(store), dim,
                                   _vectors_file(run.settings)), precomputed.identity(), 0.0)
