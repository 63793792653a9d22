"""A checkpoint records how it retrieved in training (dense, bm25, hybrid with its fusion); a model loaded to
retrieve otherwise warns, naming the option that retrieves as it was trained."""
import logging

import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.tasks.hybrid_options import retriever_name  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402


def _model(world, retriever):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
        data=str(world["data"]), knowledge=str(world["ks"]), n_docs=3, retriever=retriever))
    torch.manual_seed(0)
    return RagTokenModel.build_model(RagConfig(generator_size="tiny"), task)


def test_retriever_names():
    assert retriever_name(RetrievalAugmentedConfig(retriever="dense")) == "dense"
    assert retriever_name(RetrievalAugmentedConfig(retriever="bm25")) == "bm25"
    assert retriever_name(RetrievalAugmentedConfig(retriever="hybrid")) == "hybrid (--fusion rrf --rrf-k 60.0)"
    assert retriever_name(RetrievalAugmentedConfig(retriever="hybrid", fusion="weighted", fusion_weight=0.3)) == \
        "hybrid (--fusion weighted --fusion-weight 0.3)"


@pytest.mark.parametrize("trained, now, warned", [("hybrid", "dense", True), ("dense", "dense", False),
                                                  ("dense", "hybrid", True)])
def test_a_checkpoint_loaded_to_retrieve_otherwise_warns(tiny_world, caplog, trained, now, warned):
    saved = _model(tiny_world, trained)
    assert saved.knowledge_identity["retriever"].split(" (")[0] == trained
    loading = _model(tiny_world, now)
    with caplog.at_level(logging.WARNING):
        loading.load_state_dict(saved.state_dict())
    lines = [r.getMessage() for r in caplog.records if "retrieving with" in r.getMessage()]
    assert bool(lines) is warned
    if warned:
        assert f"--retriever {trained} to retrieve as it was trained" in lines[0]
