"""The service's routes (FastAPI): ``/v1/answer``, ``/v1/search``, ``/v1/health``, ``/v1/info``, ``/v1/reload``, and
the web page at ``/`` (static files of this package only). Every refusal is a 4xx whose JSON body is one line
naming the field: ``{"error": "...", "field": "..."}``; the service keeps serving."""
import asyncio
import hmac
import json
import logging
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from rag_plugin.serving.batcher import Batcher, Job
from rag_plugin.serving.schemas import (
    AnswerRequest,
    AnswerResponse,
    BadRequest,
    SearchRequest,
    SearchResponse,
    check_answer,
    check_search,
)
from rag_plugin.util.errors import UserError

logger = logging.getLogger("rag_plugin.serving")
STATIC = Path(__file__).resolve().parent / "static"
#: the largest request body read (bytes); a larger one is 413
MAX_BODY = 1 << 20


def error(status: int, message: str, field=None) -> JSONResponse:
    return JSONResponse({"error": " ".join(str(message).split()), "field": field}, status_code=status)


async def read_body(request: Request, model):
    """The request's JSON body as ``model``: 415 for another content type, 413 over MAX_BODY, 400 for bad JSON,
    422 for a body of the wrong shape (naming the field)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(f"the body must be application/json, got {kind or 'no content type'}", "content-type", 415)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:  # refused before it is read
        raise BadRequest(f"the body has {int(declared)} bytes, more than {MAX_BODY}", None, 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest(f"the body has more than {MAX_BODY} bytes", None, 413)
    raw = b"".join(chunks)
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise BadRequest(f"the body is not valid JSON: {err}", None, 400) from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", None, 422)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        raise BadRequest(f"{where}: {first['msg']}" if where else first["msg"], where, 422) from None


class Service:
    """The engine, its batcher and the service's counters."""

    def __init__(self, engine, settings):
        self.engine, self.settings = engine, settings
        self.batcher = Batcher(settings.max_wait_ms)
        self.pending = 0
        self.reload_epoch = read_epoch(settings.reload_stamp)

    async def follow_reloads(self) -> None:
        """--workers N: a reload another worker was asked for reaches this one before its next request."""
        epoch = read_epoch(self.settings.reload_stamp)
        if epoch > self.reload_epoch:
            self.reload_epoch = epoch
            previous, now = await self.batcher.exclusive(self.engine.reload)
            logger.info("knowledge source reloaded (asked of another worker): version %d -> %d", previous, now)

    async def reload(self):
        previous, now = await self.batcher.exclusive(self.engine.reload)
        if self.settings.reload_stamp:
            self.reload_epoch = read_epoch(self.settings.reload_stamp) + 1
            write_epoch(self.settings.reload_stamp, self.reload_epoch)
        logger.info("knowledge source reloaded: version %d -> %d", previous, now)
        return {"knowledge_version": now, "previous": previous}

    async def submit(self, job: Job):
        if self.pending >= self.settings.max_pending:
            raise BadRequest(f"the service holds {self.pending} requests (--max-pending); try again", None, 503)
        self.pending += 1
        try:
            await self.follow_reloads()
            return await asyncio.wait_for(self.batcher.submit(job), self.settings.timeout)
        except asyncio.TimeoutError:
            raise BadRequest(f"no answer within --timeout {self.settings.timeout:g} s; the request was dropped",
                             None, 503) from None
        finally:
            self.pending -= 1

    def answer_job(self, req: AnswerRequest) -> Job:
        e = self.engine
        check_answer(req, self.settings, e.variant, e.max_k)
        return Job(run=e.answer, key=e.key(req), payload=req.question, size=1, limit=self.settings.max_batch)

    def search_job(self, req: SearchRequest) -> Job:
        s, searcher = self.settings, self.engine.searcher
        check_search(req, s, self.engine.max_k, searcher.max_depth)
        key = searcher.key(req)
        return Job(run=self._search, key=key, payload=list(req.queries), size=len(req.queries),
                   limit=max(s.max_queries, s.max_batch), lane=searcher.lane(key))

    def _search(self, key, payloads):
        flat = [q for queries in payloads for q in queries]
        hits, version = self.engine.searcher.search(key, flat)  # the version the batch read
        out, start = [], 0
        for queries in payloads:
            out.append((hits[start:start + len(queries)], version))
            start += len(queries)
        return out


def build_app(engine, settings) -> FastAPI:
    service = Service(engine, settings)

    @asynccontextmanager
    async def lifespan(app):
        service.batcher.start()
        yield
        await service.batcher.stop()

    app = FastAPI(title="rag-serve", lifespan=lifespan, docs_url=None, redoc_url=None)  # no CDN pages
    app.state.service = service
    _errors(app)
    _cors(app, settings)

    @app.post("/v1/answer", response_model=AnswerResponse)
    async def answer(request: Request):
        started = time.perf_counter()
        req = await read_body(request, AnswerRequest)
        result = await service.submit(service.answer_job(req))
        return {**result, "elapsed_ms": 1000.0 * (time.perf_counter() - started)}

    @app.post("/v1/search", response_model=SearchResponse)
    async def search(request: Request):
        req = await read_body(request, SearchRequest)
        job = service.search_job(req)
        results, version = await service.submit(job)
        return {"results": results, "retriever": req.retriever, "rerank": req.rerank, "knowledge_version": version}

    @app.get("/v1/health")
    async def health():
        return {"status": "ok", "knowledge_version": engine.version, "pending": service.pending,
                "batches": service.batcher.batches, "batched": service.batcher.batched}

    @app.get("/v1/info")
    async def info():
        return engine.info()

    @app.post("/v1/reload")
    async def reload(request: Request):
        _authorize(request, settings.admin_token)
        return await service.reload()

    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")  # refuses paths out of the folder
    return app


def read_epoch(path) -> int:
    """How many reloads the workers were asked for (0 without a stamp file: one process)."""
    if not path:
        return 0
    try:
        return int(Path(path).read_text() or 0)
    except (OSError, ValueError):
        return 0


def write_epoch(path: str, epoch: int) -> None:
    tmp = f"{path}.{os.getpid()}"
    Path(tmp).write_text(str(epoch))
    os.replace(tmp, path)  # atomic: a worker reads the old number or the new one


def _authorize(request: Request, token) -> None:
    if not token:
        raise BadRequest("POST /v1/reload is off: start rag-serve with --admin-token TOKEN to enable it", None, 403)
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise BadRequest("POST /v1/reload needs the header 'Authorization: Bearer <--admin-token>'",
                         "authorization", 401)


def _cors(app: FastAPI, settings) -> None:
    """Cross-origin requests only from the origins given (--cors-origin); none by default."""
    if settings.cors_origin:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origin), allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"])


def _errors(app: FastAPI) -> None:
    @app.exception_handler(BadRequest)
    async def bad_request(request, err: BadRequest):
        return error(err.status, err.message, err.field)

    @app.exception_handler(UserError)
    async def user_error(request, err: UserError):  # the knowledge source or model refused (a reload, say)
        return error(409, err.render())

    @app.exception_handler(HTTPException)
    async def http_error(request, err: HTTPException):
        return error(err.status_code, f"{request.method} {request.url.path}: {err.detail}")

    @app.exception_handler(Exception)
    async def internal(request, err: Exception):
        logger.exception("%s %s failed", request.method, request.url.path)
        return error(500, f"internal error ({type(err).__name__}: {err}); the service is still up")
