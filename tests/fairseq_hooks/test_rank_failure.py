"""A rank that dies (SIGKILL) or hangs (SIGSTOP) in two-process CPU training: the surviving rank
fails within a bounded time with a one-line message, instead of waiting for gloo's 30-minute
default. A one-line error (UserError) raised on one rank only stops both ranks with that same line
(rag_plugin/fairseq_hooks/rank_errors.py), whichever rank raised it (rank 0 serves the job's store).

The ranks are started directly (``MASTER_ADDR``/``RANK``/``WORLD_SIZE``, as on two machines)
rather than under torchrun, whose agent would tear the survivor down itself: the survivor has to
notice on its own. A test-only driver (written into tmp_path) wraps ``FairseqTask.train_step``
so that rank 1 sends itself the signal (or raises the UserError) at its second update, after recording
the time; then it runs ``fairseq_cli.train.cli_main()`` unchanged through ``scripts/train_cpu_ddp.sh``.

Marked ``slow`` (two processes per test, 20-40 s each on 2 cores).
"""
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DRIVER = '''\
#!{python}
"""Test-only fairseq-train: rank $FAIL_RANK sends itself $FAIL_SIGNAL at update $FAIL_AT."""
import os
import signal
import sys
import time

import fairseq_cli.train  # first: it sets up fairseq's log format
from fairseq.tasks import FairseqTask

calls = [0]
_train_step = FairseqTask.train_step


def train_step(self, sample, *args, **kwargs):
    calls[0] += 1
    if os.environ["RANK"] == os.environ["FAIL_RANK"] and calls[0] == int(os.environ["FAIL_AT"]):
        with open(os.environ["FAIL_RECORD"], "w") as fh:
            fh.write(repr(time.time()))
        if os.environ["FAIL_SIGNAL"] == "UserError":
            from rag_plugin.util.errors import UserError  # imported here: the plugin is loaded as fairseq-train's

            raise UserError(f"passage 7 of shard {{os.environ['RANK']}} is unreadable", fix="rebuild the shard")
        os.kill(os.getpid(), getattr(signal, os.environ["FAIL_SIGNAL"]))
    return _train_step(self, sample, *args, **kwargs)


FairseqTask.train_step = train_step
sys.argv[0] = "fairseq-train"
fairseq_cli.train.cli_main()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(world, tmp_path, fail_signal, extra=(), ks=None, fail_rank=1):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(python=sys.executable))
    driver.chmod(driver.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "failed_at"
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, FAIRSEQ_TRAIN=str(driver), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2", RANK=str(rank),
                   LOCAL_RANK=str(rank), FAIL_RANK=str(fail_rank), FAIL_AT="2", FAIL_SIGNAL=fail_signal,
                   FAIL_RECORD=str(record))
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
        cmd = [str(ROOT / "scripts" / "train_cpu_ddp.sh"), str(world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
               "--task", "retrieval_augmented", "--knowledge", str(ks or world["ks"]), "--arch", "rag_token_tiny",
               "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3",
               "--batch-size", "4", "--max-epoch", "3", "--seed", "1", "--save-dir", str(tmp_path / "ckpt"),
               "--num-workers", "0", "--no-progress-bar", "--log-interval", "1", "--log-format", "simple",
               "--disable-validation", *extra]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs, record


def _survivor(procs, record, limit):
    """Wait for rank 0; return (returncode, stderr, seconds from rank 1's failure to rank 0's exit)."""
    try:
        out, err = procs[0].communicate(timeout=limit)
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert record.is_file(), "rank 1 never reached its second update:\n" + (out + err)[-3000:]
    return procs[0].returncode, out, err, ended - float(record.read_text())


def _one_error_line(err):
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines[0]


def test_killed_rank_makes_the_other_fail_fast(tiny_world, tmp_path):
    procs, record = _start_ranks(tiny_world, tmp_path, "SIGKILL")
    rc, out, err, seconds = _survivor(procs, record, limit=240)
    assert procs[1].returncode == -signal.SIGKILL
    assert rc == 1, (out + err)[-3000:]
    line = _one_error_line(err)
    assert re.search(r"error: rank 0 of 2: lost contact with another rank \(.*(closed|reset)", line), line
    assert "resume from checkpoint_last.pt" in line
    assert seconds < 60, f"rank 0 took {seconds:.1f} s to notice"
    print(f"rank 0 exited {rc} {seconds:.1f} s after rank 1 was killed: {line}")


def test_hung_rank_times_out_with_heartbeat_timeout(tiny_world, tmp_path):
    """SIGSTOP keeps rank 1's connections open: only a timeout can free rank 0. With
    --heartbeat-timeout 6 it is the process group's timeout too (rag_plugin.fairseq_hooks.distributed)."""
    procs, record = _start_ranks(tiny_world, tmp_path, "SIGSTOP", extra=["--heartbeat-timeout", "6"])
    rc, out, err, seconds = _survivor(procs, record, limit=240)
    assert rc not in (0, None), (out + err)[-3000:]
    line = _one_error_line(err)
    assert "error: rank 0 of 2: lost contact with another rank" in line, line
    assert 6 <= seconds < 6 + 60, f"rank 0 ended {seconds:.1f} s after rank 1 stopped"
    print(f"rank 0 exited {rc} {seconds:.1f} s after rank 1 stopped: {line}")


def test_killed_rank_during_sharded_retrieval_makes_the_other_fail_fast(tiny_world, tmp_path):
    """With the index in 3 shards over the 2 ranks, a training step's first collective is the retrieval's
    all-gather of question vectors: rank 1 dies before it, rank 0 stops there with the one-line error."""
    from tests.tiny_world import sharded_knowledge

    procs, record = _start_ranks(tiny_world, tmp_path, "SIGKILL", ks=sharded_knowledge(tiny_world, 3))
    rc, out, err, seconds = _survivor(procs, record, limit=240)
    assert rc == 1, (out + err)[-3000:]
    line = _one_error_line(err)
    assert re.search(r"error: rank 0 of 2: lost contact with another rank \(.*(closed|reset)", line), line
    assert "holds index shards [0, 1] of 3" in out + err  # the collective search was in use
    assert seconds < 60, f"rank 0 took {seconds:.1f} s to notice"


@pytest.mark.parametrize("fail_rank", [1, 0])
def test_user_error_on_one_rank_stops_every_rank_with_the_same_line(tiny_world, tmp_path, fail_rank):
    """Rank ``fail_rank`` alone raises a UserError at its second update (the other rank waits for it in the
    gradients' all-reduce): both ranks stop at once with its one line and exit 2, none with "lost contact"."""
    procs, record = _start_ranks(tiny_world, tmp_path, "UserError", fail_rank=fail_rank)
    try:
        results = [p.communicate(timeout=240) for p in procs]
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert record.is_file(), "the rank never reached its second update:\n" + "".join(results[fail_rank])[-3000:]
    expected = (f"error: passage 7 of shard {fail_rank} is unreadable (rebuild the shard)")
    for rank, (p, (out, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode == 2, f"rank {rank}: " + (out + err)[-3000:]
        assert _one_error_line(err) == expected, f"rank {rank}"
    seconds = ended - float(record.read_text())
    assert seconds < 30, f"the ranks took {seconds:.1f} s to stop"
    print(f"rank {fail_rank} raised; both ranks exited 2 within {seconds:.1f} s: {expected}")
