"""``rag-serve``: an HTTP service over a trained checkpoint: answers with their passages and per-token posterior,
retrieval alone for other processes, and a web page, with concurrent requests batched.

    rag-serve --path checkpoints/rag_token/checkpoint_best.pt [--knowledge KS] [--port 8000] [--workers 2]
    curl -s localhost:8000/v1/answer -H 'Content-Type: application/json' -d '{"question": "Capital of Burundi?"}'
    open http://127.0.0.1:8000/   (the page: the answer, its passages, the per-token posterior)

Endpoints: POST /v1/answer, POST /v1/search, GET /v1/health, GET /v1/info, POST /v1/reload (only with
--admin-token, and then only with it). Binds 127.0.0.1 unless --host says otherwise; no cross-origin requests
unless --cors-origin. SIGTERM lets the requests in flight finish and exits 0. docs/serving.md has the API.
"""
import logging
import typing
from dataclasses import MISSING, fields

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import UserError, cli_main

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
POSITIVE = ("workers", "max_k", "max_batch", "max_pending", "max_question_chars", "max_queries", "max_beam",
            "max_len")


def _arg_type(f):
    """An option's type from its field's annotation: Optional[int] is int (a None default says nothing)."""
    kinds = typing.get_args(f.type) or (f.type,)
    return next((t for t in kinds if t in (int, float)), str)


def build_parser() -> ArgumentParser:
    from rag_plugin.serving.settings import ServeSettings

    p = ArgumentParser(prog="rag-serve", description=__doc__)
    for f in fields(ServeSettings):
        meta = dict(f.metadata)
        if meta.get("internal"):
            continue
        flag = "--" + f.name.replace("_", "-")
        kw = {"help": meta.pop("help"), "dest": f.name}
        if meta.pop("required", False):
            kw["required"] = True
        elif meta.get("action") == "append":
            kw["action"] = meta.pop("action")
        else:
            kw["default"] = None if f.default is MISSING else f.default
            kw["type"] = _arg_type(f)
        p.add_argument(flag, **kw)
    return p


def check(settings) -> None:
    """The settings' own errors, before anything loads."""
    for name in POSITIVE:
        if getattr(settings, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(settings, name)}")
    if not 0 <= settings.port <= 65535:
        raise UserError(f"--port {settings.port} is not a TCP port", fix="use 0..65535 (0: a free one)")
    if settings.max_wait_ms < 0 or settings.timeout <= 0:
        raise UserError("--max-wait-ms must be >= 0 and --timeout > 0",
                        fix=f"got --max-wait-ms {settings.max_wait_ms:g}, --timeout {settings.timeout:g}")
    if settings.n_docs is not None and settings.n_docs < 1:
        raise UserError(f"--n-docs must be at least 1, got {settings.n_docs}")
    if settings.admin_token is not None and len(settings.admin_token) < 8:
        raise UserError("--admin-token is shorter than 8 characters", fix="use a long random token")
    if settings.log_level.lower() not in LOG_LEVELS:
        raise UserError(f"--log-level {settings.log_level!r} is not a log level",
                        fix=f"use one of {', '.join(LOG_LEVELS)}")


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rag_plugin.serving.settings import ServeSettings

    settings = ServeSettings.from_dict(vars(args))
    check(settings)
    from rag_plugin.util.quiet_import import import_fairseq_quietly

    import_fairseq_quietly()  # before logging is set up: fairseq's import notices stay out of the log
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    try:
        from rag_plugin.serving import launch  # start-up: uvicorn, fastapi
    except ImportError as err:
        raise UserError(f"rag-serve needs {err.name}", fix="pip install -e . (fastapi and uvicorn)") from None
    from rag_plugin.util.safe_load import checkpoint_task_options

    checkpoint_task_options(settings.path)  # "checkpoint not found" / unsafe: one line before any worker starts
    try:
        return launch.run(settings)
    except OSError as err:  # the port
        raise UserError(f"cannot listen on {settings.host}:{settings.port} ({err.strerror})",
                        fix="check --host, or pick another --port (0: a free one)") from None
