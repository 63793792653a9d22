"""Jeopardy question-generation converter (rag_plugin.datasets.jeopardy, `rag-prepare jeopardy`)."""
import json

import pytest

from rag_plugin.datasets.jeopardy import clean_jeopardy_text, convert_jeopardy
from rag_plugin.datasets.writer import SPLITS
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import JEOPARDY, check_readable, read_jsonl, run_prepare, splits, write_json


def test_clean_jeopardy_text():
    c = clean_jeopardy_text
    assert c("'For the last 8 years of his life, Galileo was under house arrest'") == \
        "For the last 8 years of his life, Galileo was under house arrest"
    assert c("'<a href=\"http://x/y.mp3\" target=\"_blank\">Beyond ideology</a>, this &quot;Great "
             "Communicator&quot; <br />was <i>funny</i>'") == 'Beyond ideology, this "Great Communicator" was funny'
    assert c("McDonald\\'s") == "McDonald's"
    assert c("'\"Jaws\"'") == "Jaws"
    assert c("'5 &lt; 6'") == "5 < 6"
    assert c(None) == "" and c("''") == ""


def test_jeopardy_raw_file_split_by_seed(tmp_path):
    raw = write_json(tmp_path / "JEOPARDY_QUESTIONS1.json", JEOPARDY)
    out = tmp_path / "jeop"
    proc = run_prepare("jeopardy", "--input", raw, "--out", out, "--valid-size", "3", "--test-size", "0.2",
                      "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    data = splits(out)
    assert [len(data[s]) for s in SPLITS] == [20, 3, 6]  # 30 items, 1 empty clue skipped; 0.2 * 29
    recs = {r["id"]: r for part in data.values() for r in part}
    assert len(recs) == 29 and "jeopardy-4" not in recs
    galileo = recs["jeopardy-0"]
    assert galileo["input"] == "Copernicus"  # the answer entity is the input ...
    assert galileo["output"] == [{"answer": "For the last 8 years of his life, Galileo was under house arrest for "
                                            "espousing this man's theory"}]  # ... the clue the target
    assert galileo["meta"] == {"category": "HISTORY", "round": "Jeopardy!", "value": "$200",
                               "air_date": "2004-12-31", "show_number": "4680"}
    assert recs["jeopardy-2"]["output"][0]["answer"] == \
        'Beyond ideology, this "Great Communicator" was known for his humor'
    assert recs["jeopardy-3"]["input"] == "McDonald's" and "value" not in recs["jeopardy-3"]["meta"]
    check_readable(out)
    again = tmp_path / "jeop2"
    convert_jeopardy(again, input=raw, valid_size=3, test_size="0.2", seed=7, progress=False)
    for s in SPLITS:
        assert (out / f"{s}.jsonl").read_bytes() == (again / f"{s}.jsonl").read_bytes()
    assert json.loads((out / "prepare.json").read_text())["skipped"] == \
        {"all": {"empty clue or answer after cleaning": 1}}


def test_jeopardy_searchqa_folders(tmp_path):
    root = tmp_path / "searchqa"
    for split, items in (("train", JEOPARDY[5:20]), ("val", JEOPARDY[20:25]), ("test", JEOPARDY[:4])):
        (root / split).mkdir(parents=True)
        for i, item in enumerate(items):
            obj = dict(item, search_results=[{"urls": "http://example.com", "snippets": "a snippet",
                                              "titles": "a title", "related_links": None}])
            write_json(root / split / f"{split}{i:05d}.json", obj)
    info = convert_jeopardy(tmp_path / "out", train=root / "train", dev=root / "val", test=root / "test",
                                    progress=False)
    assert info["counts"] == {"train": 15, "valid": 5, "test": 4}
    test = read_jsonl(tmp_path / "out" / "test.jsonl")
    assert test[0]["id"] == "test00000" and test[0]["input"] == "Copernicus"
    bad = root / "test" / "test00001.json"
    bad.write_text('{"question": "\'clue\'", "answer": ')
    with pytest.raises(UserError, match=r"test00001.json:1: invalid JSON"):
        convert_jeopardy(tmp_path / "o2", train=root / "train", dev=root / "val", test=root / "test",
                                 progress=False)
