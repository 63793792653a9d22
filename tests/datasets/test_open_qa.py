"""Open-domain QA converter (rag_plugin.datasets.open_qa, `rag-prepare nq|triviaqa|webquestions|curatedtrec`)
on DPR, KILT and TriviaQA fixtures; the official NQ-open, SEMPRE and DrQA files: test_official_formats.py."""
import gzip
import json

import pytest

from rag_plugin.data.kilt import read_kilt
from rag_plugin.datasets.open_qa import convert_open_qa
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import (
    CT_QAS,
    NQ_QAS_DEV,
    NQ_QAS_TRAIN,
    TQA_QUESTIONS,
    assert_nothing_left,
    assert_one_line_error,
    check_readable,
    dpr_json_records,
    kilt_nq_records,
    kilt_tqa_line,
    read_jsonl,
    run_prepare,
    splits,
    triviaqa_json,
    write_json,
    write_jsonl,
    write_lines,
)


def test_nq_dpr_qas_train_dev_carves_valid_and_dev_becomes_test(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    out = tmp_path / "nq"
    info = convert_open_qa("nq", out, train, dev, valid_from_train="3", seed=1, progress=False)
    data = splits(out)
    assert info["counts"] == {"train": 7, "valid": 3, "test": 2}
    check_readable(out)
    # dev -> test, in order, ids naming the official file
    assert [r["id"] for r in data["test"]] == ["nq-dev-0", "nq-dev-1"]
    assert data["test"][0]["input"] == "who got the first nobel prize in physics"
    assert data["test"][0]["output"] == [{"answer": "Wilhelm Conrad Röntgen"}]
    # train + valid = the training file, disjoint, order kept
    ids = [r["id"] for r in data["train"] + data["valid"]]
    assert sorted(ids) == sorted(f"nq-train-{i}" for i in range(10)) and len(set(ids)) == 10
    by_id = {r["id"]: r for r in data["train"] + data["valid"]}
    assert by_id["nq-train-3"]["input"] == 'what is the name of the "lion king" villain'
    assert [o["answer"] for o in by_id["nq-train-3"]["output"]] == ["Scar", "Taka"]
    assert [o["answer"] for o in by_id["nq-train-4"]["output"]] == ["Richard Dean Anderson", "Kurt Russell"]
    assert "meta" not in by_id["nq-train-0"]
    # seeded: the same seed gives the same split, another seed (almost surely) another
    convert_open_qa("nq", tmp_path / "nq2", train, dev, valid_from_train="3", seed=1, progress=False)
    assert (out / "valid.jsonl").read_bytes() == (tmp_path / "nq2" / "valid.jsonl").read_bytes()
    convert_open_qa("nq", tmp_path / "nq3", train, dev, valid_from_train="0.3", seed=2, progress=False)
    assert len(read_jsonl(tmp_path / "nq3" / "valid.jsonl")) == 3
    assert (tmp_path / "nq3" / "valid.jsonl").read_bytes() != (out / "valid.jsonl").read_bytes()
    summary = json.loads((out / "prepare.json").read_text())
    assert summary["formats"] == {"train": "dpr-qas", "test": "dpr-qas"}
    assert "valid (3) carved from train with seed 1" in summary["notes"]


def test_three_files_map_one_to_one_and_gzip_is_read(tmp_path):
    train = tmp_path / "nq-train.csv.gz"
    with gzip.open(train, "wt", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in NQ_QAS_TRAIN))
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    test = write_lines(tmp_path / "nq-test.csv", NQ_QAS_DEV[:1])
    info = convert_open_qa("nq", tmp_path / "out", train, dev, test, progress=False)
    assert info["counts"] == {"train": 10, "valid": 2, "test": 1}
    assert read_jsonl(tmp_path / "out" / "valid.jsonl")[1]["id"] == "nq-dev-1"


def test_curatedtrec_answers_are_regexes_kept_verbatim(tmp_path):
    f = write_lines(tmp_path / "curatedtrec-test.csv", CT_QAS)
    convert_open_qa("curatedtrec", tmp_path / "ct", f, test=f, valid_from_train=1, progress=False)
    recs = {r["input"]: r for part in splits(tmp_path / "ct").values() for r in part}
    mars = recs["how far is it from earth to mars"]
    assert mars["output"][0]["answer"] == r"(35|35\.0|48|140|2[0-9][0-9]) million miles"
    assert all(r["meta"]["answer_is_regex"] is True for r in recs.values())
    assert recs["What is the name of the longest ruling dynasty of Japan?"]["output"] == [{"answer": "Yamato"}]


def test_dpr_retriever_json_maps_positive_ctxs_to_provenance(tmp_path):
    f = write_json(tmp_path / "nq-train.json", dpr_json_records(), indent=4)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    convert_open_qa("nq", tmp_path / "out", f, dev, valid_from_train=1, progress=False)
    recs = {r["id"]: r for part in ("train", "valid") for r in read_jsonl(tmp_path / "out" / f"{part}.jsonl")}
    assert recs["nq-train-0"]["output"] == [
        {"answer": "seven", "provenance": [{"id": "18768923", "title": "Big Little Lies (TV series)"},
                                           {"id": "18768928", "title": "Big Little Lies (TV series)"}]}]
    assert recs["nq-train-1"]["output"][0]["provenance"] == [{"id": "11828866", "title": "Does He Love You"}]
    assert recs["nq-train-2"]["output"] == [{"answer": "Canberra"}, {"answer": "Canberra, ACT"}]
    got = {r.id: r.provenance for part in ("train", "valid")
           for r in read_kilt(str(tmp_path / "out" / f"{part}.jsonl"))}
    assert got["nq-train-0"] == ["18768923", "18768928"]
    # --no-provenance
    convert_open_qa("nq", tmp_path / "np", f, dev, valid_from_train=1, keep_provenance=False, progress=False)
    assert "provenance" not in (tmp_path / "np" / "train.jsonl").read_text()


def test_kilt_nq_keeps_aliases_and_provenance(tmp_path):
    train = write_jsonl(tmp_path / "nq-train-kilt.jsonl", kilt_nq_records())
    dev = write_jsonl(tmp_path / "nq-dev-kilt.jsonl", kilt_nq_records()[:2])
    convert_open_qa("nq", tmp_path / "out", train, dev, valid_from_train=1, progress=False)
    data = splits(tmp_path / "out")
    first = data["test"][0]
    assert first["id"] == "-1381557374982285430"
    assert [o["answer"] for o in first["output"]] == ["March 18, 2018", "March 18 , 2018"]
    prov = first["output"][0]["provenance"]
    assert len(prov) == 2 and prov[0]["wikipedia_id"] == "42271" and prov[1]["start_paragraph_id"] == 1
    check_readable(tmp_path / "out")


def test_kilt_triviaqa_inputs_filled_from_triviaqa_by_id(tmp_path):
    train = write_jsonl(tmp_path / "triviaqa-train_id-kilt.jsonl",
                        [kilt_tqa_line("qw_3935", ["Tyne and Wear", "Tyne & Wear"]),
                         kilt_tqa_line("tc_33", ["Sunset Boulevard"]), kilt_tqa_line("sfq_1", []),
                         kilt_tqa_line("bt_7", ["Lima"])])
    dev = write_jsonl(tmp_path / "triviaqa-dev_id-kilt.jsonl", [kilt_tqa_line("dev_1", ["Mali"])])
    tqa_train = write_json(tmp_path / "unfiltered-web-train.json", triviaqa_json(TQA_QUESTIONS[:4]))
    tqa_dev = write_json(tmp_path / "unfiltered-web-dev.json", triviaqa_json(TQA_QUESTIONS[4:]))
    out = tmp_path / "tqa"
    # without the TriviaQA files: a clear error, and nothing written
    proc = run_prepare("triviaqa", "--train", train, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{train}:1:", "no question", "--triviaqa-questions")
    assert_nothing_left(tmp_path, out)
    # with only the train file: the dev id is missing
    with pytest.raises(UserError, match="not in --triviaqa-questions, e.g. ids dev_1"):
        convert_open_qa("triviaqa", out, train, dev, triviaqa_questions=[tqa_train], progress=False)
    assert_nothing_left(tmp_path, out)
    proc = run_prepare("triviaqa", "--train", train, "--dev", dev, "--out", out, "--valid-from-train", "1",
                      "--triviaqa-questions", tqa_train, tqa_dev)
    assert proc.returncode == 0, proc.stderr
    assert "paper, Table 7: 78786/8838/11314" in proc.stderr
    recs = {r["id"]: r for part in splits(out).values() for r in part}
    assert recs["qw_3935"]["input"] == "Which metropolitan county was created in 1974 around Newcastle?"
    assert [o["answer"] for o in recs["qw_3935"]["output"]] == ["Tyne and Wear", "Tyne & Wear"]
    assert recs["qw_3935"]["meta"] == {"input_from": "triviaqa"}
    # a KILT record without answers takes TriviaQA's Value + Aliases
    assert [o["answer"] for o in recs["sfq_1"]["output"]] == ["David Seville"]
    assert recs["dev_1"]["input"] == "In which country is Timbuktu?"
    check_readable(out)


def test_triviaqa_own_json_as_input(tmp_path):
    tqa = write_json(tmp_path / "unfiltered-web-train.json", triviaqa_json(TQA_QUESTIONS))
    dev = write_lines(tmp_path / "trivia-dev.csv", ["Who wrote Hamlet?\t['Shakespeare', 'William Shakespeare']"])
    convert_open_qa("triviaqa", tmp_path / "out", tqa, dev, valid_from_train=2, progress=False)
    recs = {r["id"]: r for part in ("train", "valid") for r in read_jsonl(tmp_path / "out" / f"{part}.jsonl")}
    assert [o["answer"] for o in recs["qw_3935"]["output"]] == ["Tyne and Wear", "Tyne & Wear", "Tyne and wear"]
    assert [o["answer"] for o in recs["bt_7"]["output"]] == ["Lima", "Lima, Peru"]


def test_webquestions_cli_end_to_end(tmp_path):
    train = write_json(tmp_path / "webq-train.json", [
        {"question": "what does jamaican people speak?", "answers": ["Jamaican English", "Jamaican Creole English "
         "Language"], "positive_ctxs": [{"title": "Jamaica", "text": "...", "passage_id": "1234"}],
         "negative_ctxs": [], "hard_negative_ctxs": []},
        {"question": "what did james k polk do before he was president?", "answers": ["Lawyer"],
         "positive_ctxs": [], "negative_ctxs": [], "hard_negative_ctxs": []},
        {"question": "what is the oregon ducks 2012 football schedule?", "answers": ["University of Oregon"],
         "positive_ctxs": [], "negative_ctxs": [], "hard_negative_ctxs": []}])
    dev = write_json(tmp_path / "webq-dev.json", [
        {"question": "where is jamarcus russell from?", "answers": ["Mobile"], "positive_ctxs": []}])
    test = write_lines(tmp_path / "webq-test.csv", ["what character did natalie portman play in star wars?\t"
                                                     "['Padmé Amidala']"])
    out = tmp_path / "wq"
    proc = run_prepare("webquestions", "--train", train, "--dev", dev, "--test", test, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "prepare.json").read_text())["counts"] == {"train": 3, "valid": 1, "test": 1}
    assert read_jsonl(out / "test.jsonl")[0]["output"] == [{"answer": "Padmé Amidala"}]
