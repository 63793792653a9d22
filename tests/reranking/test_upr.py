"""The reader as reranker (UPR) on the tiny world: its scores against the generator's teacher-forced log-likelihood of
the question computed by hand, one pair at a time; batching and chunking; the gradient into the generator against
finite differences; no weights of its own."""
import fairseq.utils
import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.reranking.base import BUILDERS, RerankBatch  # noqa: E402
from rag_plugin.reranking.upr import UprReranker  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402

B, L = 3, 5


@pytest.fixture(scope="module")
def world(tiny_world):
    """A task, a RAG-Token model (float64, eval, no dropout) and a batch of B questions with L candidates each."""
    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=2)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    torch.manual_seed(1)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, train_doc_encoder=False), task)
    model = model.double().eval()
    ds = task.datasets["train"]
    ni = ds.collater([ds[i] for i in range(B)])["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], L)
    batch = RerankBatch(rows=rows, first_stage=scores.float(), src_tokens=ni["src_tokens"],
                        query_tokens=ni["query_tokens"], query_mask=ni["query_mask"])
    return task, model, batch


def _by_hand(model, question, row, decoder_start):
    """log p(question </s> | <s> </s> title </s> text </s>), one encoder and one decoder forward, a Python sum."""
    store = model.retriever.store
    q = [int(t) for t in question if int(t) != model.pad]
    src = ([model.bos, model.eos] + [int(t) for t in store.title_tokens(row)] + [model.eos]
           + [int(t) for t in store.text_tokens(row)] + [model.eos])
    target = q + [model.eos]
    prev = [decoder_start] + target[:-1]
    encoder_out = model.generator.encoder(torch.tensor([src]), src_lengths=torch.tensor([len(src)]))
    logits, _ = model.generator.decoder(torch.tensor([prev]), encoder_out=encoder_out)
    lp = torch.log_softmax(logits[0].double(), dim=-1)
    return sum(float(lp[t, y]) for t, y in enumerate(target))


@pytest.mark.parametrize("target_format", ["plugin", "hf"])
def test_scores_equal_teacher_forced_question_likelihood_by_hand(world, target_format):
    _, model, batch = world
    assert model.cfg.max_source_positions > 40  # the tiny world's passages are never cut: the layout above is whole
    with torch.no_grad():
        scores = UprReranker(target_format)(model, batch)
        start = model.bos if target_format == "hf" else model.eos  # hf targets: the decoder starts with <s>
        expected = [[_by_hand(model, batch.src_tokens[b], int(batch.rows[b, j]), start) for j in range(L)]
                    for b in range(B)]
    assert scores.shape == (B, L) and scores.dtype == torch.float64
    torch.testing.assert_close(scores, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-10)
    assert scores.std() > 0.01  # the candidates are told apart


def test_question_tokens_with_bos_and_eos_score_as_without(world):
    _, model, batch = world
    q = batch.src_tokens
    framed = torch.full((B, q.size(1) + 2), model.pad, dtype=torch.long)
    for b in range(B):
        body = q[b][q[b].ne(model.pad)]
        framed[b, : len(body) + 2] = torch.cat([torch.tensor([model.bos]), body, torch.tensor([model.eos])])
    upr = UprReranker()
    with torch.no_grad():
        plain = upr(model, batch)
        other = upr(model, RerankBatch(rows=batch.rows, first_stage=batch.first_stage, src_tokens=framed))
    torch.testing.assert_close(other, plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_batching_and_chunking_do_not_change_scores(world, dtype, tol):
    _, model, batch = world
    model = model.to(dtype)
    try:
        with torch.no_grad():
            whole = UprReranker(chunk=64)(model, batch)
            for chunk in (1, 2, 7):
                torch.testing.assert_close(UprReranker(chunk=chunk)(model, batch), whole, rtol=tol, atol=tol * 50)
            one_cell = UprReranker(max_cells=1)(model, batch)  # the logits budget alone forces one pair per forward
            torch.testing.assert_close(one_cell, whole, rtol=tol, atol=tol * 50)
            alone = torch.cat([UprReranker()(model, RerankBatch(rows=batch.rows[b: b + 1],
                                                                 first_stage=batch.first_stage[b: b + 1],
                                                                 src_tokens=batch.src_tokens[b: b + 1]))
                               for b in range(B)])
            torch.testing.assert_close(alone, whole, rtol=tol, atol=tol * 50)
            flip = torch.arange(L - 1, -1, -1).expand(B, L)
            picked = UprReranker()(model, batch.select(flip[:, :3]))  # the stage's second call: a subset, any order
            torch.testing.assert_close(picked, whole.gather(1, flip[:, :3]), rtol=tol, atol=tol * 50)
        assert whole.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    finally:
        model.double()


def test_gradient_reaches_the_generator_as_finite_differences_say(world, monkeypatch):
    _, model, batch = world
    # fairseq takes the attention softmax and GELU in float32 whatever the model's dtype: in float64 here, or the
    # scores carry float32 rounding (~1e-7) and central differences at h = 1e-5 see mostly that noise
    monkeypatch.setattr(fairseq.utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim=dim))
    for layer in [*model.generator.encoder.layers, *model.generator.decoder.layers]:
        monkeypatch.setattr(layer, "activation_fn", torch.nn.functional.gelu)
    upr = UprReranker(chunk=4)
    weights = torch.linspace(-1.0, 1.0, B * L, dtype=torch.float64).view(B, L)
    probes = [(model.generator.decoder.layers[0].fc1.weight, (3, 5)),
              (model.generator.encoder.layers[1].self_attn.v_proj.weight, (7, 2))]
    for param, index in probes:
        model.zero_grad()
        (upr(model, batch) * weights).sum().backward()
        analytic = float(param.grad[index])
        h = 1e-5
        with torch.no_grad():
            value = float(param[index])
            param[index] = value + h
            up = float((upr(model, batch) * weights).sum())
            param[index] = value - h
            down = float((upr(model, batch) * weights).sum())
            param[index] = value
        numeric = (up - down) / (2 * h)
        assert abs(analytic) > 1e-6
        assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(numeric)), (analytic, numeric)
    model.zero_grad()


def test_no_weights_of_its_own_and_the_builder(world):
    task, model, _ = world
    upr = BUILDERS["upr"](model.cfg, task)
    assert isinstance(upr, UprReranker) and upr.name == "upr" and upr.target_format == "plugin"
    assert list(upr.parameters()) == [] and list(upr.buffers()) == [] and upr.state_dict() == {}
    model.add_module("upr_probe", upr)  # attached to the model it scores with, it adds nothing to the state dict
    try:
        assert not any(k.startswith("upr_probe") for k in model.state_dict())
    finally:
        del model._modules["upr_probe"]
