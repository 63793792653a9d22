"""The local files the encoder loaders read (nothing is ever downloaded).

JSON files (``config.json``, ``tokenizer_config.json``), files a spec names, and the
weights of a Hugging Face model folder: ``model.safetensors``, or ``pytorch_model.bin``
through the plugin's one safe loader (:mod:`rag_plugin.util.safe_load`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Tuple

import torch
from safetensors.torch import load_file

from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load

#: What to do with a torch file an encoder spec names that torch cannot read.
UNREADABLE_ENCODER_FIX = "re-save the weights, or check the path in the encoder spec"


def require_file(path: os.PathLike, what: str) -> Path:
    """``path`` as a Path; a missing file is a UserError naming it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} file not found", path=path, fix="check the path in the spec")
    return path


def read_json(path: Path, default=None) -> Dict:
    """The parsed JSON file; ``default`` when it is missing (an error without a default)."""
    if not path.is_file():
        if default is not None:
            return default
        raise UserError("file not found", path=path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"invalid JSON: {err}", path=path) from None


def load_encoder_checkpoint(path: Path, what: str):
    """A torch file of encoder weights, safely (``weights_only=True``, the plugin's allow-list)."""
    return safe_torch_load(path, what=what, fix_unreadable=UNREADABLE_ENCODER_FIX)


def load_folder_weights(directory: Path) -> Tuple[Dict[str, torch.Tensor], Path]:
    """``model.safetensors`` or (safely) ``pytorch_model.bin`` from a HF model folder ->
    (state dict, the file read)."""
    st = directory / "model.safetensors"
    if st.is_file():
        try:
            return load_file(str(st)), st
        except Exception as err:  # safetensors raises SafetensorError / OSError
            raise UserError(f"cannot read safetensors file: {err}", path=st) from None
    pt = directory / "pytorch_model.bin"
    if pt.is_file():
        state = load_encoder_checkpoint(pt, "weights file")
        if not isinstance(state, dict):
            raise UserError("expected a state dict", path=pt)
        return state, pt
    raise UserError("no model.safetensors or pytorch_model.bin", path=directory,
                    fix="point the spec at a folder written by save_pretrained")
