"""--doc-encoder-chunk: the trained document encoder run over a step's distinct rows a chunk at a time, each chunk
under activation checkpointing while training. Against the one-batch computation (every candidate in one graph):
the same scores, rows and gradients of both towers, with and without the lower-layer cache, with --rerank-top above
and at --n-docs; dropout masks replayed by the recomputation; the activations kept for the backward bounded by one
chunk's; a bad value is a one-line error."""
import functools

import pytest
import torch
import torch.utils.checkpoint

import rag_plugin

rag_plugin.register()

from rag_plugin.core.scores import inner_products  # noqa: E402
from rag_plugin.models import doc_encoder as doc_side  # noqa: E402
from rag_plugin.models.dropout import fast_dropout  # noqa: E402
from rag_plugin.models.rag import RagConfig  # noqa: E402
from tests.models.test_doc_encoder import (  # noqa: E402
    _batch,
    _fairseq_cfg,
    _marginal_nll,
    _model,
    _no_dropout,
    _perturb,
    _task,
)
from tests.tiny_world import layered_knowledge  # noqa: E402


@pytest.fixture(scope="module")
def world(tiny_world):
    """The tiny world (40 passages) with its knowledge source embedded by a 2-layer random encoder."""
    return {**tiny_world, "ks": layered_knowledge(tiny_world, 2)}


def _one_batch_rescored(model, q, k):
    """The computation without chunks (what rescored_retrieval was): all L candidates encoded in one batch, in
    one graph, scored, the top K kept."""
    top = max(k, int(model.cfg.rerank_top))
    rows = torch.from_numpy(model.retriever.search_vectors(q.detach().float().cpu().numpy(), top).rows)
    with torch.set_grad_enabled(model.training and torch.is_grad_enabled()):
        d = doc_side.document_vectors(model.doc_encoder, rows, model.retriever.store, model.context.passage_tokenizer,
                                      q.device, doc_side.lower_states_of(model), chunk=0)
        scores = inner_products(d, q, model.doc_score_scale)
    if top > k:
        best = scores.topk(k, dim=1)
        return best.values, rows.gather(1, best.indices)
    return scores, rows


def _counting_checkpoint(monkeypatch, **kw):
    """Count the chunks run under ``torch.utils.checkpoint`` (``kw``: passed on to it)."""
    calls = []

    def counted(fn, *args, **kwargs):
        calls.append(args[0].shape[0])
        return torch.utils.checkpoint.checkpoint(fn, *args, **{**kwargs, **kw})

    monkeypatch.setattr(doc_side, "checkpoint", counted)
    return calls


def _loss_and_grads(model, sample):
    model.zero_grad(set_to_none=True)
    loss = _marginal_nll(model, sample)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()
             if n.startswith(("query_encoder.", "doc_encoder.")) and p.grad is not None}
    return loss.detach(), grads


CASES = {"rerank": {"rerank_top": 10}, "no_rerank": {},
         "rerank_shared": {"rerank_top": 10, "share_encoder_towers": True},
         "rerank_lower_cache": {"rerank_top": 10, "doc_encoder_train_layers": 1},
         "no_rerank_lower_cache": {"doc_encoder_train_layers": 1}}


@pytest.mark.parametrize("case", CASES)
def test_chunked_scores_and_gradients_equal_the_one_batch_graph(world, monkeypatch, case):
    """float64, no dropout: the marginal NLL, the rows and every gradient of both towers as with all candidates in
    one graph, the kept rows encoded 2 at a time under checkpointing."""
    task = _task(world)
    model = _no_dropout(_model(task, doc_encoder_chunk=2, **CASES[case])).double().train()
    _perturb(model.doc_encoder, std=0.2)  # far from the index's encoder: the re-ranking changes the order
    sample = _batch(task, n=4)
    ni = sample["net_input"]
    calls = _counting_checkpoint(monkeypatch)
    loss, grads = _loss_and_grads(model, sample)
    assert calls and max(calls) == 2  # the kept rows went through the tower in chunks of 2, checkpointed
    scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
    monkeypatch.setattr(doc_side, "rescored_retrieval", _one_batch_rescored)
    ref_loss, ref_grads = _loss_and_grads(model, sample)
    ref_scores, ref_rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
    assert torch.equal(rows, ref_rows)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert set(grads) == set(ref_grads)
    assert any(n.startswith("doc_encoder." if "shared" not in case else "query_encoder.") for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)
    if "rerank" in case and "no_rerank" not in case:  # the re-ranking chose other rows than the index's top K
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
        index_top = task.retriever.search_vectors(q.detach().float().numpy(), 3).rows
        assert any(set(a) != set(b) for a, b in zip(rows.tolist(), index_top.tolist(), strict=True))


def test_evaluation_scores_equal_the_one_batch_scores(world, monkeypatch):
    """Without gradients: chunked (3 rows at a time), nothing checkpointed, the same scores and rows."""
    task = _task(world)
    model = _model(task, doc_encoder_chunk=3, rerank_top=10).eval()
    _perturb(model.doc_encoder, std=0.2)
    ni = _batch(task, n=8)["net_input"]
    calls = _counting_checkpoint(monkeypatch)
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        monkeypatch.setattr(doc_side, "rescored_retrieval", _one_batch_rescored)
        ref_scores, ref_rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
    assert not calls
    assert torch.equal(rows, ref_rows)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-5, atol=1e-5)


def _vectors(model, rows, chunk=0):
    return doc_side.document_vectors(model.doc_encoder, rows, model.retriever.store, model.context.passage_tokenizer,
                                     "cpu", chunk=chunk)


def _vectors_and_grads(model, rows, chunk, seed=5):
    """The document tower's vectors of ``rows`` with ``chunk`` and the gradient of a fixed random projection."""
    torch.manual_seed(seed)
    tower = model.doc_encoder
    tower.zero_grad(set_to_none=True)
    d = _vectors(model, rows, chunk)
    weights = torch.randn(d.shape, generator=torch.Generator().manual_seed(0), dtype=d.dtype)
    (d * weights).sum().backward()
    return d.detach(), {n: p.grad.clone() for n, p in tower.named_parameters() if p.grad is not None}


def test_checkpointed_chunks_replay_the_dropout_masks(world, monkeypatch):
    """Dropout on (the tower's 0.1): the recomputation in the backward draws the forward's masks again (torch's
    RNG state replayed), so the gradient is the one of the same chunks run without checkpointing; without the
    replay it would not be."""
    task = _task(world)
    model = _model(task).double().train()
    rows = torch.arange(24).view(3, 8)
    calls = _counting_checkpoint(monkeypatch)
    d, grads = _vectors_and_grads(model, rows, chunk=5)
    assert calls == [5, 5, 5, 5, 4]
    monkeypatch.setattr(doc_side, "checkpoint", lambda fn, *args, **kw: fn(*args))  # the same chunks, no recompute
    plain_d, plain_grads = _vectors_and_grads(model, rows, chunk=5)
    torch.testing.assert_close(d, plain_d, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-12, atol=1e-14, msg=name)
    with torch.no_grad():  # dropout did act
        assert not torch.allclose(d, _vectors(model.eval(), rows), atol=1e-6)
    model.train()
    _counting_checkpoint(monkeypatch, preserve_rng_state=False)  # other masks in the recomputation: other gradients
    _, wrong = _vectors_and_grads(model, rows, chunk=5)
    assert any(not torch.allclose(wrong[n], g, rtol=1e-6, atol=1e-9) for n, g in grads.items())


def test_the_plugins_dropout_is_replayed_by_checkpointing():
    """rag_plugin/models/dropout.py draws its mask from torch's generator: a checkpointed recomputation replays it."""
    x = torch.randn(64, 128, dtype=torch.float64, requires_grad=True)

    def step(fn):
        torch.manual_seed(3)
        x.grad = None
        y = fn(x)
        (y * torch.arange(y.numel(), dtype=y.dtype).view(y.shape)).sum().backward()
        return y.detach(), x.grad.clone()

    def layer(t):
        return fast_dropout(torch.tanh(t) * 2, 0.3)

    y, g = step(layer)
    y_ckpt, g_ckpt = step(functools.partial(torch.utils.checkpoint.checkpoint, layer, use_reentrant=False))
    assert torch.equal(y, y_ckpt) and torch.equal(g, g_ckpt)
    assert 0.2 < float((y == 0).double().mean()) < 0.4


def _saved_bytes(fn):
    """Bytes of the tensors autograd keeps for the backward while ``fn`` runs (those outside checkpoints)."""
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(sizes)


def test_checkpointed_chunks_keep_one_chunks_activations(world):
    """What the forward keeps for the backward: all rows' activations in one batch (grows with the rows), the
    inputs and the [rows, D] vectors alone with chunks (the activations of a chunk live only while it runs)."""
    task = _task(world)
    model = _model(task).train()

    def kept(n, chunk):
        return _saved_bytes(lambda: _vectors(model, torch.arange(n).view(2, n // 2), chunk))

    one_20, one_40 = kept(20, 0), kept(40, 0)
    chunked_20, chunked_40 = kept(20, 4), kept(40, 4)
    assert one_40 > 1.6 * one_20  # one batch: every row's activations
    assert chunked_40 < one_40 / 10 and chunked_20 < one_20 / 10


def test_chunk_of_zero_or_all_rows_is_one_batch_without_checkpointing(world, monkeypatch):
    task = _task(world)
    model = _model(task).train()
    calls = _counting_checkpoint(monkeypatch)
    for chunk in (0, 24, 100):
        _vectors_and_grads(model, torch.arange(24).view(3, 8), chunk=chunk)
    assert not calls


def test_negative_chunk_is_a_one_line_error(world):
    task = _task(world)
    with pytest.raises(doc_side.UserError) as err:
        task.build_model(_fairseq_cfg(RagConfig(generator_size="tiny", train_doc_encoder=True,
                                                doc_encoder_chunk=-1)))
    assert "--doc-encoder-chunk -1 is negative" in str(err.value) and "\n" not in str(err.value)
