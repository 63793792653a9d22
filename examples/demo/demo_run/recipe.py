"""The demo's recipe as command lines. config/*.yaml (the fairseq-hydra-train configs) are composed
as fairseq-hydra-train composes them (hydra's defaults list), a run's options from stages.yaml and
its own (data, save directory, updates, ...) are set on top, and the result becomes fairseq-train's
arguments: no option of the recipe is written here."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

DEMO_DIR = Path(__file__).resolve().parents[1]
CONFIG_DIR = DEMO_DIR / "config"
STAGES_FILE = DEMO_DIR / "stages.yaml"

#: fairseq-train's option for each config section's ``_name``
NAME_OPTIONS = {"task": "--task", "model": "--arch", "criterion": "--criterion", "optimizer": "--optimizer",
                "lr_scheduler": "--lr-scheduler"}
#: the order of the sections on a command line (others follow in the config's order)
SECTION_ORDER = ("common", "task", "model", "criterion", "optimizer", "lr_scheduler", "optimization",
                 "dataset", "checkpoint")
NOT_OPTIONS = ("hydra",)  # sections that are not fairseq options


def load_stages(path: Path = STAGES_FILE) -> DictConfig:
    """stages.yaml: which config and which options each run of the demo uses."""
    return OmegaConf.load(path)


def compose_config(name: str, settings: Sequence[Mapping[str, Any]] = ()) -> DictConfig:
    """config/<name>.yaml with its defaults list, as fairseq-hydra-train composes it (without
    fairseq's own defaults), then each of ``settings`` ({"section.key": value}) in turn."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.1", job_name="run_demo"):
            cfg = compose(config_name=name)
    finally:
        GlobalHydra.instance().clear()
    for mapping in settings:
        for key, value in mapping.items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def option(key: str) -> str:
    return "--" + key.replace("_", "-")


def option_args(options: Mapping[str, Any]) -> List[str]:
    """``{"beam": 4, "cpu": True, "lr": [0.001], "freeze": False}`` -> ``--beam 4 --cpu --lr 0.001``:
    true is the bare flag, false and null are left out (fairseq's defaults), a list is comma-joined."""
    args: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            args.append(option(key))
            continue
        joined = ",".join(str(v) for v in value) if isinstance(value, (list, tuple, ListConfig)) else str(value)
        args += [option(key), joined]
    return args


def train_args(cfg: DictConfig) -> List[str]:
    """fairseq-train's arguments for a composed config: ``task.data`` first (positional), each
    section's ``_name`` as its option (``--task``, ``--arch``, ...), every other key as ``--key value``."""
    config = OmegaConf.to_container(cfg, resolve=True)
    sections = [s for s in SECTION_ORDER if s in config] + [s for s in config if s not in SECTION_ORDER]
    args = [str(config["task"]["data"])]
    for section in sections:
        if section in NOT_OPTIONS or not config[section]:
            continue
        values = dict(config[section])
        if "_name" in values:
            args += [NAME_OPTIONS[section], str(values.pop("_name"))]
        if section == "task":
            values.pop("data", None)
        args += option_args(values)
    return args


def run_settings(data: Path, knowledge: Path, save_dir: Path, updates: int, init: Optional[Path] = None,
                 restore: Optional[Path] = None) -> Dict[str, Any]:
    """What a training run has of its own: data, knowledge source, save directory, updates and
    validation interval (a quarter of the updates, at least 50), and where it starts from: a
    pretrained generator (``init``) or a whole RAG model to continue (``restore``)."""
    settings: Dict[str, Any] = {"task.data": str(data), "task.knowledge": str(knowledge),
                                "checkpoint.save_dir": str(save_dir), "optimization.max_update": updates,
                                "dataset.validate_interval_updates": max(50, updates // 4)}
    if init is not None:
        settings["model.generator_checkpoint"] = str(init)
    if restore is not None:
        settings["checkpoint.restore_file"] = str(restore)
    return settings


def train_config(stage: Mapping, run: Mapping[str, Any], then: Optional[Mapping] = None) -> DictConfig:
    """The config of one training run: ``stage`` ({config, set} from stages.yaml), optionally the
    ``set`` of a stage that continues it (``then``: the hot-swap stage), then the run's own
    settings (:func:`run_settings`)."""
    settings = [stage.get("set") or {}] + ([then.get("set") or {}] if then else []) + [run]
    return compose_config(stage["config"], settings)
