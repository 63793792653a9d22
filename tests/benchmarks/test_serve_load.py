"""benchmarks/serve_load.py: its measurements' own logic (the RSS drift, the load test's plan, the comparison with
the hub, the smaps reading) and, slow, the whole benchmark in a tiny configuration over rag_token_tiny (the real
rag-serve three times: batching, --max-batch 1, --workers 2)."""
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import serve_load as SL  # noqa: E402
import serve_load_http as H  # noqa: E402
from serve_load_report import index_share  # noqa: E402


def test_rss_drift_compares_the_last_tenth_with_the_sample_after_a_tenth_of_the_requests():
    samples = [(i * 10, 1000 if i < 5 else 1100) for i in range(100)]  # 1,000 requests; RSS up 10% after 50
    drift = SL.rss_drift(samples, 1000)
    assert drift["after_warmup_at_request"] == 100 and drift["after_warmup_mib"] == round(1100 / 1024, 1)
    assert drift["drift_pct"] == 0.0  # the warm-up's rise is not drift
    grown = [(n, kb + (50 if n >= 900 else 0)) for n, kb in samples]
    assert SL.rss_drift(grown, 1000)["drift_pct"] == pytest.approx(100 * 50 / 1100, abs=0.01)


def test_load_plan_mixes_answers_searches_and_every_malformed_kind():
    questions = [f"question {i}?" for i in range(30)]
    plan = SL.load_plan(questions, questions[:5], 200, {"max_k": 7}, random.Random(0), beam=4)
    kinds = [r.kind for r in plan]
    assert kinds.count("answer") == 120 and kinds.count("search") == 60
    assert {k for k in kinds if k not in ("answer", "search")} == set(SL.MALFORMED)
    assert {r.question for r in plan if r.kind == "answer"} == set(questions[:5])
    for r in plan:
        if r.kind == "search":
            body = json.loads(r.body)
            assert 1 <= body["k"] <= 7 and body["retriever"] in SL.RETRIEVERS and 1 <= len(body["queries"]) <= 3
    too_large = next(r for r in plan if r.kind == "k_too_large")
    assert json.loads(too_large.body)["k"] == 8
    with pytest.raises(ValueError):
        json.loads(next(r for r in plan if r.kind == "invalid_json").body)
    assert next(r for r in plan if r.kind == "wrong_content_type").headers["Content-Type"] == "text/plain"


def _served(answer, ids, score, priors):
    body = {"answer": answer, "score": score, "passages": [{"id": i, "prior": p} for i, p in zip(ids, priors)]}
    return H.Outcome("answer", 200, 1.0, json.dumps(body).encode(), "q")


def test_agreement_with_the_hub_within_the_tolerance_only():
    hub = {"q": {"answer": "Paris", "score": -0.5, "provenance": [{"id": "a", "p": 0.7}, {"id": "b", "p": 0.3}]}}
    close = SL.agreement([_served("Paris", ["a", "b"], -0.5 + 5e-5, [0.7, 0.3])], hub, 10)
    assert close["compared"] == 1 and close["equal"] == 1
    for bad in (_served("Lyon", ["a", "b"], -0.5, [0.7, 0.3]), _served("Paris", ["b", "a"], -0.5, [0.7, 0.3]),
                _served("Paris", ["a", "b"], -0.5 + 2e-4, [0.7, 0.3]), _served("Paris", ["a", "b"], -0.5, [0.6, 0.3])):
        assert SL.agreement([bad], hub, 10)["equal"] == 0


def test_smaps_of_a_mapped_file_counted_by_inode(tmp_path):
    path = tmp_path / "index.faiss"
    with open(path, "wb") as f:
        f.write(np.arange(1 << 18, dtype=np.float32).tobytes())  # 1 MiB
        f.flush()
        os.fsync(f.fileno())  # written back: its page-cache pages clean (smaps counts unwritten pages dirty)
    mapped = np.memmap(path, dtype=np.float32, mode="r")
    assert float(mapped.sum()) > 0  # every page read
    files = H.mapped_files(os.getpid(), H.file_inodes(tmp_path))
    assert set(files) == {"index.faiss"}
    assert files["index.faiss"]["Rss"] == 1 << 20 and files["index.faiss"]["Private_Dirty"] == 0
    share = index_share({"files": files}, {"index.faiss": 1 << 20})
    assert share["mapped"] and share["private_fraction"] <= 1.0  # mapped by this process alone: Private_Clean
    del mapped


@pytest.mark.slow
def test_the_benchmark_in_a_tiny_configuration(trained, tiny_world, tmp_path):
    out = tmp_path / "serve_load.json"
    assert SL.main(["--path", str(trained["rag_token_tiny"]), "--questions", str(tiny_world["data"] / "train.jsonl"),
                    "--requests", "8", "--levels", "1", "4", "--load-requests", "40", "--load-clients", "4",
                    "--sample", "3", "--warm-requests", "8", "--threads", "1", "--log-dir", str(tmp_path),
                    "--json-out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["hub"]["requests"] == 8 and r["hub"]["throughput_qps"] > 0
    assert r["hub"]["engine"]["plain"]["ms_per_question_batched"] > 0
    rows = r["levels"] + r["nobatch"]
    assert [(x["clients"], x["explain"]) for x in r["levels"]] == [(1, False), (4, False), (1, True), (4, True)]
    for row in rows:
        assert row["requests"] == row["ok"] == 8 and row["statuses"] == [200]
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["throughput_qps"] > 0
        assert 1 <= row["mean_batch"] <= row["clients"]
    assert all(x["mean_batch"] == 1 for x in r["nobatch"]) and r["nobatch"][0]["clients"] == 4
    load = r["load"]
    assert load["requests"] == 40 and load["malformed"] == 4 and load["server_errors"] == 0
    assert load["malformed_not_4xx"] == 0 and load["unexpected_non_200"] == 0 and load["rss"]["samples"] > 0
    assert load["agreement"]["compared"] == 3 and load["agreement"]["equal"] == 3
    workers = r["workers"]["workers"]
    assert len(workers) == 2 and all(w["rollup"]["Rss"] > 0 for w in workers)
    assert all(any(name.startswith("passages") for name in w["files"]) for w in workers)  # both answered
    v = r["verdicts"]
    assert v["load"]["met"] and v["sigterm_exit_0"]["met"] and "throughput" in v and v["workers"]["index_mapped"]
    assert "| --max-batch 1 | 4 |" in r["report"]
