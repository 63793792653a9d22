"""Shared inputs of the encoder tests: texts, a tiny random encoder, output comparison."""
from __future__ import annotations

import numpy as np

from rag_plugin.retrieval.encoders import build_random_encoder

WORDS = ("the of and is in capital france paris city river country what which who where "
         "ozone oxygen molecule triatomic berlin germany longest world europe").split()
TITLES = ["Paris", "Ozone", "", "Rhine river", "Berlin!"]
TEXTS = [
    "Paris is the capital of France.",
    "Ozone is a triatomic oxygen molecule, found in the upper atmosphere of the world.",
    "What?",
    "The Rhine is a river in Europe which flows through Germany and other countries, " * 3,
    "Berlin is the capital city of Germany and its largest city.",
]
QUESTIONS = ["what is the capital of france", "triatomic oxygen molecule",
             "which river flows through germany and the netherlands to the north sea", "x"]


def tiny_random(vocab_file, **kw):
    """A small seeded random encoder over ``vocab_file`` (mean pooling, shared tower by default)."""
    defaults = dict(dim=32, layers=2, heads=4, vocab=vocab_file, max_position=128, max_length=64)
    defaults.update(kw)
    return build_random_encoder(**defaults)


def dpr_like(vocab_file, **kw):
    """Two different towers, CLS pooling, no normalisation, pair passages (DPR-shaped)."""
    return tiny_random(vocab_file, pooling="cls", normalize=False, passage_format="pair",
                       shared=False, **kw)


def assert_same_outputs(a, b, atol=1e-5):
    np.testing.assert_allclose(a.encode_queries(QUESTIONS), b.encode_queries(QUESTIONS), atol=atol)
    np.testing.assert_allclose(a.encode_passages(TITLES, TEXTS, progress=False),
                               b.encode_passages(TITLES, TEXTS, progress=False), atol=atol)
