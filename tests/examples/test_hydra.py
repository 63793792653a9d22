"""fairseq-hydra-train with the example configs: the demo config trains on the tiny world; every paper
config (examples/paper/config: hydra defaults over a shared recipe) composes against fairseq's schema and the
plugin's dataclasses, to exactly the configuration it replaced."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PAPER_TASKS = ("nq", "triviaqa", "webquestions", "curatedtrec", "msmarco", "jeopardy", "fever")
HYDRA_TRAIN = str(Path(sys.executable).parent / "fairseq-hydra-train")


def test_demo_rag_seq_tiny_trains_with_hydra(tiny_world, tmp_path):
    config_dir = tmp_path / "config"
    shutil.copytree(EXAMPLES / "demo" / "config", config_dir)
    save = tmp_path / "ckpt"
    cmd = [HYDRA_TRAIN, "--config-dir", str(config_dir), "--config-name", "rag_seq_tiny",
           f"common.user_dir={ROOT / 'rag_plugin'}", f"task.data={tiny_world['data']}",
           f"task.knowledge={tiny_world['ks']}", "optimization.max_update=2", f"checkpoint.save_dir={save}",
           "common.log_interval=1"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert re.findall(r"num_updates=(\d+)", log)[-1] == "2"
    assert "RagSequenceModel: trainable parameters" in log
    assert not (tmp_path / "outputs").exists()     # the config keeps hydra in the working directory

    from rag_plugin.hub import load_fairseq_checkpoint

    state = load_fairseq_checkpoint(str(save / "checkpoint_last.pt"))
    assert state["cfg"]["model"]["_name"] == "rag_seq_tiny"
    assert state["cfg"]["task"]["n_docs"] == 3
    weights = state["model"]
    assert weights["_extra_state"]["variant"] == "sequence"
    # the arch preset's tiny generator: d=192, 2 encoder and 2 decoder layers
    assert weights["generator.encoder.embed_tokens.weight"].shape[1] == 192
    layers = {int(m.group(1)) for k in weights for m in [re.match(r"generator\.encoder\.layers\.(\d+)\.", k)] if m}
    assert layers == {0, 1}
    assert any(k.startswith("query_encoder.") for k in weights)


PAPER_DIR = EXAMPLES / "paper" / "config"
VARIANTS = ("rag_token_large", "rag_seq_large")
SMALL = ("webquestions", "curatedtrec")  # [paper] initialised from the NQ RAG model
#: The 14 paper configs as they were before they became hydra defaults (examples/<task>/config/<variant>.yaml
#: at commit 69996df, each file's YAML content as JSON): what every new config must still compose to.
BEFORE = ROOT / "tests" / "examples" / "fixtures" / "paper_configs_69996df.json"


def _paper_configs():
    return [PAPER_DIR / f"{task}_{variant}.yaml" for task in PAPER_TASKS for variant in VARIANTS]


def _all_configs():
    return sorted((EXAMPLES / "demo" / "config").glob("*.yaml")) + _paper_configs()


def _config_id(path):
    return f"{path.parts[-3]}/{path.stem}"


def test_every_task_has_configs():
    assert list((EXAMPLES / "demo" / "config").glob("*.yaml"))
    for path in _paper_configs():
        assert path.is_file(), path
    assert sorted(json.loads(BEFORE.read_text())) == sorted(
        f"examples/{task}/config/{variant}.yaml" for task in PAPER_TASKS for variant in VARIANTS)


def _compose(config_dir: Path, name: str, overrides=(), plugin_defaults=True, hydra_node=False):
    """What fairseq-hydra-train does before training: hydra compose (the config validated against
    fairseq's schema under its own name) + add_defaults (``plugin_defaults``; it fills ??? values)."""
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    hydra_init(name)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.1", job_name="compose_test"):
        cfg = compose(config_name=name, overrides=list(overrides), return_hydra_config=hydra_node)
    if plugin_defaults:
        add_defaults(cfg)   # merges the plugin's task/model/criterion dataclasses: unknown keys fail here
    return cfg


@pytest.mark.parametrize("path", _all_configs(), ids=_config_id)
def test_config_composes_with_plugin_dataclasses(path, recwarn):
    import fairseq  # noqa: F401
    from omegaconf import OmegaConf

    import rag_plugin

    rag_plugin.register()
    task = path.parts[-3] if path.parts[-3] == "demo" else path.stem.split("_rag_")[0]
    if path.stem == "lm_tiny_pretrain":  # the decoder-only reader's LM: fairseq's own language_modeling task
        cfg = _compose(path.parent, path.stem, ["task.data=D"])
        assert cfg.task._name == "language_modeling" and cfg.task.sample_break_mode == "eos"
        assert cfg.model._name == "transformer_lm_rag_tiny" and cfg.criterion._name == "cross_entropy"
        assert cfg.optimizer._name == "torch_adamw" and cfg.dataset.required_batch_size_multiple == 1
        assert cfg.common.user_dir == "rag_plugin" and cfg.common.cpu and cfg.task.data == "D"
        return
    cfg = _compose(path.parent, path.stem, ["task.data=D", "task.knowledge=K"])
    fid = cfg.model._name.startswith("fid_")  # Fusion-in-Decoder trains with cross-entropy, RAG with its marginal
    assert cfg.task._name == "retrieval_augmented"
    assert cfg.criterion._name == ("reader_cross_entropy" if fid else "marginal_nll")
    assert cfg.task.data == "D" and cfg.task.knowledge == "K"
    assert cfg.optimizer._name == ("torch_adamw" if task == "demo" else "adam")
    assert cfg.dataset.required_batch_size_multiple == 1
    assert cfg.common.user_dir == "rag_plugin"
    if task == "demo":
        assert cfg.common.cpu and cfg.model._name.endswith("_tiny")
        assert cfg.task.n_docs in (0, 3, 5, 10)
        return
    assert cfg.task.n_docs in (5, 10)                                      # [paper] k in {5, 10}
    assert cfg.common.fp16 and cfg.distributed_training.distributed_world_size == 8
    assert list(cfg.optimization.lr) == [3e-05]
    assert cfg.model._name == path.stem.split("_", 1)[1]
    assert cfg.model.max_source_positions == cfg.model.max_target_positions == 1024
    assert cfg.checkpoint.save_dir == f"checkpoints/{path.stem}"
    # data and knowledge must be given on the command line
    raw = _compose(path.parent, path.stem, plugin_defaults=False)
    assert OmegaConf.is_missing(raw.task, "data") and OmegaConf.is_missing(raw.task, "knowledge")
    if task in SMALL:                                                     # [paper] from the NQ model
        # checkpoint.finetune_from_model=NQ_RAG_CHECKPOINT is needed but not enforced: fairseq's schema types
        # the checkpoint group, whose default (None) takes the place of ??? (so it did before the defaults)
        assert raw.checkpoint.finetune_from_model is None and raw.optimization.max_update == 5000
        assert raw.model.generator_checkpoint is None
    else:
        assert OmegaConf.is_missing(raw.model, "generator_checkpoint")


@pytest.mark.parametrize("task", PAPER_TASKS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_paper_config_composes_to_what_it_replaced(task, variant, tmp_path, recwarn):
    """The configs are a shared recipe (rag_large.yaml), the model (rag_token / rag_seq), the initialisation
    (from_bart / from_nq_model) and a save_dir: composed as fairseq-hydra-train composes them, each equals
    the whole YAML file it replaced, hydra settings included."""
    import fairseq  # noqa: F401
    from omegaconf import OmegaConf

    import rag_plugin

    rag_plugin.register()
    name = f"{task}_{variant}"
    before = json.loads(BEFORE.read_text())[f"examples/{task}/config/{variant}.yaml"]
    OmegaConf.save(OmegaConf.create(before), tmp_path / f"{name}.yaml")
    for hydra_node in (False, True):
        new = _compose(PAPER_DIR, name, plugin_defaults=not hydra_node, hydra_node=hydra_node)
        old = _compose(tmp_path, name, plugin_defaults=not hydra_node, hydra_node=hydra_node)
        if hydra_node:
            new, old = new.hydra, old.hydra
            for key in ("run", "output_subdir", "job.chdir"):
                assert OmegaConf.select(new, key) == OmegaConf.select(old, key), key
            assert new.run.dir == "." and new.output_subdir is None and new.job.chdir is False
        else:
            assert OmegaConf.to_container(new) == OmegaConf.to_container(old)
            assert new.common.fp16 and new.optimization.max_update == before["optimization"]["max_update"]


def _flat_items(node, prefix=""):
    items = {}
    for key, value in node.items():
        if isinstance(value, dict) and key != "defaults":
            items.update(_flat_items(value, f"{prefix}{key}."))
        elif key != "defaults":
            items[prefix + key] = value
    return items


@pytest.mark.parametrize("path", _paper_configs(), ids=_config_id)
def test_paper_config_files_set_each_key_once(path):
    """A dataset's config lists _self_ first (fairseq-hydra-train validates it against fairseq's schema, whose
    defaults would otherwise replace the shared recipe's values), which is safe because no key is set by two
    of the files it is made of. ??? (required) is only used where it is enforced: under task and model, not
    in fairseq's typed groups, where the schema's default takes its place."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert raw["defaults"][0] == "_self_"
    parts = [raw] + [OmegaConf.to_container(OmegaConf.load(PAPER_DIR / f"{d}.yaml")) for d in raw["defaults"][1:]]
    seen = {}
    for name, part in zip([path.stem] + raw["defaults"][1:], parts):
        assert "defaults" not in part or part is raw, name
        for key, value in _flat_items(part).items():
            assert key not in seen, f"{key} is set by {seen[key]} and {name}"
            seen[key] = name
            if value == "???":
                assert key.split(".")[0] in ("task", "model"), f"{name}: {key}: ??? is not enforced there"
    assert set(seen.values()) == {path.stem, "rag_large", raw["defaults"][2], raw["defaults"][3]}


def test_fairseq_hydra_train_accepts_a_paper_config(tmp_path):
    """fairseq-hydra-train's own command line (--cfg job: compose and print, do not train)."""
    import yaml

    for name, max_update in (("nq_rag_token_large", 20000), ("webquestions_rag_seq_large", 5000)):
        cmd = [HYDRA_TRAIN, "--config-dir", str(PAPER_DIR), "--config-name", name, "--cfg", "job",
               "task.data=D", "task.knowledge=K"]
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        cfg = yaml.safe_load(proc.stdout[proc.stdout.index("common:"):])
        assert cfg["common"]["fp16"] is True and cfg["common"]["tensorboard_logdir"] is None  # the schema's keys too
        assert cfg["optimization"]["max_update"] == max_update and cfg["task"]["data"] == "D"
        assert cfg["checkpoint"]["save_dir"] == f"checkpoints/{name}"
