#!/usr/bin/env python
"""rag-serve under load (``rag_plugin/serving``): throughput and latency against the hub, a mixed load test, and
the knowledge source's pages shared by ``--workers 2``.

    .venv/bin/python benchmarks/serve_load.py [--path runs/demo/checkpoints/rag_token/checkpoint_best.pt] \\
        [--questions data/demo/nq_demo/test.jsonl] [--requests 128] [--levels 1 4 16] [--load-requests 2000] \\
        [--json-out benchmarks/results/serve_load.json]

A benchmark, not a test: it reports (and says which targets were met). Everything runs the real code on loopback:
``rag-serve`` itself in a subprocess on a free port (stopped with SIGTERM; its exit status is recorded), clients
are threads of this process, each over its own keep-alive ``http.client`` connection. The server and the hub get
``--threads`` torch threads (default: every core this process may use, which is torch's own default on this
machine); run it without ``OMP_NUM_THREADS=1``, or ``--threads`` says otherwise.

Phases (``--phases``):

* ``hub``: the questions answered one at a time in this process, ``RAG.from_pretrained(path).generate([q],
  beam=B)``: the baseline's throughput, and the answers the load test is checked against; then the service's
  engine (``rag_plugin.serving.engine.Engine`` over the same model, no HTTP) answers one batch of ``--max-batch``
  and the same questions one at a time: the compute a batch saves, without the service around it.
* ``levels``: ``rag-serve --max-batch M --max-wait-ms W``; at each ``--levels`` C, C clients send ``--requests``
  questions between them (``/v1/answer``, beam B, the default k), with ``explain`` false and then true; the
  throughput (requests / wall time), p50 and p99 latency, and the server's batches over the level (``/v1/health``'s
  ``batches``/``batched``: the mean batch), the server's CPU use and the clients'.
* ``nobatch``: the same at the largest level against ``rag-serve --max-batch 1`` (no batching): batching's gain
  apart from the service's own overhead.
* ``load``: ``--load-requests`` from ``--load-clients`` clients against the ``levels`` server: 60% answers
  (explain true or false), 30% searches (1-3 queries, k 1-10, retriever model/dense/bm25/hybrid), 10% malformed
  (invalid JSON, an empty question, k above max_k, a wrong content type, an unknown field). Checked: no 5xx, every
  malformed request a 4xx, the server's VmRSS flat (sampled every ``--rss-interval`` s: the mean of the last 10%
  of samples against the sample when 10% of the requests were answered), and ``--sample`` distinct questions'
  answers equal to the hub's (answer, passage ids in order, score and passage probabilities within 1e-4).
* ``workers``: ``rag-serve --workers 2``, both workers warmed (``--warm-requests``, a new connection each, until
  both have used CPU); per worker, ``/proc/PID/smaps`` summed over the mappings of each file of the knowledge source
  (matched by inode): Rss, Pss, Shared_Clean, Private_Clean, Private_Dirty; and the worker's whole memory.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load_http as H  # noqa: E402  (this folder's plumbing)
from retrieval_common import machine_info  # noqa: E402
from serve_load_report import report, verdicts  # noqa: E402

ROOT = H.ROOT
DEFAULT_PATH = ROOT / "runs" / "demo" / "checkpoints" / "rag_token" / "checkpoint_best.pt"
DEFAULT_QUESTIONS = ROOT / "data" / "demo" / "nq_demo" / "test.jsonl"
RETRIEVERS = ("model", "dense", "bm25", "hybrid")
MALFORMED = ("invalid_json", "empty_question", "k_too_large", "wrong_content_type", "unknown_field")
TOLERANCE = 1e-4


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def read_questions(path: Path) -> List[str]:
    """Distinct questions, in file order: a .jsonl's "input" (or "question") fields, else a text file's lines."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        if str(path).endswith(".jsonl"):
            row = json.loads(line)
            line = row.get("input", row.get("question"))
        if line and line.strip() and line not in out:
            out.append(line)
    if not out:
        raise SystemExit(f"no questions in {path}")
    return out


def answer_request(question: str, beam: int, explain: bool) -> H.Request:
    body = json.dumps({"question": question, "beam": beam, "explain": explain}).encode()
    return H.Request("answer", "/v1/answer", body, question=question)


def latency(outcomes: List[H.Outcome], wall: float) -> Dict:
    ms = np.array([o.latency_ms for o in outcomes])
    ok = sum(o.status == 200 for o in outcomes)
    return {"requests": len(outcomes), "ok": ok, "wall_s": round(wall, 3),
            "throughput_qps": round(ok / wall, 2), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "mean_ms": round(float(ms.mean()), 1)}


# ------------------------------------------------------------------------------------------ hub and engine
def hub_phase(args, questions: List[str]) -> Dict:
    import torch

    from rag_plugin.hub import RAG

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    rag = RAG.from_pretrained(str(args.path))
    load_s = time.perf_counter() - started
    rag.generate([questions[0]], beam=args.beam)  # warm-up
    answers, times = {}, []
    for q in questions:
        t = time.perf_counter()
        answers[q] = rag.generate([q], beam=args.beam)[0]
        times.append(1000.0 * (time.perf_counter() - t))
    ms = np.array(times)
    weights = sum(p.numel() * p.element_size() for p in rag.model.parameters())
    out = {"threads": torch.get_num_threads(), "model_parameters_mib": round(weights / 2 ** 20, 1),
           "load_s": round(load_s, 1), "requests": len(questions),
           "wall_s": round(ms.sum() / 1000, 3), "throughput_qps": round(1000 * len(ms) / ms.sum(), 2),
           "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
           "mean_ms": round(float(ms.mean()), 1), "load_avg": os.getloadavg()[0]}
    out["engine"] = engine_phase(args, rag, questions[:args.max_batch])
    return {"baseline": out, "answers": answers}


def engine_phase(args, rag, batch: List[str]) -> Dict:
    """The service's engine without HTTP: ms per question answering ``batch`` at once and one at a time."""
    from rag_plugin.serving.engine import AnswerKey, Engine
    from rag_plugin.serving.settings import ServeSettings

    engine = Engine(rag, ServeSettings(path=str(args.path), max_batch=args.max_batch))
    out = {"batch": len(batch)}
    for explain in (False, True):
        key = AnswerKey(k=engine.default_k, decoding=engine.default_decoding, beam=args.beam, max_len=64,
                        explain=explain)
        engine.answer(key, batch[:2])  # warm-up: the generator of this key
        t = time.perf_counter()
        for q in batch:
            engine.answer(key, [q])
        alone = 1000.0 * (time.perf_counter() - t) / len(batch)
        t = time.perf_counter()
        engine.answer(key, batch)
        together = 1000.0 * (time.perf_counter() - t) / len(batch)
        out["explain" if explain else "plain"] = {"ms_per_question_alone": round(alone, 1),
                                                  "ms_per_question_batched": round(together, 1),
                                                  "batch_speedup": round(alone / together, 2)}
    return out


# ------------------------------------------------------------------------------------------ the levels
def level(server: H.Server, questions: List[str], clients: int, explain: bool, args) -> Dict:
    """``clients`` clients sending ``questions`` (each its share) to /v1/answer."""
    plans = H.deal([answer_request(q, args.beam, explain) for q in questions], clients)
    warm = [answer_request(q, args.beam, explain) for q in questions[:clients]]
    H.run_clients(server.port, H.deal(warm, clients))  # warm-up: one request per client, not counted
    before, cpu, own = server.get("/v1/health"), H.cpu_seconds(server.pid), time.process_time()
    outcomes, wall = H.run_clients(server.port, plans, keep_bodies=lambda r: True)
    after = server.get("/v1/health")
    batches, batched = after["batches"] - before["batches"], after["batched"] - before["batched"]
    out = {"clients": clients, "explain": explain, **latency(outcomes, wall),
           "statuses": sorted({o.status for o in outcomes}), "batches": batches,
           "mean_batch": round(batched / max(1, batches), 2),
           "server_ms_mean": round(float(np.mean([json.loads(o.body)["elapsed_ms"] for o in outcomes
                                                  if o.status == 200] or [0.0])), 1),
           "server_cpu_pct": round(100 * (H.cpu_seconds(server.pid) - cpu) / wall),
           "client_cpu_pct": round(100 * (time.process_time() - own) / wall), "load_avg": os.getloadavg()[0]}
    log(f"  {clients:2d} clients explain={explain!s:5s}: {out['throughput_qps']:7.2f} q/s  p50 {out['p50_ms']:7.1f}"
        f"  p99 {out['p99_ms']:7.1f} ms  mean batch {out['mean_batch']}")
    return out


def levels_phase(server: H.Server, questions: List[str], levels: List[int], args) -> List[Dict]:
    return [level(server, questions, c, explain, args) for explain in (False, True) for c in levels]


# ------------------------------------------------------------------------------------------ the load test
def load_plan(questions: List[str], asked: List[str], n: int, info: Dict, rng: random.Random,
              beam: int) -> List[H.Request]:
    """``n`` requests, shuffled: 60% answers (cycling through ``asked``, explain true or false), 30% searches of
    ``questions``, 10% malformed (each kind of MALFORMED in turn)."""
    n_answer, n_search = round(0.6 * n), round(0.3 * n)
    order = list(asked)
    rng.shuffle(order)
    out = [answer_request(order[i % len(order)], beam, rng.random() < 0.5) for i in range(n_answer)]
    for _ in range(n_search):
        queries = rng.sample(questions, min(len(questions), rng.randint(1, 3)))
        body = {"queries": queries, "k": rng.randint(1, min(10, info["max_k"])), "retriever": rng.choice(RETRIEVERS)}
        out.append(H.Request("search", "/v1/search", json.dumps(body).encode()))
    for i in range(n - n_answer - n_search):
        out.append(malformed(MALFORMED[i % len(MALFORMED)], rng.choice(questions), info["max_k"]))
    rng.shuffle(out)
    return out


def malformed(kind: str, question: str, max_k: int) -> H.Request:
    path = "/v1/answer"
    if kind == "invalid_json":
        return H.Request(kind, path, b'{"question": "' + question.encode() + b'", "beam": ')
    if kind == "empty_question":
        return H.Request(kind, path, json.dumps({"question": "   "}).encode())
    if kind == "k_too_large":
        return H.Request(kind, path, json.dumps({"question": question, "k": max_k + 1}).encode())
    if kind == "wrong_content_type":
        return H.Request(kind, path, question.encode(), headers={"Content-Type": "text/plain"})
    return H.Request(kind, path, json.dumps({"question": question, "colour": "blue"}).encode())


def load_phase(server: H.Server, questions: List[str], hub_answers: Dict, args) -> Dict:
    info = server.get("/v1/info")
    for retriever in RETRIEVERS:  # warm-up: each first stage is built on its first search
        body = json.dumps({"queries": questions[:1], "retriever": retriever}).encode()
        H.run_clients(server.port, [[H.Request("search", "/v1/search", body)]])
    plan = load_plan(questions, list(hub_answers), args.load_requests, info, random.Random(args.seed), args.beam)
    done: list = []
    sampler = H.RssSampler(server.pid, done, args.rss_interval)
    sampler.start()
    outcomes, wall = H.run_clients(server.port, H.deal(plan, args.load_clients), done=done,
                                   keep_bodies=lambda r: r.kind == "answer")
    samples = sampler.finish()
    counts: Dict[str, Dict[str, int]] = {}
    for o in outcomes:
        by = counts.setdefault(o.kind, {})
        by[str(o.status)] = by.get(str(o.status), 0) + 1
    bad = [o for o in outcomes if o.kind in MALFORMED and not 400 <= o.status < 500]
    out = {"requests": len(outcomes), "clients": args.load_clients, "wall_s": round(wall, 1),
           "throughput_rps": round(len(outcomes) / wall, 1), "statuses": counts,
           "server_errors": sum(o.status >= 500 for o in outcomes),
           "connection_errors": sum(o.status == 0 for o in outcomes),
           "malformed": sum(o.kind in MALFORMED for o in outcomes), "malformed_not_4xx": len(bad),
           "unexpected_non_200": sum(o.kind in ("answer", "search") and o.status != 200 for o in outcomes),
           "rss": rss_drift(samples, len(outcomes)), "agreement": agreement(outcomes, hub_answers, args.sample),
           "latency": {kind: latency([o for o in outcomes if o.kind == kind], wall)
                       for kind in ("answer", "search")}, "load_avg": os.getloadavg()[0]}
    out["first_errors"] = [f"{o.kind} {o.status} {o.error or o.body[:200]!r}" for o in outcomes
                           if o.status >= 500 or o.status == 0 or o in bad][:5]
    return out


def rss_drift(samples, total: int) -> Dict:
    """The sample when 10% of the requests were answered against the mean of the last 10% of samples."""
    if not samples:
        return {"samples": 0}
    base = next((s for s in samples if s[0] >= 0.1 * total), samples[-1])
    tail = samples[-max(1, len(samples) // 10):]
    mean_tail = float(np.mean([s[1] for s in tail]))
    return {"samples": len(samples), "first_mib": round(samples[0][1] / 1024, 1),
            "after_warmup_mib": round(base[1] / 1024, 1), "after_warmup_at_request": base[0],
            "last_10pct_mean_mib": round(mean_tail / 1024, 1), "max_mib": round(max(s[1] for s in samples) / 1024, 1),
            "drift_pct": round(100 * (mean_tail - base[1]) / base[1], 2),
            "curve": [[n, round(kb / 1024, 1)] for n, kb in samples[::max(1, len(samples) // 20)]]}


def agreement(outcomes: List[H.Outcome], hub_answers: Dict, sample: int) -> Dict:
    """The first answer of each of ``sample`` distinct questions (in the hub's order) against the hub's."""
    served = {}
    for o in outcomes:
        if o.kind == "answer" and o.status == 200 and o.question in hub_answers and o.question not in served:
            served[o.question] = json.loads(o.body)
    chosen = [q for q in hub_answers if q in served][:sample]
    mismatches, score_diff, prob_diff = [], 0.0, 0.0
    for q in chosen:
        s, h = served[q], hub_answers[q]
        d_score = abs(s["score"] - h["score"])
        ids_s, ids_h = [p["id"] for p in s["passages"]], [p["id"] for p in h["provenance"]]
        d_prob = max((abs(a["prior"] - b["p"]) for a, b in zip(s["passages"], h["provenance"])), default=0.0)
        score_diff, prob_diff = max(score_diff, d_score), max(prob_diff, d_prob)
        if s["answer"] != h["answer"] or ids_s != ids_h or d_score > TOLERANCE or d_prob > TOLERANCE:
            mismatches.append({"question": q, "served": [s["answer"], ids_s, s["score"]],
                               "hub": [h["answer"], ids_h, h["score"]]})
    return {"compared": len(chosen), "equal": len(chosen) - len(mismatches), "max_score_diff": score_diff,
            "max_prob_diff": prob_diff, "tolerance": TOLERANCE, "mismatches": mismatches[:5]}


# ------------------------------------------------------------------------------------------ --workers 2
def workers_phase(args, questions: List[str], log_dir: Path) -> Dict:
    options = ["--workers", "2", "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
    server = H.Server(args.path, options, log_dir / "workers.log", args.threads, args.rag_serve).wait_up()
    try:
        info = server.get("/v1/info")
        ks = Path(info["knowledge"]["path"])
        ks = ks if ks.is_absolute() else ROOT / ks
        workers = [p for p in H.children(server.pid) if "spawn_main" in H.cmdline(p)]
        inodes = H.file_inodes(ks)
        cpu0 = {p: H.cpu_seconds(p) for p in workers}
        sent, deadline = 0, time.monotonic() + 180
        while time.monotonic() < deadline:  # until each worker has read passages (it answered): the other may load
            batch = [answer_request(questions[(sent + i) % len(questions)], args.beam, False)
                     for i in range(args.warm_requests)]
            outcomes, _ = H.run_clients(server.port, H.deal(batch, 4), close=True)
            sent += len(outcomes)
            if all(answered(p, inodes) for p in workers):
                break
        sizes = {name: (ks / name).stat().st_size for name in inodes.values()}
        out = {"command": server.command, "knowledge": str(ks), "warm_requests": sent,
               "supervisor": {"pid": server.pid, "ks_mapped": sorted(H.mapped_files(server.pid, inodes))},
               "benchmark_process_maps_ks": sorted(H.mapped_files(os.getpid(), inodes)), "file_bytes": sizes,
               "workers": []}
        for pid in workers:
            files = H.mapped_files(pid, inodes)
            out["workers"].append({"pid": pid, "cpu_s": round(H.cpu_seconds(pid) - cpu0[pid], 2),
                                   "rollup": H.rollup(pid), "files": files})
    finally:
        out_code = server.stop()
    out["exit_status"] = out_code
    return out


def answered(pid: int, inodes) -> bool:
    """The worker has read its passage store (pages of it resident): it has answered."""
    return any(f["Rss"] > 0 for name, f in H.mapped_files(pid, inodes).items() if name.startswith("passages"))


# ------------------------------------------------------------------------------------------ the driver
def machine() -> str:
    info = machine_info()  # the retrieval benchmarks' reading of /proc/cpuinfo
    return f"{info.get('cpu') or platform.processor()}, {info['nproc']} cores, {int(info.get('mem_gib', 0))} GiB"


def _plain(value):
    """numpy scalars as Python's (for json.dumps)."""
    return value.item() if hasattr(value, "item") else str(value)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", type=Path, default=DEFAULT_PATH, help="the checkpoint served (and loaded by the hub)")
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="a .jsonl (its 'input') or .txt")
    ap.add_argument("--requests", type=int, default=128, help="questions per level (the first of --questions)")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16], help="concurrent clients of each level")
    ap.add_argument("--beam", type=int, default=4, help="beam of every answer (the hub's and the service's)")
    ap.add_argument("--max-batch", type=int, default=16, help="rag-serve --max-batch of the batching server")
    ap.add_argument("--max-wait-ms", type=float, default=5.0, help="rag-serve --max-wait-ms")
    ap.add_argument("--load-requests", type=int, default=2000, help="requests of the load test")
    ap.add_argument("--load-clients", type=int, default=16, help="concurrent clients of the load test")
    ap.add_argument("--sample", type=int, default=50, help="distinct questions of the load test checked")
    ap.add_argument("--rss-interval", type=float, default=0.25, help="seconds between the server's VmRSS samples")
    ap.add_argument("--warm-requests", type=int, default=50, help="requests warming --workers 2 (per round)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch threads of the server and the hub (default: the cores this process may use)")
    ap.add_argument("--phases", nargs="+", default=["hub", "levels", "nobatch", "load", "workers"],
                    choices=["hub", "levels", "nobatch", "load", "workers"], help="what runs (load needs hub)")
    ap.add_argument("--seed", type=int, default=0, help="the load test's plan")
    ap.add_argument("--rag-serve", default=None, help="the server program (default: this Python's rag-serve)")
    ap.add_argument("--log-dir", type=Path, default=None, help="the servers' logs (default: a temporary folder)")
    ap.add_argument("--json-out", type=Path, default=None, help="write the results here as JSON")
    return ap.parse_args(argv)


def serve_phases(args, questions, hub, log_dir: Path, result: Dict) -> None:
    """The levels, the load test and the server without batching."""
    top = max(args.levels)
    batching = ["--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms)]
    if "levels" in args.phases or "load" in args.phases:
        server = H.Server(args.path, batching, log_dir / "levels.log", args.threads, args.rag_serve).wait_up()
        result["servers"]["batching"] = {"command": server.command}
        try:
            if "levels" in args.phases:
                log(f"levels {args.levels}, {args.requests} requests each")
                result["levels"] = levels_phase(server, questions[:args.requests], args.levels, args)
            if "load" in args.phases:
                log(f"load test: {args.load_requests} requests from {args.load_clients} clients")
                result["load"] = load_phase(server, questions, hub["answers"], args)
                log(f"  {result['load']['throughput_rps']} requests/s, {result['load']['server_errors']} 5xx, "
                    f"RSS drift {result['load']['rss'].get('drift_pct')}%")
        finally:
            result["servers"]["batching"]["exit_status"] = server.stop()
    if "nobatch" in args.phases:
        log(f"--max-batch 1 at {top} clients")
        server = H.Server(args.path, ["--max-batch", "1"], log_dir / "nobatch.log", args.threads,
                          args.rag_serve).wait_up()
        try:
            result["nobatch"] = [level(server, questions[:args.requests], top, e, args) for e in (False, True)]
        finally:
            result["servers"]["nobatch"] = {"command": server.command, "exit_status": server.stop()}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.path.is_file():
        raise SystemExit(f"no checkpoint at {args.path}: pass --path")
    if "load" in args.phases and "hub" not in args.phases:
        raise SystemExit("the load test checks answers against the hub's: --phases needs hub too")
    questions = read_questions(args.questions)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="serve_load_"))
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
              "command": " ".join([Path(sys.executable).name, "benchmarks/serve_load.py", *(argv or sys.argv[1:])]),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if k not in ("json_out", "log_dir")},
              "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"), "questions_read": len(questions),
              "load_at_start": [round(x, 2) for x in os.getloadavg()], "servers": {}}
    hub = None
    if "hub" in args.phases:
        log(f"hub: {min(args.requests, len(questions))} questions one at a time, {args.threads} threads")
        hub = hub_phase(args, questions[:args.requests])
        result["hub"] = hub["baseline"]
        log(f"  {result['hub']['throughput_qps']} q/s, p50 {result['hub']['p50_ms']} ms")
    serve_phases(args, questions, hub, log_dir, result)
    if hub is not None:  # the hub's model maps the knowledge source too: let it go before the workers are read
        del hub
        gc.collect()
    if "workers" in args.phases:
        log("--workers 2: the knowledge source's mappings")
        result["workers"] = workers_phase(args, questions, log_dir)
    result["wall_s"] = round(time.time() - started, 1)
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["verdicts"] = verdicts(result)
    text = report(result)
    print(text)
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({**result, "report": text}, indent=1, default=_plain) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
