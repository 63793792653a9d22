"""The parametric memory: a fairseq BART generator, built by size preset or from a checkpoint."""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from fairseq.models.bart.model import BARTModel, bart_large_architecture
from fairseq.modules import MultiheadAttention

from rag_plugin.models.dropout import use_fast_dropout
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load

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


@dataclass(frozen=True)
class _Dictionaries:
    """What fairseq's ``BARTModel.build_model`` reads of a task: its dictionaries."""

    source_dictionary: object
    target_dictionary: object


@dataclass(frozen=True)
class GeneratorShape:
    """How a generator is built: its size preset and overrides, lengths, dropout, positions, initialisation."""

    size: str = "tiny"
    max_source_positions: int = 256
    max_target_positions: int = 128
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    #: non-zero: override the size preset's model dimension, layers (encoder and decoder each), heads, feed-forward
    embed_dim: int = 0
    layers: int = 0
    heads: int = 0
    ffn_dim: int = 0
    positions: str = "learned"
    init: str = "bart"
    fast_dropout: bool = True

    @classmethod
    def of(cls, cfg, init: str = "bart") -> "GeneratorShape":
        """The shape a model config (``RagConfig``: --generator-size, --generator-embed-dim, ...) asks for."""
        return cls(size=str(cfg.generator_size), max_source_positions=int(cfg.max_source_positions),
                   max_target_positions=int(cfg.max_target_positions), dropout=float(cfg.dropout),
                   attention_dropout=float(cfg.attention_dropout), activation_dropout=float(cfg.activation_dropout),
                   embed_dim=int(cfg.generator_embed_dim), layers=int(cfg.generator_layers),
                   heads=int(cfg.generator_heads), ffn_dim=int(cfg.generator_ffn_dim),
                   positions=str(getattr(cfg, "generator_positions", "learned")), init=init,
                   fast_dropout=not bool(getattr(cfg, "generator_torch_dropout", False)))


def build_bart(shape: GeneratorShape, dictionary):
    """A fairseq ``BARTModel`` of ``shape`` over ``dictionary`` (shared embeddings).

    Non-zero ``embed_dim``/``layers`` (encoder and decoder each)/``heads``/``ffn_dim`` of the shape override
    its size preset. ``positions="sinusoidal"`` replaces BART's learned position embeddings by
    fixed sinusoids (relative offsets are a linear map of them). Not an improvement as it stands:
    BART does not scale token embeddings by sqrt(d), so the unit-amplitude sinusoids outweigh the
    N(0, d^-1/2) token embeddings about tenfold; in the demo's denoising pretraining the loss
    stayed at the unigram plateau (9.1-9.6 bits) for 600 updates, where learned positions were
    at 5.4 bits after 475 (2026-12-01). ``init="xavier"``
    re-initialises a model trained from scratch the way fairseq's plain transformer is (see
    :func:`xavier_init`); ``"bart"`` keeps BART's N(0, 0.02). ``fast_dropout`` swaps fairseq's dropout
    modules for :class:`rag_plugin.models.dropout.FastDropout` (same dropout, a cheaper mask on CPU).
    """
    if shape.size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {shape.size!r}", fix=f"use one of {sorted(GENERATOR_SIZES)}")
    for option, p in (("--dropout", shape.dropout), ("--attention-dropout", shape.attention_dropout),
                      ("--activation-dropout", shape.activation_dropout)):
        if not 0.0 <= p < 1.0:  # also catches NaN
            raise UserError(f"{option} {p} is not a dropout probability", fix=f"give {option} a value in [0, 1)")
    dims = dict(GENERATOR_SIZES[shape.size])
    for keys, value in ((("encoder_embed_dim",), shape.embed_dim), (("encoder_layers", "decoder_layers"), shape.layers),
                        (("encoder_attention_heads", "decoder_attention_heads"), shape.heads),
                        (("encoder_ffn_embed_dim",), shape.ffn_dim)):
        for key in keys:
            if value:
                dims[key] = value
    if dims["encoder_embed_dim"] % dims["encoder_attention_heads"]:
        raise UserError(f"generator dimension {dims['encoder_embed_dim']} is not divisible by "
                        f"{dims['encoder_attention_heads']} heads", fix="change --generator-heads")
    args = argparse.Namespace(**dims, max_source_positions=shape.max_source_positions,
                              max_target_positions=shape.max_target_positions, dropout=shape.dropout,
                              attention_dropout=shape.attention_dropout, activation_dropout=shape.activation_dropout)
    if shape.positions not in ("learned", "sinusoidal"):
        raise UserError(f"unknown generator positions {shape.positions!r}", fix="use 'learned' or 'sinusoidal'")
    args.encoder_learned_pos = args.decoder_learned_pos = shape.positions == "learned"
    bart_large_architecture(args)  # fills every other BART default
    model = BARTModel.build_model(args, _Dictionaries(dictionary, dictionary))
    if shape.fast_dropout:
        use_fast_dropout(model)
    if shape.init == "xavier":
        xavier_init(model)
    elif shape.init != "bart":
        raise UserError(f"unknown generator initialisation {shape.init!r}", fix="use 'bart' or 'xavier'")
    return model


def xavier_init(model) -> None:
    """Attention and feed-forward weights Xavier-uniform (zero biases), token and position embeddings
    N(0, d^-1/2) with zero padding rows: the initialisation of fairseq's plain transformer.

    BART initialises everything N(0, 0.02), tuned for d=768/1024. At the tiny generator's d=192
    that starts attention at a saddle: query-key products ~ 0.02^2 and learned positions too
    small to tell apart. Measured on a pure copy task (24 random tokens, vocabulary 8,000, the
    tiny generator, Adam 1e-3): with BART's initialisation the loss is still at the unigram
    level (9.0 bits) after 400 updates; with this one it is 0.35 bits after 250.
    """
    dim = model.encoder.embed_tokens.embedding_dim
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            module.reset_parameters()
        elif isinstance(module, torch.nn.Linear) and module.weight is not model.encoder.embed_tokens.weight:
            torch.nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
    embeddings = {id(e): e for e in (model.encoder.embed_tokens, model.decoder.embed_tokens,
                                     model.encoder.embed_positions, model.decoder.embed_positions)
                  if e is not None and getattr(e, "weight", None) is not None}
    with torch.no_grad():
        for e in embeddings.values():
            torch.nn.init.normal_(e.weight, 0.0, dim ** -0.5)
            if e.padding_idx is not None:
                e.weight[e.padding_idx].zero_()


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
        raise _size_mismatch(weights, mine, bad, p)
    # torch's own loader: BART's upgrade hook reads a task name a bare generator does not have
    missing, unexpected = torch.nn.Module.load_state_dict(generator, weights, strict=False)
    missing = [k for k in missing if not k.endswith("version") and "output_projection" not in k]
    if missing:
        raise UserError(f"generator checkpoint lacks {len(missing)} weights (e.g. {missing[0]})",
                        path=str(p), fix="pass a complete fairseq BART model.pt")
    logger.info("generator initialised from %s (%d tensors)", p, len(weights))


#: learned position tables hold max positions + padding_idx + 1 rows (fairseq's LearnedPositionalEmbedding)
_POSITION_TABLES = {"encoder.embed_positions.weight": "--max-source-positions",
                    "decoder.embed_positions.weight": "--max-target-positions"}


def _size_mismatch(weights, mine, bad, path) -> UserError:
    """The error for a checkpoint whose tensors have other sizes than the generator --arch builds, naming
    the options that fix it: the position sizes (read from the checkpoint's tables), or the model size."""
    example = (f"e.g. {bad[0]}: {tuple(weights[bad[0]].shape)} in the checkpoint vs {tuple(mine[bad[0]].shape)} "
               "for --arch")
    if set(bad) <= set(_POSITION_TABLES):  # only the position tables: the checkpoint was made for other lengths
        pad = 1  # fairseq's dictionaries put <pad> at 1: positions start at pad + 1
        options = " ".join(f"{_POSITION_TABLES[k]} {weights[k].shape[0] - pad - 1}" for k in _POSITION_TABLES
                           if k in weights)
        return UserError(f"the generator checkpoint was trained with other input/output lengths ({example})",
                         path=str(path), fix=f"pass {options} (the checkpoint's lengths)")
    dim = weights["encoder.embed_tokens.weight"].shape[1]
    layers = len({k.split(".")[2] for k in weights if k.startswith("encoder.layers.")})
    return UserError(f"the generator checkpoint is another model size than --arch builds ({example})",
                     path=str(path), fix=f"use the arch (or --generator-embed-dim/--generator-layers/...) of the "
                                         f"checkpoint: d={dim}, {layers} encoder layers (bart.base: rag_*_base, "
                                         f"bart.large: rag_*_large)")


def count_parameters(module: torch.nn.Module, trainable_only: bool = True) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)
