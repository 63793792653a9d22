#!/usr/bin/env python
"""The plugin's training step inside ``fairseq-train`` against the same step in the hand-written
loop of ``rag_speed.py``: what fairseq's trainer adds (gradient norm, metrics, its optimizer
wrapper) and what the choice of ``--optimizer`` costs, on the tiny world of rag_speed.py.

    .venv/bin/python benchmarks/fairseq_train_speed.py [--rounds 3] [--updates 24] [--threads 2]

Each of ``--rounds`` rounds runs: the hand loop (RAG-Token, targets of <= 8 tokens, batch 8,
K = 5, fused AdamW), ``fairseq-train`` with ``--optimizer torch_adamw``, ``fairseq-train`` with
``--optimizer adam`` (the two fairseq-train runs swap places every other round). Reported: the
median over rounds of each contestant's median, and each ÷ the hand loop of the same round.
fairseq-train runs as the real CLI in a subprocess with the
benchmark model's sizes (BART d=256 3+3 layers, BART initialisation, the knowledge source's
question encoder), ``--log-interval 1``; its time per update is 1/``ups`` of each update after the
first three (fairseq's own speed meter, which starts after data loading; rounded by fairseq to
0.01 updates/s, ~0.5% here). Milliseconds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

import torch  # noqa: E402
import world as world_mod  # noqa: E402
from world import SPEC  # noqa: E402

WARMUP = 3


def hand_loop_ms(world: Path, updates: int) -> float:
    from plugin_side import PluginSide

    step = PluginSide(world, adam="fused").trainer("token", 8)
    times = []
    for i in range(WARMUP + updates):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:]) * 1e3


def fairseq_train_cmd(world: Path, optimizer: str, updates: int, save_dir: Path) -> list:
    g = SPEC["generator"]
    return [str(Path(sys.executable).parent / "fairseq-train"), str(world / "qa_t8"),
            "--user-dir", str(ROOT / "rag_plugin"), "--task", "retrieval_augmented",
            "--knowledge", str(world / "ks"), "--n-docs", str(SPEC["n_docs"]), "--max-query-tokens", "64",
            "--arch", "rag_token_tiny", "--generator-embed-dim", str(g["d_model"]),
            "--generator-layers", str(g["layers"]), "--generator-heads", str(g["heads"]),
            "--generator-ffn-dim", str(g["ffn"]), "--dropout", str(g["dropout"]), "--attention-dropout", "0",
            "--activation-dropout", "0", "--max-source-positions", str(g["positions"]),
            "--max-target-positions", str(g["positions"]), "--generator-init", "bart",
            "--criterion", "marginal_nll", "--optimizer", optimizer, "--lr", "1e-5",
            "--batch-size", str(SPEC["batch_size"]), "--required-batch-size-multiple", "1",
            "--max-update", str(WARMUP + updates), "--disable-validation", "--no-save", "--save-dir", str(save_dir),
            "--cpu", "--num-workers", "0", "--seed", "1", "--log-format", "json", "--log-interval", "1",
            "--no-progress-bar"]


def fairseq_train_ms(world: Path, optimizer: str, updates: int, threads: int, tmp: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = fairseq_train_cmd(world, optimizer, updates, tmp / optimizer)
    print("$ " + " ".join(cmd[1:]), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"fairseq-train --optimizer {optimizer} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    ups = []
    for line in (proc.stdout + proc.stderr).splitlines():
        start = line.find("{")
        if "train_inner" in line and start >= 0:
            record = json.loads(line[start:])
            ups.append((int(record["num_updates"]), float(record["ups"])))
    timed = [1e3 / u for n, u in sorted(ups) if n > WARMUP]
    if len(timed) < updates // 2:
        raise SystemExit(f"fairseq-train --optimizer {optimizer}: only {len(timed)} timed updates in its log")
    return statistics.median(timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="where rag_speed.py builds its tiny world")
    ap.add_argument("--updates", type=int, default=24, help="timed updates per run (after 3 warm-up updates)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (hand loop, fairseq-train x2)")
    ap.add_argument("--threads", type=int, default=SPEC["threads"])
    ap.add_argument("--json-out", default=str(HERE / ".cache" / "fairseq_train_speed.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    world = world_mod.build(args.cache, log=lambda m: print(m, file=sys.stderr))
    tmp = Path(args.cache) / "fairseq_train_speed"
    tmp.mkdir(parents=True, exist_ok=True)
    res = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv,
           "loadavg_start": os.getloadavg(), "rounds": []}
    optimizers = ["torch_adamw", "adam"]
    for r in range(args.rounds):
        row = {"hand loop": hand_loop_ms(world, args.updates)}
        for optimizer in optimizers if r % 2 == 0 else optimizers[::-1]:
            row[f"fairseq-train --optimizer {optimizer}"] = fairseq_train_ms(world, optimizer, args.updates,
                                                                             args.threads, tmp)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()), file=sys.stderr)
        res["rounds"].append(row)
    res["loadavg_end"] = os.getloadavg()
    names = list(res["rounds"][0])
    res["median_ms"] = {n: statistics.median(row[n] for row in res["rounds"]) for n in names}
    res["median_ratio_to_hand_loop"] = {n: statistics.median(row[n] / row["hand loop"] for row in res["rounds"])
                                        for n in names}
    print(f"| RAG-Token T=8, batch 8, K=5 ({args.rounds} rounds) | ms per update (median) | ÷ hand loop "
          "(median of per-round ratios) |")
    print("|---|---:|---:|")
    for n in names:
        print(f"| {n} | {res['median_ms'][n]:.1f} | {res['median_ratio_to_hand_loop'][n]:.3f} |")
    from rag_plugin.util.io import atomic_write_json

    atomic_write_json(args.json_out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
