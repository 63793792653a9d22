"""FAISS's thread budget in a step (rag_plugin/retrieval/threads.py): torch's threads with the model on the CPU; the
cores of this process divided by the job's processes on the node with the model on any other device, whatever
torch's thread count (torchrun sets 1); and the model's in-step searches (dense, --train-doc-encoder) ask
for the budget of the device their query vectors are on."""
import logging

import numpy as np
import pytest
import torch

from rag_plugin.retrieval import retriever as retriever_module
from rag_plugin.retrieval import threads


@pytest.fixture
def sixteen_cores(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # what torchrun's OMP_NUM_THREADS=1 gives every rank
    yield
    torch.set_num_threads(before)


def test_on_the_cpu_the_budget_is_torchs_threads(sixteen_cores, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert threads.faiss_thread_budget("cpu") == 1
    torch.set_num_threads(3)
    assert threads.faiss_thread_budget(torch.device("cpu")) == 3


def test_on_another_device_the_budget_is_the_cores_per_local_process(sixteen_cores, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=threads.__name__)
    threads._logged.clear()
    assert threads.faiss_thread_budget("meta") == 16  # one process on the node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun --nproc-per-node 4
    assert threads.faiss_thread_budget(torch.device("meta")) == 4
    assert threads.faiss_thread_budget("meta") == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert threads.faiss_thread_budget("meta") == 1  # never 0
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [f"FAISS search threads: {n} (the model is on meta: 16 cores, {local} process(es) of the job on "
                      "this node)" for n, local in ((16, 1), (4, 4), (1, 32))]  # each decision once


def test_fairseqs_own_launcher_counts_one_process_per_gpu_of_the_node(sixteen_cores, monkeypatch):
    """fairseq's spawn launcher (and SLURM with one task per node) sets no LOCAL_WORLD_SIZE: the job's processes on
    the node are min(GPUs, world size)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 16)  # two nodes of 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert threads.local_processes(on_gpu=True) == 8
    assert threads.faiss_thread_budget(torch.device("cuda", 3)) == 2
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)  # 2 of the node's 8 GPUs
    assert threads.faiss_thread_budget("cuda") == 8
    assert threads.faiss_thread_budget("cpu") == 1  # a CPU model shares the cores with torch
    assert threads.local_processes(on_gpu=False) == 1  # what choose_threads divides torch's threads by


def test_the_models_in_step_searches_ask_for_the_budget_of_the_query_device(tiny_world, monkeypatch):
    import rag_plugin

    rag_plugin.register()
    from rag_plugin.models.rag import RagConfig, RagTokenModel
    from tests.models.test_doc_encoder import _batch, _model, _task

    asked, searched = [], []

    def budget(device):
        asked.append(torch.device(device))
        return 7

    monkeypatch.setattr(retriever_module, "faiss_thread_budget", budget)  # what the dense retriever asks
    for train_doc_encoder in (False, True):
        task = _task(tiny_world)
        model = (_model(task) if train_doc_encoder else
                 RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)).eval()
        search = model.retriever.search_vectors

        def spy(queries, k, threads=None, compute_threads=None, with_vectors=False, search=search):
            searched.append(compute_threads)
            return search(queries, k, threads=threads, compute_threads=compute_threads, with_vectors=with_vectors)

        monkeypatch.setattr(model.retriever, "search_vectors", spy)
        ni = _batch(task, n=2)["net_input"]
        with torch.no_grad():
            scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        assert rows.shape == (2, 3) and np.isfinite(scores.numpy()).all()
    assert asked == [torch.device("cpu")] * 2 and searched == [7, 7]
