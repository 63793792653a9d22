#!/usr/bin/env python
"""rag_plugin against transformers' RAG on identical work, side by side in one process.

    .venv/bin/python benchmarks/rag_speed.py --json-out benchmarks/.cache/rag_speed.json

The fixed tiny configuration of ../shared/bench/README.md (10k synthetic passages, K=5, batch 8,
2 torch threads, BART d=256 3+3 layers, DPR-shaped BERT question encoder 4x256, byte-level BPE
8000) is built once under ``--cache`` (see world.py). Then, in this process:

* training: one step = retrieval inside the step with the current question encoder, forward,
  backward, Adam. For each of RAG-Token / RAG-Sequence x target length 8 / 32, fresh models of
  every contestant take turns, one step each per round, the order rotating every round:
  the plugin, transformers at ``max_combined_length`` 96 (tight: never truncates this data)
  and 300 (its default), and the bare generator (the floor: the plugin's BART alone on B x K
  concatenated inputs that the plugin model being trained retrieves for the same batch just
  before, untimed, as in its own step; plain cross-entropy, Adam).
* generation, 16 decoder steps per answer (the last one forced </s>) on batches of 8 questions:
  RAG-Token greedy and beam 4; RAG-Sequence beam 4 Thorough and Fast (transformers only has
  Thorough: Fast is compared with it too, and marked so). Same turn-taking.
* peak memory: one subprocess per contestant (plugin, transformers 96, transformers 300) runs
  the same workload (every training setting for a few steps, every generation mode) and
  reports its peak RSS (``VmHWM``, which only grows, hence one process per side) and the
  peak minus the RSS before the workload (after imports and loading the index).

Reported: medians over the timed rounds, the ratio plugin / transformers of the medians and the
median of per-round paired ratios (robust when other jobs share the CPUs). A Markdown table is
printed; everything, raw times included, goes to ``--json-out`` (written atomically).

Without ``transformers``/``datasets`` (or with ``--no-reference``) the reference is skipped and
only the plugin and the floor are measured.
"""
import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.modules.setdefault("torchaudio", None)  # see reference_side.py

import torch  # noqa: E402
import world as world_mod  # noqa: E402
from world import SPEC  # noqa: E402

TRAIN_SETTINGS = [("token", 8), ("token", 32), ("sequence", 8), ("sequence", 32)]
GEN_GROUPS = {  # contestants that take turns: (label, side, model kind, mode)
    "token_greedy": [("plugin", "token", "token_greedy"), ("ref", "token", "token_greedy")],
    "token_beam4": [("plugin", "token", "token_beam4"), ("ref", "token", "token_beam4")],
    "sequence_beam4": [("plugin_thorough", "sequence", "seq_thorough"),
                       ("plugin_thorough_all", "sequence", "seq_thorough_all"),
                       ("plugin_fast", "sequence", "seq_fast"), ("ref", "sequence", "seq_thorough")],
}
MCLS = (96, 300)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ``ru_maxrss``: that one carries the peak of
    the parent process over fork and exec, so a probe started by a big parent would report it."""
    return _status_mb("VmHWM")


def stats(xs):
    xs = list(xs)
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs), "values": xs}


CLOCK = time.perf_counter  # --clock process: CPU seconds of this process instead of wall time


def take_turns(contestants: dict, warmup: int, rounds: int, label: str) -> dict:
    """Run each contestant's ``fn(i)`` warmup times, then ``rounds`` rounds of one call each,
    the order rotating by one every round; returns seconds per call, per contestant."""
    names = list(contestants)

    def call(name: str, i: int) -> float:
        fn = contestants[name]
        if hasattr(fn, "prepare"):  # untimed preparation (the floor's inputs)
            fn.prepare(i)
        t0 = CLOCK()
        fn(i)
        return CLOCK() - t0

    for i in range(warmup):
        for name in names:
            call(name, i)
    times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            times[name].append(call(name, warmup + r))
        log(f"{label} round {r + 1}/{rounds}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.0f} ms" for n in names))
    return times


def count_gflop(contestants: dict, start: int, steps: int) -> dict:
    """Floating-point work of each contestant's step, in GFLOP, mean over ``steps`` steps (batches
    ``start``...): torch's FlopCounterMode, which counts matrix products and attention, forward and
    backward (2 per multiply-add); the rest (normalisation, softmax, the optimizer) is not counted.
    Untimed. Tells work from speed: the host's speed drifts, the work does not."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    # torch counts the CUDA attention kernels only; the CPU ones do the same products
    cpu_attention = {
        aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *a, out_shape=None, **kw:
            flop_counter.sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: lambda g, q, k, v, *a, out_shape=None, **kw:
            flop_counter.sdpa_backward_flop_count(g, q, k, v),
    }
    out = {}
    for name, fn in contestants.items():
        total = 0
        for i in range(start, start + steps):
            if hasattr(fn, "prepare"):
                fn.prepare(i)
            with flop_counter.FlopCounterMode(display=False, custom_mapping=cpu_attention) as counter:
                fn(i)
            total += counter.get_total_flops()
        out[name] = total / steps / 1e9
    return out


def paired_ratio(fast, slow):
    """Median over rounds of slow_r / fast_r (how many times faster ``fast`` was, round by round)."""
    return statistics.median(s / f for f, s in zip(fast, slow))


# ---------------------------------------------------------------------------------- training
def bench_train(plugin, ref, args) -> dict:
    out = {}
    bs = SPEC["batch_size"]
    for kind, t in TRAIN_SETTINGS:
        key = f"{kind}_T{t}"
        contestants = {"plugin": plugin.trainer(kind, t)}
        if ref is not None:
            for mcl in MCLS:
                contestants[f"ref{mcl}"] = ref.trainer(kind, t, mcl)
        if args.plugin_dropout == "both":
            contestants["plugin_torch_dropout"] = plugin.trainer(kind, t, dropout="torch")
        bare = plugin.bare_generator_trainer(t, contestants["plugin"].model)
        contestants["bare_generator"] = bare
        times = take_turns(contestants, args.warmup, args.steps, f"train {key}")
        res = {"step_s": {n: stats(v) for n, v in times.items()},
               "examples_per_s": {n: bs / statistics.median(v) for n, v in times.items()},
               "generator_input_tokens": stats(bare.input_lengths)}
        if args.flop_steps > 0:
            res["gflop_per_step"] = count_gflop(contestants, args.warmup + args.steps, args.flop_steps)
            res["gflop_per_s"] = {n: res["gflop_per_step"][n] / statistics.median(v) for n, v in times.items()}
            log(f"train {key}: GFLOP per step " + ", ".join(f"{n} {v:.2f}" for n, v in res["gflop_per_step"].items()))
        res["plugin_over_bare_step"] = statistics.median(times["plugin"]) / statistics.median(times["bare_generator"])
        res["plugin_over_bare_step_paired"] = paired_ratio(times["bare_generator"], times["plugin"])
        if "plugin_torch_dropout" in times:
            res["fast_dropout_speedup"] = (statistics.median(times["plugin_torch_dropout"])
                                           / statistics.median(times["plugin"]))
            res["fast_dropout_speedup_paired"] = paired_ratio(times["plugin"], times["plugin_torch_dropout"])
        if ref is not None:
            for mcl in MCLS:
                res[f"speedup_vs_ref{mcl}"] = statistics.median(times[f"ref{mcl}"]) / statistics.median(times["plugin"])
                res[f"speedup_vs_ref{mcl}_paired"] = paired_ratio(times["plugin"], times[f"ref{mcl}"])
                # the ceiling: the bare generator against the reference (no RAG step can beat it)
                res[f"bare_speedup_vs_ref{mcl}"] = (statistics.median(times[f"ref{mcl}"])
                                                    / statistics.median(times["bare_generator"]))
        res["plugin_step_parts_s"] = plugin.step_breakdown(kind, t, steps=max(3, args.steps // 2), clock=CLOCK)
        out[key] = res
        log(f"train {key}: " + ", ".join(f"{n} {v:.2f} ex/s" for n, v in res["examples_per_s"].items()))
        log(f"train {key}: plugin step parts (ms): "
            + ", ".join(f"{n} {v * 1e3:.1f}" for n, v in res["plugin_step_parts_s"].items()))
        del contestants, bare
        gc.collect()
    return out


# ---------------------------------------------------------------------------------- generation
def bench_generate(plugin, ref, args) -> dict:
    out = {}
    bs = SPEC["batch_size"]
    for group, members in GEN_GROUPS.items():
        contestants = {}
        models = {}
        for label, kind, mode in members:
            if label.startswith("plugin"):
                model = models.setdefault(("plugin", kind), plugin.model(kind).eval())
                contestants[label] = plugin.generator_fn(model, mode)
            elif ref is not None:
                for mcl in MCLS:
                    model = models.setdefault((mcl, kind), ref.model(kind, mcl).eval())
                    contestants[f"ref{mcl}"] = ref.generator_fn(model, mode)
        times = take_turns(contestants, args.gen_warmup, args.gen_reps, f"generate {group}")
        res = {"call_s": {n: stats(v) for n, v in times.items()},
               "questions_per_s": {n: bs / statistics.median(v) for n, v in times.items()}}
        if ref is not None:
            for name in contestants:
                if name.startswith("plugin"):
                    for mcl in MCLS:
                        res[f"{name}_speedup_vs_ref{mcl}"] = (statistics.median(times[f"ref{mcl}"])
                                                              / statistics.median(times[name]))
                        res[f"{name}_speedup_vs_ref{mcl}_paired"] = paired_ratio(times[name], times[f"ref{mcl}"])
        out[group] = res
        log(f"generate {group}: " + ", ".join(f"{n} {v:.2f} q/s" for n, v in res["questions_per_s"].items()))
        del contestants, models
        gc.collect()
    return out


# ---------------------------------------------------------------------------------- memory
def memory_probe(side_name: str, world: Path, args) -> dict:
    """The whole workload of one contestant in this (fresh) process; peak RSS before/after."""
    rss0 = rss_mb()
    if side_name == "plugin":
        from plugin_side import PluginSide

        side = PluginSide(world, dropout=_main_dropout(args), adam=args.adam)
        trainer = lambda kind, t: side.trainer(kind, t)  # noqa: E731
        model = lambda kind: side.model(kind)  # noqa: E731
    else:
        from reference_side import ReferenceSide

        mcl = int(side_name[len("ref"):])
        side = ReferenceSide(world, max_combined_lengths=(mcl,), adam=args.adam)
        trainer = lambda kind, t: side.trainer(kind, t, mcl)  # noqa: E731
        model = lambda kind: side.model(kind, mcl)  # noqa: E731
    gc.collect()
    res = {"rss_after_imports_mb": rss0, "rss_before_workload_mb": rss_mb(), "peak_before_workload_mb": peak_rss_mb()}
    for kind, t in TRAIN_SETTINGS:
        step = trainer(kind, t)
        for i in range(args.memory_steps):
            step(i)
        del step
        gc.collect()
        res[f"peak_after_train_{kind}_T{t}_mb"] = peak_rss_mb()
    res["peak_after_train_mb"] = peak_rss_mb()
    for members in GEN_GROUPS.values():
        for label, kind, mode in members:
            if side_name == "plugin" and not label.startswith("plugin"):
                continue
            if side_name != "plugin" and label != "ref":
                continue
            m = model(kind).eval()
            run = side.generator_fn(m, mode)
            for i in range(2):
                run(i)
            del run, m
            gc.collect()
    res["peak_mb"] = peak_rss_mb()
    res["workload_peak_mb"] = res["peak_mb"] - res["rss_before_workload_mb"]
    return res


def run_memory_probes(args, have_ref: bool) -> dict:
    out = {}
    sides = ["plugin"] + ([f"ref{m}" for m in MCLS] if have_ref else [])
    for side in sides:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", side, "--cache", args.cache,
               "--threads", str(args.threads), "--memory-steps", str(args.memory_steps),
               "--plugin-dropout", _main_dropout(args), "--adam", args.adam]
        log(f"memory probe {side}: {' '.join(cmd[1:])}")
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"memory probe {side} failed:\n{r.stderr[-3000:]}")
        out[side] = json.loads(r.stdout.strip().splitlines()[-1])
        log(f"memory {side}: peak {out[side]['peak_mb']:.0f} MB, workload {out[side]['workload_peak_mb']:.0f} MB")
    return out


# ---------------------------------------------------------------------------------- report
def machine_info(threads: int) -> dict:
    info = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "torch_threads": threads,
            "python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__}
    try:
        with open("/proc/cpuinfo") as fh:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    for module in ("transformers", "datasets", "faiss", "tokenizers", "fairseq", "numpy"):
        try:
            info[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001
            info[module] = None
    return info


def _fmt_ratio(res: dict, key: str) -> str:
    if key not in res:
        return "–"
    return f"**{res[key]:.2f}x** ({res[key + '_paired']:.2f}x)"


def _num(d: dict, key: str) -> str:
    return f"{d[key]:.2f}" if key in d else "–"


def markdown(results: dict) -> str:
    lines = []
    if "train" in results:
        lines += ["| training, examples/s (median) | plugin | tf 96 | tf 300 | plugin ÷ tf 96 | plugin ÷ tf 300 "
                  "| bare generator | plugin step ÷ bare step | bare ÷ tf 96 |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for key, res in results["train"].items():
            eps = res["examples_per_s"]
            kind, t = key.split("_T")
            ceiling = f"{res['bare_speedup_vs_ref96']:.2f}x" if "bare_speedup_vs_ref96" in res else "–"
            lines.append(f"| RAG-{kind.capitalize()} T={t} | {eps['plugin']:.2f} | {_num(eps, 'ref96')} "
                         f"| {_num(eps, 'ref300')} | {_fmt_ratio(res, 'speedup_vs_ref96')} "
                         f"| {_fmt_ratio(res, 'speedup_vs_ref300')} | {eps['bare_generator']:.2f} "
                         f"| {res['plugin_over_bare_step']:.3f} ({res['plugin_over_bare_step_paired']:.3f}) "
                         f"| {ceiling} |")
        lines.append("")
        parts = [r.get("plugin_step_parts_s") for r in results["train"].values()]
        if all(parts):
            names = list(parts[0])
            lines += ["| plugin training step, ms (median, taken apart) | " + " | ".join(names) + " | sum |",
                      "|---|" + "---:|" * (len(names) + 1)]
            for key, p in zip(results["train"], parts):
                kind, t = key.split("_T")
                lines.append(f"| RAG-{kind.capitalize()} T={t} | " + " | ".join(f"{p[n] * 1e3:.1f}" for n in names)
                             + f" | {sum(p.values()) * 1e3:.0f} |")
            lines.append("")
        work = {k: r for k, r in results["train"].items() if "gflop_per_step" in r}
        if work:
            measured = next(iter(work.values()))["gflop_per_step"]
            names = [n for n in ("plugin", "ref96", "ref300", "bare_generator") if n in measured]
            titles = {"plugin": "plugin", "ref96": "tf 96", "ref300": "tf 300", "bare_generator": "bare generator"}
            lines += ["| training work, GFLOP per step (matrix products and attention, forward + backward) | "
                      + " | ".join(titles[n] for n in names) + " | plugin ÷ tf 96 (work) | achieved GFLOP/s: "
                      + ", ".join(titles[n] for n in names) + " |",
                      "|---|" + "---:|" * (len(names) + 2)]
            for key, r in work.items():
                kind, t = key.split("_T")
                g, rate = r["gflop_per_step"], r["gflop_per_s"]
                share = f"{g['plugin'] / g['ref96']:.2f}" if "ref96" in g else "–"
                lines.append(f"| RAG-{kind.capitalize()} T={t} | " + " | ".join(f"{g[n]:.1f}" for n in names)
                             + f" | {share} | " + ", ".join(f"{rate[n]:.0f}" for n in names) + " |")
            lines.append("")
        gains = {k: r for k, r in results["train"].items() if "fast_dropout_speedup" in r}
        if gains:
            lines += ["| plugin: fast dropout against F.dropout | examples/s, fast | examples/s, F.dropout "
                      "| fast ÷ F.dropout |", "|---|---:|---:|---:|"]
            for key, r in gains.items():
                kind, t = key.split("_T")
                eps = r["examples_per_s"]
                lines.append(f"| RAG-{kind.capitalize()} T={t} | {eps['plugin']:.2f} "
                             f"| {eps['plugin_torch_dropout']:.2f} "
                             f"| {_fmt_ratio(r, 'fast_dropout_speedup')} |")
            lines.append("")
    if "generate" in results:
        lines += ["| generation, questions/s (median) | plugin | tf 96 | tf 300 | plugin ÷ tf 96 | plugin ÷ tf 300 |",
                  "|---|---:|---:|---:|---:|---:|"]
        names = {"token_greedy": [("plugin", "RAG-Token greedy")], "token_beam4": [("plugin", "RAG-Token beam 4")],
                 "sequence_beam4": [("plugin_thorough", "RAG-Sequence beam 4, Thorough"),
                                    ("plugin_thorough_all", "RAG-Sequence beam 4, Thorough re-scoring every pair ¹"),
                                    ("plugin_fast", "RAG-Sequence beam 4, Fast (tf: its Thorough) ²")]}
        for group, res in results["generate"].items():
            qps = res["questions_per_s"]
            for name, title in names[group]:
                lines.append(f"| {title} | {qps[name]:.2f} | {_num(qps, 'ref96')} | {_num(qps, 'ref300')} "
                             f"| {_fmt_ratio(res, name + '_speedup_vs_ref96')} "
                             f"| {_fmt_ratio(res, name + '_speedup_vs_ref300')} |")
        lines.append("")
    if "memory" in results:
        lines += ["| peak memory, MB (one process per contestant, same workload) | plugin | tf 96 | tf 300 |",
                  "|---|---:|---:|---:|"]
        mem = results["memory"]
        for key, title in (("peak_mb", "peak RSS of the process"),
                           ("workload_peak_mb", "peak − RSS before the workload"),
                           ("rss_before_workload_mb", "RSS before the workload (imports, index, data)")):
            cells = [f"{mem[s][key]:.0f}" if s in mem else "–" for s in ("plugin", "ref96", "ref300")]
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("tf = transformers' RagTokenForGeneration / RagSequenceForGeneration at max_combined_length 96 "
                 "(tight) or 300 (default). Ratios: plugin speed ÷ transformers speed, the medians' ratio in bold, "
                 "the median of per-round paired ratios in parentheses. ¹ transformers' amount of rescoring: every "
                 "(hypothesis, document) pair teacher-forced, even where the document's beam already scored it. "
                 "² transformers has no Fast decoding: compared with its Thorough.")
    if results.get("reference"):
        lines.append(f"transformers' side skipped: {results['reference']}.")
    if results.get("args", {}).get("clock") == "process":
        lines.append("Clock: CPU seconds of the process (--clock process), not wall time.")
    return "\n".join(lines)


def _main_dropout(args) -> str:
    """The dropout of the plugin contestant (and of its memory probe)."""
    return "fast" if args.plugin_dropout == "both" else args.plugin_dropout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="where the tiny world is built (once)")
    ap.add_argument("--threads", type=int, default=SPEC["threads"], help="torch threads (and faiss threads)")
    ap.add_argument("--warmup", type=int, default=3, help="training warm-up steps per contestant and setting")
    ap.add_argument("--steps", type=int, default=10, help="timed training rounds per setting")
    ap.add_argument("--flop-steps", type=int, default=8,
                    help="untimed training steps per contestant counted by torch's FlopCounterMode (0: none)")
    ap.add_argument("--gen-warmup", type=int, default=1)
    ap.add_argument("--gen-reps", type=int, default=5, help="timed generation rounds per mode")
    ap.add_argument("--memory-steps", type=int, default=3, help="training steps per setting in the memory probes")
    ap.add_argument("--phases", default="train,gen,memory")
    ap.add_argument("--no-reference", action="store_true", help="measure the plugin (and the floor) only")
    ap.add_argument("--plugin-dropout", choices=("fast", "torch", "both"), default="fast",
                    help="the plugin generator's dropout: fast (its default, rag_plugin/models/dropout.py), "
                         "torch (F.dropout, as before 2026-12-01), or both: training also runs a plugin model "
                         "with F.dropout as one more contestant (the before/after of that change, paired)")
    ap.add_argument("--adam", choices=("fused", "single"), default="fused",
                    help="the optimizer of every training step, the same on all sides: fused (torch's fused AdamW: "
                         "what the plugin's --optimizer torch_adamw builds and transformers' Trainer uses by default) "
                         "or single (torch.optim.Adam's per-tensor loop, the benchmark's optimizer before 2026-12-01)")
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="wall: elapsed time (the result); process: CPU seconds of this process, steadier "
                         "when other jobs share the CPUs (use with --threads 1)")
    ap.add_argument("--json-out", default=str(HERE / ".cache" / "rag_speed.json"))
    ap.add_argument("--md-out", default=None, help="also write the Markdown table here")
    ap.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    torch.set_num_threads(args.threads)
    try:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    except ImportError:
        pass
    t_start = time.perf_counter()
    world = world_mod.build(args.cache, log=log)
    if args.memory_probe:
        print(json.dumps(memory_probe(args.memory_probe, world, args)))
        return 0

    from reference_side import unavailable_reason

    reason = "--no-reference" if args.no_reference else unavailable_reason()
    if reason:
        log(f"transformers' RAG is skipped: {reason}")
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv,
               "args": vars(args), "spec": SPEC, "machine": machine_info(args.threads),
               "loadavg_start": os.getloadavg(), "reference": reason}
    from plugin_side import PluginSide

    plugin = PluginSide(world, dropout=_main_dropout(args), adam=args.adam)
    ref = None
    if not reason:
        from reference_side import ReferenceSide

        ref = ReferenceSide(world, adam=args.adam)
    params = {"plugin": plugin.n_params(plugin.model("token"))}
    if ref is not None:
        params["transformers"] = ref.n_params(ref.model("token", MCLS[0]))
    results["n_params"] = params
    log(f"parameters: {json.dumps(params)}")
    phases = set(args.phases.split(","))
    if "train" in phases:
        results["train"] = bench_train(plugin, ref, args)
    if "gen" in phases:
        results["generate"] = bench_generate(plugin, ref, args)
    del plugin, ref
    gc.collect()
    if "memory" in phases:
        results["memory"] = run_memory_probes(args, have_ref=not reason)
    results["loadavg_end"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t_start
    table = markdown(results)
    results["markdown"] = table
    from rag_plugin.util.io import atomic_write_json, atomic_write_text

    atomic_write_json(args.json_out, results)
    if args.md_out:
        atomic_write_text(args.md_out, table + "\n")
    print(table)
    log(f"done in {results['wall_s']:.0f}s; load average {results['loadavg_start']} -> {results['loadavg_end']}; "
        f"results -> {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
