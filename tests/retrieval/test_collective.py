"""Collective search over index shards held by 2 and 4 gloo processes (torchrun): the merged top k of
every rank's questions equals the unsharded Flat index's (rows, scores, stored vectors, exactly), whatever
the shard count (S = N, S > N, S < N), the placement (rank, node) and the batch sizes (one rank with none);
each rank holds only the shards the placement gives it."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.shards import assign_holders, held_by
from tests.conftest import build_hashing_knowledge_source

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("collective_worker.py")
K = 7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collective")
    whole = build_hashing_knowledge_source(tmp, n=403, name="whole")
    return tmp, whole, {s: build_hashing_knowledge_source(tmp, n=403, num_shards=s, name=f"s{s}") for s in (3, 4)}


def _torchrun(tmp, ks, nproc, sizes, placement="rank", nodes=1):
    """Launch the workers (``nodes`` torchrun agents of ``nproc`` processes each, as on separate machines)."""
    queries = np.random.default_rng(len(sizes)).standard_normal((sum(sizes), 64)).astype(np.float32)
    out = tmp / f"run-{ks.directory.name}-{nproc}-{nodes}-{placement}"
    out.mkdir()
    np.save(out / "q.npy", queries)
    port = _free_port()
    env_path = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    agents = []
    for node in range(nodes):
        launch = ["--nnodes", str(nodes), "--node-rank", str(node), "--master-addr", "127.0.0.1"] if nodes > 1 else []
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *launch,
               "--master-port", str(port), str(WORKER), str(ks.directory), str(out / "q.npy"), str(out), str(K),
               placement, ",".join(map(str, sizes))]
        agents.append(subprocess.Popen(cmd, env={**os.environ, **env_path}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    for agent in agents:
        log, _ = agent.communicate(timeout=240)
        assert agent.returncode == 0, log[-3000:]
    return queries, [dict(np.load(out / f"rank{r}.npz")) for r in range(len(sizes))]


@pytest.mark.parametrize("shards, nproc, nodes, placement, sizes", [
    (4, 2, 1, "rank", [5, 9]),          # S > N: two shards per rank
    (3, 2, 1, "rank", [0, 6]),          # S > N, uneven, a rank with no questions
    (3, 4, 1, "node", [4, 0, 3, 1]),    # one node: every rank holds every shard and they split the questions
    (3, 4, 1, "rank", [2, 5, 1, 3]),    # S < N: four ranks over three shards
    (3, 2, 2, "node", [3, 4, 2, 6]),    # two simulated nodes of two processes, each node its shards
])
def test_collective_search_equals_the_unsharded_index(sources, shards, nproc, nodes, placement, sizes):
    tmp, whole, sharded = sources
    queries, results = _torchrun(tmp, sharded[shards], nproc, sizes, placement, nodes)
    exact = whole.local_search()
    start = 0
    world = nproc * nodes
    holders = assign_holders(shards, world, placement, local_world_size=nproc)
    for rank, got in enumerate(results):
        mine = queries[start:start + sizes[rank]]
        start += sizes[rank]
        scores, rows, vectors = exact.search(mine, K, with_vectors=True)
        np.testing.assert_array_equal(got["rows"], rows)
        np.testing.assert_array_equal(got["scores"], scores)
        np.testing.assert_array_equal(got["vectors"], vectors)
        np.testing.assert_array_equal(got["vectors"], whole.vectors[rows])  # the stored d(z) of those rows
        again = exact.search(queries[:rank + 1], K)
        np.testing.assert_array_equal(got["again_rows"], again[1])
        np.testing.assert_array_equal(got["again_scores"], again[0])
        assert got["held"].tolist() == held_by(holders, rank)


def test_brute_force_agrees_with_the_unsharded_reference(sources):
    """The reference itself: the unsharded Flat index's top k is the brute-force top k of q.d."""
    _, whole, _ = sources
    q = np.random.default_rng(5).standard_normal((20, whole.dim)).astype(np.float32)
    scores, rows, _ = whole.local_search().search(q, K)
    brute = q @ np.asarray(whole.vectors).T
    np.testing.assert_allclose(scores, np.take_along_axis(brute, rows, 1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scores, -np.sort(-brute, axis=1)[:, :K], rtol=1e-5, atol=1e-5)


def test_shard_holders_cover_every_shard():
    for world in (1, 2, 3, 4, 8):
        for shards in (1, 2, 3, 5, 8, 13):
            holders = assign_holders(shards, world, "rank")
            assert all(h for h in holders), (shards, world)
            held = [held_by(holders, r) for r in range(world)]
            if shards >= world:
                assert sorted(sum(held, [])) == list(range(shards))  # each shard on exactly one rank
                assert max(map(len, held)) - min(map(len, held)) <= 1
                assert all(h == list(range(h[0], h[-1] + 1)) for h in held)  # contiguous blocks
            else:
                assert all(len(h) == 1 for h in held)
    node = assign_holders(4, 4, "node", local_world_size=2)
    assert node == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert KnowledgeSource  # (imported for the fixtures' type)


def test_collectives_over_nccl_send_tensors_on_the_ranks_own_gpu(sources, monkeypatch):
    """A process group reporting "nccl", on a rank fairseq gave cuda:1 (LOCAL_RANK unset): every tensor handed to a
    collective is asked onto cuda:1 (this machine has no GPU: ``Tensor.to`` notes the device asked for and stays
    on the CPU; the group is one rank whose collectives copy), and the search still equals the unsharded one."""
    import torch
    import torch.distributed as dist

    from rag_plugin.retrieval.collective import CollectiveSearch, collective_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert collective_device("nccl") == torch.device("cuda", 1) and collective_device("gloo").type == "cpu"
    sent = []

    def to(tensor, device, *args, **kw):
        tensor.asked_for = torch.device(device)
        return tensor

    def all_gather(out, tensor, group=None):
        sent.append(tensor.asked_for)
        out[0].copy_(tensor)

    def all_to_all_single(out, tensor, output_split_sizes=None, input_split_sizes=None, group=None):
        sent.append(tensor.asked_for)
        out.copy_(tensor)

    monkeypatch.setattr(torch.Tensor, "to", to)
    for name, fake in (("get_rank", lambda group=None: 0), ("get_world_size", lambda group=None: 1),
                       ("get_backend", lambda group=None: "nccl"), ("all_gather", all_gather),
                       ("all_to_all_single", all_to_all_single)):
        monkeypatch.setattr(dist, name, fake)
    _, whole, sharded = sources
    ks = sharded[3]
    searcher = CollectiveSearch({s: ks.part(s) for s in range(ks.num_shards)}, assign_holders(ks.num_shards, 1),
                                len(ks), ks.dim)
    q = np.random.default_rng(8).standard_normal((5, ks.dim)).astype(np.float32)
    scores, rows, vectors = searcher.search(q, K, with_vectors=True)
    monkeypatch.undo()
    assert sent == [torch.device("cuda", 1)] * 3  # sizes, questions, candidates
    exact = whole.local_search().search(q, K, with_vectors=True)
    np.testing.assert_array_equal(rows, exact[1])
    np.testing.assert_array_equal(scores, exact[0])
    np.testing.assert_array_equal(vectors, exact[2])
