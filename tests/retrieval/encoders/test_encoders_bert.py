"""rag_plugin.retrieval.encoders.bert: parameter names, pooling, the CLS shortcut, padding."""
from __future__ import annotations

import torch

from tests.retrieval.encoders.common import QUESTIONS, tiny_random


def test_state_dict_names_mirror_hf_bert(vocab_file):
    tower = tiny_random(vocab_file, layers=1).query_tower
    keys = set(tower.bert_model.state_dict())
    for key in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                "encoder.layer.0.attention.self.query.weight",
                "encoder.layer.0.attention.self.key.bias",
                "encoder.layer.0.attention.self.value.weight",
                "encoder.layer.0.attention.output.dense.weight",
                "encoder.layer.0.attention.output.LayerNorm.bias",
                "encoder.layer.0.intermediate.dense.weight",
                "encoder.layer.0.output.dense.weight", "encoder.layer.0.output.LayerNorm.weight"):
        assert key in keys
    assert len(keys) == 5 + 16  # embeddings (3 + LN 2) + one layer (16 tensors)


def test_pooling_and_normalisation(vocab_file):
    e = tiny_random(vocab_file, pooling="mean", normalize=False)
    ids, mask, types = e.collate(e.tokenize_queries(QUESTIONS))
    assert mask.sum(1).tolist() == [len(x) for x in e.tokenize_queries(QUESTIONS)]
    tower = e.query_tower
    with torch.no_grad():
        hidden = tower.bert_model(ids, mask, types)
        mean = tower(ids, mask, types)
        for row, n in enumerate(mask.sum(1).tolist()):
            torch.testing.assert_close(mean[row], hidden[row, :n].mean(0), atol=1e-5, rtol=1e-5)
        tower.pooling = "cls"
        torch.testing.assert_close(tower(ids, mask, types), hidden[:, 0])
        tower.normalize = True
        out = tower(ids, mask, types)
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(len(QUESTIONS)))
        torch.testing.assert_close(out, torch.nn.functional.normalize(hidden[:, 0], dim=-1))


def test_cls_pooling_computes_position_zero_alone_in_the_last_layer(vocab_file):
    """CLS pooling skips the last layer's other positions: the same vector and the same gradients
    for every weight as pooling position 0 of the full hidden states (float64)."""
    e = tiny_random(vocab_file, pooling="cls", normalize=False)
    tower = e.query_tower.double().eval()
    ids, mask, types = e.collate(e.tokenize_queries(QUESTIONS))
    assert mask.sum(1).min() < ids.size(1)  # padding present
    full = tower.bert_model(ids, mask, types)
    assert full.shape[1] == ids.size(1)
    full_grads = torch.autograd.grad(full[:, 0].pow(2).sum(), list(tower.parameters()), allow_unused=True)
    first = tower.bert_model(ids, mask, types, first_token_only=True)
    assert first.shape == (len(QUESTIONS), 1, full.shape[-1])
    assert torch.equal(tower(ids, mask, types), first[:, 0])
    grads = torch.autograd.grad(first[:, 0].pow(2).sum(), list(tower.parameters()), allow_unused=True)
    torch.testing.assert_close(first[:, 0], full[:, 0], rtol=1e-12, atol=1e-12)
    for (name, _), a, b in zip(tower.named_parameters(), grads, full_grads, strict=True):
        if b is None:
            assert a is None, name
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_padding_does_not_change_vectors(vocab_file):
    e = tiny_random(vocab_file, pooling="mean")
    ids = e.tokenize_queries(QUESTIONS)
    batch = e.query_tower(*e.collate(ids))
    for row, one in enumerate(ids):
        alone = e.query_tower(*e.collate([one]))
        torch.testing.assert_close(batch[row], alone[0], atol=1e-5, rtol=1e-5)


def test_projection_sets_dim(vocab_file):
    e = tiny_random(vocab_file, projection_dim=8, pooling="cls", normalize=False)
    assert e.dim == 8 and e.query_tower.dim == 8
    assert e.encode_queries(QUESTIONS).shape == (len(QUESTIONS), 8)
