"""MS-MARCO v2.1 converter (rag_plugin.datasets.msmarco, `rag-prepare msmarco`) on the columnar release;
the JSONL of its tojsonl.py: test_official_formats.py."""
import gzip
import json

import pytest

from rag_plugin.datasets.msmarco import convert_msmarco
from rag_plugin.datasets.writer import SPLITS
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import (
    MARCO_DEV,
    MARCO_TRAIN,
    NQ_QAS_DEV,
    assert_nothing_left,
    check_readable,
    msmarco_v21,
    run_prepare,
    splits,
    write_json,
    write_lines,
)


def test_msmarco_prefers_well_formed_answers_and_skips_no_answer(tmp_path):
    train = write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN))
    dev = tmp_path / "dev_v2.1.json.gz"
    with gzip.open(dev, "wt", encoding="utf-8") as fh:
        json.dump(msmarco_v21(MARCO_DEV), fh)
    out = tmp_path / "marco"
    proc = run_prepare("msmarco", "--train", train, "--dev", dev, "--out", out, "--valid-from-train", "1")
    assert proc.returncode == 0, proc.stderr
    assert "2 No Answer Present." in proc.stderr and "1 No Answer Present." in proc.stderr
    data = splits(out)
    assert [len(data[s]) for s in SPLITS] == [4, 1, 2]
    recs = {r["input"]: r for part in data.values() for r in part}
    assert recs["what is rba"]["output"] == [
        {"answer": "Results-Based Accountability is a disciplined way of thinking and taking action."}]
    assert recs["what is rba"]["meta"] == {"well_formed": True, "query_type": "DESCRIPTION"}
    assert recs["price to install tile in shower"]["output"] == [{"answer": "$11 to $22 per square foot"}]
    assert recs["price to install tile in shower"]["meta"]["well_formed"] is False
    assert recs["what is rba"]["id"] == "1185861"
    assert "where is whitemarsh island" not in recs
    check_readable(out)
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["skipped"]["train"] == {"No Answer Present.": 2}
    # the plain answers on request; the NLG subset (well-formed only) in train/valid, never in test
    convert_msmarco(tmp_path / "plain", train, dev, use_well_formed=False, valid_from_train=1,
                            progress=False)
    recs = {r["input"]: r for part in splits(tmp_path / "plain").values() for r in part}
    assert recs["what is rba"]["output"] == [{"answer": "Results-Based Accountability is a disciplined way of "
                                                        "thinking."}]
    info = convert_msmarco(tmp_path / "nlg", train, dev, dev, well_formed_only=True, progress=False)
    assert info["counts"] == {"train": 3, "valid": 1, "test": 2}
    with pytest.raises(UserError, match=r"a.csv: not a recognised MS-MARCO layout \(accepted: v2.1 columnar .json"):
        convert_msmarco(tmp_path / "x", write_lines(tmp_path / "a.csv", NQ_QAS_DEV), dev, progress=False)


def test_msmarco_eval_file_without_answers_is_refused(tmp_path):
    doc = msmarco_v21(MARCO_DEV)
    del doc["answers"], doc["wellFormedAnswers"]
    ev = write_json(tmp_path / "eval_v2.1_public.json", doc)
    train = write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN))
    with pytest.raises(UserError, match="no 'answers' column"):
        convert_msmarco(tmp_path / "o", train, test=ev, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")
