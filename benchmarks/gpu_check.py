#!/usr/bin/env python
"""The first thing to run when a GPU is lent: rag_plugin's GPU training path, exercised and measured in one go.

    .venv/bin/python benchmarks/gpu_check.py --json-out benchmarks/results/gpu_check.json   # one GPU, ~5-8 minutes
    .venv/bin/python benchmarks/gpu_check.py --cpu                                         # tiny sizes (CI: ~2 min)

On the tiny benchmark world of world.py (10,000 synthetic passages, a random DPR-shaped question encoder and its
exact index, 64 questions, byte-level BPE 8000; built once under ``--cache``):

1. **training**: fairseq-train (through gpu_check_train.py: rag-train that also records each update's norm and
   loss scale) of ``rag_token`` and ``fid`` at the bart.base shape (d 768, 6+6 layers, 12 heads, random weights,
   this world's 8,000-entry vocabulary) under ``--fp16`` and under ``--amp``, ``--updates`` updates each, K=5,
   batch 8, torch_adamw. Per update: loss, gradient norm, loss scale, update norm, whether it was skipped.
   Checked: every run finishes, its losses are finite, and no more than a quarter of its updates were skipped.
2. **fairseq-generate** of each trained model, beam 4, in float32 and with ``--fp16``: both print every question,
   and the share of identical hypotheses and the largest score difference between the two are reported.
3. **throughput beside transformers' RAG** on the same device (world.py's d=256 3+3 generator, rag_speed.py's
   turn-taking): RAG-Token beam 4 and RAG-Sequence beam 4 Thorough, questions per second, when transformers and
   datasets are installed (else recorded as skipped, with the reason).

``--cpu`` runs the same script at the tiny preset (2+2 layers, d 192), 3 updates, on the CPU, so that it cannot
rot between GPU loans: there fairseq's ``--fp16`` is left out (its FP16Optimizer keeps the fp32 master weights on
CUDA) and ``--amp`` runs fairseq's AMP wrapper with torch's GradScaler, which torch disables without CUDA (loss
scale 1). Everything measured goes to ``--json-out`` (written atomically); a Markdown summary is printed. The exit
status is 1 when a check failed.
"""
import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.modules.setdefault("torchaudio", None)  # see reference_side.py

import torch  # noqa: E402
import world as world_mod  # noqa: E402
from rag_speed import stats, take_turns  # noqa: E402

from rag_plugin.util.io import atomic_write_json  # noqa: E402

BIN = Path(sys.executable).parent
FAMILIES = {"rag_token": "marginal_nll", "fid": "reader_cross_entropy"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- 1. training
def train_command(world: Path, family: str, precision: str, args, save_dir: Path) -> list:
    size = "tiny" if args.cpu else "base"
    cmd = [sys.executable, str(HERE / "gpu_check_train.py"), str(world / "qa_t8"), "--task", "retrieval_augmented",
           "--knowledge", str(world / "ks"), "--arch", f"{family}_{size}", "--criterion", FAMILIES[family],
           "--n-docs", "5", "--optimizer", "torch_adamw", "--lr", str(args.lr), "--lr-scheduler", "fixed",
           "--batch-size", "8", "--max-update", str(args.updates), "--seed", "1", "--save-dir", str(save_dir),
           "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--log-format", "json",
           "--log-interval", "1", "--no-progress-bar", "--clip-norm", "1.0"]
    if size == "base":
        cmd += ["--generator-init", "bart", "--max-source-positions", "256", "--max-target-positions", "64"]
    if precision != "fp32":
        cmd.append(f"--{precision}")
    if args.cpu:
        cmd.append("--cpu")
    return cmd


def _train_inner(stdout: str) -> dict:
    """fairseq's json train_inner lines, by update number."""
    out = {}
    for line in stdout.splitlines():
        start = line.find("{")
        if "train_inner" not in line or start < 0:
            continue
        try:
            row = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if "num_updates" in row:
            out[int(row["num_updates"])] = row
    return out


def train_run(world: Path, family: str, precision: str, args, work: Path) -> dict:
    save_dir = work / f"{family}_{precision}"
    updates_file = work / f"{family}_{precision}.updates.jsonl"
    env = dict(os.environ, GPU_CHECK_UPDATES=str(updates_file), PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(train_command(world, family, precision, args, save_dir), cwd=HERE.parent, env=env,
                          capture_output=True, text=True, timeout=args.timeout)
    seconds = time.perf_counter() - t0
    logged = _train_inner(proc.stdout + proc.stderr)
    updates = []
    if updates_file.is_file():
        for line in updates_file.read_text().splitlines():
            row = json.loads(line)
            inner = logged.get(row["num_updates"], {})
            row.update({k: float(inner[k]) for k in ("loss", "gnorm") if k in inner})
            updates.append(row)
    losses = [u["loss"] for u in updates if "loss" in u]
    skipped = sum(u["skipped"] for u in updates)
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit status {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:300]}")
    if len(updates) < args.updates:
        problems.append(f"{len(updates)} of {args.updates} updates recorded")
    if not losses or not all(map(_finite, losses)):
        problems.append("a loss is missing or not finite")
    if skipped > len(updates) // 4:
        problems.append(f"{skipped} of {len(updates)} updates skipped (overflow)")
    log(f"train {family} {precision}: {len(updates)} updates in {seconds:.0f}s, loss "
        f"{losses[0] if losses else float('nan'):.3f} -> {losses[-1] if losses else float('nan'):.3f}, "
        f"skipped {skipped}" + (f"; PROBLEMS: {problems}" if problems else ""))
    return {"family": family, "precision": precision, "seconds": seconds, "updates": updates,
            "checkpoint": str(save_dir / "checkpoint_last.pt"), "ok": not problems, "problems": problems}


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


# ----------------------------------------------------------------------------- 2. generation
HYPOTHESIS = re.compile(r"^H-(\d+)\t(\S+)\t(.*)$")
SPEED = re.compile(r"Translated ([\d,]+) sentences .*?\(([\d.]+) sentences/s")


def generate_run(world: Path, checkpoint: str, fp16: bool, args) -> dict:
    cmd = [str(BIN / "rag-generate"), str(world / "qa_t8"), "--task", "retrieval_augmented", "--knowledge",
           str(world / "ks"), "--path", checkpoint, "--gen-subset", "train", "--beam", "4", "--batch-size", "8",
           "--max-len-b", "16", "--num-workers", "0"]
    if fp16:
        cmd.append("--fp16")
    if args.cpu:
        cmd.append("--cpu")
    proc = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, timeout=args.timeout)
    hyps = {}
    for line in proc.stdout.splitlines():
        m = HYPOTHESIS.match(line)
        if m:
            hyps[int(m.group(1))] = (float(m.group(2)), m.group(3))
    speed = SPEED.search(proc.stdout + proc.stderr)
    return {"returncode": proc.returncode, "hypotheses": hyps,
            "sentences_per_s": float(speed.group(2)) if speed else None,
            "error": "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or [""])[-1][:300]}


def compare_generation(world: Path, run: dict, args) -> dict:
    full = generate_run(world, run["checkpoint"], False, args)
    half = generate_run(world, run["checkpoint"], True, args)
    n = len(world_mod.load_corpus(world)["qa"])
    shared = sorted(set(full["hypotheses"]) & set(half["hypotheses"]))
    same = sum(full["hypotheses"][i][1] == half["hypotheses"][i][1] for i in shared)
    diffs = [abs(full["hypotheses"][i][0] - half["hypotheses"][i][0]) for i in shared
             if full["hypotheses"][i][1] == half["hypotheses"][i][1]]
    runs = (("fp32", full), ("fp16", half))
    problems = [f"{name}: {r['error'] or 'exit ' + str(r['returncode'])}" for name, r in runs if r["returncode"] != 0]
    problems += [f"{name} printed {len(r['hypotheses'])} of {n} questions" for name, r in runs
                 if r["returncode"] == 0 and len(r["hypotheses"]) != n]
    result = {"family": run["family"], "trained_with": run["precision"], "questions": n,
              "same_hypothesis_share": same / len(shared) if shared else None,
              "max_score_difference_same_hypothesis": max(diffs) if diffs else None,
              "fp32_sentences_per_s": full["sentences_per_s"], "fp16_sentences_per_s": half["sentences_per_s"],
              "ok": not problems, "problems": problems}
    log(f"generate {run['family']}: fp16 vs fp32 same hypotheses {result['same_hypothesis_share']}, max score "
        f"difference {result['max_score_difference_same_hypothesis']}"
        + (f"; PROBLEMS: {problems}" if problems else ""))
    return result


# ----------------------------------------------------------------------------- 3. throughput
def throughput(world: Path, device: str, rounds: int) -> dict:
    from plugin_side import PluginSide
    from reference_side import ReferenceSide, unavailable_reason

    plugin = PluginSide(world)
    reason = unavailable_reason()
    ref = None if reason else ReferenceSide(world, max_combined_lengths=(96,))
    out = {"device": device, "reference": "transformers" if ref else f"skipped: {reason}", "questions_per_s": {}}
    batch = world_mod.SPEC["batch_size"]
    for label, kind, mode in (("rag_token_beam4", "token", "token_beam4"),
                              ("rag_sequence_beam4_thorough", "sequence", "seq_thorough")):
        contestants = {"plugin": plugin.generator_fn(plugin.model(kind), mode, device=device)}
        if ref is not None:
            contestants["transformers"] = ref.generator_fn(ref.model(kind, 96), mode, device=device)
        timed = {name: _synchronised(fn, device) for name, fn in contestants.items()}
        times = take_turns(timed, warmup=1, rounds=rounds, label=label)
        out["questions_per_s"][label] = {name: batch / stats(t)["median"] for name, t in times.items()}
    return out


def _synchronised(fn, device: str):
    def run(i: int):
        result = fn(i)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return result
    return run


# ----------------------------------------------------------------------------- report
def _training_row(r: dict) -> str:
    u = r["updates"]
    losses = [x["loss"] for x in u if "loss" in x]
    norms = sorted(x["update_norm"] for x in u)
    loss = f"{losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "-"
    norm = f"{norms[len(norms) // 2]:.3g}" if norms else "-"
    scale = u[-1]["loss_scale_after"] if u else "-"
    return (f"| {r['family']} --{r['precision']} | {len(u)} | {loss} | {scale} | {norm} | "
            f"{sum(x['skipped'] for x in u)} | {r['ok']} |")


def summary(report: dict) -> str:
    lines = ["| run | updates | loss first -> last | loss scale (last) | median update norm | skipped | ok |",
             "|---|---:|---|---:|---:|---:|---|"]
    lines += [_training_row(r) for r in report["training"]]
    lines += ["", "| generation | same hypotheses fp16/fp32 | max score diff | fp32 sent/s | fp16 sent/s | ok |",
              "|---|---:|---:|---:|---:|---|"]
    for g in report["generation"]:
        lines.append(f"| {g['family']} | {g['same_hypothesis_share']} | {g['max_score_difference_same_hypothesis']} | "
                     f"{g['fp32_sentences_per_s']} | {g['fp16_sentences_per_s']} | {g['ok']} |")
    t = report.get("throughput") or {}
    for label, sides in t.get("questions_per_s", {}).items():
        lines.append(f"\n{label} on {t['device']}: " + ", ".join(f"{k} {v:.1f} q/s" for k, v in sides.items()))
    if t:
        lines.append(f"reference: {t['reference']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (CI), without --fp16 training")
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="where world.py builds its tiny world")
    ap.add_argument("--updates", type=int, default=0, help="updates per training run (default 20 on a GPU, 3 --cpu)")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of the training runs")
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds per throughput contestant "
                    "(default 10; 2 --cpu)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds allowed to each fairseq command")
    ap.add_argument("--no-throughput", action="store_true", help="leave out part 3")
    ap.add_argument("--json-out", default=str(HERE / ".cache" / "gpu_check.json"))
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA device is visible to torch (fix: run on a GPU machine, or pass --cpu for the tiny CPU "
              "run)", file=sys.stderr)
        return 2
    args.updates = args.updates or (3 if args.cpu else 20)
    args.rounds = args.rounds or (2 if args.cpu else 10)
    device = "cpu" if args.cpu else "cuda"
    t0 = time.perf_counter()
    world = world_mod.build(args.cache, log=log)
    precisions = ("fp32", "amp") if args.cpu else ("fp16", "amp")
    report = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device,
              "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None, "host": platform.node(),
              "torch": torch.__version__, "updates": args.updates, "sizes": "tiny" if args.cpu else "base",
              "training": [], "generation": []}
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as tmp:
        work = Path(tmp)
        for family in FAMILIES:
            for precision in precisions:
                report["training"].append(train_run(world, family, precision, args, work))
            trained = next((r for r in report["training"] if r["family"] == family and r["ok"]), None)
            if trained is not None:
                report["generation"].append(compare_generation(world, trained, args))
    if not args.no_throughput:
        report["throughput"] = throughput(world, device, args.rounds)
    report["seconds"] = time.perf_counter() - t0
    failed = [r for r in report["training"] + report["generation"] if not r["ok"]]
    failed += [{"family": f, "problems": ["no run trained"]} for f in FAMILIES
               if not any(g["family"] == f for g in report["generation"])]
    report["ok"] = not failed
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, report)
    print(summary(report))
    log(f"{'all checks passed' if not failed else f'{len(failed)} check(s) failed'} in "
        f"{report['seconds']:.0f}s; figures in {out}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
