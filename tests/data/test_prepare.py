"""Dataset converters (rag_plugin.datasets.prepare, scripts/prepare_*.py) on small fixtures written
here in each official format, as the released files look (see docs/datasets.md for sources)."""
from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.datasets import prepare
from rag_plugin.data.kilt import read_kilt
from rag_plugin.util.errors import UserError

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- helpers
def read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def splits(out):
    return {s: read_jsonl(Path(out) / f"{s}.jsonl") for s in prepare.SPLITS}


def check_readable(out):
    """Every split passes the task's own reader."""
    for s in prepare.SPLITS:
        assert read_kilt(str(Path(out) / f"{s}.jsonl"))


def run_script(name, *args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *map(str, args), "--quiet"],
                          capture_output=True, text=True, cwd=str(REPO), timeout=120)


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def assert_nothing_left(parent, out):
    assert not Path(out).exists()
    assert not [p.name for p in Path(parent).iterdir() if p.name.startswith(f".{Path(out).name}.")]


# ----------------------------------------------------------------------------- fixtures
NQ_QAS_TRAIN = [  # DPR's nq-train.csv: question<TAB>Python list literal, no header
    "big little lies season 2 how many episodes\t['seven']",
    "who sings does he love me with reba\t['Linda Davis']",
    "how many pages is invisible man by ralph ellison\t['581 ( second edition )']",
    'what is the name of the "lion king" villain\t["Scar", "Taka"]',
    "who played o'neill in stargate\t[\"Richard Dean Anderson\", 'Kurt Russell']",
    "where did the titanic sink\t['North Atlantic Ocean', 'the North Atlantic']",
    "when was the first harry potter book published\t['1997']",
    "who wrote the declaration of independence\t['Thomas Jefferson']",
    "what is the capital of australia\t['Canberra']",
    "who invented the telephone\t['Alexander Graham Bell']",
]
NQ_QAS_DEV = [
    "who got the first nobel prize in physics\t['Wilhelm Conrad Röntgen']",
    "when is the next deadpool movie being released\t['May 18 , 2018']",
]
CT_QAS = [  # DPR's curatedtrec-*.csv: the answers are regular expressions
    "What is the largest city in the world?\t['Tokyo|Tokyo-Yokohama']",
    "how far is it from earth to mars\t['(35|35\\\\.0|48|140|2[0-9][0-9]) million miles']",
    "What is the name of the longest ruling dynasty of Japan?\t[\"Yamato\"]",
    "Who was the first president of the United States?\t['(George )?Washington']",
]


def dpr_json_records():
    """DPR's retriever-training JSON (biencoder-nq-*.json), as released (indent=4)."""
    return [
        {"dataset": "nq_train_psg_compass", "question": "big little lies season 2 how many episodes",
         "answers": ["seven"],
         "positive_ctxs": [{"title": "Big Little Lies (TV series)", "text": "series garnered several accolades. "
                            "It received 16 Emmy Award nominations", "score": 1000, "title_score": 1,
                            "passage_id": "18768923"},
                           {"title": "Big Little Lies (TV series)", "text": "second season of seven episodes",
                            "score": 13.4, "title_score": 0, "passage_id": "18768928"}],
         "negative_ctxs": [{"title": "Cormac McCarthy", "text": "chores of the house", "score": 0,
                            "title_score": 0, "passage_id": "2145653"}],
         "hard_negative_ctxs": [{"title": "Little People, Big World", "text": "final minutes of the season",
                                 "score": 13.2, "title_score": 0, "passage_id": "20676573"}]},
        {"dataset": "nq_train_psg_compass", "question": "who sings does he love me with reba",
         "answers": ["Linda Davis"],
         "positive_ctxs": [{"title": "Does He Love You", "text": "Does He Love You is a song written by Sandy "
                            "Knox and Billy Stritch", "score": 1000, "title_score": 1, "psg_id": "wiki:11828866"}],
         "negative_ctxs": [], "hard_negative_ctxs": []},
        {"dataset": "nq_train_psg_compass", "question": "what is the capital of australia",
         "answers": ["Canberra", "Canberra, ACT"], "positive_ctxs": [], "negative_ctxs": [],
         "hard_negative_ctxs": []},
    ]


def kilt_nq_records():
    prov = {"wikipedia_id": "42271", "title": "The Walking Dead (season 8)", "section": "Section::::Production.",
            "start_paragraph_id": 3, "start_character": 0, "end_paragraph_id": 3, "end_character": 150,
            "bleu_score": 1.0, "meta": {}}
    return [
        {"id": "-1381557374982285430", "input": "when is the last episode of season 8 of the walking dead",
         "output": [{"answer": "March 18, 2018", "provenance": [prov]}, {"answer": "March 18 , 2018"},
                    {"provenance": [dict(prov, start_paragraph_id=1, end_paragraph_id=1)]}],
         "meta": {}},
        {"id": "8921476712341", "input": "who plays the voice of the beast in beauty and the beast",
         "output": [{"answer": "Dan Stevens"}], "meta": {}},
        {"id": "-6341222344", "input": "what is the currency of japan",
         "output": [{"answer": "yen"}, {"answer": "Japanese yen"}], "meta": {}},
        {"id": "123", "input": "who was the first man on the moon",
         "output": [{"answer": "Neil Armstrong"}], "meta": {}},
    ]


def triviaqa_json(questions):
    """TriviaQA's unfiltered-web-*.json."""
    data = [{"Answer": {"Aliases": aliases, "MatchedWikiEntityName": value,
                        "NormalizedAliases": [a.lower() for a in aliases], "NormalizedMatchedWikiEntityName":
                        value.lower(), "NormalizedValue": value.lower(), "Type": "WikipediaEntity", "Value": value},
             "EntityPages": [{"DocSource": "TagMe", "Filename": f"{value}.txt", "Title": value}],
             "Question": q, "QuestionId": qid, "QuestionSource": "http://www.quizwise.com/",
             "SearchResults": [{"Description": "...", "DisplayUrl": "example.com", "Filename": "1.txt", "Rank": 0,
                                "Title": value, "Url": "http://example.com/"}]}
            for qid, q, value, aliases in questions]
    return {"Data": data, "Domain": "Web", "Split": "train", "VerifiedEval": False, "Version": 1.0}


TQA_QUESTIONS = [
    ("qw_3935", "Which metropolitan county was created in 1974 around Newcastle?", "Tyne and Wear",
     ["Tyne & Wear", "Tyne and Wear", "Tyne and wear"]),
    ("tc_33", "Which Lloyd Webber musical premiered in the US on 10th December 1993?", "Sunset Boulevard",
     ["Sunset Boulevard", "Sunset Blvd"]),
    ("sfq_1", "Who was the man behind The Chipmunks?", "David Seville", ["David Seville"]),
    ("bt_7", "What is the capital of Peru?", "Lima", ["Lima", "Lima, Peru"]),
    ("dev_1", "In which country is Timbuktu?", "Mali", ["Mali", "Republic of Mali"]),
]


def kilt_tqa_line(qid, answers):
    """KILT's triviaqa-*_id-kilt.jsonl: ids and outputs only, no 'input'."""
    return {"id": qid, "output": [{"answer": a} for a in answers]
            + [{"provenance": [{"wikipedia_id": "52780", "title": "Tyne and Wear"}]}]}


def msmarco_v21(rows):
    """MS-MARCO v2.1's columnar JSON: one dict per column, keyed by row number as a string."""
    doc = {"answers": {}, "passages": {}, "query": {}, "query_id": {}, "query_type": {}, "wellFormedAnswers": {}}
    for i, (query, answers, wfa) in enumerate(rows):
        k = str(i)
        doc["answers"][k] = answers
        doc["passages"][k] = [{"is_selected": int(j == 0), "passage_text": f"passage {j} about {query}",
                               "url": f"http://example.com/{i}/{j}"} for j in range(3)]
        doc["query"][k] = query
        doc["query_id"][k] = 1185860 + i
        doc["query_type"][k] = "DESCRIPTION"
        doc["wellFormedAnswers"][k] = wfa
    return doc


JEOPARDY = [  # JEOPARDY_QUESTIONS1.json
    {"category": "HISTORY", "air_date": "2004-12-31",
     "question": "'For the last 8 years of his life, Galileo was under house arrest for espousing this man's theory'",
     "value": "$200", "answer": "Copernicus", "round": "Jeopardy!", "show_number": "4680"},
    {"category": "ESPN's TOP 10 ALL-TIME ATHLETES", "air_date": "2004-12-31",
     "question": "'No. 2: 1912 Olympian; football star at Carlisle Indian School; 6 MLB seasons with the Reds, "
                 "Giants & Braves'", "value": "$200", "answer": "Jim Thorpe", "round": "Jeopardy!",
     "show_number": "4680"},
    {"category": "EVERYBODY TALKS ABOUT IT...", "air_date": "2004-12-31",
     "question": "'<a href=\"http://www.j-archive.com/media/2004-12-31_DJ_23.mp3\" target=\"_blank\">Beyond "
                 "ideology</a>, this &quot;Great Communicator&quot; was known for his <i>humor</i>'",
     "value": "$1,200", "answer": "Ronald Reagan", "round": "Double Jeopardy!", "show_number": "4680"},
    {"category": "THE COMPANY LINE", "air_date": "2004-12-31",
     "question": "'In 1963, live on \"The Art Linkletter Show\", this company served its billionth burger'",
     "value": None, "answer": "McDonald\\'s", "round": "Final Jeopardy!", "show_number": "4680"},
    {"category": "EPITAPHS & TRIBUTES", "air_date": "2004-12-31", "question": "''", "value": "$2,000",
     "answer": "nothing", "round": "Jeopardy!", "show_number": "4680"},
] + [{"category": "SCIENCE", "air_date": "2005-01-03", "question": f"'This element has atomic number {i}'",
      "value": "$400", "answer": f"Element {i}", "round": "Jeopardy!", "show_number": "4681"} for i in range(1, 26)]

FEVER_ORIGINAL = [  # FEVER's train.jsonl / paper_dev.jsonl
    {"id": 75397, "verifiable": "VERIFIABLE", "label": "SUPPORTS",
     "claim": "Nikolaj Coster-Waldau worked with the Fox Broadcasting Company.",
     "evidence": [[[92206, 104971, "Nikolaj_Coster-Waldau", 7], [92206, 104971, "Fox_Broadcasting_Company", 0]]]},
    {"id": 150448, "verifiable": "VERIFIABLE", "label": "SUPPORTS", "claim": "Roman Atwood is a content creator.",
     "evidence": [[[174271, 187498, "Roman_Atwood", 1]], [[174271, 187499, "Roman_Atwood", 3]],
                  [[174271, 187498, "Roman_Atwood", 1]]]},
    {"id": 214861, "verifiable": "VERIFIABLE", "label": "REFUTES",
     "claim": "History of art includes architecture, dance, sculpture, music, painting, poetry literature, "
              "theatre, narrative, film, photography and graphic arts.",
     "evidence": [[[255136, 254645, "History_of_art", 2]]]},
    {"id": 156709, "verifiable": "NOT VERIFIABLE", "label": "NOT ENOUGH INFO",
     "claim": "Adrienne Bailon is an accountant.", "evidence": [[[180581, None, None, None]]]},
    {"id": 83235, "verifiable": "VERIFIABLE", "label": "REFUTES", "claim": "System of a Down briefly disbanded in "
     "limbo.", "evidence": [[[100277, 113694, "System_of_a_Down_-LRB-album-RRB-", 0]]]},
    {"id": 129629, "verifiable": "NOT VERIFIABLE", "label": "NOT ENOUGH INFO",
     "claim": "Homeland is an American television spy thriller.", "evidence": [[[151831, None, None, None]]]},
]


def write_lines(path, lines):
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_json(path, obj, indent=None):
    Path(path).write_text(json.dumps(obj, indent=indent), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- streaming JSON
@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 16])
def test_json_stream_matches_json_load_at_any_chunk_size(tmp_path, chunk):
    doc = [{"a": 1, "b": [1.5e3, -2, True, None, "x\"y\\z"], "c": "é \u2603 " * 5},
           12345678901234567890, "tail", [], {}, {"nested": {"k": [1, {"deep": "v"}]}}, 0.25, False]
    path = write_json(tmp_path / "a.json", doc, indent=2)
    with prepare.JsonStream(path, chunk_chars=chunk) as js:
        got = [v for _, v in js.iter_array()]
    assert got == doc
    obj = {"Data": doc, "Domain": "Web", "Version": 1.0}
    path = write_json(tmp_path / "o.json", obj)
    with prepare.JsonStream(path, chunk_chars=chunk) as js:
        seen = {}
        for _, key in js.iter_object():
            seen[key] = [v for _, v in js.iter_array()] if key == "Data" else js.value()
    assert seen == obj


def test_json_stream_reports_file_and_line_of_damage(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"question": "q1", "answers": ["a"]},\n  {"question": "q2", "answers": ["a"],,}\n]\n')
    with pytest.raises(UserError) as err:
        with prepare.JsonStream(path, chunk_chars=4) as js:
            list(js.iter_array())
    assert f"{path}:3:" in str(err.value) and "invalid JSON" in str(err.value)
    path.write_text('[\n  {"question": "q1", "answers": ["a"]},\n  {"question": "q2", "ans')
    with pytest.raises(UserError, match="invalid JSON"):
        with prepare.JsonStream(path, chunk_chars=4) as js:
            list(js.iter_array())


# ----------------------------------------------------------------------------- open-domain QA
def test_nq_dpr_qas_train_dev_carves_valid_and_dev_becomes_test(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    out = tmp_path / "nq"
    info = prepare.convert_open_qa("nq", out, train, dev, valid_from_train="3", seed=1, progress=False)
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
    prepare.convert_open_qa("nq", tmp_path / "nq2", train, dev, valid_from_train="3", seed=1, progress=False)
    assert (out / "valid.jsonl").read_bytes() == (tmp_path / "nq2" / "valid.jsonl").read_bytes()
    prepare.convert_open_qa("nq", tmp_path / "nq3", train, dev, valid_from_train="0.3", seed=2, progress=False)
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
    info = prepare.convert_open_qa("nq", tmp_path / "out", train, dev, test, progress=False)
    assert info["counts"] == {"train": 10, "valid": 2, "test": 1}
    assert read_jsonl(tmp_path / "out" / "valid.jsonl")[1]["id"] == "nq-dev-1"


def test_curatedtrec_answers_are_regexes_kept_verbatim(tmp_path):
    f = write_lines(tmp_path / "curatedtrec-test.csv", CT_QAS)
    prepare.convert_open_qa("curatedtrec", tmp_path / "ct", f, test=f, valid_from_train=1, progress=False)
    recs = {r["input"]: r for part in splits(tmp_path / "ct").values() for r in part}
    mars = recs["how far is it from earth to mars"]
    assert mars["output"][0]["answer"] == r"(35|35\.0|48|140|2[0-9][0-9]) million miles"
    assert all(r["meta"]["answer_is_regex"] is True for r in recs.values())
    assert recs["What is the name of the longest ruling dynasty of Japan?"]["output"] == [{"answer": "Yamato"}]


def test_dpr_retriever_json_maps_positive_ctxs_to_provenance(tmp_path):
    f = write_json(tmp_path / "nq-train.json", dpr_json_records(), indent=4)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    prepare.convert_open_qa("nq", tmp_path / "out", f, dev, valid_from_train=1, progress=False)
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
    prepare.convert_open_qa("nq", tmp_path / "np", f, dev, valid_from_train=1, keep_provenance=False, progress=False)
    assert "provenance" not in (tmp_path / "np" / "train.jsonl").read_text()


def test_kilt_nq_keeps_aliases_and_provenance(tmp_path):
    train = write_jsonl(tmp_path / "nq-train-kilt.jsonl", kilt_nq_records())
    dev = write_jsonl(tmp_path / "nq-dev-kilt.jsonl", kilt_nq_records()[:2])
    prepare.convert_open_qa("nq", tmp_path / "out", train, dev, valid_from_train=1, progress=False)
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
    proc = run_script("prepare_triviaqa.py", "--train", train, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{train}:1:", "no question", "--triviaqa-questions")
    assert_nothing_left(tmp_path, out)
    # with only the train file: the dev id is missing
    with pytest.raises(UserError, match="not in --triviaqa-questions, e.g. ids dev_1"):
        prepare.convert_open_qa("triviaqa", out, train, dev, triviaqa_questions=[tqa_train], progress=False)
    assert_nothing_left(tmp_path, out)
    proc = run_script("prepare_triviaqa.py", "--train", train, "--dev", dev, "--out", out, "--valid-from-train", "1",
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
    prepare.convert_open_qa("triviaqa", tmp_path / "out", tqa, dev, valid_from_train=2, progress=False)
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
    proc = run_script("prepare_webquestions.py", "--train", train, "--dev", dev, "--test", test, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "prepare.json").read_text())["counts"] == {"train": 3, "valid": 1, "test": 1}
    assert read_jsonl(out / "test.jsonl")[0]["output"] == [{"answer": "Padmé Amidala"}]


# ----------------------------------------------------------------------------- errors (CLI)
def test_malformed_qas_line_is_a_one_line_error_and_leaves_nothing(tmp_path):
    bad = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN[:2] + ["who is this\tnot a list"] + NQ_QAS_TRAIN[2:])
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    out = tmp_path / "nq"
    proc = run_script("prepare_nq.py", "--train", bad, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad}:3:", "not a list literal")
    assert_nothing_left(tmp_path, out)
    bad.write_text("just a question with no tab\n")
    proc = run_script("prepare_nq.py", "--train", bad, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad}:1:", "expected 2 tab-separated columns")
    assert_nothing_left(tmp_path, out)


def test_malformed_json_and_jsonl_lines_name_file_and_line(tmp_path):
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    bad_json = tmp_path / "nq-train.json"
    bad_json.write_text(json.dumps(dpr_json_records(), indent=4)[:-30] + "\n  oops ]")
    out = tmp_path / "o"
    proc = run_script("prepare_nq.py", "--train", bad_json, "--dev", dev, "--out", out)
    assert_one_line_error(proc, str(bad_json), "invalid JSON")
    assert_nothing_left(tmp_path, out)
    lines = [json.dumps(r) for r in kilt_nq_records()]
    bad_kilt = write_lines(tmp_path / "nq-train-kilt.jsonl", lines[:2] + ['{"id": "x", "input": "q", "output": ['])
    proc = run_script("prepare_nq.py", "--train", bad_kilt, "--dev", dev, "--out", out)
    assert_one_line_error(proc, f"{bad_kilt}:3:", "invalid JSON")
    assert_nothing_left(tmp_path, out)
    bad_fever = write_lines(tmp_path / "train.jsonl", [json.dumps(FEVER_ORIGINAL[0]),
                                                       json.dumps(dict(FEVER_ORIGINAL[1], label="MAYBE"))])
    proc = run_script("prepare_fever.py", "--train", bad_fever, "--dev", bad_fever, "--out", out)
    assert_one_line_error(proc, f"{bad_fever}:2:", "unknown FEVER label 'MAYBE'")
    assert_nothing_left(tmp_path, out)


def test_an_error_late_in_the_run_removes_the_partial_output(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV + ["\t['x']"])  # empty question on the last line
    out = tmp_path / "nq"
    with pytest.raises(UserError, match=r"nq-dev.csv:3: empty question"):
        prepare.convert_open_qa("nq", out, train, dev, progress=False)
    assert_nothing_left(tmp_path, out)


def test_output_directory_rules(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    dev = write_lines(tmp_path / "nq-dev.csv", NQ_QAS_DEV)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.docx").write_text("precious")
    with pytest.raises(UserError, match="not empty and is not a prepared dataset"):
        prepare.convert_open_qa("nq", foreign, train, dev, overwrite=True, progress=False)
    assert (foreign / "thesis.docx").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare.convert_open_qa("nq", empty, train, dev, progress=False)  # an empty directory is fine
    with pytest.raises(UserError, match="already holds a prepared dataset"):
        prepare.convert_open_qa("nq", empty, train, dev, progress=False)
    prepare.convert_open_qa("nq", empty, train, dev, valid_from_train=2, overwrite=True, progress=False)
    assert json.loads((empty / "prepare.json").read_text())["counts"]["valid"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_split_rules(tmp_path):
    train = write_lines(tmp_path / "nq-train.csv", NQ_QAS_TRAIN)
    with pytest.raises(UserError, match="no evaluation file"):
        prepare.convert_open_qa("nq", tmp_path / "o", train, progress=False)
    with pytest.raises(UserError, match="cannot take 10 records out of the 10"):
        prepare.convert_open_qa("nq", tmp_path / "o", train, train, valid_from_train=10, progress=False)
    with pytest.raises(UserError, match="fraction must be between 0 and 1"):
        prepare.convert_open_qa("nq", tmp_path / "o", train, train, valid_from_train="1.5", progress=False)
    # a KILT test file ships without answers: it cannot be the test split
    nq_test = write_jsonl(tmp_path / "nq-test_without_answers-kilt.jsonl",
                          [{"id": "1", "input": "who?"}, {"id": "2", "input": "when?"}])
    with pytest.raises(UserError, match=r"split 'test' would be empty \(skipped no answer: 2\)"):
        prepare.convert_open_qa("nq", tmp_path / "o", train, test=nq_test, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")


# ----------------------------------------------------------------------------- MS-MARCO
MARCO_TRAIN = [
    (")what was the immediate impact of the success of the manhattan project?",
     ["The success of the Manhattan Project had an immediate impact."], "[]"),
    ("what is rba", ["Results-Based Accountability is a disciplined way of thinking."],
     ["Results-Based Accountability is a disciplined way of thinking and taking action."]),
    ("was ronald reagan a democrat", ["Yes"], ["Yes, Ronald Reagan was a democrat."]),
    ("how long do you need for sydney and surrounding areas", ["No Answer Present."], "[]"),
    ("price to install tile in shower", ["$11 to $22 per square foot"], "[]"),
    ("why conversion observed in body", ["No Answer Present."], "[]"),
    ("where are the benefits of eating oat", ["Oats are rich in fiber"], ["Oats are rich in fiber."]),
]
MARCO_DEV = [
    (". what is a corporation?", ["A corporation is a company or group of people authorized to act as a single "
                                  "entity."], ["A corporation is a company."]),
    ("where is whitemarsh island", ["No Answer Present."], "[]"),
    ("how much do hockey refs make", ["$65,000 a year"], "[]"),
]


def test_msmarco_prefers_well_formed_answers_and_skips_no_answer(tmp_path):
    train = write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN))
    dev = tmp_path / "dev_v2.1.json.gz"
    with gzip.open(dev, "wt", encoding="utf-8") as fh:
        json.dump(msmarco_v21(MARCO_DEV), fh)
    out = tmp_path / "marco"
    proc = run_script("prepare_msmarco.py", "--train", train, "--dev", dev, "--out", out, "--valid-from-train", "1")
    assert proc.returncode == 0, proc.stderr
    assert "2 No Answer Present." in proc.stderr and "1 No Answer Present." in proc.stderr
    data = splits(out)
    assert [len(data[s]) for s in prepare.SPLITS] == [4, 1, 2]
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
    prepare.convert_msmarco(tmp_path / "plain", train, dev, use_well_formed=False, valid_from_train=1,
                            progress=False)
    recs = {r["input"]: r for part in splits(tmp_path / "plain").values() for r in part}
    assert recs["what is rba"]["output"] == [{"answer": "Results-Based Accountability is a disciplined way of "
                                                        "thinking."}]
    info = prepare.convert_msmarco(tmp_path / "nlg", train, dev, dev, well_formed_only=True, progress=False)
    assert info["counts"] == {"train": 3, "valid": 1, "test": 2}
    with pytest.raises(UserError, match="not an MS-MARCO"):
        prepare.convert_msmarco(tmp_path / "x", write_lines(tmp_path / "a.csv", NQ_QAS_DEV), dev, progress=False)


def test_msmarco_eval_file_without_answers_is_refused(tmp_path):
    doc = msmarco_v21(MARCO_DEV)
    del doc["answers"], doc["wellFormedAnswers"]
    ev = write_json(tmp_path / "eval_v2.1_public.json", doc)
    train = write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN))
    with pytest.raises(UserError, match="no 'answers' column"):
        prepare.convert_msmarco(tmp_path / "o", train, test=ev, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")


# ----------------------------------------------------------------------------- Jeopardy
def test_clean_jeopardy_text():
    c = prepare.clean_jeopardy_text
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
    proc = run_script("prepare_jeopardy.py", "--input", raw, "--out", out, "--valid-size", "3", "--test-size", "0.2",
                      "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    data = splits(out)
    assert [len(data[s]) for s in prepare.SPLITS] == [20, 3, 6]  # 30 items, 1 empty clue skipped; 0.2 * 29
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
    prepare.convert_jeopardy(again, input=raw, valid_size=3, test_size="0.2", seed=7, progress=False)
    for s in prepare.SPLITS:
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
    info = prepare.convert_jeopardy(tmp_path / "out", train=root / "train", dev=root / "val", test=root / "test",
                                    progress=False)
    assert info["counts"] == {"train": 15, "valid": 5, "test": 4}
    test = read_jsonl(tmp_path / "out" / "test.jsonl")
    assert test[0]["id"] == "test00000" and test[0]["input"] == "Copernicus"
    bad = root / "test" / "test00001.json"
    bad.write_text('{"question": "\'clue\'", "answer": ')
    with pytest.raises(UserError, match=r"test00001.json:1: invalid JSON"):
        prepare.convert_jeopardy(tmp_path / "o2", train=root / "train", dev=root / "val", test=root / "test",
                                 progress=False)


# ----------------------------------------------------------------------------- FEVER
def test_fever_original_three_and_two_way(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", FEVER_ORIGINAL)
    dev = write_jsonl(tmp_path / "paper_dev.jsonl", FEVER_ORIGINAL[:4])
    test = write_jsonl(tmp_path / "paper_test.jsonl", FEVER_ORIGINAL[2:])
    info = prepare.convert_fever(tmp_path / "f3", train, dev, test, progress=False)
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
    proc = run_script("prepare_fever.py", "--train", train, "--dev", dev, "--test", test, "--two-way",
                      "--out", tmp_path / "f2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "f2" / "prepare.json").read_text())
    assert summary["counts"] == {"train": 4, "valid": 3, "test": 2}
    assert summary["skipped"]["train"] == {"NOT ENOUGH INFO (--two-way)": 2}
    assert "paper, Table 7: 96966/6666/6666" in proc.stderr
    labels = {r["output"][0]["answer"] for s in prepare.SPLITS for r in read_jsonl(tmp_path / "f2" / f"{s}.jsonl")}
    assert labels == {"SUPPORTS", "REFUTES"}


def test_fever_kilt_and_unlabelled_test(tmp_path):
    kilt = [{"id": str(i), "input": f"Claim number {i}.",
             "output": [{"answer": "SUPPORTS" if i % 2 else "REFUTES",
                         "provenance": [{"wikipedia_id": str(1000 + i), "title": f"Page {i}", "start_paragraph_id": 1,
                                         "end_paragraph_id": 1}]},
                        {"answer": "SUPPORTS" if i % 2 else "REFUTES"}]} for i in range(8)]
    train = write_jsonl(tmp_path / "fever-train-kilt.jsonl", kilt)
    dev = write_jsonl(tmp_path / "fever-dev-kilt.jsonl", kilt[:3])
    prepare.convert_fever(tmp_path / "out", train, dev, valid_from_train=2, progress=False)
    test = read_jsonl(tmp_path / "out" / "test.jsonl")
    assert test[1]["output"] == [{"answer": "SUPPORTS", "provenance": [
        {"wikipedia_id": "1001", "title": "Page 1", "start_paragraph_id": 1, "end_paragraph_id": 1}]}]
    check_readable(tmp_path / "out")
    unlabelled = write_jsonl(tmp_path / "shared_task_test.jsonl",
                             [{"id": 1, "claim": "A claim."}, {"id": 2, "claim": "Another claim."}])
    with pytest.raises(UserError, match="split 'test' would be empty"):
        prepare.convert_fever(tmp_path / "o", train, test=unlabelled, progress=False)
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [FEVER_ORIGINAL[0], kilt[0]])
    with pytest.raises(UserError, match=r"mixed.jsonl:2: record is in kilt format"):
        prepare.convert_fever(tmp_path / "o", mixed, dev, progress=False)


# ----------------------------------------------------------------------------- psgs_w100 + vectors
def psgs_tsv(path, n):
    lines = ["id\ttext\ttitle"]
    for i in range(1, n + 1):
        text = f"passage number {i} about topic {i % 7}"
        if i == 1:
            text = '"Aaron Aaron ( or ; ""Ahärôn"") is a prophet, high priest, and the brother of Moses."'
        lines.append(f"{i}\t{text}\tTitle {i}")
    return write_lines(path, lines)


IDENTITY = {"kind": "hf-dpr", "name": "dpr-ctx_encoder-single-nq-base", "spec": "hf-dpr:/models/dpr", "dim": 16,
            "pooling": "cls", "normalize": False, "passage_weights_sha256": "abc", "query_weights_sha256": "def"}


def test_import_precomputed_npy_vectors_aligned_by_id(tmp_path):
    from rag_plugin.retrieval.index import search
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    n, dim = 40, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(0)
    truth = {str(i): rng.standard_normal(dim).astype(np.float32) for i in range(1, n + 1)}
    truth["999"] = rng.standard_normal(dim).astype(np.float32)  # an id not in the TSV: ignored
    ids = list(truth)
    rng.shuffle(ids)
    half = len(ids) // 2
    files = []
    for k, chunk in enumerate((ids[:half], ids[half:])):
        np.save(tmp_path / f"emb_{k}.npy", np.stack([truth[i] for i in chunk]).astype(np.float64))
        write_lines(tmp_path / f"emb_{k}.ids", chunk)
        files.append((tmp_path / f"emb_{k}.npy", tmp_path / f"emb_{k}.ids"))
    out = tmp_path / "ks"
    logs = []
    ks = prepare.import_precomputed_vectors(out, tsv, [f for f, _ in files], [i for _, i in files],
                                            encoder_identity=json.dumps(IDENTITY), shard_size=16,
                                            progress=False, log=logs.append)
    assert sorted(os.listdir(out)) == ["index.faiss", "manifest.json", "passages", "vectors.npy"]
    ks = KnowledgeSource(str(out))
    assert len(ks) == n and ks.dim == dim and ks.vectors.dtype == np.float32
    for row in range(n):
        np.testing.assert_array_equal(ks.vectors[row], truth[ks.passages.id(row)])
    assert ks.passages.id(0) == "1" and ks.passages.text(0).startswith('Aaron Aaron ( or ; "Ahärôn")')
    assert ks.encoder_identity == IDENTITY and ks.encoder_spec == "hf-dpr:/models/dpr"
    _, rows = search(ks.index, np.stack([truth["17"], truth["3"]]) * 10, k=1)
    assert [ks.passages.id(int(r)) for r in rows[:, 0]] == ["17", "3"]
    assert any("ignored 1 vectors" in m and "999" in m for m in logs)
    # rerun with the same inputs: up to date
    prepare.import_precomputed_vectors(out, tsv, [f for f, _ in files], [i for _, i in files],
                                       encoder_identity=IDENTITY, shard_size=16, progress=False, log=logs.append)
    assert logs[-1].endswith("knowledge source is up to date")


def test_import_missing_ids_and_bad_dims_are_errors(tmp_path):
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", 10)
    np.save(tmp_path / "e.npy", np.ones((8, 16), np.float32))
    write_lines(tmp_path / "e.ids", [str(i) for i in range(1, 9)])
    with pytest.raises(UserError, match=r"2 of 10 passages have no vector, e.g. ids '9', '10'"):
        prepare.import_precomputed_vectors(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                                           encoder_identity=IDENTITY, progress=False, log=lambda m: None)
    with pytest.raises(UserError, match="dimension 16, the encoder identity says 768"):
        prepare.import_precomputed_vectors(tmp_path / "ks2", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                                           encoder_identity=dict(IDENTITY, dim=768), progress=False,
                                           log=lambda m: None)
    write_lines(tmp_path / "short.ids", ["1", "2"])
    with pytest.raises(UserError, match="2 ids for 8 vector rows"):
        prepare.import_precomputed_vectors(tmp_path / "ks3", tsv, [tmp_path / "e.npy"], [tmp_path / "short.ids"],
                                           encoder_identity=IDENTITY, progress=False, log=lambda m: None)
    with pytest.raises(UserError, match="1 .npy vectors file"):
        prepare.import_precomputed_vectors(tmp_path / "ks4", tsv, [tmp_path / "e.npy"], [],
                                           encoder_identity=IDENTITY, progress=False, log=lambda m: None)


def _dpr_pickle(path, pairs):
    """DPR's wikipedia_passages_*.pkl: a pickled list of (id, numpy vector)."""
    with open(path, "wb") as fh:
        pickle.dump(pairs, fh)
    return path


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickles_need_trust_pickles(tmp_path):
    n, dim = 12, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(1)
    vecs = {str(i): rng.standard_normal(dim).astype(np.float32) for i in range(1, n + 1)}
    items = list(vecs.items())
    p0 = _dpr_pickle(tmp_path / "wikipedia_passages_0.pkl", [(f"wiki:{i}", v) for i, v in items[:5]])
    p1 = _dpr_pickle(tmp_path / "wikipedia_passages_1.pkl", [(i, v) for i, v in items[5:]])
    ident = write_json(tmp_path / "identity.json", IDENTITY)
    out = tmp_path / "ks"
    proc = run_script("prepare_psgs_w100.py", "--passages", tsv, "--vectors", p0, p1, "--out", out,
                      "--encoder-identity", ident)
    assert_one_line_error(proc, "refusing to unpickle 2 file(s)", "--trust-pickles", str(p0))
    assert not out.exists()
    proc = run_script("prepare_psgs_w100.py", "--passages", tsv, "--vectors", p0, p1, "--out", out,
                      "--encoder-identity", ident, "--trust-pickles")
    assert proc.returncode == 0, proc.stderr
    assert "warning: unpickling" in proc.stderr and f"wrote {out}: {n} passages, dim {dim}" in proc.stderr
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    ks = KnowledgeSource(str(out))
    for row in range(n):
        np.testing.assert_array_equal(ks.vectors[row], vecs[ks.passages.id(row)])
    # even trusted, a pickle is only allowed to build numpy arrays
    evil = _dpr_pickle(tmp_path / "evil.pkl", [("1", _Evil())])
    with pytest.raises(UserError, match=r"cannot read the pickle \(global posix.system is not allowed"):
        prepare.import_precomputed_vectors(tmp_path / "ks_evil", tsv, [evil], trust_pickles=True,
                                           encoder_identity=IDENTITY, progress=False, log=lambda m: None)


def test_encoder_spec_or_identity_is_required(tmp_path):
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", 3)
    np.save(tmp_path / "e.npy", np.ones((3, 16), np.float32))
    write_lines(tmp_path / "e.ids", ["1", "2", "3"])
    ident = {k: v for k, v in IDENTITY.items() if k != "spec"}
    with pytest.raises(UserError, match="no encoder spec"):
        prepare.import_precomputed_vectors(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                                           encoder_identity=ident, progress=False, log=lambda m: None)
    ks = prepare.import_precomputed_vectors(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                                            encoder_identity=ident, encoder_spec="hf-dpr:/elsewhere",
                                            progress=False, log=lambda m: None)
    assert ks.encoder_spec == "hf-dpr:/elsewhere" and ks.encoder_identity["dim"] == 16


def test_import_resumes_after_an_interruption_and_restarts_on_request(tmp_path, monkeypatch):
    from rag_plugin.retrieval import knowledge

    n, dim = 20, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(2)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    np.save(tmp_path / "e.npy", vecs[:15])
    write_lines(tmp_path / "e.ids", [str(i) for i in range(1, 16)])
    np.save(tmp_path / "all.npy", vecs)
    write_lines(tmp_path / "all.ids", [str(i) for i in range(1, n + 1)])
    out = tmp_path / "ks"
    kw = dict(encoder_identity=IDENTITY, shard_size=8, progress=False)
    # incomplete vectors: an error before any vector was placed, and nothing is left behind
    with pytest.raises(UserError, match="5 of 20 passages have no vector"):
        prepare.import_precomputed_vectors(out, tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], log=lambda m: None,
                                           **kw)
    assert not out.exists()
    # interrupted after the shards (while building the index): the unfinished build cannot be
    # loaded, other vectors are refused unless --restart, and the rerun resumes (the passage
    # store is not rewritten)
    real = knowledge.faiss_index.build_index

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(knowledge.faiss_index, "build_index", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare.import_precomputed_vectors(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"],
                                           log=lambda m: None, **kw)
    assert sorted(os.listdir(out / ".build" / "shards")) == [f"{s:012d}.npy" for s in (0, 8, 16)]
    with pytest.raises(UserError, match="build did not finish"):
        knowledge.KnowledgeSource(str(out))
    with pytest.raises(UserError, match="unfinished build with other settings"):
        prepare.import_precomputed_vectors(out, tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                                           log=lambda m: None, **kw)
    with pytest.raises(KeyboardInterrupt):  # --restart discards it (and is interrupted again)
        prepare.import_precomputed_vectors(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"], restart=True,
                                           log=lambda m: None, **kw)
    monkeypatch.setattr(knowledge.faiss_index, "build_index", real)
    logs = []
    ks = prepare.import_precomputed_vectors(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"],
                                            log=logs.append, **kw)
    assert "passage store: 20 passages (already built)" in logs
    np.testing.assert_array_equal(np.asarray(ks.vectors), vecs)
    assert not (out / ".build").exists()
