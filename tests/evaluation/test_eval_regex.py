"""Regular-expression answers (CuratedTrec, meta.answer_is_regex) are scored as patterns."""
import json
import re

import pytest

from rag_plugin.evaluation import metrics as M
from rag_plugin.evaluation.readers import read_gold
from rag_plugin.evaluation.scoring import evaluate_files
from rag_plugin.util.errors import UserError


def drqa_regex_match_score(prediction, pattern):
    """DrQA's definition (drqa/pipeline eval: regex_match_score), restated for the comparison."""
    try:
        compiled = re.compile(pattern, flags=re.IGNORECASE + re.UNICODE + re.MULTILINE)
    except re.error:
        return False
    return compiled.match(prediction) is not None


FLINT = r"Charles\s+Flint|Flint"


@pytest.mark.parametrize("pred,patterns,expected", [
    ("Charles Flint", FLINT, 1.0),
    ("charles   FLINT", FLINT, 1.0),          # re.IGNORECASE, \s+
    ("Flint", FLINT, 1.0),
    ("Flint, Michigan", FLINT, 1.0),          # .match anchors at the start only (as DrQA)
    ("Mr Flint", FLINT, 0.0),                 # ... so a later start does not match
    ("Charles", FLINT, 0.0),
    ("1945", r"194[45]", 1.0),
    ("1946", r"194[45]", 0.0),
    ("the Beatles", r"(the )?Beatles", 1.0),
    ("Beatles", r"(the )?Beatles", 1.0),
    ("The Rolling Stones", r"(the )?Beatles", 0.0),
    ("Paris", [r"London", r"Par(is|ee)"], 1.0),  # the maximum over patterns
    (" Paris", r"Paris", 0.0),                # the prediction is not normalised (as DrQA)
])
def test_regex_exact_match_hand_computed(pred, patterns, expected):
    assert M.regex_exact_match(pred, patterns) == expected
    assert M.regex_token_f1(pred, patterns) == expected  # F1 on a pattern is its EM


def test_regex_exact_match_agrees_with_drqa():
    patterns = [FLINT, r"194[45]", r"(the )?Beatles", r"^Paris$", r"\d+ (miles|km)", r"colou?r", r"Mc\w+"]
    preds = ["Charles Flint", "flint", "1944", "19450", "Beatles", "the beatles!", "paris", "Paris\nFrance",
             "12 km", "twelve km", "Color", "McDonald", "", "X"]
    for pattern in patterns:
        for pred in preds:
            assert M.regex_exact_match(pred, pattern) == float(drqa_regex_match_score(pred, pattern)), (pred, pattern)


def test_pattern_that_does_not_compile_is_matched_literally():
    bad = "Smith (born"  # prepare_curatedtrec.py keeps such patterns verbatim
    assert M.compile_answer_pattern(bad) is None
    assert M.regex_exact_match("smith born", bad) == 1.0  # SQuAD-normalised literal match
    assert M.regex_exact_match("Smith", bad) == 0.0
    assert M.answer_in_top_k(["he met Smith (born 1900)"], [bad], 1, regex=True) == 1.0


def test_answer_in_top_k_searches_the_pattern():
    texts = ["IBM history.", "The company was founded by Charles  Flint in 1911."]
    assert M.answer_in_top_k(texts, [FLINT], 2, regex=True) == 1.0
    assert M.answer_in_top_k(texts, [FLINT], 1, regex=True) == 0.0
    assert M.answer_in_top_k(["it ended in 1945."], [r"194[45]"], 1, regex=True) == 1.0
    assert M.answer_in_top_k(["it ended in 1945."], [r"194[45]"], 1) == 0.0  # the pattern as a literal string
    assert M.answer_in_top_k(["Cafe\u0301 society"], ["Caf\u00e9"], 1, regex=True) == 1.0  # NFD, as DPR


def _gold(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


CT_GOLD = [
    {"id": "curatedtrec-test-0", "input": "who founded ibm", "output": [{"answer": FLINT}],
     "meta": {"answer_is_regex": True}},
    {"id": "curatedtrec-test-1", "input": "when did ww2 end", "output": [{"answer": "194[45]"}],
     "meta": {"answer_is_regex": True}},
    {"id": "plain", "input": "capital of france", "output": [{"answer": "Paris"}]},
]


def test_evaluate_files_scores_regex_golds_as_patterns(tmp_path):
    """The reviewer's repro: "Charles Flint" against Charles\\s+Flint|Flint used to score EM 0."""
    gold = _gold(tmp_path / "test.jsonl", CT_GOLD)
    guess = _gold(tmp_path / "guess.jsonl", [{"id": "curatedtrec-test-0", "output": [{"answer": "Charles Flint"}]},
                                             {"id": "curatedtrec-test-1", "output": [{"answer": "1945"}]},
                                             {"id": "plain", "output": [{"answer": "the Paris"}]}])
    assert evaluate_files(str(gold), str(guess), ["em", "f1"]) == {"em": 100.0, "f1": 100.0}
    wrong = _gold(tmp_path / "wrong.jsonl", [{"id": "curatedtrec-test-0", "output": [{"answer": "Watson"}]},
                                             {"id": "curatedtrec-test-1", "output": [{"answer": "194[45]"}]},
                                             {"id": "plain", "output": [{"answer": "Lyon"}]}])
    assert evaluate_files(str(gold), str(wrong), ["em", "f1"]) == {"em": 0.0, "f1": 0.0}


def test_answer_in_top_k_in_evaluate_uses_the_pattern(tmp_path):
    gold = _gold(tmp_path / "test.jsonl", [dict(CT_GOLD[0], output=[{"answer": FLINT, "provenance": [{"id": "p9"}]}])])
    guess = _gold(tmp_path / "guess.jsonl", [{"id": "curatedtrec-test-0", "output": [{
        "answer": "x", "provenance": [{"id": "p1", "text": "IBM was founded by Charles Flint."}]}]}])
    assert evaluate_files(str(gold), str(guess), ["answer_in_top1"]) == {"answer_in_top1": 100.0}


def test_derived_targets_are_scored_against_the_kept_pattern(tmp_path):
    """After rag-curatedtrec-targets: answers are concrete, meta.answer_pattern holds the pattern."""
    gold = _gold(tmp_path / "train.jsonl", [
        {"id": "a", "input": "q", "output": [{"answer": "Charles Flint"}],
         "meta": {"answer_is_regex": True, "answer_pattern": [FLINT], "target_from": "retrieved"}}])
    guess = _gold(tmp_path / "guess.jsonl", [{"id": "a", "output": [{"answer": "Flint"}]}])
    assert read_gold(str(gold))[0].patterns == [FLINT]
    assert evaluate_files(str(gold), str(guess), ["em"]) == {"em": 100.0}


def test_malformed_answer_pattern_names_file_and_line(tmp_path):
    gold = _gold(tmp_path / "gold.jsonl", [CT_GOLD[2], {"id": "a", "input": "q", "output": [{"answer": "x"}],
                                                        "meta": {"answer_is_regex": True, "answer_pattern": 3}}])
    with pytest.raises(UserError) as err:
        read_gold(str(gold))
    assert "gold.jsonl:2:" in str(err.value) and "answer_pattern" in str(err.value)
    assert str(err.value).endswith(")")
