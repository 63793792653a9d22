"""--reranker maxsim on the tiny world: the scores against a hand computation over the towers' token vectors; the
lower-layer cache of the passage tower gives the same scores as the passages' texts; the gradient reaches the
reranker's own query tower (finite differences, float64) and never the frozen passage tower, which stays out of the
state dict; the LRU of passage states; one-line errors."""
import copy
import shutil
import types

import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()

from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.optim.lr_scale import plain_module_state  # noqa: E402
from rag_plugin.reranking import maxsim as M  # noqa: E402
from rag_plugin.reranking.base import BUILDERS, RerankBatch  # noqa: E402
from rag_plugin.retrieval.encoders import lower_states as lower_cache  # noqa: E402
from rag_plugin.retrieval.encoders.random import build_random_encoder  # noqa: E402
from tests.conftest import HashingEncoder  # noqa: E402
from tests.models.test_doc_encoder import _batch, _perturb, _task  # noqa: E402
from tests.tiny_world import layered_knowledge  # noqa: E402

#: candidates of 4 questions: repeated across questions and within one
ROWS = torch.tensor([[0, 1, 2, 3, 4], [4, 5, 6, 0, 1], [7, 7, 8, 9, 10], [11, 12, 0, 13, 2]])


def _rerank_batch(task, rows=ROWS):
    ni = _batch(task, n=rows.shape[0])["net_input"]
    return RerankBatch(rows=rows, first_stage=torch.zeros(rows.shape), src_tokens=ni["src_tokens"],
                       query_tokens=ni["query_tokens"], query_mask=ni["query_mask"])


def _holder(task):
    """The smallest object a reranker reads at forward: ``.retriever.store`` (and the model's passage tokenizer)."""
    return types.SimpleNamespace(retriever=task.retriever, context=types.SimpleNamespace(passage_tokenizer=None))


def _hand_scores(reranker, task, batch) -> torch.Tensor:
    """MaxSim by explicit loops in float64: each question and each passage through its tower alone (no padding)."""
    encoder, store = task.text_encoder, task.knowledge.passages
    passage_bert = encoder.passage_tower.bert_model.eval()
    out = torch.zeros(batch.rows.shape, dtype=torch.float64)
    with torch.no_grad():
        for b in range(batch.rows.shape[0]):
            ids = batch.query_tokens[b][batch.query_mask[b]][None]
            q = reranker.query_encoder(ids, torch.ones_like(ids))[0].double()
            for l, r in enumerate(batch.rows[b].tolist()):
                tokens = torch.tensor(encoder.tokenize_passages([store.title(r)], [store.text(r)]))
                d = passage_bert(tokens, torch.ones_like(tokens))[0].double()
                total = 0.0
                for i in range(len(q)):
                    qi = q[i] / q[i].norm()
                    total += max(float(qi @ (d[j] / d[j].norm())) for j in range(len(d)))
                out[b, l] = total
    return out


def test_maxsim_equals_a_hand_computation_over_token_vectors(tiny_world):
    task = _task(tiny_world)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny"), task)  # the model a stage hands
    reranker = BUILDERS["maxsim"](model.cfg, task).eval()
    assert isinstance(reranker, M.MaxSimReranker) and reranker.name == "maxsim"
    _perturb(reranker.query_encoder)  # its own tower: no longer the knowledge source's query tower
    assert not torch.equal(reranker.query_encoder.embeddings.word_embeddings.weight,
                           task.text_encoder.query_tower.bert_model.embeddings.word_embeddings.weight)
    batch = _rerank_batch(task)
    assert not bool(batch.query_mask.all())  # questions of several lengths: padding to exclude
    with torch.no_grad():
        scores = reranker(model, batch)
    assert scores.dtype == torch.float32 and scores.shape == ROWS.shape
    torch.testing.assert_close(scores.double(), _hand_scores(reranker, task, batch), rtol=0, atol=1e-5)
    # float64 towers: float64 scores, equal to the hand computation to rounding
    reranker.double()
    task.text_encoder.passage_tower.double()
    reranker.passages.clear()  # the float32 states it keeps
    with torch.no_grad():
        scores = reranker(model, batch)
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores, _hand_scores(reranker, task, batch), rtol=0, atol=1e-10)
    assert scores[2, 0] == scores[2, 1]  # the same row twice: one score


def _copied_knowledge(world, tmp_path):
    """The tiny world's 2-layer knowledge source, copied (the caches built here stay out of the shared one)."""
    ks = tmp_path / "ks"
    # without the lower-layer caches other tests built in the shared one (--doc-encoder-train-layers)
    shutil.copytree(layered_knowledge(world, 2), ks, ignore=shutil.ignore_patterns(lower_cache.DIR_NAME))
    return {**world, "ks": ks}


def _build_cache(tower, layers, store, encoder, root):
    key = lower_cache.tower_key(plain_module_state(tower), layers, store.sha256)
    return lower_cache.lower_states(tower, layers, key, store, encoder.tokenize_passages, encoder.collate, root,
                                    progress=False)


def test_cached_lower_layers_give_the_scores_of_the_texts(tiny_world, tmp_path):
    world = _copied_knowledge(tiny_world, tmp_path)
    task = _task(world)
    reranker = M.build(RagConfig(), task, cache_size=0).eval()
    _perturb(reranker.query_encoder)
    holder, batch, store = _holder(task), _rerank_batch(task), task.knowledge.passages
    root = world["ks"] / lower_cache.DIR_NAME
    with torch.no_grad():
        from_text = reranker(holder, batch)
        assert reranker.passages.lower(store) is None
        # a cache of other frozen weights is not read
        other = copy.deepcopy(task.text_encoder.passage_tower)
        _perturb(other.bert_model.embeddings)
        _build_cache(other, 1, store, task.text_encoder, root)
        assert reranker.passages.lower(store) is None
        # this tower's: found (built after the reranker: looked for again), its lower layer continued
        _build_cache(task.text_encoder.passage_tower, 1, store, task.text_encoder, root)
        found = reranker.passages.lower(store)
        assert found is not None and found.layers == 1
        calls = []
        continue_from = task.text_encoder.passage_tower.bert_model.continue_from
        task.text_encoder.passage_tower.bert_model.continue_from = lambda *a, **k: calls.append(a) or continue_from(
            *a, **k)
        from_cache = reranker(holder, batch)
    assert calls and all(c[2] == 1 for c in calls)  # the states came from the cache
    torch.testing.assert_close(from_cache, from_text, rtol=0, atol=1e-5)


def test_gradient_reaches_the_query_tower_and_matches_finite_differences(tiny_world):
    task = _task(tiny_world)
    reranker = M.build(RagConfig(query_encoder_lr_scale=0.5), task)
    state = reranker.state_dict()
    assert any(".parametrizations." in k for k in state)  # learns at the query encoder's scale
    # the effective weights start as the knowledge source's query tower's
    torch.testing.assert_close(reranker.query_encoder.encoder.layer[0].output.dense.weight,
                               task.text_encoder.query_tower.bert_model.encoder.layer[0].output.dense.weight)
    reranker.double().eval()  # no dropout: a deterministic loss
    holder, batch = _holder(task), _rerank_batch(task)

    def loss():
        scores = reranker(holder, batch)
        assert scores.dtype == torch.float64
        return -torch.log_softmax(scores, dim=1)[:, 0].sum()

    reranker.zero_grad()
    loss().backward()
    params = dict(reranker.named_parameters())
    for name, index in [("query_encoder.encoder.layer.0.output.dense.parametrizations.weight.original", (0, 1)),
                        ("query_encoder.embeddings.LayerNorm.parametrizations.weight.original", (3,))]:
        p, eps = params[name], 1e-6
        analytic = float(p.grad[index])
        with torch.no_grad():
            old = float(p[index])
            p[index] = old + eps
            up = float(loss())
            p[index] = old - eps
            down = float(loss())
            p[index] = old
        numeric = (up - down) / (2 * eps)
        assert abs(numeric) > 1e-6, name
        assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-8), name


def test_passage_tower_is_frozen_and_out_of_the_state_dict(tiny_world):
    task = _task(tiny_world)
    reranker = M.build(RagConfig(), task).train()
    tower = task.text_encoder.passage_tower
    tower.train()  # whatever mode the task's tower is in: the reranker runs it in eval mode and leaves it so
    ours = set(reranker.state_dict())
    assert ours == {f"query_encoder.{k}" for k in tower.bert_model.state_dict()}
    theirs = {p.data_ptr() for p in tower.parameters()}
    assert not theirs & {p.data_ptr() for p in reranker.parameters()}
    holder, batch = _holder(task), _rerank_batch(task)
    tower.zero_grad()
    states = []
    for _ in range(2):
        reranker.passages.clear()
        scores = reranker(holder, batch)
        scores.sum().backward()
        states.append(reranker.passages.of([0, 5], task.knowledge.passages, "cpu"))
    assert all(p.grad is None for p in tower.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in reranker.parameters())
    assert tower.training  # its mode as it was
    assert all(torch.equal(a, b) for a, b in zip(*states))  # no dropout on the passage side
    assert copy.deepcopy(reranker).passages is reranker.passages  # a model's EMA copy shares it


def test_passage_states_lru_is_bounded_and_reused(tiny_world):
    task = _task(tiny_world)
    reranker = M.build(RagConfig(), task, cache_size=6).eval()
    plain = M.build(RagConfig(), task, cache_size=0).eval()
    holder, batch = _holder(task), _rerank_batch(task)
    computed = []
    compute = reranker.passages._compute
    reranker.passages._compute = lambda tower, ids, *a: computed.append(list(ids)) or compute(tower, ids, *a)
    with torch.no_grad():
        scores = reranker(holder, batch)
        assert len(reranker.passages._cache) == 6
        assert [k[1] for k in reranker.passages._cache] == [8, 9, 10, 11, 12, 13]  # the most recent
        computed.clear()
        kept = batch.select(torch.tensor([[0], [0], [3], [3]]))  # rows 0, 4, 9, 13: two kept, two not
        again = reranker(holder, kept)
    assert computed == [[0, 4]]
    torch.testing.assert_close(again, scores.gather(1, torch.tensor([[0], [0], [3], [3]])), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(plain(holder, batch), scores, rtol=0, atol=0)
    assert not plain.passages._cache


def _one_line(err, *needles):
    text = str(err.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text


def test_one_line_errors(tiny_world):
    task = _task(tiny_world)
    cfg = RagConfig()
    with pytest.raises(UserError) as err:
        M.build(cfg, types.SimpleNamespace(text_encoder=None, knowledge=task.knowledge))
    _one_line(err, "--reranker maxsim reads the knowledge source's encoder")
    with pytest.raises(UserError) as err:  # no BERT towers: no token states
        M.build(cfg, types.SimpleNamespace(text_encoder=HashingEncoder(), knowledge=task.knowledge))
    _one_line(err, "--reranker maxsim", "per-token states")
    other_vocab = types.SimpleNamespace(encoder_identity={**task.knowledge.encoder_identity, "vocab_sha256": "0" * 64},
                                        directory=task.knowledge.directory, root=task.knowledge.root)
    with pytest.raises(UserError) as err:  # a tokenizer other than the knowledge source's
        M.build(cfg, types.SimpleNamespace(text_encoder=task.text_encoder, knowledge=other_vocab))
    _one_line(err, "--reranker maxsim", "another vocabulary")
    assert M.vocab_sha256(task.text_encoder.tokenizer) == task.knowledge.encoder_identity["vocab_sha256"]
    mixed = copy.copy(task.text_encoder)
    mixed.passage_tower = build_random_encoder(dim=16, layers=1, heads=2, intermediate=32).passage_tower
    with pytest.raises(UserError) as err:  # token states of two sizes
        M.build(cfg, types.SimpleNamespace(text_encoder=mixed, knowledge=task.knowledge))
    _one_line(err, "--reranker maxsim", "differ in size")
    batch = _rerank_batch(task)
    batch.query_tokens = batch.query_mask = None
    reranker = M.build(cfg, task)
    with pytest.raises(UserError) as err:
        reranker(_holder(task), batch)
    _one_line(err, "--reranker maxsim", "encoder tokens")
    rows = ROWS.clone()
    rows[1, 4] = -1
    with pytest.raises(ValueError, match="rows of -1"):  # the stage holds missing rows out: never a row's states
        reranker(_holder(task), _rerank_batch(task, rows))


def test_maxsim_cache_holds_every_layer_and_gives_the_scores_of_the_texts(tiny_world, tmp_path):
    """--maxsim-cache: the builder computes every passage's final token states once (a cache of all the tower's
    layers: none left to run at a step), and the scores are those of the texts."""
    world = _copied_knowledge(tiny_world, tmp_path)
    task = _task(world)
    plain = M.build(RagConfig(), task, cache_size=0).eval()
    holder, batch = _holder(task), _rerank_batch(task)
    with torch.no_grad():
        from_text = plain(holder, batch)
    task.cfg.maxsim_cache = True
    cached = M.build(RagConfig(), task, cache_size=0).eval()
    cached.query_encoder.load_state_dict(plain.query_encoder.state_dict())
    found = cached.passages.lower(task.knowledge.passages)
    assert found is not None and found.layers == len(task.text_encoder.passage_tower.bert_model.encoder.layer)
    with torch.no_grad():
        torch.testing.assert_close(cached(holder, batch), from_text, rtol=0, atol=1e-5)
