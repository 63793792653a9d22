"""The parametric memory: a fairseq BART generator, built by size preset or from a checkpoint."""
from __future__ import annotations

import argparse
import logging
import types
from pathlib import Path

import torch

from rag_plugin.checkpoints import safe_torch_load
from rag_plugin.errors import UserError

logger = logging.getLogger(__name__)

# Sizes. "base"/"large" are fairseq's bart_base/bart_large; "tiny" trains on the demo data on
# 2 CPU cores in minutes (other sizes: --generator-embed-dim/-layers/-heads/-ffn-dim).
GENERATOR_SIZES = {
    "tiny": dict(encoder_embed_dim=192, encoder_ffn_embed_dim=768, encoder_layers=2,
                 encoder_attention_heads=4, decoder_layers=2, decoder_attention_heads=4),
    "base": dict(encoder_embed_dim=768, encoder_ffn_embed_dim=3072, encoder_layers=6,
                 encoder_attention_heads=12, decoder_layers=6, decoder_attention_heads=12),
    "large": dict(encoder_embed_dim=1024, encoder_ffn_embed_dim=4096, encoder_layers=12,
                  encoder_attention_heads=16, decoder_layers=12, decoder_attention_heads=16),
}


def build_bart(size: str, dictionary, max_source_positions: int, max_target_positions: int,
               dropout: float, attention_dropout: float, activation_dropout: float, embed_dim: int = 0,
               layers: int = 0, heads: int = 0, ffn_dim: int = 0):
    """A fairseq ``BARTModel`` of the given size over ``dictionary`` (shared embeddings).

    Non-zero ``embed_dim``/``layers`` (encoder and decoder each)/``heads``/``ffn_dim`` override
    the size preset.
    """
    from fairseq.models.bart.model import BARTModel, bart_large_architecture

    if size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {size!r}", fix=f"use one of {sorted(GENERATOR_SIZES)}")
    dims = dict(GENERATOR_SIZES[size])
    for keys, value in ((("encoder_embed_dim",), embed_dim), (("encoder_layers", "decoder_layers"), layers),
                        (("encoder_attention_heads", "decoder_attention_heads"), heads),
                        (("encoder_ffn_embed_dim",), ffn_dim)):
        for key in keys:
            if value:
                dims[key] = value
    if dims["encoder_embed_dim"] % dims["encoder_attention_heads"]:
        raise UserError(f"generator dimension {dims['encoder_embed_dim']} is not divisible by "
                        f"{dims['encoder_attention_heads']} heads", fix="change --generator-heads")
    args = argparse.Namespace(**dims, max_source_positions=max_source_positions,
                              max_target_positions=max_target_positions, dropout=dropout,
                              attention_dropout=attention_dropout, activation_dropout=activation_dropout)
    bart_large_architecture(args)  # fills every other BART default
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return BARTModel.build_model(args, task)


def load_generator_weights(generator, path: str, dictionary) -> None:
    """Initialise ``generator`` from a fairseq BART checkpoint (``bart.base``/``bart.large``) or
    from the generator of a rag_plugin checkpoint (e.g. one pretrained closed-book)."""
    p = Path(path)
    state = safe_torch_load(p)
    weights = state.get("model", state)
    if not isinstance(weights, dict):
        raise UserError("generator checkpoint holds no model weights", path=str(p),
                        fix="pass a fairseq BART model.pt")
    if any(k.startswith("generator.") for k in weights):  # a rag_plugin checkpoint: take its generator
        weights = {k[len("generator."):]: v for k, v in weights.items() if k.startswith("generator.")}
    weights = {k: v for k, v in weights.items() if not k.startswith("classification_heads.")}
    emb = weights.get("encoder.embed_tokens.weight")
    if emb is None:
        raise UserError("generator checkpoint is not a fairseq BART/transformer", path=str(p),
                        fix="pass a fairseq BART model.pt")
    rows = emb.shape[0]
    if rows < len(dictionary):
        raise UserError(f"generator checkpoint has {rows} embeddings, the dictionary {len(dictionary)} "
                        "symbols", path=str(p), fix="use the checkpoint's own dict.txt")
    if rows > len(dictionary):
        # fairseq's BART dictionaries gain <mask> (and padding) after dict.txt: drop the extra rows
        for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                    "decoder.output_projection.weight"):
            if key in weights:
                weights[key] = weights[key][: len(dictionary)]
    mine = generator.state_dict()
    bad = [k for k, v in weights.items() if k in mine and mine[k].shape != v.shape]
    if bad:
        raise UserError(f"generator checkpoint sizes differ from --arch (e.g. {bad[0]}: "
                        f"{tuple(weights[bad[0]].shape)} vs {tuple(mine[bad[0]].shape)})", path=str(p),
                        fix="pick the *_base arch for bart.base and *_large for bart.large")
    # torch's own loader: BART's upgrade hook reads a task name a bare generator does not have
    missing, unexpected = torch.nn.Module.load_state_dict(generator, weights, strict=False)
    missing = [k for k in missing if not k.endswith("version") and "output_projection" not in k]
    if missing:
        raise UserError(f"generator checkpoint lacks {len(missing)} weights (e.g. {missing[0]})",
                        path=str(p), fix="pass a complete fairseq BART model.pt")
    logger.info("generator initialised from %s (%d tensors)", p, len(weights))


def count_parameters(module: torch.nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
