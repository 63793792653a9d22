"""rag_plugin: Retrieval-Augmented Generation (Lewis et al., 2020) as a fairseq plugin.

``--user-dir rag_plugin`` imports this package; fairseq then imports ``tasks/`` and
``models/`` itself. Criterions are imported here. The retrieval package
(``rag_plugin.retrieval``) needs no fairseq and is not imported here.
"""
import sys

from rag_plugin.errors import install_excepthook

__version__ = "0.1.0"


def _register_fairseq_parts() -> None:
    from rag_plugin.checkpoints import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    import rag_plugin.criterions.marginal_nll  # noqa: F401  (registers marginal_nll)
    import rag_plugin.models.rag  # noqa: F401
    import rag_plugin.tasks.retrieval_augmented  # noqa: F401


# Imported as a fairseq user dir (fairseq already loaded): register everything. Imported
# for retrieval alone: stay fairseq-free.
if "fairseq" in sys.modules:
    _register_fairseq_parts()
    install_excepthook()


def register() -> None:
    """Register the fairseq task/models/criterion (for scripts that load checkpoints
    without ``--user-dir``)."""
    import fairseq  # noqa: F401

    _register_fairseq_parts()
    install_excepthook()
