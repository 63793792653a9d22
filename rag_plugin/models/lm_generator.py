"""The decoder-only reader's language model: a fairseq ``transformer_lm``, built by size preset or from a checkpoint.

Sizes (pre-LayerNorm blocks, learned positions, GELU, unscaled token embeddings tied to the output layer: GPT-2's
shape, which is what ``rag-convert-hf --gpt2`` writes):

* ``tiny``: 4 layers, d=192, 4 heads, feed-forward 768 (trains from scratch on 2 CPU cores; registered as fairseq's
  ``transformer_lm_rag_tiny`` too, so that ``fairseq-train --task language_modeling`` pretrains exactly the network
  ``rag_lm_*_tiny`` reads with);
* ``base``: GPT-2 small's 12 layers, d=768, 12 heads, feed-forward 3072 (``transformer_lm_rag_base``).

``--generator-checkpoint`` takes a fairseq ``transformer_lm`` checkpoint (fairseq's own, one pretrained with
``fairseq-train --task language_modeling``, or a converted GPT-2): its own ``cfg.model`` says the network, whatever
the size preset, and its vocabulary must be the task's (the knowledge source's generator dictionary).
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Optional

import torch
from fairseq.models import register_model_architecture
from fairseq.models.transformer_lm import TransformerLanguageModel, base_lm_architecture

from rag_plugin.models.generator import _Dictionaries
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load

logger = logging.getLogger(__name__)

LM_SIZES = {
    "tiny": dict(decoder_embed_dim=192, decoder_ffn_embed_dim=768, decoder_layers=4, decoder_attention_heads=4),
    "base": dict(decoder_embed_dim=768, decoder_ffn_embed_dim=3072, decoder_layers=12, decoder_attention_heads=12),
}
#: what every preset shares (GPT-2's block); base_lm_architecture fills the rest (pre-LN is fairseq's default)
_GPT2_STYLE = dict(activation_fn="gelu", decoder_learned_pos=True, no_scale_embedding=True,
                   share_decoder_input_output_embed=True)


def _preset(size: str):
    def arch(args):
        for key, value in {**LM_SIZES[size], **_GPT2_STYLE}.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        base_lm_architecture(args)
    return arch


for _size in LM_SIZES:  # fairseq-train --task language_modeling --arch transformer_lm_rag_tiny pretrains the LM
    register_model_architecture("transformer_lm", f"transformer_lm_rag_{_size}")(_preset(_size))


def lm_namespace(size: str, positions: int, dropout: float, attention_dropout: float, activation_dropout: float,
                 overrides: Optional[dict] = None) -> argparse.Namespace:
    """The ``transformer_lm`` options of a preset (or of a checkpoint's ``cfg.model``: ``overrides``)."""
    if overrides is None and size not in LM_SIZES:
        raise UserError(f"no decoder-only size {size!r}", fix=f"use one of {', '.join(sorted(LM_SIZES))}")
    for option, p in (("--dropout", dropout), ("--attention-dropout", attention_dropout),
                      ("--activation-dropout", activation_dropout)):
        if not 0.0 <= p < 1.0:
            raise UserError(f"{option} {p} is not a dropout probability", fix=f"give {option} a value in [0, 1)")
    values = dict(overrides or {**LM_SIZES[size], **_GPT2_STYLE})
    values.update(dropout=dropout, attention_dropout=attention_dropout, activation_dropout=activation_dropout)
    if values.get("max_target_positions") is None:
        values["max_target_positions"] = positions
    if values.get("tokens_per_sample") is None:
        values["tokens_per_sample"] = values["max_target_positions"]
    args = argparse.Namespace(**values)
    base_lm_architecture(args)
    return args


def build_lm(args: argparse.Namespace, dictionary) -> TransformerLanguageModel:
    """fairseq's ``TransformerLanguageModel`` over ``dictionary``."""
    if args.decoder_embed_dim % args.decoder_attention_heads:
        raise UserError(f"LM dimension {args.decoder_embed_dim} is not divisible by {args.decoder_attention_heads} "
                        "heads", fix="change --generator-heads")
    for unsupported in ("adaptive_input", "character_embeddings"):
        if getattr(args, unsupported, False):
            raise UserError(f"the LM uses {unsupported.replace('_', '-')}, which the RAG reader does not read",
                            fix="use a transformer_lm with ordinary token embeddings")
    if getattr(args, "adaptive_softmax_cutoff", None):
        raise UserError("the LM uses an adaptive softmax, which the RAG reader does not read",
                        fix="use a transformer_lm with a full output layer")
    return TransformerLanguageModel.build_model(args, _Dictionaries(dictionary, dictionary))


def read_lm_checkpoint(path: str, dictionary):
    """(the LM's ``transformer_lm`` options, its weights) of a fairseq ``transformer_lm`` checkpoint, or of the LM of
    a ``rag_lm_*`` checkpoint (e.g. one pretrained on pseudo-questions), checked against the task's generator
    dictionary (one-line errors). The positions come from the weights' own table."""
    p = Path(path)
    state = safe_torch_load(p)
    cfg = state.get("cfg") or {}
    model_cfg = cfg.get("model") if isinstance(cfg, dict) else None
    if model_cfg is None and state.get("args") is not None:  # a checkpoint of fairseq before hydra
        model_cfg = vars(state["args"])
    model_cfg = dict(model_cfg or {})
    weights = state.get("model")
    if isinstance(weights, dict) and "generator.decoder.embed_tokens.weight" in weights:  # a rag_lm_* checkpoint
        weights = {k[len("generator."):]: v for k, v in weights.items() if k.startswith("generator.")}
        model_cfg = rag_lm_options(model_cfg)
    if not isinstance(weights, dict) or "decoder.embed_tokens.weight" not in weights \
            or any(k.startswith("encoder.") for k in weights):
        raise UserError("not a fairseq transformer_lm checkpoint (no decoder-only weights)", path=str(p),
                        fix="pass a transformer_lm checkpoint (fairseq-train --task language_modeling, or "
                            "rag-convert-hf --gpt2) or a rag_lm_* checkpoint")
    rows = weights["decoder.embed_tokens.weight"].shape[0]
    if rows != len(dictionary):
        raise UserError(f"the LM checkpoint has {rows} token embeddings, the knowledge source's generator dictionary "
                        f"{len(dictionary)} symbols: another vocabulary", path=str(p),
                        fix="build the knowledge source with the LM's dict.txt (and its BPE) as the generator tokens")
    _check_same_symbols(p.parent / "dict.txt", dictionary, p)
    keep = {k: v for k, v in model_cfg.items()  # not the interpolations a saved cfg may keep (${task.*})
            if not k.startswith("_") and not (isinstance(v, str) and v.startswith("${"))}
    table = weights.get("decoder.embed_positions.weight")
    if table is not None:  # learned positions: max_positions + padding_idx + 1 rows
        keep["max_target_positions"] = keep["tokens_per_sample"] = int(table.shape[0]) - dictionary.pad() - 1
    return keep, weights


def rag_lm_options(rag_cfg: dict) -> dict:
    """The ``transformer_lm`` options of a rag_lm_* checkpoint's LM (its size preset and overrides)."""
    size = str(rag_cfg.get("generator_size") or "tiny")
    values = {**LM_SIZES.get(size, LM_SIZES["tiny"]), **_GPT2_STYLE}
    for key, option in (("decoder_embed_dim", "generator_embed_dim"), ("decoder_layers", "generator_layers"),
                        ("decoder_attention_heads", "generator_heads"),
                        ("decoder_ffn_embed_dim", "generator_ffn_dim")):
        if int(rag_cfg.get(option) or 0):
            values[key] = int(rag_cfg[option])
    return values


def _check_same_symbols(dict_txt: Path, dictionary, checkpoint: Path) -> None:
    """The LM's own dict.txt (beside its checkpoint, where it has one) names the task dictionary's symbols, in
    order: one of the same size with other symbols reads every token as another."""
    if not dict_txt.is_file():
        return
    theirs = [line.split(" ", 1)[0] for line in dict_txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    ours = dictionary.symbols[dictionary.nspecial:dictionary.nspecial + len(theirs)]
    for i, (a, b) in enumerate(zip(theirs, ours)):
        if a != b:
            raise UserError(f"the LM's vocabulary ({dict_txt}) differs from the knowledge source's generator "
                            f"dictionary at symbol {i + dictionary.nspecial} ({a!r} vs {b!r})", path=str(checkpoint),
                            fix="build the knowledge source with the LM's dict.txt (and its BPE) as the generator "
                                "tokens")


def load_lm_weights(lm: TransformerLanguageModel, weights: dict, path: str) -> None:
    """The checkpoint's weights into ``lm`` (built from its own cfg): every weight present, none left over."""
    mine = lm.state_dict()
    bad = [k for k, v in weights.items() if k in mine and mine[k].shape != v.shape]
    if bad:
        raise UserError(f"the LM checkpoint's {bad[0]} is {tuple(weights[bad[0]].shape)}, its own cfg builds "
                        f"{tuple(mine[bad[0]].shape)}", path=path, fix="pass an unmodified transformer_lm checkpoint")
    missing, _ = torch.nn.Module.load_state_dict(lm, weights, strict=False)
    missing = [k for k in missing if not k.endswith("version") and "output_projection" not in k]
    if missing:
        raise UserError(f"the LM checkpoint lacks {len(missing)} weights (e.g. {missing[0]})", path=path,
                        fix="pass a complete transformer_lm checkpoint")
    logger.info("LM initialised from %s (%d tensors)", path, len(weights))
