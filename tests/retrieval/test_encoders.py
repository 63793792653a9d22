"""Tests for rag_plugin.retrieval.encoders (fast: tiny random encoders, one MiniLM load)."""
from __future__ import annotations

import argparse
import copy
import json
import os
import string
import sys

import numpy as np
import pytest
import torch

from rag_plugin.util.errors import UserError
from rag_plugin.retrieval import encoders as enc
from rag_plugin.retrieval.encoders import (BertConfig, BiEncoderTower, build_random_encoder,
                                           load_encoder, save_hf_dpr)

MINILM_REFERENCE = [0.103257, 0.030420, 0.029096, -0.037323, 0.078676]

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


# ------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory):
    """A small BERT WordPiece vocabulary: specials, some words, every character and ##char."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    tokens = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list(chars)
              + ["##" + c for c in string.ascii_lowercase + string.digits])
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(tokens)) + "\n", encoding="utf-8")
    return path


def _random(vocab_file, **kw):
    defaults = dict(dim=32, layers=2, heads=4, vocab=vocab_file, max_position=128, max_length=64)
    defaults.update(kw)
    return build_random_encoder(**defaults)


@pytest.fixture(scope="module")
def minilm():
    return load_encoder("minilm")


def _dpr_like(vocab_file, **kw):
    """Two different towers, CLS pooling, no normalisation, pair passages (DPR-shaped)."""
    return _random(vocab_file, pooling="cls", normalize=False, passage_format="pair",
                   shared=False, **kw)


def _assert_same_outputs(a, b, atol=1e-5):
    np.testing.assert_allclose(a.encode_queries(QUESTIONS), b.encode_queries(QUESTIONS), atol=atol)
    np.testing.assert_allclose(a.encode_passages(TITLES, TEXTS, progress=False),
                               b.encode_passages(TITLES, TEXTS, progress=False), atol=atol)


# -------------------------------------------------------------------------- MiniLM


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


# ------------------------------------------------------------- model and pooling


def test_state_dict_names_mirror_hf_bert(vocab_file):
    tower = _random(vocab_file, layers=1).query_tower
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
    e = _random(vocab_file, pooling="mean", normalize=False)
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
    e = _random(vocab_file, pooling="cls", normalize=False)
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
    for (name, _), a, b in zip(tower.named_parameters(), grads, full_grads):
        if b is None:
            assert a is None, name
        else:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)

def test_padding_does_not_change_vectors(vocab_file):
    e = _random(vocab_file, pooling="mean")
    ids = e.tokenize_queries(QUESTIONS)
    batch = e.query_tower(*e.collate(ids))
    for row, one in enumerate(ids):
        alone = e.query_tower(*e.collate([one]))
        torch.testing.assert_close(batch[row], alone[0], atol=1e-5, rtol=1e-5)


def test_projection_sets_dim(vocab_file):
    e = _random(vocab_file, projection_dim=8, pooling="cls", normalize=False)
    assert e.dim == 8 and e.query_tower.dim == 8
    assert e.encode_queries(QUESTIONS).shape == (len(QUESTIONS), 8)


def test_encode_keeps_input_order(vocab_file):
    e = _random(vocab_file, shared=False)
    batched = e.encode_passages(TITLES, TEXTS, batch_size=2, progress=False)
    one_by_one = np.concatenate([e.encode_passages([t], [x], progress=False)
                                 for t, x in zip(TITLES, TEXTS)])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)
    q = e.encode_queries(QUESTIONS, batch_size=3)
    np.testing.assert_allclose(q, np.concatenate([e.encode_queries([x]) for x in QUESTIONS]),
                               atol=1e-5)
    assert e.encode_queries([]).shape == (0, e.dim)


def test_encode_restores_training_mode_and_towers_deepcopy(vocab_file):
    e = _random(vocab_file)
    e.query_tower.train()
    first = e.encode_queries(QUESTIONS)
    assert e.query_tower.training
    np.testing.assert_array_equal(first, e.encode_queries(QUESTIONS))  # dropout was off
    clone = copy.deepcopy(e.query_tower).eval()
    ids = e.collate(e.tokenize_queries(QUESTIONS))
    with torch.no_grad():
        torch.testing.assert_close(clone(*ids), e.query_tower.eval()(*ids))


def test_random_is_seeded_and_leaves_global_rng_alone(vocab_file):
    state = torch.get_rng_state()
    a, b = _random(vocab_file, seed=3), _random(vocab_file, seed=3)
    assert torch.equal(state, torch.get_rng_state())
    assert a.identity()["weights_sha256"] == b.identity()["weights_sha256"]
    assert _random(vocab_file, seed=4).identity()["weights_sha256"] != a.identity()["weights_sha256"]
    spec = f"random:dim=32,layers=2,heads=4,vocab={vocab_file},seed=3,max_position=128,max_length=64"
    assert load_encoder(spec).identity()["weights_sha256"] == a.identity()["weights_sha256"]


def test_dpr_pair_format(vocab_file):
    e = _dpr_like(vocab_file, max_length=16)
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


# ---------------------------------------------------------------- HF DPR layout


def test_hf_dpr_round_trip(vocab_file, tmp_path):
    original = _dpr_like(vocab_file, projection_dim=16)
    save_hf_dpr(original, tmp_path / "dpr")
    loaded = load_encoder(f"hf-dpr:{tmp_path / 'dpr'},max_length=64")
    assert not loaded.shared_towers and loaded.passage_format == "pair" and loaded.dim == 16
    _assert_same_outputs(original, loaded, atol=0)
    a, b = original.identity(), loaded.identity()
    for key in ("weights_sha256", "passage_weights_sha256", "query_weights_sha256", "vocab_sha256", "dim", "pooling",
                "normalize", "lowercase", "max_length"):
        assert a[key] == b[key], key
    assert b["kind"] == "hf-dpr"


def test_hf_dpr_single_encoder_folder(vocab_file, tmp_path):
    original = _dpr_like(vocab_file)
    save_hf_dpr(original, tmp_path / "dpr")
    only_q = load_encoder(f"hf-dpr:{tmp_path / 'dpr' / 'question_encoder'},max_length=64")
    assert only_q.shared_towers
    np.testing.assert_array_equal(only_q.encode_queries(QUESTIONS),
                                  original.encode_queries(QUESTIONS))
    (tmp_path / "ctx_only").mkdir()
    (tmp_path / "dpr" / "ctx_encoder").rename(tmp_path / "ctx_only" / "ctx_encoder")
    only_ctx = load_encoder(f"hf-dpr:{tmp_path / 'ctx_only'},max_length=64")
    np.testing.assert_array_equal(only_ctx.encode_passages(TITLES, TEXTS, progress=False),
                                  original.encode_passages(TITLES, TEXTS, progress=False))


def test_hf_dpr_reads_vocab_txt_without_tokenizer_json(vocab_file, tmp_path):
    original = _dpr_like(vocab_file)
    save_hf_dpr(original, tmp_path)
    for sub in ("question_encoder", "ctx_encoder"):
        (tmp_path / sub / "tokenizer.json").unlink()
    loaded = load_encoder(f"hf-dpr:{tmp_path},max_length=64")
    assert loaded.tokenize_passages(TITLES, TEXTS) == original.tokenize_passages(TITLES, TEXTS)
    _assert_same_outputs(original, loaded, atol=0)


def test_save_hf_dpr_refuses_mean_pooling(vocab_file, tmp_path):
    with pytest.raises(UserError, match="CLS"):
        save_hf_dpr(_random(vocab_file), tmp_path)


def test_hf_dpr_key_mismatch_names_the_file(vocab_file, tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf_dpr(_dpr_like(vocab_file), tmp_path)
    weights = tmp_path / "question_encoder" / "model.safetensors"
    state = load_file(str(weights))
    state.pop("question_encoder.bert_model.encoder.layer.1.output.dense.weight")
    state["question_encoder.bert_model.extra.weight"] = torch.zeros(2)
    save_file(state, str(weights))
    with pytest.raises(UserError) as err:
        load_encoder(f"hf-dpr:{tmp_path}")
    msg = str(err.value)
    assert str(weights) in msg and "missing" in msg and "unexpected" in msg
    assert "layer.1.output.dense.weight" in msg and "\n" not in msg


def test_hf_dpr_shape_mismatch(vocab_file, tmp_path):
    save_hf_dpr(_dpr_like(vocab_file), tmp_path)
    cfg_path = tmp_path / "ctx_encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["intermediate_size"] = 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="shape"):
        load_encoder(f"hf-dpr:{tmp_path}")


# ------------------------------------------------------- original DPR checkpoint


def _dpr_checkpoint(encoder, params, with_pooler=True):
    """A dict shaped like the original DPR code's CheckpointState."""
    model_dict = {}
    for prefix, tower in (("question_model.", encoder.query_tower),
                          ("ctx_model.", encoder.passage_tower)):
        for key, value in tower.state_dict().items():
            model_dict[prefix + key.replace("bert_model.", "", 1)] = value.clone()
        hidden = tower.bert_model.config.hidden_size
        if with_pooler:  # DPR's HFBertEncoder keeps BERT's pooler (unused)
            model_dict[prefix + "pooler.dense.weight"] = torch.zeros(hidden, hidden)
            model_dict[prefix + "pooler.dense.bias"] = torch.zeros(hidden)
            model_dict[prefix + "embeddings.position_ids"] = torch.arange(128)[None]
    return {"model_dict": model_dict, "optimizer_dict": None, "scheduler_dict": None,
            "offset": 0, "epoch": 3, "encoder_params": params}


def test_dpr_checkpoint_round_trip_namespace(vocab_file, tmp_path):
    original = _dpr_like(vocab_file, projection_dim=8)
    params = argparse.Namespace(pretrained_model_cfg="bert-base-uncased", sequence_length=64,
                                projection_dim=8, do_lower_case=True, encoder_model_type="hf_bert")
    ckpt = tmp_path / "dpr_biencoder.cp"
    torch.save(_dpr_checkpoint(original, params), ckpt)
    loaded = load_encoder(f"dpr:{ckpt},vocab={vocab_file},heads=4")
    assert loaded.max_length == 64 and loaded.kind == "dpr" and loaded.dim == 8
    _assert_same_outputs(original, loaded, atol=0)
    assert loaded.identity()["weights_sha256"] == original.identity()["weights_sha256"]


def test_dpr_checkpoint_dict_params_infers_heads_and_vocab_beside(vocab_file, tmp_path):
    original = _dpr_like(vocab_file, dim=128, heads=2, layers=1)
    ckpt = tmp_path / "hf_bert_base.cp"
    torch.save(_dpr_checkpoint(original, {"sequence_length": 64}, with_pooler=False), ckpt)
    (tmp_path / "vocab.txt").write_bytes(vocab_file.read_bytes())
    loaded = load_encoder(f"dpr:{ckpt}")  # heads = 128 // 64, vocab.txt beside the checkpoint
    assert loaded.query_tower.bert_model.config.num_heads == 2
    _assert_same_outputs(original, loaded, atol=0)


def test_dpr_checkpoint_omegaconf_params(vocab_file, tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    original = _dpr_like(vocab_file, dim=64, heads=1, layers=1)
    params = {"encoder": omegaconf.OmegaConf.create({"sequence_length": 48, "projection_dim": 0,
                                                     "pretrained_model_cfg": "bert-base-uncased"})}
    ckpt = tmp_path / "hydra.cp"
    torch.save(_dpr_checkpoint(original, params), ckpt)
    loaded = load_encoder(f"dpr:{ckpt},vocab={vocab_file}")
    assert loaded.max_length == 48
    np.testing.assert_array_equal(loaded.encode_queries(QUESTIONS), original.encode_queries(QUESTIONS))


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_is_refused_not_run(vocab_file, tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "evil.cp"
    torch.save({"model_dict": {}, "encoder_params": _Evil(marker)}, ckpt)
    with pytest.raises(UserError) as err:
        load_encoder(f"dpr:{ckpt},vocab={vocab_file}")
    assert str(ckpt) in str(err.value) and "refused" in str(err.value)
    assert not marker.exists()
    # the same through an HF folder's pytorch_model.bin
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(BertConfig(vocab_size=10).to_hf()))
    torch.save({"x": _Evil(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(UserError, match="refused"):
        load_encoder(f"hf-dpr:{folder}")
    assert not marker.exists()


def test_dpr_checkpoint_errors(vocab_file, tmp_path):
    ckpt = tmp_path / "model.cp"
    with pytest.raises(UserError, match="not found") as err:
        load_encoder(f"dpr:{ckpt}")
    assert str(ckpt) in str(err.value)
    ckpt.write_bytes(b"not a torch file")
    with pytest.raises(UserError) as err:  # no vocab beside it
        load_encoder(f"dpr:{ckpt}")
    assert str(tmp_path / "vocab.txt") in str(err.value) and "vocab=" in str(err.value)
    with pytest.raises(UserError, match="cannot read") as err:
        load_encoder(f"dpr:{ckpt},vocab={vocab_file}")
    assert str(ckpt) in str(err.value)
    torch.save({"weights": torch.zeros(2)}, ckpt)
    with pytest.raises(UserError, match="model_dict"):
        load_encoder(f"dpr:{ckpt},vocab={vocab_file}")
    odd = _dpr_like(vocab_file, dim=48, heads=4, layers=1)
    torch.save(_dpr_checkpoint(odd, {}), ckpt)
    with pytest.raises(UserError, match="heads=N"):
        load_encoder(f"dpr:{ckpt},vocab={vocab_file}")


# ------------------------------------------------------------------- bad specs


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty"),
    ("bert-base", "unknown encoder spec"),
    ("hf-dpr", "needs a folder"),
    ("hf-dpr:/no/such/dir", "/no/such/dir"),
    ("dpr:/no/such/file.cp", "/no/such/file.cp"),
    ("minilm:/no/such/minilm", "/no/such/minilm"),
    ("random:dim=abc", "integer"),
    ("random:dim=32,layers=1,heads=5", "multiple"),
    ("random:dim=32,layers=1,heads=4,colour=red", "unknown option"),
    ("random:dim=32,layers=1,heads=4,vocab=/no/such/vocab.txt", "/no/such/vocab.txt"),
    ("random:dim=32,layers=1,heads=4,pooling=max", "pooling"),
    ("random:dim=32,layers=1,heads=4,max_length=1000", "max_length"),
    ("minilm,frobnicate=1", "unknown option"),
])
def test_bad_specs_raise_user_error(spec, fragment):
    with pytest.raises(UserError) as err:
        load_encoder(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_hf_dpr_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="model.safetensors") as err:
        load_encoder(f"hf-dpr:{tmp_path}")
    assert str(tmp_path) in str(err.value)


# ------------------------------------------------------- transformers reference


@pytest.fixture(scope="module")
def transformers():
    sys.modules.setdefault("torchaudio", None)
    return pytest.importorskip("transformers")


def _hf_dpr_models(transformers, projection_dim):
    cfg = transformers.DPRConfig(vocab_size=160, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=48,
                                 max_position_embeddings=128, projection_dim=projection_dim)
    torch.manual_seed(0)
    return transformers.DPRQuestionEncoder(cfg).eval(), transformers.DPRContextEncoder(cfg).eval()


def _vocab_of_size(vocab_file, size, path):
    tokens = vocab_file.read_text().split("\n")[:-1]
    assert len(tokens) <= size
    tokens += [f"[unused{i}]" for i in range(size - len(tokens))]
    path.write_text("\n".join(tokens) + "\n")


@pytest.mark.parametrize("projection_dim", [0, 8])
def test_matches_transformers_dpr(transformers, vocab_file, tmp_path, projection_dim):
    q_model, c_model = _hf_dpr_models(transformers, projection_dim)
    for model, sub in ((q_model, "question_encoder"), (c_model, "ctx_encoder")):
        model.save_pretrained(tmp_path / sub)
        _vocab_of_size(vocab_file, 160, tmp_path / sub / "vocab.txt")
    ours = load_encoder(f"hf-dpr:{tmp_path},max_length=64")

    hf_tok = transformers.BertTokenizer(str(tmp_path / "ctx_encoder" / "vocab.txt"))
    q_ids = ours.tokenize_queries(QUESTIONS)
    assert q_ids == [hf_tok(q, truncation=True, max_length=64)["input_ids"] for q in QUESTIONS]
    titles, texts = TITLES[:2] + TITLES[3:], TEXTS[:2] + TEXTS[3:]  # non-empty titles
    p_ids = ours.tokenize_passages(titles, texts)
    assert p_ids == [hf_tok(t, x, truncation=True, max_length=64)["input_ids"]
                     for t, x in zip(titles, texts)]

    with torch.no_grad():
        ids, mask, types = ours.collate(q_ids)
        ref_q = q_model(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
        ids, mask, types = ours.collate(p_ids)
        ref_p = c_model(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
    np.testing.assert_allclose(ours.encode_queries(QUESTIONS), ref_q.numpy(), atol=1e-5)
    np.testing.assert_allclose(ours.encode_passages(titles, texts, progress=False),
                               ref_p.numpy(), atol=1e-5)

    # and back: our exporter's folders load in transformers with the same outputs
    save_hf_dpr(ours, tmp_path / "export")
    q2 = transformers.DPRQuestionEncoder.from_pretrained(tmp_path / "export" / "question_encoder")
    with torch.no_grad():
        ids, mask, types = ours.collate(q_ids)
        again = q2.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).pooler_output
    torch.testing.assert_close(again, ref_q, atol=1e-5, rtol=1e-5)
