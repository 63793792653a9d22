"""rag-pretrain (rag_plugin/cli/pretrain.py) and its recipe (rag_plugin/pipeline/recipes.py): the recipe
is the package's rag_plugin/pipeline/config/recipe/tiny.yaml (the file the demo's configs compose:
tests/examples/test_run_demo.py), as fairseq parses the command lines; the commands of the two stages,
printed; a finished stage is skipped, a changed one redone with every stage after it; bad input is one
line, exit 2. A real run is part of tests/examples/test_own_corpus.py."""
import json
import os
import shlex
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rag_plugin.cli import pretrain
from rag_plugin.pipeline import recipes
from tests.cli.helpers import assert_one_line_error, run_module
from tests.conftest import ROOT

MODULE = "rag_plugin.cli.pretrain"
RECIPE_FILE = ROOT / "rag_plugin" / "pipeline" / "config" / "recipe" / "tiny.yaml"
#: keys of the recipe that are each run's own (run_settings), or that rag-train goes without (user_dir)
RUN_OWN = {("common", "user_dir"), ("task", "data"), ("task", "knowledge"), ("optimization", "max_update"),
           ("dataset", "validate_interval_updates")}


def parsed_by_fairseq(argv):
    """fairseq-train's config for ``argv`` (its own parser, the plugin as --user-dir), as a dict."""
    script = ("import json, sys\n"
              "from fairseq import options\n"
              "from fairseq.dataclass.utils import convert_namespace_to_omegaconf\n"
              "from omegaconf import OmegaConf\n"
              "args = options.parse_args_and_arch(options.get_training_parser(), input_args=json.load(sys.stdin))\n"
              "print(json.dumps(OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True,\n"
              "                                        enum_to_str=True), default=str))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(argv), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_rag_train_reads_the_packaged_recipe_as_fairseq_parses_it():
    tiny = OmegaConf.to_container(OmegaConf.load(RECIPE_FILE))
    assert OmegaConf.to_container(recipes.load_recipe()) == tiny  # the package's file, read as package data
    stage = recipes.PRETRAINING_STAGES[1]
    argv = recipes.rag_train_args(recipes.load_recipe(), stage.settings(),
                                  recipes.run_settings("DATA", "KS", "SAVE", 400, init="GEN"))
    assert "--user-dir" not in argv  # rag-train loads the plugin itself
    parsed = parsed_by_fairseq(argv + ["--user-dir", str(ROOT / "rag_plugin")])
    checked = 0
    for section, values in tiny.items():
        if section == "hydra":
            continue
        for key, value in values.items():
            if (section, key) not in RUN_OWN and (section, key) != ("task", "retriever"):
                assert parsed[section][key] == value, (section, key, parsed[section][key], value)
                checked += 1
    assert checked >= 25
    assert parsed["task"]["n_docs"] == 1 and parsed["task"]["retriever"] == "bm25"  # the stage's own
    assert parsed["model"]["_name"] == "rag_token_tiny" and parsed["criterion"]["_name"] == "marginal_nll"
    assert parsed["task"]["data"] == "DATA" and parsed["task"]["knowledge"] == "KS"
    assert parsed["optimization"]["max_update"] == 400 and parsed["checkpoint"]["save_dir"] == "SAVE"
    assert parsed["dataset"]["validate_interval_updates"] == 100 and parsed["model"]["generator_checkpoint"] == "GEN"


def test_the_recipe_ships_as_package_data(tmp_path):
    """What setup.py builds (what a wheel holds) has recipe/tiny.yaml beside the package's code."""
    proc = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    shipped = tmp_path / "rag_plugin" / "pipeline" / "config" / "recipe" / "tiny.yaml"
    assert shipped.read_text() == RECIPE_FILE.read_text()


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
