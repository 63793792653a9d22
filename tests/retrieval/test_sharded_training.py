"""The multi-node recipe, simulated on this machine: two torchrun agents (``--nnodes 2``, a localhost c10d
rendezvous), each a "node" whose copy of the knowledge source holds only its own index shards
(``--shard-placement node``), train the tiny world's RAG-Token for a few updates; the losses and the final
parameters equal those of a one-node, two-process run on the unsharded index with the same seed.

Marked ``slow`` (about a minute on 2 cores).
"""
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fairseq_hooks.test_distributed import DRIVER
from tests.tiny_world import sharded_knowledge

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# The driver of test_distributed, reading the knowledge source of its node: "--knowledge DIR/node{GROUP_RANK}".
NODE_DRIVER = DRIVER.replace(
    'sys.argv[0] = "fairseq-train"',
    'sys.argv = [a.replace("{{NODE}}", os.environ["GROUP_RANK"]) for a in sys.argv]\nsys.argv[0] = "fairseq-train"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(world, tmp_path, name, knowledge, nodes, per_node, extra=()):
    run = tmp_path / name
    out = run / "out"
    out.mkdir(parents=True)
    driver = run / "driver.py"
    driver.write_text(NODE_DRIVER.format(python=sys.executable))
    driver.chmod(driver.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, RAG_DDP_TEST_OUT=str(out), FAIRSEQ_TRAIN=str(driver), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    port = _free_port()
    agents = []
    for node in range(nodes):
        launch = ["--nnodes", str(nodes), "--node-rank", str(node), "--rdzv-backend", "c10d",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", name]
        cmd = [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(per_node),
               "--no-python", str(ROOT / "scripts" / "train_cpu_ddp.sh"), str(world["data"]),
               "--user-dir", str(ROOT / "rag_plugin"), "--task", "retrieval_augmented", "--knowledge", knowledge,
               "--arch", "rag_token_tiny", "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam",
               "--lr", "1e-3", "--batch-size", "4", "--max-epoch", "2", "--seed", "1", "--save-dir", str(run / "ckpt"),
               "--no-epoch-checkpoints", "--num-workers", "0", "--no-progress-bar", "--log-interval", "1",
               "--log-format", "simple", "--disable-validation", *extra]
        agents.append(subprocess.Popen(cmd, cwd=run, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True))
    logs = []
    for agent in agents:
        log, _ = agent.communicate(timeout=400)
        assert agent.returncode == 0, log[-4000:]
        logs.append(log)
    log = "\n".join(logs)
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([0-9.]+),", log)]
    hashes = {r: (out / f"rank{r}.sha256").read_text().strip() for r in range(nodes * per_node)}
    return log, losses, hashes


def test_two_nodes_each_holding_its_shards_train_like_one_node(tiny_world, tmp_path):
    sharded = sharded_knowledge(tiny_world, 4)
    for node, missing in ((0, ("00002", "00003")), (1, ("00000", "00001"))):  # each node: only its shards
        copy = tmp_path / f"node{node}"
        shutil.copytree(sharded, copy)
        for shard in missing:
            shutil.rmtree(copy / "shards" / shard)
    log1, losses1, hashes1 = _train(tiny_world, tmp_path, "one_node", str(tiny_world["ks"]), nodes=1, per_node=2)
    log2, losses2, hashes2 = _train(tiny_world, tmp_path, "two_nodes", str(tmp_path / "node{NODE}"), nodes=2,
                                    per_node=1, extra=["--shard-placement", "node"])
    assert "holds index shards [0, 1] of 4 (node placement, shared)" in log2
    # (rank 1 logs warnings only: that its node's copy lacks shards 0 and 1 and it still trained shows it never
    # opened them)
    assert len(losses1) >= 4 and losses1 == losses2, (losses1, losses2)
    assert len(set(hashes1.values())) == 1 and hashes1 == hashes2  # same parameters on every rank of both runs
