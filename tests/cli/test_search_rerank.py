"""rag-search --rerank (rag_plugin/cli/search.py, rag_plugin/cli/search_rerank.py), run as the installed console
script: zero-shot MaxSim against sorting the first stage's candidates by MaxSim computed here from the encoder's
towers; --path against the checkpoint's own model.retrieve through the hub; the KILT output scored by rag-evaluate;
the one-line errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, assert_one_line_error

BIN = Path(sys.executable).parent  # the console scripts, as installed
K, L = 3, 10


def run(script, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(BIN / script), *map(str, args)], capture_output=True, text=True, cwd=str(ROOT),
                          env=env, timeout=timeout)


def search(world, *args):
    return run("rag-search", "--knowledge", world["ks"], "--data-file", world["data"] / "test.jsonl", *args)


def by_question(proc):
    """stdout's hits: question number -> [(id, score), ...] best first."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        h = json.loads(line)
        out.setdefault(h["query"], []).append((h["id"], h["score"]))
    return out


def questions(world):
    return [json.loads(line)["input"] for line in (world["data"] / "test.jsonl").read_text().splitlines()]


def gold_ids(world):
    return [json.loads(line)["output"][0]["provenance"][0]["id"]
            for line in (world["data"] / "test.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def upr_checkpoint(tiny_world, tmp_path_factory):
    """rag_token_tiny trained two updates with --reranker upr --rerank-candidates 8 (as tests/conftest.py's
    _train_tiny, with the reranker)."""
    save = tmp_path_factory.mktemp("rerank_ckpt") / "upr"
    cmd = [str(BIN / "fairseq-train"), str(tiny_world["data"]), "--user-dir", "rag_plugin",
           "--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]), "--arch", "rag_token_tiny",
           "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3",
           "--batch-size", "8", "--max-update", "2", "--save-dir", str(save), "--cpu", "--num-workers", "0",
           "--no-progress-bar", "--no-epoch-checkpoints", "--disable-validation",
           "--reranker", "upr", "--rerank-candidates", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return save / "checkpoint_last.pt"


# ------------------------------------------------------------------ (1) zero-shot MaxSim
def _maxsim_by_hand(ks_dir, question, ids):
    """MaxSim of ``question`` against the passages ``ids``: the knowledge source's own encoder's token states (its
    query tower's BERT over the question, its passage tower's over each passage), scored by
    rag_plugin.reranking.maxsim.maxsim."""
    from rag_plugin.reranking.maxsim import maxsim
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    ks = KnowledgeSource(str(ks_dir))
    encoder = ks.load_encoder()
    store = ks.passages
    row_of = {store.id(r): r for r in range(len(store))}
    rows = [row_of[i] for i in ids]
    with torch.no_grad():
        q_ids, q_mask, q_types = encoder.collate(encoder.tokenize_queries([question]))
        query = encoder.query_tower.eval().bert_model(q_ids, q_mask, q_types)                   # [1, Q, H]
        p_ids, p_mask, p_types = encoder.collate(encoder.tokenize_passages([store.title(r) for r in rows],
                                                                           [store.text(r) for r in rows]))
        passages = encoder.passage_tower.eval().bert_model(p_ids, p_mask, p_types)             # [L, T, H]
        return maxsim(query, q_mask.bool(), passages[None], p_mask.bool()[None])[0].numpy()


@pytest.mark.parametrize("first_stage", [[], ["--bm25"], ["--hybrid"]], ids=["dense", "bm25", "hybrid"])
def test_maxsim_without_path_sorts_the_first_stage_candidates_by_maxsim(tiny_world, tmp_path, first_stage):
    """The printed top-K is the first stage's L candidates (rag-search -k L, same first stage) sorted by MaxSim
    computed here; the scores are those MaxSim sums; the KILT file holds the same hits."""
    kilt = tmp_path / "maxsim.jsonl"
    candidates = by_question(search(tiny_world, "-k", L, *first_stage))
    reranked = by_question(search(tiny_world, "-k", K, "--rerank", "maxsim", "--rerank-candidates", L,
                                  *first_stage, "--kilt-out", kilt))
    changed = 0
    for i, question in enumerate(questions(tiny_world)):
        ids = [pid for pid, _ in candidates[i]]
        scores = _maxsim_by_hand(tiny_world["ks"], question, ids)
        order = np.argsort(-scores, kind="stable")[:K]
        assert [pid for pid, _ in reranked[i]] == [ids[j] for j in order], i
        np.testing.assert_allclose([s for _, s in reranked[i]], scores[order], rtol=1e-5, atol=1e-5)
        changed += [pid for pid, _ in reranked[i]] != ids[:K]
    assert changed, "MaxSim kept the first stage's order for every question: nothing was reranked"
    records = [json.loads(line) for line in kilt.read_text().splitlines()]
    assert [[p["id"] for p in r["output"][0]["provenance"]] for r in records] == \
        [[pid for pid, _ in reranked[i]] for i in range(len(records))]


def test_the_default_candidates_are_max_20_k(tiny_world):
    """Without --rerank-candidates, L = max(20, -k): the same hits as --rerank-candidates 20 (and, for 5 questions,
    no progress bar)."""
    default = search(tiny_world, "-k", K, "--rerank", "maxsim")
    given = search(tiny_world, "-k", K, "--rerank", "maxsim", "--rerank-candidates", 20)
    assert default.returncode == given.returncode == 0, default.stderr + given.stderr
    assert default.stdout == given.stdout and default.stderr == ""


# ------------------------------------------------------------------ (2) --path: the checkpoint's model
def _retrieve_through_the_hub(checkpoint, world, rerank_candidates=None):
    """(ids, scores) per question: the model's own retrieve over the task's dataset of the questions."""
    from rag_plugin.hub import RAG

    rag = RAG.from_pretrained(str(checkpoint), knowledge=str(world["ks"]), n_docs=K,
                              rerank_candidates=rerank_candidates)
    assert rag.model.reranker is not None and rag.model.reranker.name == "upr"
    dataset = rag.task.build_dataset(questions(world))
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    ni = sample["net_input"]
    with torch.no_grad():
        scores, rows = rag.model.retrieve(ni.get("query_tokens"), ni.get("query_mask"), K, ni.get("fixed_doc_rows"),
                                          ni.get("fixed_doc_scores"), ni["src_tokens"])
    store = rag.task.knowledge.passages
    return [[(store.id(int(r)), float(s)) for r, s in zip(row, score)] for row, score in zip(rows, scores)]


@pytest.mark.parametrize("flags, wanted_l", [([], None), (["--rerank", "upr", "--rerank-candidates", 12], 12)],
                         ids=["checkpoint-defaults", "explicit"])
def test_path_hits_are_the_models_own_retrieve(tiny_world, upr_checkpoint, tmp_path, flags, wanted_l):
    """--path of a checkpoint trained with --reranker upr: the hits are what model.retrieve (loaded through the hub)
    returns for the same questions: its UPR logits and rows, with the checkpoint's L = 8 or --rerank-candidates."""
    got = by_question(search(tiny_world, "-k", K, "--path", upr_checkpoint, *flags))
    want = _retrieve_through_the_hub(upr_checkpoint, tiny_world, wanted_l)
    assert len(got) == len(want) == 5
    for i, hits in enumerate(want):
        assert [pid for pid, _ in got[i]] == [pid for pid, _ in hits], i
        np.testing.assert_allclose([s for _, s in got[i]], [s for _, s in hits], rtol=1e-5, atol=1e-4)
    assert all(s < 0 for hits in got.values() for _, s in hits)  # log p(question | passage): UPR's logits


# ------------------------------------------------------------------ (3) scored by rag-evaluate
@pytest.mark.parametrize("flags", [["--rerank", "maxsim", "--rerank-candidates", L], ["--path", "CKPT"]],
                         ids=["maxsim", "path"])
def test_kilt_out_is_scored_by_rag_evaluate(tiny_world, upr_checkpoint, tmp_path, flags):
    """rag-evaluate --metrics recall@1,recall@3 reads the --kilt-out file: the recall of the printed hits."""
    flags = [upr_checkpoint if f == "CKPT" else f for f in flags]
    kilt = tmp_path / "hits.jsonl"
    hits = by_question(search(tiny_world, "-k", K, *flags, "--kilt-out", kilt))
    gold = tiny_world["data"] / "test.jsonl"
    proc = run("rag-evaluate", "--gold", gold, "--guess", kilt, "--metrics", "recall@1,recall@3")
    assert proc.returncode == 0, proc.stderr
    scores = json.loads(proc.stdout)
    for k in (1, K):
        want = 100 * np.mean([g in [pid for pid, _ in hits[i][:k]] for i, g in enumerate(gold_ids(tiny_world))])
        assert scores[f"recall@{k}"] == pytest.approx(want, abs=1e-3)


# ------------------------------------------------------------------ (4) one-line errors
ERRORS = [
    (["--rerank", "foo"], ["--rerank", "invalid choice"]),
    (["--rerank", "maxsim", "-k", 5, "--rerank-candidates", 4], ["--rerank-candidates 4 is fewer than -k 5"]),
    (["--rerank", "maxsim", "--rerank-candidates", 41], ["--rerank-candidates 41", "(40 passages)"]),
    (["--rerank", "maxsim", "-k", 41], ["-k 41 is outside 1..40"]),
    (["--rerank", "upr"], ["--rerank upr", "--path"]),
    (["--rerank", "cross"], ["--rerank cross", "--path"]),
    (["--rerank-candidates", 5], ["--rerank-candidates 5", "no --rerank"]),
    (["--path", "missing.pt"], ["checkpoint not found", "missing.pt"]),
    (["--path", "CKPT", "--rerank", "maxsim"], ["--rerank maxsim", "--reranker upr"]),
    (["--path", "CKPT", "-k", 9], ["--rerank-candidates 8 (the checkpoint's) is fewer than -k 9"]),
    (["--path", "CKPT", "-k", 0], ["-k 0 is outside 1..40"]),
    (["--path", "CKPT", "--rerank-candidates", 41], ["--rerank-candidates 41", "(40 passages)"]),
    (["--path", "CKPT", "--bm25"], ["--bm25", "--path"]),
    (["--path", "CKPT", "--hybrid-candidates", 30], ["--hybrid-candidates", "--path"]),
]


@pytest.mark.parametrize("args, needles", ERRORS, ids=[" ".join(map(str, a)) for a, _ in ERRORS])
def test_bad_input_is_one_line(tiny_world, upr_checkpoint, tmp_path, args, needles):
    kilt = tmp_path / "never.jsonl"
    args = [upr_checkpoint if a == "CKPT" else tmp_path / a if a == "missing.pt" else a for a in args]
    proc = run("rag-search", "--knowledge", tiny_world["ks"], "--query", "What is the capital of Kalo?",
               *args, "--kilt-out", kilt)
    assert_one_line_error(proc, *needles)
    assert not kilt.exists()


def test_an_encoder_without_token_states_is_the_scorers_one_line_error(tiny_world):
    """A knowledge source whose encoder has no BERT towers (no token states to compare): MaxSim's own one-line
    error. No registered encoder lacks them, so the knowledge source's encoder is replaced here, in the process that
    runs rag-search's main (BM25 first stage: only the reranker reads the encoder)."""
    code = ("import sys, types\n"
            "from rag_plugin.retrieval.knowledge import KnowledgeSource\n"
            "KnowledgeSource.load_encoder = lambda self: types.SimpleNamespace(name='bag-of-words', "
            "query_tower=object(), passage_tower=object())\n"
            "from rag_plugin.cli.search import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, "--knowledge", str(tiny_world["ks"]), "--query", "x", "-k", "2",
                           "--bm25", "--rerank", "maxsim"], capture_output=True, text=True, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=120)
    assert_one_line_error(proc, "maxsim", "'bag-of-words' has no BERT towers")


# ------------------------------------------------------------------ the rest
def test_a_progress_bar_for_many_questions(tiny_world, tmp_path):
    """From 200 questions a tqdm bar on stderr (stdout keeps only the hits)."""
    qfile = tmp_path / "q.txt"
    qfile.write_text("".join(f"What is the capital of {c}?\n" for c, _ in tiny_world["countries"] * 5))
    many = run("rag-search", "--knowledge", tiny_world["ks"], "--queries", qfile, "-k", 2, "--rerank", "maxsim",
               "--rerank-candidates", 4)
    assert many.returncode == 0, many.stderr
    assert "200/200" in many.stderr and len(many.stdout.splitlines()) == 400


def test_the_cli_choices_are_the_reranking_stages():
    """search_rerank keeps torch off rag-search --help, so it names the rerankers and the default L itself."""
    from rag_plugin.cli import search_rerank
    from rag_plugin.reranking.base import RERANKERS
    from rag_plugin.reranking.options import DEFAULT_CANDIDATES

    assert search_rerank.RERANKERS == RERANKERS and search_rerank.DEFAULT_CANDIDATES == DEFAULT_CANDIDATES
    code = "import sys\nfrom rag_plugin.cli import search\nsearch.build_parser()\nprint('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_the_hub_takes_the_checkpoints_reranker_only(tiny_world, upr_checkpoint, tmp_path):
    """RAG.from_pretrained(reranker=, rerank_candidates=): the checkpoint's reranker with another L loads; another
    reranker, and a file that is no checkpoint, are one-line UserErrors before any model is built."""
    from rag_plugin.hub import RAG, checkpoint_task_options
    from rag_plugin.util.errors import UserError

    rag = RAG.from_pretrained(str(upr_checkpoint), knowledge=str(tiny_world["ks"]), reranker="upr",
                              rerank_candidates=12)
    assert rag.model.reranker.name == "upr" and rag.model.context.rerank_candidates == 12
    assert checkpoint_task_options(str(upr_checkpoint))["reranker"] == "upr"
    with pytest.raises(UserError) as err:
        RAG.from_pretrained(str(upr_checkpoint), knowledge=str(tiny_world["ks"]), reranker="maxsim")
    assert "'maxsim' is not the one the checkpoint was trained with (upr)" in str(err.value)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(UserError) as err:
        checkpoint_task_options(str(junk))
    assert str(junk) in str(err.value) and len(str(err.value).splitlines()) == 1


def test_path_of_a_checkpoint_trained_without_a_reranker_reranks_zero_shot(tiny_world, tmp_path_factory):
    """--path of a plain RAG-Token checkpoint with --rerank upr: its own first stage, reranked by its generator's
    log p(question | passage): the hits are the hub's retrieve with reranker="upr" (zero-shot), whose query encoder,
    trained and now fixed, loads from the checkpoint's scaled weights."""
    from rag_plugin.hub import RAG
    from tests.conftest import _train_tiny

    plain = _train_tiny(tiny_world, tmp_path_factory.mktemp("plain"), "rag_token_tiny")
    proc = run("rag-search", "--knowledge", tiny_world["ks"], "--data-file", tiny_world["data"] / "test.jsonl",
               "-k", K, "--path", plain, "--rerank", "upr", "--rerank-candidates", 10)
    assert proc.returncode == 0, proc.stderr
    printed = [[h[0] for h in hits] for _, hits in sorted(by_question(proc).items())]
    rag = RAG.from_pretrained(str(plain), knowledge=str(tiny_world["ks"]), n_docs=K, reranker="upr",
                              rerank_candidates=10)
    assert rag.model.reranker.name == "upr" and rag.model.cfg.freeze_query_encoder
    dataset = rag.task.build_dataset(questions(tiny_world))
    ni = dataset.collater([dataset[i] for i in range(len(dataset))])["net_input"]
    with torch.no_grad():
        _, rows = rag.model.retrieve(ni["query_tokens"], ni["query_mask"], K, src_tokens=ni["src_tokens"])
    store = rag.task.knowledge.passages
    assert printed == [[store.id(int(r)) for r in row] for row in rows]
