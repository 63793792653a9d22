"""The demo's recipe as command lines. config/*.yaml (the fairseq-hydra-train configs, which compose
the package's recipe/tiny.yaml from their hydra search path) are composed as fairseq-hydra-train
composes them (hydra's defaults list), a run's options from stages.yaml and its own (data, save
directory, updates, ...: :func:`rag_plugin.pipeline.recipes.run_settings`) are set on top, and the
result becomes fairseq-train's arguments (:func:`rag_plugin.pipeline.recipes.train_args`): no option
of the recipe is written here."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from rag_plugin.pipeline.recipes import with_settings

DEMO_DIR = Path(__file__).resolve().parents[1]
CONFIG_DIR = DEMO_DIR / "config"
STAGES_FILE = DEMO_DIR / "stages.yaml"


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
    return with_settings(cfg, *settings)


def train_config(stage: Mapping, run: Mapping[str, Any], then: Optional[Mapping] = None) -> DictConfig:
    """The config of one training run: ``stage`` ({config, set} from stages.yaml), optionally the
    ``set`` of a stage that continues it (``then``: the hot-swap stage), then the run's own
    settings (:func:`rag_plugin.pipeline.recipes.run_settings`)."""
    settings = [stage.get("set") or {}] + ([then.get("set") or {}] if then else []) + [run]
    return compose_config(stage["config"], settings)
