#!/usr/bin/env python
"""Two-rank demo training on the mapped index vs ``--private-index`` (issue 22, benchmark 4).

    python benchmarks/index_sharing_train.py --demo-dir data/demo --updates 30 --json-out /tmp/train.json

Runs the demo's RAG-Token recipe (examples/demo/config/rag_token_tiny.yaml, composed as run_demo.py does,
starting from ``--init`` (a pretrained demo generator) when given) twice under
``torchrun --nproc-per-node 2 --no-python scripts/train_cpu_ddp.sh`` (gloo, one thread per rank): once with the
index mapped (the default), once with ``--private-index``; same seed, data and batches. A small driver
(``FAIRSEQ_TRAIN``) wraps ``FairseqTask.train_step`` to time each update and count its examples, and at exit
records each rank's peak RSS (VmHWM), ``smaps_rollup`` Pss/Private and the Pss of its ``*.faiss`` mappings.
Reported: examples/s per rank after ``--skip`` warm-up updates, peak memory per rank, and whether the
per-update training losses rank 0 logs are identical. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = '''#!{python}
"""fairseq-train that records per-update times and examples and the process's memory at exit."""
import atexit, json, os, sys, time
import fairseq_cli.train
from fairseq.tasks import FairseqTask

OUT, RANK = os.environ["INDEX_SHARING_OUT"], os.environ.get("RANK", "0")
steps, last = [], {{}}
_train_step = FairseqTask.train_step


def train_step(self, sample, *args, **kwargs):
    t0 = time.perf_counter()
    out = _train_step(self, sample, *args, **kwargs)
    steps.append([t0, time.perf_counter(), int(sample["nsentences"]) if sample else 0])
    last.update(memory())  # while the task (and its index) is alive, after the timed step
    return out


FairseqTask.train_step = train_step


def memory():
    rec = {{}}
    for line in open("/proc/self/smaps_rollup").read().splitlines()[1:]:
        k, v = line.split(":", 1)
        rec[k] = int(v.split()[0]) * 1024
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            rec["VmHWM"] = int(line.split()[1]) * 1024
    faiss_pss, on = 0, False
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split(None, 1)
        if head and "-" in head[0] and not head[0].endswith(":"):
            on = line.rstrip().endswith(".faiss")
        elif on and line.startswith("Pss:"):
            faiss_pss += int(line.split()[1]) * 1024
    rec["faiss_file_pss"] = faiss_pss
    return rec


def dump():
    with open(os.path.join(OUT, f"rank{{RANK}}.json"), "w") as fh:
        json.dump({{"steps": steps, "memory": last, "exit": memory()}}, fh)


atexit.register(dump)
sys.argv[0] = "fairseq-train"
fairseq_cli.train.cli_main()
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--demo-dir", default="data/demo")
    p.add_argument("--knowledge", default=None, help="default: DEMO_DIR/ks")
    p.add_argument("--init", default=None, help="pretrained generator checkpoint (model.generator_checkpoint)")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="warm-up updates left out of examples/s")
    p.add_argument("--work-dir", default="/tmp/index_sharing_train")
    p.add_argument("--json-out", default=None)
    return p.parse_args(argv)


def train_command(args, save_dir: Path) -> list:
    sys.path.insert(0, str(ROOT / "examples" / "demo"))
    from demo_run.recipe import compose_config

    from rag_plugin.pipeline.recipes import run_settings, train_args

    demo = Path(args.demo_dir)
    settings = run_settings(demo / "nq_demo", Path(args.knowledge or demo / "ks"), save_dir, args.updates,
                            init=Path(args.init) if args.init else None)
    cfg = compose_config("rag_token_tiny", [settings, {"common.user_dir": str(ROOT / "rag_plugin"),
                                                       "common.log_interval": 1}])
    return train_args(cfg) + ["--no-save", "--disable-validation"]


def run(args, mode: str) -> dict:
    out = Path(args.work_dir) / mode
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    driver = Path(args.work_dir) / "driver.py"
    driver.write_text(DRIVER.format(python=sys.executable), encoding="utf-8")
    driver.chmod(driver.stat().st_mode | stat.S_IXUSR)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           str(ROOT / "scripts" / "train_cpu_ddp.sh"), *train_command(args, out / "ckpt")]
    if mode == "private":
        cmd.append("--private-index")
    env = dict(os.environ, INDEX_SHARING_OUT=str(out), FAIRSEQ_TRAIN=str(driver), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    (out / "train.log").write_text(log, encoding="utf-8")
    if proc.returncode != 0:
        return {"error": log[-3000:], "command": cmd}
    losses = [_training_values(line) for line in log.splitlines() if "| train_inner |" in line]
    ranks = []
    for r in (0, 1):
        rec = json.loads((out / f"rank{r}.json").read_text(encoding="utf-8"))
        steps = rec["steps"][args.skip:]
        seconds = steps[-1][1] - steps[0][0] if steps else float("nan")
        examples = sum(s[2] for s in steps)
        m = rec["memory"]
        ranks.append({"updates": len(rec["steps"]), "examples_per_s": examples / seconds if steps else None,
                      "peak_rss_mib": m["VmHWM"] / 2 ** 20, "pss_end_mib": m["Pss"] / 2 ** 20,
                      "private_end_mib": (m["Private_Clean"] + m["Private_Dirty"]) / 2 ** 20,
                      "faiss_file_pss_mib": m["faiss_file_pss"] / 2 ** 20})
    return {"command": " ".join(cmd), "wall_s": wall, "loadavg_1m_before": load, "losses": losses,
            "ranks": ranks, "index_log": [ln for ln in log.splitlines() if "index" in ln.lower()][:5]}


TIMING_KEYS = ("wps", "ups", "wall", "train_wall")


def _training_values(line: str) -> str:
    """A train_inner log line's numbers other than timings (loss, nll_loss, gnorm, document statistics...)."""
    pairs = re.findall(r"(\w+)=([^,\s]+)", line)
    return ", ".join(f"{k}={v}" for k, v in pairs if k not in TIMING_KEYS)


def markdown(result: dict) -> str:
    lines = ["| index | rank | examples/s | peak RSS MiB | Pss at end MiB | Private at end MiB | mapped .faiss "
             "Pss MiB |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for mode, res in result["runs"].items():
        if "error" in res:
            lines.append(f"| {mode} | failed | | | | | |")
            continue
        for r, rank in enumerate(res["ranks"]):
            lines.append(f"| {mode} | {r} | {rank['examples_per_s']:.1f} | {rank['peak_rss_mib']:,.0f} | "
                         f"{rank['pss_end_mib']:,.0f} | {rank['private_end_mib']:,.0f} | "
                         f"{rank['faiss_file_pss_mib']:.1f} |")
    same = result.get("losses_identical")
    lines += ["", f"Per-update training losses (rank 0's log, {result.get('n_losses', 0)} updates) identical: "
                  f"{'yes' if same else 'NO' if same is not None else 'not compared'}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]), "args": vars(args), "runs": {}}
    for mode in ("mapped", "private"):
        print(f"[bench] training with the {mode} index", file=sys.stderr, flush=True)
        result["runs"][mode] = run(args, mode)
    runs = result["runs"]
    if all("losses" in r for r in runs.values()):
        a, b = runs["mapped"]["losses"], runs["private"]["losses"]
        result["losses_identical"] = bool(a) and a == b
        result["n_losses"] = len(a)
    result["markdown"] = markdown(result)
    print(result["markdown"])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
