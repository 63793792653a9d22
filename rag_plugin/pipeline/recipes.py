"""The tiny training recipe, as fairseq-train arguments, and the generator pretraining stages.

The recipe is one file, shipped with the package: ``rag_plugin/pipeline/config/recipe/tiny.yaml``
(:func:`load_recipe`), the file the demo's fairseq-hydra-train configs (examples/demo/config) compose
from their ``hydra.searchpath``. It holds the paper's recipe scaled down to CPUs: a tiny BART
generator (2+2 layers, d=192) at lr 1e-3 with AdamW betas (0.9, 0.98), inverse square root warm-up,
gradient clipping, batches of 32, the query encoder's token embeddings frozen and the query encoder
at 3e-5. :func:`train_args` turns a config (the recipe with a run's own settings on top,
:func:`run_settings`) into fairseq-train's arguments; :func:`rag_train_args` does it for ``rag-train``.

:data:`PRETRAINING_STAGES` are what the demo does to pretrain a generator on passages alone (no
pretrained seq2seq model ships offline): BART's denoising objective, closed book, then
pseudo-questions answered from one BM25-retrieved passage (``rag-pretraining-data --objective``).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from omegaconf import DictConfig, ListConfig, OmegaConf

#: the package whose files are the shipped configs (also the demo configs' hydra search path)
CONFIG_PACKAGE = "rag_plugin.pipeline.config"
#: fairseq-train's option for each config section's ``_name``
NAME_OPTIONS = {"task": "--task", "model": "--arch", "criterion": "--criterion", "optimizer": "--optimizer",
                "lr_scheduler": "--lr-scheduler"}
#: the order of the sections on a command line (others follow in the config's order)
SECTION_ORDER = ("common", "task", "model", "criterion", "optimizer", "lr_scheduler", "optimization",
                 "dataset", "checkpoint")
NOT_OPTIONS = ("hydra",)  # sections that are not fairseq options


def load_recipe(name: str = "tiny") -> DictConfig:
    """``recipe/<name>.yaml`` of the package, as an OmegaConf config."""
    text = resources.files(CONFIG_PACKAGE).joinpath("recipe", f"{name}.yaml").read_text(encoding="utf-8")
    return OmegaConf.create(text)


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


def validate_interval(updates: int) -> int:
    """Validation four times in a run, at least 50 updates apart."""
    return max(50, updates // 4)


def run_settings(data: Path, knowledge: Path, save_dir: Path, updates: int, init: Optional[Path] = None,
                 restore: Optional[Path] = None) -> Dict[str, Any]:
    """What a training run has of its own, as ``{"section.key": value}``: data, knowledge source, save
    directory, updates and validation interval (:func:`validate_interval`), and where it starts from:
    a pretrained generator (``init``) or a whole RAG model to continue (``restore``)."""
    settings: Dict[str, Any] = {"task.data": str(data), "task.knowledge": str(knowledge),
                                "checkpoint.save_dir": str(save_dir), "optimization.max_update": updates,
                                "dataset.validate_interval_updates": validate_interval(updates)}
    if init is not None:
        settings["model.generator_checkpoint"] = str(init)
    if restore is not None:
        settings["checkpoint.restore_file"] = str(restore)
    return settings


def with_settings(cfg: DictConfig, *settings: Mapping[str, Any]) -> DictConfig:
    """A copy of ``cfg`` with each of ``settings`` ({"section.key": value}) set in turn."""
    cfg = cfg.copy()
    for mapping in settings:
        for key, value in mapping.items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def rag_train_args(recipe: DictConfig, *settings: Mapping[str, Any]) -> List[str]:
    """``rag-train``'s arguments: ``recipe`` with ``settings`` on top (:func:`with_settings`), less its
    ``common.user_dir`` (a path relative to the repository: rag-train loads the plugin itself)."""
    cfg = with_settings(recipe, *settings)
    if "common" in cfg and "user_dir" in cfg.common:
        del cfg.common["user_dir"]
    return train_args(cfg)


@dataclass(frozen=True)
class PretrainingStage:
    """One stage of generator pretraining: data made by ``rag-pretraining-data --objective objective``,
    trained with ``n_docs`` documents from ``retriever`` (0: closed book)."""

    name: str
    objective: str
    n_docs: int
    retriever: str = "dense"
    what: str = ""

    def settings(self) -> Dict[str, Any]:
        """The stage's own settings over the recipe (RAG-Token's tiny generator, the marginal NLL)."""
        return {"model._name": "rag_token_tiny", "criterion._name": "marginal_nll", "task.n_docs": self.n_docs,
                "task.retriever": self.retriever}


PRETRAINING_STAGES = (
    PretrainingStage("denoise", "denoise", n_docs=0,
                     what="BART's denoising objective in miniature: reconstruct corrupted passages, closed book"),
    PretrainingStage("pseudo_questions", "pseudo-questions", n_docs=1, retriever="bm25",
                     what="pseudo-questions (a run of words -> the title, or -> the words that follow), answered "
                          "from one BM25-retrieved passage"),
)
