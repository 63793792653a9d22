"""Bad input to every command line ends in one line, exit status 2, and leaves nothing that
looks valid.

One table, one row per case: the bad files a case writes into its own directory, the command
as a user would type it (a console script such as ``rag-build-knowledge``, or
``fairseq-train``/``fairseq-generate`` with ``--user-dir rag_plugin``), and the words the error
line must hold (the file, ``file:line`` where a line is at fault, and the fact). Every case must:

* exit with status 2;
* print exactly one non-empty line on stderr, ``error: <file>[:<line>]: <what> (<fix>)``, once
  log lines are set aside: fairseq's (it logs at INFO level by design; in fairseq-generate a
  fairseq module turns on Python's default log format on stderr, so those lines come as
  ``INFO:<logger>:...`` there) and the builder's ``passage store: N passages`` progress line.
  Everything else counts: a warning, a usage text, a traceback;
* show no traceback anywhere;
* leave no output that looks valid: the case's output paths do not exist (or, for a directory,
  holds no ``manifest.json`` / checkpoint), nothing on stdout but fairseq's log lines, no
  hypotheses, no training update, and a pre-existing checkpoint is unchanged.

Malicious files (a pickle whose ``__reduce__`` would create a marker file) also check that the
marker was never created.

The cases run as subprocesses, three at a time; the whole table takes about a minute on two
cores. ``python -m tests.test_bad_inputs`` prints the table of what each case produced.
"""
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAST_ENCODER = "random:dim=8,layers=1,heads=1,intermediate=16,seed=0"

# fairseq's own logging lines (see the module docstring)
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|DEBUG) \| |(INFO|DEBUG):[\w.]+:"
                      r"|passage store: \d+ passages$)")


class Evil:
    """Creates ``marker`` when unpickled: what a malicious checkpoint or array file does."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@dataclass
class Case:
    name: str
    make: Callable[[Path, dict], List[str]]   # writes the bad files into the case dir, returns argv
    expect: List[str]                          # every one must be in the error line
    outputs: List[str] = field(default_factory=list)  # paths (in the case dir) that must not look valid
    marker: bool = False                       # a malicious file must not have run
    unchanged: List[str] = field(default_factory=list)  # files whose bytes must not change


# ------------------------------------------------------------------------------------ commands
def script(program: str, *args) -> List[str]:
    """A console script of the plugin, as installed beside this Python."""
    return [str(BIN / program), *map(str, args)]


def fairseq_train(world, data, save_dir, knowledge=None, arch="rag_token_tiny", n_docs=3, extra=()):
    return [str(BIN / "fairseq-train"), str(data), "--user-dir", str(ROOT / "rag_plugin"),
            "--task", "retrieval_augmented", "--knowledge", str(knowledge or world["ks"]), "--arch", arch,
            "--criterion", "marginal_nll", "--n-docs", str(n_docs), "--optimizer", "adam", "--lr", "1e-3",
            "--batch-size", "8", "--max-update", "1", "--save-dir", str(save_dir), "--cpu",
            "--num-workers", "0", "--no-progress-bar", "--disable-validation", *map(str, extra)]


def fairseq_generate(world, path, data=None, knowledge=None, n_docs=3, extra=()):
    return [str(BIN / "fairseq-generate"), str(data or world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
            "--task", "retrieval_augmented", "--knowledge", str(knowledge or world["ks"]), "--path", str(path),
            "--gen-subset", "test", "--n-docs", str(n_docs), "--beam", "2", "--batch-size", "8", "--cpu",
            "--num-workers", "0", *map(str, extra)]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    e.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # safe loading on, as by default
    return e


# ------------------------------------------------------------------------------------ bad files
def lines(path: Path, rows, raw=False) -> Path:
    """Write rows (dicts as JSON, strings as they are) one per line; ``raw``: bytes as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if raw:
        path.write_bytes(rows)
    else:
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


PSG = [{"id": "a", "title": "A", "text": "alpha beta"}, {"id": "b", "title": "B", "text": "gamma delta"},
       {"id": "c", "title": "C", "text": "epsilon zeta"}]
QA = {"id": "x1", "input": "What is the capital of X?", "output": [{"answer": "Y"}]}


def copy_ks(world, d: Path, name="ks") -> Path:
    import shutil

    out = d / name
    shutil.copytree(world["ks"], out)
    return out


def edit_manifest(ks: Path, **changes) -> None:
    m = json.loads((ks / "manifest.json").read_text())
    m.update(changes)
    (ks / "manifest.json").write_text(json.dumps(m))


def build(d, passages, *extra, out="ks_out"):
    return script("rag-build-knowledge", "--passages", passages, "--out", out, "--encoder", FAST_ENCODER,
              "--quiet", *extra)


def search(ks, *extra):
    return script("rag-search", "--knowledge", ks, "--query", "What is the capital?", *extra)


def data_dir(world, d: Path, train_rows) -> Path:
    data = d / "data"
    lines(data / "train.jsonl", train_rows)
    (data / "valid.jsonl").write_text((world["data"] / "valid.jsonl").read_text())
    return data


def case_table() -> List[Case]:
    def b_trunc_jsonl(d, w):
        text = "".join(json.dumps(r) + "\n" for r in PSG)
        (d / "psgs.jsonl").write_text(text[:-15])  # the last line cut short
        return build(d, "psgs.jsonl")

    def b_latin1_tsv(d, w):
        lines(d / "psgs.tsv", b"id\ttext\ttitle\na\talpha\tA\nb\tcaf\xe9 au lait\tB\n", raw=True)
        return build(d, "psgs.tsv")

    def b_columns(d, w):
        lines(d / "psgs.tsv", ["id\ttext\ttitle", "a\talpha beta", "b\tgamma\tB"])
        return build(d, "psgs.tsv")

    def b_duplicate(d, w):
        lines(d / "psgs.jsonl", PSG + [{"id": "b", "title": "B2", "text": "again"}])
        return build(d, "psgs.jsonl")

    def b_empty(d, w):
        (d / "psgs.jsonl").write_text("\n\n")
        return build(d, "psgs.jsonl")

    def b_missing_text(d, w):
        lines(d / "psgs.jsonl", [PSG[0], {"id": "b", "title": "B"}])
        return build(d, "psgs.jsonl")

    def b_ivf_too_big(d, w):
        lines(d / "psgs.jsonl", PSG)
        return build(d, "psgs.jsonl", "--index-factory", "IVF64,Flat")

    def b_factory(d, w):
        lines(d / "psgs.jsonl", PSG)
        return build(d, "psgs.jsonl", "--index-factory", "Flatt")

    def b_foreign_out(d, w):
        lines(d / "psgs.jsonl", PSG)
        (d / "ks_out").mkdir()
        (d / "ks_out" / "thesis.txt").write_text("precious")
        return build(d, "psgs.jsonl")

    def b_reuse_other_encoder(d, w):
        lines(d / "psgs.jsonl", PSG)
        return build(d, "psgs.jsonl", "--reuse-vectors-from", w["ks"])

    def b_reuse_other_max_length(d, w):
        from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source

        lines(d / "psgs.jsonl", PSG)
        build_knowledge_source(str(d / "old"), BuildSettings(passages=str(d / "psgs.jsonl"), encoder=FAST_ENCODER),
                               BuildOptions(progress=False, log=lambda m: None))
        return build(d, "psgs.jsonl", "--encoder", FAST_ENCODER + ",max_length=8", "--reuse-vectors-from", "old")

    def b_same_file_twice(d, w):
        lines(d / "psgs.jsonl", PSG)
        return script("rag-build-knowledge", "--passages", "psgs.jsonl", "psgs.jsonl", "--out", "ks_out",
                  "--encoder", FAST_ENCODER, "--quiet")

    def dpr_encoder(d, seed):  # hf-dpr:DIR, written again with other weights at the same path
        from rag_plugin.retrieval.encoders import build_random_encoder, save_hf_dpr

        save_hf_dpr(build_random_encoder(dim=8, layers=1, heads=1, intermediate=16, seed=seed, pooling="cls",
                                         normalize=False), d / "dpr")
        return f"hf-dpr:{d / 'dpr'}"

    def b_encoder_changed(d, w):
        from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source

        lines(d / "psgs.jsonl", PSG)
        build_knowledge_source(str(d / "ks_out"), BuildSettings(passages=str(d / "psgs.jsonl"),
                                                                encoder=dpr_encoder(d, 0)),
                               BuildOptions(progress=False, log=lambda m: None))
        return build(d, "psgs.jsonl", "--encoder", dpr_encoder(d, 1))

    def b_resume_encoder_changed(d, w):
        from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
        from rag_plugin.retrieval.encoders import load_encoder

        lines(d / "psgs.jsonl", PSG)
        spec = dpr_encoder(d, 0)
        interrupted = load_encoder(spec)
        interrupted.encode_passages = lambda *a, **k: 1 / 0  # the build stops while embedding
        try:
            build_knowledge_source(str(d / "ks_out"), BuildSettings(passages=str(d / "psgs.jsonl"), encoder=spec),
                                   BuildOptions(progress=False, log=lambda m: None), BuildHooks(encoder=interrupted))
        except ZeroDivisionError:
            pass
        return build(d, "psgs.jsonl", "--encoder", dpr_encoder(d, 1))

    def s_index_cut(d, w):
        ks = copy_ks(w, d)
        raw = (ks / "index.faiss").read_bytes()
        (ks / "index.faiss").write_bytes(raw[: len(raw) // 2])
        return search("ks")

    def s_vectors_cut(d, w):
        ks = copy_ks(w, d)
        raw = (ks / "vectors.npy").read_bytes()
        (ks / "vectors.npy").write_bytes(raw[:-64])
        return search("ks")

    def s_half_built(d, w):
        ks = copy_ks(w, d)
        (ks / "manifest.json").unlink()
        (ks / ".build" / "shards").mkdir(parents=True)
        return search("ks")

    def s_manifest_json(d, w):
        ks = copy_ks(w, d)
        (ks / "manifest.json").write_text('{"format": "rag_plugin.knowledge/1", "count": ')
        return search("ks")

    def s_index_count(d, w):
        import faiss

        ks = copy_ks(w, d)
        vectors = np.load(ks / "vectors.npy")
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors[:-1])
        faiss.write_index(index, str(ks / "index.faiss"))
        return search("ks")

    def s_store_count(d, w):
        import shutil

        ks = copy_ks(w, d)
        shutil.rmtree(ks / "passages")
        shutil.copytree(w["ks3"] / "passages", ks / "passages")  # a 3-passage store from another build
        return search("ks")

    def s_encoder_dim(d, w):
        ks = copy_ks(w, d)
        edit_manifest(ks, encoder_spec="random:dim=16,layers=1,heads=2,intermediate=64,seed=0")
        return search("ks")

    def s_manifest_dim(d, w):
        ks = copy_ks(w, d)
        edit_manifest(ks, dim=16)
        return search("ks")

    def s_k_above(d, w):
        return search(w["ks"], "-k", len(w["countries"]) + 1)

    def s_k_zero(d, w):
        return search(w["ks"], "-k", 0)

    def s_empty_question(d, w):
        lines(d / "questions.txt", ["What is the capital of X?", "  ", "Where is Y?"])
        return script("rag-search", "--knowledge", w["ks"], "--queries", "questions.txt")

    def s_pickle_file(d, w):
        import pickle

        ks = copy_ks(w, d)
        (ks / "cache.pkl").write_bytes(pickle.dumps(Evil(d / "PWNED")))
        return search("ks")

    def s_object_vectors(d, w):
        ks = copy_ks(w, d)
        np.save(ks / "vectors.npy", np.array([Evil(d / "PWNED")], dtype=object), allow_pickle=True)
        return search("ks")

    def s_evil_encoder(d, w):
        import torch

        ks = copy_ks(w, d)
        torch.save({"model_dict": {"x": Evil(d / "PWNED")}}, d / "encoder.pt")
        (d / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncapital\n")
        edit_manifest(ks, encoder_spec=f"dpr:{d / 'encoder.pt'}")
        return search("ks")

    def e_ids(d, w):
        lines(d / "guess.jsonl", [{"id": f"other{i}", "output": [{"answer": "x"}]} for i in range(5)])
        return script("rag-evaluate", "--gold", w["data"] / "test.jsonl", "--guess", "guess.jsonl", "--task", "qa",
                  "--json-out", "scores.json")

    def e_index_outside(d, w):
        lines(d / "gen.txt", [f"H-{i}\t-0.5\tx\nD-{i}\t-0.5\tx" for i in range(6)])
        return script("rag-evaluate", "--gold", w["data"] / "test.jsonl", "--guess", "gen.txt", "--json-out",
                  "scores.json")

    def e_gold_field(d, w):
        lines(d / "gold.jsonl", [QA, {"id": "x2", "output": [{"answer": "Z"}]}])
        lines(d / "guess.jsonl", [{"id": "x1", "output": [{"answer": "Y"}]}])
        return script("rag-evaluate", "--gold", "gold.jsonl", "--guess", "guess.jsonl")

    def e_empty_target(d, w):
        lines(d / "gold.jsonl", [QA, {"id": "x2", "input": "Who?", "output": [{"answer": ""}]}])
        lines(d / "guess.jsonl", [{"id": "x1", "output": [{"answer": "Y"}]}])
        return script("rag-evaluate", "--gold", "gold.jsonl", "--guess", "guess.jsonl")

    def e_guess_utf8(d, w):
        lines(d / "gen.txt", b"S-0\tq\nD-0\t-0.5\tan\xff\xfeswer\n", raw=True)
        return script("rag-evaluate", "--gold", w["data"] / "test.jsonl", "--guess", "gen.txt")

    def e_guess_empty(d, w):
        (d / "gen.txt").write_text("")
        return script("rag-evaluate", "--gold", w["data"] / "test.jsonl", "--guess", "gen.txt")

    def e_z_line(d, w):
        rows = [f"H-{i}\t-0.5\tx\nD-{i}\t-0.5\tx" for i in range(5)] + ["Z-3\t0\t1.7\tc3\tTitle"]
        lines(d / "gen.txt", rows)
        return script("rag-evaluate", "--gold", w["data"] / "test.jsonl", "--guess", "gen.txt")

    def l_pair(d, w):
        return script("rag-leaderboard", "--gold", w["data"] / "test.jsonl", "--system", "rag_token")

    def l_one_bad_system(d, w):
        lines(d / "good.jsonl", [{"id": f"q{i}", "output": [{"answer": "x"}]} for i in range(35, 40)])
        lines(d / "bad.jsonl", [{"id": f"q{i}", "output": [{"answer": "x"}]} for i in range(35, 39)])
        return script("rag-leaderboard", "--gold", w["data"] / "test.jsonl", "--system", "good=good.jsonl",
                  "--system", "bad=bad.jsonl", "--json-out", "board.json", "--md-out", "board.md")

    def p_nq_utf8(d, w):
        lines(d / "nq.csv", b"who is x\t['a']\nwhat is \xff\t['b']\n", raw=True)
        return script("rag-prepare", "nq", "--out", "nq", "--train", "nq.csv", "--dev", "nq.csv", "--quiet")

    def p_nq_columns(d, w):
        lines(d / "nq.csv", ["who is x\t['a']", "what is y"])
        return script("rag-prepare", "nq", "--out", "nq", "--train", "nq.csv", "--dev", "nq.csv", "--quiet")

    def p_kilt_cut(d, w):
        rows = [json.dumps({"id": f"t{i}", "input": "q?", "output": [{"answer": "a"}]}) for i in range(3)]
        (d / "kilt.jsonl").write_text("\n".join(rows)[:-20])
        return script("rag-prepare", "triviaqa", "--out", "tqa", "--train", "kilt.jsonl", "--dev", "kilt.jsonl",
                      "--quiet")

    def p_missing_out(d, w):
        return script("rag-prepare", "webquestions", "--train", "wq.json")

    def p_pickled_vectors(d, w):
        import pickle

        lines(d / "psgs.tsv", ["id\ttext\ttitle", "1\talpha\tA"])
        (d / "vectors.pkl").write_bytes(pickle.dumps(Evil(d / "PWNED")))
        return script("rag-import-knowledge", "--passages", "psgs.tsv", "--vectors", "vectors.pkl", "--out", "ks_out",
                  "--encoder-spec", FAST_ENCODER)

    def t_arch(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", arch="rag_tokn_tiny")

    def t_empty_question(d, w):
        return fairseq_train(w, data_dir(w, d, [QA, {"id": "x2", "input": " ", "output": [{"answer": "Z"}]}]),
                             d / "ckpt")

    def t_regex_targets(d, w):  # CuratedTrec patterns as they come from prepare_curatedtrec.py
        return fairseq_train(w, data_dir(w, d, [QA, {"id": "ct1", "input": "Who founded IBM?", "output": [
            {"answer": "Charles\\s+Flint|Flint"}], "meta": {"answer_is_regex": True}}]), d / "ckpt")

    def t_other_knowledge(d, w):
        import shutil

        (d / "ckpt").mkdir()
        shutil.copyfile(w["checkpoint"], d / "ckpt" / "checkpoint_last.pt")
        return fairseq_train(w, w["data"], d / "ckpt", knowledge=w["ks16"], extra=["--max-update", "3"])

    def t_restore_missing(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--restore-file", d / "checkpoint_9.pt"])

    def t_dropout(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--dropout", "1.5"])

    def t_adam_eps(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--optimizer", "torch_adamw", "--adam-eps=-1e-8"])

    def t_fp16(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--fp16"])

    def t_bf16(d, w):
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--bf16", "--tpu"])

    def t_truncated_last(d, w):
        (d / "ckpt").mkdir()
        (d / "ckpt" / "checkpoint_last.pt").write_bytes(Path(w["checkpoint"]).read_bytes()[:4096])
        return fairseq_train(w, w["data"], d / "ckpt", extra=["--max-update", "3"])

    def g_other_knowledge(d, w):
        return fairseq_generate(w, w["checkpoint"], knowledge=w["ks16"])

    def g_n_docs(d, w):
        return fairseq_generate(w, w["checkpoint"], n_docs=len(w["countries"]) + 1)

    def g_missing_path(d, w):
        return fairseq_generate(w, d / "checkpoint_best.pt")

    def g_malicious(d, w):
        import torch

        state = torch.load(w["checkpoint"], weights_only=False)  # our own file
        state["extra_state"]["payload"] = Evil(d / "PWNED")
        torch.save(state, d / "evil.pt")
        return fairseq_generate(w, d / "evil.pt")

    def g_truncated(d, w):
        (d / "cut.pt").write_bytes(Path(w["checkpoint"]).read_bytes()[:100_000])
        return fairseq_generate(w, d / "cut.pt")

    def g_option(*extra):
        return lambda d, w: fairseq_generate(w, w["checkpoint"], extra=extra)

    def g_posterior(score_reference):
        def make(d, w):
            path = w["checkpoint"]
            if not score_reference:  # the same weights as a RAG-Sequence checkpoint
                import torch

                state = torch.load(path, weights_only=False)  # our own file
                state["cfg"]["model"]["_name"] = "rag_seq_tiny"
                state["model"]["_extra_state"]["variant"] = "sequence"  # as a rag_seq run records itself
                torch.save(state, d / "rag_seq.pt")
                path = d / "rag_seq.pt"
            extra = ["--score-reference"] if score_reference else []
            return fairseq_generate(w, path, extra=[*extra, "--doc-posterior-out", d / "post.jsonl"])

        return make

    return [
        # --- build_knowledge_source.py
        Case("passages: JSONL cut short", b_trunc_jsonl, ["psgs.jsonl:3:", "invalid JSON"], ["ks_out"]),
        Case("passages: not UTF-8 (TSV)", b_latin1_tsv, ["psgs.tsv:3:", "UTF-8"], ["ks_out"]),
        Case("passages: wrong column count", b_columns, ["psgs.tsv:2:", "3 tab-separated columns"], ["ks_out"]),
        Case("passages: duplicate id", b_duplicate, ["psgs.jsonl:4:", "duplicate passage id 'b'"], ["ks_out"]),
        Case("passages: empty collection", b_empty, ["psgs.jsonl:", "no passages"], ["ks_out"]),
        Case("passages: JSONL line without text", b_missing_text, ["psgs.jsonl:2:", "missing field(s) text"],
             ["ks_out"]),
        Case("index: IVF lists > passages", b_ivf_too_big, ["IVF64,Flat", "needs at least 64"], ["ks_out"]),
        Case("index: unknown factory", b_factory, ["'Flatt'", "FAISS cannot build"], ["ks_out"]),
        Case("build: --out holds other files", b_foreign_out, ["ks_out:", "not a knowledge source"],
             ["ks_out/manifest.json"], unchanged=["ks_out/thesis.txt"]),
        Case("build: reuse vectors of another encoder", b_reuse_other_encoder,
             ["manifest.json:", "does not match the document encoder"], ["ks_out"]),
        Case("build: reuse vectors of another max_length", b_reuse_other_max_length,
             ["old/manifest.json:", "max_length 256 there, 8 here"], ["ks_out"]),
        Case("passages: the same file given twice", b_same_file_twice,
             ["psgs.jsonl:1:", "duplicate passage id 'a'", "given twice"], ["ks_out"]),
        Case("build: rerun after the encoder's weights changed", b_encoder_changed,
             ["ks_out:", "another document encoder", "passage_weights_sha256"],
             unchanged=["ks_out/manifest.json"]),
        Case("build: resume after the encoder's weights changed", b_resume_encoder_changed,
             ["ks_out:", "unfinished build begun with another document encoder", "--restart"], ["ks_out"],
             unchanged=["ks_out/.build/settings.json"]),
        # --- search.py on damaged or foreign knowledge sources
        Case("knowledge: index file cut short", s_index_cut, ["ks/index.faiss:", "truncated"]),
        Case("knowledge: vectors file cut short", s_vectors_cut, ["ks/vectors.npy:", "truncated"]),
        Case("knowledge: half-built (no manifest)", s_half_built, ["ks:", "did not finish"]),
        Case("knowledge: manifest not JSON", s_manifest_json, ["ks/manifest.json:", "corrupted"]),
        Case("knowledge: index count != store count", s_index_count, ["ks/index.faiss:", "holds 39 vectors"]),
        Case("knowledge: passage store of another build", s_store_count, ["ks/passages:", "does not match"]),
        Case("knowledge: encoder dim != index dim", s_encoder_dim, ["ks/manifest.json:", "does not match"]),
        Case("knowledge: manifest dim != vectors", s_manifest_dim, ["ks/vectors.npy:", "(40, 16)"]),
        Case("search: -k above collection", s_k_above, ["k=41", "at most 40"]),
        Case("search: -k 0", s_k_zero, ["at least 1"]),
        Case("search: empty question line", s_empty_question, ["questions.txt:2:", "empty question"]),
        Case("untrusted: .pkl in knowledge source", s_pickle_file, ["ks/cache.pkl:", "pickle"], marker=True),
        Case("untrusted: object array as vectors", s_object_vectors, ["ks/vectors.npy:", "Python objects"],
             marker=True),
        Case("untrusted: manifest names a pickled encoder", s_evil_encoder, ["encoder.pt:", "refused"],
             marker=True),
        # --- evaluate.py / leaderboard.py
        Case("evaluate: guess ids != gold ids", e_ids, ["guess.jsonl:", "no prediction"], ["scores.json"]),
        Case("evaluate: example index outside gold", e_index_outside, ["gen.txt:11:", "outside the gold file"],
             ["scores.json"]),
        Case("evaluate: gold line without input", e_gold_field, ["gold.jsonl:2:", "'input'"]),
        Case("evaluate: empty gold target", e_empty_target, ["gold.jsonl:2:", "empty target"]),
        Case("evaluate: guess not UTF-8", e_guess_utf8, ["gen.txt:2:", "UTF-8"]),
        Case("evaluate: empty guess file", e_guess_empty, ["gen.txt:", "empty"]),
        Case("evaluate: p(z|x) above 1", e_z_line, ["gen.txt:11:", "not a probability"]),
        Case("leaderboard: --system without =", l_pair, ["NAME=FILE"]),
        Case("leaderboard: one system misses ids", l_one_bad_system, ["bad.jsonl:", "no prediction"],
             ["board.json", "board.md"]),
        # --- prepare.py (rag-prepare)
        Case("prepare_nq: not UTF-8", p_nq_utf8, ["nq.csv:2:", "UTF-8"], ["nq"]),
        Case("prepare_nq: wrong column count", p_nq_columns, ["nq.csv:2:", "2 tab-separated columns"], ["nq"]),
        Case("prepare_triviaqa: JSONL cut short", p_kilt_cut, ["kilt.jsonl:3:", "invalid JSON"], ["tqa"]),
        Case("prepare_webquestions: no --out", p_missing_out, ["--out", "rag-prepare webquestions --help"]),
        Case("import_hf_knowledge: pickled vectors", p_pickled_vectors, ["vectors.pkl:", "refusing to unpickle"],
             ["ks_out"], marker=True),
        # --- fairseq-train
        Case("train: unknown --arch", t_arch, ["rag_tokn_tiny", "did you mean rag_token_tiny"], ["ckpt"]),
        Case("train: empty question", t_empty_question, ["data/train.jsonl:2:", "empty question"], ["ckpt"]),
        Case("train: CuratedTrec regex answers without derived targets", t_regex_targets,
             ["data/train.jsonl:2:", "regular-expression answers", "rag-curatedtrec-targets"], ["ckpt"]),
        Case("train: resume with another knowledge source", t_other_knowledge,
             ["manifest.json:", "checkpoint's document encoder does not match"],
             unchanged=["ckpt/checkpoint_last.pt"]),
        Case("train: --restore-file missing", t_restore_missing, ["checkpoint_9.pt:", "--restore-file not found"],
             ["ckpt"]),
        Case("train: --dropout above 1", t_dropout, ["--dropout 1.5 is not a dropout probability", "[0, 1)"],
             ["ckpt"]),
        Case("train: torch_adamw with a negative --adam-eps", t_adam_eps, ["--adam-eps -1e-08 is not a number >= 0"],
             ["ckpt"]),
        *([Case("train: --fp16 with a torch without CUDA", t_fp16, ["--fp16 needs CUDA", "leave --fp16 out"], ["ckpt"])]
          if not torch.cuda.is_available() else []),
        Case("train: --bf16 --tpu without torch_xla", t_bf16, ["--tpu needs torch_xla", "--bf16 without --tpu"],
             ["ckpt"]),
        Case("train: checkpoint_last.pt cut short", t_truncated_last,
             ["ckpt/checkpoint_last.pt:", "unreadable or truncated"], unchanged=["ckpt/checkpoint_last.pt"]),
        # --- fairseq-generate
        Case("generate: checkpoint of another knowledge source", g_other_knowledge,
             ["manifest.json:", "checkpoint's document encoder does not match"]),
        Case("generate: --n-docs above collection", g_n_docs, ["ks:", "--n-docs 41", "40 or fewer"]),
        Case("generate: --path missing", g_missing_path, ["checkpoint_best.pt:", "checkpoint not found"]),
        Case("generate: malicious pickle in checkpoint", g_malicious, ["evil.pt:", "safe loading refuses"],
             marker=True),
        Case("generate: checkpoint cut short", g_truncated, ["cut.pt:", "unreadable or truncated"]),
        Case("generate: --print-alignment", g_option("--print-alignment"),
             ["--print-alignment", "leave --print-alignment out"]),
        Case("generate: --constraints", g_option("--constraints"), ["--constraints", "leave --constraints out"]),
        Case("generate: --max-tokens below an example", g_option("--max-tokens", "5",
                                                                  "--skip-invalid-size-inputs-valid-test"),
             ["--max-tokens 5", "raise --max-tokens to at least"]),
        Case("generate: --doc-posterior-out with rag_seq", g_posterior(False),
             ["--doc-posterior-out", "RAG-Sequence"], ["post.jsonl"]),
        Case("generate: --doc-posterior-out with --score-reference", g_posterior(True),
             ["--doc-posterior-out", "--score-reference"], ["post.jsonl"]),
        Case("generate: --replace-unk", g_option("--replace-unk"), ["--replace-unk", "leave --replace-unk out"]),
        Case("generate: --replace-unk on a raw dataset", g_option("--dataset-impl", "raw", "--replace-unk"),
             ["--replace-unk", "leave --replace-unk out"]),
        Case("generate: --print-step", g_option("--print-step"), ["--print-step", "leave --print-step out"]),
        Case("generate: --post-process letter", g_option("--post-process", "letter"),
             ["--post-process letter", "leave --post-process out"]),
    ]


# ------------------------------------------------------------------------------------ running
@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    problem_lines: List[str]    # stderr without fairseq's logging lines
    directory: Path
    seconds: float
    argv: List[str]
    before: Dict[str, bytes]


def run_case(case: Case, directory: Path, world: dict) -> Outcome:
    import time

    directory.mkdir(parents=True, exist_ok=True)
    argv = case.make(directory, world)
    before = {p: (directory / p).read_bytes() for p in case.unchanged}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=directory, env=env(), capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - t0
    problems = [line for line in proc.stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]
    return Outcome(proc.returncode, proc.stdout, proc.stderr, problems, directory, seconds, argv, before)


def looks_valid(path: Path) -> bool:
    if not path.exists():
        return False
    if path.is_dir():
        names = {p.name for p in path.rglob("*")}
        return "manifest.json" in names or any(n.endswith(".pt") for n in names) or "train.jsonl" in names
    return True


def check(case: Case, out: Outcome) -> List[str]:
    problems = []
    if out.returncode != 2:
        problems.append(f"exit status {out.returncode}")
    if len(out.problem_lines) != 1:
        problems.append(f"{len(out.problem_lines)} stderr lines besides logging")
    line = out.problem_lines[-1] if out.problem_lines else ""
    if not line.startswith("error: "):
        problems.append("no 'error: ' line")
    for word in case.expect:
        if word not in line:
            problems.append(f"error line lacks {word!r}")
    if not line.rstrip().endswith(")"):
        problems.append("no fix in parentheses at the end")
    if "Traceback" in out.stdout + out.stderr:
        problems.append("traceback")
    if out.argv[0] == sys.executable and out.stdout.strip():
        problems.append("output on stdout")
    if re.search(r"^[HD]-\d+\t|num_updates|begin training epoch", out.stdout + out.stderr, re.M):
        problems.append("results or training updates were produced")
    for rel in case.outputs:
        if looks_valid(out.directory / rel):
            problems.append(f"left {rel} behind")
    for rel, data in out.before.items():
        if (out.directory / rel).read_bytes() != data:
            problems.append(f"{rel} was changed")
    if case.marker and (out.directory / "PWNED").exists():
        problems.append("the malicious file's code ran")
    return problems


@pytest.fixture(scope="module")
def bad_input_world(tiny_world, tmp_path_factory):
    """The tiny world, a checkpoint trained on it (1 update), and two more knowledge sources:
    one with another document encoder (dim 16), one of 3 passages."""
    from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
    from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles

    root = tmp_path_factory.mktemp("bad_inputs")
    world = dict(tiny_world)
    tok = GeneratorTokenizerFiles(dict=str(world["root"] / "dict.txt"), bpe_model=str(world["root"] / "spm.model"))
    quiet = BuildOptions(progress=False, log=lambda m: None)
    build_knowledge_source(str(root / "ks16"), BuildSettings(
        passages=str(world["root"] / "passages.jsonl"), index_factory="Flat",
        encoder="random:dim=16,layers=1,heads=2,intermediate=64,seed=0", tokenizer=tok), quiet)
    lines(root / "three.jsonl", PSG)
    build_knowledge_source(str(root / "ks3"), BuildSettings(passages=str(root / "three.jsonl"),
                                                            encoder=FAST_ENCODER, tokenizer=tok), quiet)
    proc = subprocess.run(fairseq_train(world, world["data"], root / "ckpt"), cwd=root, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    world.update(ks16=root / "ks16", ks3=root / "ks3", checkpoint=root / "ckpt" / "checkpoint_last.pt")
    return world


CASES = case_table()


@pytest.fixture(scope="module")
def outcomes(bad_input_world, tmp_path_factory, request) -> Dict[str, Outcome]:
    """Runs the cases this session selected (all, unless ``-k`` picked some), three at a time."""
    selected = {item.callspec.params["case"].name for item in request.session.items
                if getattr(item, "originalname", "") == "test_bad_input_is_one_line_error"}
    if any(getattr(item, "originalname", "") == "test_write_table" for item in request.session.items):
        selected = {c.name for c in CASES}
    root = tmp_path_factory.mktemp("cases")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.name: pool.submit(run_case, c, root / f"case{i:02d}", bad_input_world)
                   for i, c in enumerate(CASES) if c.name in selected}
        return {name: f.result() for name, f in futures.items()}


def test_table_is_large_enough():
    assert len(CASES) >= 25
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_error(case, outcomes):
    out = outcomes[case.name]
    problems = check(case, out)
    assert not problems, (f"{case.name}: {problems}\n--- stderr:\n{out.stderr[-3000:]}\n"
                          f"--- stdout:\n{out.stdout[-1500:]}")


def markdown_table(outcomes: Dict[str, Outcome]) -> str:
    rows = ["| case | exit | error line | s |", "|---|---|---|---|"]
    for case in CASES:
        out = outcomes[case.name]
        line = out.problem_lines[-1] if out.problem_lines else "(none)"
        line = line.replace(str(out.directory) + "/", "").replace("|", "\\|")
        rows.append(f"| {case.name} | {out.returncode} | `{line}` | {out.seconds:.1f} |")
    return "\n".join(rows)


def test_write_table(outcomes, tmp_path_factory):
    """The table of cases and what each produced (for the record: $RAG_BAD_INPUT_TABLE, if set)."""
    table = markdown_table(outcomes)
    target = os.environ.get("RAG_BAD_INPUT_TABLE")
    if target:
        Path(target).write_text(table + "\n")
    assert table.count("\n") == len(CASES) + 1
