"""The index-sharing benchmark's worker processes (``torch.multiprocessing.spawn``, gloo on CPU, one FAISS and
one torch thread each): load the index the way a mode says, measure the process's memory, then time the
retrieval of training batches with that mode's design. Each rank writes ``rank{r}.json`` into the run's folder.

Modes (what every rank of an N-process job holds, and how a batch is retrieved):

* ``private``: a private copy of the whole index (``read_index_as(.., "private")``); every rank searches its
  own copy, no communication (today's design).
* ``shared``: the whole index mapped (``read_index_as(.., "shared")``): one copy per node in the page cache;
  every rank searches it, no communication.
* ``sharded``: S = N shards, rank r maps shard r; :class:`~rag_plugin.retrieval.collective.CollectiveSearch`
  (all-gather of the questions, each rank searches its shard, one all-to-all of candidates, exact merge).
* ``rank0``: the contestant (transformers' RAG design): rank 0 holds a private copy of the whole index, the
  others nothing; the questions are gathered to rank 0, which searches them all and scatters rows, scores
  and document vectors back.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

SMAPS_FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Private_Clean", "Private_Dirty", "Anonymous")


def smaps() -> Dict[str, int]:
    """This process's memory, bytes (``/proc/self/smaps_rollup``), plus ``Private`` = Private_Clean + Private_Dirty."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        if name in SMAPS_FIELDS:
            out[name] = int(value.split()[0]) * 1024
    out["Private"] = out["Private_Clean"] + out["Private_Dirty"]
    return out


def index_file_pss() -> int:
    """Pss, bytes, of this process's mappings of FAISS index files (``*.faiss``): a mapped index's share."""
    total, counting = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(None, 1)
        if head and "-" in head[0] and not head[0].endswith(":"):  # a mapping's header line
            counting = line.rstrip().endswith(".faiss")
        elif counting and line.startswith("Pss:"):
            total += int(line.split()[1]) * 1024
    return total


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _bare_part(directory: Path, number: int, mode: str):
    """Shard ``number`` (or the whole index) of a synthetic directory (index files + ``bench.json``)."""
    from rag_plugin.retrieval.index import read_index_as
    from rag_plugin.retrieval.parts import IndexPart

    meta = json.loads((directory / "bench.json").read_text(encoding="utf-8"))
    shards = meta.get("shards")
    if shards:
        entry = shards[number]
        index_path, vectors_path, start = directory / entry["index"], directory / entry["vectors"], entry["start"]
    else:
        index_path, vectors_path, start = directory / "index.faiss", directory / "vectors.npy", 0
    index, how = read_index_as(str(index_path), mode)
    vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
    return IndexPart(index, vectors, start, how, str(index_path))


def open_collection(directory: str, mode: str):
    """A function shard number -> index part, read as ``mode`` ("shared"/"private"): through
    :class:`~rag_plugin.retrieval.knowledge.KnowledgeSource` for a knowledge source (opened now: manifest, passage
    store and vectors mapped), else from the bare files."""
    d = Path(directory)
    if (d / "manifest.json").is_file():
        from rag_plugin.retrieval.knowledge import KnowledgeSource

        return KnowledgeSource(str(d), index_mode=mode).part
    return lambda number: _bare_part(d, number, mode)


def _holdings(cfg: Dict, rank: int):
    """(directory, shard numbers, read mode) this rank loads under ``cfg['mode']``."""
    mode, world = cfg["mode"], cfg["world"]
    if mode == "sharded" and world > 1:
        return cfg["sharded_dir"], [rank], "shared"
    if mode == "rank0":
        return cfg["whole_dir"], ([0] if rank == 0 else []), "private"
    return cfg["whole_dir"], [0], ("private" if mode == "private" else "shared")


def _rank0_search(local, queries: np.ndarray, k: int, dim: int, rank: int, world: int):
    """The contestant: gather the questions to rank 0, search there, scatter (score, row, vector) back."""
    import torch
    import torch.distributed as dist

    q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32))
    b = len(queries)
    received = torch.empty((b, k, dim + 3), dtype=torch.float32)
    if rank == 0:
        gathered = [torch.empty_like(q) for _ in range(world)]
        dist.gather(q, gathered, dst=0)
        everyone = torch.cat(gathered).numpy()
        s, r, v = local.search(everyone, k, threads=1, with_vectors=True)
        packed = np.concatenate([s[:, :, None], r.view(np.float32).reshape(len(everyone), k, 2), v], axis=2)
        chunks = [c.contiguous() for c in torch.from_numpy(np.ascontiguousarray(packed)).split(b)]
        dist.scatter(received, chunks, src=0)
    else:
        dist.gather(q, None, dst=0)
        dist.scatter(received, None, src=0)
    got = received.numpy()
    rows = np.ascontiguousarray(got[:, :, 1:3]).view(np.int64).reshape(b, k)
    return got[:, :, 0], rows, got[:, :, 3:]


def _searcher(cfg: Dict, parts: list, rank: int, info: Dict):
    """A function queries -> (scores, rows, vectors) for this mode."""
    from rag_plugin.retrieval.collective import CollectiveSearch
    from rag_plugin.retrieval.parts import LocalSearch
    from rag_plugin.retrieval.shards import assign_holders

    k, count, dim, world = cfg["k"], info["count"], info["dim"], cfg["world"]
    if cfg["mode"] == "sharded":
        numbers = [rank] if world > 1 else [0]
        search = CollectiveSearch(dict(zip(numbers, parts)), assign_holders(world, world, "rank"), count, dim)
        return lambda q: search.search(q, k, threads=1, with_vectors=True)
    local = LocalSearch(parts, count, dim)
    if cfg["mode"] == "rank0":
        return lambda q: _rank0_search(local, q, k, dim, rank, world)
    return lambda q: local.search(q, k, threads=1, with_vectors=True)


def _time_batches(cfg: Dict, search, queries: np.ndarray, rank: int):
    import torch.distributed as dist

    world, b = cfg["world"], cfg["batch"]
    times, cpu, rows = [], [], []
    for step in range(cfg["warmup"] + cfg["batches"]):
        start = ((step * world + rank) * b) % (len(queries) - b + 1)
        q = queries[start:start + b]
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        _, r, v = search(q)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if step >= cfg["warmup"]:
            times.append(dt)
            cpu.append(dc)
            rows.append(r)
    return times, cpu, np.concatenate(rows)


def worker(rank: int, cfg: Dict) -> None:
    import faiss
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=cfg["world"])
    queries = np.load(cfg["queries"])
    directory, numbers, read_mode = _holdings(cfg, rank)
    dist.barrier()
    t0 = time.perf_counter()
    part = open_collection(directory, read_mode)
    out: Dict = {"rank": rank, "open_s": time.perf_counter() - t0, "before": smaps()}
    t0 = time.perf_counter()
    parts = [part(n) for n in numbers]
    out["load_s"] = time.perf_counter() - t0
    out["how"] = [p.how for p in parts]
    out["index_rows"] = sum(int(p.index.ntotal) for p in parts)
    out["after_load"] = smaps()
    t0 = time.perf_counter()
    for p in parts:  # a Flat search reads every code: every page of the index is touched
        p.search(queries[:cfg["batch"]], cfg["k"], threads=1)
    out["first_search_s"] = time.perf_counter() - t0
    dist.barrier()
    out["after_touch"] = smaps()  # every rank holds (and has touched) its part now
    out["index_file_pss"] = index_file_pss()
    dist.barrier()
    if cfg["batches"]:
        search = _searcher(cfg, parts, rank, cfg["info"])
        times, cpu, rows = _time_batches(cfg, search, queries, rank)
        out["batch_s"], out["batch_cpu_s"] = times, cpu
        np.save(Path(cfg["out_dir"]) / f"rows{rank}.npy", rows)
    out["peak_rss"] = peak_rss()
    (Path(cfg["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(out), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(cfg: Dict) -> List[Dict]:
    """Spawn ``cfg['world']`` workers; their ``rank{r}.json`` results (with ``rows`` of the timed batches)."""
    import torch.multiprocessing as mp

    out_dir = Path(cfg["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("r*"):
        old.unlink()
    cfg = {**cfg, "port": free_port()}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(worker, args=(cfg,), nprocs=cfg["world"], join=True)
    results = []
    for r in range(cfg["world"]):
        res = json.loads((out_dir / f"rank{r}.json").read_text(encoding="utf-8"))
        if (out_dir / f"rows{r}.npy").is_file():
            res["rows"] = np.load(out_dir / f"rows{r}.npy")
        results.append(res)
    return results
