"""run_demo.py --systems: which systems a run trains and tests (demo_run.selection), and RESULTS.json / RESULTS.md
across runs (demo_run.history): a run of some systems replaces their rows and keeps the others', each naming the
run that made it. Every command is faked (tests/examples/fake_demo.py); nothing is trained."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from demo_run import history, recipe, selection  # examples/demo, put on sys.path by conftest.py
from demo_run.results import command_line, results_markdown
from demo_run.runner import ROOT

from rag_plugin.util.errors import UserError
from tests.examples.fake_demo import TRAINED, FakeDemo

LEGACY_DATE = "2026-12-02 15:34 UTC"
ISSUE35 = ["rag_token_rerank_maxsim", "rag_token_rerank_upr", "rag_token_rerank_cross", "rag_token_hybrid_rerank",
           "fid_scorebias"]


def legacy_results() -> dict:
    """A RESULTS.json as run_demo.py wrote it before runs were recorded (one run, described at the top level)."""
    row = {"test_em": 46.7, "test_f1": 53.2, "recall_at_5": 86.1, "answer_in_top5": 89.0}
    return {"command": "make demo  (python examples/demo/run_demo.py)", "date": LEGACY_DATE, "machine": "2 CPU cores",
            "systems": {"closed_book": {"test_em": 3.7, "test_f1": 6.1}, "rag_token": row, "rag_seq": row,
                        "rag_seq_thorough": row, "fid": {**row, "test_em": 21.8}, "gone_system": row},
            "k_sweep": {"rag_token": [{"k": 1, "em": 51.6, "recall": 64.8}, {"k": 3, "em": 47.7, "recall": 82.9}],
                        "fid": [{"k": 1, "em": 47.4, "recall": 54.0}, {"k": 3, "em": 29.1, "recall": 79.2}]},
            "hot_swap": {"questions": 22, "country_fact_updates": 400, "follows_index_in_use": 0.9,
                         "follows_other_index": 0.0, "n_docs": {"rag_token": {"k": 1, "valid_em": {"1": 100.0}}},
                         "runs": {"rag_token/countryinfo": {"follows_index_in_use": 0.9, "follows_other_index": 0.0}}},
            "jeopardy": {"bleu1": 30.5, "distinct3": 91.2},
            "timings_s": {"train rag_token": 287.7}, "total_s": 5483.5}


def trained(runner) -> list:
    """The save directories' names of the fairseq-train commands a run ran."""
    names = []
    for command in runner.commands:
        if command.program == "fairseq-train":
            args = [str(a) for a in command.args]
            names.append(args[args.index("--save-dir") + 1].rsplit("/", 1)[-1])
    return names


def test_the_default_systems():
    """make demo's systems: known names; the issue-35 rows with the rows they are measured against (rag_token,
    rag_token_hybrid, fid: the sweep's); both systems of the hot-swap test and Jeopardy; not rag_token_end2end."""
    stages = recipe.load_stages()
    default = selection.default_systems(stages)
    assert set(default) <= set(selection.known_systems(stages)) and len(set(default)) == len(default)
    cheap = [name for name in ISSUE35 if name not in ("rag_token_rerank_upr", "rag_token_rerank_cross")]
    assert set(cheap + ["rag_token", "rag_token_hybrid", "fid", "rag_seq", "closed_book", "jeopardy"]) <= set(default)
    # left to --systems all: the end-to-end document encoder (~20 min) and the two rerankers 2 cores cannot afford
    # within ~100 min (BENCHMARKS.md, reranking cost)
    assert not {"rag_token_end2end", "rag_token_rerank_upr", "rag_token_rerank_cross"} & set(default)
    chosen = selection.Selection.of(None, stages)
    assert chosen.hot_swap(stages) and chosen.jeopardy()
    assert chosen.sweep_systems(stages) == ["rag_token", "fid", "fid_scorebias"]
    assert selection.Selection.of("all", stages).systems == tuple(selection.known_systems(stages))
    # in stages.yaml's order, whatever the order given
    assert selection.parse_systems("fid_scorebias, rag_token", stages) == ["rag_token", "fid_scorebias"]


@pytest.mark.parametrize("spec, wanted", [("rag_token,nope", "unknown system nope; known: closed_book, rag_token"),
                                          (",", "no system named; known: closed_book")])
def test_unknown_systems_are_a_one_line_error(spec, wanted, capsys):
    import run_demo

    with pytest.raises(UserError, match=wanted):
        selection.parse_systems(spec, recipe.load_stages())
    assert run_demo.main(["--systems", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --systems: ") and "jeopardy" in err


def test_the_default_run(tmp_path, monkeypatch, capsys):
    """run_demo.py without --systems trains the default systems only, tests their rows, sweeps those of the
    sweep, runs the hot-swap test and Jeopardy; it ends by printing the command that serves its RAG-Token model."""
    demo = FakeDemo(tmp_path, monkeypatch)
    runner = demo.run(["--sweep", "1,3"])
    last = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert last[:2] == [".venv/bin/rag-serve", "--path"] and last[-2:] == ["--port", "8000"]
    assert Path(last[2]).name == "checkpoint_last.pt" and Path(last[2]).parent.name == "rag_token"
    stages = recipe.load_stages()
    default = selection.default_systems(stages)
    systems = [name for name in default if name != "jeopardy"]
    assert trained(runner) == ["pretrain", "pretrain_pseudo", *systems, "rag_token_countries", "rag_seq_countries",
                               "rag_token_jeopardy"]
    saved = demo.saved()
    rows = [name for name, run in stages.generate.test.items() if run.system in default]
    assert set(saved["systems"]) == {*rows, "rag_seq"} and "rag_token_frozen" not in saved["systems"]
    assert set(saved["k_sweep"]) == {"rag_token", "fid", "fid_scorebias"}
    (run,) = saved["runs"]
    assert saved["runs"][run]["systems"] == default and saved["hot_swap"]["run"] == saved["jeopardy"]["run"] == run
    assert not (demo.work / "ks_rag_token_end2end").exists()


def test_a_run_of_some_systems_keeps_the_others_rows(tmp_path, monkeypatch):
    """An earlier RESULTS.json (written before runs were recorded) and a work directory whose pretraining is
    complete; a run of two systems trains only them, adds their rows and sweep, keeps every other row, sweep and
    test as the earlier run left them, and RESULTS.md says which run made each."""
    demo = FakeDemo(tmp_path, monkeypatch)
    (tmp_path / "RESULTS.json").write_text(json.dumps(legacy_results()))
    for name, updates in (("pretrain", 1500), ("pretrain_pseudo", 2000)):  # finished by an earlier invocation
        (demo.work / "checkpoints" / name).mkdir(parents=True)
        (demo.work / "checkpoints" / name / "checkpoint_last.pt").write_bytes(name.encode())
        (demo.work / f"train_{name}.log").write_text(f"num_updates {updates} | done training\n")
    runner = demo.run(["--systems", "rag_token_rerank_maxsim,fid_scorebias", "--sweep", "1,3"])
    assert trained(runner) == ["rag_token_rerank_maxsim", "fid_scorebias"]
    programs = [c.program for c in runner.commands]
    assert "rag-plot-posterior" not in programs and "rag-update-knowledge" not in programs  # no Jeopardy, no hot swap
    generated = [str(c.args[0]) for c in runner.commands if c.program == "fairseq-generate"]
    assert len(generated) == 2 + 2 and all(path.endswith("nq_demo") for path in generated)  # 2 rows, 2 sweep points
    saved = demo.saved()
    assert set(saved["runs"]) == {LEGACY_DATE, new := next(r for r in saved["runs"] if r != LEGACY_DATE)}
    record = saved["runs"][new]
    assert record["command"] == ("python examples/demo/run_demo.py --systems rag_token_rerank_maxsim,fid_scorebias "
                                 "--sweep 1,3")
    assert record["systems"] == ["rag_token_rerank_maxsim", "fid_scorebias"] and record["settings"]["updates"] == 400
    assert record["reused"] == ["pretrain", "pretrain_pseudo"]
    assert record["pretrained_sha256"] == hashlib.sha256(b"pretrain_pseudo").hexdigest()[:12]
    legacy = saved["runs"][LEGACY_DATE]
    assert legacy["command"] == "make demo  (python examples/demo/run_demo.py)" and legacy["total_s"] == 5483.5
    assert legacy["systems"] == ["closed_book", "rag_token", "rag_seq", "fid", "jeopardy"]
    assert {name: row["run"] for name, row in saved["systems"].items()} == {
        "closed_book": LEGACY_DATE, "rag_token": LEGACY_DATE, "rag_seq": LEGACY_DATE, "rag_seq_thorough": LEGACY_DATE,
        "fid": LEGACY_DATE, "rag_token_rerank_maxsim": new, "fid_scorebias": new}  # gone_system: not in stages.yaml
    assert saved["systems"]["rag_token"]["test_em"] == 46.7 and saved["systems"]["fid_scorebias"]["test_em"] == 40.0
    assert saved["systems"]["fid_scorebias"]["training"] == TRAINED and "training" not in saved["systems"]["fid"]
    assert {name: {p["run"] for p in points} for name, points in saved["k_sweep"].items()} == {
        "rag_token": {LEGACY_DATE}, "fid": {LEGACY_DATE}, "fid_scorebias": {new}}
    assert saved["hot_swap"]["run"] == saved["jeopardy"]["run"] == LEGACY_DATE
    assert saved["jeopardy"]["bleu1"] == 30.5
    md = demo.markdown()
    assert "| rag_token | 46.7 | 53.2 | 86.1 | 89.0 | A | – |" in md  # its training: not recorded then
    assert "| fid_scorebias | 40.0 | 60.0 | 50.0 | 50.0 | B | 1.5 min, 2026-12-05 17:06 |" in md
    assert f"| A | {LEGACY_DATE} | `make demo  (python examples/demo/run_demo.py)` |" in md
    assert "| fid_scorebias EM / recall | 50.0 / 50.0 | 50.0 / 50.0 | B |" in md
    assert "| rag_token EM / recall | 51.6 / 64.8 | 47.7 / 82.9 | A |" in md
    assert "state differently; run A)" in md and "## Jeopardy-style generation (RAG-Token; run A)" in md
    assert "Run B reused what an earlier invocation had left complete in its work directory: the training of " \
           "pretrain, pretrain_pseudo" in md
    assert "Step timings of run A (s): train rag_token: 288" in md
    assert (demo.work / "k_sweep.png").is_file()  # drawn from every run's sweep

    demo.run(["--systems", "closed_book,rag_token,rag_seq,fid,jeopardy", "--sweep", "1,3"])  # all that A made
    saved = demo.saved()
    assert LEGACY_DATE not in saved["runs"] and len(saved["runs"]) == 2  # a run with nothing left is dropped
    assert saved["hot_swap"]["run"] == saved["jeopardy"]["run"] == max(saved["runs"])
    assert saved["systems"]["fid_scorebias"]["run"] == new and saved["systems"]["rag_token"]["test_em"] == 40.0
    assert "| fid_scorebias | 40.0 | 60.0 | 50.0 | 50.0 | A |" in demo.markdown()  # relabelled: the oldest run left


def test_merge_orders_rows_as_stages_yaml_and_names_each_run(tmp_path):
    stages = recipe.load_stages()
    previous = history.load_previous(tmp_path / "none.json", stages)
    assert previous == {}
    current = {"systems": {"fid_scorebias": {"test_em": 1.0}, "closed_book": {"test_em": 2.0}},
               "k_sweep": {"fid_scorebias": [{"k": 1, "em": 3.0, "recall": 4.0}]}}
    merged = history.merge(previous, current, "R", {"date": "R", "systems": ["closed_book", "fid_scorebias"]}, stages)
    assert list(merged["systems"]) == ["closed_book", "fid_scorebias"] and merged["runs"] == {
        "R": {"date": "R", "systems": ["closed_book", "fid_scorebias"]}}
    assert merged["k_sweep"]["fid_scorebias"] == [{"k": 1, "em": 3.0, "recall": 4.0, "run": "R"}]
    assert "hot_swap" not in merged and history.unique_run_id("R", merged) == "R (2)"
    md = results_markdown(merged, ROOT / "runs" / "demo")
    assert "| closed_book | 2.0 | – | – | – | A |" in md and "## Index hot-swap" not in md


def test_the_command_as_typed(monkeypatch):
    monkeypatch.delenv("MAKELEVEL", raising=False)
    assert command_line([]) == "python examples/demo/run_demo.py"
    assert command_line(["--systems", "a,b"]) == "python examples/demo/run_demo.py --systems a,b"
    monkeypatch.setenv("MAKELEVEL", "1")  # make sets it for the commands it runs: make demo
    assert command_line([]) == "make demo  (python examples/demo/run_demo.py)"


def test_a_system_started_from_another_needs_it_in_the_run(tmp_path, monkeypatch, capsys):
    """rag_lm_token_lsr freezes rag_lm_token's trained LM (stages.yaml init: rag_lm_token): alone it is a one-line
    error naming the system to add; with it, the decoder-only LM is pretrained (its two stages) and rag_lm_token is
    trained before it, and its start is rag_lm_token's checkpoint."""
    demo = FakeDemo(tmp_path, monkeypatch)
    import run_demo

    assert run_demo.main(["--systems", "rag_lm_token_lsr", "--work", str(demo.work)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "starts from rag_lm_token's trained generator" in err and "name rag_lm_token" in err
    runner = demo.run(["--systems", "rag_lm_token,rag_lm_token_lsr", "--sweep", "1"])
    assert trained(runner) == ["pretrain", "pretrain_pseudo", "pretrain_lm", "pretrain_lm_pseudo", "rag_lm_token",
                               "rag_lm_token_lsr"]
    lsr = next(c for c in runner.commands if c.program == "fairseq-train" and "rag_lm_token_lsr" in str(c.args))
    args = [str(a) for a in lsr.args]
    start = Path(args[args.index("--generator-checkpoint") + 1])
    assert start.parent.name == "rag_lm_token"
