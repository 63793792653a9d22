"""The commands the demo runs, as a user would type them: the plugin's console scripts
(``rag-build-knowledge``, ``rag-search``, ...) and fairseq's (``fairseq-train``, ...) beside this
Python, or, where a console script is not installed (the package not reinstalled since it gained
them), ``python -m`` on the module it runs. Shown as the console script either way."""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

#: console script -> the module it runs (setup.py's entry points; fairseq's own for fairseq-*)
MODULES = {
    "rag-build-knowledge": "rag_plugin.cli.build_knowledge",
    "rag-search": "rag_plugin.cli.search",
    "rag-update-knowledge": "rag_plugin.cli.update_knowledge",
    "rag-pretraining-data": "rag_plugin.cli.pretraining_data",
    "rag-evaluate": "rag_plugin.cli.evaluate",
    "rag-leaderboard": "rag_plugin.cli.leaderboard",
    "rag-plot-posterior": "rag_plugin.cli.plot_doc_posterior",
    "fairseq-train": "fairseq_cli.train",
    "fairseq-generate": "fairseq_cli.generate",
}


@dataclass(frozen=True)
class Command:
    """A command line: ``program`` is what it is shown as, ``prefix`` what runs it."""

    program: str
    prefix: Sequence[str]
    args: Sequence[str]

    def argv(self) -> List[str]:
        return [*self.prefix, *(str(a) for a in self.args)]

    def shown(self, root: Path) -> str:
        """As a user would type it in ``root`` (paths under it written relative to it)."""
        words = [self.program] + [shlex.quote(str(a)) for a in self.args]
        return " ".join(words).replace(str(root) + "/", "")


def console_script(name: str, *args) -> Command:
    """``name`` (a key of :data:`MODULES`) with ``args``."""
    script = Path(sys.executable).parent / name
    prefix = [str(script)] if script.is_file() else [sys.executable, "-m", MODULES[name]]
    return Command(name, prefix, [str(a) for a in args])


def python_script(path: Path, root: Path, *args) -> Command:
    """A script of the repository (``python examples/demo/prepare_demo_data.py ...``)."""
    return Command(f"python {path.relative_to(root)}", [sys.executable, str(path)], [str(a) for a in args])
