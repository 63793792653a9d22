"""rag_plugin.retrieval.encoders.text_encoder: tokenization, passage formats, batched encoding."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rag_plugin.util.errors import UserError
from tests.retrieval.encoders.common import QUESTIONS, TEXTS, TITLES, dpr_like, tiny_random


def test_shorter_query_length_keeps_sep_as_the_tokenizers_truncation_does(minilm):
    """--max-query-tokens below the encoder's length: the question is cut, its [SEP] kept, token for
    token what the tokenizer's own truncation to that length gives."""
    from tokenizers import Tokenizer

    questions = ["What is the capital of " + " ".join(["Gavisu"] * 80) + "?", "Who wrote it?"]
    reference = Tokenizer.from_str(minilm.tokenizer.to_str())
    reference.enable_truncation(16)
    got = minilm.tokenize_queries(questions, max_length=16)
    assert got == [e.ids for e in reference.encode_batch(questions)]
    assert len(got[0]) == 16 and got[0][-1] == minilm.tokenizer.token_to_id("[SEP]")
    assert got[1] == minilm.tokenize_queries(questions)[1]  # short questions unchanged
    with pytest.raises(UserError, match="--max-query-tokens 3 or more"):
        minilm.tokenize_queries(questions, max_length=2)


def test_minilm_joined_passage_format(minilm):
    ids = minilm.tokenize_passages(["Paris", "Q&A?", None], ["Capital of France.", "x", "y"])
    assert ids[0] == minilm.tokenize_queries(["Paris. Capital of France."])[0]
    assert ids[1] == minilm.tokenize_queries(["Q&A? x"])[0]
    assert ids[2] == minilm.tokenize_queries(["y"])[0]


def test_dpr_pair_format(vocab_file):
    e = dpr_like(vocab_file, max_length=16)
    tok = e.tokenizer
    cls_, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    ids = e.tokenize_passages(["Paris", ""], ["the capital of france", "ozone"])
    title_ids = tok.encode("Paris", add_special_tokens=False).ids
    text_ids = tok.encode("the capital of france", add_special_tokens=False).ids
    assert ids[0] == [cls_] + title_ids + [sep] + text_ids + [sep]
    assert ids[1] == [cls_, tok.token_to_id("ozone"), sep]
    long = e.tokenize_passages(["Paris"], ["the capital " * 50])[0]
    assert len(long) == 16 and long[-1] == sep and long[:len(title_ids) + 2] == [cls_] + title_ids + [sep]
    _, _, types = e.collate(ids)
    assert int(types.abs().sum()) == 0


def test_encode_keeps_input_order(vocab_file):
    e = tiny_random(vocab_file, shared=False)
    batched = e.encode_passages(TITLES, TEXTS, batch_size=2, progress=False)
    one_by_one = np.concatenate([e.encode_passages([t], [x], progress=False)
                                 for t, x in zip(TITLES, TEXTS, strict=True)])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    q = e.encode_queries(QUESTIONS, batch_size=3)
    np.testing.assert_allclose(q, np.concatenate([e.encode_queries([x]) for x in QUESTIONS]),
                               atol=1e-5)
    assert e.encode_queries([]).shape == (0, e.dim)


def test_encode_restores_training_mode_and_towers_deepcopy(vocab_file):
    e = tiny_random(vocab_file)
    e.query_tower.train()
    first = e.encode_queries(QUESTIONS)
    assert e.query_tower.training
    np.testing.assert_array_equal(first, e.encode_queries(QUESTIONS))  # dropout was off
    clone = copy.deepcopy(e.query_tower).eval()
    ids = e.collate(e.tokenize_queries(QUESTIONS))
    with torch.no_grad():
        torch.testing.assert_close(clone(*ids), e.query_tower.eval()(*ids))
