"""rag_plugin.evaluation.leaderboard and rag-leaderboard: rows, columns, rendering; a closed-book row
has no retrieval values ("–" / null) instead of failing the board (issue 25, item 7)."""
import json

import pytest

from rag_plugin.evaluation.leaderboard import board_json, build_rows, markdown_table, read_results
from rag_plugin.util.errors import UserError
from tests.evaluation.eval_data import GENERATE_QA
from tests.evaluation.test_eval_cli import LEADERBOARD, run


def _closed_book(tmp_path):
    """The same answers as GENERATE_QA, without the Z- (provenance) lines: a closed-book system."""
    path = tmp_path / "closed.out"
    path.write_text("".join(line + "\n" for line in GENERATE_QA.splitlines() if not line.startswith("Z-")))
    return path


def test_closed_book_row_has_no_retrieval_values(qa_files, tmp_path):
    rows = build_rows([("rag", str(qa_files["generate"])), ("closed", str(_closed_book(tmp_path)))], [],
                      ["em", "rprec", "recall@5", "answer_in_top1"], str(qa_files["gold"]),
                      passages=str(qa_files["passages"]))
    assert rows["closed"] == {"em": pytest.approx(200 / 3, abs=1e-3), "rprec": None, "recall@5": None,
                              "answer_in_top1": None}
    assert rows["rag"]["em"] == rows["closed"]["em"] and rows["rag"]["recall@5"] == 100.0
    lines = markdown_table(rows, ["em", "rprec", "recall@5", "answer_in_top1"]).splitlines()
    assert lines[0] == "| System | EM | R-Prec | R@5 | Ans@1 |"
    assert lines[2] == "| rag | 66.67 | 83.33 | 100.00 | 100.00 |"
    assert lines[3] == "| closed | 66.67 | – | – | – |"
    assert json.loads(json.dumps(board_json(rows)))["systems"]["closed"]["rprec"] is None


def test_rag_leaderboard_closed_book_row(qa_files, tmp_path):
    """Before: 'the predictions hold no retrieved passages' stopped the whole board."""
    board = tmp_path / "board.json"
    proc = run(LEADERBOARD, "--gold", qa_files["gold"], "--metrics", "em,f1,recall@5,answer_in_top1",
               "--passages", qa_files["passages"], "--system", f"rag_token={qa_files['generate']}",
               "--system", f"closed_book={_closed_book(tmp_path)}", "--json-out", board)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2:] == ["| rag_token | 66.67 | 88.89 | 100.00 | 100.00 |",
                                            "| closed_book | 66.67 | 88.89 | – | – |"]
    rows = json.loads(board.read_text())["systems"]
    assert rows["closed_book"]["recall@5"] is None and rows["closed_book"]["answer_in_top1"] is None
    # the board's JSON is read back as results, nulls included
    assert read_results(str(board), "closed_book")["recall@5"] is None
    proc = run(LEADERBOARD, "--metrics", "em,f1,recall@5,answer_in_top1", "--results", f"closed_book={board}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2] == "| closed_book | 66.67 | 88.89 | – | – |"


def test_closed_book_still_needs_what_text_metrics_need(qa_files, tmp_path):
    """Only retrieval columns are left empty: a system without answers still fails em."""
    guess = tmp_path / "noanswer.jsonl"
    guess.write_text("".join(json.dumps({"id": i, "output": [{}]}) + "\n" for i in ("q1", "q2", "q3")))
    with pytest.raises(UserError, match="no 'answer'"):
        build_rows([("x", str(guess))], [], ["em", "rprec"], str(qa_files["gold"]))


def test_results_columns_are_added_after_the_asked_ones(tmp_path):
    res = tmp_path / "r.json"
    res.write_text(json.dumps({"EM": 10, "custom": 2.5, "recall@05": None}))
    columns = ["em"]
    rows = build_rows([], [("old", str(res))], columns, None)
    assert columns == ["em", "custom", "recall@5"]
    assert rows == {"old": {"em": 10.0, "custom": 2.5, "recall@5": None}}
    assert markdown_table(rows, columns).splitlines()[2] == "| old | 10.00 | 2.50 | – |"
