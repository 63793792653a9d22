#!/usr/bin/env python
"""Benchmark an index mapped once per node, sharded over processes, and the rank-0-serves-all design (issue 22).

    python benchmarks/index_sharing.py --demo-dir data/demo --json-out benchmarks/results/index_sharing.json
    python benchmarks/index_sharing.py --collections demo --paper-n 0 --batches 5     # a quick look

A benchmark, not a test: it asserts nothing and only reports (Markdown tables on stdout, everything in
``--json-out``, with the command, date and machine). Worker processes are started with
``torch.multiprocessing.spawn`` and talk over gloo on CPU; each uses ONE FAISS thread and one torch thread.

1. Memory and load time, for 1, 2 and 4 processes and each mode (see ``index_sharing_workers``: private copy,
   mapped once per node, sharded with S = N, rank 0 holding a copy): per process, ``/proc/self/smaps_rollup``
   Pss and Private (Private_Clean + Private_Dirty) after loading the index and running one search (a Flat search
   reads every page), minus before loading; the seconds to load and to run that first search (page cache warm:
   the files were just written or read). On the demo knowledge source (through ``KnowledgeSource``) and on a
   synthetic collection of ``--synthetic`` vectors (real demo vectors + jittered copies; index files only).
   Targets (issue 22): mapped, each extra process adds < 5% of the index's bytes (judged on each process's
   Private bytes: Pss also splits the pages with any other job mapping the same file); sharded over N, index
   bytes per process (Pss) <= 1.1/N of the whole.
2. Retrieval time per training batch (``--batch`` real questions per rank, K = ``--k``, document vectors
   returned), slowest rank per batch, median and p90 of ``--batches`` after ``--warmup``: private copies and
   mapped copies (no communication), sharded (``CollectiveSearch``) and rank-0-serves-all (gather, search,
   scatter). Same Flat index, same batches; rows are compared with the private copies'. Also the CPU seconds of
   the busiest rank per batch: the wall time on a machine with a free core per rank. Target: at 4 processes
   sharded takes at most half of rank-0-serves-all's time.
3. Paper scale on paper (``index_sharing_paper``): bytes/passage and recall@k against Flat of Flat, IVF-SQ8,
   HNSW32-SQ8 and IVF-PQ on the first ``--paper-n`` synthetic vectors, projected to 21M x 768.

Derived collections are built once under ``--work-dir`` (``index_sharing_data``); nothing is written beside the
demo source. A private-copy job is skipped (and reported so) when MemAvailable could not hold N copies.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import index_sharing_data as data  # noqa: E402
import index_sharing_report as report  # noqa: E402
import numpy as np  # noqa: E402
from retrieval_common import int_list, log, machine_info, versions  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--demo-dir", default="data/demo", help="output of examples/demo/prepare_demo_data.py")
    p.add_argument("--demo-ks", default=None, help="the demo knowledge source (default: DEMO_DIR/ks)")
    p.add_argument("--work-dir", default="/tmp/index_sharing", help="derived collections and scratch (reused)")
    p.add_argument("--collections", default="demo,synthetic")
    p.add_argument("--synthetic", type=int, default=2_000_000, help="vectors in the synthetic collection")
    p.add_argument("--jitter", type=float, default=1.0, help="relative norm of the noise on the real vectors")
    p.add_argument("--processes", default="1,2,4")
    p.add_argument("--modes", default="private,shared,sharded,rank0")
    p.add_argument("--batch", type=int, default=8, help="questions per rank per training batch")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="timed batches on the demo source")
    p.add_argument("--synthetic-batches", type=int, default=10, help="timed batches on the synthetic collection")
    p.add_argument("--queries", type=int, default=1000, help="real questions encoded (reused round-robin)")
    p.add_argument("--mem-margin-gib", type=float, default=3.0, help="MemAvailable kept free by private copies")
    p.add_argument("--paper-n", type=int, default=500_000, help="synthetic vectors for the paper table (0: skip)")
    p.add_argument("--paper-factories", default="Flat;IVF{nlist},SQ8;HNSW32,SQ8;IVF{nlist},PQ32np;IVF{nlist},PQ48np")
    p.add_argument("--paper-nprobe", default="16,64")
    p.add_argument("--paper-ef-search", default="64,256")
    p.add_argument("--paper-nlist", type=int, default=0, help="IVF lists (0: ~4 sqrt(n), >= 39 training vectors each)")
    p.add_argument("--paper-train-size", type=int, default=65536)
    p.add_argument("--paper-nlist-target", type=int, default=0,
                   help="IVF lists at paper scale (0: ~4 sqrt(passages), a power of two)")
    p.add_argument("--paper-passages", type=int, default=21_000_000)
    p.add_argument("--paper-dim", type=int, default=768)
    p.add_argument("--node-ram-gib", type=int, default=256, help="RAM per node usable for the index")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--resume", action="store_true", help="keep the jobs already in --json-out")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def prepare(args) -> Dict[str, Dict]:
    """The collections: name -> {whole_dir, sharded {N: dir}, info}."""
    demo_dir = Path(args.demo_dir)
    demo_ks = Path(args.demo_ks or demo_dir / "ks")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    wanted = args.collections.split(",")
    ns = [n for n in int_list(args.processes) if n > 1]
    out = {}
    if "demo" in wanted:
        out["demo"] = {"whole_dir": demo_ks, "sharded": {n: data.shard_demo(demo_ks, work, n) for n in ns}}
    if "synthetic" in wanted:
        base = data.synthetic_base(demo_ks, work, args.synthetic, args.jitter, 0)
        out["synthetic"] = {"whole_dir": base, "sharded": {n: data.synthetic_shards(base, n) for n in ns}}
    for c in out.values():
        c["info"] = data.collection_info(c["whole_dir"])
        for n, d in c["sharded"].items():
            c.setdefault("sharded_bytes", {})[str(n)] = data.collection_info(d)["index_bytes"]
    return out


def run_collection(name: str, coll: Dict, queries_path: Path, args, result: Dict, save) -> None:
    from index_sharing_workers import run_job

    info = coll["info"]
    entry = result["collections"].setdefault(name, {**info, "whole_dir": str(coll["whole_dir"]),
                                                    "sharded_index_bytes": coll.get("sharded_bytes", {}),
                                                    "jobs": {}, "skipped": []})
    batches = args.batches if name == "demo" else args.synthetic_batches
    private_rows = {}
    for n in int_list(args.processes):
        for mode in args.modes.split(","):
            if str(n) in entry["jobs"].get(mode, {}):
                continue
            copies = n if mode == "private" else (1 if mode == "rank0" else 0)
            need = copies * info["index_bytes"] + args.mem_margin_gib * 2 ** 30
            if copies and mem_available() < need:
                entry["skipped"].append(f"{mode} N={n}: MemAvailable {mem_available() / 2 ** 30:.1f} GiB < "
                                        f"{need / 2 ** 30:.1f} GiB needed")
                log(entry["skipped"][-1])
                continue
            cfg = {"mode": mode, "world": n, "whole_dir": str(coll["whole_dir"]),
                   "sharded_dir": str(coll["sharded"].get(n, "")), "queries": str(queries_path),
                   "batch": args.batch, "k": args.k, "warmup": args.warmup, "batches": batches,
                   "info": {"count": info["count"], "dim": info["dim"]},
                   "out_dir": str(Path(args.work_dir) / "run")}
            load = os.getloadavg()[0]
            log(f"{name}: {mode} with {n} processes (load average {load:.2f})")
            t0 = time.perf_counter()
            ranks = run_job(cfg)
            job = report.summarize_job(ranks, info["index_bytes"])
            job.update({"loadavg_1m_before": load, "wall_s": time.perf_counter() - t0})
            rows = [r.get("rows") for r in ranks]
            if mode == "private":
                private_rows[n] = rows
            if n in private_rows and rows[0] is not None:
                job["same_rows_as_private"] = float(np.mean([np.mean(a == b) for a, b in
                                                             zip(rows, private_rows[n], strict=True)]))
            entry["jobs"].setdefault(mode, {})[str(n)] = job
            save()
    report.add_targets(entry)
    save()


def paper(args, result: Dict, colls: Dict, queries: np.ndarray, save) -> None:
    import index_sharing_paper as paper_scale

    base = Path(colls["synthetic"]["whole_dir"]) if "synthetic" in colls else None
    if base is None or args.paper_n <= 0:
        return
    demo_ks = Path(args.demo_ks or Path(args.demo_dir) / "ks")
    store = sum(f.stat().st_size for f in (demo_ks / "passages").iterdir()) / data.collection_info(demo_ks)["count"]
    rows = paper_scale.measure(base / "vectors.npy", min(args.paper_n, args.synthetic), queries, args)
    result["paper"] = paper_scale.project(rows, colls["synthetic"]["info"]["dim"], args, store)
    save()


def markdown(result: Dict, args) -> str:
    earlier = [f"Earlier runs whose jobs this one kept (--resume): {'; '.join(result['earlier_commands'])}"
               ] if result.get("earlier_commands") else []
    lines = [f"Command: `{result['command']}`", f"Date: {result['date']}", *earlier,
             f"Machine: {result['machine'].get('cpu', '?')}, {result['machine']['affinity']} cores, "
             f"{result['machine'].get('mem_gib', '?')} GiB RAM; torch {result['versions'].get('torch')}, faiss "
             f"{result['versions'].get('faiss')}; every process: 1 FAISS thread, 1 torch thread, gloo on CPU."]
    for name, coll in result["collections"].items():
        lines += report.memory_table(name, coll)
        lines += report.timing_table(name, coll, args.batch, args.k)
        lines += report.targets_table(name, coll)
        lines += ["", f"Skipped: {'; '.join(coll['skipped'])}"] if coll.get("skipped") else []
    if "paper" in result:
        lines += report.paper_table(result["paper"])
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out_path = Path(args.json_out) if args.json_out else None
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "args": vars(args),
              "machine": machine_info(), "versions": versions(), "loadavg_start": os.getloadavg(),
              "threads": {"faiss": 1, "torch": 1, "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]},
              "collections": {}}
    if args.resume and out_path and out_path.is_file():
        old = json.loads(out_path.read_text(encoding="utf-8"))
        result["collections"] = old.get("collections", {})
        result["earlier_commands"] = old.get("earlier_commands", []) + [f"{old.get('date')}: {old.get('command')}"]
        if "paper" in old:
            result["paper"] = old["paper"]

    def save():
        if out_path:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(result, indent=1, default=float) + "\n", encoding="utf-8")

    colls = prepare(args)
    queries_path = Path(args.work_dir) / f"queries_{args.queries}.npy"
    queries = data.query_vectors(Path(args.demo_ks or Path(args.demo_dir) / "ks"), Path(args.demo_dir),
                                 Path(args.work_dir), args.queries)
    for name, coll in colls.items():
        run_collection(name, coll, queries_path, args, result, save)
    paper(args, result, colls, queries, save)
    result["loadavg_end"] = os.getloadavg()
    result["markdown"] = markdown(result, args)
    save()
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
