"""Where and when the trainer's re-index runs and lands (rag_plugin/reindexing/reindexer.py): ``--reindex-device cuda``
is
the rank's own GPU whatever LOCAL_RANK says (fairseq's launcher and SLURM never set it); ``--reindex-switch-after M``
switches at the start update + M exactly, for a re-index that lands long before and for one the trainer must wait
for, on two gloo ranks one of which sees the new version late; and the options' one-line errors."""
import logging
import time
from pathlib import Path

import pytest
import torch

from rag_plugin.reindexing import reindexer as reindex
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.reindexing.reindex_worker import CHUNK, FakeModel, FakeTask, reindexer_of, tower_state_at
from tests.reindexing.test_reindex import _build, run_two_ranks


@pytest.fixture
def four_gpus_rank_two(monkeypatch):
    """A process fairseq gave cuda:2 of 4 (torch.cuda.set_device(2)), LOCAL_RANK unset as under its own launcher."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


class _Started:
    """subprocess.Popen's stand-in: records the command line, ends at once."""

    commands = []

    def __init__(self, cmd, **kw):
        self.commands.append(cmd)
        self.returncode, self.pid = 0, 0

    def poll(self):
        return 0


def _device_given(tmp_path, monkeypatch, device, model=None):
    root = tmp_path / "ks" if (tmp_path / "ks").is_dir() else _build(tmp_path)
    task = FakeTask(str(root), every=2)
    task.cfg.reindex_device = device
    model = model or FakeModel(task.knowledge)
    reindex.check_options(task, model)
    _Started.commands = []
    monkeypatch.setattr(reindex.subprocess, "Popen", _Started)
    r = reindex.Reindexer(root, task.cfg)
    r.step(task, model, 2)
    r.close()
    (cmd,) = _Started.commands
    return cmd[cmd.index("--device") + 1]


def test_reindex_on_cuda_runs_on_the_ranks_own_gpu_not_local_ranks(tmp_path, monkeypatch, four_gpus_rank_two):
    assert _device_given(tmp_path, monkeypatch, "cuda") == "cuda:2"  # was cuda:0: LOCAL_RANK unset
    monkeypatch.setenv("LOCAL_RANK", "0")  # a launcher whose LOCAL_RANK is not the GPU fairseq chose
    assert _device_given(tmp_path, monkeypatch, "cuda") == "cuda:2"
    assert _device_given(tmp_path, monkeypatch, "cuda:1") == "cuda:1"
    assert _device_given(tmp_path, monkeypatch, "cpu") == "cpu"


def test_reindex_on_cuda_follows_the_gpu_the_model_is_on(tmp_path, monkeypatch, four_gpus_rank_two):
    from torch._subclasses.fake_tensor import FakeTensorMode

    ks = _build(tmp_path)
    model = FakeModel(KnowledgeSource(str(ks)))
    with FakeTensorMode():  # a parameter that says cuda:3 without a GPU
        model.on_gpu = torch.nn.Parameter(torch.empty(2, device="cuda:3"))
    assert next(model.parameters()).device == torch.device("cuda", 3)  # the model's device: its first parameter's
    assert _device_given(tmp_path, monkeypatch, "cuda", model) == "cuda:3"


def test_reindex_options_for_devices_and_the_switch_are_one_line_errors(tmp_path):
    task = FakeTask(str(_build(tmp_path)), every=2)
    model = FakeModel(task.knowledge)
    for device, needle in (("cuda", "CUDA is not available"), ("cuda:0", "CUDA is not available"),
                           ("gpu", "is not a device"), ("auto", "say where")):
        task.cfg.reindex_device = device
        with pytest.raises(UserError, match=needle) as err:
            reindex.check_options(task, model)
        assert "\n" not in str(err.value)
    task.cfg.reindex_device, task.cfg.reindex_switch_after = "cpu", -1
    with pytest.raises(UserError, match="--reindex-switch-after must be 0"):
        reindex.check_options(task, model)


def _train(root: Path, every: int, after: int, until_landed: bool, updates: int, logs: list):
    """Steps 1..updates of a fake trainer with --reindex-switch-after; ``until_landed``: after a re-index starts,
    the trainer waits for it to land (a re-index infinitely faster than training); else it steps without pause
    (a re-index far slower). Returns the version read at each update."""
    task = FakeTask(str(root), every=every)
    task.cfg.reindex_switch_after = after
    model = FakeModel(task.knowledge)
    r = reindex.Reindexer(root, task.cfg, log=logs.append)
    task.reindexer = r
    read = []
    for update in range(1, updates + 1):
        model.train_to(update)
        before = r.started_update
        reindexer_of(task, model).step(task, model, update)
        read.append(task.knowledge.version)
        if until_landed and r.started_update != before:
            r.proc.wait(300)
            assert versions.current_version(root) == r.started_version + 1  # landed, not yet read
    r.close()
    return read


@pytest.mark.slow
def test_switch_after_m_updates_is_the_same_update_for_a_fast_and_a_slow_reindex(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(reindex.Reindexer, "chunk_size", CHUNK)
    caplog.set_level(logging.WARNING, logger=reindex.__name__)
    runs = {}
    for speed in ("fast", "slow"):
        (tmp_path / speed).mkdir()
        root = _build(tmp_path / speed)
        logs = []
        runs[speed] = _train(root, every=2, after=3, until_landed=speed == "fast", updates=9, logs=logs)
        waits = [m for m in logs if "waiting for the re-index started at update" in m]
        assert bool(waits) == (speed == "slow"), logs  # the slow one was waited for, at its switch
        assert all("(--reindex-switch-after 3)" in m for m in waits)
        # started at 2, switched at 5; the next started at 6 (the first multiple of 2 from 5), switched at 9
        for version, start in ((2, 2), (3, 6)):
            manifest = KnowledgeSource(str(root), version=version).manifest
            assert manifest["reembedded_from"] == f"training snapshot at update {start}"
            ks1 = KnowledgeSource(str(root), version=1)
            assert manifest["document_tower_sha256"] == state_dict_sha256(tower_state_at(ks1, start))
    assert runs["fast"] == runs["slow"] == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_two_ranks_switch_at_the_start_plus_m_even_when_one_sees_the_version_late(tmp_path):
    """reindex_worker.py's two ranks (rank 1 sees a new version 5 steps after it lands) with
    --reindex-switch-after 40: both switch at exactly start + 40."""
    runs = run_two_ranks(tmp_path, _build(tmp_path), "5", "40")
    assert runs[0]["read"] == runs[1]["read"] and runs[0]["started"] == runs[1]["started"]
    read = [v for v, _ in runs[0]["read"]]
    switches = [step for step in range(1, len(read)) if read[step] != read[step - 1]]
    starts = runs[0]["started"]
    assert [read[s] for s in switches] == [2, 3] and starts[0] == 5
    assert switches == [starts[0] + 40, starts[1] + 40] and starts[1] == switches[0]  # 45 is a multiple of 5


def test_a_failed_reindex_ends_the_wait_without_a_switch(tmp_path, monkeypatch, caplog):
    root = _build(tmp_path)
    monkeypatch.setattr(reindex.Reindexer, "chunk_size", CHUNK)
    task = FakeTask(str(root), every=2)
    task.cfg.reindex_switch_after = 2
    model = FakeModel(task.knowledge)
    good = model.doc_encoder_state
    model.doc_encoder_state = lambda: {**good(), "bert_model.stray": torch.zeros(1)}  # does not fit the tower
    r = reindex.Reindexer(root, task.cfg)
    caplog.set_level(logging.WARNING, logger=reindex.__name__)
    t0 = time.monotonic()
    for update in range(1, 5):
        r.step(task, model, update)
        if r.started_update > 0:  # the first snapshot is taken
            model.doc_encoder_state = good
    r.close()
    assert time.monotonic() - t0 < 120 and task.knowledge.version == 1
    warnings = [rec.getMessage() for rec in caplog.records]
    assert len(warnings) == 1 and "failed (exit 2)" in warnings[0], warnings
    assert r.started_update == 4  # the next one started at the next multiple of --reindex-every
