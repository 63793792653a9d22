#!/usr/bin/env python
"""What training the document encoder costs on CPU, and what a background re-index costs while training.

    python benchmarks/reindex_cost.py --passages 1000 --updates 12 --reindex-every 4 \
        --json-out benchmarks/results/reindex_cost.json

A benchmark, not a test: it reports only. A knowledge source of the first ``--passages`` passages of the demo's
Wikipedia summaries (MiniLM, Flat; the demo's generator vocabulary) is built once; then the demo's RAG-Token
recipe (examples/demo/config/rag_token_tiny.yaml: batch 32, K=3, the tiny generator from scratch) trains for
``--updates`` updates on nq_demo, three ways, each a real ``fairseq-train``:

* ``query``: today's default, the query encoder trained, the stored document vectors fixed;
* ``doc``: ``--train-doc-encoder`` (each retrieved passage encoded again, with gradient, in every step);
* ``doc_reindex``: the same with ``--reindex-every``, so background re-indexes run beside training
  (``--reindex-wait-at-exit``: the last one lands before the run ends);
* ``top1`` and ``top1_reindex``: the same two with ``--doc-encoder-train-layers 1`` (MiniLM's top layer trained, the
  lower five frozen and computed once per passage: the cache's build is in the first update, left out of the mean;
  the re-indexes run only the top layer).

``--runs`` picks some of them (default: all).

Reported: seconds per update of each run (mean over the updates after the first two, from fairseq's per-update
log lines), each re-index's duration and the update its version was read from (from the trainer's log), and the
knowledge source's embedding time (a re-index embeds as many passages).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "demo"))

from demo_run import recipe  # noqa: E402  (examples/demo/demo_run: the demo's recipe as command lines)

from rag_plugin.pipeline.recipes import run_settings, train_args  # noqa: E402

DATA = ROOT / "data" / "demo"
RUNS = {"query": {}, "doc": {"model.train_doc_encoder": True},
        "doc_reindex": {"model.train_doc_encoder": True, "task.reindex_wait_at_exit": True},
        "top1": {"model.train_doc_encoder": True, "model.doc_encoder_train_layers": 1},
        "top1_reindex": {"model.train_doc_encoder": True, "model.doc_encoder_train_layers": 1,
                         "task.reindex_wait_at_exit": True}}
TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
WROTE = re.compile(r"wrote knowledge version (\d+) in ([\d.]+)s")
READ_FROM = re.compile(r"knowledge version (\d+) \(was \d+\) is read from update (\d+)")
ENDED = re.compile(r"the re-index started at update (\d+) ended \(exit (\d+)\) after ([\d.]+)s")


def build_source(args, work: Path) -> Path:
    ks = work / "ks"
    if (ks / "manifest.json").is_file():
        return ks
    passages = work / "passages.jsonl"
    with open(DATA / "wiki_passages.jsonl") as src, open(passages, "w") as out:
        for _, line in zip(range(args.passages), src):
            out.write(line)
    subprocess.run([sys.executable, "-m", "rag_plugin.cli.build_knowledge", "--passages", str(passages),
                    "--out", str(ks), "--encoder", "minilm", "--index-factory", "Flat", "--split-words", "100",
                    "--dict", str(DATA / "dict.txt"), "--bpe-model", str(DATA / "spm.model"), "--quiet"],
                   check=True, cwd=ROOT)
    return ks


def seconds_per_update(log: str) -> float:
    """Mean wall seconds between consecutive per-update log lines (--log-interval 1), the first two left out."""
    stamps = [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
              for line in log.splitlines() if "train_inner" in line and (m := TIME.match(line))]
    gaps = [b - a for a, b in zip(stamps[2:], stamps[3:])]
    return round(sum(gaps) / len(gaps), 2) if gaps else float("nan")


def train(name: str, extra: dict, args, ks: Path, work: Path) -> dict:
    run = run_settings(DATA / "nq_demo", ks, work / f"ckpt_{name}", args.updates)
    run.update({"common.log_interval": 1, "dataset.validate_interval_updates": 0})
    if name.endswith("_reindex"):
        run["task.reindex_every"] = args.reindex_every
    config = recipe.train_config({"config": "rag_token_tiny", "set": extra}, run)
    argv = [str(Path(sys.executable).parent / "fairseq-train"), *train_args(config), "--disable-validation",
            "--no-save"]
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (work / f"train_{name}.log").write_text(log)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: fairseq-train failed, see {work / f'train_{name}.log'}")
    return {"seconds_per_update": seconds_per_update(log), "wall_s": round(time.perf_counter() - started, 1),
            "reindexes": [{"version": int(v), "seconds": float(s)} for v, s in WROTE.findall(log)],
            "switches": [{"version": int(v), "from_update": int(u)} for v, u in READ_FROM.findall(log)],
            # a re-index still running when training ends (waited for: --reindex-wait-at-exit)
            "ended_at_exit": [{"started_update": int(u), "exit": int(c), "seconds": float(t)}
                              for u, c, t in ENDED.findall(log)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=1000, help="passages of the benchmark's knowledge source")
    ap.add_argument("--updates", type=int, default=12, help="updates of each training run")
    ap.add_argument("--reindex-every", type=int, default=4, help="--reindex-every of the doc_reindex run")
    ap.add_argument("--work", default="runs/reindex_cost", help="where the source, logs and checkpoints go")
    ap.add_argument("--json-out", default="benchmarks/results/reindex_cost.json")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which runs, comma-separated (of {', '.join(RUNS)})")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.runs.split(",")) - set(RUNS))
    if unknown:
        ap.error(f"--runs: unknown {', '.join(unknown)} (known: {', '.join(RUNS)})")
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ks = build_source(args, work)
    manifest = json.loads((ks / "manifest.json").read_text())
    results = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu_cores": os.cpu_count(),
               "torch_threads": os.environ.get("OMP_NUM_THREADS", "default"), "passages": manifest.get("count"),
               "embedding_seconds": manifest.get("embedding_seconds"), "updates": args.updates,
               "reindex_every": args.reindex_every, "runs": {}}
    for name in args.runs.split(","):
        extra = RUNS[name]
        results["runs"][name] = train(name, extra, args, ks, work)
        print(name, json.dumps(results["runs"][name]), flush=True)
    out = ROOT / args.json_out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
