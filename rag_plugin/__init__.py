"""rag_plugin: Retrieval-Augmented Generation (Lewis et al., 2020) as a fairseq plugin.

``--user-dir rag_plugin`` imports this package; fairseq then imports ``tasks/`` and
``models/`` itself. Criterions are imported here. The retrieval package
(``rag_plugin.retrieval``) needs no fairseq and is not imported here.
"""
import sys

from rag_plugin.util.errors import install_excepthook, install_fairseq_usage_errors

__version__ = "0.1.0"


#: Deprecation notices hydra prints about how fairseq calls it: nothing a user can act on, and
#: they would bury the one-line error of a failed command.
_HYDRA_NOTICES = (r"\s*hydra\.experimental\.(initialize|compose)\(\) is no longer experimental",
                  r"\s*The version_base parameter is not specified",
                  r"\s*In '.*': Usage of deprecated keyword in package header",
                  r"\s*'.*' is validated against ConfigStore schema with the same name",
                  r"\s*The strict flag in the compose API is deprecated")


def _quiet_fairseq_noise() -> None:
    import logging
    import warnings

    for pattern in _HYDRA_NOTICES:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    # fairseq's wav2vec2_classification module calls logging.basicConfig(level=DEBUG) on import,
    # which makes hydra's debug messages appear on stderr of every fairseq-generate run; faiss's
    # loader reports at INFO level which CPU instruction sets it tried (as multi-line messages).
    logging.getLogger("hydra").setLevel(logging.INFO)
    logging.getLogger("faiss").setLevel(logging.WARNING)


def _register_fairseq_parts() -> None:
    from rag_plugin.util.safe_load import allow_fairseq_checkpoints, guard_fairseq_checkpoints

    from rag_plugin.fairseq_hooks.distributed import bound_collective_waits

    _quiet_fairseq_noise()
    allow_fairseq_checkpoints()
    guard_fairseq_checkpoints()
    bound_collective_waits()
    import rag_plugin.criterions.marginal_nll  # noqa: F401  (registers marginal_nll)
    import rag_plugin.models.rag  # noqa: F401
    import rag_plugin.optim.torch_adamw  # noqa: F401  (registers torch_adamw)
    import rag_plugin.tasks.retrieval_augmented  # noqa: F401


# Imported as a fairseq user dir (fairseq already loaded): register everything. Imported
# for retrieval alone: stay fairseq-free.
if "fairseq" in sys.modules:
    _register_fairseq_parts()
    install_excepthook()
    install_fairseq_usage_errors()


def register() -> None:
    """Register the fairseq task/models/criterion (for scripts that load checkpoints
    without ``--user-dir``)."""
    import fairseq  # noqa: F401

    _register_fairseq_parts()
    install_excepthook()
    install_fairseq_usage_errors()
