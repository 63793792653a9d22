"""A passage tower's lower layers, computed once: the hidden states of every passage after its frozen bottom.

Training the document encoder (``--train-doc-encoder``) costs a forward and a backward of the whole tower for every
retrieved passage of every step: on a CPU most of a step. With its embeddings and its first M layers frozen
(``--doc-encoder-train-layers N``, M = layers - N), their output for a passage never changes, so it is computed once
for the whole collection and stored; a step then runs only the N trainable layers (forward and backward) on the
stored states of its passages, and gives the same vectors as the full tower would (same weights, the frozen part in
eval mode, no dropout).

On disk, ``DIR/`` (written under ``DIR.partial`` and renamed: a half-built cache is never read)::

    meta.json      {"layers": M, "count": N, "hidden_size": H, "key": ..., "tokens": T}
    offsets.npy    int64[N + 1]: passage r's states are rows offsets[r]:offsets[r + 1] of states.npy
    states.npy     float32[T, H] (memory-mapped when read)

``DIR`` is named by :func:`cache_key`: the frozen weights' hash, M, and the passage store's content hash, so a
cache of other weights or other passages is never read. Builders of the same cache (several ranks) take turns on
``DIR.lock`` (flock): the first builds it, the others find it complete.

The cache takes tokens x hidden x 4 bytes (BERT-base, ~150 tokens per 100-word passage: ~460 KB a passage, ~10 TB
for Wikipedia's 21M). Before building, :func:`check_disk` holds that (estimated from a sample of the passages, then
exactly once they are tokenized) against the free space of the disk it goes on: a one-line error with the figures.
"""
from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)

META = "meta.json"
#: where the caches of a knowledge source go: ``KS/.lower_states/``
DIR_NAME = ".lower_states"
#: passages per forward while building
BATCH = 64
#: the free disk a cache must leave beside itself (checkpoints, logs): this fraction of its size, and these bytes
HEADROOM_FRACTION, HEADROOM_BYTES = 0.10, 256 * 2 ** 20
#: passages tokenized to estimate a large store's tokens before tokenizing all of it
SAMPLE = 1000
#: passages tokenized at a time while building (their ids go to a file beside the cache until it is complete)
TOKENIZE_WINDOW = 8192


def frozen_part(state: dict, layers: int) -> dict:
    """Of a tower's plain state dict, the weights :meth:`BiEncoderTower.lower_states` ``(layers=M)`` reads: the
    embeddings and layers 0..M-1."""
    wanted = ("bert_model.embeddings.",) + tuple(f"bert_model.encoder.layer.{i}." for i in range(layers))
    return {k: v for k, v in state.items() if k.startswith(wanted)}


def cache_key(frozen_state: dict, layers: int, store_sha256: str) -> str:
    """The name of the cache of these frozen weights over this passage store."""
    text = json.dumps({"frozen": state_dict_sha256(frozen_state), "layers": int(layers), "passages": store_sha256})
    return hashlib.sha256(text.encode()).hexdigest()


def tower_key(state: dict, layers: int, store_sha256: str) -> str:
    """:func:`cache_key` of a tower's plain state dict with its first ``layers`` layers frozen."""
    return cache_key(frozen_part(state, layers), layers, store_sha256)


def cache_dir(root: os.PathLike, key: str) -> Path:
    """Where the cache named ``key`` lives under ``root`` (complete once it holds ``meta.json``; while it is
    built: ``<that>.partial``)."""
    return Path(root) / key[:24]


def find(root: os.PathLike, state: dict, store_sha256: str) -> Optional[LowerStates]:
    """A complete cache under ``root`` of exactly ``state``'s frozen layers (however many a cache there froze)
    over the passages of hash ``store_sha256``, or None; of several, the one of the most layers (the fewest left to
    run). A cache that cannot be read is passed over."""
    found = list(_matching(root, state, store_sha256))
    return max(found, key=lambda c: c.layers) if found else None


def _matching(root: os.PathLike, state: dict, store_sha256: str):
    for meta in sorted(Path(root).glob("*/" + META)):
        try:
            layers = int(json.loads(meta.read_text())["layers"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        key = tower_key(state, layers, store_sha256)
        if meta.parent != cache_dir(root, key):  # another tower's or other passages' (or a build not yet renamed)
            continue
        try:
            found = LowerStates(meta.parent)
        except (OSError, ValueError, KeyError):
            continue
        if found.meta.get("key") == key:
            yield found


class LowerStates(SharedOnCopy):
    """A complete cache, memory-mapped; :meth:`gather` hands the states of some rows to the trainable layers."""

    def __init__(self, directory: os.PathLike):
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / META).read_text())
        self.layers = int(self.meta["layers"])
        self.passages_sha256 = self.meta["passages_sha256"]
        self.offsets = np.load(self.directory / "offsets.npy")
        self.states = np.load(self.directory / "states.npy", mmap_mode="r")

    def __len__(self) -> int:
        return int(self.meta["count"])

    def gather(self, rows: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(hidden FloatTensor[U, T, H], attention_mask LongTensor[U, T]) of passages ``rows``, padded to the
        longest with zeros (masked)."""
        rows = [int(r) for r in rows]
        bad = [r for r in rows if not 0 <= r < len(self)]
        if bad:
            raise UserError(f"passage row {bad[0]} is not in the cached lower-layer states ({len(self)} passages)",
                            path=str(self.directory), fix="delete the folder: it is built again")
        lengths = [int(self.offsets[r + 1] - self.offsets[r]) for r in rows]
        hidden = np.zeros((len(rows), max(lengths, default=0), self.states.shape[1]), dtype=np.float32)
        mask = np.zeros(hidden.shape[:2], dtype=np.int64)
        for i, (r, n) in enumerate(zip(rows, lengths, strict=True)):
            hidden[i, :n] = self.states[self.offsets[r]:self.offsets[r] + n]
            mask[i, :n] = 1
        return torch.from_numpy(hidden), torch.from_numpy(mask)


def lower_states(tower, layers: int, key: str, store, tokenize: Callable[[list, list], List[List[int]]],
                 collate: Callable, root: os.PathLike, progress: bool = True) -> LowerStates:
    """The cache ``root/KEY`` of ``tower``'s first ``layers`` layers over every passage of ``store``, built (with a
    progress bar) unless complete. ``tokenize(titles, texts)`` -> token ids per passage as the tower reads them;
    ``collate(ids)`` -> its input tensors. ``key``: :func:`cache_key` of ``tower``'s frozen part."""
    directory = cache_dir(root, key)
    if (directory / META).is_file():
        return LowerStates(directory)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        lock = open(directory.with_suffix(".lock"), "a+")
    except OSError as e:
        raise UserError(f"cannot write the lower-layer cache ({e.strerror})", path=str(directory.parent),
                        fix="make the knowledge source's folder writable, or use --doc-encoder-train-layers 0") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it: wait for it
        if not (directory / META).is_file():
            _build(tower, layers, key, store, tokenize, collate, directory, progress)
            _note_other_caches(Path(root), directory)
    return LowerStates(directory)


def other_caches(root: Path, keep: Path) -> List[Tuple[Path, int]]:
    """The complete caches under ``root`` other than ``keep``, with their sizes in bytes."""
    out = []
    for meta in sorted(root.glob("*/" + META)):
        if meta.parent != keep:
            out.append((meta.parent, sum(f.stat().st_size for f in meta.parent.iterdir() if f.is_file())))
    return out


def _note_other_caches(root: Path, built: Path) -> None:
    """Caches are never removed (a run may still train against one): say what the older ones take, once per build."""
    try:
        others = other_caches(root, built)
    except OSError:
        return
    if others:
        size = sum(n for _, n in others) / 1e9
        logger.warning("%d older lower-layer cache(s) in %s take %.2f GB (%s): remove those no run trains against "
                       "(rm -r DIR)", len(others), root, size, ", ".join(p.name for p, _ in others))


def cache_bytes(count: int, tokens: int, hidden_size: int) -> int:
    """The size of a cache of ``count`` passages, ``tokens`` in all: float32 states and int64 offsets."""
    return int(tokens) * int(hidden_size) * 4 + (int(count) + 1) * 8


def check_disk(directory: Path, count: int, tokens: int, hidden_size: int, estimated: bool = False) -> None:
    """A one-line error unless the filesystem of ``directory`` has room for the cache with headroom (its
    :data:`HEADROOM_FRACTION` and :data:`HEADROOM_BYTES`): a cache written past a full disk would end the
    process mid-build (its states are a memory-mapped file)."""
    need = cache_bytes(count, tokens, hidden_size)
    free = shutil.disk_usage(directory).free
    if free >= need * (1 + HEADROOM_FRACTION) + HEADROOM_BYTES:
        return
    per = f"{'~' if estimated else ''}{tokens / max(count, 1):.0f}"
    raise UserError(f"the lower-layer cache of --doc-encoder-train-layers needs {_gb(need)} ({count:,} passages x "
                    f"{per} tokens x hidden size {hidden_size} x 4 bytes, plus {HEADROOM_FRACTION:.0%} headroom) but "
                    f"its disk has {_gb(free)} free", path=str(directory),
                    fix="train the whole document tower (--doc-encoder-train-layers 0: no cache; fewer trained "
                        "layers do not shrink it, it holds the frozen layers' output for every token), or free disk "
                        "or put the knowledge source on a larger disk")


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n < 1e10 else f"{n / 1e9:,.0f} GB"


def _estimated_tokens(store, tokenize, count: int) -> int:
    """The tokens of all ``count`` passages, from the mean of :data:`SAMPLE` spread over the store (its first ones
    for a store without row access)."""
    if hasattr(store, "title") and hasattr(store, "text"):
        rows = np.unique(np.linspace(0, count - 1, SAMPLE).round().astype(np.int64)).tolist()
        ids = tokenize([store.title(r) for r in rows], [store.text(r) for r in rows])
    else:
        titles, texts = zip(*itertools.islice(store.iter_titles_texts(), SAMPLE))
        ids = tokenize(list(titles), list(texts))
    return round(count * sum(len(x) for x in ids) / len(ids))


def _tokenized(store, tokenize, count: int, path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """(token ids int32[T], memory-mapped from ``path``; offsets int64[count + 1]) of every passage, tokenized
    :data:`TOKENIZE_WINDOW` at a time: the memory of tokenizing stays that of a window (a tokenizer's output for a
    whole store at once takes ~200 bytes a token)."""
    offsets = np.zeros(count + 1, dtype=np.int64)
    passages, done = iter(store.iter_titles_texts()), 0
    with open(path, "wb") as out:
        while done < count:
            window = list(itertools.islice(passages, min(TOKENIZE_WINDOW, count - done)))
            if not window:
                raise ValueError(f"the passage store yielded {done} passages of {count}")
            titles, texts = zip(*window)
            ids = tokenize(list(titles), list(texts))
            offsets[done + 1:done + 1 + len(ids)] = offsets[done] + np.cumsum([len(x) for x in ids])
            for x in ids:
                out.write(np.asarray(x, dtype=np.int32).tobytes())
            done += len(ids)
    tokens = int(offsets[-1])
    ids = np.memmap(path, dtype=np.int32, mode="r", shape=(tokens,)) if tokens else np.zeros(0, dtype=np.int32)
    return ids, offsets


def _build(tower, layers, key, store, tokenize, collate, directory: Path, progress: bool) -> None:
    partial = directory.with_suffix(".partial")
    shutil.rmtree(partial, ignore_errors=True)  # a build that died: its space is free for this one
    count = len(store)
    hidden_size = int(tower.bert_model.config.hidden_size)
    if count > SAMPLE:  # before tokenizing the whole store (minutes at scale)
        check_disk(directory.parent, count, _estimated_tokens(store, tokenize, count), hidden_size, estimated=True)
    partial.mkdir()
    ids, offsets = _tokenized(store, tokenize, count, partial / "ids.int32")
    try:
        check_disk(directory.parent, count, int(offsets[-1]), hidden_size)
    except UserError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _write_states(tower, layers, ids, offsets, collate, partial / "states.npy", hidden_size, progress)
    del ids
    (partial / "ids.int32").unlink()
    np.save(partial / "offsets.npy", offsets)
    meta = {"layers": int(layers), "count": count, "hidden_size": hidden_size, "tokens": int(offsets[-1]),
            "key": key, "passages_sha256": store.sha256}
    (partial / META).write_text(json.dumps(meta, indent=1))
    shutil.rmtree(directory, ignore_errors=True)  # an incomplete one (no meta.json) from elsewhere
    os.replace(partial, directory)


def _write_states(tower, layers: int, ids: np.ndarray, offsets: np.ndarray, collate, path: Path, hidden_size: int,
                  progress: bool) -> None:
    """The states of every passage after the tower's first ``layers`` layers, into ``path`` (float32[T, H])."""
    count = len(offsets) - 1
    param = next(tower.parameters())
    states = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(int(offsets[-1]), hidden_size))
    order = np.argsort(-np.diff(offsets), kind="stable")  # longest first: little padding per batch
    was_training = tower.training
    tower.eval()
    try:
        with torch.inference_mode(), tqdm(total=count, unit="passage", disable=not progress,
                                          desc=f"lower {layers} layers of the document encoder") as bar:
            for start in range(0, count, BATCH):
                rows = order[start:start + BATCH].tolist()
                batch = collate([ids[offsets[r]:offsets[r + 1]].astype(np.int64) for r in rows])  # writable
                out = tower.lower_states(*(t.to(param.device) for t in batch), layers=layers).float().cpu().numpy()
                for i, r in enumerate(rows):
                    states[offsets[r]:offsets[r + 1]] = out[i, :offsets[r + 1] - offsets[r]]
                bar.update(len(rows))
    finally:
        tower.train(was_training)
    states.flush()
