"""The models in reduced precision on CPU proxies of a GPU's: under torch.autocast (fairseq's --amp) RAG-Token,
RAG-Sequence, FiD, hybrid retrieval and --train-doc-encoder score documents in float32, equal to the float64
product of the vectors they used; every architecture cast to bfloat16 as fairseq's trainer casts it (--bf16) gives
the float32 loss within 1%, float32 doc scores, finite gradients, and the float32 generations with their scores
within 0.01."""
import copy

import pytest
import torch
from fairseq import utils
from fairseq.dataclass.configs import GenerationConfig

import rag_plugin

rag_plugin.register()

from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion  # noqa: E402
from rag_plugin.criterions.reader_cross_entropy import ReaderCrossEntropyCriterion  # noqa: E402
from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.models.rag_lm import RagLMSequenceModel, RagLMTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402

ARCHS = {"rag_token": RagTokenModel, "rag_seq": RagSequenceModel, "fid": FidModel,
         "rag_lm_token": RagLMTokenModel, "rag_lm_seq": RagLMSequenceModel}


def _setup(world, arch, n_docs=3, model_kw=None, **task_kw):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
        data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs, **task_kw))
    task.load_dataset("test")
    torch.manual_seed(0)
    cls = ARCHS[arch]
    config = FidConfig if cls is FidModel else RagConfig
    model = cls.build_model(config(generator_size="tiny", dropout=0.0, **(model_kw or {})), task)
    ds = task.datasets["test"]
    return task, model, ds.collater([ds[i] for i in range(len(ds))])


def _captured_outputs(module):
    """The outputs of every call of ``module`` (its forward hook), in a list."""
    seen = []
    module.register_forward_hook(lambda _m, _inputs, output: seen.append(output))
    return seen


# -------------------------------------------------------------------------------------------- autocast
@pytest.mark.parametrize("arch, task_kw, model_kw", [
    ("rag_token", {}, {}), ("rag_seq", {}, {}), ("fid", {}, {}),
    ("rag_token", {"retriever": "hybrid", "fusion": "weighted"}, {}),
    ("rag_token", {}, {"train_doc_encoder": True}), ("rag_lm_token", {}, {}), ("rag_lm_seq", {}, {})],
    ids=["rag_token", "rag_seq", "fid", "hybrid", "train_doc_encoder", "rag_lm_token", "rag_lm_seq"])
def test_doc_scores_are_float32_products_under_autocast(tiny_world, arch, task_kw, model_kw):
    """fairseq's --amp runs the forward under autocast, where a bmm computes in 16 bits: the doc scores are float32
    and equal (2e-5) to scale x q.d in float64 from the very q and d the forward used (a bfloat16 product is off by
    ~1e-2); the generator's logits are bfloat16 (autocast was on)."""
    task, model, sample = _setup(tiny_world, arch, model_kw=model_kw, **task_kw)
    model.eval()
    queries = _captured_outputs(model.query_encoder)
    documents = _captured_outputs(model.doc_encoder) if model_kw.get("train_doc_encoder") else None
    ni = sample["net_input"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits, extra = model(**ni)
    scores, rows = extra["doc_scores"], extra["doc_rows"]
    assert logits.dtype == torch.bfloat16 and scores.dtype == torch.float32
    q = queries[-1].double()  # float32 (the tower ends in a norm, which autocast runs in float32), from bf16 layers
    scale = model.doc_score_scale
    if task_kw.get("retriever") == "hybrid":
        expected, fused_rows = model.retriever.fuse(q, ni["fixed_doc_rows"].numpy(), ni["fixed_doc_scores"].numpy(),
                                                    rows.size(1), scale)
        assert expected.dtype == torch.float64 and (torch.from_numpy(fused_rows) == rows).all()
    else:
        if documents is not None:
            _, inverse = torch.unique(rows, return_inverse=True)
            d = documents[-1].double()[inverse]                                   # [B, K, D] the trained tower's
        else:
            d = torch.from_numpy(model.retriever.doc_vectors(rows.numpy())).double()  # [B, K, D] stored, float32
        expected = scale * torch.einsum("bkd,bd->bk", d, q)
    torch.testing.assert_close(scores.double(), expected, rtol=2e-5, atol=2e-5)  # float32 rounding, not bfloat16's
    assert not torch.equal(scores.to(torch.bfloat16).float(), scores)  # not values on bfloat16's grid


# ------------------------------------------------------------------------------ the whole model in bfloat16
def _to_bfloat16(sample):
    """fairseq's trainer under --bf16 (Trainer._prepare_sample): every float32 tensor of the batch to bfloat16."""
    return utils.apply_to_sample(lambda t: t.to(torch.bfloat16) if t.dtype is torch.float32 else t,
                                 copy.deepcopy(sample))


def _train_and_generate(task, model, sample, criterion, dtype):
    """fairseq's trainer's cast (model and criterion .to(dtype)), one training forward/backward through the
    criterion, then the task's generator (beam 2) on the first questions."""
    model = copy.deepcopy(model).to(dtype=dtype)
    criterion = criterion.to(dtype=dtype)
    batch = _to_bfloat16(sample) if dtype is torch.bfloat16 else sample
    model.train()
    torch.manual_seed(0)  # the same dropout masks (the query encoder's: the same passages retrieved) in each dtype
    loss, _, _ = criterion(model, batch)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    model.eval()
    with torch.no_grad():
        _, extra = model(**batch["net_input"])
        first = {"id": batch["id"][:3], "net_input": {k: v[:3] if torch.is_tensor(v) else v
                                                      for k, v in batch["net_input"].items()}}
        hypos = task.build_generator([model], GenerationConfig(beam=2, max_len_a=0, max_len_b=6)).generate(
            [model], first)
    best = [(h[0]["tokens"].tolist(), float(h[0]["score"])) for h in hypos]
    return float(loss), extra["doc_scores"], grads, best


@pytest.mark.slow
@pytest.mark.parametrize("arch, n_docs", [("rag_token", 3), ("rag_seq", 3), ("fid", 3), ("rag_token", 0),
                                          ("rag_lm_token", 3), ("rag_lm_seq", 3), ("rag_lm_token", 0)],
                         ids=["rag_token", "rag_seq", "fid", "closed_book", "rag_lm_token", "rag_lm_seq",
                              "closed_book_lm"])
def test_model_cast_to_bfloat16_as_fairseqs_trainer_casts_it(tiny_world, arch, n_docs):
    """--bf16: the whole model (query encoder included) in bfloat16. The loss is the float32 one within 1%, the doc
    scores float32 (and the float32 model's to bfloat16's q precision), every gradient finite (and the query
    encoder's there), the generated answers the float32 model's with scores within 0.01."""
    task, model, sample = _setup(tiny_world, arch, n_docs=n_docs)
    criterion = ReaderCrossEntropyCriterion(task) if arch == "fid" else MarginalNLLCriterion(task)
    loss32, scores32, _, gen32 = _train_and_generate(task, model, sample, criterion, torch.float32)
    loss16, scores16, grads, gen16 = _train_and_generate(task, model, sample, criterion, torch.bfloat16)
    assert abs(loss16 - loss32) <= 0.01 * abs(loss32), (loss16, loss32)
    assert scores16.dtype == torch.float32
    torch.testing.assert_close(scores16, scores32, rtol=2e-2, atol=2e-2)
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    if arch != "fid" and n_docs:  # RAG trains its query encoder through the doc scores
        tower = [g for n, g in grads.items() if n.startswith("query_encoder.")]
        assert tower and all(g is not None for g in tower) and any(g.abs().sum() > 0 for g in tower)
    assert [tokens for tokens, _ in gen16] == [tokens for tokens, _ in gen32]
    for (_, s16), (_, s32) in zip(gen16, gen32):
        assert abs(s16 - s32) <= 0.01, (s16, s32)
