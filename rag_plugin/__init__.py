"""rag_plugin: Retrieval-Augmented Generation (Lewis et al., 2020) as a fairseq plugin.

Importing the package only registers the plugin's fairseq parts (task ``retrieval_augmented``,
models ``rag_token``/``rag_seq`` and ``rag_lm_token``/``rag_lm_seq`` (decoder-only readers), criterion
``marginal_nll``, optimizer ``torch_adamw``), and only when fairseq is already imported (``--user-dir rag_plugin``
imports this package; fairseq then imports ``tasks/`` and ``models/`` itself). The retrieval package
(:mod:`rag_plugin.retrieval`) needs no fairseq and is not imported here.

Nothing else happens on import, with one exception that is the command line's own business: when
the process IS a fairseq command line (``fairseq-train ... --user-dir rag_plugin``), the hooks of
:mod:`rag_plugin.fairseq_hooks` (one-line errors, safe checkpoint loading, bounded collective waits,
a full ``--help``) are installed, since a plugin has no other way in. A program or notebook that
imports the plugin keeps its excepthook, argparse, logging, fairseq and torch as they were.
"""
import sys

__version__ = "0.1.0"


def register() -> None:
    """Register the fairseq task, models, criterion and optimizer (idempotent). For programs that
    load checkpoints without ``--user-dir``; installs no hook."""
    import fairseq  # noqa: F401

    import rag_plugin.criterions.marginal_nll  # noqa: F401  (registers marginal_nll)
    import rag_plugin.criterions.reader_cross_entropy  # noqa: F401  (registers reader_cross_entropy)
    import rag_plugin.models.fid  # noqa: F401  (registers fid and its archs)
    import rag_plugin.models.rag  # noqa: F401  (registers rag_token, rag_seq and their archs)
    import rag_plugin.models.rag_lm  # noqa: F401  (registers rag_lm_token, rag_lm_seq and their archs)
    import rag_plugin.optim.torch_adamw  # noqa: F401  (registers torch_adamw)
    import rag_plugin.tasks.retrieval_augmented  # noqa: F401  (registers retrieval_augmented)


if "fairseq" in sys.modules:  # imported as a fairseq user dir (or after fairseq): register
    register()
    from rag_plugin.fairseq_hooks import fairseq_command as _fairseq_command

    if _fairseq_command() is not None:
        from rag_plugin.fairseq_hooks import install as _install_hooks

        _install_hooks()
