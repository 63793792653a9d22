#!/usr/bin/env python
"""What the reranking stage (issue 35) costs on the demo: time per question against L for each scorer, and memory.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rerank_cost.py [--questions 8] [--candidates 10 20 50] \\
        [--repeats 2] [--threads 1] [--memory-batch 32] [--json-out benchmarks/results/rerank_cost.json]

A benchmark, not a test: it reports only. Everything runs through the real code: the task is
``RetrievalAugmentedTask.setup_task`` on the demo's knowledge source (``--knowledge``, data/demo/ks: MiniLM-L6,
exact MIPS) and nq_demo (``--data``), the model ``RagTokenModel.build_model`` with the demo's recipe (recipe/tiny.yaml)
and its generator from the demo's pretrained one (``--checkpoint``, as the demo's systems start), which builds its
reranker through ``rag_plugin.reranking.registry.build_reranker``; candidates come from the model's own first stage
(query encoder, then dense MIPS top-L) and are scored by the stage's ``rerank()``. The questions: the first
``--questions`` of DATA/test.jsonl, scored as one batch (the stage runs over a training batch at once).

Scorers: ``maxsim_text`` (MaxSim, the passages' token states computed from their texts by the frozen passage tower),
``maxsim_cache`` (MaxSim reading the full token-state cache, ``--maxsim-cache``; skipped unless it is complete under
KS/.lower_states, or ``--build-cache``), ``upr`` (the reader as reranker), ``cross`` (the cross-encoder); ``first``
is the first stage alone (query encoder + MIPS top-L), beside them. Each (scorer, measurement) runs in a fresh
process, warmed up on one question first; the passage-state LRU is emptied before each timed pass (a pass of new
questions finds few of its candidates there).

Measured per scorer:

* ``select``: the selection pass, ``rerank(grad=False)`` in eval mode under no_grad, per question, for each L;
* ``train``: what the stage adds to a training step at ``--memory-candidates`` L: ``rerank(grad=True)`` in train mode
  (the L scored without a graph, the kept ``--n-docs`` scored again with one) and the backward of their logsumexp;
* ``memory``: the rise of the peak resident set (VmHWM, reset to the current RSS through /proc/self/clear_refs
  after a malloc_trim) over one selection pass of ``--memory-batch`` questions at ``--memory-candidates``;
* the token states' bytes (tokens x hidden x 4) per passage over the knowledge source, the cache's size on disk, and
  the LRU's at its default size.

Times are the fastest of ``--repeats`` wall-clock passes, each with the 1-minute load average at its end
(os.getloadavg): on a shared machine the load says how far to trust a figure.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "runs" / "demo" / "checkpoints" / "pretrain_pseudo"
#: scorer -> --reranker
RERANKER = {"first": "none", "maxsim_text": "maxsim", "maxsim_cache": "maxsim", "upr": "upr", "cross": "cross"}
SCORERS = tuple(RERANKER)
#: the tables' names of the scorers
NAMES = {"first": "first stage: query encoder + MIPS top-L", "maxsim_text": "maxsim, states from the texts",
         "maxsim_cache": "maxsim, `--maxsim-cache`", "upr": "upr", "cross": "cross"}


# ------------------------------------------------------------------------------------------ the measured process
def build(args, scorer: str, questions: int):
    """(task, model, batch of the first ``questions`` test questions) for ``scorer``, or a reason it is skipped."""
    import torch

    import rag_plugin

    torch.set_num_threads(args.threads)
    rag_plugin.register()
    from rag_plugin.models.rag import RagConfig, RagTokenModel
    from rag_plugin.pipeline.recipes import load_recipe
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    name = RERANKER[scorer]
    cfg = RetrievalAugmentedConfig(data=args.data, knowledge=args.knowledge, n_docs=args.n_docs, retriever="dense",
                                   reranker=name, rerank_candidates=max(args.candidates) if name != "none" else None,
                                   maxsim_cache=scorer == "maxsim_cache")
    task = RetrievalAugmentedTask.setup_task(cfg)
    if scorer == "maxsim_cache" and not args.build_cache and full_cache(task) is None:
        return f"no complete token-state cache under {Path(args.knowledge) / '.lower_states'} (--build-cache builds it)"
    task.load_dataset("test")
    recipe = load_recipe("tiny")
    torch.manual_seed(1)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", generator_checkpoint=str(args.checkpoint),
                                                lr=list(recipe.optimization.lr), **recipe.model), task)
    if scorer == "maxsim_text":
        model.reranker.passages.lower_root = None  # the passages' states from their texts, whatever cache exists
    ds = task.datasets["test"]
    return task, model, ds.collater([ds[i] for i in range(min(questions, len(ds)))])


def full_cache(task):
    """The complete cache of all the passage tower's layers over the knowledge source, or None."""
    from rag_plugin.optim.lr_scale import plain_module_state
    from rag_plugin.retrieval.encoders import lower_states

    tower = task.text_encoder.passage_tower
    found = lower_states.find(Path(task.knowledge.root) / lower_states.DIR_NAME, plain_module_state(tower),
                              task.knowledge.passages.sha256)
    return found if found is not None and found.layers == len(tower.bert_model.encoder.layer) else None


def first_stage(model, net_input, width: int):
    """The model's first stage: (first-stage logits, rows) of the top ``width`` passages, and the query vectors."""
    import torch

    with torch.no_grad():
        q = model.query_encoder(net_input["query_tokens"], net_input["query_mask"])
        first, rows = model.retriever.retrieve(q, width, model.doc_score_scale)
    return first, rows, q


def rerank_batch(model, net_input, width: int, upto: int = None):
    """The stage's input for the first ``upto`` questions at L = ``width``, as RagModel.retrieve builds it."""
    from rag_plugin.reranking.base import RerankBatch

    ni = {k: v[:upto] for k, v in net_input.items()}
    first, rows, q = first_stage(model, ni, width)
    return RerankBatch(rows=rows, first_stage=first.detach().float(), src_tokens=ni["src_tokens"],
                       query_tokens=ni["query_tokens"], query_mask=ni["query_mask"], query_vectors=q)


def forget(model) -> None:
    """Empty the passage-state LRU (MaxSim's), so that a pass computes its candidates' states."""
    passages = getattr(getattr(model, "reranker", None), "passages", None)
    if passages is not None:
        passages.clear()


def timed(fn, repeats: int, questions: int, before=None) -> dict:
    """The fastest of ``repeats`` calls of ``fn``, in ms per question, with each call's 1-min load average."""
    times, loads = [], []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000 / questions)
        loads.append(round(os.getloadavg()[0], 2))
    best = min(range(repeats), key=times.__getitem__)
    return {"ms_per_question": round(times[best], 2), "load": loads[best], "all_ms": [round(t, 2) for t in times],
            "all_load": loads}


def time_phase(args, scorer: str) -> dict:
    import torch

    from rag_plugin.reranking.stage import rerank

    built = build(args, scorer, args.questions)
    if isinstance(built, str):
        return {"skipped": built}
    _, model, sample = built
    ni, n = sample["net_input"], sample["net_input"]["src_tokens"].size(0)
    model.eval()
    out = {"questions": n, "select": {}}
    if scorer == "first":
        q = first_stage(model, ni, args.n_docs)[2]  # warm-up; the query vectors of the MIPS-alone figures
        out["search"] = {}
        for width in args.candidates:
            out["select"][width] = timed(lambda w=width: first_stage(model, ni, w), args.repeats, n)
            out["search"][width] = timed(lambda w=width: model.retriever.retrieve(q, w, model.doc_score_scale),
                                         args.repeats, n)
        return out
    with torch.no_grad():
        rerank(model.reranker, model, rerank_batch(model, ni, args.n_docs, upto=1), args.n_docs, grad=False)
    for width in args.candidates:
        batch = rerank_batch(model, ni, width)

        def select(b=batch):
            with torch.no_grad():
                rerank(model.reranker, model, b, args.n_docs, grad=False)
        out["select"][width] = timed(select, args.repeats, n, before=lambda: forget(model))
    out["train"] = train_cost(args, model, rerank_batch(model, ni, args.memory_candidates), n)
    out.update(cache_used(model))
    return out


def train_cost(args, model, batch, n: int) -> dict:
    """The stage in a training step: the selection pass, the kept K again with a graph, and the backward."""
    import torch

    from rag_plugin.reranking.stage import rerank

    model.train()

    def step():
        logits, _ = rerank(model.reranker, model, batch, args.n_docs, grad=True)
        logits.logsumexp(-1).sum().backward()

    def reset():
        forget(model)
        model.zero_grad(set_to_none=True)

    with torch.enable_grad():
        reset()
        step()  # warm-up: the first backward's buffers
        result = timed(step, args.repeats, n, before=reset)
    model.eval()
    result["candidates"] = args.memory_candidates
    return result


def cache_used(model) -> dict:
    """Which token-state cache MaxSim read (its layers), if any."""
    passages = getattr(model.reranker, "passages", None)
    if passages is None:
        return {}
    lower = passages.lower(model.retriever.store)
    return {"cache_layers": None if lower is None else lower.layers}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak() -> bool:
    """Return freed heap to the system and reset VmHWM to the current RSS (Linux 4.0+); False where refused."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def memory_phase(args, scorer: str) -> dict:
    import torch

    from rag_plugin.reranking.stage import rerank

    built = build(args, scorer, args.memory_batch)
    if isinstance(built, str):
        return {"skipped": built}
    _, model, sample = built
    ni, n = sample["net_input"], sample["net_input"]["src_tokens"].size(0)
    model.eval()
    width = args.memory_candidates
    if scorer == "first":
        first_stage(model, ni, args.n_docs)[1].sum()  # warm-up

        def run():
            first_stage(model, ni, width)
    else:
        batch = rerank_batch(model, ni, width)
        with torch.no_grad():  # warm-up on one question at L = K
            rerank(model.reranker, model, rerank_batch(model, ni, args.n_docs, upto=1), args.n_docs, grad=False)
        forget(model)

        def run():
            with torch.no_grad():
                rerank(model.reranker, model, batch, args.n_docs, grad=False)
    reset = _reset_peak()
    before = _status_kib("VmRSS") if reset else _status_kib("VmHWM")
    run()
    rise = (_status_kib("VmHWM") - before) / 1024
    return {"questions": n, "candidates": width, "peak_rise_mib": round(rise, 1),
            "peak_rise_mib_per_question": round(rise / n, 2), "method": "VmHWM reset" if reset else "VmHWM",
            "load": round(os.getloadavg()[0], 2)}


def states_phase(args, scorer: str) -> dict:
    """The token states' bytes per passage over the knowledge source (tokens x hidden x 4), from the cache's offsets
    where it exists (else from tokenizing every passage), the cache's size on disk, the LRU's at its default size."""
    import numpy as np

    import rag_plugin

    rag_plugin.register()
    from rag_plugin.reranking.maxsim import DEFAULT_CACHE
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=args.data, knowledge=args.knowledge,
                                                                      n_docs=args.n_docs, retriever="dense"))
    encoder = task.text_encoder
    hidden = int(encoder.passage_tower.bert_model.config.hidden_size)
    cache = full_cache(task)
    if cache is not None:
        tokens, source = np.diff(cache.offsets), f"the cache's offsets ({cache.directory.name})"
        disk = sum(f.stat().st_size for f in cache.directory.iterdir() if f.is_file())
    else:
        store, counts = task.knowledge.passages, []
        pairs = list(store.iter_titles_texts())
        for start in range(0, len(pairs), 2048):
            titles, texts = zip(*pairs[start:start + 2048])
            counts.extend(len(ids) for ids in encoder.tokenize_passages(list(titles), list(texts)))
        tokens, source, disk = np.asarray(counts), "tokenizing every passage", None
    per = tokens.astype(np.int64) * hidden * 4
    largest = np.sort(per)[::-1][:DEFAULT_CACHE]
    return {"passages": int(len(tokens)), "hidden": hidden, "tokens_from": source,
            "tokens_mean": round(float(tokens.mean()), 1), "tokens_p95": float(np.percentile(tokens, 95)),
            "tokens_max": int(tokens.max()), "kb_mean": round(per.mean() / 1e3, 1),
            "kb_p95": round(float(np.percentile(per, 95)) / 1e3, 1), "kb_max": round(per.max() / 1e3, 1),
            "states_gb": round(per.sum() / 1e9, 3), "disk_gb": None if disk is None else round(disk / 1e9, 3),
            "lru_size": DEFAULT_CACHE, "lru_mb_mean": round(DEFAULT_CACHE * per.mean() / 1e6, 1),
            "lru_mb_largest": round(largest.sum() / 1e6, 1)}


PHASES = {"time": time_phase, "memory": memory_phase, "states": states_phase}


# ------------------------------------------------------------------------------------------ the driver
def child_args(args) -> list:
    out = ["--checkpoint", str(args.checkpoint), "--knowledge", args.knowledge, "--data", args.data,
           "--questions", str(args.questions), "--candidates", *map(str, args.candidates), "--repeats",
           str(args.repeats), "--threads", str(args.threads), "--n-docs", str(args.n_docs), "--memory-batch",
           str(args.memory_batch), "--memory-candidates", str(args.memory_candidates)]
    return out + (["--build-cache"] if args.build_cache else [])


def run_child(args, phase: str, scorer: str) -> dict:
    """``phase`` of ``scorer`` in a fresh process (its own peak memory, its own thread setting)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(ROOT))
    start = time.time()
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure", phase, scorer, *child_args(args)],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"{phase} {scorer}: the measuring process failed (exit {r.returncode})")
    result = json.loads(lines[-1][len("RESULT "):])
    print(f"  {phase:6s} {scorer:12s} {time.time() - start:6.1f}s", file=sys.stderr, flush=True)
    return result


def cell(t: dict) -> str:
    return f"{t['ms_per_question']:,.1f} ({t['load']:.1f})"


def report(result: dict) -> str:
    """BENCHMARKS.md's tables of a result."""
    widths, demo = result["settings"]["candidates"], result["demo"]
    m, k = result["settings"]["memory_candidates"], result["settings"]["n_docs"]
    head = (f"| scorer | {' | '.join(f'L={w}' for w in widths)} | training, L={m} | {demo['updates']} updates x "
            f"{demo['batch']} questions |")
    lines = ["ms per question (1-minute load average); training = the selection pass + the kept "
             f"K={k} with a graph, forward and backward", "", head, "|---" + "|---:" * (len(widths) + 2) + "|"]
    for scorer, t in result["time"].items():
        if "skipped" in t:
            lines.append(f"| {NAMES.get(scorer, scorer)} | skipped: {t['skipped']} |")
            continue
        train = t.get("train")
        total = (f"{train['ms_per_question'] * demo['updates'] * demo['batch'] / 60000:,.1f} min" if train else "")
        lines.append(f"| {NAMES.get(scorer, scorer)} | {' | '.join(cell(t['select'][str(w)]) for w in widths)} | "
                     f"{cell(train) if train else ''} | {total} |")
        if "search" in t:
            lines.append(f"| first stage: MIPS alone | {' | '.join(cell(t['search'][str(w)]) for w in widths)} | | |")
    mem = result["memory"]
    some = next((v for v in mem.values() if "skipped" not in v), {})
    lines += ["", f"Peak RSS rise of one selection pass, {some.get('questions', '?')} questions at L={m} (MiB)", "",
              "| scorer | pass | per question | load |", "|---|---:|---:|---:|"]
    for scorer, v in mem.items():
        name = NAMES.get(scorer, scorer)
        lines.append(f"| {name} | skipped |  |  |" if "skipped" in v else
                     f"| {name} | {v['peak_rise_mib']:,.1f} | {v['peak_rise_mib_per_question']:.2f} | "
                     f"{v['load']:.1f} |")
    s = result["states"]
    disk = f"{s['disk_gb']:.2f} GB" if s["disk_gb"] is not None else "no cache"
    lines += ["", f"Token states: {s['passages']:,} passages x hidden {s['hidden']} x 4 bytes a token "
              f"(tokens from {s['tokens_from']})", "",
              "| tokens mean / p95 / max | KB a passage: mean / p95 / max | all passages | cache on disk | "
              f"LRU of {s['lru_size']}: mean / largest |", "|---|---|---:|---:|---|",
              f"| {s['tokens_mean']} / {s['tokens_p95']:.0f} / {s['tokens_max']} | {s['kb_mean']} / {s['kb_p95']} / "
              f"{s['kb_max']} | {s['states_gb']:.2f} GB | {disk} | {s['lru_mb_mean']} / {s['lru_mb_largest']} MB |"]
    return "\n".join(lines)


def machine() -> str:
    try:
        name = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                    if x.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor()
    return f"{name}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="the pretrained generator (default the demo's pretrain_pseudo checkpoint_best.pt, else _last)")
    ap.add_argument("--knowledge", default=str(ROOT / "data" / "demo" / "ks"), help="the knowledge source")
    ap.add_argument("--data", default=str(ROOT / "data" / "demo" / "nq_demo"), help="the questions: DATA/test.jsonl")
    ap.add_argument("--questions", type=int, default=8, help="questions timed (the first of test.jsonl), one batch")
    ap.add_argument("--candidates", type=int, nargs="+", default=[10, 20, 50], help="the L timed")
    ap.add_argument("--scorers", nargs="+", choices=SCORERS, default=list(SCORERS), help="what is measured")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes of each figure (the fastest is reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (and OMP_NUM_THREADS) of each measurement")
    ap.add_argument("--n-docs", type=int, default=3, help="K, the candidates the stage keeps (the demo trains at 3)")
    ap.add_argument("--memory-batch", type=int, default=32, help="questions of the memory pass (the demo's batch)")
    ap.add_argument("--memory-candidates", type=int, default=20, help="L of the memory pass and of the training cost")
    ap.add_argument("--build-cache", action="store_true", help="build the token-state cache if it is not complete")
    ap.add_argument("--json-out", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--measure", nargs=2, metavar=("PHASE", "SCORER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.checkpoint is None:
        best = CHECKPOINTS / "checkpoint_best.pt"
        args.checkpoint = best if best.is_file() else CHECKPOINTS / "checkpoint_last.pt"
    if args.measure:
        phase, scorer = args.measure
        print("RESULT " + json.dumps(PHASES[phase](args, scorer)), flush=True)
        return 0
    if not args.checkpoint.is_file():
        raise SystemExit(f"no checkpoint at {args.checkpoint}: pass --checkpoint (the demo's pretrained generator)")
    from rag_plugin.pipeline.recipes import load_recipe

    recipe = load_recipe("tiny")
    started = time.time()
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "command": " ".join([Path(sys.executable).name, "benchmarks/rerank_cost.py", *sys.argv[1:]]),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if k not in ("measure", "json_out")},
              "demo": {"updates": int(recipe.optimization.max_update), "batch": int(recipe.dataset.batch_size)},
              "load_at_start": [round(x, 2) for x in os.getloadavg()],
              "time": {s: run_child(args, "time", s) for s in args.scorers},
              "memory": {s: run_child(args, "memory", s) for s in args.scorers},
              "states": run_child(args, "states", "maxsim_cache")}
    result["wall_s"] = round(time.time() - started, 1)
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    text = report(result)
    print(text)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({**result, "report": text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
