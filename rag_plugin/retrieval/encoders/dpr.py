"""DPR encoders: ``dpr:CKPT`` (the original DPR code's checkpoints), ``hf-dpr:DIR`` (the Hugging
Face layout), and :func:`save_hf_dpr`, which writes the Hugging Face layout.

``hf-dpr:PATH``
    ``PATH`` holds sub-folders ``question_encoder/`` and/or ``ctx_encoder/`` (each a
    ``save_pretrained`` folder: ``config.json``, ``model.safetensors`` or ``pytorch_model.bin``,
    ``tokenizer.json`` or ``vocab.txt``), or ``PATH`` is itself one such folder. When only one
    of the two encoders is present it serves both queries and passages.
``dpr:CKPT`` / ``dpr:CKPT,vocab=FILE``
    A torch file holding ``model_dict`` with ``question_model.*``/``ctx_model.*`` keys and
    ``encoder_params``, loaded safely (``weights_only=True``). The WordPiece vocabulary is
    ``vocab.txt`` beside ``CKPT`` unless ``vocab=FILE`` is given; sizes are read from the
    tensor shapes (heads = hidden/64 unless ``heads=N``).

Both: CLS pooling, no normalisation, pair passages, max length 256 (or the checkpoint's).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from safetensors.torch import save_file

from rag_plugin.retrieval.encoders.bert import BertConfig, BiEncoderTower, new_tower
from rag_plugin.retrieval.encoders.files import load_encoder_checkpoint, load_folder_weights, read_json, require_file
from rag_plugin.retrieval.encoders.registry import EncoderOptions, register_encoder
from rag_plugin.retrieval.encoders.text_encoder import TextEncoder
from rag_plugin.retrieval.encoders.weights import as_tower_keys, load_tower_state, sub_state
from rag_plugin.retrieval.encoders.wordpiece import save_tokenizer_files, tokenizer_from_dir, wordpiece_tokenizer
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json

DPR_MAX_LENGTH = 256

_HF_DPR_PREFIXES = {"question_encoder.": "question", "ctx_encoder.": "ctx"}


# ------------------------------------------------------------------ Hugging Face layout


def _load_hf_dpr_folder(directory: Path) -> Tuple[str, BiEncoderTower, object]:
    """One ``save_pretrained`` DPR folder -> (role "question"/"ctx", tower, tokenizer)."""
    config = read_json(directory / "config.json")
    state, weights_path = load_folder_weights(directory)
    roles = {role for prefix, role in _HF_DPR_PREFIXES.items()
             if any(k.startswith(prefix) for k in state)}
    if len(roles) != 1:
        raise UserError("not a DPR question or context encoder (expected keys under "
                        "question_encoder. or ctx_encoder.)", path=weights_path,
                        fix="save the model with DPRQuestionEncoder/DPRContextEncoder.save_pretrained")
    role = roles.pop()
    prefix = next(p for p, r in _HF_DPR_PREFIXES.items() if r == role)
    cfg = BertConfig.from_hf(config, directory / "config.json")
    tower = new_tower(cfg, pooling="cls", normalize=False,
                      projection_dim=int(config.get("projection_dim") or 0))
    load_tower_state(tower, sub_state(state, prefix), weights_path, f"DPR {role} encoder")
    tower.eval()
    return role, tower, tokenizer_from_dir(directory)


@register_encoder("hf-dpr", usage="hf-dpr:DIR")
def load_hf_dpr(arg: str, options: EncoderOptions) -> TextEncoder:
    """DPR in the HF layout; sub-folders ``question_encoder/``/``ctx_encoder/`` or one folder."""
    max_length = options.integer("max_length", DPR_MAX_LENGTH)
    options.done("max_length")
    if not arg:
        raise UserError(f"encoder spec {options.spec!r} needs a folder", fix="write hf-dpr:DIR")
    root = Path(arg)
    if not root.is_dir():
        raise UserError("DPR model folder not found", path=root, fix="check the path in the spec")
    folders = [root / sub for sub in ("question_encoder", "ctx_encoder") if (root / sub).is_dir()]
    towers, tokenizer = {}, None
    for folder in folders or [root]:
        role, tower, tok = _load_hf_dpr_folder(folder)
        if role in towers:
            raise UserError(f"two DPR {role} encoders", path=folder,
                            fix="put the question encoder in question_encoder/ and the context "
                                "encoder in ctx_encoder/")
        towers[role] = tower
        tokenizer = tokenizer or tok
    query = towers.get("question", towers.get("ctx"))
    passage = towers.get("ctx", query)
    return TextEncoder(query, passage, tokenizer, kind="hf-dpr", name=root.name, source=str(root),
                       max_length=max_length, passage_format="pair")


def save_hf_dpr(encoder: TextEncoder, directory: os.PathLike) -> Path:
    """Write ``encoder`` in the Hugging Face DPR layout, readable by ``hf-dpr:DIR`` and by
    ``transformers`` (``DPRQuestionEncoder.from_pretrained(DIR/question_encoder)`` ...).

    Creates ``DIR/question_encoder/`` and ``DIR/ctx_encoder/``, each with ``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json``.
    Only CLS-pooled, unnormalised encoders are DPR encoders; others raise UserError.
    """
    for tower in (encoder.query_tower, encoder.passage_tower):
        if tower.pooling != "cls" or tower.normalize:
            raise UserError("only CLS-pooled, unnormalised encoders can be saved as DPR "
                            f"(this one: pooling={tower.pooling}, normalize={tower.normalize})",
                            path=directory)
    root = Path(directory)
    for sub, tower, prefix, arch in (
            ("question_encoder", encoder.query_tower, "question_encoder.", "DPRQuestionEncoder"),
            ("ctx_encoder", encoder.passage_tower, "ctx_encoder.", "DPRContextEncoder")):
        folder = root / sub
        folder.mkdir(parents=True, exist_ok=True)
        state = {prefix + k: v.detach().cpu().contiguous().clone()
                 for k, v in tower.state_dict().items()}
        with atomic_path(folder / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        config = {"architectures": [arch], "model_type": "dpr",
                  "projection_dim": tower.dim if tower.encode_proj is not None else 0,
                  **tower.bert_model.config.to_hf()}
        atomic_write_json(folder / "config.json", config)
        save_tokenizer_files(encoder.tokenizer, folder, encoder.max_length)
    return root


# ------------------------------------------------------------ original DPR checkpoints


def _plain(value):
    """Namespace / omegaconf containers -> plain dicts and lists (recursively)."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # optional dependency (fairseq's): loaded already when a value is one
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _dpr_params(raw) -> Dict:
    """``encoder_params`` (dict, argparse.Namespace or omegaconf) -> flat dict."""
    raw = _plain(raw)
    if not isinstance(raw, dict):
        return {}
    if isinstance(raw.get("encoder"), dict):  # Hydra-era DPR: {"encoder": cfg.encoder}
        raw = {**raw, **raw["encoder"]}
    return raw


def _dpr_tower(state: Dict[str, torch.Tensor], heads: Optional[int], source: Path, role: str
               ) -> Optional[BiEncoderTower]:
    """One DPR encoder (HF BERT keys + optional ``encode_proj.*``) -> tower, sizes inferred."""
    if not state:
        return None
    proj = {k: v for k, v in state.items() if k.startswith("encode_proj.")}
    bert = {k: v for k, v in state.items() if not k.startswith("encode_proj.")}
    cfg = BertConfig.infer(bert, num_heads=heads, source=str(source))
    proj_dim = proj["encode_proj.weight"].shape[0] if "encode_proj.weight" in proj else 0
    tower = new_tower(cfg, pooling="cls", normalize=False, projection_dim=proj_dim)
    load_tower_state(tower, {**as_tower_keys(bert), **proj}, source, f"DPR {role} encoder")
    return tower.eval()


@register_encoder("dpr", usage="dpr:CKPT[,vocab=FILE]")
def load_dpr_checkpoint(arg: str, options: EncoderOptions) -> TextEncoder:
    """An original DPR checkpoint (``model_dict`` with ``question_model.*``/``ctx_model.*``)."""
    if not arg:
        raise UserError(f"encoder spec {options.spec!r} needs a checkpoint", fix="write dpr:CKPT[,vocab=FILE]")
    ckpt_path = require_file(arg, "DPR checkpoint")
    vocab = Path(options.text("vocab", ckpt_path.parent / "vocab.txt"))
    heads = options.integer("heads", None)
    max_length_opt = options.integer("max_length", None)
    options.done("vocab, heads, max_length")
    if not vocab.is_file():
        raise UserError("vocabulary for the DPR checkpoint not found", path=vocab,
                        fix="put BERT's vocab.txt beside the checkpoint or add ,vocab=FILE")
    ckpt = load_encoder_checkpoint(ckpt_path, "DPR checkpoint")
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model_dict"), dict):
        raise UserError("not a DPR checkpoint (no model_dict)", path=ckpt_path)
    params = _dpr_params(ckpt.get("encoder_params"))
    towers = {}
    for role, prefix in (("question", "question_model."), ("ctx", "ctx_model.")):
        towers[role] = _dpr_tower(sub_state(ckpt["model_dict"], prefix), heads, ckpt_path, role)
    if towers["question"] is None or towers["ctx"] is None:
        raise UserError("DPR checkpoint lacks question_model.* or ctx_model.* weights",
                        path=ckpt_path)
    max_length = max_length_opt or int(params.get("sequence_length") or DPR_MAX_LENGTH)
    model_cfg = str(params.get("pretrained_model_cfg") or "bert-base-uncased")
    lowercase = bool(params.get("do_lower_case", "uncased" in model_cfg or "cased" not in model_cfg))
    return TextEncoder(towers["question"], towers["ctx"], wordpiece_tokenizer(vocab, lowercase),
                       kind="dpr", name=ckpt_path.stem, source=str(ckpt_path),
                       max_length=max_length, passage_format="pair")
