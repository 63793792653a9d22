"""Running the service: uvicorn on a socket bound here (port 0: a free one), one process or ``--workers N``.

With several workers, uvicorn's supervisor starts N processes on the one socket; each loads the model itself and
opens the knowledge source with its index mapped shared (``KnowledgeSource``'s default), so the index's pages are
the node's page cache, held once however many workers read them. Each worker takes its share of the cores for
torch. SIGTERM (or Ctrl-C) stops accepting connections, lets every request in flight finish, and exits 0."""
import inspect
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from dataclasses import replace

from rag_plugin.serving.settings import ServeSettings

#: the environment variable that hands the settings to worker processes (uvicorn's factory takes no arguments)
SETTINGS_ENV = "RAG_SERVE_SETTINGS"
logger = logging.getLogger("rag_plugin.serving")


def torch_threads(workers: int) -> int:
    """Intra-op threads per worker: the cores shared out (each at least one)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def build_engine(settings: ServeSettings):
    import torch

    from rag_plugin.serving.engine import Engine, load_model

    if settings.workers > 1:
        torch.set_num_threads(torch_threads(settings.workers))
    return Engine(load_model(settings), settings)


def create_app():
    """uvicorn's app factory in a worker process: the settings from SETTINGS_ENV."""
    from rag_plugin.serving.app import build_app

    settings = ServeSettings.from_dict(json.loads(os.environ[SETTINGS_ENV]))
    return build_app(build_engine(settings), settings)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class _Stop:
    """SIGTERM/SIGINT after uvicorn's graceful shutdown: uvicorn raises the signal again once it is done, and this
    handler takes it instead of the default one (which would end the process with the signal's status)."""

    def __init__(self):
        self.signals = []

    def __call__(self, sig, frame):
        self.signals.append(sig)


def run(settings: ServeSettings, announce=print) -> int:
    """Serve until SIGTERM/SIGINT; the exit status (0 after a graceful stop)."""
    import uvicorn

    stop = _Stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    common = dict(log_level=settings.log_level, timeout_graceful_shutdown=None, access_log=False,
                  proxy_headers=False, server_header=False)
    if settings.workers <= 1:
        from rag_plugin.serving.app import build_app

        engine = build_engine(settings)
        config = uvicorn.Config(build_app(engine, settings), **common)
        sock = bind(settings.host, settings.port)
        _announce(announce, settings, sock, engine)
        uvicorn.Server(config).run(sockets=[sock])
        return 0
    from uvicorn.supervisors import Multiprocess

    stamp = tempfile.NamedTemporaryFile(prefix="rag-serve-reload-", suffix=".stamp", delete=False)
    stamp.close()
    settings = replace(settings, reload_stamp=stamp.name)
    os.environ[SETTINGS_ENV] = json.dumps(settings.to_dict())
    config = uvicorn.Config("rag_plugin.serving.server:create_app", factory=True, workers=settings.workers,
                            **common)
    sock = bind(settings.host, settings.port)
    _announce(announce, settings, sock, None)
    if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn before its worker health checks
        supervisor = Multiprocess(config, target=uvicorn.Server(config).run, sockets=[sock])
    else:
        supervisor = Multiprocess(config, sockets=[sock])
    try:
        supervisor.run()
    finally:
        os.unlink(stamp.name)
    failed = [p.exitcode for p in supervisor.processes if p.exitcode not in (None, 0, -signal.SIGTERM)]
    return 1 if failed else 0


def _announce(announce, settings: ServeSettings, sock: socket.socket, engine) -> None:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    what = "" if engine is None else (f" ({engine.variant}, K={engine.default_k}, knowledge version "
                                      f"{engine.version})")
    workers = f", {settings.workers} workers loading" if settings.workers > 1 else ""
    announce(f"rag-serve: serving {settings.path}{what} at http://{shown}:{port}/{workers}", flush=True)
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("rag-serve listens on %s: every host that reaches it can ask it (and, with --admin-token, "
                       "reload it)", settings.host)
    sys.stdout.flush()
