"""The official files users download convert as they are: NQ-open's own JSONL, WebQuestions' SEMPRE
JSON, DrQA's CuratedTrec .txt, MS-MARCO's tojsonl.py JSONL, gzip-compressed inputs of every
converter; a file in no known layout is one line naming the layouts accepted. Each fixture is
written here with the real field names and shapes, and the converted records are checked exactly."""
import gzip
import json
from pathlib import Path

import pytest

from rag_plugin.datasets.fever import convert_fever
from rag_plugin.datasets.jeopardy import convert_jeopardy
from rag_plugin.datasets.msmarco import convert_msmarco
from rag_plugin.datasets.open_qa import convert_open_qa
from rag_plugin.datasets.qa_layouts import parse_target_value
from rag_plugin.datasets.writer import SPLITS
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import (
    FEVER_ORIGINAL,
    JEOPARDY,
    MARCO_DEV,
    MARCO_TRAIN,
    TQA_QUESTIONS,
    assert_nothing_left,
    assert_one_line_error,
    check_readable,
    msmarco_v21,
    read_jsonl,
    run_prepare,
    splits,
    triviaqa_json,
    write_gz,
    write_json,
    write_jsonl,
    write_lines,
)

# ----------------------------------------------------------------------------- NQ-open
NQ_OPEN_TRAIN = [  # NQ-open.train.jsonl: {"question", "answer": [...]}, no id
    {"question": "where did they film hot tub time machine", "answer": ["Fernie Alpine Resort"]},
    {"question": "who has the right of way in international waters", "answer": ["Neither vessel"]},
    {"question": "who does annie work for attack on titan", "answer": ["Marley"]},
]
NQ_OPEN_DEV = [  # NQ-open.dev.jsonl
    {"question": "when was the last time anyone was on the moon", "answer": ["14 December 1972 UTC", "December 1972"]},
    {"question": "who wrote he ain't heavy he's my brother lyrics", "answer": ["Bobby Scott", "Bob Russell"]},
]
NQ_OPEN_EFFICIENTQA_TEST = [  # NQ-open.efficientqa.test.1.1.jsonl
    {"question": "who is the largest supermarket chain in the uk", "answer": ["Tesco"]},
]


def _records(rows, prefix, meta=None):
    """The records the converter must write for ``{"question", "answer"}`` rows."""
    return [{"id": f"{prefix}-{i}", "input": r["question"], "output": [{"answer": a} for a in r["answer"]],
             **({"meta": meta} if meta else {})} for i, r in enumerate(rows)]


def test_nq_open_jsonl_files_convert_with_ids_from_split_and_position(tmp_path):
    train = write_jsonl(tmp_path / "NQ-open.train.jsonl", NQ_OPEN_TRAIN)
    dev = write_jsonl(tmp_path / "NQ-open.dev.jsonl", NQ_OPEN_DEV)
    test = write_jsonl(tmp_path / "NQ-open.efficientqa.test.1.1.jsonl", NQ_OPEN_EFFICIENTQA_TEST)
    info = convert_open_qa("nq", tmp_path / "nq", train, dev, test, progress=False)
    assert info["formats"] == {"train": "qa-jsonl", "valid": "qa-jsonl", "test": "qa-jsonl"}
    assert splits(tmp_path / "nq") == {"train": _records(NQ_OPEN_TRAIN, "nq-train"),
                                       "valid": _records(NQ_OPEN_DEV, "nq-dev"),
                                       "test": _records(NQ_OPEN_EFFICIENTQA_TEST, "nq-test")}
    check_readable(tmp_path / "nq")
    # stable: the same files give the same ids and bytes
    convert_open_qa("nq", tmp_path / "again", train, dev, test, progress=False)
    for s in SPLITS:
        assert (tmp_path / "nq" / f"{s}.jsonl").read_bytes() == (tmp_path / "again" / f"{s}.jsonl").read_bytes()


def test_nq_open_gzipped_through_the_command_line(tmp_path):
    train = write_gz(tmp_path / "NQ-open.train.jsonl.gz", "".join(json.dumps(r) + "\n" for r in NQ_OPEN_TRAIN))
    dev = write_gz(tmp_path / "NQ-open.dev.jsonl.gz", "".join(json.dumps(r) + "\n" for r in NQ_OPEN_DEV))
    proc = run_prepare("nq", "--train", train, "--dev", dev, "--valid-from-train", "1", "--out", tmp_path / "nq")
    assert proc.returncode == 0, proc.stderr
    data = splits(tmp_path / "nq")
    assert data["test"] == _records(NQ_OPEN_DEV, "nq-dev")  # dev -> test, valid carved from train
    assert sorted(data["train"] + data["valid"], key=lambda r: r["id"]) == _records(NQ_OPEN_TRAIN, "nq-train")


# ----------------------------------------------------------------------------- WebQuestions (SEMPRE)
WEBQ_SEMPRE_TRAIN = [  # webquestions.examples.train.json
    {"url": "http://www.freebase.com/view/en/justin_bieber",
     "targetValue": "(list (description \"Jazmine Grace Grimaldi\") (description \"Jaxon Bieber\"))",
     "utterance": "what is the name of justin bieber brother?"},
    {"url": "http://www.freebase.com/view/en/natalie_portman",
     "targetValue": "(list (description \"Padm\u00e9 Amidala\"))",
     "utterance": "what character did natalie portman play in star wars?"},
    {"url": "http://www.freebase.com/view/en/morocco", "targetValue": "(list (description Rabat))",
     "utterance": "what is the capital city of morocco?"},
    {"url": "http://www.freebase.com/view/en/lightnin_hopkins",
     "targetValue": "(list (description \"Sam \\\"Lightnin'\\\" Hopkins\") (description 1912))",
     "utterance": "what was lightnin hopkins real name?"},
    {"url": "http://www.freebase.com/view/en/nothing", "targetValue": "(list)", "utterance": "what is nothing?"},
]
WEBQ_SEMPRE_TEST = [  # webquestions.examples.test.json
    {"url": "http://www.freebase.com/view/en/jamarcus_russell", "targetValue": "(list (description Mobile))",
     "utterance": "where is jamarcus russell from?"},
]


def write_sempre(path, rows, gz=False):
    """As released: a JSON array, one example per line."""
    text = "[" + ",\n".join(json.dumps(r) for r in rows) + "]\n"
    if gz:
        return write_gz(path, text)
    Path(path).write_text(text, encoding="utf-8")
    return path


def test_target_value_parser():
    assert parse_target_value('(list (description "Jazmine Grace Grimaldi") (description Rabat))', "f", 1) == \
        ["Jazmine Grace Grimaldi", "Rabat"]
    assert parse_target_value('(list (description "Sam \\"Lightnin\'\\" Hopkins"))', "f", 1) == \
        ['Sam "Lightnin\'" Hopkins']
    assert parse_target_value('(list (description "Dracula (1931 film)"))', "f", 1) == ["Dracula (1931 film)"]
    assert parse_target_value("(list)", "f", 1) == []
    for bad in ('(list (description "unterminated))', "Rabat", "(list (name fb:en.rabat Rabat))"):
        with pytest.raises(UserError, match=r"^webq.json:7: .*targetValue"):
            parse_target_value(bad, "webq.json", 7)


def test_webquestions_sempre_json_converts(tmp_path):
    train = write_sempre(tmp_path / "webquestions.examples.train.json", WEBQ_SEMPRE_TRAIN)
    test = write_sempre(tmp_path / "webquestions.examples.test.json.gz", WEBQ_SEMPRE_TEST, gz=True)
    info = convert_open_qa("webquestions", tmp_path / "wq", train, test=test, valid_from_train=1, seed=3,
                           progress=False)
    assert info["formats"] == {"train": "sempre", "test": "sempre"}
    assert info["skipped"] == {"train": {"no answer": 1}}  # "(list)"
    data = splits(tmp_path / "wq")
    expected = [
        {"id": "webquestions-train-0", "input": "what is the name of justin bieber brother?",
         "output": [{"answer": "Jazmine Grace Grimaldi"}, {"answer": "Jaxon Bieber"}],
         "meta": {"url": "http://www.freebase.com/view/en/justin_bieber"}},
        {"id": "webquestions-train-1", "input": "what character did natalie portman play in star wars?",
         "output": [{"answer": "Padmé Amidala"}], "meta": {"url": "http://www.freebase.com/view/en/natalie_portman"}},
        {"id": "webquestions-train-2", "input": "what is the capital city of morocco?",
         "output": [{"answer": "Rabat"}], "meta": {"url": "http://www.freebase.com/view/en/morocco"}},
        {"id": "webquestions-train-3", "input": "what was lightnin hopkins real name?",
         "output": [{"answer": 'Sam "Lightnin\'" Hopkins'}, {"answer": "1912"}],
         "meta": {"url": "http://www.freebase.com/view/en/lightnin_hopkins"}},
    ]
    assert sorted(data["train"] + data["valid"], key=lambda r: r["id"]) == expected
    assert data["test"] == [{"id": "webquestions-test-0", "input": "where is jamarcus russell from?",
                             "output": [{"answer": "Mobile"}],
                             "meta": {"url": "http://www.freebase.com/view/en/jamarcus_russell"}}]
    check_readable(tmp_path / "wq")
    bad = write_sempre(tmp_path / "bad.json", WEBQ_SEMPRE_TEST + [dict(WEBQ_SEMPRE_TEST[0], targetValue="Mobile")])
    with pytest.raises(UserError, match=r"bad.json:2: targetValue is not a \(list"):
        convert_open_qa("webquestions", tmp_path / "o", bad, test=test, valid_from_train=1, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")


# ----------------------------------------------------------------------------- CuratedTrec (DrQA)
CT_DRQA_TRAIN = [  # DrQA's CuratedTrec-train.txt: JSON lines, the answers are regular expressions
    {"question": "What U.S. state's motto is \"Live free or Die\"?", "answer": ["New Hampshire"]},
    {"question": "How far is it from Earth to Mars?", "answer": ["(35|35\\.0|48|140|2[0-9][0-9]) million miles"]},
    {"question": "Who was the first president of the United States?", "answer": ["(George )?Washington"]},
    {"question": "Where is Devil's Tower?", "answer": ["Wyoming|Crook County", "Smith (born"]},
]
CT_DRQA_TEST = [  # CuratedTrec-test.txt
    {"question": "What is the largest city in the world?", "answer": ["Tokyo|Tokyo-Yokohama"]},
]


def test_curatedtrec_drqa_txt_is_json_lines_of_regexes(tmp_path):
    train = write_jsonl(tmp_path / "CuratedTrec-train.txt", CT_DRQA_TRAIN)
    test = tmp_path / "CuratedTrec-test.txt.gz"
    write_gz(test, "".join(json.dumps(r) + "\n" for r in CT_DRQA_TEST))
    proc = run_prepare("curatedtrec", "--train", train, "--dev", test, "--valid-from-train", "1",
                       "--out", tmp_path / "ct")
    assert proc.returncode == 0, proc.stderr
    data = splits(tmp_path / "ct")
    regex = {"answer_is_regex": True}
    assert data["test"] == _records(CT_DRQA_TEST, "curatedtrec-dev", regex)
    assert sorted(data["train"] + data["valid"], key=lambda r: r["id"]) == \
        _records(CT_DRQA_TRAIN, "curatedtrec-train", regex)
    summary = json.loads((tmp_path / "ct" / "prepare.json").read_text())
    assert summary["formats"] == {"train": "qa-jsonl", "test": "qa-jsonl"}
    assert "train: 1 answer patterns do not compile as Python regexes (kept verbatim)" in summary["notes"]
    check_readable(tmp_path / "ct")


# ----------------------------------------------------------------------------- MS-MARCO (tojsonl.py)
def msmarco_jsonl_lines(rows):
    """What MS-MARCO's tojsonl.py writes (pandas ``Series.to_json`` per row): the columns in the
    release's order, '/' escaped."""
    doc = msmarco_v21(rows)
    lines = []
    for k in doc["query"]:
        row = {col: doc[col][k] for col in ("answers", "passages", "query", "query_id", "query_type",
                                            "wellFormedAnswers")}
        lines.append(json.dumps(row, separators=(",", ":")).replace("/", "\\/"))
    return lines


def test_msmarco_jsonl_converts_like_the_columnar_release(tmp_path):
    train_json = write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN))
    dev_json = write_json(tmp_path / "dev_v2.1.json", msmarco_v21(MARCO_DEV))
    train = write_lines(tmp_path / "train_v2.1.jsonl", msmarco_jsonl_lines(MARCO_TRAIN))
    dev = write_gz(tmp_path / "dev_v2.1.jsonl.gz", "".join(line + "\n" for line in msmarco_jsonl_lines(MARCO_DEV)))
    info = convert_msmarco(tmp_path / "jsonl", train, dev, dev, progress=False)
    assert info["formats"] == {"train": "jsonl", "valid": "jsonl", "test": "jsonl"}
    assert info["counts"] == {"train": 5, "valid": 2, "test": 2}
    assert info["skipped"] == {"train": {"No Answer Present.": 2}, "valid": {"No Answer Present.": 1},
                               "test": {"No Answer Present.": 1}}
    data = splits(tmp_path / "jsonl")
    assert data["valid"] == [
        {"id": "1185860", "input": ". what is a corporation?", "output": [{"answer": "A corporation is a company."}],
         "meta": {"well_formed": True, "query_type": "DESCRIPTION"}},
        {"id": "1185862", "input": "how much do hockey refs make", "output": [{"answer": "$65,000 a year"}],
         "meta": {"well_formed": False, "query_type": "DESCRIPTION"}}]
    convert_msmarco(tmp_path / "columns", train_json, dev_json, dev_json, progress=False)
    for s in SPLITS:
        assert (tmp_path / "jsonl" / f"{s}.jsonl").read_bytes() == (tmp_path / "columns" / f"{s}.jsonl").read_bytes()
    check_readable(tmp_path / "jsonl")


def test_msmarco_jsonl_eval_file_without_answers_is_refused(tmp_path):
    train = write_lines(tmp_path / "train_v2.1.jsonl", msmarco_jsonl_lines(MARCO_TRAIN))
    rows = [json.loads(line) for line in msmarco_jsonl_lines(MARCO_DEV)]
    ev = write_jsonl(tmp_path / "eval_v2.1_public.jsonl",
                     [{k: v for k, v in r.items() if k not in ("answers", "wellFormedAnswers")} for r in rows])
    with pytest.raises(UserError, match=r"eval_v2.1_public.jsonl:1: no 'answers' field \(the eval file"):
        convert_msmarco(tmp_path / "o", train, test=ev, progress=False)
    assert_nothing_left(tmp_path, tmp_path / "o")


# ----------------------------------------------------------------------------- gzip everywhere
def _same_output(a, b):
    for s in SPLITS:
        assert (Path(a) / f"{s}.jsonl").read_bytes() == (Path(b) / f"{s}.jsonl").read_bytes(), s


def _gzipped(path):
    gz = Path(str(path) + ".gz")
    gz.write_bytes(gzip.compress(Path(path).read_bytes()))
    return gz


def test_every_converter_reads_gzip(tmp_path):
    kilt = [{"id": str(i), "input": f"question {i}?", "output": [{"answer": f"answer {i}"}]} for i in range(6)]
    plain = {"kilt": write_jsonl(tmp_path / "nq-kilt.jsonl", kilt),
             "tqa": write_json(tmp_path / "unfiltered-web-dev.json", triviaqa_json(TQA_QUESTIONS)),
             "marco": write_json(tmp_path / "train_v2.1.json", msmarco_v21(MARCO_TRAIN)),
             "jeopardy": write_json(tmp_path / "JEOPARDY_QUESTIONS1.json", JEOPARDY),
             "fever": write_jsonl(tmp_path / "train.jsonl", FEVER_ORIGINAL)}
    gz = {k: _gzipped(p) for k, p in plain.items()}
    for files, out in ((plain, tmp_path / "plain"), (gz, tmp_path / "gz")):
        convert_open_qa("nq", out / "nq", files["kilt"], files["kilt"], valid_from_train=2, progress=False)
        convert_open_qa("triviaqa", out / "tqa", files["tqa"], files["tqa"], valid_from_train=2, progress=False)
        convert_msmarco(out / "marco", files["marco"], files["marco"], valid_from_train=1, progress=False)
        convert_jeopardy(out / "jeopardy", input=files["jeopardy"], valid_size=3, test_size=3, progress=False)
        convert_fever(out / "fever", files["fever"], files["fever"], valid_from_train=1, progress=False)
    for name in ("nq", "tqa", "marco", "jeopardy", "fever"):
        _same_output(tmp_path / "plain" / name, tmp_path / "gz" / name)
    assert len(read_jsonl(tmp_path / "gz" / "tqa" / "test.jsonl")) == len(TQA_QUESTIONS)


def test_searchqa_folder_of_gzipped_files(tmp_path):
    for split, items in (("train", JEOPARDY[5:15]), ("val", JEOPARDY[15:20]), ("test", JEOPARDY[:4])):
        (tmp_path / split).mkdir()
        for i, item in enumerate(items):
            _gzipped(write_json(tmp_path / split / f"{split}{i:05d}.json", item))
            (tmp_path / split / f"{split}{i:05d}.json").unlink()
    info = convert_jeopardy(tmp_path / "out", train=tmp_path / "train", dev=tmp_path / "val",
                            test=tmp_path / "test", progress=False)
    assert info["counts"] == {"train": 10, "valid": 5, "test": 4}
    assert read_jsonl(tmp_path / "out" / "test.jsonl")[0] == {
        "id": "test00000", "input": "Copernicus",
        "output": [{"answer": "For the last 8 years of his life, Galileo was under house arrest for espousing this "
                              "man's theory"}],
        "meta": {"category": "HISTORY", "round": "Jeopardy!", "value": "$200", "air_date": "2004-12-31",
                 "show_number": "4680"}}


def test_a_truncated_gzip_is_a_one_line_error(tmp_path):
    full = gzip.compress("".join(json.dumps(r) + "\n" for r in NQ_OPEN_TRAIN * 50).encode())
    cut = tmp_path / "NQ-open.train.jsonl.gz"
    cut.write_bytes(full[: len(full) // 2])
    dev = write_jsonl(tmp_path / "NQ-open.dev.jsonl", NQ_OPEN_DEV)
    proc = run_prepare("nq", "--train", cut, "--dev", dev, "--out", tmp_path / "nq")
    assert_one_line_error(proc, str(cut), "not a readable gzip file", "download it again")
    assert_nothing_left(tmp_path, tmp_path / "nq")


# ----------------------------------------------------------------------------- unrecognised layouts
QA_ACCEPTED = ("accepted: DPR qas .csv/.tsv, DPR retriever .json, KILT .jsonl, NQ-open .jsonl, DrQA .txt (JSON lines), "
               "WebQuestions SEMPRE .json, TriviaQA .json")


@pytest.mark.parametrize("name,content", [
    ("mystery.jsonl", '{"query": "who?", "label": 1}\n'),             # JSON lines of unknown records
    ("mystery.json", '[{"utterance": "who?"}]'),                      # an array of unknown elements
    ("mystery.json", '{"Questions": [1, 2]}'),                        # an unknown document
    ("mystery.json", "who?\t['a']\n"),                                 # TSV under a .json name
])
def test_unknown_open_qa_layout_names_the_layouts_accepted(tmp_path, name, content):
    bad = tmp_path / name
    bad.write_text(content, encoding="utf-8")
    dev = write_jsonl(tmp_path / "NQ-open.dev.jsonl", NQ_OPEN_DEV)
    proc = run_prepare("nq", "--train", bad, "--dev", dev, "--out", tmp_path / "nq")
    assert_one_line_error(proc, f"{bad}: not a recognised NQ layout ({QA_ACCEPTED})")
    assert_nothing_left(tmp_path, tmp_path / "nq")


def test_unknown_layouts_of_the_other_converters(tmp_path):
    csv = write_lines(tmp_path / "a.csv", ["who?\t['a']"])
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(UserError, match=r"a.csv: not a recognised Jeopardy layout \(accepted: SearchQA"):
        convert_jeopardy(tmp_path / "o", input=csv, progress=False)
    with pytest.raises(UserError, match=r"folder: not a recognised FEVER layout \(accepted: FEVER .jsonl"):
        convert_fever(tmp_path / "o", folder, folder, progress=False)
    kilt_qa = write_jsonl(tmp_path / "q.jsonl", [{"id": "1", "input": "q", "output": [{"answer": "a"}]}])
    with pytest.raises(UserError, match=r"q.jsonl: not a recognised MS-MARCO layout"):
        convert_msmarco(tmp_path / "o", kilt_qa, kilt_qa, progress=False)
    assert not (tmp_path / "o").exists()
