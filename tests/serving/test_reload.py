"""POST /v1/reload while the service is answering: the real rag-serve over a copy of the tiny world's knowledge
source, four threads asking /v1/answer and /v1/search, and meanwhile the top passage of their question deleted
(``update_knowledge_source`` in the test process) and the service reloaded. No request fails; every response says
the version it was computed on, 1 (the deleted passage still there) or 2 (never); afterwards the service reads
version 2. And in process: the version a response carries is the one its batch read, even when a reload finishes
before the response is written."""
import asyncio
import shutil
import threading
import time

import pytest

from tests.serving.live import LiveServer

TOKEN = "TOKEN12345"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUESTION = "What is the capital of Kakaka?"
#: the requests of the load (by kind): an answer and the three first stages' searches, each of 3 passages
BODIES = {"answer": {"question": QUESTION, "k": 3, "beam": 2, "max_len": 4},
          "model": {"queries": [QUESTION], "k": 3},
          "dense": {"queries": [QUESTION], "k": 3, "retriever": "dense"},
          "bm25": {"queries": [QUESTION], "k": 3, "retriever": "bm25"}}


def ask(server, kind):
    """(status, knowledge version, passage ids best first) of one request of the load."""
    path = "/v1/answer" if kind == "answer" else "/v1/search"
    status, body = server.post(path, BODIES[kind])
    if status != 200:
        return status, body, None
    ids = [p["id"] for p in body["passages"]] if kind == "answer" else [h["id"] for h in body["results"][0]]
    return status, body["knowledge_version"], ids


def delete_passage(ks, passage_id: str, tmp_path) -> None:
    from rag_plugin.indexing.update import update_knowledge_source

    (tmp_path / "gone.txt").write_text(passage_id + "\n")
    update_knowledge_source(str(ks), delete=str(tmp_path / "gone.txt"), progress=False, log=lambda m: None)


@pytest.fixture
def served_copy(trained, tiny_world, tmp_path):
    """rag-serve over rag_token_tiny reading a copy of the tiny world's knowledge source, with an admin token."""
    ks = tmp_path / "ks"
    shutil.copytree(tiny_world["ks"], ks)
    server = LiveServer(trained["rag_token_tiny"], tmp_path / "rag-serve.log",
                        ["--knowledge", str(ks), "--admin-token", TOKEN, "--max-batch", "8", "--max-wait-ms", "20"])
    yield server.wait_up(), ks
    assert server.stop() == 0, server.log()[-3000:]


class Load:
    """4 threads x 15 requests (the four kinds in turn). Requests 10..12 of each thread wait until the reload has
    been asked for (so some are in flight while it runs), 13..14 until it has returned (so some read version 2)."""

    def __init__(self, server, threads=4, per_thread=15):
        self.server, self.records, self.lock = server, [], threading.Lock()
        self.reload_asked, self.reloaded = threading.Event(), threading.Event()
        self.times = {}
        self.workers = [threading.Thread(target=self._work, args=(n, per_thread)) for n in range(threads)]

    def _work(self, n, per_thread):
        kinds = list(BODIES)
        for i in range(per_thread):
            if i >= 10:
                (self.reload_asked if i < 13 else self.reloaded).wait(120)
            kind = kinds[(n + i) % len(kinds)]
            sent = time.monotonic()
            status, version, ids = ask(self.server, kind)
            with self.lock:
                self.records.append({"kind": kind, "status": status, "version": version, "ids": ids, "sent": sent,
                                     "done": time.monotonic()})

    def start(self):
        for w in self.workers:
            w.start()

    def done(self):
        with self.lock:
            return len(self.records)

    def join(self):
        for w in self.workers:
            w.join(300)
            assert not w.is_alive(), "a thread of the load never finished"


@pytest.mark.slow
def test_reload_during_load_answers_every_request_on_one_version(served_copy, tmp_path):
    server, ks = served_copy
    passages = server.get("/v1/info")[1]["knowledge"]["passages"]
    before = {kind: ask(server, kind) for kind in BODIES}
    assert all(status == 200 and version == 1 for status, version, _ in before.values()), before
    # the question's best passage that every kind retrieves (the model's retrieval and BM25 rank differently)
    common = [i for i in before["model"][2] if all(i in ids for _, _, ids in before.values())]
    assert common, before
    gone = common[0]

    load = Load(server)
    load.start()
    deadline = time.monotonic() + 120
    while load.done() < 6:  # the load is running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    delete_passage(ks, gone, tmp_path)  # version 2, written while the service reads version 1
    load.times["asked"] = time.monotonic()
    load.reload_asked.set()
    status, reloaded = server.post("/v1/reload", {}, headers=AUTH)
    load.times["returned"] = time.monotonic()
    load.reloaded.set()
    load.join()
    assert status == 200 and reloaded == {"knowledge_version": 2, "previous": 1}, reloaded

    after = {kind: ask(server, kind) for kind in BODIES}
    assert all(status == 200 and version == 2 and gone not in ids for status, version, ids in after.values()), after
    records = load.records
    assert len(records) == 60
    failed = [r for r in records if r["status"] != 200]
    assert not failed, failed[:3]
    assert {r["version"] for r in records} == {1, 2}
    overlapping = [r for r in records if r["sent"] < load.times["returned"] and r["done"] > load.times["asked"]]
    assert overlapping, "no request was in flight while the reload ran"
    for r in records:
        # each response is exactly its version's: version 1 still has the deleted passage, version 2 never
        expect = before if r["version"] == 1 else after
        assert r["ids"] == expect[r["kind"]][2], r
        assert (gone in r["ids"]) == (r["version"] == 1), r
        if r["done"] < load.times["asked"]:
            assert r["version"] == 1, r
        if r["sent"] > load.times["returned"]:
            assert r["version"] == 2, r

    status, info = server.get("/v1/info")
    assert status == 200 and info["knowledge"]["version"] == 2
    assert info["knowledge"]["passages"] == passages - 1
    status, health = server.get("/v1/health")
    assert status == 200 and health["knowledge_version"] == 2

    # a reload with nothing new keeps the version; one without the token changes nothing
    assert server.post("/v1/reload", {}, headers=AUTH) == (200, {"knowledge_version": 2, "previous": 2})
    status, refused = server.post("/v1/reload", {}, headers={"Authorization": "Bearer wrong-token"})
    assert status == 401 and refused["field"] == "authorization"
    assert server.get("/v1/health")[1]["knowledge_version"] == 2


# ---------------------------------------------------------------------------------------------- in process


class _Request:
    """A starlette Request of a JSON body (the routes read nothing else)."""

    def __new__(cls, path, body, headers=()):
        import json

        from starlette.requests import Request

        raw = json.dumps(body).encode()

        async def receive():
            return {"type": "http.request", "body": raw, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"", "headers":
                 [(b"content-type", b"application/json"), *((k.lower().encode(), v.encode()) for k, v in headers)]}
        return Request(scope, receive)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/answer", "/v1/search"])
def test_a_response_carries_the_version_its_batch_read(trained, tiny_world, tmp_path, path):
    """The batch reads version 1; a reload queued behind it finishes before the response is written (the event
    loop busy meanwhile): the response, computed on version 1 (the deleted passage in it), says version 1."""
    from rag_plugin.hub import RAG
    from rag_plugin.serving.app import build_app
    from rag_plugin.serving.engine import Engine
    from rag_plugin.serving.settings import ServeSettings

    ks = tmp_path / "ks"
    shutil.copytree(tiny_world["ks"], ks)
    ckpt = str(trained["rag_token_tiny"])
    settings = ServeSettings(path=ckpt, knowledge=str(ks), admin_token=TOKEN)
    engine = Engine(RAG.from_pretrained(ckpt, knowledge=str(ks)), settings)
    # search(): (the hits of each query, the version they come from)
    gone = engine.searcher.search(engine.searcher.key(_search_req()), [QUESTION])[0][0][0]["id"]
    delete_passage(ks, gone, tmp_path)
    app = build_app(engine, settings)
    routes = {r.path: r.endpoint for r in app.routes if hasattr(r, "endpoint")}
    computing, release, reloaded = threading.Event(), threading.Event(), threading.Event()
    reload, search, answer = engine.reload, engine.searcher.search, engine.answer

    def gated(compute):
        def run(*args):
            computing.set()
            assert release.wait(30)
            out = compute(*args)
            loop.call_soon_threadsafe(reloaded.wait, 30)  # the loop is busy until the reload behind is done
            return out
        return run

    def reload_and_tell():
        try:
            return reload()
        finally:
            reloaded.set()

    engine.reload, engine.searcher.search, engine.answer = reload_and_tell, gated(search), gated(answer)
    body = {"question": QUESTION, "k": 3, "max_len": 4} if path == "/v1/answer" else {"queries": [QUESTION], "k": 3}

    async def main():
        nonlocal loop
        loop = asyncio.get_running_loop()
        service = app.state.service
        service.batcher.start()
        try:
            asked = asyncio.ensure_future(routes[path](_Request(path, body)))
            while not computing.is_set():
                await asyncio.sleep(0.005)
            reloading = asyncio.ensure_future(routes["/v1/reload"](_Request("/v1/reload", {}, AUTH.items())))
            await asyncio.sleep(0.1)  # the reload is queued behind the computing batch
            release.set()
            return await asyncio.wait_for(asked, 60), await asyncio.wait_for(reloading, 60)
        finally:
            await service.batcher.stop()

    loop = None
    response, reload_response = asyncio.run(main())
    assert reload_response == {"knowledge_version": 2, "previous": 1}
    ids = [p["id"] for p in response["passages"]] if path == "/v1/answer" else \
        [h["id"] for h in response["results"][0]]
    assert gone in ids  # computed on version 1
    assert response["knowledge_version"] == 1, f"{path}: a response computed on version 1 says version " \
                                               f"{response['knowledge_version']}"
    assert engine.version == 2


def _search_req():
    from rag_plugin.serving.schemas import SearchRequest

    return SearchRequest.model_validate({"queries": [QUESTION], "k": 3})
