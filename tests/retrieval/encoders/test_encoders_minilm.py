"""rag_plugin.retrieval.encoders.minilm: all-MiniLM-L6-v2 reproduces sentence-transformers, and its
identity (what knowledge sources record) is pinned."""
from __future__ import annotations

import json

import numpy as np

#: sentence-transformers' all-MiniLM-L6-v2 vector of "The capital of France is Paris." (first 5 values)
MINILM_REFERENCE = [0.103257, 0.030420, 0.029096, -0.037323, 0.078676]

#: MiniLM's identity as knowledge sources record it (all but ``source``, the install folder). A change
#: here makes every knowledge source built with ``minilm`` refuse its encoder.
MINILM_IDENTITY = {
    "kind": "minilm",
    "name": "all-MiniLM-L6-v2",
    "spec": "minilm",
    "pooling": "mean",
    "normalize": True,
    "dim": 384,
    "max_length": 256,
    "passage_format": "joined",
    "lowercase": True,
    "shared_towers": True,
    "vocab_sha256": "0f052197aac305fe42f378b5c61554b7bacb34b8be4af83fec2cfdcdffbc9973",
    "weights_sha256": "2bb8e891d93b4e69972226c74432c18e4ad53cc338620bc8465daddad16a9d92",
    "passage_weights_sha256": "301560cac616220b537466da69a33916f89bc30b4643b484aa61a171c78b15f5",
    "query_weights_sha256": "301560cac616220b537466da69a33916f89bc30b4643b484aa61a171c78b15f5",
}


def test_minilm_reproduces_sentence_transformers(minilm):
    vec = minilm.encode_queries(["The capital of France is Paris."])
    assert vec.dtype == np.float32 and vec.shape == (1, 384)
    np.testing.assert_allclose(vec[0, :5], MINILM_REFERENCE, atol=1e-5)
    assert abs(np.linalg.norm(vec[0]) - 1.0) < 1e-5
    # a passage without title is the same single sequence
    p = minilm.encode_passages(None, ["The capital of France is Paris."], progress=False)
    np.testing.assert_allclose(p, vec, atol=1e-6)


def test_minilm_settings_and_identity(minilm):
    assert minilm.query_tower is minilm.passage_tower
    assert (minilm.pooling, minilm.normalize, minilm.max_length, minilm.dim) == ("mean", True, 256, 384)
    ids = minilm.tokenize_queries(["hello " * 400])[0]
    assert len(ids) == 256 and ids[0] == minilm.tokenizer.token_to_id("[CLS]")
    assert ids[-1] == minilm.tokenizer.token_to_id("[SEP]")
    ident = minilm.identity()
    json.dumps(ident)
    assert ident["kind"] == "minilm" and ident["dim"] == 384 and ident["lowercase"] is True
    assert ident["passage_weights_sha256"] == ident["query_weights_sha256"]
    assert minilm.identity() == ident  # deterministic


def test_minilm_identity_is_pinned(minilm):
    ident = minilm.identity()
    assert {k: v for k, v in ident.items() if k != "source"} == MINILM_IDENTITY
