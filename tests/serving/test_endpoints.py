"""rag-serve's endpoints, bad input, security and lifecycle against the real service in a subprocess
(tests/serving/live.py) over the tiny world's trained checkpoints: every endpoint answers per docs/serving.md;
every refusal is a 4xx whose JSON body is one line naming the field, and the service answers the next good
request; it binds loopback, sends no CORS headers unless told, serves no file from outside its static folder and
reloads only with the admin token; --timeout and --max-pending answer 503; SIGTERM lets the request in flight
finish and exits 0 (one worker or two); a port in use is a one-line error.

Servers started: tests/serving/conftest.py's ``token_server`` (RAG-Token), ``seq_server`` (RAG-Sequence, the module
fixture below: its last test stops it with SIGTERM), a --timeout one, a --workers 2 one and a port-in-use one."""
import http.client
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.serving.live import ROOT, LiveServer

pytestmark = pytest.mark.slow

SERVING = ROOT / "rag_plugin" / "serving"
Q = "What is the capital of Kakaka?"
GOOD = {"question": Q, "max_len": 2}  # a fast request that must still be answered after every refusal
#: a slow request on the tiny models (seconds on one CPU core, beam 16 over 8 passages, 128 tokens)
SLOW = {"question": Q, "beam": 16, "max_len": 128, "k": 8}
INFO_KEYS = {"model", "arch", "variant", "k", "max_k", "decodings", "default_decoding", "max_beam", "max_len",
             "max_question_chars", "max_batch", "retrievers", "rerankers", "knowledge", "reranker", "workers"}
KNOWLEDGE_KEYS = {"path", "version", "passages", "encoder", "passage_store_sha256"}


@pytest.fixture(scope="module")
def seq_server(trained, tmp_path_factory):
    """rag-serve over rag_seq_tiny, holding one request at a time, with small question and query limits."""
    server = LiveServer(trained["rag_seq_tiny"], tmp_path_factory.mktemp("serve-seq") / "rag-serve.log",
                        ["--max-pending", "1", "--max-question-chars", "40", "--max-queries", "2"])
    try:
        yield server.wait_up()
    finally:
        server.stop()


def raw_request(server, method: str, path: str, body: bytes = None, headers=None, timeout: float = 30.0):
    """(status, body bytes, lower-cased headers) of ``path`` sent exactly as written (no normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def assert_refused(status: int, body: dict, expected: int, field, *needles):
    assert status == expected, body
    assert set(body) == {"error", "field"}, body
    assert isinstance(body["error"], str) and body["error"] and "\n" not in body["error"], body
    assert body["field"] == field, body
    for needle in needles:
        assert needle in body["error"], body


def assert_still_answers(server):
    status, body = server.post("/v1/answer", GOOD)
    assert status == 200 and isinstance(body["answer"], str), body


def no_traceback(server):
    assert "Traceback" not in server.log(), server.log()[-3000:]


def in_thread(fn, *args):
    """Runs ``fn(*args)`` in a thread; returns (thread, list that receives its result)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def wait_pending(server, thread, timeout: float = 60.0):
    """Until the service holds a request (the slow one sent in ``thread``)."""
    deadline = time.monotonic() + timeout
    while server.get("/v1/health")[1]["pending"] < 1:
        assert thread.is_alive(), "the slow request finished before it was seen pending"
        assert time.monotonic() < deadline, "the slow request never reached the service"
        time.sleep(0.01)


def header(headers: dict, name: str):
    return {k.lower(): v for k, v in headers.items()}.get(name.lower())


# ---------------------------------------------------------------------------------------------- every endpoint
def test_health_info_and_page(token_server, trained, tiny_world):
    status, health = token_server.get("/v1/health")
    assert status == 200 and health["status"] == "ok" and isinstance(health["knowledge_version"], int)
    status, info = token_server.get("/v1/info")
    assert status == 200 and INFO_KEYS <= set(info), info
    assert info["variant"] == "token" and info["decodings"] == ["beam"] and info["default_decoding"] == "beam"
    assert info["k"] == 3 and info["max_k"] == 20 and info["arch"] == "rag_token_tiny"
    assert info["model"] == str(trained["rag_token_tiny"]) and info["workers"] == 1
    assert (info["max_beam"], info["max_len"], info["max_question_chars"], info["max_batch"]) == (16, 128, 1000, 8)
    assert info["retrievers"] == ["model", "dense", "bm25", "hybrid"] and info["rerankers"] == ["maxsim"]
    assert info["reranker"] is None
    knowledge = info["knowledge"]
    assert KNOWLEDGE_KEYS <= set(knowledge), knowledge
    assert Path(knowledge["path"]).resolve() == Path(tiny_world["ks"]).resolve()
    assert knowledge["passages"] == len(tiny_world["countries"]) and knowledge["version"] == health[
        "knowledge_version"]
    status, page, headers = token_server.request("GET", "/")
    assert status == 200 and header(headers, "content-type").startswith("text/html")
    assert page["raw"] == (SERVING / "static" / "index.html").read_text(encoding="utf-8")
    status, script, _ = raw_request(token_server, "GET", "/static/app.js")
    assert status == 200 and script == (SERVING / "static" / "app.js").read_bytes()


def check_answer_body(body: dict, question: str, k: int):
    """An /v1/answer body per docs/serving.md; returns its passages."""
    assert body["question"] == question and isinstance(body["answer"], str) and body["k"] == k
    assert isinstance(body["score"], float) and body["elapsed_ms"] > 0
    passages = body["passages"]
    assert [p["rank"] for p in passages] == list(range(k))
    assert len({p["id"] for p in passages}) == k
    priors = [p["prior"] for p in passages]
    assert priors == sorted(priors, reverse=True) and math.fsum(priors) == pytest.approx(1.0, abs=1e-4)
    for p in passages:
        assert p["text"] and p["title"] and p["id"]
    return passages


def test_answer_token(token_server):
    for k in (3, 5):
        status, body = token_server.post("/v1/answer", {"question": Q, "k": k} if k != 3 else {"question": Q})
        assert status == 200, body
        passages = check_answer_body(body, Q, k)
        assert body["decoding"] == "beam"
        assert body["knowledge_version"] == token_server.get("/v1/health")[1]["knowledge_version"]
        assert math.fsum(p["posterior"] for p in passages) == pytest.approx(1.0, abs=1e-4)
        # the prior is the softmax of the retrieval scores over the K passages read
        scores = [p["retrieval_score"] for p in passages]
        top = max(scores)
        soft = [math.exp(s - top) / math.fsum(math.exp(x - top) for x in scores) for s in scores]
        assert [p["prior"] for p in passages] == pytest.approx(soft, abs=1e-4)
        tp = body["token_posterior"]
        tokens, table = tp["tokens"], tp["posterior"]
        assert tokens[-1] == "</s>" and "".join(tokens[:-1]) == body["answer"]
        assert len(table) == k and all(len(row) == len(tokens) for row in table)
        for t in range(len(tokens)):
            assert math.fsum(row[t] for row in table) == pytest.approx(1.0, abs=1e-4), t


def test_answer_without_explain(token_server):
    status, full = token_server.post("/v1/answer", {"question": Q})
    status2, body = token_server.post("/v1/answer", {"question": Q, "explain": False})
    assert status == status2 == 200, body
    passages = check_answer_body(body, Q, 3)
    assert body["token_posterior"] is None and body["answer"] == full["answer"]
    assert all(p["posterior"] is None and p["retrieval_score"] is None for p in passages)
    assert [p["id"] for p in passages] == [p["id"] for p in full["passages"]]


def search(server, queries, **kw):
    status, body = server.post("/v1/search", {"queries": queries, **kw})
    assert status == 200, body
    assert len(body["results"]) == len(queries) and body["retriever"] == kw.get("retriever", "model")
    assert body["rerank"] == kw.get("rerank") and isinstance(body["knowledge_version"], int)
    k = kw.get("k", 5)
    for hits in body["results"]:
        assert [h["rank"] for h in hits] == list(range(k)) and len({h["id"] for h in hits}) == k
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True) and all(h["text"] and h["title"] for h in hits)
    return body["results"]


def test_search_every_retriever(token_server, tiny_world):
    names = [country for country, _ in tiny_world["countries"][:2]]
    queries = [f"What is the capital of {name}?" for name in names]
    for retriever in ("model", "dense", "bm25", "hybrid"):
        results = search(token_server, queries, k=3, retriever=retriever)
        if retriever == "bm25":  # the country's name is the only rare word: its passage first, per query
            assert [hits[0]["title"] for hits in results] == names
        if retriever != "model":
            search(token_server, queries, k=3, retriever=retriever, rerank="maxsim")
    search(token_server, queries[:1], retriever="dense", rerank="maxsim", rerank_candidates=10)
    search(token_server, [Q])  # the defaults: model, k 5
    for k in (3, 5):  # the model's own retrieval reads what generation reads
        hits = search(token_server, [Q], k=k)[0]
        status, answer = token_server.post("/v1/answer", {"question": Q, "k": k, "max_len": 2})
        assert status == 200, answer
        read = sorted(answer["passages"], key=lambda p: -p["retrieval_score"])
        assert [h["id"] for h in hits] == [p["id"] for p in read]
        assert [h["score"] for h in hits] == pytest.approx([p["retrieval_score"] for p in read], rel=1e-4)


# ---------------------------------------------------------------------------------------------- bad input
J = {"Content-Type": "application/json"}
ANSWER_REFUSALS = [
    (b"{not json", J, 400, None),
    (b"\xff\xfe{}", J, 400, None),
    (b"[1, 2]", J, 422, None),
    (b'"question"', J, 422, None),
    ({}, J, 422, "question"),
    ({"question": None}, J, 422, "question"),
    ({"question": ""}, J, 422, "question"),
    ({"question": " \t\n "}, J, 422, "question"),
    ({"question": "x" * 1001}, J, 422, "question"),
    ({"question": Q, "k": 0}, J, 422, "k"),
    ({"question": Q, "k": 21}, J, 422, "k"),
    ({"question": Q, "k": "2"}, J, 422, "k"),
    ({"question": Q, "k": 2.0}, J, 422, "k"),
    ({"question": Q, "k": True}, J, 422, "k"),
    ({"question": Q, "decoding": "greedy"}, J, 422, "decoding"),
    ({"question": Q, "decoding": "fast"}, J, 422, "decoding"),
    ({"question": Q, "beam": 0}, J, 422, "beam"),
    ({"question": Q, "beam": 17}, J, 422, "beam"),
    ({"question": Q, "max_len": 0}, J, 422, "max_len"),
    ({"question": Q, "max_len": 129}, J, 422, "max_len"),
    ({"question": Q, "explain": "yes"}, J, 422, "explain"),
    ({"question": Q, "temperature": 1}, J, 422, "temperature"),
    ({"question": Q}, {"Content-Type": "text/plain"}, 415, "content-type"),
    ({"question": Q}, {"Content-Type": "application/x-www-form-urlencoded"}, 415, "content-type"),
    ({"question": Q}, {}, 415, "content-type"),
    ({"question": Q, "pad": "x" * (1 << 20)}, J, 413, None),
]


@pytest.mark.parametrize("body,headers,status,field", ANSWER_REFUSALS,
                         ids=[f"{i}-{c[2]}-{c[3]}" for i, c in enumerate(ANSWER_REFUSALS)])
def test_answer_refuses(token_server, body, headers, status, field):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, reply, _ = raw_request(token_server, "POST", "/v1/answer", raw, headers)  # no header added
    assert_refused(got, json.loads(reply), status, field)
    assert_still_answers(token_server)


def test_answer_limits_name_their_option(token_server):
    status, body = token_server.post("/v1/answer", {"question": "x" * 1001})
    assert_refused(status, body, 422, "question", "--max-question-chars 1000", "1001")
    status, body = token_server.post("/v1/answer", {"question": Q, "k": 21})
    assert_refused(status, body, 422, "k", "--max-k", "21")
    status, body = token_server.post("/v1/answer", {"question": Q, "beam": 17})
    assert_refused(status, body, 422, "beam", "--max-beam")
    status, body, _ = raw_request(token_server, "POST", "/v1/answer", json.dumps(GOOD).encode())
    assert_refused(status, json.loads(body), 415, "content-type", "no content type")
    status, body = token_server.post("/v1/answer", {"question": "x" * 1000, "max_len": 2})  # the limit itself
    assert status == 200, body


SEARCH_REFUSALS = [
    ({"queries": []}, 422, "queries"),
    ({"queries": "one query"}, 422, "queries"),
    ({"queries": [Q] * 65}, 413, "queries"),
    ({"queries": [Q, " "]}, 422, "queries[1]"),
    ({"queries": [Q, Q, ""]}, 422, "queries[2]"),
    ({"queries": [Q], "k": 0}, 422, "k"),
    ({"queries": [Q], "k": 21}, 422, "k"),
    ({"queries": [Q], "k": 3.0}, 422, "k"),
    ({"queries": [Q], "retriever": "splade"}, 422, "retriever"),
    ({"queries": [Q], "rerank": "maxsim"}, 422, "rerank"),
    ({"queries": [Q], "retriever": "dense", "rerank": "colbert"}, 422, "rerank"),
    ({"queries": [Q], "retriever": "dense", "rerank_candidates": 10}, 422, "rerank_candidates"),
    ({"queries": [Q], "retriever": "bm25", "rerank": "maxsim", "k": 5, "rerank_candidates": 4}, 422,
     "rerank_candidates"),
    ({"queries": [Q], "question": Q}, 422, "question"),
    ({"question": Q}, 422, "queries"),
]


@pytest.mark.parametrize("body,status,field", SEARCH_REFUSALS,
                         ids=[f"{i}-{c[1]}-{c[2]}" for i, c in enumerate(SEARCH_REFUSALS)])
def test_search_refuses(token_server, body, status, field):
    got, reply = token_server.post("/v1/search", body)
    assert_refused(got, reply, status, field)
    search(token_server, [Q], k=2)


def test_unknown_paths_and_methods(token_server):
    status, body = token_server.get("/v1/nothing")
    assert_refused(status, body, 404, None, "/v1/nothing")
    status, body = token_server.get("/v1/answer")
    assert_refused(status, body, 405, None)
    status, body = token_server.post("/v1/health", {})
    assert_refused(status, body, 405, None)
    status, body, _ = token_server.request("DELETE", "/v1/search")
    assert_refused(status, body, 405, None)
    assert_still_answers(token_server)


def test_a_body_announced_over_the_limit_is_refused_before_it_is_read(token_server):
    """A client that announces 1 GiB gets its 413 at once: the service does not wait for (and hold) the body."""
    with socket.create_connection(("127.0.0.1", token_server.port), timeout=15) as sock:
        sock.sendall(b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1073741824\r\n\r\n" + b"x" * 65536)
        try:
            head = sock.recv(200)
        except socket.timeout:
            head = b"(no answer within 15 s: the service waits to read the whole announced body)"
    assert head.startswith(b"HTTP/1.1 413"), head
    assert_still_answers(token_server)


# ---------------------------------------------------------------------------------------------- security
def test_no_cross_origin_by_default(token_server):
    evil = {"Origin": "http://evil.example"}
    status, body, headers = token_server.request("POST", "/v1/answer", json.dumps(GOOD).encode(), {**J, **evil})
    assert status == 200 and header(headers, "access-control-allow-origin") is None, headers
    status, body, headers = token_server.request("GET", "/v1/info", headers=evil)
    assert status == 200 and header(headers, "access-control-allow-origin") is None, headers
    status, body, headers = token_server.request(
        "OPTIONS", "/v1/answer", headers={**evil, "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "content-type"})
    assert_refused(status, body, 405, None)
    assert not any(k.lower().startswith("access-control-") for k in headers), headers


TRAVERSALS = ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static/%2e%2e%2fapp.py",
              "/static/%2E%2E%2Fapp.py", "/static/.%2e/app.py", "/static/%252e%252e%252fapp.py",
              "/static/..%5capp.py", "/static/..\\app.py", "/static/%c0%ae%c0%ae/app.py", "/static/....//app.py",
              "/static/../../hub.py", "/static/%2e%2e/%2e%2e/hub.py", "/static/..%2f..%2fhub.py", "/../app.py",
              "/..%2fapp.py", "//etc/passwd", "/static//etc/passwd", "/static/%2fetc%2fpasswd",
              "/static/..%2f..%2f..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd", "/static/../../../../../../etc/passwd",
              "/static/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/static/app.js/../../app.py",
              "/static/app.js%00.py"]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_no_file_from_outside_static(token_server, path):
    status, body, _ = raw_request(token_server, "GET", path)
    assert status == 404, (status, body[:200])
    json.loads(body)  # the service's JSON 404, not a file
    for secret in (SERVING / "app.py", ROOT / "rag_plugin" / "hub.py"):
        assert secret.read_bytes()[:60] not in body
    assert b"root:" not in body


def test_reload_needs_the_admin_token(token_server, seq_server):
    status, body = seq_server.post("/v1/reload", {})  # started without --admin-token: off
    assert_refused(status, body, 403, None, "--admin-token")
    for headers in ({}, {"Authorization": "Bearer wrong-token-1"}, {"Authorization": "secret-token-1"},
                    {"Authorization": "bearer secret-token-1"}, {"Authorization": "Bearer secret-token-12"},
                    {"Authorization": "Basic c2VjcmV0LXRva2VuLTE="}):
        status, body = token_server.post("/v1/reload", {}, headers)
        assert_refused(status, body, 401, "authorization")
    status, body = token_server.post("/v1/reload", {}, {"Authorization": "Bearer secret-token-1"})
    assert status == 200 and set(body) == {"knowledge_version", "previous"}, body
    assert isinstance(body["knowledge_version"], int) and isinstance(body["previous"], int)
    assert body["knowledge_version"] >= body["previous"] >= 1
    assert token_server.get("/v1/health")[1]["knowledge_version"] == body["knowledge_version"]
    assert_still_answers(token_server)
    search(token_server, [Q], k=2, retriever="dense")  # the first stages are built again on the version open


def outside_address():
    """A non-loopback IPv4 address of this machine, or None."""
    candidates = []
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:  # no packet is sent: the route's source
            udp.connect(("198.51.100.1", 9))
            candidates.append(udp.getsockname()[0])
    except OSError:
        pass
    return next((a for a in candidates if not a.startswith("127.") and a != "0.0.0.0"), None)


def test_binds_loopback_only(seq_server):
    line = next(x for x in seq_server.log().splitlines() if x.startswith("rag-serve: serving"))
    assert f"http://127.0.0.1:{seq_server.port}/" in line, line
    address = outside_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError):
        socket.create_connection((address, seq_server.port), timeout=5).close()


# ---------------------------------------------------------------------------------------------- RAG-Sequence
def test_sequence_decodings(seq_server):
    status, info = seq_server.get("/v1/info")
    assert status == 200 and info["variant"] == "sequence" and info["decodings"] == ["thorough", "fast"]
    assert info["default_decoding"] in ("thorough", "fast") and info["arch"] == "rag_seq_tiny"
    assert info["max_question_chars"] == 40 and info["k"] == 3
    for decoding in (None, "thorough", "fast"):
        request = {"question": Q, "max_len": 8, **({"decoding": decoding} if decoding else {})}
        status, body = seq_server.post("/v1/answer", request)
        assert status == 200, body
        passages = check_answer_body(body, Q, 3)
        assert body["decoding"] == (decoding or info["default_decoding"]) and body["token_posterior"] is None
        assert math.fsum(p["posterior"] for p in passages) == pytest.approx(1.0, abs=1e-4)
    status, body = seq_server.post("/v1/answer", {"question": Q, "decoding": "beam"})
    assert_refused(status, body, 422, "decoding", "beam")
    status, body = seq_server.post("/v1/answer", {"question": "What is the capital of Kakaka, the country?"})
    assert_refused(status, body, 422, "question", "--max-question-chars 40")
    status, body = seq_server.post("/v1/search", {"queries": [Q, Q, Q]})
    assert_refused(status, body, 413, "queries", "--max-queries 2")
    search(seq_server, [Q, Q], k=2)


def test_max_pending(seq_server):
    """--max-pending 1: while a slow request is held, the next is 503 at once; the slow one is answered."""
    thread, out = in_thread(seq_server.post, "/v1/answer", {**SLOW, "decoding": "fast"})
    wait_pending(seq_server, thread)
    status, body = seq_server.post("/v1/answer", {**SLOW, "decoding": "fast"})
    assert_refused(status, body, 503, None, "--max-pending")
    thread.join(120)
    assert out and out[0][0] == 200 and isinstance(out[0][1]["answer"], str), out
    status, body = seq_server.post("/v1/answer", {"question": Q, "max_len": 2})
    assert status == 200, body


def test_sigterm_lets_the_request_in_flight_finish(seq_server):
    """The last test of seq_server: SIGTERM while a slow request computes; it is answered, the process exits 0."""
    thread, out = in_thread(seq_server.post, "/v1/answer", {**SLOW, "decoding": "fast"})
    wait_pending(seq_server, thread)
    seq_server.proc.send_signal(signal.SIGTERM)
    thread.join(120)
    assert out and out[0][0] == 200 and isinstance(out[0][1]["answer"], str), out
    assert seq_server.proc.wait(timeout=60) == 0, seq_server.log()[-3000:]
    no_traceback(seq_server)


# ---------------------------------------------------------------------------------------------- lifecycle
def test_timeout_then_sigint(token_server, trained, tmp_path):
    started = time.monotonic()
    status, body = token_server.post("/v1/answer", SLOW)  # without --timeout: answered, slowly
    slow = time.monotonic() - started
    assert status == 200 and body["elapsed_ms"] > 200, body.get("elapsed_ms", body)
    server = LiveServer(trained["rag_token_tiny"], tmp_path / "rag-serve.log", ["--timeout", "0.2"])
    try:
        server.wait_up()
        started = time.monotonic()
        status, body = server.post("/v1/answer", SLOW)
        assert_refused(status, body, 503, None, "--timeout 0.2")
        assert time.monotonic() - started < slow, "the 503 came no sooner than the answer would have"
        status, health = server.get("/v1/health")
        assert status == 200 and health["status"] == "ok" and health["pending"] == 0
        deadline, replies = time.monotonic() + 120, []
        while not replies or replies[-1][0] != 200:  # a fast request, once the slow batch leaves the thread
            assert time.monotonic() < deadline, replies
            replies.append(server.post("/v1/answer", GOOD))
            assert replies[-1][0] in (200, 503), replies[-1]
        assert isinstance(replies[-1][1]["answer"], str)
        assert server.stop(signal.SIGINT) == 0, server.log()[-3000:]
        no_traceback(server)
    finally:
        server.stop(signal.SIGKILL)


def test_two_workers_with_cors(trained, tmp_path):
    server = LiveServer(trained["rag_token_tiny"], tmp_path / "rag-serve.log",
                        ["--cors-origin", "http://good.example"], workers=2)
    try:
        server.wait_up()
        assert server.get("/v1/info")[1]["workers"] == 2
        threads = [in_thread(server.post, "/v1/answer", {"question": Q, "max_len": 8}) for _ in range(6)]
        for thread, _ in threads:
            thread.join(120)
        replies = [out[0] for _, out in threads]
        assert all(status == 200 for status, _ in replies), replies
        assert len({body["answer"] for _, body in replies}) == 1  # every worker answers alike
        good, evil = {"Origin": "http://good.example"}, {"Origin": "http://evil.example"}
        status, _, headers = server.request("POST", "/v1/answer", json.dumps(GOOD).encode(), {**J, **good})
        assert status == 200 and header(headers, "access-control-allow-origin") == "http://good.example"
        status, _, headers = server.request("POST", "/v1/answer", json.dumps(GOOD).encode(), {**J, **evil})
        assert status == 200 and header(headers, "access-control-allow-origin") is None, headers
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        status, _, headers = server.request("OPTIONS", "/v1/answer", headers={**good, **preflight})
        assert status == 200 and header(headers, "access-control-allow-origin") == "http://good.example"
        assert "POST" in header(headers, "access-control-allow-methods")
        status, _, headers = server.request("OPTIONS", "/v1/answer", headers={**evil, **preflight})
        assert status >= 400 and header(headers, "access-control-allow-origin") is None, headers
        started = time.monotonic()
        assert server.stop(signal.SIGTERM, timeout=60) == 0, server.log()[-3000:]
        assert time.monotonic() - started < 60
        assert "2 workers" in server.log()
        no_traceback(server)
    finally:
        server.stop(signal.SIGKILL)


def test_port_in_use_is_a_one_line_error(trained):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([str(Path(sys.executable).parent / "rag-serve"), "--path", str(trained["rag_token_tiny"]),
                               "--port", str(port)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    assert errors[0].startswith("error: cannot listen on 127.0.0.1:") and f":{port} " in errors[0], errors
    assert "rag-serve: serving" not in proc.stdout


def test_a_worker_that_cannot_start_is_the_commands_one_line_error(trained, tmp_path):
    """--workers 2 over a knowledge source that is not there: the workers' error, one line, exit 2."""
    proc = subprocess.run([str(Path(sys.executable).parent / "rag-serve"), "--path", str(trained["rag_token_tiny"]),
                           "--knowledge", str(tmp_path / "no_ks"), "--port", "0", "--workers", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert_one_line_error(proc, "a worker could not start", str(tmp_path / "no_ks"), "rag-build-knowledge")
