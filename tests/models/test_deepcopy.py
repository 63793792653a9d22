"""A deep copy of a model (fairseq's --store-ema keeps its moving average in ``copy.deepcopy(model)``) shares the
knowledge source, its passage store, vectors and index, the retriever and the retrieval context: the vectors stay
one read-only memory map, the version's lock keeps one owner of its file descriptor, and the copy's weights are
its own. fairseq-train with --store-ema runs end to end in tests/fairseq_hooks/test_torch_ddp.py."""
import copy
import gc
import os
import sys

import numpy as np
import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from tests.tiny_world import layered_knowledge  # noqa: E402


def _task(world, ks=None, **options):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(ks or world["ks"]), n_docs=3, **options)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _batch(task, n=4):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(n)])


@pytest.fixture
def unraisable(monkeypatch):
    """Exceptions raised where Python can only print them (``__del__``: a file descriptor closed twice)."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: seen.append(repr(info.exc_value)))
    return seen


def _assert_shares_retrieval(model, clone, task):
    assert clone.context is model.context
    assert clone.retriever is model.retriever is task.retriever
    ks = task.knowledge
    assert model.context.knowledge is ks
    assert isinstance(ks.vectors, np.memmap) and str(ks.vectors.filename).endswith("vectors.npy")
    # the weights are the copy's own, equal to the model's
    for (name, p), (_, q) in zip(model.named_parameters(), clone.named_parameters(), strict=True):
        assert p.data_ptr() != q.data_ptr(), name
        assert torch.equal(p, q), name


def _lock_is_open(ks):
    os.fstat(ks._in_use._fd)  # raises OSError (EBADF) once closed
    return True


@pytest.mark.parametrize("retriever", ["dense", "hybrid"])
def test_deepcopy_of_a_rag_model_shares_the_knowledge_source(tiny_world, unraisable, retriever):
    task = _task(tiny_world, retriever=retriever)
    torch.manual_seed(0)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task).eval()
    clone = copy.deepcopy(model)
    _assert_shares_retrieval(model, clone, task)
    if retriever == "hybrid":
        assert clone.retriever.bm25 is model.retriever.bm25 and clone.retriever.dense is model.retriever.dense
    sample = _batch(task)
    with torch.no_grad():
        a, extra_a = model(**sample["net_input"])
        b, extra_b = clone(**sample["net_input"])
    assert torch.equal(extra_a["doc_rows"], extra_b["doc_rows"]) and torch.equal(a, b)
    del clone
    gc.collect()
    assert _lock_is_open(task.knowledge) and unraisable == []
    with torch.no_grad():
        again, _ = model(**sample["net_input"])  # the original still reads its mapped source
    assert torch.equal(a, again)


def test_deepcopy_of_a_fid_model_shares_the_knowledge_source(tiny_world, unraisable):
    task = _task(tiny_world)
    torch.manual_seed(0)
    model = FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0, retriever_loss="adist"), task)
    assert model.returns_attention  # trains its query encoder (--retriever-loss adist)
    clone = copy.deepcopy(model)
    _assert_shares_retrieval(model, clone, task)
    del clone
    gc.collect()
    assert _lock_is_open(task.knowledge) and unraisable == []


def test_deepcopy_shares_the_cached_lower_layer_states(tiny_world, unraisable):
    """--doc-encoder-train-layers: the model's cache of the frozen lower layers (a memory map under the knowledge
    source) is shared too."""
    from rag_plugin.models import doc_encoder as doc_side

    task = _task(tiny_world, ks=layered_knowledge(tiny_world, 2))
    torch.manual_seed(0)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, train_doc_encoder=True,
                                                doc_encoder_train_layers=1), task)
    lower = doc_side.lower_states_of(model)
    assert isinstance(lower.states, np.memmap)
    clone = copy.deepcopy(model)
    _assert_shares_retrieval(model, clone, task)
    assert clone._lower_states is lower and doc_side.lower_states_of(clone) is lower
    assert clone.doc_encoder is not model.doc_encoder
    del clone
    gc.collect()
    assert _lock_is_open(task.knowledge) and unraisable == []
