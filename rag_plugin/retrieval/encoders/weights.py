"""State dicts of encoder towers: the identity hash, key prefixes, strict loading.

:func:`state_dict_sha256` names a tower's weights in a knowledge source's manifest: its
bytes must never change for the same weights, or every existing knowledge source would
refuse its encoder.
"""
from __future__ import annotations

import hashlib
import re
from typing import Dict, Mapping

import torch

from rag_plugin.retrieval.encoders.bert import BiEncoderTower
from rag_plugin.util.errors import UserError

# Keys that legitimately appear in checkpoints but that a CLS/mean tower never uses.
_IGNORED_KEYS = re.compile(r"^(pooler\.|embeddings\.position_ids$)")


def state_dict_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (key, dtype, shape, raw bytes) of every tensor, keys in sorted order."""
    digest = hashlib.sha256()
    for key in sorted(state):
        t = state[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}\n".encode("utf-8"))
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def sub_state(state: Mapping[str, torch.Tensor], prefix: str) -> Dict[str, torch.Tensor]:
    """The entries under ``prefix`` with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def as_tower_keys(bert_state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """HF BertModel keys (optionally under ``bert.``) -> tower keys (``bert_model.*``)."""
    if any(k.startswith("bert.") for k in bert_state):
        bert_state = sub_state(bert_state, "bert.")
    return {"bert_model." + k: v for k, v in bert_state.items()}


def load_tower_state(tower: BiEncoderTower, state: Mapping[str, torch.Tensor], source,
                     what: str) -> None:
    """Strictly load ``state`` (tower naming, i.e. ``bert_model.*``/``encode_proj.*``) into
    ``tower``; missing/unexpected/mis-shaped keys -> UserError naming ``source``."""
    state = {k: v for k, v in state.items()
             if not (k.startswith("bert_model.") and _IGNORED_KEYS.match(k[len("bert_model."):]))}
    expected = tower.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        raise UserError(f"{what} weights do not match the model: {'; '.join(parts)}",
                        path=source, fix="check that the file is a BERT/DPR encoder checkpoint")
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise UserError(f"{what} weight {key} has shape {tuple(value.shape)}, expected "
                            f"{tuple(expected[key].shape)}", path=source,
                            fix="check config.json against the weights")
    tower.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
