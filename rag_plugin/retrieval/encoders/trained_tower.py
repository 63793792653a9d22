"""The document tower a fairseq checkpoint trained with ``--train-doc-encoder``, read without fairseq.

Re-embedding a knowledge source with a trained tower (``rag-update-knowledge --reembed CHECKPOINT``, the background
re-index of ``--reindex-every``) needs only the tower's effective weights: the checkpoint's ``doc_encoder.*`` keys
(``query_encoder.*`` with ``--share-encoder-towers``), their learning-rate reparametrisation resolved
(:mod:`rag_plugin.optim.lr_scale`), keys as ``BiEncoderTower.state_dict()``.
"""
from __future__ import annotations

from typing import Dict

import torch

from rag_plugin.optim.lr_scale import checkpoint_scale, plain_state
from rag_plugin.retrieval.encoders.weights import sub_state
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load


def doc_encoder_state_from_checkpoint(path: str) -> Dict[str, torch.Tensor]:
    """The plain document tower state of a fairseq checkpoint trained with ``--train-doc-encoder``, read with safe
    loading; a one-line error for any other checkpoint."""
    state = safe_torch_load(path)
    cfg = state.get("cfg") if isinstance(state, dict) else None
    model_cfg = (cfg or {}).get("model") or {}
    if not model_cfg.get("train_doc_encoder"):
        raise UserError("the checkpoint has no trained document encoder (it was trained without "
                        "--train-doc-encoder)", path=str(path),
                        fix="re-embed with a checkpoint of a run with --train-doc-encoder (the knowledge source's "
                            "own vectors already are this checkpoint's document side)")
    prefix = "query_encoder." if model_cfg.get("share_encoder_towers") else "doc_encoder."
    weights = sub_state(state.get("model") or {}, prefix)
    if not weights:
        raise UserError(f"the checkpoint records --train-doc-encoder but holds no {prefix}* weights", path=str(path),
                        fix="use a checkpoint written by fairseq-train with the plugin")
    weights = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}  # --fp16 checkpoints
    return plain_state(weights, checkpoint_scale(cfg))
