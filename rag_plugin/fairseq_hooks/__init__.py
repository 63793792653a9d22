"""Every patch the plugin makes to fairseq, torch and argparse, in one place.

Installed only on the command-line path: by a fairseq command line (``fairseq-train``,
``fairseq-generate``, ``fairseq-interactive``, ``fairseq-validate``, ``fairseq-hydra-train``) that
imports the plugin with ``--user-dir``, and by the plugin's own console scripts that drive fairseq
(``rag-train``, ``rag-generate``, ...). Never by importing the package from Python, by
:func:`rag_plugin.register`, the hub or the converters: a notebook or a program that embeds the
plugin keeps its excepthook, argparse, logging, and fairseq's and torch's functions as they were.

Each hook is checked against the fairseq version it was written for; on another version the hooks
are not installed and one warning says so (the plugin still works, with fairseq's own messages).
"""
import logging
import sys
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

#: fairseq versions the hooks were written and tested against (fairseq-fixed 0.12.3.1 is 0.12.2 + Python 3.11 fixes)
SUPPORTED_FAIRSEQ = ("0.12.2", "0.12.3.1")

#: fairseq's console scripts, by the name they are run as
FAIRSEQ_COMMANDS = ("fairseq-train", "fairseq-generate", "fairseq-interactive", "fairseq-validate",
                    "fairseq-hydra-train", "fairseq-eval-lm", "fairseq-score")

_installed = False


def fairseq_command() -> Optional[str]:
    """The fairseq command line this process runs (``fairseq-train`` or ``fairseq_cli.train`` for
    ``python -m``), or None: the process is something else (a notebook, a program, pytest)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if name in FAIRSEQ_COMMANDS:
        return name
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and str(spec.name).startswith("fairseq_cli."):
        return spec.name
    return None


def install() -> bool:
    """Install every hook (idempotent). Returns whether they are installed."""
    global _installed
    if _installed:
        return True
    import fairseq  # start-up: rag-user-dir and ``import rag_plugin`` import this package without fairseq

    version = getattr(fairseq, "__version__", "unknown")
    if version not in SUPPORTED_FAIRSEQ:
        logger.warning("rag_plugin's command-line hooks were written for fairseq %s, this is %s: not installed "
                       "(errors come as fairseq's tracebacks)", " / ".join(SUPPORTED_FAIRSEQ), version)
        return False
    # the hooks import fairseq's internals at their top: only once its version is known to be one they were written for
    from rag_plugin.fairseq_hooks.checkpoints import allow_fairseq_checkpoints, guard_fairseq_checkpoints
    from rag_plugin.fairseq_hooks.distributed import bound_collective_waits, torch_ddp_on_cpu
    from rag_plugin.fairseq_hooks.excepthook import install_excepthook
    from rag_plugin.fairseq_hooks.generate_output import install_generate_output
    from rag_plugin.fairseq_hooks.mixed_precision import install_mixed_precision
    from rag_plugin.fairseq_hooks.noise import quiet_dependency_noise
    from rag_plugin.fairseq_hooks.numpy_compat import install_numpy_compat
    from rag_plugin.fairseq_hooks.option_errors import refuse_bad_update_freq
    from rag_plugin.fairseq_hooks.threads import choose_threads
    from rag_plugin.fairseq_hooks.usage_errors import install_fairseq_usage_errors, install_full_help

    quiet_dependency_noise()
    install_numpy_compat()
    allow_fairseq_checkpoints()
    guard_fairseq_checkpoints()
    bound_collective_waits()
    torch_ddp_on_cpu()
    install_excepthook()
    install_fairseq_usage_errors()
    install_full_help()
    install_generate_output()
    install_mixed_precision()
    refuse_bad_update_freq()
    choose_threads()
    _installed = True
    return True
