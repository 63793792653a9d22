"""``random:dim=384,layers=6,heads=12,...``: a seeded, randomly initialised BERT bi-encoder.

For tests, benchmarks and small demos: the same weights for the same settings and seed, with
the global RNG left untouched. The tokenizer is WordPiece over ``vocab=FILE`` or, by default,
MiniLM's. The keys are those of :func:`load_random`.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from rag_plugin.retrieval.encoders.bert import BertConfig, BiEncoderTower, new_tower
from rag_plugin.retrieval.encoders.minilm import minilm_dir
from rag_plugin.retrieval.encoders.registry import EncoderOptions, register_encoder
from rag_plugin.retrieval.encoders.text_encoder import TextEncoder
from rag_plugin.retrieval.encoders.wordpiece import tokenizer_from_dir, wordpiece_tokenizer
from rag_plugin.util.errors import UserError


def build_random_encoder(dim: int = 384, layers: int = 6, heads: int = 12,
                         intermediate: Optional[int] = None, max_position: int = 512,
                         seed: int = 0, vocab: Optional[os.PathLike] = None,
                         lowercase: bool = True, pooling: str = "mean", normalize: bool = True,
                         projection_dim: int = 0, max_length: int = 256,
                         passage_format: str = "joined", shared: bool = True) -> TextEncoder:
    """A seeded random BERT bi-encoder (global RNG untouched).

    The tokenizer is WordPiece over ``vocab`` (vocab.txt) or MiniLM's tokenizer. With
    ``shared=False`` the passage tower is a second tower initialised from ``seed + 1``.
    """
    tokenizer = (wordpiece_tokenizer(vocab, lowercase) if vocab is not None
                 else tokenizer_from_dir(minilm_dir()))
    cfg = BertConfig(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
                     hidden_size=dim, num_layers=layers, num_heads=heads,
                     intermediate_size=intermediate or 4 * dim, max_position=max_position)

    def tower(tower_seed: int) -> BiEncoderTower:
        t = new_tower(cfg, pooling, normalize, projection_dim)
        generator = torch.Generator().manual_seed(tower_seed)
        t.bert_model.init_weights(generator)
        if t.encode_proj is not None:
            with torch.no_grad():
                t.encode_proj.weight.normal_(0.0, 0.02, generator=generator)
                t.encode_proj.bias.zero_()
        return t.eval()

    query = tower(seed)
    passage = query if shared else tower(seed + 1)
    return TextEncoder(query, passage, tokenizer, kind="random", name=f"random-{dim}x{layers}",
                       source=None if vocab is None else str(vocab), max_length=max_length,
                       passage_format=passage_format)


@register_encoder("random", usage="random:dim=N,layers=N,heads=N[,vocab=FILE]")
def load_random(arg: str, options: EncoderOptions) -> TextEncoder:
    """``random:dim=..,layers=..,heads=..,intermediate=..,max_position=..,seed=..,vocab=FILE,
    lowercase=0|1,pooling=cls|mean,normalize=0|1,proj=N,max_length=N,passages=joined|pair,
    shared=0|1``."""
    if arg:
        raise UserError(f"unexpected {arg!r} in encoder spec {options.spec!r}",
                        fix="write random:dim=N,layers=N,heads=N")
    kwargs = dict(
        dim=options.integer("dim", 384),
        layers=options.integer("layers", 6),
        heads=options.integer("heads", 12),
        intermediate=options.integer("intermediate", None),
        max_position=options.integer("max_position", 512),
        seed=options.integer("seed", 0),
        lowercase=options.flag("lowercase", True),
        normalize=options.flag("normalize", True),
        projection_dim=options.integer("proj", 0),
        max_length=options.integer("max_length", 256),
        shared=options.flag("shared", True),
        pooling=options.text("pooling", "mean"),
        passage_format=options.text("passages", "joined"),
        vocab=options.text("vocab", None),
    )
    options.done("dim, layers, heads, intermediate, max_position, seed, vocab, "
                 "lowercase, pooling, normalize, proj, max_length, passages, shared")
    if min(kwargs["dim"], kwargs["layers"], kwargs["heads"]) < 1:
        raise UserError(f"dim, layers and heads must be positive in encoder spec {options.spec!r}")
    return build_random_encoder(**kwargs)
