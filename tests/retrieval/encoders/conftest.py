"""Fixtures of the encoder tests: a small WordPiece vocabulary, MiniLM loaded once."""
from __future__ import annotations

import string

import pytest

from rag_plugin.retrieval.encoders import load_encoder
from tests.retrieval.encoders.common import WORDS


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory):
    """A small BERT WordPiece vocabulary: specials, some words, every character and ##char."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    tokens = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list(chars)
              + ["##" + c for c in string.ascii_lowercase + string.digits])
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(tokens)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def minilm():
    return load_encoder("minilm")
