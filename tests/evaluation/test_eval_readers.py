"""rag_plugin.evaluation.readers and scoring: gold/guess parsing, alignment, strict errors."""
import json

import pytest

from rag_plugin.evaluation.fairseq_output import parse_fairseq_lines, read_fairseq_generate
from rag_plugin.evaluation.readers import detect_format, read_gold, read_guesses, read_kilt_guesses
from rag_plugin.evaluation.registry import canonical_metric, default_metrics, metric_label, parse_metrics
from rag_plugin.evaluation.scoring import evaluate, evaluate_files
from rag_plugin.util.errors import UserError
from tests.evaluation.eval_data import GENERATE_QA, GOLD_QA, write_jsonl


def _lines(text):
    return list(enumerate(text.splitlines(), 1))


def _err(excinfo):
    return excinfo.value.render()


# ------------------------------------------------------------------ gold
def test_read_gold_evidence_sets(qa_files):
    gold = read_gold(str(qa_files["gold"]))
    assert [g.id for g in gold] == ["q1", "q2", "q3"]
    assert gold[0].answers == ["Paris", "City of Paris"]
    assert gold[0].evidence_sets == [["p1"], []]
    assert gold[1].evidence_sets == [["p2", "p3"]]
    assert gold[2].evidence_sets == [["p4"]]  # wikipedia_id accepted
    assert gold[1].provenance == ["p2", "p3"]
    assert [g.line for g in gold] == [1, 2, 3]


def test_read_gold_skips_blank_lines_like_read_kilt(tmp_path):
    from rag_plugin.data.kilt import read_kilt

    path = tmp_path / "g.jsonl"
    path.write_text("\n" + json.dumps(GOLD_QA[0]) + "\n\n" + json.dumps(GOLD_QA[1]) + "\n", encoding="utf-8")
    gold = read_gold(str(path))
    assert [g.id for g in gold] == [r.id for r in read_kilt(str(path))]
    assert [g.line for g in gold] == [2, 4]


def test_read_gold_takes_evidence_sets_from_the_kilt_reader(qa_files, monkeypatch):
    """One pass over the gold file when rag_plugin.data.kilt keeps each output's provenance."""
    from rag_plugin.evaluation import readers

    def read_kilt(path, **kwargs):
        records = rag_read_kilt(path, **kwargs)
        for r, row in zip(records, GOLD_QA):
            r.evidence_sets = [[p.get("id", p.get("wikipedia_id")) for p in out.get("provenance", [])]
                               for out in row["output"]]
        return records

    def no_second_pass(*args, **kwargs):
        raise AssertionError("the gold file was read twice")

    rag_read_kilt = readers.read_kilt
    monkeypatch.setattr(readers, "read_kilt", read_kilt)
    monkeypatch.setattr(readers, "iter_jsonl", no_second_pass)
    gold = read_gold(str(qa_files["gold"]))
    assert [g.evidence_sets for g in gold] == [[["p1"], []], [["p2", "p3"]], [["p4"]]]


def test_read_gold_opens_the_file_once(qa_files, monkeypatch):
    import builtins

    from rag_plugin.data.kilt import QARecord

    if "evidence_sets" not in QARecord.__dataclass_fields__:
        pytest.skip("rag_plugin.data.kilt.QARecord does not keep evidence_sets yet (second pass)")
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(qa_files["gold"]):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    assert len(read_gold(str(qa_files["gold"]))) == 3
    assert len(opened) == 1


# ------------------------------------------------------------------ fairseq-generate
def test_parse_fairseq_nbest_provenance_and_log_lines():
    ex = parse_fairseq_lines(_lines(GENERATE_QA), "gen.out")
    assert sorted(ex) == [0, 1, 2]
    assert ex[2].hypothesis == "Jupiter"  # first D line of two (--nbest 2)
    assert ex[2].n_hypotheses == 2
    assert ex[2].hypothesis_score == -0.2
    assert [(r, pid) for r, _, pid, _ in ex[2].ranked_passages()] == [(0, "p4"), (1, "p9")]
    assert ex[1].ranked_passages()[2] == (2, 0.2, "p3", "Shakespeare")
    assert ex[0].source == "What is the capital of France?"
    assert ex[0].target == "Paris"
    assert ex[0].pieces == "the \u2581paris"


def test_read_guesses_fairseq_aligned_to_gold(qa_files):
    gold = read_gold(str(qa_files["gold"]))
    guesses = read_guesses(str(qa_files["generate"]), gold)
    assert [g.id for g in guesses] == ["q1", "q2", "q3"]
    assert [g.answer for g in guesses] == ["The Paris!", "Shakespeare", "Jupiter"]
    assert guesses[1].retrieved == ["p2", "p7", "p3"]
    assert guesses[1].doc_scores == [0.5, 0.3, 0.2]


def test_fairseq_missing_examples_named(qa_files, tmp_path):
    gold = read_gold(str(qa_files["gold"]))
    example_1 = ("S-1", "T-1", "H-1", "D-1", "P-1", "Z-1", "A-1")
    text = "\n".join(line for line in GENERATE_QA.splitlines() if not line.startswith(example_1))
    path = tmp_path / "partial.out"
    path.write_text(text + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_guesses(str(path), gold)
    msg = _err(e)
    assert "'q2'" in msg and "1 of 3" in msg and str(path) in msg


def test_fairseq_index_outside_gold(qa_files, tmp_path):
    gold = read_gold(str(qa_files["gold"]))
    path = tmp_path / "extra.out"
    path.write_text(GENERATE_QA + "S-7\tq\nH-7\t-1\tx\nD-7\t-1\tx\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_guesses(str(path), gold)
    assert "index 7" in _err(e) and f"{path}:" in _err(e)


@pytest.mark.parametrize("line, words", [
    ("H-x\t-1\thyp", "malformed H- line"),
    ("D-3 -1 hyp", "malformed D- line"),
    ("D-0\tnot-a-score\thyp", "is not a number"),
    ("P-0\t-0.1 abc", "is not a number"),
    ("Z-0\t0\t0.5", "fields"),
    ("Z-0\tfirst\t0.5\tp1\tT", "not a non-negative integer"),
    ("Z-0\t-1\t0.5\tp1\tT", "not a non-negative integer"),
    ("Z-0\t0\t-3.2\tp1\tT", "not a probability"),
    ("Z-0\t0\tnan\tp1\tT", "not a probability"),
    ("Z-0\t0\t0.5\t \tT", "empty passage id"),
])
def test_fairseq_malformed_lines_name_file_and_line(line, words):
    text = "2024 | INFO | start\nS-0\tq\nH-0\t-1\ta\nD-0\t-1\ta\n" + line + "\n"
    with pytest.raises(UserError) as e:
        parse_fairseq_lines(_lines(text), "gen.out")
    assert "gen.out:5:" in _err(e)
    assert words in _err(e)


def test_fairseq_structural_errors(tmp_path):
    def run(text):
        path = tmp_path / "g.out"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(UserError) as e:
            read_fairseq_generate(str(path))
        return _err(e)

    assert "H- line but no D- line" in run("S-0\tq\nH-0\t-1\ta\n")
    assert "no D- line" in run("S-0\tq\n")
    assert "ranks are [0, 2]" in run("D-0\t-1\ta\nZ-0\t0\t0.5\tp1\tT\nZ-0\t2\t0.5\tp2\tT\n")
    assert "given twice" in run("D-0\t-1\ta\nZ-0\t0\t0.5\tp1\tT\nZ-0\t0\t0.5\tp2\tT\n")
    assert "second S-0 line" in run("S-0\tq\nS-0\tq\nD-0\t-1\ta\n")
    assert "no fairseq-generate records" in run("2024 | INFO | nothing\nGenerate test with beam=5\n")


def test_fairseq_tolerates_repeated_identical_z_lines_and_other_records():
    text = ("D-0\t-1\ta\nZ-0\t0\t0.5\tp1\tT\nZ-0\t0\t0.5\tp1\tT\nW-0\t0.01\tseconds\n"
            "E-0_1\tsomething\nI-0\t1\n")
    ex = parse_fairseq_lines(_lines(text))
    assert ex[0].ranked_passages() == [(0, 0.5, "p1", "T")]


def test_fairseq_empty_hypothesis_and_title_with_tab():
    ex = parse_fairseq_lines(_lines("D-0\t-1.5\t\nZ-0\t0\t1.0\tp1\tA\tB\n"))
    assert ex[0].hypothesis == ""
    assert ex[0].ranked_passages() == [(0, 1.0, "p1", "A\tB")]


def test_empty_guess_file(tmp_path, qa_files):
    path = tmp_path / "empty.out"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_guesses(str(path), read_gold(str(qa_files["gold"])))
    assert "empty" in _err(e) and str(path) in _err(e)


def test_missing_guess_file(tmp_path, qa_files):
    with pytest.raises(UserError) as e:
        read_guesses(str(tmp_path / "nope.out"), read_gold(str(qa_files["gold"])))
    assert "not found" in _err(e)


# ------------------------------------------------------------------ KILT guesses
def _kilt_guess(gid, answer, prov=()):
    return {"id": gid, "output": [{"answer": answer, "provenance": [dict(p) for p in prov]}]}


def test_kilt_guesses_any_order_with_texts(qa_files, tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [
        _kilt_guess("q3", "Jupiter", [{"wikipedia_id": "p4", "text": "Jupiter is big"}]),
        _kilt_guess("q1", "Paris", [{"id": "p1"}, {"id": 17}]),
        _kilt_guess("q2", "Shakespeare"),
    ])
    assert detect_format(str(path)) == "kilt"
    gold = read_gold(str(qa_files["gold"]))
    guesses = read_guesses(str(path), gold)
    assert [g.id for g in guesses] == ["q1", "q2", "q3"]
    assert guesses[0].retrieved == ["p1", "17"]
    assert guesses[2].passage_texts == ["Jupiter is big"]
    assert guesses[1].retrieved == []


def test_kilt_guesses_missing_and_extra_ids(qa_files, tmp_path):
    gold = read_gold(str(qa_files["gold"]))
    path = write_jsonl(tmp_path / "g.jsonl", [_kilt_guess("q1", "Paris")])
    with pytest.raises(UserError) as e:
        read_guesses(str(path), gold)
    assert "2 of 3 gold ids have no prediction" in _err(e) and "'q2', 'q3'" in _err(e)
    assert str(path) in _err(e)
    path = write_jsonl(tmp_path / "g2.jsonl", [_kilt_guess(i, "x") for i in ("q1", "q2", "q3", "zz")])
    with pytest.raises(UserError) as e:
        read_guesses(str(path), gold)
    assert "'zz'" in _err(e) and "not in the gold file" in _err(e)


@pytest.mark.parametrize("line, words", [
    ('{"id": "q1", "output": [{"answer": "a"}]', "invalid JSON"),
    ('["q1"]', "not a JSON object"),
    ('{"output": [{"answer": "a"}]}', "'id'"),
    ('{"id": "q1", "output": []}', "exactly one"),
    ('{"id": "q1", "output": [{"answer": "a"}, {"answer": "b"}]}', "exactly one"),
    ('{"id": "q1", "output": [{"answer": 3}]}', "'answer' must be a string"),
    ('{"id": "q1", "output": [{"answer": "a", "provenance": [{"title": "x"}]}]}', "no 'id'"),
    ('{"id": "q1", "output": [{"answer": "a", "provenance": {"id": "x"}}]}', "must be a list"),
])
def test_kilt_guess_malformed(tmp_path, line, words):
    path = tmp_path / "g.jsonl"
    path.write_text('{"id": "q0", "output": [{"answer": "a"}]}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_kilt_guesses(str(path))
    assert f"{path}:2:" in _err(e) and words in _err(e)


def test_kilt_guess_duplicate_id(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [_kilt_guess("q1", "a"), _kilt_guess("q1", "b")])
    with pytest.raises(UserError) as e:
        read_kilt_guesses(str(path))
    assert "duplicate id 'q1'" in _err(e) and ":2:" in _err(e)


# ------------------------------------------------------------------ scoring
def test_metric_names():
    assert parse_metrics("em, F1,rougel,recall@05,answer_in_top5,distinct3,em") == [
        "em", "f1", "rougeL", "recall@5", "answer_in_top5", "distinct3"]
    assert canonical_metric("Precision@10") == "precision@10"
    for bad in ("bleu4", "recall@0", "recall@", "qbleu1", "foo"):
        with pytest.raises(UserError) as e:
            canonical_metric(bad)
        assert "unknown metric" in _err(e)
    with pytest.raises(UserError):
        parse_metrics(" , ")
    assert default_metrics("fever") == ["accuracy", "accuracy2"]
    assert default_metrics(None) == ["em", "f1"]
    with pytest.raises(UserError):
        default_metrics("squad")
    assert metric_label("recall@5") == "R@5" and metric_label("rougeL") == "R-L"


def test_evaluate_fairseq_qa(qa_files):
    scores = evaluate_files(str(qa_files["gold"]), str(qa_files["generate"]),
                            ["em", "f1", "rprec", "recall@1", "recall@3", "precision@1", "answer_in_top1"],
                            passages=str(qa_files["passages"]))
    assert scores == pytest.approx({
        "em": 200 / 3, "f1": 100 * (1 + 2 / 3 + 1) / 3, "rprec": 100 * 2.5 / 3,
        "recall@1": 200 / 3, "recall@3": 100.0, "precision@1": 200 / 3, "answer_in_top1": 100.0}, abs=1e-3)
    assert list(scores) == ["em", "f1", "rprec", "recall@1", "recall@3", "precision@1", "answer_in_top1"]


def test_evaluate_answer_in_top_k_needs_passages(qa_files):
    with pytest.raises(UserError) as e:
        evaluate_files(str(qa_files["gold"]), str(qa_files["generate"]), ["answer_in_top2"])
    assert "--passages" in _err(e)


def test_evaluate_unknown_passage_id(qa_files, tmp_path):
    passages = write_jsonl(tmp_path / "few.jsonl", [{"id": "p1", "title": "t", "text": "x"}])
    with pytest.raises(UserError) as e:
        evaluate_files(str(qa_files["gold"]), str(qa_files["generate"]), ["answer_in_top1"],
                       passages=str(passages))
    assert "'p2'" in _err(e)


def test_evaluate_retrieval_needs_provenance(qa_files, tmp_path):
    path = tmp_path / "noz.out"
    path.write_text("".join(line + "\n" for line in GENERATE_QA.splitlines() if not line.startswith("Z-")),
                    encoding="utf-8")
    with pytest.raises(UserError) as e:
        evaluate_files(str(qa_files["gold"]), str(path), ["rprec"])
    assert "no retrieved passages" in _err(e)
    assert evaluate_files(str(qa_files["gold"]), str(path), ["em"])["em"] == pytest.approx(200 / 3, abs=1e-3)


def test_evaluate_fever(tmp_path):
    gold = write_jsonl(tmp_path / "fever.jsonl", [
        {"id": "c1", "input": "claim 1", "output": [{"answer": "SUPPORTS"}]},
        {"id": "c2", "input": "claim 2", "output": [{"answer": "REFUTES"}]},
        {"id": "c3", "input": "claim 3", "output": [{"answer": "NOT ENOUGH INFO"}]},
    ])
    guess = write_jsonl(tmp_path / "g.jsonl", [_kilt_guess("c1", "SUPPORTS"), _kilt_guess("c2", "SUPPORTS"),
                                                _kilt_guess("c3", "NOT ENOUGH INFO")])
    scores = evaluate_files(str(gold), str(guess), default_metrics("fever"))
    assert scores == pytest.approx({"accuracy": 200 / 3, "accuracy2": 50.0}, abs=1e-3)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "c1", "input": "claim", "output": [{"answer": "Paris"}]}])
    with pytest.raises(UserError) as e:
        evaluate_files(str(bad), str(write_jsonl(tmp_path / "g1.jsonl", [_kilt_guess("c1", "SUPPORTS")])),
                       ["accuracy"])
    assert "not a FEVER label" in _err(e) and f"{bad}:1:" in _err(e)


def test_evaluate_missing_answer(qa_files, tmp_path):
    rows = [{"id": i, "output": [{"provenance": [{"id": "p1"}]}]} for i in ("q1", "q2", "q3")]
    path = write_jsonl(tmp_path / "g.jsonl", rows)
    with pytest.raises(UserError) as e:
        evaluate_files(str(qa_files["gold"]), str(path), ["em"])
    assert "no 'answer'" in _err(e)
    scores = evaluate_files(str(qa_files["gold"]), str(path), ["recall@1"])
    assert scores["recall@1"] == pytest.approx(100 / 3, abs=1e-3)


def test_evaluate_requires_alignment(qa_files):
    gold = read_gold(str(qa_files["gold"]))
    with pytest.raises(ValueError):
        evaluate(gold, [], ["em"])


def test_answer_in_top_k_from_passage_store_directory(qa_files, tmp_path):
    from rag_plugin.retrieval.passages import Passage, PassageStore
    from tests.evaluation.eval_data import PASSAGES

    ks = tmp_path / "knowledge"
    PassageStore.write(str(ks / "passages"), [Passage(p["id"], p["title"], p["text"]) for p in PASSAGES],
                       progress=False)
    for source in (ks, ks / "passages"):  # a knowledge-source directory or the store itself
        scores = evaluate_files(str(qa_files["gold"]), str(qa_files["generate"]), ["answer_in_top1"],
                                passages=str(source))
        assert scores == {"answer_in_top1": 100.0}
    with pytest.raises(UserError) as e:
        evaluate_files(str(qa_files["gold"]), str(qa_files["generate"]), ["answer_in_top2"],
                       passages=str(tmp_path))
    assert "meta.json" in _err(e) or "passage store" in _err(e)


def test_gold_with_empty_question_keeps_indices(tmp_path, capfd):
    """The fairseq task keeps evaluation records with an empty question (example N = record N)."""
    import inspect

    from rag_plugin.data.kilt import read_kilt

    if "allow_empty_input" not in inspect.signature(read_kilt).parameters:
        pytest.skip("read_kilt has no allow_empty_input")
    path = write_jsonl(tmp_path / "g.jsonl", [
        {"id": "a", "input": "q", "output": [{"answer": "x"}]},
        {"id": "b", "input": " ", "output": [{"answer": "y"}]},
        {"id": "c", "input": "q3", "output": [{"answer": "z"}]},
    ])
    gold = read_gold(str(path))
    assert [g.id for g in gold] == ["a", "b", "c"]
    gen = tmp_path / "gen.out"
    gen.write_text("D-0\t-1\tx\nD-1\t-1\ty\nD-2\t-1\tnope\n", encoding="utf-8")
    assert evaluate_files(str(path), str(gen), ["em"]) == {"em": pytest.approx(200 / 3, abs=1e-3)}
    assert "empty question" not in capfd.readouterr().err


def test_s_lines_must_show_the_gold_questions():
    """Predictions are aligned with the gold file by position: a gold file of other questions (another
    split of the same size) is refused; a question the generator's vocabulary spelled differently
    (case, spacing, an unknown character) in a minority of lines is not."""
    from rag_plugin.evaluation.fairseq_output import align_fairseq, parse_fairseq_lines
    from rag_plugin.evaluation.records import GoldExample

    gold = [GoldExample(f"id{i}", q, ["a"], [[]]) for i, q in
            enumerate(["Who wrote Hamlet?", "Capital of São Tomé?", "Where is Rira?"])]

    def out(sources):
        lines = []
        for i, src in enumerate(sources):
            lines += [f"S-{i}\t{src}", f"H-{i}\t-0.1\ta", f"D-{i}\t-0.1\ta"]
        return parse_fairseq_lines(list(enumerate(lines, 1)), "gen.out")

    ok = align_fairseq("gen.out", out(["who wrote hamlet ?", "Capital of S ⁇ o Tom ⁇ ?", "Where is Rira?"]), gold)
    assert [g.answer for g in ok] == ["a", "a", "a"]
    with pytest.raises(UserError, match="3 of 3 S- lines do not show their gold record's question.*the same split"):
        align_fairseq("gen.out", out(["Who is Delo?", "What flows?", "Name a lake."]), gold)
