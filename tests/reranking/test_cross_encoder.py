"""The cross-encoder reranker on the tiny world: its scores against a hand computation (one BERT forward per pair,
float64), the first stage's logits exactly at initialisation, its gradient against finite differences, truncation,
the builder (a copy of the knowledge encoder's BERT, the lr scale) and its one-line errors."""
import copy
import types

import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()

from rag_plugin.reranking.base import BUILDERS, RerankBatch  # noqa: E402
from rag_plugin.reranking.cross_encoder import CrossEncoderReranker, build_cross_encoder  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402

TINY = "random:dim=32,layers=1,heads=2,intermediate=64"


@pytest.fixture(scope="module")
def task(tiny_world):
    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=3)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _reader(task):
    """What the reranker reads of the model it serves: the retriever's passage store."""
    return types.SimpleNamespace(retriever=task.retriever)


def _batch(task, n=3, width=4, seed=0):
    ds = task.datasets["train"]
    ni = ds.collater([ds[i] for i in range(n)])["net_input"]
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(len(task.knowledge), generator=g)[:width] for _ in range(n)])
    first = torch.randn(n, width, generator=g)
    return RerankBatch(rows=rows, first_stage=first, src_tokens=ni["src_tokens"], query_tokens=ni["query_tokens"],
                       query_mask=ni["query_mask"])


def _reranker(task, seed=1, **kw):
    """A reranker on a copy of the knowledge encoder's BERT, its head perturbed (no longer zero), no dropout."""
    reranker = CrossEncoderReranker(copy.deepcopy(task.text_encoder.query_tower.bert_model), task.text_encoder, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        reranker.head.weight.copy_(torch.randn(reranker.head.weight.shape, generator=g))
        reranker.head.bias.fill_(0.3)
    return reranker.eval()


def _by_hand(task, reranker, batch):
    """Each pair's score in float64: ``[CLS] q [SEP]`` + the passage's ids without [CLS], types 0 then 1, one BERT
    forward each, the head on position 0, + the first-stage logit."""
    bert = copy.deepcopy(reranker.bert).double().eval()
    w, b = reranker.head.weight.double()[0], reranker.head.bias.double()[0]
    store = task.knowledge.passages
    out = torch.zeros(batch.rows.shape, dtype=torch.float64)
    for i in range(batch.rows.shape[0]):
        q = batch.query_tokens[i][batch.query_mask[i]].tolist()
        for j, r in enumerate(batch.rows[i].tolist()):
            p = task.text_encoder.tokenize_passages([store.title(r)], [store.text(r)])[0]
            assert p[0] == 101 and p[-1] == 102  # [CLS] ... [SEP]
            ids = torch.tensor([q + p[1:]])
            kinds = torch.tensor([[0] * len(q) + [1] * (len(p) - 1)])
            with torch.no_grad():
                h = bert(ids, torch.ones_like(ids), kinds)[0, 0]
            out[i, j] = h @ w + b + float(batch.first_stage[i, j])
    return out


def test_scores_equal_a_hand_computation(task):
    batch = _batch(task)
    reranker = _reranker(task, chunk=5)  # 12 pairs: three forwards of pairs sorted by length, scattered back
    with torch.no_grad():
        scores = reranker(_reader(task), batch)
        scores64 = reranker.double()(_reader(task), batch)
    expected = _by_hand(task, reranker, batch)
    assert scores.dtype == torch.float32 and scores.shape == (3, 4)
    assert scores64.dtype == torch.float64
    torch.testing.assert_close(scores64, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(scores.double(), expected, rtol=0, atol=1e-5)
    assert (expected - batch.first_stage.double()).std() > 1e-3  # the head's correction differs between pairs


def test_at_initialisation_the_scores_are_the_first_stage_logits(task):
    reranker = build_cross_encoder(_model_cfg(), _task_with(task, "knowledge")).eval()
    batch = _batch(task, width=5)
    with torch.no_grad():
        scores = reranker(_reader(task), batch)
    assert torch.equal(scores, batch.first_stage)


def _model_cfg(scale=1.0):
    return types.SimpleNamespace(query_encoder_lr_scale=scale, lr=[1e-3])


def _task_with(task, spec, text_encoder=True):
    """The task as the builder reads it, with ``--cross-encoder spec``."""
    return types.SimpleNamespace(cfg=types.SimpleNamespace(cross_encoder=spec), knowledge=task.knowledge,
                                 text_encoder=task.text_encoder if text_encoder else None)


def _loss(reranker, task, batch):
    """A retriever-loss-like objective: -log p(z|x) of each question's candidate 1, and a weighted sum."""
    scores = reranker(_reader(task), batch)
    return -torch.log_softmax(scores, -1)[:, 1].sum() + (scores * torch.linspace(-1, 1, scores.shape[1])).sum()


def test_gradient_reaches_the_bert_and_the_head(task):
    reranker = _reranker(task, chunk=4).double()
    batch = _batch(task)
    batch.first_stage = batch.first_stage.double().requires_grad_(True)
    _loss(reranker, task, batch).backward()
    assert batch.first_stage.grad is None  # the first stage only proposes: detached
    picks = [(reranker.bert.encoder.layer[0].intermediate.dense.weight, (3, 5)),
             (reranker.bert.embeddings.word_embeddings.weight, (2054, 7)),  # "what", in every question
             (reranker.head.weight, (0, 2))]
    eps = 1e-4  # the forward's float64 rounding (~1e-14 on the loss) outweighs eps^2 below this
    for p, index in picks:
        with torch.no_grad():
            old = float(p[index])
            p[index] = old + eps
            up = float(_loss(reranker, task, batch))
            p[index] = old - eps
            down = float(_loss(reranker, task, batch))
            p[index] = old
        numeric = (up - down) / (2 * eps)
        assert abs(numeric) > 1e-6
        assert float(p.grad[index]) == pytest.approx(numeric, rel=1e-6, abs=1e-12)


def test_truncation_keeps_the_question_and_the_final_sep(task):
    reranker = _reranker(task, max_length=16)
    batch = _batch(task, n=2, width=3)
    pairs = reranker.pairs(_reader(task), batch)
    for i, (ids, n_question) in enumerate(pairs):
        q = batch.query_tokens[i // 3][batch.query_mask[i // 3]].tolist()
        assert len(ids) == 16 and n_question == len(q) == 11
        assert ids[:11] == q and ids[-1] == 102 and ids.count(101) == 1
        full = reranker._passage_ids([task.knowledge.passages.title(int(batch.rows.view(-1)[i]))],
                                     [task.knowledge.passages.text(int(batch.rows.view(-1)[i]))])[0]
        assert ids[11:-1] == full[1:5]  # the passage's start, cut from its end
    ids, mask, kinds = reranker.collate(pairs[:1], "cpu")
    assert kinds[0].tolist() == [0] * 11 + [1] * 5 and mask.all()
    # a question too long for the pair keeps its [CLS] and [SEP] and leaves one passage token
    ids, n_question = reranker.pair_ids([101] + list(range(1000, 1020)) + [102], [101, 7, 8, 102])
    assert ids == [101] + list(range(1000, 1012)) + [102, 7, 102] and n_question == 14
    # a short pair is left alone
    assert reranker.pair_ids([101, 5, 102], [101, 7, 8, 102]) == ([101, 5, 102, 7, 8, 102], 3)


def test_builder_copies_the_knowledge_bert_and_scales_its_learning_rate(task):
    assert BUILDERS["cross"] is build_cross_encoder
    reranker = build_cross_encoder(_model_cfg(scale=0.25), _task_with(task, "knowledge"))
    original = task.text_encoder.query_tower.bert_model
    assert reranker.training and reranker.name == "cross"
    ours = reranker.bert.encoder.layer[0].intermediate.dense
    torch.testing.assert_close(ours.weight, original.encoder.layer[0].intermediate.dense.weight, rtol=0, atol=1e-7)
    assert ours.weight.data_ptr() != original.encoder.layer[0].intermediate.dense.weight.data_ptr()
    keys = set(reranker.state_dict())
    assert "bert.encoder.layer.0.intermediate.dense.parametrizations.weight.original" in keys  # scaled: 0.25 x lr
    assert {"head.weight", "head.bias"} <= keys  # the head learns at lr
    assert not any(k.startswith("_") for k in keys)  # the tokenizer is no part of the state


def test_cross_encoder_spec_of_the_same_vocabulary(task):
    reranker = build_cross_encoder(_model_cfg(), _task_with(task, TINY + ",seed=7"))
    knowledge = task.text_encoder.query_tower.bert_model.embeddings.word_embeddings.weight
    assert not torch.allclose(reranker.bert.embeddings.word_embeddings.weight, knowledge)  # another seed's BERT


def test_cross_encoder_of_another_vocabulary_is_one_line_naming_the_option(task, tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "capital"]))
    spec = f"{TINY},vocab={vocab}"
    with pytest.raises(UserError) as err:
        build_cross_encoder(_model_cfg(), _task_with(task, spec))
    message = str(err.value)
    assert "\n" not in message and "--cross-encoder" in message and "vocabulary" in message
    assert "--cross-encoder knowledge" in message  # the fix


def test_no_text_encoder_is_one_line_naming_the_reranker(task):
    with pytest.raises(UserError) as err:
        build_cross_encoder(_model_cfg(), _task_with(task, "knowledge", text_encoder=False))
    assert "\n" not in str(err.value) and "--reranker cross" in str(err.value)


def test_cross_encoder_layers_keeps_the_bottom_layers_of_its_bert(task):
    """--cross-encoder-layers 2 of a 3-layer BERT: the same embeddings and bottom two layers (its states are the full
    BERT's after two layers), the third gone from the state dict; 0 keeps all."""
    spec = "random:dim=32,layers=3,heads=2,intermediate=64"
    full = build_cross_encoder(_model_cfg(), types.SimpleNamespace(
        cfg=types.SimpleNamespace(cross_encoder=spec, cross_encoder_layers=0), knowledge=task.knowledge,
        text_encoder=task.text_encoder))
    small = build_cross_encoder(_model_cfg(), types.SimpleNamespace(
        cfg=types.SimpleNamespace(cross_encoder=spec, cross_encoder_layers=2), knowledge=task.knowledge,
        text_encoder=task.text_encoder))
    assert len(full.bert.encoder.layer) == 3 and len(small.bert.encoder.layer) == 2
    assert small.bert.config.num_layers == 2
    assert not any(k.startswith("bert.encoder.layer.2.") for k in small.state_dict())
    ids = torch.tensor([[2, 5, 6, 7, 3]])
    mask = torch.ones_like(ids)
    full.eval(), small.eval()
    torch.testing.assert_close(small.bert(ids, mask), full.bert(ids, mask, stop=2), rtol=0, atol=0)


def test_cross_encoder_layers_without_the_cross_encoder_is_one_line(tiny_world):
    with pytest.raises(UserError) as err:
        RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
            data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=3, reranker="upr",
            cross_encoder_layers=2))
    assert "--cross-encoder-layers 2 sizes the cross-encoder, and --reranker is upr" in str(err.value)
    assert "\n" not in str(err.value)
