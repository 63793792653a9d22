"""Dynamic batching: requests that arrive together are answered by one forward.

Work runs on lanes, each one thread with its own queue: ``compute`` holds the model (it is not shared between
threads), ``search`` the knowledge source's own first stages (``/v1/search`` without the model), so that a search
does not wait behind a batch of answers. On a lane, batches run in the order they are formed. The first request of
a batch waits at most ``max_wait_ms`` for others with the same key (the same K, decoding, beam...) to join it, up
to its limit of questions; requests that arrive while a batch computes form the next one. A request whose caller
stopped waiting (its timeout) before its batch started is left out of it. Work that must not run beside a batch of
the model (a reload of the knowledge source) is queued on the compute lane with :meth:`Batcher.exclusive`: the
batch computing finishes first, on the version it started with."""
import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List

#: the lanes, each one thread: the model's, and the knowledge source's first stages'
LANES = ("compute", "search")


@dataclass
class Job:
    run: Callable[[Hashable, List[Any]], List[Any]]  # (key, payloads) -> one result per payload
    key: Hashable
    payload: Any
    size: int                     # questions it holds
    limit: int                    # the most questions a batch of its kind holds
    lane: str = "compute"         # the thread it runs on (LANES)
    future: asyncio.Future = field(repr=False, default=None)

    def group(self):
        return (self.run, self.key)


class _Lane:
    """One thread, its queue and the loop that forms its batches."""

    def __init__(self, name: str, batcher: "Batcher"):
        self.name, self.batcher = name, batcher
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"rag-serve-{name}")
        self.task = asyncio.get_running_loop().create_task(self._loop(), name=f"rag-serve-{name}-batcher")

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        while not self.queue.empty():
            _fail(self.queue.get_nowait())
        self.executor.shutdown(wait=True)

    async def _loop(self) -> None:
        while True:
            jobs = [await self.queue.get()]
            try:
                await self._gather(jobs)
                for batch in _batches(jobs):
                    await self._compute(batch)
            except asyncio.CancelledError:  # stop(): what was gathered and not answered fails
                for j in jobs:
                    _fail(j)
                raise

    async def _gather(self, jobs: List[Job]) -> None:
        """Add to ``jobs`` what is queued, then what comes within max_wait, until the first job's batch is full."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batcher.max_wait
        while True:
            while not self.queue.empty():
                jobs.append(self.queue.get_nowait())
            if _filled(jobs):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            try:
                jobs.append(await asyncio.wait_for(self.queue.get(), remaining))
            except asyncio.TimeoutError:
                return

    async def _compute(self, batch: List[Job]) -> None:
        live = [j for j in batch if not j.future.done()]  # a caller that timed out has cancelled its future
        if not live:
            return
        first = live[0]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.executor, first.run, first.key, [j.payload for j in live])
        except Exception as err:  # the batch's error is each of its requests'
            for j in live:
                if not j.future.done():
                    j.future.set_exception(err)
            return
        self.batcher.batches += 1
        self.batcher.batched += sum(j.size for j in live)
        for j, result in zip(live, results):
            if not j.future.done():
                j.future.set_result(result)


class Batcher:
    def __init__(self, max_wait_ms: float):
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self._lanes: Dict[str, _Lane] = {}
        self.batches = 0          # batches computed so far (for /v1/health and the tests)
        self.batched = 0          # questions in them

    def start(self) -> None:
        self._lanes = {name: _Lane(name, self) for name in LANES}

    async def stop(self) -> None:
        """After the last response: stop gathering; what is still queued fails; the lanes' threads are joined."""
        for lane in self._lanes.values():
            await lane.stop()

    async def submit(self, job: Job) -> Any:
        """Queue ``job`` on its lane; its result once its batch is computed (cancelling the wait leaves it out of its
        batch if that batch has not started)."""
        job.future = asyncio.get_running_loop().create_future()
        self._lanes[job.lane].queue.put_nowait(job)
        return await job.future

    async def exclusive(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the compute lane's thread, after the batch computing now."""
        return await asyncio.get_running_loop().run_in_executor(self._lanes["compute"].executor, fn)


def _fail(job: Job) -> None:
    if not job.future.done():
        job.future.set_exception(RuntimeError("the service is shutting down"))


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
