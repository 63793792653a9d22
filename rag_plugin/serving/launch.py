"""``rag-serve``'s start: the socket bound (port 0: a free one), the address announced, then this process serving
(:mod:`.server`) or ``--workers N`` processes (:mod:`.workers`); the exit status, 0 after a graceful stop."""
import logging
import socket
import sys

from rag_plugin.serving.server import Stop, bind, build_engine, serve
from rag_plugin.serving.settings import ServeSettings

logger = logging.getLogger("rag_plugin.serving")


def run(settings: ServeSettings, announce=print) -> int:
    """Serve until SIGTERM/SIGINT; the exit status (0 after a graceful stop)."""
    stop = Stop().install()
    if settings.workers <= 1:
        engine = build_engine(settings)
        sock = bind(settings.host, settings.port)
        _announce(announce, settings, sock, engine)
        serve(settings, sock, engine, stop)
        return 0
    from rag_plugin.serving.workers import supervise  # start-up: multiprocessing's spawn

    sock = bind(settings.host, settings.port)
    _announce(announce, settings, sock, None)
    return supervise(settings, sock)


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
