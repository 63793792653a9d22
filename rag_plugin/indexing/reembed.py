"""Re-embed a knowledge source with a trained document tower: version v+1 holds the same passages (ids, order,
pre-tokenization) with every vector made again by the source's own encoder whose passage tower carries the
given weights (``rag-update-knowledge --reembed``, and the trainer's ``--reindex-every``).

How it is done, with the builder's machinery (:mod:`rag_plugin.indexing.builder`,
:mod:`~rag_plugin.indexing.embedding`):

1. every process (``rank`` of ``world``) embeds its share of the embedding chunks (rank r: chunks r, r + world,
   ...) from version v's passage store into ``KS/.reindex/vVVVVVV-TOWERSHA/`` (one ``.npy`` per chunk, each written
   atomically; a chunk already there is not made again: the same call resumes). The folder is named by the base
   version and the tower's weights, so chunks of other weights are never mixed in;
2. rank 0 waits for every chunk, then, holding the update lock (``KS/.update.lock``), moves them into the build
   state of ``KS/versions/.VVVVVV.partial`` and lets the builder finish it: passage store, the vectors gathered,
   the index with v's settings (Flat: the same type; IVF/PQ: a quantizer trained afresh, every vector moved; HNSW:
   rebuilt; S shards: S shards), the manifest (written last);
3. the partial directory is renamed to ``versions/VVVVVV`` and ``CURRENT`` switched (a rename), last. Killed at any
   point, v stays current and byte-identical; rerunning the same call resumes.

The manifest keeps v's ``encoder`` identity (the query side and the encoder spec are unchanged: readers open it
with the same encoder) and adds ``document_tower_sha256`` (:func:`state_dict_sha256` of the weights) and
``reembedded_from`` (what they came from). Processes other than rank 0 signal a failure with a file
(``failed.rankR``) so rank 0 stops waiting at once.

``python -m rag_plugin.indexing.reembed --knowledge KS --tower FILE --what TEXT [--rank R --world W]`` runs one
process of it (the trainer starts these, :mod:`rag_plugin.reindexing.reindexer`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from rag_plugin.indexing import stages
from rag_plugin.indexing.builder import BuildHooks, BuildOptions, build_knowledge_source
from rag_plugin.indexing.embedding import embed_shards, embedding_record
from rag_plugin.indexing.output_dir import shard_path, shards_dir
from rag_plugin.indexing.settings import ENCODER_IDENTITY, passage_side
from rag_plugin.indexing.update import update_settings
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.encoders import lower_states
from rag_plugin.retrieval.encoders.trained_tower import doc_encoder_state_from_checkpoint
from rag_plugin.retrieval.encoders.weights import load_tower_state, state_dict_sha256
from rag_plugin.retrieval.index import set_faiss_threads
from rag_plugin.retrieval.knowledge import BUILD_DIR, MANIFEST, KnowledgeSource
from rag_plugin.util.devices import resolve_device
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_path, atomic_write_json
from rag_plugin.util.safe_load import safe_torch_load

#: ``KS/.reindex``: chunks, logs and results of re-embeddings (plain arrays and text: never a pickle)
REINDEX_DIR = ".reindex"
#: passages per embedding chunk (the unit of resume and of the split between processes)
CHUNK_SIZE = 2048
#: manifest entries a re-embedded version adds
TOWER_SHA = "document_tower_sha256"
FROM = "reembedded_from"


class TowerEncoder:
    """The knowledge source's encoder with its passage tower holding other weights: embeds passages only; its
    identity is the source's plus the tower's hash (so an unfinished build of other weights is never resumed)."""

    def __init__(self, encoder, base_identity: dict, tower_sha: str):
        self.encoder, self.base_identity, self.tower_sha = encoder, dict(base_identity), tower_sha
        self.dim = int(encoder.dim)
        #: a :class:`~rag_plugin.retrieval.encoders.lower_states.LowerStates` of this tower's frozen layers, or None
        self.lower = None

    def encode_passages(self, titles, texts, batch_size: int = 64, progress: bool = False):
        return self.encoder.encode_passages(titles, texts, batch_size=batch_size, progress=progress)

    def encode_rows(self, start: int, end: int, batch_size: int = 64):
        """float32[end - start, D]: the rows' vectors from the cached states of the frozen lower layers (only the
        layers above run)."""
        tower = self.encoder.passage_tower.eval()
        param = next(tower.parameters())
        out = np.empty((end - start, self.dim), dtype=np.float32)
        with torch.inference_mode(), self.encoder.precision(param.device):
            for s in range(start, end, batch_size):
                hidden, mask = self.lower.gather(range(s, min(s + batch_size, end)))
                vectors = tower.forward_from(hidden.to(param.device, param.dtype), mask.to(param.device),
                                             self.lower.layers)
                out[s - start:s - start + len(vectors)] = vectors.float().cpu().numpy()
        return out

    def find_lower_states(self, root: Path, tower_state: Dict, passages_sha256: str, log) -> None:
        """Continue from a cache under ``KS/.lower_states`` whose frozen layers and passages are exactly this
        tower's and this version's (``--doc-encoder-train-layers`` left one), if there is one."""
        found = lower_states.find(Path(root) / lower_states.DIR_NAME, tower_state, passages_sha256)
        if found is not None:
            self.lower = found
            log(f"the tower's lower {found.layers} layers: from the cache {found.directory}")

    def use_lower_states(self, directory: str, tower_state: Dict, passages_sha256: str) -> None:
        """Continue from the cache in ``directory`` (``--lower-states``): a one-line error unless it holds this
        tower's frozen layers over these passages."""
        try:
            lower = lower_states.LowerStates(directory)
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"not a complete lower-layer cache ({e})", path=str(directory),
                            fix="leave --lower-states out (every layer runs)") from e
        if lower.meta.get("key") != lower_states.tower_key(tower_state, lower.layers, passages_sha256):
            raise UserError(f"the lower-layer cache is not of this tower's frozen {lower.layers} layers over these "
                            "passages", path=str(directory), fix="leave --lower-states out (every layer runs)")
        self.lower = lower

    def identity(self) -> dict:
        return {**self.base_identity, TOWER_SHA: self.tower_sha}


def tower_encoder(current: KnowledgeSource, tower_state: Dict, what: str) -> TowerEncoder:
    """``current``'s encoder (:meth:`KnowledgeSource.load_encoder`) with ``tower_state`` in its passage tower."""
    encoder = current.load_encoder()
    if getattr(encoder, "passage_tower", None) is None:
        raise UserError(f"the encoder {current.encoder_spec!r} of this knowledge source has no BERT passage tower "
                        "to load trained weights into", path=str(current.directory / MANIFEST),
                        fix="re-embed only sources built with a BERT bi-encoder (minilm, dpr, hf-dpr, random)")
    load_tower_state(encoder.passage_tower, tower_state, what, "document tower")
    return TowerEncoder(encoder, current.encoder_identity, state_dict_sha256(tower_state))


def chunk_dir(root: Path, base: int, tower_sha: str) -> Path:
    return Path(root) / REINDEX_DIR / f"v{base:06d}-{tower_sha[:16]}"


@dataclass
class Reembedding:
    """One re-embedding: what the tower's weights are, the version re-embedded, this process's share and where
    the tower runs."""

    what: str  # what the weights are, for the manifest
    base_version: Optional[int] = None  # the version re-embedded (None: the current one)
    rank: int = 0  # without a BuildGroup: this process, of world independent ones (rank r: chunks r, r + world, ...)
    world: int = 1
    encoder: Optional[TowerEncoder] = None  # a ready tower encoder in place of the tower_state given
    device: str = "cpu"  # where the tower made from tower_state runs
    fp16: bool = False  # that tower's forward in half precision (TextEncoder.for_embedding)
    wait_minutes: float = 24 * 60  # how long rank 0 waits for the other processes' chunks


def reembed(knowledge_dir: str, tower_state: Optional[Dict], job: Reembedding,
            options: Optional[BuildOptions] = None) -> int:
    """Write version v+1 of ``knowledge_dir`` (v: ``job.base_version``, default the current one) with every passage
    embedded again by a passage tower holding ``tower_state`` (or ``job.encoder``), and make it current (see the
    module docstring). ``options``: chunk and batch sizes, progress, log and ``group`` (a
    :class:`~rag_plugin.indexing.distributed.BuildGroup`: its rank and world; rank 0 returns when the version is
    current, the others with it); without a group, ``job.rank``/``job.world`` split the chunks between
    independent processes, and ranks other than 0 return once their chunks are written. Returns the new
    version's number."""
    t0 = time.perf_counter()
    options = options or BuildOptions()
    group = options.group
    rank, world = (group.rank, group.world) if group is not None else (job.rank, job.world)
    root = Path(knowledge_dir)
    current = KnowledgeSource(str(root), version=job.base_version)
    encoder = job.encoder
    if encoder is None:
        encoder = tower_encoder(current, tower_state, job.what)
        encoder.encoder.for_embedding(job.device, job.fp16)
        encoder.find_lower_states(root, tower_state, current.passages.sha256, options.log)
    elif tower_state is not None and encoder.tower_sha != state_dict_sha256(tower_state):
        raise ValueError("the encoder given does not hold tower_state")
    chunks = chunk_dir(root, current.version, encoder.tower_sha)
    starts = list(range(0, len(current), options.shard_size))

    def embed_mine():
        mine = [s for s in starts[rank::world] if not shard_path(chunks, s).is_file()]
        chunks.mkdir(parents=True, exist_ok=True)
        try:
            embed_shards(current.passages, chunks, mine, options.shard_size, encoder, options.batch_size, None,
                         options.progress and rank == 0)
        except BaseException as err:
            if world > 1 and group is None:
                (chunks / f"failed.rank{rank}").write_text(f"{type(err).__name__}: {err}\n", encoding="utf-8")
            raise
        return None, None

    if group is None:
        embed_mine()
        if rank != 0:
            return current.version + 1
        return _commit(root, current, encoder, chunks, starts, job, options, t0, world)
    group.each(embed_mine)
    _, version = group.on_main(lambda: (None, _commit(root, current, encoder, chunks, starts, job, options, t0, 1)))
    return version


def _wait_for_chunks(chunks: Path, starts, world: int, wait_minutes: float) -> None:
    """Rank 0: until every chunk is there; a failure file of another rank, or the wait running out, stops it."""
    deadline = time.monotonic() + wait_minutes * 60
    while True:
        failed = sorted(chunks.glob("failed.rank*"))
        if failed:
            reason = failed[0].read_text(encoding="utf-8").strip().splitlines()[:1]
            raise UserError(f"another process of the re-embedding failed ({failed[0].name}: "
                            f"{reason[0] if reason else '?'})", path=str(failed[0]), fix="see that process's log")
        missing = [s for s in starts if not shard_path(chunks, s).is_file()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise UserError(f"{len(missing)} of {len(starts)} embedding chunks did not arrive within "
                            f"{wait_minutes:g} minutes from the other {world - 1} processes", path=str(chunks),
                            fix="see the other processes' logs; the chunks written are kept for the next run")
        time.sleep(0.5)


def _commit(root: Path, current: KnowledgeSource, encoder: TowerEncoder, chunks: Path, starts, job: Reembedding,
            options: BuildOptions, t0: float, world: int) -> int:
    """Rank 0: the chunks into version v+1 (built by the builder in its partial directory), then made current."""
    log = options.log
    if world > 1:
        _wait_for_chunks(chunks, starts, world, job.wait_minutes)
    base, new = current.version, current.version + 1
    with versions.UpdateLock(root):
        if versions.current_version(root) != base:
            raise UserError(f"the knowledge source moved on to version {versions.current_version(root)} while "
                            f"version {base} was re-embedded", path=str(root), fix="re-embed the current version")
        settings = update_settings(current, [])
        identity = encoder.identity()
        partial, final = versions.partial_dir(root, new), versions.version_dir(root, new)
        _discard_other(partial, final, encoder.tower_sha, log)
        if not (final / MANIFEST).is_file():
            if not (partial / BUILD_DIR / "settings.json").is_file() and not (partial / MANIFEST).is_file():
                fingerprint = {**settings.fingerprint(), ENCODER_IDENTITY: passage_side(identity)}
                stages.start_build_state(partial, "new", None, fingerprint, options.shard_size, log)
            for s in starts:  # the chunks join the build state (a rename each; those moved before are there)
                if shard_path(chunks, s).is_file():
                    os.replace(shard_path(chunks, s), shard_path(shards_dir(partial), s))
            store = current.passages
            extra = {"version": new, "previous_version": base, TOWER_SHA: encoder.tower_sha, FROM: job.what,
                     **embedding_record(encoder.encoder)}
            build_knowledge_source(str(partial), settings, replace(options, group=None, restart=False),
                                   BuildHooks(encoder=encoder, manifest_extra=extra,
                                              collection=lambda: (store.passage(r) for r in range(len(store)))))
            _keep_base_identity(partial, current.encoder_identity, time.perf_counter() - t0)
            os.replace(partial, final)
        versions.switch_to(root, new)
    shutil.rmtree(chunks, ignore_errors=True)
    log(f"{root}: version {new} is current: {len(current)} passages re-embedded from {job.what} "
        f"in {time.perf_counter() - t0:.1f}s")
    return new


def _tower_of(directory: Path) -> Optional[str]:
    """The tower hash an unfinished (or finished, never current) re-embedding in ``directory`` was begun with."""
    for path, key in ((directory / MANIFEST, "build_settings"), (directory / BUILD_DIR / "settings.json", None)):
        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        recorded = recorded.get(key) or {} if key else recorded
        return (recorded.get(ENCODER_IDENTITY) or {}).get(TOWER_SHA, "")
    return None


def _discard_other(partial: Path, final: Path, tower_sha: str, log) -> None:
    """Remove what another update or re-embedding left unfinished (or finished but never made current) as v+1."""
    for d in (final, partial):
        if d.is_dir() and _tower_of(d) != tower_sha:
            if d == final and versions.in_use(d):
                raise UserError("a version that was never made current is open in a process", path=str(d),
                                fix="stop that process, then rerun")
            log(f"discarding {d.name}: an unfinished update of other content")
            if (d / MANIFEST).is_file():
                (d / MANIFEST).unlink()
            shutil.rmtree(d)


def _keep_base_identity(partial: Path, base_identity: dict, seconds: float) -> None:
    """The manifest's ``encoder`` is the source's own (the tower's hash is recorded beside it)."""
    manifest = json.loads((partial / MANIFEST).read_text(encoding="utf-8"))
    manifest.update(encoder=base_identity, reembed_seconds=round(seconds, 2))
    atomic_write_json(partial / MANIFEST, manifest)


# ------------------------------------------------------------------------------------- tower files
def save_tower_state(state: Dict, path: Path) -> Path:
    """``state`` (tensors) as a safetensors file, written atomically (no pickle)."""
    with atomic_path(path) as tmp:
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(tmp))
    return Path(path)


def read_tower_state(path: str) -> Dict:
    """A document tower's weights: a ``.safetensors`` file, a ``.pt`` holding ``{"document_tower": state}``, or a
    fairseq checkpoint of a model trained with ``--train-doc-encoder``."""
    if str(path).endswith(".safetensors"):
        if not Path(path).is_file():
            raise UserError("document tower file not found", path=str(path), fix="check the path")
        return load_file(str(path))
    loaded = safe_torch_load(path, what="document tower file")
    if isinstance(loaded, dict) and isinstance(loaded.get("document_tower"), dict):
        return dict(loaded["document_tower"])
    if isinstance(loaded, dict) and "model" in loaded:
        return doc_encoder_state_from_checkpoint(path)
    if isinstance(loaded, dict) and loaded and all(isinstance(v, torch.Tensor) for v in loaded.values()):
        return dict(loaded)
    raise UserError("not a document tower: neither a fairseq checkpoint nor {'document_tower': state dict}",
                    path=str(path), fix="pass a checkpoint trained with --train-doc-encoder")


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rag_plugin.indexing.reembed", description=__doc__.split("\n\n")[0])
    p.add_argument("--knowledge", required=True)
    p.add_argument("--tower", required=True, help="the document tower's weights (.safetensors, .pt, checkpoint)")
    p.add_argument("--what", default=None, help="what the weights are, for the manifest (default: --tower)")
    p.add_argument("--base-version", type=int, default=None, help="the version re-embedded (default: current)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch and FAISS threads")
    p.add_argument("--device", default="cpu", help="where the passage tower runs: cpu, cuda, cuda:N")
    p.add_argument("--fp16", action="store_true", help="the passage tower's forward in half precision")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--chunk-size", type=int, default=CHUNK_SIZE, help="passages per embedding chunk")
    p.add_argument("--wait-minutes", type=float, default=24 * 60)
    p.add_argument("--result", default=None, help="write {version, seconds} here (JSON) when done")
    p.add_argument("--lower-states", default=None,
                   help="a cache of the tower's frozen lower layers: only the layers above run")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    set_faiss_threads(args.threads)
    t0 = time.perf_counter()
    current = KnowledgeSource(args.knowledge, version=args.base_version)
    what = args.what or args.tower
    state = read_tower_state(args.tower)
    encoder = tower_encoder(current, state, what)
    encoder.encoder.for_embedding(resolve_device(args.device), args.fp16)
    if args.lower_states:
        encoder.use_lower_states(args.lower_states, state, current.passages.sha256)
        print(f"the tower's lower {encoder.lower.layers} layers: from the cache {args.lower_states}", flush=True)
    base = current.version
    del current
    job = Reembedding(what, base_version=base, rank=args.rank, world=args.world, encoder=encoder,
                      wait_minutes=args.wait_minutes)
    options = BuildOptions(shard_size=args.chunk_size, batch_size=args.batch_size, progress=False,
                           log=lambda m: print(m, flush=True))
    version = reembed(args.knowledge, None, job, options)
    if args.result:
        atomic_write_json(args.result, {"version": version, "seconds": round(time.perf_counter() - t0, 2),
                                        "rank": args.rank})
    return 0


if __name__ == "__main__":
    sys.exit(main())
