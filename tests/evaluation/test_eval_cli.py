"""rag-evaluate and rag-leaderboard end to end (subprocess: the console scripts and rag_plugin.cli modules)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_plugin.evaluation import metrics
from tests.evaluation.eval_data import GOLD_QA, write_jsonl

REPO = Path(__file__).resolve().parents[2]
EVALUATE = Path(sys.executable).parent / "rag-evaluate"  # the console scripts, as installed
LEADERBOARD = Path(sys.executable).parent / "rag-leaderboard"


def run(script, *args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([str(script), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def assert_user_error(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert proc.stdout == ""


# ------------------------------------------------------------------ evaluate.py
def test_evaluate_fairseq_output_with_json_out(qa_files):
    out = qa_files["dir"] / "scores" / "qa.json"
    proc = run(EVALUATE, "--gold", qa_files["gold"], "--guess", qa_files["generate"],
               "--metrics", "em,f1,rprec,recall@5,answer_in_top1", "--passages", qa_files["passages"],
               "--json-out", out)
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert list(printed) == ["em", "f1", "rprec", "recall@5", "answer_in_top1"]
    assert printed["em"] == pytest.approx(66.6667)
    assert printed["recall@5"] == 100.0
    assert json.loads(out.read_text()) == printed
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_evaluate_task_defaults(qa_files, tmp_path):
    proc = run(EVALUATE, "--gold", qa_files["gold"], "--guess", qa_files["generate"])
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)) == ["em", "f1"]

    gold = write_jsonl(tmp_path / "jeo.jsonl", [
        {"id": "j1", "input": "Hamlet", "output": [{"answer": "This Shakespeare play features a Danish prince"}]},
        {"id": "j2", "input": "Jupiter", "output": [{"answer": "It is the largest planet of the solar system"}]},
    ])
    guess = write_jsonl(tmp_path / "jeo_guess.jsonl", [
        {"id": "j1", "output": [{"answer": "This play by Shakespeare has a Danish prince"}]},
        {"id": "j2", "output": [{"answer": "The largest planet in the solar system"}]},
    ])
    # by hand: 13a lower-cased unigrams, 6 + 6 clipped matches of 8 + 7 guess tokens, references of
    # 7 + 9 tokens (brevity penalty exp(1 - 16/15)); 6 + 5 trigrams, all distinct
    bleu1 = 100 * math.exp(1 - 16 / 15) * 12 / 15
    refs = ["This Shakespeare play features a Danish prince", "It is the largest planet of the solar system"]
    preds = ["This play by Shakespeare has a Danish prince", "The largest planet in the solar system"]
    expect = {"jeopardy": {"bleu1": bleu1, "distinct3": 100.0},
              "msmarco": {"rougeL": 100 * metrics.rouge_l(preds, refs), "bleu1": bleu1,
                          "bleu": 100 * metrics.sacrebleu_corpus(preds, [[r] for r in refs]), "distinct3": 100.0}}
    for task, want in expect.items():
        proc = run(EVALUATE, "--gold", gold, "--guess", guess, "--task", task)
        assert proc.returncode == 0, proc.stderr
        scores = json.loads(proc.stdout)
        assert list(scores) == list(want)
        assert scores == pytest.approx(want, abs=1e-3)


def test_evaluate_fever_task(tmp_path):
    gold = write_jsonl(tmp_path / "fever.jsonl", [
        {"id": "c1", "input": "A claim.", "output": [{"answer": "SUPPORTS"}]},
        {"id": "c2", "input": "Another claim.", "output": [{"answer": "REFUTES"}]},
    ])
    gen = tmp_path / "gen.out"
    gen.write_text("S-0\tA claim.\nH-0\t-0.1\tSUPPORTS\nD-0\t-0.1\tSUPPORTS\n"
                   "S-1\tAnother claim.\nH-1\t-0.2\tSUPPORTS\nD-1\t-0.2\tSUPPORTS\n", encoding="utf-8")
    proc = run(EVALUATE, "--gold", gold, "--guess", gen, "--task", "fever")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"accuracy": 50.0, "accuracy2": 50.0}


@pytest.mark.parametrize("case", ["no_gold", "unknown_metric", "bad_flag", "missing_ids", "malformed",
                                  "empty_guess", "bad_task", "bad_gold_json"])
def test_evaluate_bad_inputs_exit_2_one_line(qa_files, tmp_path, case):
    gold, gen = qa_files["gold"], qa_files["generate"]
    if case == "no_gold":
        proc = run(EVALUATE, "--gold", tmp_path / "nope.jsonl", "--guess", gen)
        assert_user_error(proc, "nope.jsonl", "not found")
    elif case == "unknown_metric":
        proc = run(EVALUATE, "--gold", gold, "--guess", gen, "--metrics", "em,qbleu1")
        assert_user_error(proc, "unknown metric 'qbleu1'")
    elif case == "bad_flag":
        proc = run(EVALUATE, "--gold", gold, "--guess", gen, "--frobnicate")
        assert_user_error(proc, "--frobnicate")
    elif case == "missing_ids":
        guess = write_jsonl(tmp_path / "g.jsonl", [{"id": "q1", "output": [{"answer": "Paris"}]}])
        proc = run(EVALUATE, "--gold", gold, "--guess", guess)
        assert_user_error(proc, "'q2'", "'q3'", str(guess))
    elif case == "malformed":
        bad = tmp_path / "bad.out"
        bad.write_text(gen.read_text() + "Z-0\t9\tlots\tp1\tT\n")
        n = len(bad.read_text().splitlines())
        proc = run(EVALUATE, "--gold", gold, "--guess", bad)
        assert_user_error(proc, f"{bad}:{n}:")
    elif case == "empty_guess":
        empty = tmp_path / "empty.out"
        empty.write_text("")
        proc = run(EVALUATE, "--gold", gold, "--guess", empty)
        assert_user_error(proc, "empty", str(empty))
    elif case == "bad_task":
        proc = run(EVALUATE, "--gold", gold, "--guess", gen, "--task", "squad")
        assert_user_error(proc, "squad")
    elif case == "bad_gold_json":
        bad_gold = tmp_path / "gold_bad.jsonl"
        bad_gold.write_text(json.dumps(GOLD_QA[0]) + "\n{oops\n")
        proc = run(EVALUATE, "--gold", bad_gold, "--guess", gen)
        assert_user_error(proc, f"{bad_gold}:2:")


# ------------------------------------------------------------------ leaderboard.py
def test_leaderboard_systems_and_results(qa_files, tmp_path):
    # a second system: KILT JSONL, all wrong answers, perfect retrieval
    guess_b = write_jsonl(tmp_path / "b.jsonl", [
        {"id": g["id"], "output": [{"answer": "nothing", "provenance": [
            {"id": p.get("id", p.get("wikipedia_id"))} for out in g["output"] for p in out.get("provenance", [])]}]}
        for g in GOLD_QA])
    results = tmp_path / "bart.json"
    results.write_text(json.dumps({"em": 12.5, "f1": 20.0, "rougel": 30.25}))
    md, js = tmp_path / "board.md", tmp_path / "board.json"
    proc = run(LEADERBOARD, "--gold", qa_files["gold"], "--metrics", "em,f1,rprec",
               "--system", f"RAG-Token={qa_files['generate']}", "--system", f"Oracle|retr={guess_b}",
               "--results", f"BART={results}", "--json-out", js, "--md-out", md)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "| System | EM | F1 | R-Prec | R-L |"
    assert lines[1] == "| --- | ---: | ---: | ---: | ---: |"
    assert lines[2].startswith("| RAG-Token | 66.67 | 88.89 | 83.33 | – |")
    assert lines[3] == "| Oracle\\|retr | 0.00 | 0.00 | 100.00 | – |"
    assert lines[4] == "| BART | 12.50 | 20.00 | – | 30.25 |"
    assert md.read_text() == proc.stdout
    board = json.loads(js.read_text())
    assert set(board) == {"systems"}
    assert board["systems"]["RAG-Token"]["em"] == pytest.approx(66.6667)
    assert board["systems"]["BART"] == {"em": 12.5, "f1": 20.0, "rougeL": 30.25}


def test_leaderboard_config(qa_files, tmp_path):
    cfg_dir = qa_files["dir"]
    (cfg_dir / "res.json").write_text(json.dumps({"em": 1.0}))
    cfg = cfg_dir / "board.json"
    cfg.write_text(json.dumps({"gold": "gold.jsonl", "task": "qa",
                               "systems": [{"name": "rag", "guess": "generate.out"}],
                               "results": {"old": "res.json"}}))
    proc = run(LEADERBOARD, "--config", cfg, cwd=tmp_path.parent)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "| System | EM | F1 |"
    assert lines[2] == "| rag | 66.67 | 88.89 |"
    assert lines[3] == "| old | 1.00 | – |"


@pytest.mark.parametrize("case", ["no_systems", "dup_name", "no_gold", "bad_pair", "bad_results",
                                  "bad_config_key", "mismatch"])
def test_leaderboard_bad_inputs(qa_files, tmp_path, case):
    gen = qa_files["generate"]
    if case == "no_systems":
        assert_user_error(run(LEADERBOARD, "--gold", qa_files["gold"]), "no system")
    elif case == "dup_name":
        assert_user_error(run(LEADERBOARD, "--gold", qa_files["gold"], "--system", f"a={gen}",
                              "--system", f"a={gen}"), "twice")
    elif case == "no_gold":
        assert_user_error(run(LEADERBOARD, "--system", f"a={gen}"), "--gold")
    elif case == "bad_pair":
        assert_user_error(run(LEADERBOARD, "--gold", qa_files["gold"], "--system", str(gen)), "NAME=FILE")
    elif case == "bad_results":
        res = tmp_path / "r.json"
        res.write_text(json.dumps({"em": "high"}))
        assert_user_error(run(LEADERBOARD, "--results", f"x={res}"), str(res), "'em'")
    elif case == "bad_config_key":
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"gold": "g.jsonl", "sytems": {}}))
        assert_user_error(run(LEADERBOARD, "--config", cfg), "sytems")
    elif case == "mismatch":
        other = write_jsonl(tmp_path / "other.jsonl", GOLD_QA[:2])
        assert_user_error(run(LEADERBOARD, "--gold", other, "--system", f"a={gen}"), "index 2", str(gen))


def test_evaluation_package_imports_no_fairseq():
    code = ("import sys; import rag_plugin.evaluation.scoring, rag_plugin.evaluation.readers, "
            "rag_plugin.evaluation.metrics as m; m.rouge_l(['a'], ['a']); m.bleu1(['a'], ['a']); "
            "print(sorted(x for x in ('fairseq', 'torch') if x in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_leaderboard_results_from_a_previous_board(tmp_path):
    board = tmp_path / "old.json"
    board.write_text(json.dumps({"systems": {"A": {"em": 50.0}, "B": {"em": 40.0, "custom": 1.5}}}))
    proc = run(LEADERBOARD, "--results", f"B={board}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["| System | EM | custom |", "| --- | ---: | ---: |", "| B | 40.00 | 1.50 |"]
    assert_user_error(run(LEADERBOARD, "--results", f"C={board}"), "no system 'C'")


@pytest.mark.parametrize("module, shown", [("evaluate", ["rag-evaluate", "(default: auto)", "answer_in_top<K>"]),
                                           ("leaderboard", ["rag-leaderboard", "NAME=GUESS_FILE", "closed book"]),
                                           ("plot_doc_posterior", ["rag-plot-posterior", "(default: None)"])])
def test_console_modules_help_shows_defaults(module, shown):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", f"rag_plugin.cli.{module}", "--help"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for text in shown:
        assert text in proc.stdout, (text, proc.stdout)


def test_usage_error_names_the_console_command(qa_files):
    proc = run(EVALUATE, "--gold", qa_files["gold"])
    assert_user_error(proc, "--guess", "rag-evaluate --help")
