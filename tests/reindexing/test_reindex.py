"""``--reindex-every`` (rag_plugin/reindexing/reindexer.py): on 2 gloo ranks the re-index runs in background processes
and every rank switches to the new version at the same step, even when one rank sees it later; each version
landed holds the passages embedded by the snapshot it was started from; a failed re-index is one warning and the
next one succeeds; a trainer killed during a re-index leaves the previous version current and byte-identical and no
process behind; the options' one-line errors (also from a real fairseq-train)."""
import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.reindexing import reindexer as reindex
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.encoders import load_encoder
from rag_plugin.retrieval.encoders.weights import load_tower_state, state_dict_sha256
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load
from tests.conftest import ROOT, synthetic_passages, write_jsonl
from tests.indexing.test_reembed import _digest
from tests.reindexing.reindex_worker import CHUNK, FakeModel, FakeTask, reindexer_of, tower_state_at

SPEC = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0,max_length=32"
WORKER = Path(__file__).with_name("reindex_worker.py")
N = 150


def _build(tmp: Path, n: int = N) -> Path:
    src = write_jsonl(tmp / "p.jsonl", synthetic_passages(n, seed=6))
    build_knowledge_source(str(tmp / "ks"), BuildSettings(passages=str(src), encoder=SPEC),
                           BuildOptions(shard_size=CHUNK, progress=False, log=lambda m: None))
    return tmp / "ks"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected_vectors(ks: KnowledgeSource, state: dict) -> np.ndarray:
    encoder = load_encoder(SPEC)
    load_tower_state(encoder.passage_tower, state, "test", "document tower")
    return encoder.encode_passages([ks.passages.title(r) for r in range(N)],
                                   [ks.passages.text(r) for r in range(N)], progress=False)


def run_two_ranks(tmp_path, root, *worker_args):
    """reindex_worker.py's ``run`` on two gloo ranks (``worker_args`` after it); each rank's JSON record."""
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(root), str(tmp_path / f"out{r}.json"), "run",
                               *worker_args],
                              env=_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]


def test_two_ranks_switch_at_the_same_step_to_what_their_snapshot_embeds(tmp_path):
    root = _build(tmp_path)
    runs = run_two_ranks(tmp_path, root, "5")
    assert runs[0]["read"] == runs[1]["read"]  # the same version (and retriever) at every step on both ranks
    assert runs[0]["started"] == runs[1]["started"]
    read = [v for v, _ in runs[0]["read"]]
    switches = [step for step in range(1, len(read)) if read[step] != read[step - 1]]
    assert [read[s] for s in switches] == [2, 3]
    assert all(r == f"retriever of version {v}" for v, r in runs[0]["read"])  # the model's retriever followed
    ks1 = KnowledgeSource(str(root), version=1)
    for version, switch in zip((2, 3), switches):
        manifest = KnowledgeSource(str(root), version=version).manifest
        start = int(manifest["reembedded_from"].rsplit(" ", 1)[1])
        assert start in runs[0]["started"] and start % 5 == 0 and start < switch
        state = tower_state_at(ks1, start)
        assert manifest["document_tower_sha256"] == state_dict_sha256(state)
        assert manifest["previous_version"] == version - 1
    # rank 1 saw each version 5 steps after rank 0 did: neither switched before both saw it
    last = KnowledgeSource(str(root), version=3)
    start = int(last.manifest["reembedded_from"].rsplit(" ", 1)[1])
    np.testing.assert_allclose(np.asarray(last.vectors), _expected_vectors(ks1, tower_state_at(ks1, start)),
                               atol=1e-5, rtol=0)
    assert last.passages.sha256 == ks1.passages.sha256
    assert not list((root / ".reindex").glob("v*-*"))  # the chunks of the versions landed are gone


def test_a_trainer_killed_during_a_reindex_leaves_the_version_current_and_no_process(tmp_path):
    # ten times the passages: after its first chunk the re-index (one passage per forward) runs on for ~45 chunks,
    # long enough that the trainer's kill comes before it lands even when the trainer is not scheduled for a while
    root = _build(tmp_path, n=10 * N)
    digest = _digest(root)
    proc = subprocess.run([sys.executable, str(WORKER), str(root), str(tmp_path / "out.json"), "kill", "2"],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-3000:]
    child = json.loads((tmp_path / "out.json").read_text())["child"]
    deadline = time.monotonic() + 60
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    status = Path(f"/proc/{child}/status")
    assert not status.exists() or "zombie" in status.read_text()  # killed with the trainer (PDEATHSIG)
    assert versions.current_version(root) == 1 and versions.versions(root) == [1] and _digest(root) == digest
    assert KnowledgeSource(str(root)).version == 1


def test_a_failed_reindex_is_one_warning_and_the_next_one_lands(tmp_path, caplog, monkeypatch):
    root = _build(tmp_path)
    monkeypatch.setattr(reindex.Reindexer, "chunk_size", CHUNK)
    task = FakeTask(str(root), every=2)
    model = FakeModel(task.knowledge)
    good = model.doc_encoder_state
    stray = {"bert_model.stray.weight": good()["bert_model.embeddings.word_embeddings.weight"][:2].clone()}
    model.doc_encoder_state = lambda: {**good(), **stray}  # the first snapshot does not fit the tower
    logs = []
    r = reindex.Reindexer(root, task.cfg, log=logs.append)
    task.reindexer = r
    caplog.set_level(logging.WARNING, logger="rag_plugin.reindexing.reindexer")
    for update in range(1, 3000):
        model.train_to(update)
        if r.started_update > 0:  # the first snapshot is taken
            model.doc_encoder_state = good
        reindexer_of(task, model).step(task, model, update)
        if task.knowledge.version == 2:
            break
        time.sleep(0.02)
    if r.proc is not None:  # it made version 2 current: it ends (the log line comes once it has)
        r.proc.wait(120)
        r._poll(task)
    r.close()
    warnings = [rec.getMessage() for rec in caplog.records]
    assert len(warnings) == 1 and "failed (exit 2)" in warnings[0] and ".log" in warnings[0], warnings
    log_file = warnings[0].split("see ")[1].split(";")[0]
    assert "weights do not match the model" in Path(log_file).read_text()
    assert task.knowledge.version == 2 and model.retriever == "retriever of version 2"
    assert any("wrote knowledge version 2" in m for m in logs) and any("is read from update" in m for m in logs)


def test_reindex_options_are_refused_when_they_cannot_help(tmp_path):
    root = _build(tmp_path)
    task = FakeTask(str(root), every=2)
    with pytest.raises(UserError, match="needs --train-doc-encoder"):
        reindex.check_options(task, FakeModel(task.knowledge, train_doc_encoder=False))
    task.cfg.retriever = "bm25"
    with pytest.raises(UserError, match="needs dense retrieval"):
        reindex.check_options(task, FakeModel(task.knowledge))
    task.cfg = SimpleNamespace(**{**vars(task.cfg), "retriever": "dense", "reindex_every": -1})
    with pytest.raises(UserError, match="0 or more"):
        reindex.check_options(task, FakeModel(task.knowledge))


def test_fairseq_train_refuses_reindex_every_without_a_trained_document_encoder(tiny_world, tmp_path):
    from tests.tasks.test_training import _args, _run

    code, _, err = _run(_args(tiny_world, tmp_path / "ck", extra=["--reindex-every", "2", "--max-update", "2"]),
                        cwd=str(tmp_path), threads=1)
    assert code == 2, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "needs --train-doc-encoder" in lines[0] and "Traceback" not in err, err[-3000:]


def test_wait_at_exit_lets_the_running_reindex_land(tmp_path, monkeypatch):
    root = _build(tmp_path)
    monkeypatch.setattr(reindex.Reindexer, "chunk_size", CHUNK)
    task = FakeTask(str(root), every=2)
    task.cfg.reindex_wait_at_exit = True
    model = FakeModel(task.knowledge)
    model.train_to(2)
    r = reindexer_of(task, model)
    r.step(task, model, 2)
    assert r.proc is not None
    r.close()  # what atexit does at the end of training
    landed = KnowledgeSource(str(root))
    assert landed.version == 2 and landed.manifest["reembedded_from"] == "training snapshot at update 2"
    assert landed.manifest["document_tower_sha256"] == state_dict_sha256(model.doc_encoder_state())


@pytest.mark.parametrize("train_layers", [0, 1])
def test_fairseq_train_reindexes_with_the_trained_document_encoder(tiny_world, tmp_path, train_layers):
    """A real fairseq-train with --train-doc-encoder --reindex-every 2 writes version 2 from the tower of its
    checkpoint at update 2 (waited for at exit); with --doc-encoder-train-layers 1 (a 2-layer encoder) the re-index
    runs the top layer on the cached states of the lower one, with the same vectors. The whole-tower run has
    --reindex-switch-after 1: the trainer waits at update 3 for version 2 and reads it from there, and so does its
    EMA copy (--store-ema: fairseq hands it to the task, which re-binds it with the model)."""
    import shutil

    from rag_plugin.retrieval.encoders import trained_tower
    from tests.tasks.test_training import _args, _run
    from tests.tiny_world import layered_knowledge

    ks = tmp_path / "ks"
    shutil.copytree(layered_knowledge(tiny_world, 2) if train_layers else tiny_world["ks"], ks)
    extra = ["--train-doc-encoder", "--reindex-every", "2", "--reindex-wait-at-exit",
             "--max-update", "3" if train_layers else "4",  # the whole tower: one more update, the switch's
             "--save-interval-updates", "2", "--no-epoch-checkpoints", "--doc-encoder-train-layers", str(train_layers)]
    if not train_layers:  # and fairseq's EMA copy (--store-ema), which the task re-binds with the model
        extra += ["--reindex-switch-after", "1", "--store-ema", "--ema-start-update", "1"]
    code, out, err = _run(_args(tiny_world, tmp_path / "ck", knowledge=ks, extra=extra), cwd=str(tmp_path),
                          threads=1, timeout=600)
    assert code == 0, err[-3000:]
    assert "re-index of knowledge version 1 started at update 2" in out + err
    switched = "knowledge version 2 (was 1) is read from update 3 on, by every rank" in out + err
    # the switch's own wait (the re-index takes seconds, the next update does not); --reindex-wait-at-exit logs a
    # wait of its own at the end when the re-index has not landed by then, which is not this one
    waited = "waiting for the re-index started at update 2 (--reindex-switch-after 1)" in out + err
    assert switched == (not train_layers) and waited == switched
    reindex_logs = "".join(f.read_text() for f in (ks / ".reindex" / "logs").glob("*.log"))
    assert ("the tower's lower 1 layers: from the cache" in reindex_logs) == bool(train_layers), reindex_logs
    landed = KnowledgeSource(str(ks))
    assert landed.version == 2 and landed.manifest["reembedded_from"] == "training snapshot at update 2"
    if not train_layers:  # the EMA copy reads (and records) the version the model switched to
        last = safe_torch_load(str(tmp_path / "ck" / "checkpoint_last.pt"))
        read = {name: json.loads(extra["_extra_state"]["knowledge"])["version"]
                for name, extra in (("model", last["model"]), ("ema", last["extra_state"]["ema"]))}
        assert read == {"model": 2, "ema": 2}, read
    [checkpoint] = (tmp_path / "ck").glob("checkpoint_*_2.pt")
    state = trained_tower.doc_encoder_state_from_checkpoint(str(checkpoint))
    assert landed.manifest["document_tower_sha256"] == state_dict_sha256(state)
    old = KnowledgeSource(str(ks), version=1)
    encoder = old.load_encoder()
    load_tower_state(encoder.passage_tower, state, "test", "document tower")
    expected = encoder.encode_passages([old.passages.title(r) for r in range(len(old))],
                                       [old.passages.text(r) for r in range(len(old))], progress=False)
    np.testing.assert_allclose(np.asarray(landed.vectors), expected, atol=1e-5, rtol=0)


def test_reindex_keep_removes_the_versions_no_process_has_open(tmp_path, monkeypatch):
    """--reindex-keep 1: after the switch to version 3, version 2 (closed by the switch) is removed; version 1, which
    this process still has open (the model's), is kept."""
    root = _build(tmp_path)
    monkeypatch.setattr(reindex.Reindexer, "chunk_size", CHUNK)
    task = FakeTask(str(root), every=2)
    task.cfg.reindex_keep = 1
    model = FakeModel(task.knowledge)
    holder = KnowledgeSource(str(root))  # version 1 open elsewhere
    logs = []
    r = reindex.Reindexer(root, task.cfg, log=logs.append)
    task.reindexer = r
    for update in range(1, 5000):
        model.train_to(update)
        reindexer_of(task, model).step(task, model, update)
        if task.knowledge.version == 3:
            break
        time.sleep(0.02)
    r.close()
    assert task.knowledge.version == 3
    assert versions.versions(root) == [1, 3], logs
    assert holder.version == 1 and len(holder.passages) == N  # kept: it is open
    assert any("removed versions [2]" in m for m in logs), logs
    task.cfg.reindex_keep = -1
    with pytest.raises(UserError, match="--reindex-keep"):
        reindex.check_options(task, FakeModel(task.knowledge))
