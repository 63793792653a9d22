"""The reranking stage on the tiny world, with a reranker whose scores are known (one learned logit per passage):
the kept top-K equals sorting the L first-stage candidates by its scores; its gradient reaches its weights through
RAG's marginal (finite differences, float64); missing rows stay out; BM25 and hybrid first stages hold L candidates;
the options' one-line errors."""
import dataclasses

import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()

from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.reranking.base import RerankBatch, Reranker  # noqa: E402
from rag_plugin.reranking.stage import NO_ROW, rerank  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from tests.models.test_doc_encoder import _marginal_nll, _no_dropout  # noqa: E402

L = 10


class PerPassageReranker(Reranker):
    """score(z) = w[row of z]: a reranker whose order and gradient are known by construction."""

    name = "per_passage"

    def __init__(self, n: int, seed: int = 0):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n, generator=torch.Generator().manual_seed(seed)))

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:
        return self.w[batch.rows.to(self.w.device)]


def _task(world, **kw):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), **{"n_docs": 3, **kw})
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _reranked_model(task, dtype=torch.float32):
    torch.manual_seed(1)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    model.reranker = PerPassageReranker(len(task.knowledge))
    model.use_retrieval(dataclasses.replace(model.context, rerank_candidates=L))
    return model.to(dtype)


def _batch(task, n=4):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(n)])


def test_the_kept_rows_are_the_l_candidates_sorted_by_the_rerankers_scores(tiny_world):
    task = _task(tiny_world)
    model = _reranked_model(task).eval()
    ni = _batch(task)["net_input"]
    scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3, src_tokens=ni["src_tokens"])
    q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
    candidates = task.retriever.search_vectors(q.detach().numpy(), L).rows                  # the first stage
    w = model.reranker.w.detach()
    for got_rows, got_scores, cands in zip(rows.tolist(), scores.tolist(), candidates.tolist(), strict=True):
        expected = sorted(cands, key=lambda r: -float(w[r]))[:3]
        assert got_rows == expected
        assert got_scores == pytest.approx([float(w[r]) for r in expected], abs=0)
    first_top3 = candidates[:, :3].tolist()
    assert rows.tolist() != first_top3  # the reranker chose other passages than the first stage's best


def test_the_marginal_trains_the_reranker_as_finite_differences_say(tiny_world):
    task = _task(tiny_world)
    model = _no_dropout(_reranked_model(task, torch.float64)).train()
    sample = _batch(task)
    model.zero_grad(set_to_none=True)
    _marginal_nll(model, sample).backward()
    grad = model.reranker.w.grad
    _, rows = model.eval().retrieve(sample["net_input"]["query_tokens"], sample["net_input"]["query_mask"], 3,
                                    src_tokens=sample["net_input"]["src_tokens"])
    model.train()
    kept = sorted({r for row in rows.tolist() for r in row})
    assert set(torch.nonzero(grad).flatten().tolist()) <= set(kept)  # only the kept rows' logits reach the loss
    eps = 1e-6
    for r in kept[:3]:
        with torch.no_grad():
            model.reranker.w[r] += eps
            up = float(_marginal_nll(model, sample))
            model.reranker.w[r] -= 2 * eps
            down = float(_marginal_nll(model, sample))
            model.reranker.w[r] += eps
        assert float(grad[r]) == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-8)
        assert float(grad[r]) != 0.0


def test_missing_candidates_stay_below_every_real_one():
    class ByRow(Reranker):
        def forward(self, model, batch):
            return batch.rows.double()

    rows = torch.tensor([[5, -1, 3, -1, 7], [-1, -1, -1, 2, 4]])
    batch = RerankBatch(rows=rows, first_stage=torch.zeros(2, 5, dtype=torch.float64),
                        src_tokens=torch.zeros(2, 1, dtype=torch.long))
    scores, kept = rerank(ByRow(), None, batch, 3, grad=False)
    assert kept[0].tolist() == [7, 5, 3]
    assert kept[1, :2].tolist() == [4, 2] and float(scores[1, 2]) == NO_ROW


def test_a_bm25_first_stage_holds_l_candidates_per_question(tiny_world):
    task = _task(tiny_world, retriever="bm25", reranker="upr", rerank_candidates=12)
    assert task.datasets["train"].fixed_rows.shape[1] == 12
    assert task.text_encoder is None  # the reader as reranker reads no encoder
    for name in ("maxsim", "cross"):  # these read the knowledge source's encoder: the task loads it
        assert _task(tiny_world, retriever="bm25", reranker=name).text_encoder is not None


def test_a_hybrid_first_stage_takes_at_least_l_candidates_per_side(tiny_world):
    from rag_plugin.tasks.hybrid_options import hybrid_candidates

    task = _task(tiny_world, retriever="hybrid", reranker="upr", rerank_candidates=30)
    assert hybrid_candidates(task.cfg) >= 30


@pytest.mark.parametrize("options,needle", [
    ({"reranker": "upr", "rerank_candidates": 2}, "--rerank-candidates 2 is fewer than --n-docs 3"),
    ({"reranker": "upr", "rerank_candidates": 41}, "--rerank-candidates 41 is larger than the knowledge source"),
    ({"rerank_candidates": 8}, "no --reranker is given"),
    ({"reranker": "maxsim", "n_docs": 0}, "--n-docs 0 retrieves none"),
])
def test_bad_options_are_one_line_errors(tiny_world, options, needle):
    with pytest.raises(UserError) as err:
        _task(tiny_world, **options)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_second_reranker_beside_the_trainable_document_encoder_is_refused(tiny_world):
    task = _task(tiny_world, reranker="upr")
    with pytest.raises(UserError, match="--reranker upr would be a second reranker"):
        RagTokenModel.build_model(RagConfig(generator_size="tiny", train_doc_encoder=True), task)


def test_a_checkpoints_reranking_options_fill_what_the_run_did_not_give():
    from rag_plugin.reranking.options import RerankConfig, resolve_from_checkpoint

    saved = {"reranker": "cross", "rerank_candidates": 30, "cross_encoder": "minilm", "cross_encoder_layers": 2}
    cfg = RerankConfig()
    resolve_from_checkpoint(cfg, saved)  # nothing given: the checkpoint's reranker and what shapes its weights
    assert (cfg.reranker, cfg.rerank_candidates, cfg.cross_encoder, cfg.cross_encoder_layers) == \
        ("cross", 30, "minilm", 2)
    cfg = RerankConfig(reranker="cross", rerank_candidates=50)
    resolve_from_checkpoint(cfg, saved)  # the same reranker given: its L kept, its weights' shape the checkpoint's
    assert (cfg.rerank_candidates, cfg.cross_encoder_layers) == (50, 2)
    cfg = RerankConfig(reranker="none")
    resolve_from_checkpoint(cfg, saved)  # reranking switched off by the run
    assert cfg.reranker == "none" and cfg.rerank_candidates is None
    cfg = RerankConfig()
    resolve_from_checkpoint(cfg, None)  # no checkpoint (training): none
    assert cfg.reranker == "none"


def test_another_reranker_than_the_checkpoints_trained_one_is_one_line():
    from rag_plugin.reranking.options import RerankConfig, resolve_from_checkpoint

    with pytest.raises(UserError) as err:
        resolve_from_checkpoint(RerankConfig(reranker="upr"), {"reranker": "cross"})
    assert "--reranker upr: the checkpoint was trained with --reranker cross" in str(err.value)
    assert "\n" not in str(err.value)
    cfg = RerankConfig(reranker="maxsim")
    resolve_from_checkpoint(cfg, {"reranker": "none"})  # trained without one: any reranks zero-shot
    assert cfg.reranker == "maxsim"


@pytest.mark.parametrize("name", ["cross", "maxsim"])
def test_a_real_rerankers_weights_learn_through_the_marginal_as_finite_differences_say(tiny_world, name):
    """RAG-Token with --reranker cross / maxsim built by the task (L=8 -> K=3), float64: the gradient of the marginal
    NLL reaches the reranker's own weights and equals central differences."""
    task = _task(tiny_world, reranker=name, rerank_candidates=8)
    torch.manual_seed(1)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=1.0), task)
    model = _no_dropout(model).double().train()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.reranker.parameters():  # away from the start (the cross-encoder's head is zero there)
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    sample = _batch(task)
    model.zero_grad(set_to_none=True)
    _marginal_nll(model, sample).backward()
    named = dict(model.reranker.named_parameters())
    picks = [("head.weight", (0, 1)), ("head.bias", (0,))] if name == "cross" else \
        [("encoder.layer.0.output.dense.weight", (1, 2)), ("embeddings.LayerNorm.weight", (3,))]
    eps = 1e-5
    for pname, index in picks:
        param = named[pname] if pname in named else named[f"query_encoder.{pname}"]
        grad = float(param.grad[index])
        with torch.no_grad():
            param[index] += eps
            up = float(_marginal_nll(model, sample))
            param[index] -= 2 * eps
            down = float(_marginal_nll(model, sample))
            param[index] += eps
        assert grad != 0.0
        assert grad == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-9)
