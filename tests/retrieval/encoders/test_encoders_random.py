"""rag_plugin.retrieval.encoders.random: seeded, leaves the global RNG alone, and its identity (what
knowledge sources record, weight hashes included) is pinned byte for byte."""
from __future__ import annotations

import json

import torch

from rag_plugin.retrieval.encoders import load_encoder
from tests.retrieval.encoders.common import dpr_like, tiny_random

#: ``random:dim=16,layers=1,heads=2,max_length=32`` (MiniLM's tokenizer), as a manifest records it.
#: A change here makes every knowledge source built with a random encoder refuse it.
RANDOM_SPEC = "random:dim=16,layers=1,heads=2,max_length=32"
RANDOM_IDENTITY_JSON = (
    '{"kind": "random", '
    '"name": "random-16x1", '
    '"spec": "random:dim=16,layers=1,heads=2,max_length=32", '
    '"source": null, '
    '"pooling": "mean", '
    '"normalize": true, '
    '"dim": 16, '
    '"max_length": 32, '
    '"passage_format": "joined", '
    '"lowercase": true, '
    '"shared_towers": true, '
    '"vocab_sha256": "0f052197aac305fe42f378b5c61554b7bacb34b8be4af83fec2cfdcdffbc9973", '
    '"weights_sha256": "02093556521429114fa8fefa7e3c9e33a9360d19e00a14509cf8190a483666b8", '
    '"passage_weights_sha256": "b9833764cc87a1d805d4492c91bec8deb1260c7f5067a76f0ed2ddad03a23b64", '
    '"query_weights_sha256": "b9833764cc87a1d805d4492c91bec8deb1260c7f5067a76f0ed2ddad03a23b64"}'
)

#: A DPR-shaped random encoder over the tests' vocabulary (two towers, a projection): its hashes.
DPR_LIKE_HASHES = {
    "vocab_sha256": "1939a6b48b8cca2eb54bd80fb271b492c6370d927b49023dba7fc6b8df67be41",
    "weights_sha256": "4698ab0a07b4ff51fe1bc959ebfd5460091f7481f2b81ec43f73bf03e74ad83f",
    "passage_weights_sha256": "d9e96f2af0e2be94e87915b87b8d4aee4bcbe0ed7d24fbafee21d32249adf915",
    "query_weights_sha256": "cd1fb72a99ecf922091296d1f073140413056325c4b2ba06e93538bb1749c9b8",
}


def test_random_is_seeded_and_leaves_global_rng_alone(vocab_file):
    state = torch.get_rng_state()
    a, b = tiny_random(vocab_file, seed=3), tiny_random(vocab_file, seed=3)
    assert torch.equal(state, torch.get_rng_state())
    assert a.identity()["weights_sha256"] == b.identity()["weights_sha256"]
    assert tiny_random(vocab_file, seed=4).identity()["weights_sha256"] != a.identity()["weights_sha256"]
    spec = f"random:dim=32,layers=2,heads=4,vocab={vocab_file},seed=3,max_position=128,max_length=64"
    assert load_encoder(spec).identity()["weights_sha256"] == a.identity()["weights_sha256"]


def test_random_identity_is_pinned():
    assert json.dumps(load_encoder(RANDOM_SPEC).identity()) == RANDOM_IDENTITY_JSON


def test_dpr_like_hashes_are_pinned(vocab_file):
    ident = dpr_like(vocab_file, projection_dim=8, seed=5).identity()
    assert {k: ident[k] for k in DPR_LIKE_HASHES} == DPR_LIKE_HASHES
    assert ident["passage_weights_sha256"] != ident["query_weights_sha256"]
