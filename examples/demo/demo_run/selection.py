"""Which systems a run of the demo trains (run_demo.py ``--systems``), and what follows from them: a system's test
rows (stages.yaml ``generate.test``), its K sweep (``generate.k_sweep.systems``), the index hot-swap test (only when
every system of ``generate.hot_swap.systems`` runs: it compares them) and, by the name ``jeopardy``, the Jeopardy
RAG-Token model (``train.jeopardy``). The default is stages.yaml's ``default_systems``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from omegaconf import DictConfig

from rag_plugin.util.errors import UserError

JEOPARDY = "jeopardy"
ALL = "all"


def known_systems(stages: DictConfig) -> List[str]:
    """Every name --systems takes, in stages.yaml's order: the trained systems, then ``jeopardy``."""
    return [*stages.train.systems, JEOPARDY]


def default_systems(stages: DictConfig) -> List[str]:
    return list(stages.default_systems)


def parse_systems(spec: Optional[str], stages: DictConfig) -> List[str]:
    """``--systems``'s value (None: the default; ``all``: every system) -> the names, in stages.yaml's order;
    an unknown name is a one-line error listing the known ones."""
    known = known_systems(stages)
    if spec is None:
        names = default_systems(stages)
    elif spec.strip() == ALL:
        names = known
    else:
        names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        what = f"unknown system {', '.join(unknown)}" if unknown else "no system named"
        raise UserError(f"--systems: {what}; known: {', '.join(known)}", fix=f"name some of them, or {ALL}")
    return [name for name in known if name in names]


@dataclass(frozen=True)
class Selection:
    """The systems one run trains and what it therefore tests."""

    systems: Tuple[str, ...]

    @classmethod
    def of(cls, spec: Optional[str], stages: DictConfig) -> "Selection":
        return cls(tuple(parse_systems(spec, stages)))

    def __contains__(self, name: str) -> bool:
        return name in self.systems

    def trained(self, stages: DictConfig) -> Dict[str, DictConfig]:
        """The selected systems of ``train.systems`` (not ``jeopardy``), name -> stage."""
        return {name: stage for name, stage in stages.train.systems.items() if name in self}

    def test_rows(self, stages: DictConfig) -> Dict[str, DictConfig]:
        """The rows of ``generate.test`` whose system runs, row -> its options."""
        return {name: run for name, run in stages.generate.test.items() if run.system in self}

    def sweep_systems(self, stages: DictConfig) -> List[str]:
        return [name for name in stages.generate.k_sweep.systems if name in self]

    def hot_swap(self, stages: DictConfig) -> bool:
        """Whether the index hot-swap test runs: every system it compares does."""
        return all(name in self for name in stages.generate.hot_swap.systems)

    def jeopardy(self) -> bool:
        return JEOPARDY in self


def systems_help(stages: DictConfig) -> str:
    """--systems's help: what it selects, why the default, every known name."""
    return (f"comma-separated systems to train and test, or {ALL} (every one); the default, stages.yaml's "
            "default_systems, keeps the demo within ~100 min on 2 cores (left out: the ablations, "
            "rag_token_end2end, the upr and cross rerankers and the decoder-only readers); known: "
            f"{', '.join(known_systems(stages))}. The others' rows stay in RESULTS.json as an earlier run left them")
