"""One process serving: the engine built, uvicorn on a socket bound here (port 0: a free one). SIGTERM (or Ctrl-C)
stops accepting connections and lets every request in flight finish (:class:`Stop`)."""
import logging
import os
import signal
import socket

from rag_plugin.serving.settings import ServeSettings

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


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP: asyncio sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


class Stop:
    """SIGTERM/SIGINT's handler around uvicorn: uvicorn takes the signals while it serves, shuts down gracefully,
    then raises the signal again; this handler takes it there instead of the default one (which would end the
    process with the signal's status, skipping its clean-up)."""

    def __init__(self):
        self.signals = []

    def __call__(self, sig, frame):
        self.signals.append(sig)

    def install(self) -> "Stop":
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self)
        return self


def serve(settings: ServeSettings, sock: socket.socket, engine=None, stop: "Stop" = None) -> None:
    """Serve ``sock`` in this process until SIGTERM/SIGINT (the engine built here unless given). ``stop``: the
    handler installed at the start; a signal it took while the model was loading ends the process here, before
    serving (uvicorn would not know of it, and would serve on)."""
    import uvicorn

    from rag_plugin.serving.app import build_app

    engine = engine if engine is not None else build_engine(settings)
    if stop is not None and stop.signals:
        return
    config = uvicorn.Config(build_app(engine, settings), log_level=settings.log_level, access_log=False,
                            timeout_graceful_shutdown=None, proxy_headers=False, server_header=False)
    uvicorn.Server(config).run(sockets=[sock])
