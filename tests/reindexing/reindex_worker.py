"""One rank of a fake training loop with ``--reindex-every`` (tests/reindexing/test_reindex.py): a stand-in task and
model whose document tower (a tiny random BERT, the knowledge source's own) moves a known amount each update,
driving the real :class:`rag_plugin.reindexing.reindexer.Reindexer` and its real re-index processes.

    python reindex_worker.py KS OUT.json MODE [EVERY [SWITCH_AFTER]]     (RANK/WORLD_SIZE/MASTER_* set: a gloo rank)

MODE ``run``: steps until version 3 is read (two re-indexes landed) and records the version read at every step;
rank 1 sees a new version only 5 steps after it lands (the ranks must still switch at the same step).
MODE ``kill``: one process; kills itself (SIGKILL) as soon as its re-index process has written a chunk (the re-index
embedding one passage at a time, so that it is still running then).
"""
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rag_plugin.reindexing import reindexer as reindex_module  # noqa: E402
from rag_plugin.reindexing.reindexer import Reindexer  # noqa: E402
from rag_plugin.retrieval.knowledge import KnowledgeSource  # noqa: E402

CHUNK = 32
STEP = 1e-3


def tower_state_at(ks: KnowledgeSource, update: int) -> dict:
    """The document tower's weights after ``update`` updates: the source's own, moved along a fixed direction."""
    base = ks.load_encoder().passage_tower.state_dict()
    g = torch.Generator().manual_seed(7)
    return {k: (v + update * STEP * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v.clone()
            for k, v in base.items()}


class FakeTask:
    def __init__(self, ks_dir: str, every: int, batch_size: int = 16):
        self.cfg = SimpleNamespace(knowledge=ks_dir, reindex_every=every, reindex_threads=1,
                                   reindex_batch_size=batch_size, reindex_wait_minutes=2.0, n_docs=3, retriever="dense")
        self.knowledge = KnowledgeSource(ks_dir)
        self.reindexer = None

    def reopen_knowledge(self, version=None, models=()):
        self.knowledge = self.knowledge.reopened(version)
        for model in models:
            model.use_retrieval(self.retrieval_context(model.cfg))
        return self.knowledge.version

    def retrieval_context(self, model_cfg):
        return SimpleNamespace(retriever=f"retriever of version {self.knowledge.version}",
                               identity={"version": self.knowledge.version})


class FakeModel(torch.nn.Module):
    def __init__(self, ks: KnowledgeSource, train_doc_encoder=True):
        super().__init__()
        self.cfg = SimpleNamespace(train_doc_encoder=train_doc_encoder)
        self.ks = ks
        self.doc_encoder = ks.load_encoder().passage_tower
        self.retriever = "retriever of version 1"

    def use_retrieval(self, context) -> None:
        self.retriever = context.retriever

    def train_to(self, update: int) -> None:
        self.doc_encoder.load_state_dict(tower_state_at(self.ks, update))

    def doc_encoder_state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.doc_encoder.state_dict().items()}


def reindexer_of(task: FakeTask, model) -> Reindexer:
    """As the task's train_step: the re-indexer made at the first step (the module's class: rank 1 patches it)."""
    if task.reindexer is None:
        task.reindexer = reindex_module.Reindexer.for_task(task, model)
    return task.reindexer


class LateSeeing(Reindexer):
    """Sees a new version only ``late`` steps after it landed."""

    late = 5

    def _seen(self, task):
        now = super()._seen(task)
        self._count = getattr(self, "_count", {})
        self._count[now] = self._count.get(now, 0) + 1
        return now if self._count[now] > self.late else task.knowledge.version


def main():
    ks_dir, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    switch_after = int(sys.argv[5]) if len(sys.argv) > 5 else 0  # --reindex-switch-after
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank() if world > 1 else 0
    torch.set_num_threads(1)
    Reindexer.chunk_size = CHUNK
    # kill: the re-index embeds one passage at a time, so that after its first chunk it runs for many of this
    # loop's polls (on an idle machine it could otherwise finish between two polls, and the kill never come)
    task = FakeTask(ks_dir, every, batch_size=1 if mode == "kill" else 16)
    task.cfg.reindex_switch_after = switch_after
    if rank == 1:
        reindex_module.Reindexer = LateSeeing  # this rank's reindexer sees late
    model = FakeModel(task.knowledge)
    read, started = [], []
    for update in range(20000):
        model.train_to(update)
        r = reindexer_of(task, model)
        before = r.started_update
        r.step(task, model, update)
        if r.started_update != before:
            started.append(update)
        read.append([task.knowledge.version, model.retriever])
        if mode == "kill" and r.proc is not None and any((Path(ks_dir) / ".reindex").glob("v*/*.npy")):
            Path(out).write_text(json.dumps({"child": r.proc.pid}))
            os.kill(os.getpid(), signal.SIGKILL)
        if task.knowledge.version >= 3:
            break
        time.sleep(0.001 if mode == "kill" else 0.02)  # kill: watch the chunks closely
    r.close()
    Path(out).write_text(json.dumps({"rank": rank, "read": read, "started": started}))
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
