"""The builder's embedding stages: document vectors in resumable shards, then one array.

* :func:`embed_shards` embeds the passages of every missing shard (``.build/shards``, each written
  atomically: an interrupted build resumes at the first missing one), copying the vectors of
  unchanged passages from an older source when asked (:class:`VectorReuse`);
* :func:`gather_vectors` concatenates the shards into the memory-mappable ``vectors.npy``;
* :func:`embedding_encoder` readies an encoder for it: on a device, in half precision if asked.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import List, Optional

import numpy as np
from tqdm import tqdm

from rag_plugin.indexing.output_dir import shard_path
from rag_plugin.indexing.settings import describe_differences, differences, passage_side
from rag_plugin.retrieval.knowledge import MANIFEST, KnowledgeSource
from rag_plugin.retrieval.passages import PassageStore
from rag_plugin.util.devices import model_device, resolve_device
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path

#: ``--fp16`` of the commands that embed passages
FP16_HELP = ("embed in half precision (the encoder's forward under float16 autocast), for a GPU: on a CPU without "
             "float16 arithmetic it is several times slower than float32; the vectors are stored float32, within "
             "float16 rounding of float32 ones")


def embedding_encoder(encoder, device=None, fp16: bool = False):
    """``encoder`` (a :class:`~rag_plugin.retrieval.encoders.TextEncoder`, or a spec to load) on ``device`` (a
    ``--device`` value: None for a GPU when there is one, else the CPU), its forward in half precision with
    ``fp16`` (:meth:`~rag_plugin.retrieval.encoders.text_encoder.TextEncoder.for_embedding`). Another object with
    the encoder interface only (``encode_passages``, ...) runs where it runs: asked explicitly for a GPU or for
    ``fp16``, it is a one-line error."""
    where = resolve_device(device)  # first: a bad --device is an error before any weights load
    if isinstance(encoder, str):
        from rag_plugin.retrieval.encoders import load_encoder  # start-up: torch; --help stays light

        encoder = load_encoder(encoder)
    if not hasattr(encoder, "for_embedding"):
        if fp16 or (device is not None and where.type != "cpu"):
            raise UserError(f"the encoder {type(encoder).__name__} chooses its own device and precision",
                            fix="leave --device and --fp16 out for it")
        return encoder
    return encoder.for_embedding(where, fp16)


def embedding_device(encoder):
    """Where ``encoder`` embeds: its passage tower's device; the CPU for an encoder without towers."""
    import torch  # start-up: --help stays light

    tower = getattr(encoder, "passage_tower", None)
    return model_device(tower) if tower is not None else torch.device("cpu")


def embedding_record(encoder) -> dict:
    """What a manifest records of how its vectors were computed beyond the encoder's identity: ``embedding_fp16``
    when the forward ran in half precision (vectors within float16 rounding of the float32 ones)."""
    return {"embedding_fp16": True} if getattr(encoder, "fp16", False) else {}


def passage_key(pid: str, title: str, text: str) -> bytes:
    return hashlib.sha1(f"{pid}\0{title}\0{text}".encode("utf-8")).digest()


class VectorReuse:
    """Vectors of unchanged passages (same id, title and text) from an existing knowledge source
    embedded with the same document encoder: only new or edited passages are embedded."""

    def __init__(self, directory: str, identity: dict):
        self.directory = directory
        self.ks = KnowledgeSource(directory)
        self.ks.check_encoder(identity, what="the encoder of this build")
        # every passage-side setting, not only dim, pooling and weights: the same weights with
        # another max_length (or passage format, vocabulary, ...) make other vectors
        theirs, mine = passage_side(self.ks.encoder_identity), passage_side(identity)
        if differences(theirs, mine):
            raise UserError("the encoder of this build does not match the document encoder of this knowledge "
                            f"source ({describe_differences(theirs, mine, 'there', 'here')})",
                            path=str(self.ks.directory / MANIFEST),
                            fix="reuse vectors only from a knowledge source embedded with the same encoder "
                                "settings, or leave --reuse-vectors-from out")
        store = self.ks.passages
        self.row_of = {passage_key(store.id(r), store.title(r), store.text(r)): r for r in range(len(store))}
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


def _embed_rows(store: PassageStore, start: int, end: int, encoder, batch_size: int,
                reuse: Optional[VectorReuse]) -> np.ndarray:
    """float32 [end - start, dim] vectors of the store's rows ``start:end``."""
    if reuse is None and getattr(encoder, "lower", None) is not None:  # continued from cached lower-layer states
        return encoder.encode_rows(start, end, batch_size)
    titles = [store.title(r) for r in range(start, end)]
    texts = [store.text(r) for r in range(start, end)]
    if reuse is None:
        return np.asarray(encoder.encode_passages(titles, texts, batch_size=batch_size, progress=False),
                          dtype=np.float32)
    keys = [passage_key(store.id(r), t, x) for r, t, x in zip(range(start, end), titles, texts)]
    found, old_rows, missing = reuse.split(keys)
    vecs = np.empty((end - start, int(encoder.dim)), dtype=np.float32)
    if found:
        vecs[found] = reuse.ks.vectors[np.asarray(old_rows)]
    if missing:
        vecs[missing] = encoder.encode_passages([titles[i] for i in missing], [texts[i] for i in missing],
                                                batch_size=batch_size, progress=False)
    return vecs


def embed_shards(store: PassageStore, shards: Path, todo: List[int], shard_size: int, encoder,
                 batch_size: int, reuse: Optional[VectorReuse], progress: bool) -> float:
    """Embed the shards starting at ``todo`` (each saved atomically); returns the seconds spent."""
    n, dim = len(store), int(encoder.dim)
    bar = None
    if progress and todo:
        bar = tqdm(total=n, initial=n - sum(min(shard_size, n - s) for s in todo),
                   desc="embedding", unit=" psg", mininterval=1.0, smoothing=0.1)
    t0 = time.perf_counter()
    for s in todo:
        e = min(s + shard_size, n)
        vecs = _embed_rows(store, s, e, encoder, batch_size, reuse)
        if vecs.shape != (e - s, dim):
            raise RuntimeError(f"encoder returned {vecs.shape}, expected {(e - s, dim)}")
        with atomic_path(shard_path(shards, s)) as tmp:
            with open(tmp, "wb") as fh:
                np.save(fh, vecs, allow_pickle=False)
        if bar is not None:
            bar.update(e - s)
    if bar is not None:
        bar.close()
    return time.perf_counter() - t0


def gather_vectors(out: Path, shards: Path, starts: List[int], shard_size: int, n: int, dim: int,
                   name: str = "vectors.npy") -> np.ndarray:
    """All shards in one memory-mappable ``out/vectors.npy`` (``name``; written atomically); returns its
    memory map."""
    with atomic_path(out / name) as tmp:
        vectors = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        for s in starts:
            vectors[s:s + shard_size] = np.load(shard_path(shards, s), allow_pickle=False)
        vectors.flush()
        del vectors
    return np.load(out / name, mmap_mode="r")
