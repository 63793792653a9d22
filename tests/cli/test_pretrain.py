"""rag-pretrain (rag_plugin/cli/pretrain.py): the commands of the two stages, printed; a finished stage is skipped, a
changed one redone with every stage after it; bad input is one line, exit 2. Its recipe, as fairseq parses it:
tests/pipeline/test_recipes.py. A real run is part of tests/examples/test_own_corpus.py."""
import json
import os
import shlex

import pytest

from rag_plugin.cli import pretrain
from tests.cli.helpers import assert_one_line_error, run_module

MODULE = "rag_plugin.cli.pretrain"
def shown_commands(stdout: str):
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("$ ")]


def option(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_dry_run_prints_both_stages(tiny_world, tmp_path):
    out = tmp_path / "pre"
    proc = run_module(MODULE, "--knowledge", tiny_world["ks"], "--out", out, "--updates", 7, "--pseudo-updates", 9,
                      "--dry-run")
    assert proc.returncode == 0, proc.stderr
    data1, train1, data2, train2 = shown_commands(proc.stdout)
    assert data1[:1] + [option(data1, "--objective"), option(data1, "--valid")] == ["rag-pretraining-data",
                                                                                     "denoise", "4"]
    assert data2[0] == "rag-pretraining-data" and option(data2, "--objective") == "pseudo-questions"
    assert train1[0] == train2[0] == "rag-train"
    assert train1[1] == str(out / "data" / "denoise") and option(train1, "--n-docs") == "0"
    assert option(train1, "--max-update") == "7" and "--generator-checkpoint" not in train1
    assert train2[1] == str(out / "data" / "pseudo_questions") and option(train2, "--max-update") == "9"
    assert option(train2, "--n-docs") == "1" and option(train2, "--retriever") == "bm25"
    assert option(train2, "--generator-checkpoint") == str(out / "checkpoints" / "denoise" / "checkpoint_last.pt")
    assert not out.exists()
    proc = run_module(MODULE, "--knowledge", tiny_world["ks"], "--out", out, "--pseudo-updates", 0, "--dry-run")
    assert [c[0] for c in shown_commands(proc.stdout)] == ["rag-pretraining-data", "rag-train"]


@pytest.fixture()
def fake_runs(monkeypatch):
    """commands.run replaced: records each command and makes the files the real one would."""
    ran = []

    def fake_run(command, **kwargs):
        ran.append(command)
        argv = list(command.args)
        if command.program == "rag-pretraining-data":
            out = option(argv, "--out")
            os.makedirs(out, exist_ok=True)
            for split in ("valid", "train"):
                open(os.path.join(out, f"{split}.jsonl"), "w").close()
        else:
            save = option(argv, "--save-dir")
            os.makedirs(save, exist_ok=True)
            with open(os.path.join(save, "checkpoint_last.pt"), "w") as fh:
                fh.write(" ".join(argv))

    monkeypatch.setattr(pretrain.commands, "run", fake_run)
    return ran


def test_finished_stages_are_skipped_and_changed_ones_redone(tiny_world, tmp_path, fake_runs, capsys):
    out = tmp_path / "pre"
    base = ["--knowledge", str(tiny_world["ks"]), "--out", str(out)]
    assert pretrain.main(base + ["--updates", "5", "--pseudo-updates", "6"]) == 0
    assert [c.program for c in fake_runs] == ["rag-pretraining-data", "rag-train"] * 2
    generator = out / "generator.pt"
    assert generator.read_text() == (out / "checkpoints" / "pseudo_questions" / "checkpoint_last.pt").read_text()
    info = json.loads((out / "pretrain.json").read_text())
    assert info["stages"] == {"denoise": 5, "pseudo_questions": 6} and info["max_source_positions"] == 96
    assert "--max-source-positions 96 --max-target-positions 64" in capsys.readouterr().out
    fake_runs.clear()
    assert pretrain.main(base + ["--updates", "5", "--pseudo-updates", "6"]) == 0
    assert fake_runs == []  # everything finished: nothing runs
    assert pretrain.main(base + ["--updates", "5", "--pseudo-updates", "8"]) == 0
    assert [c.program for c in fake_runs] == ["rag-train"]  # only the changed stage (its data is kept)
    fake_runs.clear()
    assert pretrain.main(base + ["--updates", "4", "--pseudo-updates", "8"]) == 0
    assert [option(list(c.args), "--max-update") for c in fake_runs] == ["4", "8"]  # a redone stage redoes the next


def test_bad_inputs_are_one_line(tiny_world, tmp_path):
    from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source

    ks = ["--knowledge", tiny_world["ks"], "--out", tmp_path / "pre"]
    assert_one_line_error(run_module(MODULE, "--knowledge", tmp_path / "none", "--out", tmp_path / "pre"), "none")
    assert_one_line_error(run_module(MODULE, *ks, "--updates", 0), "--updates")
    assert_one_line_error(run_module(MODULE, *ks, "--max-source-positions", 4), "--max-source-positions")
    assert_one_line_error(run_module(MODULE, *ks, "--batch-size", "x"), "--batch-size")
    plain = tmp_path / "plain_ks"
    build_knowledge_source(str(plain), BuildSettings(passages=str(tiny_world["root"] / "passages.jsonl"),
                                                     encoder="random:dim=16,layers=1,heads=2,intermediate=32"),
                           BuildOptions(progress=False, log=lambda m: None))
    assert_one_line_error(run_module(MODULE, "--knowledge", plain, "--out", tmp_path / "pre"),
                          "no generator vocabulary", "--dict")
