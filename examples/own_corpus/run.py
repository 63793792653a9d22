#!/usr/bin/env python
"""Your own corpus, end to end, with the console scripts a user types (each printed as it runs):

    python examples/own_corpus/run.py [--work runs/own_corpus] [--islands 300] [--updates 200] ...

 0. python examples/own_corpus/make_corpus.py: a generated corpus (invented islands: passages.jsonl, and
    question/answer pairs in KILT JSONL split by island into train/valid/test); stands for yours;
 1. rag-vocab: a generator vocabulary (SentencePiece with byte fallback + fairseq dict.txt) from the passages;
 2. rag-build-knowledge: the knowledge source, pre-tokenized with that vocabulary;
 3. rag-pretrain: a tiny generator pretrained on the passages (denoising, then pseudo-questions), as the
    demo does (or --generator-checkpoint with --vocab-from: the demo's, or any generator trained with
    that vocabulary and 96/64 positions);
 4. rag-train: closed book, RAG-Token and RAG-Sequence from it, with the safe defaults (the query encoder
    learns at min(1, 3e-5 / --lr) x --lr; training warns when retrieval collapses);
 5. rag-choose-k: the number of documents K of each RAG model, chosen on the valid set;
 6. rag-generate on the test set with the chosen K; rag-search + rag-evaluate: retrieval (R-precision,
    recall@5) of the knowledge source's own encoder; rag-evaluate: the answers; rag-leaderboard: every row.

Every step is skipped when its output is complete, so a rerun after an interruption continues; a training
run whose settings changed is done again, with what comes after it (the corpus, vocabulary and knowledge
source are kept as they are: use another --work to change them). Logs: WORK/logs/. At the end WORK/leaderboard.md and
WORK/summary.json (chosen K, timings). With OMP_NUM_THREADS=1 on 2 CPU cores it takes about 20 minutes
at the default sizes (examples/own_corpus/README.md); the flags make it smaller (tests/examples run it
in minutes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, Optional

from rag_plugin.pipeline import commands, markers
from rag_plugin.pipeline.recipes import load_recipe, rag_train_args, run_settings
from rag_plugin.util.errors import cli_main
from rag_plugin.util.io import atomic_path, atomic_write_json

HERE = Path(__file__).resolve().parent
#: the systems trained: name -> (architecture, documents in training)
SYSTEMS = {"closed_book": ("rag_token_tiny", 0), "rag_token": ("rag_token_tiny", 3), "rag_seq": ("rag_seq_tiny", 3)}
#: test-time decoding: RAG-Token greedy (the paper's QA preset), RAG-Sequence a beam of 4 with Thorough
BEAM = {"closed_book": 1, "rag_token": 1, "rag_seq": 4}
DECODING = {"rag_seq": ["--rag-decoding", "thorough"]}
#: the rest of the decoding settings, the same on valid (rag-choose-k) and test
GENERATE_OPTIONS = ["--max-len-b", "24", "--num-workers", "0"]
ANSWER_METRICS = "em,f1"
RETRIEVAL_METRICS = "rprec,recall@5"  # of the retriever before training (rag-search): five passages each


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/own_corpus", help="where everything goes (default: %(default)s)")
    ap.add_argument("--islands", type=int, default=300, help="passages of the generated corpus (default: %(default)s)")
    ap.add_argument("--vocab-size", type=int, default=2000, help="generator vocabulary (default: %(default)s)")
    ap.add_argument("--pretrain-updates", type=int, default=150, help="denoising updates (default: %(default)s)")
    ap.add_argument("--pseudo-updates", type=int, default=150, help="pseudo-question updates (default: %(default)s)")
    ap.add_argument("--updates", type=int, default=200, help="updates per system (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=16, help="training batch size (default: %(default)s)")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 3, 5], help="K tried on valid (default: %(default)s)")
    ap.add_argument("--generator-checkpoint", default=None,
                    help="start from this pretrained generator instead of rag-pretrain (needs --vocab-from)")
    ap.add_argument("--vocab-from", default=None,
                    help="directory with the dict.txt and spm.model the generator was trained with (e.g. data/demo)")
    args = ap.parse_args(argv)
    if (args.generator_checkpoint is None) != (args.vocab_from is None):
        ap.error("--generator-checkpoint and --vocab-from go together")
    return args


class Journey:
    """The steps, under ``work``; ``summary`` collects the chosen K and the step timings."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.work = Path(args.work)
        self.corpus = self.work / "corpus"
        self.data = self.corpus / "qa"
        self.ks = self.work / "ks"
        self.vocab = Path(args.vocab_from) if args.vocab_from else self.work / "vocab"
        self.summary: Dict = {"timings_s": {}, "k": {}}

    def log(self, message: str) -> None:
        print(message, flush=True)

    def run(self, program: str, *args, log: Optional[str] = None, stdout: Optional[Path] = None, progress=None):
        log_file = self.work / "logs" / f"{log}.log" if log else None
        commands.run(commands.Command(program, [str(a) for a in args]), log_file=log_file, stdout_file=stdout,
                     progress=progress, echo=self.log)

    def step(self, name: str, done: bool, body) -> None:
        """A named, timed step; skipped when ``done``."""
        self.log(f"\n== {name}")
        if done:
            self.log("   done before (output complete)")
            return
        start = time.perf_counter()
        body()
        self.summary["timings_s"][name] = round(time.perf_counter() - start, 1)
        self.log(f"   ({self.summary['timings_s'][name]:.0f} s)")

    # ------------------------------------------------------------------ corpus, vocabulary, knowledge
    def prepare(self) -> None:
        script = os.path.relpath(HERE / "make_corpus.py")
        self.step("0. a generated corpus (stands for yours)", (self.corpus / "passages.jsonl").is_file(),
                  lambda: self.run("python", script, "--out", self.corpus, "--islands", self.args.islands))
        passages = self.corpus / "passages.jsonl"
        if not self.args.vocab_from:
            self.step("1. a generator vocabulary from your passages", (self.vocab / "vocab.json").is_file(),
                      lambda: self.run("rag-vocab", "--passages", passages, "--questions", self.data / "train.jsonl",
                                       "--out", self.vocab, "--size", self.args.vocab_size))
        self.step("2. the knowledge source, pre-tokenized with that vocabulary", (self.ks / "manifest.json").is_file(),
                  lambda: self.run("rag-build-knowledge", "--passages", passages, "--out", self.ks,
                                   "--dict", self.vocab / "dict.txt", "--bpe-model", self.vocab / "spm.model",
                                   "--quiet", log="build_knowledge"))

    def pretrain(self) -> Path:
        """rag-pretrain skips its finished stages itself: it runs every time."""
        if self.args.generator_checkpoint:
            return Path(self.args.generator_checkpoint)
        out = self.work / "pretrain"
        own_batch = self.args.batch_size != load_recipe().dataset.batch_size
        batch = ["--batch-size", self.args.batch_size] if own_batch else []
        self.step("3. a generator pretrained on your passages", False,
                  lambda: self.run("rag-pretrain", "--knowledge", self.ks, "--out", out, "--updates",
                                   self.args.pretrain_updates, "--pseudo-updates", self.args.pseudo_updates, *batch))
        return out / "generator.pt"

    # ------------------------------------------------------------------ training and K
    def train(self, name: str, generator: Path) -> Path:
        """One system from the pretrained generator; a retrained system's later outputs are redone."""
        arch, n_docs = SYSTEMS[name]
        save = self.work / "checkpoints" / name
        settings = {"updates": self.args.updates, "batch_size": self.args.batch_size, "arch": arch, "n_docs": n_docs,
                    "generator": str(generator),
                    "generator_mtime_ns": generator.stat().st_mtime_ns}

        def body():
            markers.prepare(save, settings)
            for stale in (self.work / f"k_{name}.json", self.test_output(name)):
                stale.unlink(missing_ok=True)
            system = {"model._name": arch, "criterion._name": "marginal_nll", "task.n_docs": n_docs,
                      "dataset.batch_size": self.args.batch_size}
            run = run_settings(self.data, self.ks, save, self.args.updates, init=generator)
            self.run("rag-train", *rag_train_args(load_recipe(), system, run), log=f"train_{name}",
                     progress=commands.condensed)
            markers.mark_finished(save, settings)

        what = "closed book (no retrieval)" if n_docs == 0 else f"{arch}, K={n_docs} in training"
        self.step(f"4. train {name}: {what}", markers.is_finished(save, settings), body)
        return save / "checkpoint_last.pt"

    def choose_k(self, name: str, checkpoint: Path) -> int:
        out = self.work / f"k_{name}.json"
        self.step(f"5. choose K for {name} on the valid set", out.is_file(),
                  lambda: self.run("rag-choose-k", "--checkpoint", checkpoint, "--data", self.data, "--knowledge",
                                   self.ks, "--k", *self.args.k, "--out-dir", self.work / "choose_k" / name,
                                   "--beam", BEAM[name], "--json-out", out, "--", *DECODING.get(name, []),
                                   *GENERATE_OPTIONS))
        best = int(json.loads(out.read_text())["best_k"])
        self.summary["k"][name] = best
        return best

    # ------------------------------------------------------------------ test set
    def test_output(self, name: str) -> Path:
        return self.work / "test" / f"{name}.txt"

    def generate(self, name: str, checkpoint: Path, k: Optional[int]) -> Path:
        """rag-generate on the test set (a closed-book checkpoint knows it reads no documents)."""
        out = self.test_output(name)
        n_docs = [] if k is None else ["--n-docs", k]

        def body():
            with atomic_path(out) as tmp:
                self.run("rag-generate", self.data, "--task", "retrieval_augmented", "--knowledge", self.ks,
                         "--path", checkpoint, "--gen-subset", "test", *n_docs, "--beam", BEAM[name],
                         *DECODING.get(name, []), "--batch-size", 32, *GENERATE_OPTIONS,
                         log=f"test_{name}", stdout=tmp, progress=commands.generation_progress)

        self.step(f"6. test answers of {name}" + (f" (K={k})" if k else ""), out.is_file(), body)
        return out

    def retrieval(self) -> None:
        """The knowledge source's own encoder as the retriever, scored against the gold passages."""
        hits = self.work / "test" / "retrieval_hits.jsonl"
        scores = self.work / "test" / "retrieval_scores.json"

        def body():
            self.run("rag-search", "--knowledge", self.ks, "--data-file", self.data / "test.jsonl", "-k", 5,
                     "--kilt-out", hits, stdout=self.work / "test" / "retrieval_search.jsonl")
            self.run("rag-evaluate", "--gold", self.data / "test.jsonl", "--guess", hits, "--metrics",
                     RETRIEVAL_METRICS, "--json-out", scores)

        self.step("6. retrieval on the test set (before training: the knowledge source's encoder)",
                  scores.is_file(), body)
        self.summary["retrieval_before_training"] = json.loads(scores.read_text())

    def leaderboard(self, outputs: Dict[str, Path]) -> None:
        """rag-evaluate on RAG-Token's answers (answer_in_top<K>: a gold answer in the title or text of one
        of the K passages it read), then every system in one table. The leaderboard's retrieval column is
        R-precision (here: the trained query encoder's first passage is the gold one): recall@5 needs five
        passages, and a model that reads K < 5 lists only K."""
        gold = self.data / "test.jsonl"
        k = self.summary["k"]["rag_token"]

        def body():
            self.run("rag-evaluate", "--gold", gold, "--guess", outputs["rag_token"], "--metrics",
                     f"{ANSWER_METRICS},rprec,answer_in_top{k}", "--passages", self.ks)
            systems = [a for name, path in outputs.items() for a in ("--system", f"{name}={path}")]
            self.run("rag-leaderboard", "--gold", gold, "--metrics", f"{ANSWER_METRICS},rprec", *systems,
                     "--json-out", self.work / "leaderboard.json", "--md-out", self.work / "leaderboard.md")

        self.step("6. the answers scored, and the leaderboard", False, body)


@cli_main
def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    journey = Journey(args)
    journey.prepare()
    generator = journey.pretrain()
    checkpoints = {name: journey.train(name, generator) for name in SYSTEMS}
    chosen = {name: journey.choose_k(name, ckpt) for name, ckpt in checkpoints.items() if SYSTEMS[name][1]}
    outputs = {name: journey.generate(name, ckpt, chosen.get(name)) for name, ckpt in checkpoints.items()}
    journey.retrieval()
    journey.leaderboard(outputs)
    journey.summary["total_s"] = round(time.perf_counter() - started, 1)
    atomic_write_json(journey.work / "summary.json", journey.summary)
    print(f"\n{journey.work / 'leaderboard.md'}; {journey.summary['total_s'] / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
