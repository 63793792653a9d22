"""Two-process CPU data-parallel training (torchrun + scripts/train_cpu_ddp.sh) on the tiny world.

fairseq saves checkpoints on rank 0 only, so a test-only driver (written into tmp_path)
wraps ``checkpoint_utils.save_checkpoint``, which every rank calls, to record each rank's
parameter hash, and ``FairseqTask.train_step`` to record which examples each rank trained on;
then it runs ``fairseq_cli.train.cli_main()`` unchanged. Both ranks must end with identical
parameters, see different examples, and the loss must fall; a rerun resumes on both ranks.

Marked ``slow`` (about 40 s on 2 cores): ``pytest -m "not slow"`` skips it.
"""
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DRIVER = '''\
#!{python}
"""Test-only fairseq-train: records per-rank parameter hashes and trained example ids."""
import hashlib
import json
import os
import sys

import fairseq_cli.train  # first: it sets up fairseq's log format before fairseq is imported
import torch
from fairseq import checkpoint_utils
from fairseq.tasks import FairseqTask

OUT = os.environ["RAG_DDP_TEST_OUT"]
RANK = os.environ.get("RANK", "0")
steps = []

_train_step = FairseqTask.train_step


def train_step(self, sample, *args, **kwargs):
    if not kwargs.get("ignore_grad", False):  # a rank out of batches trains on an ignored dummy
        steps.append(sample["id"].tolist())
    return _train_step(self, sample, *args, **kwargs)


FairseqTask.train_step = train_step

_save = checkpoint_utils.save_checkpoint


def param_hash(model):
    h = hashlib.sha256()
    state = model.state_dict()
    for key in sorted(state):
        value = state[key]
        if torch.is_tensor(value):
            h.update(key.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    model = trainer.get_model()
    task = trainer.task
    digest = param_hash(model)
    record = {{
        "rank": int(RANK), "pid": os.getpid(), "num_updates": trainer.get_num_updates(),
        "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
        "hash": digest, "steps": steps,
        "retriever": type(model.retriever).__name__ if model.retriever is not None else None,
        "retriever_is_tasks": model.retriever is task.retriever,
        "retriever_id": id(task.retriever),
    }}
    with open(os.path.join(OUT, f"rank{{RANK}}.jsonl"), "a") as fh:
        fh.write(json.dumps(record) + "\\n")
    with open(os.path.join(OUT, f"rank{{RANK}}.sha256"), "w") as fh:
        fh.write(digest + "\\n")
    return _save(cfg, trainer, epoch_itr, val_loss)


checkpoint_utils.save_checkpoint = save_checkpoint

sys.argv[0] = "fairseq-train"
fairseq_cli.train.cli_main()
'''


def _torchrun(world, tmp_path, out, max_epoch):
    driver = tmp_path / "ddp_driver.py"
    if not driver.exists():
        driver.write_text(DRIVER.format(python=sys.executable))
        driver.chmod(driver.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, RAG_DDP_TEST_OUT=str(out), FAIRSEQ_TRAIN=str(driver), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           str(ROOT / "scripts" / "train_cpu_ddp.sh"), str(world["data"]),
           "--user-dir", str(ROOT / "rag_plugin"), "--task", "retrieval_augmented",
           "--knowledge", str(world["ks"]), "--arch", "rag_token_tiny", "--criterion", "marginal_nll",
           "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-epoch", str(max_epoch),
           "--seed", "1", "--save-dir", str(tmp_path / "ckpt"), "--no-epoch-checkpoints",
           "--num-workers", "0", "--no-progress-bar", "--log-interval", "1", "--log-format", "simple"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    records = [[json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    return log, records


def test_two_rank_cpu_training_keeps_ranks_identical(tiny_world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    log, records = _torchrun(tiny_world, tmp_path, out, max_epoch=2)

    # every rank hashed its parameters at every save (end of epochs 1 and 2)
    hashes = [(out / f"rank{r}.sha256").read_text().strip() for r in (0, 1)]
    assert len(hashes[0]) == 64 and hashes[0] == hashes[1]
    assert len(records[0]) == len(records[1]) == 2
    for r0, r1 in zip(*records):
        assert r0["num_updates"] == r1["num_updates"] > 0
        assert r0["hash"] == r1["hash"], "ranks diverged"
        assert r0["world_size"] == r1["world_size"] == 2
    assert records[0][0]["hash"] != records[0][1]["hash"], "parameters did not change in epoch 2"
    first, last = records[0][-1], records[1][-1]

    # one process per rank, each with its own retriever (built by its own task)
    assert first["pid"] != last["pid"]
    assert first["retriever"] == last["retriever"] == "DenseRetriever"
    assert first["retriever_is_tasks"] and last["retriever_is_tasks"]

    # same seed, different shards: at each update the ranks train on disjoint examples
    steps0, steps1 = first["steps"], last["steps"]
    assert steps0 and steps1
    assert not set(steps0[0]) & set(steps1[0])
    ids0 = {i for s in steps0 for i in s}
    ids1 = {i for s in steps1 for i in s}
    assert ids0 | ids1 == set(range(30))  # no training example dropped (30 in the tiny world's train split)

    # the global batch is the sum of the ranks' batches (rank 0 logs the aggregate)
    inner = re.findall(r"train_inner \| epoch 001:\s+1 / \d+ .*?bsz=(\d+).*?num_updates=1\b", log)
    assert inner, log[-4000:]
    assert int(inner[0]) == len(steps0[0]) + len(steps1[0])  # (partial batches are kept, so not always 16)

    # training made progress
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([0-9.]+),", log)]
    assert len(losses) >= 4, log[-4000:]
    assert losses[-1] < losses[0]
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").is_file()

    # rerun with one more epoch: both ranks resume from checkpoint_last.pt and stay identical
    saved = first["num_updates"]
    log2, records2 = _torchrun(tiny_world, tmp_path, out, max_epoch=3)
    assert re.search(rf"Loaded checkpoint \S+checkpoint_last\.pt \(epoch 3 @ {saved} updates\)", log2), log2[-4000:]
    updates = [int(x) for x in re.findall(r"train_inner \|.*?num_updates=(\d+)", log2)]
    assert updates and updates[0] == saved + 1
    r0, r1 = records2[0][-1], records2[1][-1]
    assert r0["num_updates"] == r1["num_updates"] > saved
    assert r0["hash"] == r1["hash"], "ranks diverged after resume"
