"""FEVER converter (rag_plugin.datasets.fever, `rag-prepare fever`): original and KILT FEVER."""
import json

import pytest

from rag_plugin.datasets.fever import convert_fever
from rag_plugin.datasets.writer import SPLITS
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import FEVER_ORIGINAL, check_readable, read_jsonl, run_prepare, write_jsonl


def test_fever_original_three_and_two_way(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", FEVER_ORIGINAL)
    dev = write_jsonl(tmp_path / "paper_dev.jsonl", FEVER_ORIGINAL[:4])
    test = write_jsonl(tmp_path / "paper_test.jsonl", FEVER_ORIGINAL[2:])
    info = convert_fever(tmp_path / "f3", train, dev, test, progress=False)
    assert info["counts"] == {"train": 6, "valid": 4, "test": 4}
    recs = {r["id"]: r for r in read_jsonl(tmp_path / "f3" / "train.jsonl")}
    assert recs["75397"]["input"] == "Nikolaj Coster-Waldau worked with the Fox Broadcasting Company."
    assert recs["75397"]["output"][0]["answer"] == "SUPPORTS"
    assert recs["75397"]["output"][0]["provenance"] == [
        {"title": "Nikolaj Coster-Waldau", "wikipedia_title": "Nikolaj_Coster-Waldau", "sentence_id": 7},
        {"title": "Fox Broadcasting Company", "wikipedia_title": "Fox_Broadcasting_Company", "sentence_id": 0}]
    assert len(recs["150448"]["output"][0]["provenance"]) == 2  # duplicate evidence folded
    assert recs["83235"]["output"][0]["provenance"][0]["title"] == "System of a Down (album)"
    assert recs["156709"]["output"] == [{"answer": "NOT ENOUGH INFO"}]
    assert recs["156709"]["meta"] == {"verifiable": "NOT VERIFIABLE"}
    check_readable(tmp_path / "f3")
    proc = run_prepare("fever", "--train", train, "--dev", dev, "--test", test, "--two-way",
                      "--out", tmp_path / "f2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "f2" / "prepare.json").read_text())
    assert summary["counts"] == {"train": 4, "valid": 3, "test": 2}
    assert summary["skipped"]["train"] == {"NOT ENOUGH INFO (--two-way)": 2}
    assert "paper, Table 7: 96966/6666/6666" in proc.stderr
    labels = {r["output"][0]["answer"] for s in SPLITS for r in read_jsonl(tmp_path / "f2" / f"{s}.jsonl")}
    assert labels == {"SUPPORTS", "REFUTES"}


def test_fever_kilt_and_unlabelled_test(tmp_path):
    kilt = [{"id": str(i), "input": f"Claim number {i}.",
             "output": [{"answer": "SUPPORTS" if i % 2 else "REFUTES",
                         "provenance": [{"wikipedia_id": str(1000 + i), "title": f"Page {i}", "start_paragraph_id": 1,
                                         "end_paragraph_id": 1}]},
                        {"answer": "SUPPORTS" if i % 2 else "REFUTES"}]} for i in range(8)]
    train = write_jsonl(tmp_path / "fever-train-kilt.jsonl", kilt)
    dev = write_jsonl(tmp_path / "fever-dev-kilt.jsonl", kilt[:3])
    convert_fever(tmp_path / "out", train, dev, valid_from_train=2, progress=False)
    test = read_jsonl(tmp_path / "out" / "test.jsonl")
    assert test[1]["output"] == [{"answer": "SUPPORTS", "provenance": [
        {"wikipedia_id": "1001", "title": "Page 1", "start_paragraph_id": 1, "end_paragraph_id": 1}]}]
    check_readable(tmp_path / "out")
    unlabelled = write_jsonl(tmp_path / "shared_task_test.jsonl",
                             [{"id": 1, "claim": "A claim."}, {"id": 2, "claim": "Another claim."}])
    with pytest.raises(UserError, match="split 'test' would be empty"):
        convert_fever(tmp_path / "o", train, test=unlabelled, progress=False)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [FEVER_ORIGINAL[0], kilt[0]])
    with pytest.raises(UserError, match=r"mixed.jsonl:2: record is in kilt format"):
        convert_fever(tmp_path / "o", mixed, dev, progress=False)
