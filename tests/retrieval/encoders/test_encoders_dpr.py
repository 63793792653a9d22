"""rag_plugin.retrieval.encoders.dpr: the Hugging Face DPR layout (read and written), original DPR
checkpoints (safely loaded), and agreement with transformers' DPR encoders."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import pytest
import torch

from rag_plugin.retrieval.encoders import BertConfig, load_encoder, save_hf_dpr
from rag_plugin.util.errors import UserError
from tests.retrieval.encoders.common import QUESTIONS, TEXTS, TITLES, assert_same_outputs, dpr_like, tiny_random

# ---------------------------------------------------------------- HF DPR layout


def test_hf_dpr_round_trip(vocab_file, tmp_path):
    original = dpr_like(vocab_file, projection_dim=16)
    save_hf_dpr(original, tmp_path / "dpr")
    loaded = load_encoder(f"hf-dpr:{tmp_path / 'dpr'},max_length=64")
    assert not loaded.shared_towers and loaded.passage_format == "pair" and loaded.dim == 16
    assert_same_outputs(original, loaded, atol=0)
    a, b = original.identity(), loaded.identity()
    for key in ("weights_sha256", "passage_weights_sha256", "query_weights_sha256", "vocab_sha256", "dim", "pooling",
                "normalize", "lowercase", "max_length"):
        assert a[key] == b[key], key
    assert b["kind"] == "hf-dpr"


def test_hf_dpr_single_encoder_folder(vocab_file, tmp_path):
    original = dpr_like(vocab_file)
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
    original = dpr_like(vocab_file)
    save_hf_dpr(original, tmp_path)
    for sub in ("question_encoder", "ctx_encoder"):
        (tmp_path / sub / "tokenizer.json").unlink()
    loaded = load_encoder(f"hf-dpr:{tmp_path},max_length=64")
    assert loaded.tokenize_passages(TITLES, TEXTS) == original.tokenize_passages(TITLES, TEXTS)
    assert_same_outputs(original, loaded, atol=0)


def test_save_hf_dpr_refuses_mean_pooling(vocab_file, tmp_path):
    with pytest.raises(UserError, match="CLS"):
        save_hf_dpr(tiny_random(vocab_file), tmp_path)


def test_hf_dpr_key_mismatch_names_the_file(vocab_file, tmp_path):
    from safetensors.torch import load_file, save_file

    save_hf_dpr(dpr_like(vocab_file), tmp_path)
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
    save_hf_dpr(dpr_like(vocab_file), tmp_path)
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
    original = dpr_like(vocab_file, projection_dim=8)
    params = argparse.Namespace(pretrained_model_cfg="bert-base-uncased", sequence_length=64,
                                projection_dim=8, do_lower_case=True, encoder_model_type="hf_bert")
    ckpt = tmp_path / "dpr_biencoder.cp"
    torch.save(_dpr_checkpoint(original, params), ckpt)
    loaded = load_encoder(f"dpr:{ckpt},vocab={vocab_file},heads=4")
    assert loaded.max_length == 64 and loaded.kind == "dpr" and loaded.dim == 8
    assert_same_outputs(original, loaded, atol=0)
    assert loaded.identity()["weights_sha256"] == original.identity()["weights_sha256"]


def test_dpr_checkpoint_dict_params_infers_heads_and_vocab_beside(vocab_file, tmp_path):
    original = dpr_like(vocab_file, dim=128, heads=2, layers=1)
    ckpt = tmp_path / "hf_bert_base.cp"
    torch.save(_dpr_checkpoint(original, {"sequence_length": 64}, with_pooler=False), ckpt)
    (tmp_path / "vocab.txt").write_bytes(vocab_file.read_bytes())
    loaded = load_encoder(f"dpr:{ckpt}")  # heads = 128 // 64, vocab.txt beside the checkpoint
    assert loaded.query_tower.bert_model.config.num_heads == 2
    assert_same_outputs(original, loaded, atol=0)


def test_dpr_checkpoint_omegaconf_params(vocab_file, tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    original = dpr_like(vocab_file, dim=64, heads=1, layers=1)
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
    odd = dpr_like(vocab_file, dim=48, heads=4, layers=1)
    torch.save(_dpr_checkpoint(odd, {}), ckpt)
    with pytest.raises(UserError, match="heads=N"):
        load_encoder(f"dpr:{ckpt},vocab={vocab_file}")


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
                     for t, x in zip(titles, texts, strict=True)]

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
