"""rag_plugin.serving.batcher.Batcher with fake run functions (no model, asyncio only), and the request schemas'
checks (rag_plugin.serving.schemas): what one batch holds, the limits, a caller that stopped waiting, an error in
a batch, exclusive work between batches, stop; each refused value naming its field."""
import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from rag_plugin.serving.batcher import Batcher, Job
from rag_plugin.serving.engine import AnswerKey, Engine
from rag_plugin.serving.schemas import AnswerRequest, BadRequest, SearchRequest, check_answer, check_search
from rag_plugin.serving.settings import ServeSettings

#: a waiter's bound in these tests: a job never answered fails the test instead of hanging it
BOUND = 10.0


class Recorder:
    """A run function that records each batch (key, payloads) and answers each payload with (key, payload);
    ``gate``: a batch of that key blocks (on the compute thread) until ``release`` is set."""

    def __init__(self, fail_key=None, gate=None):
        self.calls, self.fail_key, self.gate = [], fail_key, gate
        self.started, self.release = threading.Event(), threading.Event()
        self.order = []  # batches and exclusive work, in the order the compute thread ran them

    def __call__(self, key, payloads):
        self.calls.append((key, list(payloads)))
        self.order.append(("batch", key, tuple(payloads)))
        if key == self.gate:
            self.started.set()
            assert self.release.wait(BOUND), "the test never released the gated batch"
        if key == self.fail_key:
            raise ValueError(f"bad batch {key}")
        return [(key, p) for p in payloads]


def job(run, key, payload, size=1, limit=8) -> Job:
    return Job(run=run, key=key, payload=payload, size=size, limit=limit)


def run_async(scenario, max_wait_ms=50.0):
    """``scenario(batcher)`` in a fresh event loop with a started batcher, stopped afterwards."""

    async def main():
        batcher = Batcher(max_wait_ms)
        batcher.start()
        try:
            return await scenario(batcher)
        finally:
            await asyncio.wait_for(batcher.stop(), BOUND)

    return asyncio.run(main())


async def submit_all(batcher, jobs):
    return await asyncio.wait_for(asyncio.gather(*(batcher.submit(j) for j in jobs)), BOUND)


async def until(event: threading.Event):
    """Wait (without blocking the loop) for a compute-thread event."""
    deadline = time.monotonic() + BOUND
    while not event.is_set():
        assert time.monotonic() < deadline, "the compute thread never got there"
        await asyncio.sleep(0.005)


# ---------------------------------------------------------------------------------------------- batching


def test_jobs_of_one_key_submitted_together_are_one_batch():
    rec = Recorder()

    async def scenario(b):
        results = await submit_all(b, [job(rec, "a", f"q{i}") for i in range(5)])
        return results, b.batches, b.batched

    results, batches, batched = run_async(scenario)
    assert results == [("a", f"q{i}") for i in range(5)]  # each its own result, in its own order
    assert rec.calls == [("a", [f"q{i}" for i in range(5)])]
    assert (batches, batched) == (1, 5)


def test_different_keys_form_separate_batches_each_answered_its_own():
    rec = Recorder()
    keys = ["a", "b", "a", "c", "b", "a"]

    async def scenario(b):
        return await submit_all(b, [job(rec, k, f"q{i}") for i, k in enumerate(keys)])

    results = run_async(scenario)
    assert results == [(k, f"q{i}") for i, k in enumerate(keys)]
    assert rec.calls == [("a", ["q0", "q2", "q5"]), ("b", ["q1", "q4"]), ("c", ["q3"])]  # keys in first-come order


def test_another_run_function_with_the_same_key_is_another_batch():
    first, second = Recorder(), Recorder()

    async def scenario(b):
        return await submit_all(b, [job(first, "k", "x"), job(second, "k", "y"), job(first, "k", "z")])

    assert run_async(scenario) == [("k", "x"), ("k", "y"), ("k", "z")]
    assert first.calls == [("k", ["x", "z"])] and second.calls == [("k", ["y"])]


def test_a_batch_never_exceeds_its_limit_counting_sizes():
    rec = Recorder()
    # sizes as /v1/search gives them: a job of 5 queries has size 5; limit 8
    sizes = [5, 5, 2, 1, 3, 8, 1]
    jobs = [job(rec, "s", f"j{i}", size=s, limit=8) for i, s in enumerate(sizes)]
    size_of = {f"j{i}": s for i, s in enumerate(sizes)}

    async def scenario(b):
        return await submit_all(b, jobs), b.batched

    results, batched = run_async(scenario)
    assert results == [("s", f"j{i}") for i in range(len(sizes))]
    assert sorted(p for _, ps in rec.calls for p in ps) == sorted(size_of)  # each job computed once
    assert all(sum(size_of[p] for p in ps) <= 8 for _, ps in rec.calls), rec.calls
    assert len(rec.calls) >= 4 and batched == sum(sizes)  # 25 questions cannot fit in 3 batches of 8


def test_a_full_batch_does_not_wait_for_max_wait():
    rec = Recorder()

    async def scenario(b):
        started = time.monotonic()
        await submit_all(b, [job(rec, "a", i, limit=4) for i in range(4)])
        return time.monotonic() - started

    assert run_async(scenario, max_wait_ms=5000) < 2.5  # the 4th filled the batch: no 5 s window
    assert rec.calls == [("a", [0, 1, 2, 3])]


def test_jobs_arriving_while_a_batch_computes_form_the_next_batch():
    rec = Recorder(gate="slow")

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)
        later = asyncio.ensure_future(submit_all(b, [job(rec, "a", i) for i in range(3)]))
        await asyncio.sleep(0.2)  # they queue behind the computing batch
        assert rec.calls == [("slow", ["s"])]
        rec.release.set()
        return await asyncio.wait_for(slow, BOUND), await later

    assert run_async(scenario) == (("slow", "s"), [("a", 0), ("a", 1), ("a", 2)])
    assert rec.calls == [("slow", ["s"]), ("a", [0, 1, 2])]


# ---------------------------------------------------------------------------------------------- timeouts, errors


def test_a_job_whose_waiter_timed_out_is_left_out_of_its_batch():
    rec = Recorder(gate="slow")

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)  # the compute thread is busy
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.submit(job(rec, "a", "gave-up")), 0.05)
        kept = asyncio.ensure_future(b.submit(job(rec, "a", "kept")))
        await asyncio.sleep(0.05)
        rec.release.set()
        return await asyncio.wait_for(slow, BOUND), await asyncio.wait_for(kept, BOUND), b.batched

    slow, kept, batched = run_async(scenario)
    assert (slow, kept) == (("slow", "s"), ("a", "kept"))
    assert rec.calls == [("slow", ["s"]), ("a", ["kept"])]  # the abandoned question is never computed
    assert batched == 2


def test_a_batch_of_only_abandoned_jobs_is_not_computed():
    rec = Recorder(gate="slow")

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)
        for i in range(3):
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(b.submit(job(rec, "a", i)), 0.02)
        rec.release.set()
        await asyncio.wait_for(slow, BOUND)
        after = await submit_all(b, [job(rec, "b", "next")])
        return after, b.batches

    after, batches = run_async(scenario)
    assert after == [("b", "next")] and rec.calls == [("slow", ["s"]), ("b", ["next"])] and batches == 2


def test_an_error_fails_every_job_of_its_batch_only():
    rec = Recorder(fail_key="bad")

    async def scenario(b):
        together = [job(rec, "bad", 0), job(rec, "good", 1), job(rec, "bad", 2), job(rec, "good", 3)]
        outcome = await asyncio.wait_for(
            asyncio.gather(*(b.submit(j) for j in together), return_exceptions=True), BOUND)
        after = await submit_all(b, [job(rec, "good", 4), job(rec, "good", 5)])
        return outcome, after

    outcome, after = run_async(scenario)
    assert [type(o).__name__ for o in outcome] == ["ValueError", "tuple", "ValueError", "tuple"]
    assert str(outcome[0]) == "bad batch bad" and outcome[0] is outcome[2]  # the batch's one error
    assert outcome[1] == ("good", 1) and outcome[3] == ("good", 3)
    assert after == [("good", 4), ("good", 5)]  # the loop goes on


# ---------------------------------------------------------------------------------------------- exclusive, stop


def test_exclusive_runs_after_the_computing_batch_and_before_later_batches():
    rec = Recorder(gate="slow")

    def reload():
        rec.order.append(("exclusive",))
        return "reloaded"

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)
        exclusive = asyncio.ensure_future(b.exclusive(reload))
        await asyncio.sleep(0.02)
        later = asyncio.ensure_future(b.submit(job(rec, "a", "after")))
        await asyncio.sleep(0.1)
        assert rec.order == [("batch", "slow", ("s",))]  # nothing runs beside the computing batch
        rec.release.set()
        return await asyncio.wait_for(asyncio.gather(slow, exclusive, later), BOUND)

    assert run_async(scenario) == [("slow", "s"), "reloaded", ("a", "after")]
    assert rec.order == [("batch", "slow", ("s",)), ("exclusive",), ("batch", "a", ("after",))]


def test_a_search_lane_job_runs_while_a_compute_batch_is_busy():
    """The knowledge source's searches have their own thread: a search is answered while a batch of the model
    computes, and never beside another search (one thread per lane)."""
    rec = Recorder(gate="slow")
    threads = []

    def search(key, payloads):
        threads.append(threading.current_thread().name)
        return [("searched", p) for p in payloads]

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)
        found = await asyncio.wait_for(b.submit(Job(run=search, key="dense", payload="q", size=1, limit=8,
                                                    lane="search")), BOUND)
        assert not slow.done()  # the model's batch is still computing
        rec.release.set()
        return found, await asyncio.wait_for(slow, BOUND)

    assert run_async(scenario) == (("searched", "q"), ("slow", "s"))
    assert threads == ["rag-serve-search_0"]


def test_exclusive_on_an_idle_batcher_runs_at_once_and_passes_its_error():
    def boom():
        raise OSError("cannot open")

    async def scenario(b):
        ok = await asyncio.wait_for(b.exclusive(lambda: threading.current_thread().name), BOUND)
        with pytest.raises(OSError, match="cannot open"):
            await asyncio.wait_for(b.exclusive(boom), BOUND)
        return ok

    assert run_async(scenario).startswith("rag-serve-compute")  # the compute thread, not the loop's


def test_stop_fails_the_queued_jobs():
    rec = Recorder(gate="slow")

    async def scenario(b):
        slow = asyncio.ensure_future(b.submit(job(rec, "slow", "s")))
        await until(rec.started)
        queued = [asyncio.ensure_future(b.submit(job(rec, "a", i))) for i in range(3)]
        await asyncio.sleep(0.02)
        threading.Timer(0.2, rec.release.set).start()  # stop() joins the compute thread
        await asyncio.wait_for(b.stop(), BOUND)
        outcome = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), BOUND)
        slow.cancel()
        return outcome

    async def main():
        b = Batcher(10.0)
        b.start()
        return await scenario(b)

    outcome = asyncio.run(main())
    assert all(isinstance(o, RuntimeError) and "shutting down" in str(o) for o in outcome), outcome
    assert rec.calls == [("slow", ["s"])]


def test_stop_fails_the_jobs_gathered_for_a_batch_not_yet_computed():
    """A job the gathering loop already took from the queue (its batch waits --max-wait-ms for others) is failed
    by stop() too, never left waiting forever."""
    rec = Recorder()

    async def main():
        b = Batcher(60_000.0)  # a long window: the job sits in the gathering loop, out of the queue
        b.start()
        gathered = asyncio.ensure_future(b.submit(job(rec, "a", "waiting")))
        await asyncio.sleep(0.1)
        await asyncio.wait_for(b.stop(), BOUND)
        try:
            return await asyncio.wait_for(gathered, 2.0)
        except Exception as err:  # noqa: BLE001 (the outcome is the test's subject)
            return err

    outcome = asyncio.run(main())
    assert isinstance(outcome, RuntimeError) and "shutting down" in str(outcome), \
        f"a job gathered before stop() got {outcome!r} instead of the shutdown error"
    assert rec.calls == []


# ---------------------------------------------------------------------------------------------- schemas

SETTINGS = ServeSettings(path="x.pt", max_question_chars=20, max_beam=6, max_len=30, max_queries=3)


def _refused(check, req, field, *needles, status=422):
    with pytest.raises(BadRequest) as err:
        check(req)
    assert err.value.field == field and err.value.status == status, (err.value.field, err.value.status)
    assert "\n" not in err.value.message
    for needle in needles:
        assert needle in err.value.message, err.value.message


@pytest.mark.parametrize("body, field, needles", [
    ({"question": "   "}, "question", ("empty",)),
    ({"question": "q" * 21}, "question", ("21 characters", "--max-question-chars 20")),
    ({"question": "q", "k": 0}, "k", ("between 1 and 5", "--max-k")),
    ({"question": "q", "k": 6}, "k", ("between 1 and 5", "got 6")),
    ({"question": "q", "decoding": "beam"}, "decoding", ("'beam'", "thorough, fast")),
    ({"question": "q", "decoding": "fid"}, "decoding", ("sequence",)),
    ({"question": "q", "beam": 0}, "beam", ("--max-beam",)),
    ({"question": "q", "beam": 7}, "beam", ("between 1 and 6",)),
    ({"question": "q", "max_len": 0}, "max_len", ("--max-len",)),
    ({"question": "q", "max_len": 31}, "max_len", ("between 1 and 30",)),
])
def test_check_answer_refuses_each_bad_value_naming_its_field(body, field, needles):
    req = AnswerRequest.model_validate(body)
    _refused(lambda r: check_answer(r, SETTINGS, "sequence", 5), req, field, *needles)


def test_check_answer_accepts_the_limits_themselves():
    for body in ({"question": "q" * 20, "k": 5, "beam": 6, "max_len": 30, "decoding": "fast"},
                 {"question": "q", "k": 1, "beam": 1, "max_len": 1}):
        check_answer(AnswerRequest.model_validate(body), SETTINGS, "sequence", 5)
    check_answer(AnswerRequest.model_validate({"question": "q", "decoding": "beam", "max_len": 30}), SETTINGS,
                 "token", 5)


def test_a_request_leaving_beam_and_max_len_out_is_accepted_under_lower_limits():
    """The request's defaults (beam 4, max_len 64) are not the caller's: a service started with --max-beam 2
    --max-len 30 answers a plain {"question": ...} (with the defaults capped), never refusing values nobody gave."""
    lower = ServeSettings(path="x.pt", max_beam=2, max_len=30)
    check_answer(AnswerRequest.model_validate({"question": "q"}), lower, "token", 5)
    assert _key(lower, {"question": "q"}) == AnswerKey(3, "beam", 2, 30, True)


@pytest.mark.parametrize("body, field, needles, status", [
    ({"queries": []}, "queries", ("empty",), 422),
    ({"queries": ["a", "b", "c", "d"]}, "queries", ("holds 4", "--max-queries 3"), 413),
    ({"queries": ["a", " "]}, "queries[1]", ("queries[1] is empty",), 422),
    ({"queries": ["q" * 21]}, "queries[0]", ("--max-question-chars",), 422),
    ({"queries": ["a"], "k": 0}, "k", ("between 1 and 5",), 422),
    ({"queries": ["a"], "k": 6}, "k", ("--max-k",), 422),
    ({"queries": ["a"], "rerank": "maxsim"}, "rerank", ("dense, bm25, hybrid",), 422),
    ({"queries": ["a"], "retriever": "dense", "rerank_candidates": 10}, "rerank_candidates", ("rerank is not set",),
     422),
    ({"queries": ["a"], "k": 4, "retriever": "bm25", "rerank": "maxsim", "rerank_candidates": 3},
     "rerank_candidates", ("between 4 and 40",), 422),
    ({"queries": ["a"], "retriever": "hybrid", "rerank": "maxsim", "rerank_candidates": 41},
     "rerank_candidates", ("at least k",), 422),
])
def test_check_search_refuses_each_bad_value_naming_its_field(body, field, needles, status):
    req = SearchRequest.model_validate(body)
    _refused(lambda r: check_search(r, SETTINGS, 5, 40), req, field, *needles, status=status)


def test_check_search_accepts_the_limits_themselves():
    for body in ({"queries": ["q" * 20, "b", "c"], "k": 5},
                 {"queries": ["a"], "k": 5, "retriever": "dense", "rerank": "maxsim", "rerank_candidates": 40},
                 {"queries": ["a"], "k": 2, "retriever": "bm25", "rerank": "maxsim", "rerank_candidates": 2}):
        check_search(SearchRequest.model_validate(body), SETTINGS, 5, 40)


@pytest.mark.parametrize("model, body, where", [
    (AnswerRequest, {"question": "q", "k": 2.0}, "k"),          # strict: no float for an int
    (AnswerRequest, {"question": "q", "k": "2"}, "k"),          # nor a string
    (AnswerRequest, {"question": "q", "beam": True}, "beam"),   # nor a bool
    (AnswerRequest, {"question": "q", "max_len": 3.5}, "max_len"),
    (AnswerRequest, {"question": 7}, "question"),
    (AnswerRequest, {"question": "q", "explain": "yes"}, "explain"),
    (AnswerRequest, {"question": "q", "explain": 1}, "explain"),
    (AnswerRequest, {"question": "q", "decoding": "greedy"}, "decoding"),
    (AnswerRequest, {"question": "q", "n_docs": 3}, "n_docs"),  # unknown fields are refused, not ignored
    (AnswerRequest, {"k": 3}, "question"),
    (SearchRequest, {"queries": "one string"}, "queries"),
    (SearchRequest, {"queries": ["a", 2]}, "queries.1"),
    (SearchRequest, {"queries": ["a"], "k": False}, "k"),
    (SearchRequest, {"queries": ["a"], "retriever": "tfidf"}, "retriever"),
    (SearchRequest, {"queries": ["a"], "rerank": "cross"}, "rerank"),
    (SearchRequest, {"queries": ["a"], "rerank_candidates": 20.0}, "rerank_candidates"),
    (SearchRequest, {"queries": ["a"], "top_k": 3}, "top_k"),
])
def test_request_models_are_strict_and_refuse_unknown_fields(model, body, where):
    with pytest.raises(ValidationError) as err:
        model.model_validate(body)
    assert ".".join(str(p) for p in err.value.errors()[0]["loc"]) == where


def _key(settings, body):
    """The AnswerKey the engine makes of a request (Engine.key over a stand-in engine: K 3, decoding beam)."""
    engine = SimpleNamespace(default_k=3, default_decoding="beam", settings=settings)
    return Engine.key(engine, AnswerRequest.model_validate(body))


def test_request_defaults():
    assert _key(ServeSettings(path="x.pt"), {"question": "q"}) == AnswerKey(3, "beam", 4, 64, True)
    assert _key(SETTINGS, {"question": "q", "k": 2, "beam": 1, "max_len": 5, "explain": False}) == \
        AnswerKey(2, "beam", 1, 5, False)
    s = SearchRequest.model_validate({"queries": ["q"]})
    assert (s.k, s.retriever, s.rerank, s.rerank_candidates) == (5, "model", None, None)
