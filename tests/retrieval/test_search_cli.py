"""rag-search (rag_plugin/cli/search.py): its JSON lines, and its KILT output scored by the project's own
evaluator (rag_plugin.evaluation.scoring.evaluate_files) equal to R-precision and recall@k computed by
brute force over the knowledge source's stored vectors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from tests.conftest import ROOT, assert_one_line_error, synthetic_passages, write_jsonl

SPEC = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0"
K = 5


def _run(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.search", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    rows = synthetic_passages(60, seed=4)
    src = write_jsonl(root / "p.jsonl", rows)
    ks = build_knowledge_source(str(root / "ks"), BuildSettings(passages=str(src), encoder=SPEC),
                                BuildOptions(progress=False, log=lambda m: None))
    rng = np.random.default_rng(5)
    gold = []
    for i in range(12):  # a question made of some words of passage p, gold: p and another passage
        p = int(rng.integers(60))
        other = int(rng.integers(60))
        words = rows[p]["text"].split()
        question = " ".join(rng.choice(words, size=min(5, len(words)), replace=False))
        outputs = [{"answer": "x", "provenance": [{"wikipedia_id": f"p{p}"}]}]
        if other != p:
            outputs.append({"answer": "y", "provenance": [{"wikipedia_id": f"p{other}"}]})
        gold.append({"id": f"q{i}", "input": question, "output": outputs})
    data = write_jsonl(root / "test.jsonl", gold)
    return {"root": root, "ks": ks, "gold": gold, "data": data}


def _brute_force_top_k(ks, questions, k):
    from rag_plugin.retrieval.encoders import load_encoder

    q = load_encoder(SPEC).encode_queries(questions)
    scores = q @ np.asarray(ks.vectors).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[ks.passages.id(int(r)) for r in row] for row in order], np.take_along_axis(scores, order, 1)


def test_kilt_output_scored_by_rag_evaluate_equals_brute_force(world, tmp_path):
    from rag_plugin.evaluation.scoring import evaluate_files

    kilt = tmp_path / "hits.jsonl"
    proc = _run("--knowledge", world["root"] / "ks", "--data-file", world["data"], "-k", K, "--batch-size", 5,
                "--kilt-out", kilt)
    assert proc.returncode == 0, proc.stderr
    questions = [g["input"] for g in world["gold"]]
    top, top_scores = _brute_force_top_k(world["ks"], questions, K)
    # the KILT file: one record per question, under the data file's ids, hits best first
    records = [json.loads(line) for line in kilt.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [g["id"] for g in world["gold"]]
    assert [r["input"] for r in records] == questions
    assert [[p["id"] for p in r["output"][0]["provenance"]] for r in records] == top
    np.testing.assert_allclose([[p["score"] for p in r["output"][0]["provenance"]] for r in records], top_scores,
                               rtol=1e-4, atol=1e-5)
    # the JSON lines on stdout are the same hits
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [[h["id"] for h in lines if h["query"] == i] for i in range(len(questions))] == top
    assert set(lines[0]) == {"query", "rank", "id", "title", "score", "text"}
    # scored by the project's evaluator == brute force (single-id evidence sets: recall@k is the
    # fraction of gold ids in the top k; R-precision is whether the first hit is gold)
    golds = [[o["provenance"][0]["wikipedia_id"] for o in g["output"]] for g in world["gold"]]
    metrics = evaluate_files(str(world["data"]), str(kilt), ["rprec", "recall@1", "recall@3", f"recall@{K}"])
    for k in (1, 3, K):
        want = 100 * np.mean([len(set(g) & set(t[:k])) / len(g) for g, t in zip(golds, top)])
        assert metrics[f"recall@{k}"] == pytest.approx(want, abs=1e-3)
    assert metrics["rprec"] == pytest.approx(100 * np.mean([t[0] in g for g, t in zip(golds, top)]), abs=1e-3)
    assert 0 < metrics[f"recall@{K}"] < 100  # neither trivially all nor nothing


def test_questions_file_ids_are_line_numbers_and_errors_are_one_line(world, tmp_path):
    questions = [g["input"] for g in world["gold"][:3]]
    qfile = tmp_path / "q.txt"
    qfile.write_text("".join(q + "\n" for q in questions), encoding="utf-8")
    kilt = tmp_path / "hits.jsonl"
    proc = _run("--knowledge", world["root"] / "ks", "--queries", qfile, "-k", 2, "--kilt-out", kilt)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in kilt.read_text().splitlines()] == ["0", "1", "2"]
    proc = _run("--knowledge", world["root"] / "ks", "--queries", qfile, "--data-file", world["data"])
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1
    proc = _run("--knowledge", world["root"] / "ks", "--data-file", tmp_path / "missing.jsonl", "--kilt-out",
                tmp_path / "never.jsonl")
    assert proc.returncode == 2 and "data file not found" in proc.stderr
    assert not (tmp_path / "never.jsonl").exists()
    help_text = _run("--help").stdout
    assert "--kilt-out" in help_text and "(default: 5)" in help_text


@pytest.fixture(scope="module")
def sharded(world):
    src = world["root"] / "p.jsonl"
    return build_knowledge_source(str(world["root"] / "ks3"), BuildSettings(passages=str(src), encoder=SPEC,
                                                                             num_shards=3),
                                  BuildOptions(progress=False, log=lambda m: None))


@pytest.mark.parametrize("private", [False, True])
def test_a_sharded_source_searches_like_the_unsharded_one(world, sharded, tmp_path, private):
    """One process (rag-search) maps every shard and merges: the same lines as the unsharded source."""
    flags = ["--private-index"] if private else []
    whole = _run("--knowledge", world["ks"].directory, "--data-file", world["data"], "-k", K)
    split = _run("--knowledge", sharded.directory, "--data-file", world["data"], "-k", K, *flags)
    assert whole.returncode == split.returncode == 0, whole.stderr + split.stderr
    assert split.stdout == whole.stdout and len(split.stdout.splitlines()) == 12 * K


@pytest.mark.parametrize("damage, needle", [
    ("delete", "index shard 1 (rows 20-39) is missing"),
    ("truncate", "index shard 1 (rows 20-39) is"),
    ("swap", "index shard 1 (rows 20-39) does not match the manifest checksum: it is from another build"),
])
def test_a_damaged_shard_is_named_in_one_line(world, sharded, tmp_path, damage, needle):
    import shutil

    copy = tmp_path / "ks"
    shutil.copytree(sharded.directory, copy)
    index = copy / "shards" / "00001" / "index.faiss"
    if damage == "delete":
        index.unlink()
    elif damage == "truncate":
        index.write_bytes(index.read_bytes()[:-100])
    else:  # the same-sized shard of another build: other vectors (the first shard's rows 0-19)
        shutil.copyfile(copy / "shards" / "00000" / "index.faiss", index)
    proc = _run("--knowledge", copy, "--query", "anything", "-k", K)
    assert_one_line_error(proc, needle, str(copy / "shards"))


def _lines(proc):
    hits = {}
    for line in proc.stdout.splitlines():
        h = json.loads(line)
        hits.setdefault(h["query"], []).append(h)
    return hits


@pytest.mark.parametrize("fusion", ["rrf", "weighted"])
def test_hybrid_search_equals_the_fusion_of_the_dense_and_bm25_lists(world, tmp_path, fusion):
    """rag-search --hybrid: the hits are the k best of the union of the dense and BM25 top-L lists under the fused
    score, computed here by hand from rag-search's own dense and --bm25 lists (scores: the fused logits)."""
    questions = tmp_path / "q.txt"
    questions.write_text("".join(g["input"] + "\n" for g in world["gold"]))
    cands = 10
    dense = _lines(_run("--knowledge", world["ks"].directory, "--queries", questions, "-k", cands))
    every = _lines(_run("--knowledge", world["ks"].directory, "--queries", questions, "-k", 60))  # all dense scores
    bm25 = _lines(_run("--knowledge", world["ks"].directory, "--queries", questions, "-k", cands, "--bm25"))
    r = _run("--knowledge", world["ks"].directory, "--queries", questions, "-k", K, "--hybrid", "--fusion", fusion,
             "--hybrid-candidates", cands, "--fusion-weight", 0.3)
    assert r.returncode == 0, r.stderr[-2000:]
    hybrid = _lines(r)
    for qi in range(len(world["gold"])):
        d = {h["id"]: (h["rank"], h["score"]) for h in dense[qi]}
        b = {h["id"]: (h["rank"], h["score"]) for h in bm25.get(qi, []) if h["score"] > 0}
        fused = {}
        for pid in set(d) | set(b):
            if fusion == "rrf":
                fused[pid] = sum(1.0 / (60.0 + side[pid][0] + 1) for side in (d, b) if pid in side) / (2 / 61.0)
            else:  # dense: min-max over the union's own inner products; BM25: over its list, 0 outside it
                q_d = {h["id"]: h["score"] for h in every[qi]}
                union = set(d) | set(b)
                lo, hi = min(q_d[x] for x in union), max(q_d[x] for x in union)
                b_lo, b_hi = min(v[1] for v in b.values()), max(v[1] for v in b.values())
                dense_part = (q_d[pid] - lo) / (hi - lo) if hi > lo else 0.0
                bm25_part = (b[pid][1] - b_lo) / (b_hi - b_lo) if pid in b and b_hi > b_lo else 0.0
                fused[pid] = 0.3 * dense_part + 0.7 * bm25_part
        got = [h["id"] for h in hybrid[qi]]
        assert len(got) == K and set(got) <= set(fused)
        best = sorted(fused.values(), reverse=True)
        assert [round(fused[g], 5) for g in got] == pytest.approx([round(v, 5) for v in best[:K]], abs=1e-4), qi


def test_hybrid_search_bad_options_are_one_line_errors(world):
    r = _run("--knowledge", world["ks"].directory, "--query", "a b", "--hybrid", "--fusion", "weighted",
             "--fusion-weight", "1.5")
    assert_one_line_error(r, "--fusion-weight 1.5")
    r = _run("--knowledge", world["ks"].directory, "--query", "a b", "--hybrid", "--bm25")
    assert r.returncode == 2 and "--hybrid" in r.stderr and "Traceback" not in r.stderr
