"""FiD + attention distillation (--retriever-loss adist): the forward pass returns each passage's share of the
decoder's cross-attention (the same as generation's teacher-forced shares), criterion reader_cross_entropy adds
the loss to fairseq's label-smoothed cross-entropy (equal to it with no retriever loss), the gradient of the
retriever term reaches the query encoder only, and a checkpoint trained so generates with a fixed encoder."""
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

import rag_plugin

rag_plugin.register()

from rag_plugin.core.net_output import ATTENTION_KEY  # noqa: E402
from rag_plugin.core.retriever_losses import adist_loss  # noqa: E402
from rag_plugin.criterions.reader_cross_entropy import (  # noqa: E402
    ReaderCrossEntropyConfig,
    ReaderCrossEntropyCriterion,
)
from rag_plugin.generation.fid_attention import teacher_forced  # noqa: E402
from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.tasks import pairing  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402


def _task(world, split="train", n_docs=3):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset(split)
    return task


def _criterion(task, loss="adist", weight=1.0, **kw):
    """reader_cross_entropy with --retriever-loss ``loss`` (the criterion's option)."""
    return ReaderCrossEntropyCriterion(task, ReaderCrossEntropyConfig(retriever_loss=loss,
                                                                      retriever_loss_weight=weight, **kw))


def _fid(task, loss="adist", seed=0, **kw):
    """A FiD model built for the criterion's --retriever-loss ``loss``, checked against it as the task does."""
    torch.manual_seed(seed)
    kw.setdefault("query_encoder_lr_scale", 1.0)
    model = FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0, retriever_loss=loss, **kw), task)
    pairing.check_retriever_loss(task.cfg, pairing.BuiltModel.of(model), _criterion(task, loss))
    return model


def _batch(task, split="train"):
    ds = task.datasets[split]
    return ds.collater([ds[i] for i in range(len(ds))])


def test_adist_trains_the_query_encoder_and_returns_attention_shares(tiny_world):
    task = _task(tiny_world)
    model = _fid(task).eval()
    assert model.returns_attention and not model.cfg.freeze_query_encoder
    assert any(p.requires_grad for p in model.query_encoder.parameters())
    sample = _batch(task)
    ni = sample["net_input"]
    with torch.no_grad():
        _, extra = model(**ni)
        shares = extra[ATTENTION_KEY]
        encoder_out, _, _ = model.fused_encode(ni["src_tokens"], ni["query_tokens"], ni["query_mask"])
        b = shares.size(0)
        _, by_generation = teacher_forced(model, encoder_out, torch.arange(b), ni["prev_output_tokens"],
                                          sample["target"], shares.size(1))
    assert shares.shape == extra["doc_scores"].shape
    torch.testing.assert_close(shares.sum(-1), torch.ones(b), atol=1e-5, rtol=0)
    torch.testing.assert_close(shares, by_generation, atol=1e-6, rtol=0)


def test_without_retriever_loss_the_criterion_is_label_smoothed_cross_entropy(tiny_world):
    task = _task(tiny_world)
    model = _fid(task, loss="none").eval()
    sample = _batch(task)
    ours = _criterion(task, loss="none", label_smoothing=0.1)
    fairseqs = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    with torch.no_grad():
        a, size_a, log_a = ours(model, sample)
        b, size_b, log_b = fairseqs(model, sample)
    assert float(a) == pytest.approx(float(b), rel=1e-6) and size_a == size_b
    assert float(log_a["nll_loss"]) == pytest.approx(float(log_b["nll_loss"]), rel=1e-6)
    assert "retriever_loss" not in log_a
    hits = [k for k in log_a if k.startswith("gold_hits_at_")]  # the retriever's recall is logged
    assert hits == ["gold_hits_at_3"] and int(log_a["n_with_gold"]) > 0


def test_adist_loss_is_added_with_its_weight_and_reaches_only_the_query_encoder(tiny_world):
    task = _task(tiny_world)
    model = _fid(task).eval()
    sample = _batch(task)
    criterion = _criterion(task, weight=0.5)
    plain = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.0)
    with torch.no_grad():
        loss, sample_size, log = criterion(model, sample)
        ce, _, _ = plain(model, sample)
        _, extra = model(**sample["net_input"])
        by_formula = adist_loss(extra["doc_scores"], extra[ATTENTION_KEY])
    nsent = sample["target"].size(0)
    assert float(log["retriever_loss"]) == pytest.approx(float(by_formula.sum()), rel=1e-5)
    expected = float(ce) + 0.5 * float(by_formula.sum()) * sample_size / nsent
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(by_formula.sum()) > 0
    # in training the retriever term's gradient reaches the query encoder, never the reader
    model.train()
    _, extra = model(**sample["net_input"])
    assert extra["doc_scores"].requires_grad and not extra[ATTENTION_KEY].requires_grad
    model.zero_grad()
    adist_loss(extra["doc_scores"], extra[ATTENTION_KEY]).sum().backward()
    q_grad = sum(float(p.grad.abs().sum()) for p in model.query_encoder.parameters() if p.grad is not None)
    assert q_grad > 0
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.generator.parameters())


def test_an_adist_checkpoint_generates_with_a_fixed_query_encoder(tiny_world):
    """Trained with adist its query encoder is saved reparametrised (lr scale); generating (no retriever loss)
    the model is plain and fixed, with the same effective weights, so it retrieves the same passages."""
    trained = _fid(_task(tiny_world), query_encoder_lr_scale=0.25)
    with torch.no_grad():
        for p in trained.query_encoder.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # "trained": the stored values move
    state = trained.state_dict()
    assert any(".parametrizations." in k for k in state)
    task = _task(tiny_world, split="test")
    fresh = _fid(task, loss="none", seed=3, query_encoder_lr_scale=0.25)
    assert not any(".parametrizations." in k for k in fresh.state_dict())
    fresh.load_state_dict(state)
    ni = _batch(task, "test")["net_input"]
    trained.eval(), fresh.eval()
    with torch.no_grad():
        a = trained.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        b = fresh.retrieve(ni["query_tokens"], ni["query_mask"], 3)
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=0)
    assert torch.equal(a[1], b[1])


@pytest.mark.parametrize("loss", ["pdist", "emdr2", "loop"])
def test_fid_with_a_likelihood_based_retriever_loss_is_an_error(tiny_world, loss):
    from omegaconf import OmegaConf

    task = _task(tiny_world)
    with pytest.raises(UserError, match=f"--retriever-loss {loss}.*Fusion-in-Decoder"):
        _fid(task, loss=loss)
    # the task checks the model it built against the criterion it builds
    task.build_model(OmegaConf.structured(FidConfig(_name="fid", generator_size="tiny", lr=[1e-3],
                                                    retriever_loss=loss)))
    with pytest.raises(UserError, match=f"--retriever-loss {loss}.*Fusion-in-Decoder"):
        task.build_criterion(OmegaConf.structured(ReaderCrossEntropyConfig(_name="reader_cross_entropy",
                                                                           retriever_loss=loss)))


def test_reader_cross_entropy_on_a_rag_model_is_an_error(tiny_world):
    task = _task(tiny_world)
    rag = pairing.BuiltModel.of(RagTokenModel.build_model(RagConfig(generator_size="tiny"), task))
    with pytest.raises(UserError, match="--criterion reader_cross_entropy"):
        pairing.check_family(rag, _criterion(task, loss="none"))
    pairing.check_family(pairing.BuiltModel.of(_fid(task, loss="none")), _criterion(task, loss="none"))
