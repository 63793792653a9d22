"""examples/demo/run_demo.py: its recipe is the YAML fairseq-hydra-train runs, written once (shipped in the
package: rag_plugin/pipeline/config/recipe/tiny.yaml, composed from the demo configs' hydra search path).

Nothing is trained here: the fairseq-train command lines the demo would run are built from
examples/demo/config and stages.yaml and compared with the YAML, as strings and as fairseq parses them.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from demo_run import recipe  # examples/demo, put on sys.path by conftest.py
from omegaconf import OmegaConf

from rag_plugin.pipeline.commands import console_script
from rag_plugin.pipeline.recipes import option_args, run_settings, train_args
from rag_plugin.util.errors import UserError
from tests.examples.fake_demo import TRAINED, FakeDemo

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo"
RECIPE_FILE = ROOT / "rag_plugin" / "pipeline" / "config" / "recipe" / "tiny.yaml"
DATA = Path("/demo-data")
CKPT = Path("/ckpt/checkpoint_last.pt")
RECIPE_SECTIONS = ("optimizer", "lr_scheduler", "optimization")  # what every run must share


def training_runs():
    """name -> (config, its fairseq-train arguments) for every training run of the demo."""
    stages = recipe.load_stages()
    runs = {"pretrain": (stages.train.pretrain, None, {}),
            "pretrain_pseudo": (stages.train.pretrain_pseudo, None, {"init": CKPT}),
            "rag_token_jeopardy": (stages.train.jeopardy, None, {"init": CKPT})}
    for name, stage in stages.train.systems.items():
        runs[name] = (stage, None, {"init": CKPT})
    for name in stages.generate.hot_swap.systems:
        runs[f"{name}_countries"] = (stages.train.systems[name], stages.train.hot_swap, {"restore": CKPT})
    out = {}
    for name, (stage, then, start) in runs.items():
        settings = run_settings(DATA / name, DATA / "ks", Path("/save") / name, 400, **start)
        config = recipe.train_config(stage, settings, then=then)
        out[name] = config, train_args(config), stage, then
    return out


@pytest.fixture(scope="module")
def runs(forget_fairseq_schemas):
    return training_runs()


@pytest.fixture(scope="module", autouse=True)
def forget_fairseq_schemas():
    """fairseq's hydra_init(name) stores its whole schema in hydra's ConfigStore under a config's name, and hydra
    then validates a config of that name against it (every fairseq option joins the composed config): a test that
    composed a demo config as fairseq-hydra-train does (tests/examples/test_hydra.py), earlier in this process,
    must not change what run_demo.py composes in a process of its own."""
    from hydra.core.config_store import ConfigStore

    for path in (DEMO / "config").glob("*.yaml"):
        ConfigStore.instance().repo.pop(path.name, None)


def options_of(args):
    """``["DATA", "--lr", "0.001", "--cpu", ...]`` -> {"--lr": "0.001", "--cpu": True}; each once."""
    found = {}
    i = 1
    while i < len(args):
        assert args[i].startswith("--"), args[i]
        assert args[i] not in found, f"{args[i]} given twice"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            found[args[i]] = args[i + 1]
            i += 2
        else:
            found[args[i]] = True
            i += 1
    return found


def expected_value(value):
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return True if value is True else str(value)


def test_the_recipe_is_the_one_results_md_came_from():
    """The committed RESULTS.md came from run_demo.py with Adam betas (0.9, 0.98) (the YAML then said
    0.999); the recipe file now holds run_demo's values."""
    tiny = OmegaConf.load(RECIPE_FILE)
    assert tiny.optimizer.adam_betas == "(0.9, 0.98)" and tiny.optimizer._name == "torch_adamw"
    assert list(tiny.optimization.lr) == [1e-3] and tiny.optimization.clip_norm == 1.0
    assert tiny.lr_scheduler._name == "inverse_sqrt" and tiny.lr_scheduler.warmup_updates == 100
    assert tiny.model.query_encoder_lr_scale == 0.03 and tiny.model.freeze_query_embeddings is True
    assert tiny.dataset.batch_size == 32 and tiny.dataset.batch_size_valid == 64
    assert tiny.common.log_interval == 25 and tiny.common.seed == 1


def test_train_command_lines_carry_the_yaml_optimizer_settings(runs):
    """Every option of the recipe file's optimizer, schedule and optimization sections is on every
    fairseq-train command line exactly as the YAML (or, for the hot-swap stage, stages.yaml) says."""
    tiny = OmegaConf.to_container(OmegaConf.load(RECIPE_FILE))
    names = {"criterion": "--criterion", "optimizer": "--optimizer", "lr_scheduler": "--lr-scheduler"}
    for name, (_, args, _, then) in runs.items():
        found = options_of(args)
        changed = OmegaConf.to_container(then.set) if then is not None else {}
        for section in RECIPE_SECTIONS:
            for key, value in tiny[section].items():
                wanted = changed.get(f"{section}.{key}", value)
                flag = names[section] if key == "_name" else "--" + key.replace("_", "-")
                assert found.get(flag) == expected_value(wanted), (name, flag, found.get(flag), wanted)
    assert options_of(runs["rag_token"][1])["--adam-betas"] == "(0.9, 0.98)"
    assert options_of(runs["rag_seq_countries"][1])["--lr"] == "0.0005"  # the hot-swap stage's own lr


def test_every_yaml_option_is_on_the_command_line(runs):
    """Nothing of a composed config is lost on the way to fairseq-train (true flags bare, false
    flags left at fairseq's default false)."""
    for name, (config, args, _, _) in runs.items():
        found = options_of(args)
        assert args[0] == config.task.data
        for section, values in OmegaConf.to_container(config).items():
            if section == "hydra":
                continue
            for key, value in values.items():
                if key == "_name" or (section, key) == ("task", "data"):
                    continue
                flag = "--" + key.replace("_", "-")
                if value is False or value is None:
                    assert flag not in found, (name, flag)
                else:
                    assert found.get(flag) == expected_value(value), (name, flag)


def test_the_stage_options_reach_their_runs(runs):
    opts = {name: options_of(args) for name, (_, args, _, _) in runs.items()}
    assert opts["pretrain"]["--n-docs"] == "0" and "--generator-checkpoint" not in opts["pretrain"]
    assert opts["pretrain_pseudo"]["--n-docs"] == "1" and opts["pretrain_pseudo"]["--retriever"] == "bm25"
    assert opts["rag_token_frozen"]["--freeze-query-encoder"] is True
    assert "--freeze-query-encoder" not in opts["rag_token"]
    assert opts["rag_token_bm25"]["--retriever"] == "bm25" and opts["rag_token"]["--retriever"] == "dense"
    assert opts["rag_seq"]["--arch"] == "rag_seq_tiny" and opts["closed_book"]["--n-docs"] == "0"
    for name in ("closed_book", "pretrain", "pretrain_pseudo", "rag_token", "rag_seq", "rag_token_pdist"):
        assert opts[name]["--criterion"] == "marginal_nll", name
    assert opts["fid"]["--arch"] == "fid_tiny" and opts["fid"]["--criterion"] == "reader_cross_entropy"
    assert opts["fid"]["--n-docs"] == "3" and "--retriever-loss" not in opts["fid"]
    assert opts["fid_adist"]["--retriever-loss"] == "adist" and opts["rag_token_pdist"]["--retriever-loss"] == "pdist"
    assert opts["rag_token_hybrid"]["--retriever"] == "hybrid"
    for name, reranker in (("rag_token_rerank_maxsim", "maxsim"), ("rag_token_rerank_upr", "upr"),
                           ("rag_token_rerank_cross", "cross"), ("rag_token_hybrid_rerank", "maxsim")):
        assert opts[name]["--arch"] == "rag_token_tiny" and opts[name]["--reranker"] == reranker, name
        assert opts[name]["--rerank-candidates"] == "20" and opts[name]["--n-docs"] == "3", name
        assert (opts[name].get("--maxsim-cache") is True) == (reranker == "maxsim"), name  # token states once
    assert opts["rag_token_rerank_cross"]["--retriever-loss"] == "pdist"
    assert "--retriever-loss" not in opts["rag_token_rerank_maxsim"] and "--reranker" not in opts["rag_token"]
    assert opts["rag_token_hybrid_rerank"]["--retriever"] == "hybrid"
    assert opts["rag_token_rerank_upr"]["--retriever"] == "dense"
    assert opts["fid_scorebias"]["--arch"] == "fid_tiny" and opts["fid_scorebias"]["--fid-score-bias"] is True
    assert opts["fid_scorebias"]["--fid-random-passages"] == "0.2" and "--fid-score-bias" not in opts["fid"]
    for name in ("rag_token_countries", "rag_seq_countries"):
        assert opts[name]["--restore-file"] == str(CKPT) and opts[name]["--warmup-updates"] == "20"
        assert all(opts[name][f"--reset-{what}"] is True for what in ("optimizer", "lr-scheduler", "dataloader",
                                                                        "meters"))
    assert opts["rag_token"]["--generator-checkpoint"] == str(CKPT)
    assert opts["rag_token"]["--max-update"] == "400" and opts["rag_token"]["--validate-interval-updates"] == "100"


def test_the_configs_set_only_what_the_recipe_does_not():
    """config/*.yaml list recipe/tiny after _self_ and find it in the package (their hydra search path), so a
    key set in both would silently take the recipe's value: each config may set only keys the recipe leaves alone."""
    def leaves(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield prefix + key

    recipe = OmegaConf.to_container(OmegaConf.load(RECIPE_FILE))
    tiny = set(leaves(recipe))
    configs = sorted((DEMO / "config").glob("*.yaml"))
    assert {p.stem for p in configs} == {"rag_token_tiny", "rag_seq_tiny", "bart_tiny_closed_book", "fid_tiny",
                                         "rag_lm_token_tiny", "rag_lm_seq_tiny", "lm_tiny_pretrain"}
    # the decoder-only reader's LM pretrains with fairseq's language_modeling task, whose task and model sections
    # are not the recipe's: it writes the recipe's training values out, and they must stay the recipe's
    lm = OmegaConf.to_container(OmegaConf.load(DEMO / "config" / "lm_tiny_pretrain.yaml"))
    for section in ("optimizer", "lr_scheduler", "optimization", "dataset"):
        for key, value in recipe[section].items():
            if key not in ("max_update", "validate_interval_updates"):  # the run's own (run_settings)
                assert lm[section][key] == value, (section, key)
    for path in configs:
        if path.stem == "lm_tiny_pretrain":
            continue
        own = OmegaConf.to_container(OmegaConf.load(path))
        assert own.pop("defaults") == ["_self_", "recipe/tiny"], path
        assert own["hydra"].pop("searchpath") == ["pkg://rag_plugin.pipeline.config"], path
        assert not set(leaves(own)) & tiny, path


def test_no_option_of_the_recipe_is_written_in_python():
    code = "".join(p.read_text() for p in [DEMO / "run_demo.py", *sorted((DEMO / "demo_run").glob("*.py"))])
    for literal in ('"--lr"', '"--adam-betas"', '"--warmup-updates"', '"--beam"', '"--n-docs"', '"--dropout"',
                    '"--batch-size"', '"--retriever"', "TRAIN_COMMON", "0.98", "1e-3", "5e-4", "torch_adamw",
                    "inverse_sqrt", "marginal_nll", "rag_token_tiny", "rag_seq_tiny", "minilm"):
        assert literal not in code, literal


def test_fairseq_parses_the_command_lines_to_the_yaml(runs):
    """What fairseq-train makes of each command line (its own parser, with the plugin as --user-dir)
    holds every value of the composed YAML."""
    argvs = {name: args for name, (_, args, _, _) in runs.items()}
    script = ("import json, sys\n"
              "from fairseq import options\n"
              "from fairseq.dataclass.utils import convert_namespace_to_omegaconf\n"
              "from omegaconf import OmegaConf\n"
              "out = {}\n"
              "for name, argv in json.load(sys.stdin).items():\n"
              "    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)\n"
              "    out[name] = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True,\n"
              "                                       enum_to_str=True)\n"
              "print(json.dumps(out, default=str))\n")
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], input=json.dumps(argvs), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, (config, _, _, _) in runs.items():
        for section, values in OmegaConf.to_container(config).items():
            if section == "hydra":
                continue
            for key, value in values.items():
                assert parsed[name][section][key] == value, (name, section, key, parsed[name][section][key], value)
        assert parsed[name]["optimizer"]["adam_betas"] == "(0.9, 0.98)"


def test_generate_options():
    stages = recipe.load_stages()
    assert option_args({"beam": 4, "cpu": True, "quiet": False, "path": None, "lr": [0.1, 0.2]}) == [
        "--beam", "4", "--cpu", "--lr", "0.1,0.2"]
    common = option_args(stages.generate.common)
    assert common[:4] == ["--user-dir", "rag_plugin", "--task", "retrieval_augmented"]
    fast = dict(stages.generate.test.rag_seq_fast)
    assert fast.pop("system") == "rag_seq"
    assert option_args(fast) == ["--beam", "4", "--n-docs", "5", "--rag-decoding", "fast"]
    assert list(stages.generate.test) == ["closed_book", "rag_token", "rag_seq_thorough", "rag_seq_fast",
                                          "rag_token_frozen", "rag_token_bm25", "rag_token_hybrid", "rag_token_pdist",
                                          "fid", "fid_adist", "rag_token_end2end", "rag_token_rerank_maxsim",
                                          "rag_token_rerank_upr", "rag_token_rerank_cross", "rag_token_hybrid_rerank",
                                          "fid_scorebias", "closed_book_lm", "rag_lm_token", "rag_lm_seq_thorough",
                                          "rag_lm_seq_fast", "rag_lm_token_lsr"]
    assert set(stages.train.systems) == {run.system for run in stages.generate.test.values()}
    # the reranked systems are tested as they were trained: the same reranker, L=20 candidates -> K=5
    for name in ("rag_token_rerank_maxsim", "rag_token_rerank_upr", "rag_token_rerank_cross",
                 "rag_token_hybrid_rerank"):
        trained, tested = stages.train.systems[name].set, stages.generate.test[name]
        for key in ("reranker", "rerank_candidates", "maxsim_cache", "retriever"):
            assert tested.get(key) == trained.get(f"task.{key}"), (name, key)
        assert tested.rerank_candidates == 20 and tested.n_docs == 5
    assert list(stages.generate.k_sweep.systems) == ["rag_token", "fid", "fid_scorebias"]


def setup_console_scripts():
    """The console scripts setup.py declares (its CONSOLE_SCRIPTS: the one table of them)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    table = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "CONSOLE_SCRIPTS")
    return {entry.split("=")[0].strip() for entry in ast.literal_eval(table)}


def test_console_scripts_run_as_installed(tmp_path, monkeypatch):
    installed = console_script("fairseq-train", "--help")
    assert installed.argv() == [str(Path(sys.executable).parent / "fairseq-train"), "--help"]
    cmd = console_script("rag-build-knowledge", "--out", ROOT / "data" / "demo" / "ks")
    assert cmd.argv()[0] == str(Path(sys.executable).parent / "rag-build-knowledge")
    assert cmd.shown(ROOT) == "rag-build-knowledge --out data/demo/ks"
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no console scripts beside it, none on PATH
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="command rag-build-knowledge not found") as err:
        cmd.argv()
    assert "pip install -e ." in str(err.value)


@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_run_demo_help(cwd, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(DEMO / "run_demo.py"), "--help"], env=env, capture_output=True,
                          cwd=ROOT if cwd == "root" else tmp_path, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "usage: run_demo.py" in proc.stdout and "(default: 400)" in proc.stdout


def test_the_whole_demo_runs_its_commands_in_order(tmp_path, monkeypatch):
    """run_demo.main --systems all with every command faked: the order of the commands, the recipe on every
    fairseq-train line, and RESULTS.md / RESULTS.json from what the commands wrote."""
    demo = FakeDemo(tmp_path, monkeypatch)
    data = demo.data
    commands_run = demo.run(["--systems", "all", "--sweep", "1,3"]).commands
    programs = [c.program for c in commands_run]
    assert programs[:5] == ["python examples/demo/prepare_demo_data.py", "rag-build-knowledge", "rag-build-knowledge",
                            "rag-search", "rag-pretraining-data"]
    # pretraining, systems, hot swap, Jeopardy; the decoder-only reader's LM (its two stages) and its 4 systems
    assert programs.count("fairseq-train") == 2 + 15 + 2 + 1 + 2 + 4
    # test, K sweep (RAG-Token, FiD, FiD with score bias), K choice, hot swap (swapped and updated source), Jeopardy
    assert programs.count("fairseq-generate") == 16 + 5 + 3 * 2 + 2 * 3 + 2 * 3 + 1
    # the system with a trained document encoder: its own copy of the source, trained, embedded again, tested
    own = tmp_path / "runs" / "demo" / "ks_rag_token_end2end"
    assert (own / "manifest.json").is_file() and not (data / "ks" / "versions").exists()
    end2end_commands = [c for c in commands_run if str(own) in [str(a) for a in c.args]]
    assert [c.program for c in end2end_commands] == ["fairseq-train", "rag-update-knowledge", "fairseq-generate",
                                                     "rag-evaluate"]
    assert "--reembed" in [str(a) for a in end2end_commands[1].args]
    update = next(c for c in commands_run if "--replace" in [str(a) for a in c.args])
    args = [str(a) for a in update.args]
    replaced = Path(args[args.index("--replace") + 1]).read_text().splitlines()
    added = Path(args[args.index("--add") + 1]).read_text().splitlines()
    assert [json.loads(x)["id"] for x in replaced] == ["country:BI"] and [json.loads(x)["id"] for x in added] == [
        "country:XK"]
    assert (tmp_path / "runs" / "demo" / "ks_updated" / "manifest.json").is_file()  # a linked copy, updated
    assert {"rag-leaderboard", "rag-plot-posterior", "rag-evaluate"} <= set(programs)
    scripts = {p for p in programs if not p.startswith("python ")}
    assert scripts - {"fairseq-train", "fairseq-generate"} <= setup_console_scripts()  # setup.py's, none other
    for command in commands_run:
        if command.program == "fairseq-train":
            assert options_of([str(a) for a in command.args])["--adam-betas"] == "(0.9, 0.98)"
    saved = demo.saved()
    (run,) = saved["runs"]
    assert saved["systems"]["rag_token"] == {"test_em": 40.0, "test_f1": 60.0, "recall_at_5": 50.0,
                                             "answer_in_top5": 50.0, "run": run, "training": TRAINED}
    assert saved["systems"]["closed_book"] == {"test_em": 40.0, "test_f1": 60.0, "run": run, "training": TRAINED}
    assert saved["runs"][run]["systems"] == list(recipe.load_stages().train.systems) + ["jeopardy"]
    assert saved["runs"][run]["command"] == "python examples/demo/run_demo.py --systems all --sweep 1,3"
    hot = saved["hot_swap"]
    assert hot["questions"] == 2 and hot["follows_index_in_use"] == hot["follows_other_index"] == 0.5
    assert hot["runs"]["rag_token/countryinfo"] == {"follows_index_in_use": 1.0, "follows_other_index": 0.0}
    assert set(saved["k_sweep"]) == {"rag_token", "fid", "fid_scorebias"}
    assert all([r["k"] for r in sweep] == [1, 3] for sweep in saved["k_sweep"].values())
    for name in ("fid", "fid_adist", "rag_token_pdist", "rag_token_hybrid", "rag_token_rerank_cross", "fid_scorebias"):
        assert set(saved["systems"][name]) == {"test_em", "test_f1", "recall_at_5", "answer_in_top5", "run",
                                               "training"}, name
    assert "## Index hot-swap (2 facts" in demo.markdown()
    row = saved["systems"]["rag_token_end2end"]
    assert row["reindexes"] == [{"started_at_update": 100, "version": 2, "seconds": 61.5}]
    assert row["switched_at_updates"] == {"2": 175}  # (JSON keys)
    assert row["reindex_switch_after"] == 75 and row["waited_s"] == 12.5
    train = next(c for c in end2end_commands if c.program == "fairseq-train")
    assert options_of([str(a) for a in train.args])["--reindex-switch-after"] == "75"  # reproducible switches
    assert row["train_updates_per_s"] == 0.3 and row["baseline_updates_per_s"] == 0.5
    assert row["compared_with"] == "rag_token" and row["reindex_every"] == 100 and row["test_em"] == 40.0
    assert "## Knowledge that learns (rag_token_end2end)" in demo.markdown()
    assert "update 100 -> version 2 in 62 s" in demo.markdown()
    assert "switched in 75 updates after its re-index started" in demo.markdown()
    assert hot["update"]["replaced_passages"] == 1 and hot["update"]["added_passages"] == 1
    assert set(hot["update"]["runs"]) == {"rag_token/countryinfo updated", "rag_seq/countryinfo updated"}
    assert "Updated instead of swapped" in demo.markdown()
