"""marginal_nll with --retriever-loss: the loss trained is the marginal NLL + weight x the retriever loss per
question, each loss against its formula over the K documents enumerated one by one; the retriever loss
reaches only the query encoder; recall@K of the gold passages; the checks that refuse what trains nothing;
hybrid retrieval inside the model (fused logits, gradient to the query encoder)."""
import math

import numpy as np
import pytest
import torch
from fairseq import metrics

import rag_plugin

rag_plugin.register()

from rag_plugin.criterions.marginal_nll import MarginalNLLConfig, MarginalNLLCriterion  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.tasks import pairing  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

W, TEMP = 0.7, 0.5


def _task(world, n_docs=3, **options):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs, **options)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _criterion(task, **options):
    """marginal_nll with the criterion's options (--retriever-loss and its settings)."""
    return MarginalNLLCriterion(task, MarginalNLLConfig(**options))


def _model(cls, task, seed=1, **cfg):
    torch.manual_seed(seed)
    return cls.build_model(RagConfig(generator_size="tiny", dropout=0.0, **cfg), task)


def _batch(task, n=4):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(n)])


def _per_doc_token_lp(model, sample, rows):
    """log p(y_t | x, z_k, y<t) for each document alone (K=1 forwards): [B, K, T] float64."""
    out = []
    for k in range(rows.size(1)):
        ni = sample["net_input"]
        logits, _ = model(src_tokens=ni["src_tokens"], prev_output_tokens=ni["prev_output_tokens"],
                          fixed_doc_rows=rows[:, k:k + 1], fixed_doc_scores=torch.zeros(rows.size(0), 1), n_docs=1)
        out.append(torch.log_softmax(logits.double(), -1).gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1))
    return torch.stack(out, 1).numpy()


def _log_softmax(x):
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def _reference(name, variant, scores, token_lp, positions):
    """The retriever loss of one question from the formulas (python floats over the K documents)."""
    k = len(scores)
    retr = _log_softmax(np.array(scores) / TEMP)
    seq = np.array([sum(token_lp[z, t] for t in positions) for z in range(k)])
    prior = _log_softmax(np.array(scores))
    if name == "emdr2":
        return -math.log(sum(math.exp(retr[z] + seq[z]) for z in range(k)))
    if name == "pdist":
        target = _log_softmax(seq)
    else:  # loop: -log p(y | x, documents without z), the prior renormalised over the others
        loo = []
        for left in range(k):
            others = [z for z in range(k) if z != left]
            p = np.exp(prior[others]) / np.exp(prior[others]).sum()
            if variant == "sequence":
                loo.append(math.log(sum(p[i] * math.exp(seq[z]) for i, z in enumerate(others))))
            else:
                loo.append(sum(math.log(sum(p[i] * math.exp(token_lp[z, t]) for i, z in enumerate(others)))
                               for t in positions))
        target = _log_softmax(-np.array(loo))
    return float(sum(math.exp(target[z]) * (target[z] - retr[z]) for z in range(k)))


@pytest.mark.parametrize("name", ["pdist", "emdr2", "loop"])
@pytest.mark.parametrize("cls", [RagTokenModel, RagSequenceModel])
def test_loss_is_marginal_plus_weighted_retriever_loss(tiny_world, name, cls):
    task = _task(tiny_world)
    model = _model(cls, task).eval()
    crit = _criterion(task, retriever_loss=name, retriever_loss_weight=W, retriever_temperature=TEMP)
    sample = _batch(task)
    with torch.no_grad():
        loss, sample_size, log = crit(model, sample, reduce=False)
        marginal, _, _ = crit.compute_loss(model, model(**sample["net_input"]), sample)
        _, extra = model(**sample["net_input"])
        rows, scores = extra["doc_rows"], extra["doc_scores"].double().numpy()
        token_lp = _per_doc_token_lp(model, sample, rows)
    mask = sample["target"].ne(task.dictionary.pad())
    per_question = sample_size / sample["target"].size(0)
    expected_total = 0.0
    for b in range(rows.size(0)):
        positions = [t for t in range(mask.size(1)) if mask[b, t]]
        expected = _reference(name, cls.variant, list(scores[b]), token_lp[b], positions)
        expected_total += expected
        assert float(loss[b] - marginal[b]) == pytest.approx(W * per_question * expected, rel=1e-4, abs=1e-5)
    assert float(log["retriever_loss"]) == pytest.approx(expected_total, rel=1e-4, abs=1e-5)


def test_retriever_loss_reaches_only_the_query_encoder(tiny_world):
    from rag_plugin.criterions import retriever_loss as RL

    task = _task(tiny_world)
    model = _model(RagTokenModel, task).train()
    sample = _batch(task)
    crit = _criterion(task, retriever_loss="pdist")
    net_output = model(**sample["net_input"])
    _, _, doc_lp, lprobs = crit.marginal(model, net_output, sample)
    r = crit.compute_retriever_loss(model, net_output, sample, doc_lp, lprobs)
    assert r.shape == (4,) and bool((r > 0).all())
    r.sum().backward()
    assert sum(float(p.grad.abs().sum()) for p in model.query_encoder.parameters() if p.grad is not None) > 0
    assert all(p.grad is None for p in model.generator.parameters())
    with pytest.raises(UserError, match="--retriever-loss adist needs the reader's cross-attention"):
        RL.retriever_loss("adist", net_output[1], 1.0)


def test_recall_at_k_of_the_gold_passages_is_logged(tiny_world):
    task = _task(tiny_world)
    model = _model(RagTokenModel, task).eval()
    sample = _batch(task, n=8)
    with torch.no_grad():
        _, _, log = MarginalNLLCriterion(task)(model, sample)
        _, extra = model(**sample["net_input"])
    gold = sample["gold_rows"]
    hits = sum(any(int(r) in [int(g) for g in gold[b] if g >= 0] for r in extra["doc_rows"][b]) for b in range(8))
    assert int(log["gold_hits_at_3"]) == hits and int(log["n_with_gold"]) == 8
    with metrics.aggregate() as agg:
        MarginalNLLCriterion.reduce_metrics([log])
        values = agg.get_smoothed_values()
    assert values["recall_at_3"] == pytest.approx(hits / 8, abs=1e-4)
    assert "retriever_loss" not in values


class _AttentionReader(RagTokenModel):
    """A RAG model that also hands cross-attention document scores (as FiD would)."""

    cross_attention_doc_scores = True

    def forward(self, *args, **kwargs):
        logits, extra = super().forward(*args, **kwargs)
        b, k = extra["doc_scores"].shape
        extra["doc_attention_scores"] = torch.arange(b * k, dtype=torch.float).view(b, k) / 3.0
        return logits, extra


def test_adist_for_a_model_with_cross_attention_scores(tiny_world):
    task = _task(tiny_world)
    model = _model(_AttentionReader, task).eval()
    crit = _criterion(task, retriever_loss="adist", retriever_temperature=TEMP)
    pairing.check_retriever_loss(task.cfg, pairing.BuiltModel.of(model), crit)  # accepted
    with torch.no_grad():
        _, _, log = crit(model, _batch(task))
        _, extra = model(**_batch(task)["net_input"])
    expected = 0.0
    for s, a in zip(extra["doc_scores"].double().numpy(), extra["doc_attention_scores"].double().numpy()):
        t, r = _log_softmax(a), _log_softmax(s / TEMP)
        expected += float((np.exp(t) * (t - r)).sum())
    assert float(log["retriever_loss"]) == pytest.approx(expected, rel=1e-4)


def _fairseq_cfg(cfg, name):
    """Options as fairseq hands them to the task: a DictConfig naming the model or criterion."""
    from omegaconf import OmegaConf

    cfg._name = name
    return OmegaConf.structured(cfg)


def test_refusals(tiny_world):
    task = _task(tiny_world)
    with pytest.raises(UserError, match=r"--retriever-loss adist distils .* RagTokenModel \(--arch\) computes none"):
        pairing.check_retriever_loss(task.cfg, pairing.BuiltModel.of(_model(RagTokenModel, task)),
                                     _criterion(task, retriever_loss="adist"))
    # the task checks the model it built against the criterion it builds
    task.build_model(_fairseq_cfg(RagConfig(generator_size="tiny", freeze_query_encoder=True), "rag_token"))
    with pytest.raises(UserError, match="--retriever-loss pdist trains the query encoder, and this model's is frozen"):
        task.build_criterion(_fairseq_cfg(MarginalNLLConfig(retriever_loss="pdist"), "marginal_nll"))
    task.build_criterion(_fairseq_cfg(MarginalNLLConfig(), "marginal_nll"))  # no retriever loss: nothing to train
    # (task options, criterion options, message): the task's setup, the criterion's constructor or the pairing
    bad = [({"retriever": "bm25"}, {"retriever_loss": "emdr2"}, "--retriever bm25 has nothing to train"),
           ({"n_docs": 1}, {"retriever_loss": "loop"}, "--n-docs 1 gives it one"),
           ({"retriever": "hybrid", "fusion": "weighted", "fusion_weight": -0.1}, {},
            "--fusion-weight -0.1 is outside"),
           ({"retriever": "hybrid", "hybrid_candidates": 2}, {}, "--hybrid-candidates 2 is fewer than --n-docs 3"),
           ({"retriever": "hybrid", "fusion": "weighted", "fusion_weight": 0.0}, {"retriever_loss": "pdist"},
            "--fusion-weight 0 gives it no weight"),
           ({}, {"retriever_loss": "pdist", "retriever_temperature": 0.0}, "--retriever-temperature 0.0 must be")]
    for options, criterion_options, message in bad:
        with pytest.raises(UserError, match=message):
            bad_task = _task(tiny_world, **{"n_docs": 3, **options})
            pairing.check_retriever_loss(bad_task.cfg, None, _criterion(bad_task, **criterion_options))


@pytest.mark.parametrize("fusion", ["rrf", "weighted"])
def test_hybrid_model_fuses_and_trains_the_query_encoder(tiny_world, fusion):
    from rag_plugin.retrieval.hybrid import HybridRetriever

    task = _task(tiny_world, retriever="hybrid", fusion=fusion, fusion_weight=0.4, hybrid_candidates=6)
    assert isinstance(task.retriever, HybridRetriever) and task.retriever.candidates == 6
    model = _model(RagTokenModel, task).train()
    sample = _batch(task)
    assert sample["net_input"]["fixed_doc_rows"].shape == (4, 6)          # the BM25 candidates
    loss, _, _ = MarginalNLLCriterion(task)(model, sample)
    loss.backward()
    assert sum(float(p.grad.abs().sum()) for p in model.query_encoder.parameters() if p.grad is not None) > 0
    # the same retrieval by hand: query vectors, then HybridRetriever.fuse
    with torch.no_grad():
        _, extra = model.eval()(**sample["net_input"])
        ni = sample["net_input"]
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"]).float()
        logits, rows = task.retriever.fuse(q, ni["fixed_doc_rows"].numpy(), ni["fixed_doc_scores"].numpy(), 3,
                                           model.doc_score_scale)
    assert extra["doc_rows"].tolist() == rows.tolist()
    torch.testing.assert_close(extra["doc_scores"], logits)
    assert float(extra["doc_scores"].max()) <= 10.0 + 1e-5                # scale x fused score in [0, 1]


def test_retriever_loss_start_trains_the_reader_alone_before_it(tiny_world):
    """--retriever-loss-start 3: at updates 0-2 the loss trained is the marginal NLL alone (the retriever loss is
    logged), from update 3 on it includes the weighted retriever loss; the task hands the update to the criterion."""
    task = _task(tiny_world)
    model = _model(RagTokenModel, task).eval()
    crit = _criterion(task, retriever_loss="pdist", retriever_loss_weight=W, retriever_loss_start=3)
    sample = _batch(task)
    per_question = None
    with torch.no_grad():
        for update, joined in ((0, False), (2, False), (3, True), (7, True)):
            crit.set_update(update)
            loss, sample_size, log = crit(model, sample)
            per_question = sample_size / sample["target"].size(0)
            added = float(loss) - float(log["nll_loss"])  # label smoothing 0: loss = nll + the retriever part
            assert float(log["retriever_loss"]) > 0
            expected = W * per_question * float(log["retriever_loss"]) if joined else 0.0
            assert added == pytest.approx(expected, rel=1e-4, abs=1e-4), update
    seen = []
    crit.set_update = seen.append
    task.train_step(sample, model.train(), crit, optimizer=type("Opt", (), {"backward": lambda self, x: None})(),
                    update_num=5)
    assert seen == [5]
    with pytest.raises(UserError, match="--retriever-loss-start"):
        _criterion(task, retriever_loss="pdist", retriever_loss_start=-1)


def test_before_retriever_loss_start_the_query_encoder_gets_a_zero_gradient(tiny_world):
    """FiD + adist + --retriever-loss-start 2: before update 2 the loss trained is the reader's cross-entropy alone,
    and every trainable query-encoder parameter still gets a gradient, all zeros (torch DDP with
    find_unused_parameters=False stops on a parameter without one); from update 2 on it is the adist term's."""
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    from rag_plugin.criterions.reader_cross_entropy import ReaderCrossEntropyConfig, ReaderCrossEntropyCriterion
    from rag_plugin.models.fid import FidConfig, FidModel

    task = _task(tiny_world)
    torch.manual_seed(0)
    model = FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=1.0,
                                           retriever_loss="adist"), task)
    model.train()
    sample = _batch(task)
    crit = ReaderCrossEntropyCriterion(task, ReaderCrossEntropyConfig(retriever_loss="adist", retriever_loss_start=2))
    plain = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.0)
    trainable = [p for p in model.query_encoder.parameters() if p.requires_grad]
    assert trainable
    for update, joined in ((0, False), (1, False), (2, True)):
        crit.set_update(update)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(update)  # the query encoder's dropout: the same masks in both forwards
        loss, _, log = crit(model, sample)
        loss.backward()
        assert all(p.grad is not None for p in trainable), update
        moved = sum(float(p.grad.abs().sum()) for p in trainable)
        torch.manual_seed(update)
        with torch.no_grad():
            ce, _, _ = plain(model, sample)
        if joined:
            assert moved > 0 and float(loss) > float(ce) + 1e-6
        else:
            assert moved == 0.0
            assert float(loss) == pytest.approx(float(ce), rel=1e-6) and float(log["retriever_loss"]) > 0
