"""The relay of one-line errors between ranks (rag_plugin/fairseq_hooks/rank_errors.py), its ranks sharing an
in-memory c10d store in one process: the first published line is the job's, another rank's watching thread
stops its process with that line (exit 2) and the publisher's does not, every rank waits for the others' lines
(bounded), and rank 0 leaves last at the end of a run. Two real ranks: tests/fairseq_hooks/test_rank_failure.py."""
import threading
import time

import pytest
import torch.distributed as dist

from rag_plugin.fairseq_hooks import distributed, excepthook, rank_errors
from rag_plugin.fairseq_hooks.rank_errors import ErrorRelay


def _relays(world, stop=lambda line: None, **kw):
    store = dist.HashStore()
    return [ErrorRelay(store, rank, world, stop, **kw) for rank in range(world)]


def test_the_first_published_line_is_the_jobs():
    r0, r1, r2 = _relays(3)
    assert r0.published() is None
    r2.publish("bad input on rank 2")
    r0.publish("another on rank 0")
    assert [r.published() for r in (r0, r1, r2)] == ["bad input on rank 2"] * 3
    assert r2.publisher and not r0.publisher and not r1.publisher


def test_another_ranks_line_stops_this_process_and_the_publishers_own_does_not(monkeypatch):
    stopped = {}
    done = threading.Event()

    def stop_process(line, status, relayed=False):
        stopped[threading.current_thread().name] = (line, status, relayed)
        done.set()

    monkeypatch.setattr(excepthook, "stop_process", stop_process)  # what the relay of the hooks calls
    r0, r1 = _relays(2, stop=distributed._stop_relayed, poll=0.02)
    r0._thread.name, r1._thread.name = "rank0", "rank1"
    r1.publish("passage 7 is unreadable (rebuild the shard)")
    r0.start(), r1.start()
    assert done.wait(5)
    time.sleep(0.1)  # the publisher's thread had as many chances to fire
    r0.close(), r1.close()
    assert stopped == {"rank0": ("passage 7 is unreadable (rebuild the shard)", 2, True)}


def test_every_rank_waits_for_the_others_lines_and_rank_0_leaves_last():
    r0, r1, r2 = _relays(3, wait=5.0)
    r1.publish("line")
    ended = {}

    def finish(relay):
        relay.finish(wait=True)
        ended[relay.rank] = time.monotonic()

    threads = [threading.Thread(target=finish, args=(r,)) for r in (r0, r1)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert ended == {}  # rank 2 has not written the line yet: 0 and 1 wait
    start = time.monotonic()
    finish(r2)
    for t in threads:
        t.join(5)
    assert set(ended) == {0, 1, 2} and max(ended.values()) - start < 1.0
    assert ended[0] >= ended[2] and ended[0] >= ended[1]  # rank 0 serves the store: it leaves last


def test_a_rank_that_never_answers_delays_the_others_at_most_the_wait():
    r0, _ = _relays(2, wait=0.3)
    start = time.monotonic()
    r0.finish(wait=True)
    assert 0.3 <= time.monotonic() - start < 2.0


def test_at_the_end_of_a_run_rank_0_waits_for_the_others_to_stop_watching(monkeypatch):
    monkeypatch.setattr(rank_errors, "CLOSE_SECONDS", 5.0)
    r0, r1 = _relays(2, poll=0.02)
    r0.start(), r1.start()
    closed = threading.Event()
    t = threading.Thread(target=lambda: (r0.close(), closed.set()))
    t.start()
    assert not closed.wait(0.3)  # rank 1 still watches
    r1.close()
    assert closed.wait(2)
    t.join()
    assert not r0._thread.is_alive() and not r1._thread.is_alive()


def test_without_a_distributed_job_nothing_is_relayed():
    assert not dist.is_initialized()
    assert rank_errors.start_relay(stop=lambda line: None) is None and rank_errors.current() is None
    rank_errors.publish("line")            # no-ops
    assert rank_errors.relayed_line() is None
    rank_errors.finish(wait=True)


@pytest.fixture(autouse=True)
def _no_relay_left(monkeypatch):
    monkeypatch.setattr(rank_errors, "_relay", None)
