"""fairseq's command lines with the plugin loaded, from any directory: ``rag-train`` and
``rag-generate`` are ``fairseq-train`` and ``fairseq-generate`` with ``--user-dir`` pointing at the
installed plugin (added when not given) and the plugin's command-line hooks installed
(:mod:`rag_plugin.fairseq_hooks`). Every fairseq option works as it does there.

``fairseq-train --user-dir DIR`` itself needs DIR to be the plugin's folder as seen from the working
directory (``rag_plugin`` works from the repository root only); ``rag-user-dir`` prints the
installed folder for use anywhere: ``fairseq-train ... --user-dir "$(rag-user-dir)"``.
"""
import importlib
import os
import sys
from pathlib import Path
from typing import List, Optional

import rag_plugin
from rag_plugin.util.errors import UserError


def plugin_dir() -> Path:
    """The folder of the installed (or checked-out) rag_plugin package."""
    return Path(rag_plugin.__file__).resolve().parent


def _user_dir_value(argv: List[str]) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == "--user-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--user-dir="):
            return arg.split("=", 1)[1]
    return None


def with_user_dir(argv: List[str]) -> List[str]:
    """``argv`` with ``--user-dir`` naming this plugin; a ``--user-dir`` that is not it is a one-line error."""
    given = _user_dir_value(argv)
    if given is None:
        return list(argv) + ["--user-dir", str(plugin_dir())]
    path = Path(given).expanduser()
    if not path.is_dir() or not (path / "__init__.py").is_file():
        raise UserError(f"--user-dir {given} is not a folder holding a Python package (from {os.getcwd()})",
                        fix=f"leave --user-dir out (this command adds {plugin_dir()}), or give that path")
    if path.resolve() != plugin_dir():
        raise UserError(f"--user-dir {given} is another copy of the plugin than this command's ({plugin_dir()})",
                        fix="leave --user-dir out, or run that copy's own commands")
    return list(argv)


def _run_fairseq(module_name: str) -> int:
    """fairseq's command line ``module_name`` (``fairseq_cli.train``) with the plugin registered and its hooks
    installed, in the order of ``fairseq-train --user-dir``: fairseq's main module (which sets up fairseq's log
    format) first, then the plugin."""
    try:
        argv = with_user_dir(sys.argv[1:])
    except UserError as err:
        sys.stderr.write(f"error: {err.render()}\n")
        return 2
    # start-up: rag-user-dir imports this module too, and the hooks' package and the quiet import need logging
    from rag_plugin import fairseq_hooks
    from rag_plugin.util.quiet_import import import_fairseq_quietly

    import_fairseq_quietly()  # without fairseq's import-time log lines ("Please install tensorboardX")
    module = importlib.import_module(module_name)
    rag_plugin.register()
    fairseq_hooks.install()
    sys.argv = [sys.argv[0]] + argv
    module.cli_main()
    return 0


def train() -> int:
    """``rag-train``: fairseq-train with the plugin."""
    return _run_fairseq("fairseq_cli.train")


def generate() -> int:
    """``rag-generate``: fairseq-generate with the plugin."""
    return _run_fairseq("fairseq_cli.generate")


def user_dir() -> int:
    """``rag-user-dir``: print the plugin's folder (for ``--user-dir`` of fairseq's own commands)."""
    print(plugin_dir())
    return 0
