"""``--reranker NAME`` -> the reranker a model is built with. Each scorer's module registers its builder
(:func:`rag_plugin.reranking.base.register_reranker`) when imported; this imports the one a run names, so a run without
a reranker imports none of them."""
import importlib
from typing import Optional

from rag_plugin.reranking.base import BUILDERS, RERANKERS, Reranker
from rag_plugin.util.errors import UserError

#: reranker name -> the module that registers it
MODULES = {"maxsim": "rag_plugin.reranking.maxsim", "upr": "rag_plugin.reranking.upr",
           "cross": "rag_plugin.reranking.cross_encoder"}


def build_reranker(name: str, model_cfg, task) -> Optional[Reranker]:
    """The reranker ``--reranker name`` gives a model built with ``model_cfg`` by ``task`` (None for none)."""
    if name in (None, "", "none"):
        return None
    if name not in MODULES:
        raise UserError(f"unknown reranker {name!r}", fix=f"use --reranker one of {', '.join(RERANKERS)}, or none")
    importlib.import_module(MODULES[name])
    reranker = BUILDERS[name](model_cfg, task)
    reranker.name = name
    return reranker
