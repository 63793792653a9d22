"""--doc-encoder-train-layers N on the tiny world with a 2-layer encoder: the rows scored from the cached lower
layers as by the whole tower; only the top N layers learn (their gradient against finite differences through the
cache); a served model builds no cache; bad options; and fairseq-train end to end (frozen weights unchanged in the
checkpoint, the cache under the knowledge source)."""
import subprocess

import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()

from rag_plugin.models import doc_encoder as doc_side  # noqa: E402
from rag_plugin.models.rag import RagConfig  # noqa: E402
from rag_plugin.retrieval.encoders import trained_tower  # noqa: E402
from rag_plugin.retrieval.knowledge import KnowledgeSource  # noqa: E402
from tests.models.test_doc_encoder import (  # noqa: E402
    _batch,
    _fairseq_cfg,
    _marginal_nll,
    _model,
    _no_dropout,
    _perturb,
    _task,
    assert_finite_differences,
)
from tests.tasks.test_training import _args, _env, _load  # noqa: E402
from tests.tiny_world import layered_knowledge  # noqa: E402


@pytest.fixture(scope="module")
def world(tiny_world):
    """The tiny world with its knowledge source embedded by a 2-layer random encoder."""
    return {**tiny_world, "ks": layered_knowledge(tiny_world, 2)}


def _frozen_names(tower, trained):
    total = len(tower.bert_model.encoder.layer)
    prefixes = ("bert_model.embeddings.",) + tuple(f"bert_model.encoder.layer.{i}." for i in range(total - trained))
    return {n for n, _ in tower.named_parameters() if n.startswith(prefixes)}


def test_cached_lower_layers_score_as_the_whole_tower(world):
    task = _task(world)
    model = _model(task, doc_encoder_train_layers=1).eval()
    _perturb(model.doc_encoder.bert_model.encoder.layer[1], std=0.2)  # the trained top layer has moved
    ni = _batch(task, n=8)["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        lower = doc_side.lower_states_of(model)
        assert lower is not None and lower.layers == 1 and len(lower) == len(task.knowledge)
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
        whole = doc_side.document_vectors(model.doc_encoder, rows, task.knowledge.passages,
                                          model.context.passage_tokenizer, q.device)  # no cache: the whole tower
    expected = torch.einsum("bkd,bd->bk", whole, q) * model.doc_score_scale
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
    assert (world["ks"] / doc_side.LOWER_STATES_DIR).is_dir()


def test_only_the_top_layers_learn_with_finite_difference_gradients(world):
    task = _task(world)
    model = _no_dropout(_model(task, doc_encoder_train_layers=1)).double().train()
    tower = model.doc_encoder
    frozen = _frozen_names(tower, 1)
    assert frozen and all(not p.requires_grad for n, p in tower.named_parameters() if n in frozen)
    assert all(p.requires_grad for n, p in tower.named_parameters() if n not in frozen)
    # the frozen part is never reparametrised (plain keys in the checkpoint), the trained part is
    assert not any(".parametrizations." in k for k in model.state_dict() if k.startswith(
        ("doc_encoder.bert_model.embeddings.", "doc_encoder.bert_model.encoder.layer.0.")))
    sample = _batch(task, n=3)
    loss = _marginal_nll(model, sample)
    model.zero_grad()
    loss.backward()
    assert doc_side.lower_states_of(model) is not None  # the step ran from the cache
    assert all(p.grad is None for n, p in tower.named_parameters() if n in frozen)
    assert_finite_differences(model, sample, tower, [("bert_model.encoder.layer.1.output.dense.weight", (0, 1)),
                                                     ("bert_model.encoder.layer.1.attention.self.value.bias", (2,))])


def test_a_served_model_uses_the_whole_tower(world):
    task = _task(world)
    model = _model(task, from_checkpoint=True, doc_encoder_train_layers=1)
    assert model.context.serving and doc_side.lower_states_of(model) is None


BAD = [
    ({"train_doc_encoder": False, "doc_encoder_train_layers": 1}, "only --train-doc-encoder has"),
    ({"doc_encoder_train_layers": -1}, "--doc-encoder-train-layers -1 is negative"),
    ({"doc_encoder_train_layers": 1, "share_encoder_towers": True}, "--share-encoder-towers"),
    ({"doc_encoder_train_layers": 3}, "the document encoder has 2 layers"),
]


@pytest.mark.parametrize("kw,needle", BAD)
def test_bad_options_are_one_line_errors(world, kw, needle):
    task = _task(world)
    with pytest.raises(UserError) as err:
        task.build_model(_fairseq_cfg(RagConfig(generator_size="tiny", **{"train_doc_encoder": True, **kw})))
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_fairseq_train_trains_the_top_layer_only(world, tmp_path):
    cmd = _args(world, tmp_path / "ckpt", extra=["--no-epoch-checkpoints", "--dropout", "0", "--train-doc-encoder",
                                                  "--doc-encoder-train-layers", "1", "--max-update", "3"])
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(1), capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "--doc-encoder-train-layers 1: the document encoder's lower 1 layers run once per passage" in log
    ckpt = tmp_path / "ckpt" / "checkpoint_last.pt"
    assert _load(ckpt)["cfg"]["model"]["doc_encoder_train_layers"] == 1
    plain = trained_tower.doc_encoder_state_from_checkpoint(str(ckpt))
    initial = KnowledgeSource(str(world["ks"])).load_encoder().passage_tower.state_dict()
    assert set(plain) == set(initial)
    for k, v in initial.items():
        if k.startswith(("bert_model.embeddings.", "bert_model.encoder.layer.0.")):
            assert torch.equal(plain[k], v), k  # frozen: bit for bit the knowledge source's
    assert any(not torch.allclose(plain[k], v, rtol=0, atol=1e-6) for k, v in initial.items()
               if k.startswith("bert_model.encoder.layer.1."))  # the top layer learned
    caches = [d for d in (world["ks"] / doc_side.LOWER_STATES_DIR).iterdir() if d.is_dir()]
    assert caches and all((d / "meta.json").is_file() for d in caches)
