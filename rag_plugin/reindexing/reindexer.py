"""``--reindex-every N``: while the document encoder trains (``--train-doc-encoder``), embed the knowledge source
again every N updates in background processes, and switch every rank to the new version at the same step.

At an update that is a multiple of N, when no re-index is running on any rank, each rank writes a snapshot of
the document tower (``model.doc_encoder_state()``, a safetensors file in ``KS/.reindex/``) and starts one process
(``python -m rag_plugin.indexing.reembed``, :mod:`rag_plugin.indexing.reembed`; ``--reindex-threads`` threads, niced,
killed with the trainer) that embeds its share of the passages (rank r: chunks r, r + world, ...); rank 0's
process waits for every chunk, builds the index and makes the new version current. Training goes on meanwhile
with the version it has open (the stale index).

Each step every rank reads ``CURRENT``; the ranks agree (an all-reduce MIN over a gloo group, only when
torch.distributed is initialised) on the newest version every one of them sees and whether a re-index is still
running anywhere; a newer version is opened by every rank at that same step, and the task hands the model its
retrieval of it (``task.reopen_knowledge``, ``RagModel.use_retrieval``). A re-index that fails is one warning line
naming its log; training goes on, and the next one tries again. At exit a running re-index is stopped (its partial
version stays partial).

That switch comes at whatever update the re-index lands, so a faster or slower machine trains on other versions
at other steps. ``--reindex-switch-after M`` makes it reproducible: the re-index started at update u is switched
in at update u + M exactly, by every rank, never earlier (a version that landed sooner waits), and the trainer
waits for it there if it has not landed (a logged wait; a failed re-index ends the wait, without a switch, on
every rank together); the next re-index starts at the first multiple of N at or after the switch.

``--reindex-device cuda`` runs each rank's re-index on that rank's own GPU: the one its model is on, else the one
fairseq selected for it (:func:`rag_plugin.util.devices.current_cuda_device`), whatever the launcher.
"""
from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

import rag_plugin
from rag_plugin.indexing.reembed import CHUNK_SIZE, REINDEX_DIR, chunk_dir, save_tower_state
from rag_plugin.indexing.update import remove_old_versions
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.util.devices import current_cuda_device, model_device, resolve_device
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)

#: how long a stopped re-index process gets to end after SIGTERM before it is killed
STOP_SECONDS = 30


def unwrapped(model):
    """The model inside fairseq's / torch's distributed wrappers."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


def check_options(task, model) -> None:
    """One-line errors for a ``--reindex-every`` that could not do anything useful."""
    cfg = task.cfg
    if int(getattr(cfg, "reindex_keep", 0) or 0) < 0:
        raise UserError(f"--reindex-keep must be 0 (keep every version) or more, got {cfg.reindex_keep}",
                        fix="e.g. --reindex-keep 2")
    if cfg.reindex_every < 0 or cfg.reindex_threads < 1:
        raise UserError(f"--reindex-every must be 0 or more and --reindex-threads 1 or more, got "
                        f"{cfg.reindex_every} and {cfg.reindex_threads}", fix="e.g. --reindex-every 500")
    if switch_after(cfg) < 0:
        raise UserError(f"--reindex-switch-after must be 0 (switch when the re-index lands) or more, got "
                        f"{cfg.reindex_switch_after}", fix="e.g. --reindex-switch-after 100")
    _check_device(cfg)
    if not getattr(unwrapped(model).cfg, "train_doc_encoder", False):
        raise UserError("--reindex-every re-embeds the passages with the document encoder being trained: it needs "
                        "--train-doc-encoder (an unchanged encoder would write the same vectors again)",
                        fix="add --train-doc-encoder, or leave out --reindex-every")
    if cfg.n_docs == 0 or str(cfg.retriever) == "bm25":
        raise UserError("--reindex-every needs dense retrieval (there is no index to re-embed closed book or with "
                        "--retriever bm25)", fix="leave out --reindex-every")
    if task.knowledge.imported:
        raise UserError("--reindex-every: this knowledge source's vectors were imported; its document encoder "
                        "cannot re-embed them", path=str(task.knowledge.directory),
                        fix="rebuild it with rag-build-knowledge, or leave out --reindex-every")


def switch_after(cfg) -> int:
    """``--reindex-switch-after`` (0: switch when the re-index lands)."""
    return int(getattr(cfg, "reindex_switch_after", 0) or 0)


def _check_device(cfg) -> None:
    """``--reindex-device``: cpu, cuda or cuda:N, where the machine has it."""
    device = str(getattr(cfg, "reindex_device", "cpu") or "cpu")
    if device.strip().lower() == "auto":
        raise UserError("--reindex-device auto: say where the re-index runs", fix="use cpu, cuda or cuda:N")
    resolve_device(device, "--reindex-device")


class Reindexer:
    """The re-index processes of one rank and the agreement on when to switch (see the module docstring)."""

    chunk_size = CHUNK_SIZE  # passages per embedding chunk (tests make it small)

    def __init__(self, root: Path, cfg, log: Callable[[str], None] = logger.info):
        self.root, self.cfg, self.log = Path(root), cfg, log
        self.work = self.root / REINDEX_DIR
        self.rank, self.world, self.group = 0, 1, None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.group = dist.new_group(backend="gloo")  # every rank makes it at its first step
        self.proc: Optional[subprocess.Popen] = None
        self.started_update, self.started_at, self.log_file = -1, 0.0, None
        self.started_version = 0  # the version the running (or last) re-index embeds again
        self.pending = False  # --reindex-switch-after: a re-index started and not switched in yet
        self.followers = ()  # models that switch with the trained one (step's)
        self.failed = False  # this rank's process of the last re-index exited with an error
        self._libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
        atexit.register(self.close)

    @classmethod
    def for_task(cls, task, model) -> "Reindexer":
        """The re-indexer of ``task``'s knowledge source, the options checked (the task makes it at its first training
        step)."""
        check_options(task, model)
        return cls(Path(task.knowledge.root), task.cfg)

    # ------------------------------------------------------------------ each step
    def step(self, task, model, update_num: int, followers=()) -> None:
        """Before the step ``update_num``: note a finished re-index, switch to a newer version every rank sees,
        start a re-index at a multiple of ``--reindex-every`` if none is running anywhere. With
        ``--reindex-switch-after M``: the switch comes at the update the re-index started + M, and a new one starts
        only once the last one is switched in. ``followers``: models that read the same retrieval as ``model`` and
        switch with it (fairseq's EMA copy under --store-ema)."""
        self.followers = tuple(followers)
        self._poll(task)
        after = switch_after(self.cfg)
        if after:
            if self.pending and update_num >= self.started_update + after:
                self._switch_when_landed(task, model, update_num)
            running = self.pending
        else:
            seen, running = self._agree(self._seen(task), self.proc is not None)
            if seen > task.knowledge.version:
                self._switch(task, model, seen, update_num)
        every = self.cfg.reindex_every
        if update_num > 0 and update_num % every == 0 and update_num != self.started_update and not running:
            self._start(task, model, update_num)

    def _seen(self, task) -> int:
        """The newest complete version this rank sees (``CURRENT``)."""
        try:
            return versions.current_version(self.root)
        except UserError:
            return task.knowledge.version

    def _agree(self, seen: int, running: bool):
        """(the smallest version every rank sees, whether any rank's re-index runs): one all-reduce."""
        if self.group is None:
            return seen, running
        both = torch.tensor([seen, -int(running)], dtype=torch.long)
        dist.all_reduce(both, op=dist.ReduceOp.MIN, group=self.group)
        return int(both[0]), bool(-int(both[1]))

    def _switch_when_landed(self, task, model, update_num: int) -> None:
        """``--reindex-switch-after``: switch to the version the pending re-index writes, every rank at this update;
        wait for it until it has landed for every rank (or failed on one: then no switch)."""
        target, waited, t0 = self.started_version + 1, False, time.monotonic()
        while True:
            self._poll(task)
            seen, failed = self._agree(self._seen(task), self.failed)
            if seen >= target or failed:
                break
            if not waited and self.rank == 0:
                self.log(f"update {update_num}: waiting for the re-index started at update {self.started_update} "
                         f"(--reindex-switch-after {switch_after(self.cfg)}): knowledge version {target} has not "
                         f"landed yet")
            waited = True
            time.sleep(0.2)
        self.pending = False
        if seen < target:
            if not self.failed:  # this rank's own failure was the warning of _poll
                logger.warning("re-index started at update %d failed on another rank: no switch at update %d; "
                               "training goes on with knowledge version %d, the next re-index tries again",
                               self.started_update, update_num, task.knowledge.version)
            return
        if waited and self.rank == 0:
            self.log(f"waited {time.monotonic() - t0:.1f}s at update {update_num} for knowledge version {target}")
        self._switch(task, model, target, update_num)

    def _switch(self, task, model, version: int, update_num: int) -> None:
        old = task.knowledge.version
        task.reopen_knowledge(version, models=[unwrapped(model), *self.followers])
        self.log(f"knowledge version {version} (was {old}) is read from update {update_num} on, by every rank")
        keep = int(getattr(self.cfg, "reindex_keep", 0) or 0)
        if self.rank == 0 and keep > 0:
            self._remove_old_versions(keep)

    def _remove_old_versions(self, keep: int) -> None:
        """--reindex-keep: the versions older than the ``keep`` newest go, unless a process has one open (another
        rank still switching: it goes at the next switch)."""
        try:
            with versions.UpdateLock(self.root):
                remove_old_versions(self.root, keep, self.log)
        except UserError as e:  # an update of the source is running: the next switch tries again
            self.log(f"old versions kept for now: {e}")

    # ------------------------------------------------------------------ the processes
    def _start(self, task, model, update_num: int) -> None:
        state = unwrapped(model).doc_encoder_state()
        tower = save_tower_state(state, self.work / f"snapshot-rank{self.rank}.safetensors")
        base = task.knowledge.version
        if self.rank == 0:  # chunks of earlier, unfinished re-indexes will never be used
            keep = chunk_dir(self.root, base, state_dict_sha256(state)).name
            for d in self.work.glob("v*-*"):
                if d.is_dir() and d.name != keep:
                    shutil.rmtree(d, ignore_errors=True)
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        self.log_file = self.work / "logs" / f"update{update_num:09d}-rank{self.rank}.log"
        result = self.work / f"result-rank{self.rank}.json"
        result.unlink(missing_ok=True)
        cfg = self.cfg
        cmd = [sys.executable, "-m", "rag_plugin.indexing.reembed", "--knowledge", str(self.root),
               "--tower", str(tower),
               "--what", f"training snapshot at update {update_num}", "--base-version", str(base),
               "--rank", str(self.rank), "--world", str(self.world), "--threads", str(cfg.reindex_threads),
               "--batch-size", str(cfg.reindex_batch_size), "--wait-minutes", str(cfg.reindex_wait_minutes),
               "--chunk-size", str(self.chunk_size), "--result", str(result), "--device", self._device(model)]
        lower = getattr(unwrapped(model), "_lower_states", None)  # --doc-encoder-train-layers: the layers above only
        if lower is not None:
            cmd += ["--lower-states", str(lower.directory)]
        with open(self.log_file, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                                         stdin=subprocess.DEVNULL, preexec_fn=self._child_setup(os.getpid()))
        self.started_update, self.started_at = update_num, time.monotonic()
        self.started_version, self.pending, self.failed = base, bool(switch_after(cfg)), False
        if self.rank == 0:
            self.log(f"re-index of knowledge version {base} started at update {update_num} ({self.world} "
                     f"process(es), log {self.log_file})")

    def _device(self, model) -> str:
        """Where this rank's re-index runs: ``--reindex-device``, ``cuda`` being this rank's own GPU (the model's,
        else the one fairseq set for this process)."""
        device = str(getattr(self.cfg, "reindex_device", "cpu") or "cpu").strip().lower()
        if device != "cuda":
            return device
        on = model_device(unwrapped(model))
        return str(on if on.type == "cuda" else current_cuda_device())

    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        threads = str(self.cfg.reindex_threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        package_parent = str(Path(rag_plugin.__file__).resolve().parents[1])  # --user-dir: not installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        return env

    def _child_setup(self, parent: int):
        libc = self._libc

        def setup():  # in the child, before exec: lower priority; die with the trainer
            os.nice(10)
            if libc is not None:
                libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                if os.getppid() != parent:  # the trainer died before that
                    os._exit(1)

        return setup

    def _poll(self, task) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        rc, self.proc = self.proc.returncode, None
        seconds = time.monotonic() - self.started_at
        self.failed = rc != 0
        if rc != 0:
            logger.warning("re-index started at update %d failed (exit %d) after %.0fs: see %s; training goes on "
                           "with knowledge version %d, the next re-index tries again", self.started_update, rc,
                           seconds, self.log_file, task.knowledge.version)
        elif self.rank == 0:
            try:
                done = json.loads((self.work / "result-rank0.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                done = {}
            self.log(f"re-index started at update {self.started_update} wrote knowledge version "
                     f"{done.get('version', '?')} in {seconds:.1f}s")

    def close(self) -> None:
        """Stop a running re-index (at the end of training or exit; its partial version stays partial), or wait for it
        (``--reindex-wait-at-exit``)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if getattr(self.cfg, "reindex_wait_at_exit", False):
            logger.info("waiting for the re-index started at update %d to land (--reindex-wait-at-exit): see %s",
                        self.started_update, self.log_file)
            rc = proc.wait()
            logger.info("the re-index started at update %d ended (exit %d) after %.0fs", self.started_update, rc,
                        time.monotonic() - self.started_at)
            return
        proc.terminate()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logger.info("stopped the re-index started at update %d (unfinished: the next run starts afresh)",
                    self.started_update)
