"""A knowledge-source build split over the processes of a torch.distributed job (``torchrun ...
rag-build-knowledge``): the group the builder's stages run in, and who does what.

:class:`BuildGroup` is the job as the builder sees it: one process (``BuildGroup()``, the default) or the
ranks of a gloo process group joined from torchrun's environment (:meth:`BuildGroup.from_environment`).
Its two ways of running a stage keep the ranks in step and give every rank the same one-line error when
one fails:

* :meth:`BuildGroup.on_main`: rank 0 alone (the checks, the passage store, gathering the vectors, training
  the template index, the manifest) while the others wait; what it returns for everyone is broadcast;
* :meth:`BuildGroup.each`: every rank does its share (:func:`share`: embedding chunks; :func:`shard_builders`:
  index shards); the outcomes are all-gathered.

A :class:`UserError` on any rank stops every rank with its line (exit 2); a rank that dies makes the others'
next collective fail at once (its connections close), or after the group's timeout if it hangs: a one-line
"lost contact" error. Only small pickled summaries go over the group: the work itself goes through files in
the output directory, which every process must see at the same path (:func:`check_same_directory`).
Everything the ranks write is written atomically per embedding chunk and per index shard, so rerunning the
same command, with any number of processes, finishes a build a lost process left unfinished.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple

from tqdm import tqdm

from rag_plugin.indexing.output_dir import shard_path
from rag_plugin.retrieval.knowledge import BUILD_DIR
from rag_plugin.retrieval.shards import assign_holders
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_write_text

#: Default of ``--dist-timeout``: how long a rank waits for the others in one step (rank 0 alone writes the
#: passage store and gathers the vectors while the others wait; the slowest rank finishes its last chunk).
DEFAULT_TIMEOUT_MINUTES = 24 * 60

RERUN = "rerun the same command, with any number of processes, to finish the build"


class BuildStopped(UserError):
    """Another rank of the build stopped: its one-line reason, raised on this rank."""


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).strip().splitlines()[0].split()) if str(err).strip() else ""
    text = text.split("] ", 1)[-1] if text.startswith("[") else text  # gloo's "[file.cc:123] " prefix
    text = text.split(". ")[0]  # and its advice
    text = text or type(err).__name__
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass
class _Outcome:
    """One rank's outcome of a stage, as sent to the others."""

    ok: bool
    value: Any = None
    line: str = ""        # the one-line reason it failed
    user: bool = False    # the reason is a UserError's (shown as is) rather than a crash's

    @classmethod
    def of(cls, value: Any, failure: Optional[BaseException]) -> "_Outcome":
        if failure is None:
            return cls(True, value)
        if isinstance(failure, UserError):
            return cls(False, line=failure.render(), user=True)
        return cls(False, line=f"{type(failure).__name__}: {_first_line(failure)}")


def _use_local_gpu(env) -> None:
    """A build's processes on a node (torchrun's: it sets ``LOCAL_RANK``) each take their own GPU, the
    LOCAL_RANK-th (modulo the node's), as the current CUDA device that ``--device cuda`` (and the default) mean."""
    import torch  # start-up: --help stays light

    local = env.get("LOCAL_RANK")
    if local is not None and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        torch.cuda.set_device(int(local) % torch.cuda.device_count())


class BuildGroup:
    """The processes of one build: ``rank`` of ``world`` (one process: rank 0 of 1, no torch.distributed)."""

    def __init__(self, rank: int = 0, world: int = 1, owns_group: bool = False):
        self.rank, self.world, self._owns_group = int(rank), int(world), owns_group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, timeout_minutes: float = DEFAULT_TIMEOUT_MINUTES, environ=None) -> "BuildGroup":
        """The job torchrun started this process in (``WORLD_SIZE`` > 1: join its gloo group over ``env://``);
        one process otherwise."""
        env = os.environ if environ is None else environ
        try:
            world = int(env.get("WORLD_SIZE") or 1)
        except ValueError:
            raise UserError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} is not a number",
                            fix="launch with torchrun") from None
        if world <= 1:
            return cls()
        if timeout_minutes <= 0:
            raise UserError(f"--dist-timeout must be positive, got {timeout_minutes}", fix="give minutes, e.g. 60")
        _use_local_gpu(env)
        import torch.distributed as dist  # start-up: --help stays light

        if dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        try:
            dist.init_process_group("gloo", init_method="env://", timeout=timedelta(minutes=timeout_minutes))
        except (RuntimeError, ValueError) as err:  # DistNetworkError, DistStoreError and unset variables
            raise UserError(f"cannot join the build's {world} processes: {_first_line(err)}",
                            fix="launch with torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
                            ) from None
        return cls(dist.get_rank(), dist.get_world_size(), owns_group=True)

    def close(self) -> None:
        """Leave the process group (only if this group joined it)."""
        if self._owns_group:
            import torch.distributed as dist  # start-up: --help stays light

            if dist.is_initialized():
                dist.destroy_process_group()
            self._owns_group = False

    # ---------------------------------------------------------------- stages
    def on_main(self, stage: Callable[[], Tuple[Any, Any]]) -> Tuple[Any, Any]:
        """Run ``stage() -> (local, shared)`` on rank 0 while the others wait; returns ``(local, shared)`` on
        rank 0 and ``(None, shared)`` elsewhere. A failure on rank 0 is raised on every rank."""
        local = shared = failure = None
        if self.is_main:
            try:
                local, shared = stage()
            except BaseException as err:  # the others must hear of it, whatever it is
                failure = err
        if self.world == 1:
            if failure is not None:
                raise failure
            return local, shared
        message = [_Outcome.of(shared, failure) if self.is_main else None]
        self._collective(lambda dist: dist.broadcast_object_list(message, src=0), failure)
        if failure is not None:
            raise failure
        outcome = message[0]
        if not outcome.ok:
            raise BuildStopped(outcome.line if outcome.user else f"rank 0 of {self.world} stopped ({outcome.line}): "
                                                                 "see its log")
        return local, outcome.value

    def each(self, stage: Callable[[], Tuple[Any, Any]]) -> Tuple[Any, List[Any]]:
        """Run ``stage() -> (local, shared)`` on every rank; returns ``(local, [shared of every rank])``.
        A failure on any rank is raised on every rank."""
        local = shared = failure = None
        try:
            local, shared = stage()
        except BaseException as err:
            failure = err
        if self.world == 1:
            if failure is not None:
                raise failure
            return local, [shared]
        everyone: List[Optional[_Outcome]] = [None] * self.world
        mine = _Outcome.of(shared, failure)
        self._collective(lambda dist: dist.all_gather_object(everyone, mine), failure)
        if failure is not None:
            raise failure
        for rank, outcome in enumerate(everyone):
            if not outcome.ok:
                who = f"rank {rank} of {self.world}"
                what = outcome.line if outcome.user else f"stopped ({outcome.line}): see its log"
                raise BuildStopped(what if who in what else f"{who}: {what}")
        return local, [outcome.value for outcome in everyone]

    def _collective(self, call: Callable, failure: Optional[BaseException]) -> None:
        """``call(torch.distributed)``; a failure of the collective itself means another rank is gone."""
        import torch.distributed as dist  # start-up: --help stays light

        try:
            call(dist)
        except Exception as err:
            if failure is not None:
                raise failure from None  # this rank's own reason comes first
            raise UserError(f"rank {self.rank} of {self.world}: lost contact with another process of the build "
                            f"({_first_line(err)})", fix=f"a process died or hangs: see its log; {RERUN}") from None


# -------------------------------------------------------------------- who does what
def share(items: Sequence, group: BuildGroup) -> list:
    """This rank's part of ``items`` (every ``world``-th, from its rank: chunks of equal size spread evenly)."""
    return list(items[group.rank::group.world])


def shard_builders(num_shards: int, world: int) -> List[int]:
    """The rank that builds each index shard: the first of the ranks that would hold it
    (:func:`rag_plugin.retrieval.shards.assign_holders`)."""
    return [ranks[0] for ranks in assign_holders(num_shards, world, "rank")]


def _token_path(out: Path) -> Path:
    return out / BUILD_DIR / "job"


def write_job_token(out: Path) -> str:
    """A new random token in ``out/.build/job``: the other ranks read it to prove they see the same directory."""
    token = uuid.uuid4().hex
    atomic_write_text(_token_path(out), token + "\n")
    return token


def check_same_directory(out: Path, token: str, group: BuildGroup) -> None:
    """Refuse to work in an output directory that is not the one rank 0 writes (another machine's disk)."""
    try:
        seen = _token_path(out).read_text(encoding="utf-8").strip()
    except OSError:
        seen = None
    if seen != token:
        raise UserError(f"rank {group.rank} of {group.world} does not see the output directory rank 0 writes "
                        f"({'no' if seen is None else 'another'} {BUILD_DIR}/job file)", path=str(out),
                        fix="put --out on a filesystem every node mounts at the same path")


class ChunkProgress:
    """Rank 0's progress bar over the whole job's embedding: the rows of the chunks finished by any rank
    (files in the shared directory), refreshed after each chunk rank 0 finishes."""

    def __init__(self, shards: Path, todo: Sequence[int], shard_size: int, n: int, enabled: bool):
        self.shards, self.todo, self.shard_size, self.n = shards, list(todo), shard_size, n
        self.bar = None
        if enabled and self.todo:
            self.bar = tqdm(total=n, initial=n - self._rows(self.todo), desc="embedding", unit=" psg",
                            mininterval=1.0, smoothing=0.1)

    def _rows(self, starts: Sequence[int]) -> int:
        return sum(min(self.shard_size, self.n - s) for s in starts)

    def update(self) -> None:
        if self.bar is not None:
            unfinished = [s for s in self.todo if not shard_path(self.shards, s).is_file()]
            self.bar.update(self.n - self._rows(unfinished) - self.bar.n)

    def close(self) -> None:
        """Show the last count (after every rank finished) and close the bar."""
        self.update()
        if self.bar is not None:
            self.bar.close()


def embed_share(mine: Sequence[int], embed_chunk: Callable[[int], None], progress: ChunkProgress) -> float:
    """Embed this rank's chunks (``embed_chunk(start)`` writes one atomically); returns the seconds spent."""
    t0 = time.perf_counter()
    for start in mine:
        embed_chunk(start)
        progress.update()
    return time.perf_counter() - t0
