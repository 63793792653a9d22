"""Dynamic batching: requests that arrive together are answered by one forward.

Every computation runs on one thread (the model is not shared between threads), in the order the batches are
formed. The first request of a batch waits at most ``max_wait_ms`` for others with the same key (the same K,
decoding, beam...) to join it, up to ``max_batch`` questions; requests that arrive while a batch computes form
the next one. A request whose caller stopped waiting (its timeout) before its batch started is left out of it.
Work that must not run beside a batch (a reload of the knowledge source) is queued on the same thread with
:meth:`Batcher.exclusive`: the batch computing finishes first, on the version it started with."""
import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, List, Optional


@dataclass
class Job:
    run: Callable[[Hashable, List[Any]], List[Any]]  # (key, payloads) -> one result per payload
    key: Hashable
    payload: Any
    size: int                     # questions it holds
    limit: int                    # the most questions a batch of its kind holds
    future: asyncio.Future = field(repr=False, default=None)

    def group(self):
        return (self.run, self.key)


class Batcher:
    def __init__(self, max_wait_ms: float):
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self._queue: Optional[asyncio.Queue] = None
        self._task: Optional[asyncio.Task] = None
        self._executor: Optional[ThreadPoolExecutor] = None
        self.batches = 0          # batches computed so far (for /v1/health and the tests)
        self.batched = 0          # questions in them

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rag-serve-compute")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="rag-serve-batcher")

    async def stop(self) -> None:
        """After the last response: stop gathering; what is still queued fails; the compute thread is joined."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        while self._queue is not None and not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(RuntimeError("the service is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def submit(self, job: Job) -> Any:
        """Queue ``job``; its result once its batch is computed (cancelling the wait leaves it out of its batch if
        that batch has not started)."""
        job.future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(job)
        return await job.future

    async def exclusive(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the compute thread, after the batch computing now."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    # ------------------------------------------------------------------ the gathering loop
    async def _loop(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            try:
                await self._gather(jobs)
                for batch in _batches(jobs):
                    await self._compute(batch)
            except asyncio.CancelledError:  # stop(): what was gathered and not answered fails
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(RuntimeError("the service is shutting down"))
                raise

    async def _gather(self, jobs: List[Job]) -> None:
        """Add to ``jobs`` what is queued, then what comes within max_wait, until the first job's batch is full."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait
        while True:
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            if _filled(jobs):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                jobs.append(await asyncio.wait_for(self._queue.get(), remaining))
            except asyncio.TimeoutError:
                return

    async def _compute(self, batch: List[Job]) -> None:
        live = [j for j in batch if not j.future.done()]  # a caller that timed out has cancelled its future
        if not live:
            return
        first = live[0]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, first.run, first.key, [j.payload for j in live])
        except Exception as err:  # the batch's error is each of its requests'
            for j in live:
                if not j.future.done():
                    j.future.set_exception(err)
            return
        self.batches += 1
        self.batched += sum(j.size for j in live)
        for j, result in zip(live, results):
            if not j.future.done():
                j.future.set_result(result)


def _filled(jobs: List[Job]) -> bool:
    """The first job's batch is full."""
    first = jobs[0]
    return sum(j.size for j in jobs if j.group() == first.group()) >= first.limit


def _batches(jobs: List[Job]) -> List[List[Job]]:
    """``jobs`` by key, in the order each key first came, each cut into batches of at most its limit."""
    groups = {}
    for j in jobs:
        groups.setdefault(j.group(), []).append(j)
    out = []
    for members in groups.values():
        batch, size = [], 0
        for j in members:
            if batch and size + j.size > j.limit:
                out.append(batch)
                batch, size = [], 0
            batch.append(j)
            size += j.size
        out.append(batch)
    return out
