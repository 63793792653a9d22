"""What every converter shares (rag_plugin.datasets.writer): one-line errors naming file and line, all-or-
nothing output, the rules of the output directory and of the splits."""
import json

import pytest

from rag_plugin.datasets.open_qa import convert_open_qa
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import (
    FEVER_ORIGINAL,
    NQ_QAS_DEV,
    NQ_QAS_TRAIN,
    assert_nothing_left,
    assert_one_line_error,
    dpr_json_records,
    kilt_nq_records,
    run_prepare,
    write_jsonl,
    write_lines,
)


def test_malformed_qas_line_is_a_one_line_error_and_leaves_nothing(tmp_path):
    bad = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN[:2] + ["who is this\tnot a list"] + NQ_QAS_TRAIN[2:])
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    out = tmp_path / "nq"
    proc = run_prepare("nq", "--train", bad, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad}:3:", "not a list literal")
    assert_nothing_left(tmp_path, out)
    bad.write_text("just a question with no tab\n")
    proc = run_prepare("nq", "--train", bad, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad}:1:", "expected 2 tab-separated columns")
    assert_nothing_left(tmp_path, out)


def test_malformed_json_and_jsonl_lines_name_file_and_line(tmp_path):
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    bad_json = tmp_path / "nq-train.json"
    bad_json.write_text(json.dumps(dpr_json_records(), indent=4)[:-30] + "\n  oops ]")
    out = tmp_path / "o"
    proc = run_prepare("nq", "--train", bad_json, "--dev", dev, "--out", out)
    assert_one_line_error(proc, str(bad_json), "invalid JSON")
    assert_nothing_left(tmp_path, out)
    lines = [json.dumps(r) for r in kilt_nq_records()]
    bad_kilt = write_lines(tmp_path / "nq-train-kilt.jsonl", lines[:2] + ['{"id": "x", "input": "q", "output": ['])
    proc = run_prepare("nq", "--train", bad_kilt, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad_kilt}:3:", "invalid JSON")
    assert_nothing_left(tmp_path, out)
    bad_fever = write_lines(tmp_path / "train.jsonl", [json.dumps(FEVER_ORIGINAL[0]),
                                                       json.dumps(dict(FEVER_ORIGINAL[1], label="MAYBE"))])
    proc = run_prepare("fever", "--train", bad_fever, "--dev", bad_fever, "--out", out)
    assert_one_line_error(proc, f"{bad_fever}:2:", "unknown FEVER label 'MAYBE'")
    assert_nothing_left(tmp_path, out)


def test_an_error_late_in_the_run_removes_the_partial_output(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV + ["\t['x']"])  # empty question on the last line
    out = tmp_path / "nq"
    with pytest.raises(UserError, match=r"nq-dev.csv:3: empty question"):
        convert_open_qa("nq", out, train, dev, progress=False)
    assert_nothing_left(tmp_path, out)


def test_output_directory_rules(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.docx").write_text("precious")
    with pytest.raises(UserError, match="not empty and is not a prepared dataset"):
        convert_open_qa("nq", foreign, train, dev, overwrite=True, progress=False)
    assert (foreign / "thesis.docx").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    convert_open_qa("nq", empty, train, dev, progress=False)  # an empty directory is fine
    with pytest.raises(UserError, match="already holds a prepared dataset"):
        convert_open_qa("nq", empty, train, dev, progress=False)
    convert_open_qa("nq", empty, train, dev, valid_from_train=2, overwrite=True, progress=False)
    assert json.loads((empty / "prepare.json").read_text())["counts"]["valid"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_split_rules(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    with pytest.raises(UserError, match="no evaluation file"):
        convert_open_qa("nq", tmp_path / "o", train, progress=False)
    with pytest.raises(UserError, match="cannot take 10 records out of the 10"):
        convert_open_qa("nq", tmp_path / "o", train, train, valid_from_train=10, progress=False)
    with pytest.raises(UserError, match="fraction must be between 0 and 1"):
        convert_open_qa("nq", tmp_path / "o", train, train, valid_from_train="1.5", progress=False)
    # a KILT test file ships without answers: it cannot be the test split
    nq_test = write_jsonl(tmp_path / "nq-test_without_answers-kilt.jsonl",
                          [{"id": "1", "input": "who?"}, {"id": "2", "input": "when?"}])
    with pytest.raises(UserError, match=r"split 'test' would be empty \(skipped no answer: 2\)"):
        convert_open_qa("nq", tmp_path / "o", train, test=nq_test, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")
