"""fairseq 0.12's ``TokenBlockDataset`` (the ``language_modeling`` task's) and ``LanguagePairDataset`` name
``np.compat.long``, which numpy 2 removed (``numpy.compat`` was deprecated in 1.25): ``fairseq-train --task
language_modeling`` stops with ``AttributeError: module 'numpy' has no attribute 'compat'``. On the command-line path
only, those two fairseq modules get a view of numpy that has ``compat.long`` (numpy's ``int64``, what it was); numpy
itself and every other module are left as they are."""
from __future__ import annotations

import types

import numpy as np

#: the fairseq modules that read ``np.compat.long``
MODULES = ("fairseq.data.token_block_dataset", "fairseq.data.language_pair_dataset")


class NumpyWithCompat(types.ModuleType):
    """numpy, plus ``compat.long`` where numpy has no ``compat`` any more."""

    def __init__(self):
        super().__init__("numpy")
        self.compat = types.SimpleNamespace(long=np.int64)

    def __getattr__(self, name):
        return getattr(np, name)


def install_numpy_compat() -> bool:
    """Give :data:`MODULES` the view (not needed, and not installed, where numpy still has ``compat``). Returns
    whether it was installed."""
    if hasattr(np, "compat"):
        return False
    import importlib

    view = NumpyWithCompat()
    for name in MODULES:
        module = importlib.import_module(name)
        if getattr(module, "np", None) is np:
            module.np = view
    return True
