"""The tiny recipe (rag_plugin/pipeline/recipes.py): the package's rag_plugin/pipeline/config/recipe/tiny.yaml, read as
package data and shipped by setup.py (the file the demo's configs compose: tests/examples/test_run_demo.py), and
rag-train's command lines as fairseq parses them hold its values."""
import json
import os
import subprocess
import sys

from omegaconf import OmegaConf

from rag_plugin.pipeline import recipes
from tests.conftest import ROOT

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
