"""A knowledge-source build split over processes (rag_plugin/indexing/distributed.py, builder.py; the
rag-build-knowledge command line under torchrun): the same bytes as a one-process build, a lost process
finished by a rerun with any number of processes, bad input stopping every rank with one line.

Builds run as separate processes: under torchrun itself, or one process per rank with the environment torchrun
gives its workers (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so that each rank's exit status and stderr can
be checked. ``tests.indexing.build_entry`` is the command line with the tests' HashingEncoder as ``--encoder
hashing``.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.retrieval.knowledge import KnowledgeSource
from tests.conftest import ROOT, assert_one_line_error, synthetic_passages, write_jsonl

SPEC = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0"
ENTRY = ["-m", "tests.indexing.build_entry"]
CLI = ["-m", "rag_plugin.cli.build_knowledge"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _one(module, *args, threads=1):
    """One process, no torchrun."""
    return subprocess.run([sys.executable, *module, *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT), env=_env(OMP_NUM_THREADS=str(threads)))


def _ranks(world, module, *args, rank_env=None, rank_args=None, kill_after_rank_0=False):
    """``world`` processes started as torchrun starts its workers; returns their finished processes by rank
    (``kill_after_rank_0``: the others killed once rank 0 ended)."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **(rank_env or {}).get(rank, {}))
        argv = [*map(str, args), *map(str, (rank_args or {}).get(rank, []))]
        procs.append(subprocess.Popen([sys.executable, *module, *argv], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=str(ROOT), env=env))
    deadline = time.monotonic() + 300
    out = []
    for proc in procs:
        if out and kill_after_rank_0:
            proc.kill()
        stdout, stderr = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def _assert_stopped(proc, *needles) -> None:
    """A rank that stopped with one error line (exit 2, no traceback), after any log lines of its own."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(needle in last for needle in needles), last


def _passages(tmp_path: Path, n: int) -> Path:
    return write_jsonl(tmp_path / "p.jsonl", synthetic_passages(n))


def _files(ks_dir: Path) -> dict:
    """Every file of a knowledge source but the manifest (which has a date), by relative path: its bytes."""
    return {str(p.relative_to(ks_dir)): p.read_bytes() for p in sorted(ks_dir.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def _same_source(a: Path, b: Path, queries: np.ndarray, k: int = 10) -> None:
    """Byte-identical files and manifests (but for the date and timing), the same search results."""
    files_a, files_b = _files(a), _files(b)
    assert sorted(files_a) == sorted(files_b)
    for name in files_a:
        assert files_a[name] == files_b[name], name
    ma, mb = KnowledgeSource(str(a)).manifest, KnowledgeSource(str(b)).manifest
    for key in ("created", "embedding_seconds"):
        ma.pop(key), mb.pop(key)
    assert ma == mb
    found_a = KnowledgeSource(str(a)).local_search().search(queries, k, with_vectors=True)
    found_b = KnowledgeSource(str(b)).local_search().search(queries, k, with_vectors=True)
    for x, y in zip(found_a, found_b):
        np.testing.assert_array_equal(x, y)


def _queries(ks_dir: Path, count: int = 7) -> np.ndarray:
    """Questions near some stored vectors (and a tie-prone copy of one)."""
    vectors = np.asarray(KnowledgeSource(str(ks_dir)).vectors[np.arange(0, count * 13, 13)])
    rng = np.random.default_rng(0)
    return (vectors + 0.05 * rng.standard_normal(vectors.shape)).astype(np.float32)


def test_torchrun_two_processes_build_the_bytes_of_one_process(tmp_path):
    """The command line under torchrun, a real (random BERT) encoder, 3 index shards over 2 processes; the
    one-process build uses 2 torch threads, the workers 1 each: the vectors do not depend on it."""
    src = _passages(tmp_path, 203)
    common = ["--passages", src, "--encoder", SPEC, "--shard-size", 16, "--batch-size", 8, "--num-shards", 3]
    one = _one(CLI, *common, "--out", tmp_path / "one", "--quiet", threads=2)
    assert one.returncode == 0, one.stderr
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(_free_port()), *CLI, *map(str, common), "--out", str(tmp_path / "two")],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT), env=_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("passage store: 203 passages") == 1  # rank 0 alone logs
    assert "built by 2 processes" in proc.stderr
    _same_source(tmp_path / "one", tmp_path / "two", _queries(tmp_path / "one"))


@pytest.mark.parametrize("num_shards", [1, 2])
def test_two_ranks_build_the_bytes_of_one_process(tmp_path, num_shards):
    src = _passages(tmp_path, 157)
    common = ["--passages", src, "--encoder", "hashing", "--shard-size", 10, "--num-shards", num_shards, "--quiet"]
    assert _one(ENTRY, *common, "--out", tmp_path / "one").returncode == 0
    ranks = _ranks(2, ENTRY, *common, "--out", tmp_path / "two")
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert ranks[1].stderr == ""  # the other ranks are quiet
    _same_source(tmp_path / "one", tmp_path / "two", _queries(tmp_path / "one"))


@pytest.mark.parametrize("dies", [1, 0])
def test_a_lost_rank_stops_the_others_and_a_one_process_rerun_finishes_the_build(tmp_path, dies):
    src = _passages(tmp_path, 240)
    common = ["--passages", src, "--encoder", "hashing", "--shard-size", 8, "--num-shards", 3, "--quiet"]
    ranks = _ranks(2, ENTRY, *common, "--out", tmp_path / "ks", rank_env={dies: {"RAG_TEST_DIE_AFTER_CHUNKS": "3"}})
    assert ranks[dies].returncode == -9
    _assert_stopped(ranks[1 - dies], f"rank {1 - dies} of 2: lost contact with another process of the build",
                    "rerun the same command")
    chunks = list((tmp_path / "ks" / ".build" / "shards").glob("*.npy"))
    assert 3 <= len(chunks) < 30 and not (tmp_path / "ks" / "manifest.json").exists()
    rerun = _one(ENTRY, *common, "--out", tmp_path / "ks")
    assert rerun.returncode == 0, rerun.stderr
    assert _one(ENTRY, *common, "--out", tmp_path / "one").returncode == 0
    _same_source(tmp_path / "one", tmp_path / "ks", _queries(tmp_path / "one"))


def test_a_rank_that_hangs_stops_the_others_after_the_timeout(tmp_path):
    src = _passages(tmp_path, 120)
    t0 = time.monotonic()
    ranks = _ranks(2, ENTRY, "--passages", src, "--encoder", "hashing", "--shard-size", 8, "--quiet",
                   "--dist-timeout", 0.4, "--out", tmp_path / "ks", rank_env={1: {"RAG_TEST_STALL_AFTER_CHUNKS": "2"}},
                   kill_after_rank_0=True)
    assert time.monotonic() - t0 < 250  # not the ten minutes rank 1 sleeps
    _assert_stopped(ranks[0], "rank 0 of 2: lost contact with another process of the build (Timed out")
    assert ranks[1].returncode == -9  # killed by the test once rank 0 gave up
    assert len(list((tmp_path / "ks" / ".build" / "shards").glob("*.npy"))) >= 2


def test_bad_input_seen_by_rank_0_stops_every_rank_with_its_line_and_nothing_is_written(tmp_path):
    src = _passages(tmp_path, 12)
    ranks = _ranks(2, ENTRY, "--passages", src, "--encoder", "hashing", "--num-shards", 13, "--quiet",
                   "--out", tmp_path / "ks")
    _assert_stopped(ranks[0], "--num-shards 13 is more than the 12 passages")
    assert_one_line_error(ranks[1], "--num-shards 13 is more than the 12 passages")  # the same line, no log
    assert ranks[0].stderr.endswith(ranks[1].stderr)
    assert not (tmp_path / "ks").exists()


def test_a_rank_that_does_not_see_rank_0s_output_directory_is_refused(tmp_path):
    src = _passages(tmp_path, 30)
    ranks = _ranks(2, ENTRY, "--passages", src, "--encoder", "hashing", "--quiet",
                   rank_args={0: ["--out", tmp_path / "ks"], 1: ["--out", tmp_path / "elsewhere"]})
    assert_one_line_error(ranks[1], "rank 1 of 2 does not see the output directory rank 0 writes", "--out")
    _assert_stopped(ranks[0], "rank 1 of 2 does not see the output directory rank 0 writes")
    assert ranks[0].stderr.endswith(ranks[1].stderr)
    assert not (tmp_path / "ks").exists() and not (tmp_path / "elsewhere").exists()


def test_ranks_with_different_document_encoders_are_refused(tmp_path):
    src = _passages(tmp_path, 30)
    ranks = _ranks(2, ENTRY, "--passages", src, "--quiet", "--out", tmp_path / "ks",
                   rank_args={0: ["--encoder", "hashing:dim=64"], 1: ["--encoder", "hashing:dim=32"]})
    assert_one_line_error(ranks[1], "rank 1 of 2 has another document encoder than rank 0", "dim 64 on rank 0, 32 here")
    assert ranks[0].stderr.endswith(ranks[1].stderr)
    assert not (tmp_path / "ks").exists()


def test_not_under_torchrun_the_group_is_one_process_and_a_missing_master_is_one_line(tmp_path):
    from rag_plugin.indexing.distributed import BuildGroup
    from rag_plugin.util.errors import UserError

    group = BuildGroup.from_environment(environ={})
    assert (group.rank, group.world, group.is_main) == (0, 1, True)
    assert group.on_main(lambda: ("mine", "everyone's")) == ("mine", "everyone's")
    assert group.each(lambda: (1, 2)) == (1, [2])
    with pytest.raises(UserError, match="--dist-timeout must be positive"):
        BuildGroup.from_environment(0, environ={"WORLD_SIZE": "2"})
    proc = subprocess.run([sys.executable, *CLI, "--passages", _passages(tmp_path, 5), "--out", tmp_path / "ks",
                           "--encoder", SPEC], capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                          env={k: v for k, v in _env(WORLD_SIZE="2", RANK="1").items() if k != "MASTER_ADDR"})
    assert_one_line_error(proc, "cannot join the build's 2 processes")
    assert not (tmp_path / "ks").exists()
