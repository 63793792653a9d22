"""``--workers N``: N processes (spawned: no torch state is forked) serving one socket bound by the parent.

Each worker loads the model itself (its weights are its own) and opens the knowledge source with the FAISS index
mapped shared (``KnowledgeSource``'s default), so the index's pages are the node's page cache, held once however
many workers read them; each takes its share of the cores for torch. A reload asked of one worker reaches the
others through a stamp file (``ServeSettings.reload_stamp``). The parent restarts a worker that dies while
serving, stops when one fails to start (its one-line error becomes the command's), and on SIGTERM/SIGINT passes
SIGTERM on, waits for every worker to finish its requests, and returns 0."""
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
from dataclasses import replace

from rag_plugin.serving.settings import ServeSettings
from rag_plugin.util.errors import UserError

logger = logging.getLogger("rag_plugin.serving")
#: a worker's exit status when it could not start (bad checkpoint, knowledge source...): not restarted
STARTUP_FAILED = 3


def worker_main(settings_dict: dict, sock, errors) -> None:
    """A worker process: its one-line error into ``errors`` (a queue the parent reads) and STARTUP_FAILED when the
    model cannot be loaded; otherwise serve."""
    from rag_plugin.serving.server import Stop, build_engine, serve
    from rag_plugin.util.quiet_import import import_fairseq_quietly

    stop = Stop().install()
    import_fairseq_quietly()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    settings = ServeSettings.from_dict(settings_dict)
    try:
        engine = build_engine(settings)
    except UserError as err:
        errors.put(err.render())
        raise SystemExit(STARTUP_FAILED) from None
    serve(settings, sock, engine, stop)  # a SIGTERM taken while loading: no serving (the parent waits for it)


def supervise(settings: ServeSettings, sock) -> int:
    stamp = tempfile.NamedTemporaryFile(prefix="rag-serve-reload-", suffix=".stamp", delete=False)
    stamp.close()
    settings = replace(settings, reload_stamp=stamp.name)
    ctx = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())

    errors = ctx.SimpleQueue()

    def start():
        proc = ctx.Process(target=worker_main, args=(settings.to_dict(), sock, errors), name="rag-serve-worker")
        proc.start()
        return proc

    failed = False
    procs = [start() for _ in range(settings.workers)]
    try:
        while not stopping.wait(0.5):
            for i, proc in enumerate(procs):
                if proc.is_alive():
                    continue
                if proc.exitcode == STARTUP_FAILED:
                    failed = True
                    stopping.set()
                    break
                logger.warning("worker %d ended (exit %s); starting another", proc.pid, proc.exitcode)
                procs[i] = start()
    finally:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.join()
        os.unlink(stamp.name)
    if failed:  # the first worker's error, one line (every worker fails alike)
        raise UserError(f"a worker could not start: {errors.get()}")
    return 0
