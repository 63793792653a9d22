"""Dynamic batching changes nothing a caller sees: a question answered in a batch gets what it gets alone (the same
answer tokens, passages in the same order) and what the hub (``RAG.generate``) gives it, in process (the Engine) and
over HTTP (concurrent requests that the real rag-serve batches, keys mixed in one window, concurrent searches).

Scores, priors and posteriors are compared to 1e-5, not bit for bit: a padded batch multiplies matrices of another
shape than one question alone, so float32 rounding differs in the last places (the engine's docstring says so)."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rag_plugin.hub import RAG
from rag_plugin.serving.engine import AnswerKey, Engine
from rag_plugin.serving.settings import ServeSettings
from tests.serving.live import LiveServer

TOL = 1e-5
#: questions of different lengths (the tiny world's countries, and none of them)
QUESTIONS = ["What is the capital of Kakaka?", "Gavisu?",
             "Tell me please, what is the name of the capital city of the country that is called Vigasu?",
             "capital Devisu", "What is the capital of Rapode?", "Where do the kings of the red river live today?"]


def answer_with_tokens(engine, key, questions):
    """``engine.answer(key, questions)`` and the token ids of each answer (its generator's best hypothesis)."""
    seen = []
    original = engine._generator

    class Spy:
        def __init__(self, generator):
            self.generator = generator

        def __getattr__(self, name):  # the generator's own (last_retrieval: what the explanation reads)
            return getattr(self.generator, name)

        def generate(self, models, sample, **kw):
            hypos = self.generator.generate(models, sample, **kw)
            seen.extend(h[0]["tokens"].tolist() for h in hypos)
            return hypos

    engine._generator = lambda k: Spy(original(k))
    try:
        out = engine.answer(key, list(questions))
    finally:
        del engine._generator  # the class's method again
    assert len(seen) == len(questions)
    return out, seen


def assert_same_answer(got: dict, alone: dict, tol: float = TOL) -> None:
    """Two response bodies of one question: equal but for float32 rounding (and the time taken)."""
    for field in ("question", "answer", "decoding", "k", "knowledge_version"):
        assert got[field] == alone[field], field
    assert got["score"] == pytest.approx(alone["score"], abs=tol)
    assert [(p["rank"], p["id"], p["title"], p["text"]) for p in got["passages"]] == \
        [(p["rank"], p["id"], p["title"], p["text"]) for p in alone["passages"]]
    for p, q in zip(got["passages"], alone["passages"]):
        for field in ("retrieval_score", "prior", "posterior"):
            if q[field] is None:
                assert p[field] is None, field
            else:
                assert p[field] == pytest.approx(q[field], abs=tol), (field, p["id"])
    if alone["token_posterior"] is None:
        assert got["token_posterior"] is None
    else:
        assert got["token_posterior"]["tokens"] == alone["token_posterior"]["tokens"]
        for row, row_alone in zip(got["token_posterior"]["posterior"], alone["token_posterior"]["posterior"]):
            assert row == pytest.approx(row_alone, abs=tol)


# ---------------------------------------------------------------------------------------------- in process


@pytest.fixture(scope="module")
def loaded(trained):
    """(arch, k) -> a hub RAG reading k passages; arch -> its Engine (over a hub of the checkpoint's K)."""
    cache = {}

    def get(arch, k=None):
        if (arch, k) not in cache:
            ckpt = str(trained[arch])
            rag = RAG.from_pretrained(ckpt, n_docs=k)
            cache[(arch, k)] = rag if k is not None else Engine(rag, ServeSettings(path=ckpt))
        return cache[(arch, k)]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("arch, decoding, beam, k", [("rag_token_tiny", "beam", 1, 3), ("rag_token_tiny", "beam", 4, 3),
                                                     ("rag_token_tiny", "beam", 4, 2),
                                                     ("rag_seq_tiny", "thorough", 2, 3),
                                                     ("rag_seq_tiny", "fast", 2, 3),
                                                     ("rag_seq_tiny", "fast", 3, 2)])
def test_a_batch_answers_each_question_as_alone_and_as_the_hub(loaded, arch, decoding, beam, k):
    engine = loaded(arch)
    assert engine.default_k == 3 and engine.variant == ("token" if arch == "rag_token_tiny" else "sequence")
    key = AnswerKey(k=k, decoding=decoding, beam=beam, max_len=8, explain=True)
    batch, tokens = answer_with_tokens(engine, key, QUESTIONS)
    hub = loaded(arch, k)
    if engine.variant == "sequence":
        hub.task.cfg.rag_decoding = decoding  # the hub decodes with its task's --rag-decoding
    for i, question in enumerate(QUESTIONS):
        (alone,), (alone_tokens,) = answer_with_tokens(engine, key, [question])
        assert tokens[i] == alone_tokens, question  # the same answer, token for token
        assert batch[i]["answer"] == engine.rag.tokenizer.decode(tokens[i])
        assert_same_answer(batch[i], alone)
        assert len(batch[i]["passages"]) == k and batch[i]["knowledge_version"] == 1
        assert (batch[i]["token_posterior"] is None) == (engine.variant != "token")
        (h,) = hub.generate([question], beam=beam, max_len_b=8)
        assert h["answer"] == batch[i]["answer"]
        assert h["score"] == pytest.approx(batch[i]["score"], abs=TOL)
        assert [p["id"] for p in h["provenance"]] == [p["id"] for p in batch[i]["passages"]]
        assert [p["p"] for p in h["provenance"]] == pytest.approx([p["prior"] for p in batch[i]["passages"]], abs=TOL)
    # the questions did not all get the same passages (else the comparison above would prove little)
    assert len({tuple(p["id"] for p in r["passages"]) for r in batch}) > 1


@pytest.mark.slow
def test_a_batch_without_explanation_answers_as_with_it(loaded):
    engine = loaded("rag_token_tiny")
    plain, plain_tokens = answer_with_tokens(engine, AnswerKey(3, "beam", 4, 8, False), QUESTIONS)
    full, full_tokens = answer_with_tokens(engine, AnswerKey(3, "beam", 4, 8, True), QUESTIONS)
    assert plain_tokens == full_tokens
    for p, f in zip(plain, full):
        assert p["token_posterior"] is None and all(x["posterior"] is None for x in p["passages"])
        assert (p["answer"], [x["id"] for x in p["passages"]]) == (f["answer"], [x["id"] for x in f["passages"]])
        assert [x["prior"] for x in p["passages"]] == pytest.approx([x["prior"] for x in f["passages"]], abs=TOL)


# ---------------------------------------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def batching_server(trained, tmp_path_factory):
    """rag-serve over rag_token_tiny batching up to 8 questions, the first waiting 300 ms for the others."""
    server = LiveServer(trained["rag_token_tiny"], tmp_path_factory.mktemp("serve") / "rag-serve.log",
                        ["--max-batch", "8", "--max-wait-ms", "300"]).wait_up()
    yield server
    assert server.stop() == 0


def concurrently(server, path, bodies):
    """POST every body at once (one thread each, released together); the (status, json) of each, in order."""
    start = threading.Barrier(len(bodies))

    def one(body):
        start.wait()
        return server.post(path, body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def batches(server) -> int:
    status, health = server.get("/v1/health")
    assert status == 200
    return health["batches"]


def _ok(pairs):
    for status, body in pairs:
        assert status == 200, body
    return [body for _, body in pairs]


@pytest.mark.slow
def test_concurrent_answers_are_batched_and_each_is_its_answer_alone(batching_server):
    server = batching_server
    questions = QUESTIONS + ["What is the capital of Devisu?", "Kakaka"]
    before = batches(server)
    together = _ok(concurrently(server, "/v1/answer", [{"question": q, "max_len": 8} for q in questions]))
    grew = batches(server) - before
    assert 1 <= grew < len(questions), f"{len(questions)} concurrent requests took {grew} batches"
    for q, got in zip(questions, together):
        alone = _ok([server.post("/v1/answer", {"question": q, "max_len": 8})])[0]
        assert_same_answer(got, alone)
        assert got["token_posterior"]["tokens"][-1] == "</s>"


@pytest.mark.slow
def test_mixed_keys_in_one_window_are_each_answered_as_alone(batching_server):
    server = batching_server
    bodies = [{"question": QUESTIONS[0], "k": 2, "max_len": 6}, {"question": QUESTIONS[1], "beam": 1, "max_len": 6},
              {"question": QUESTIONS[2], "max_len": 6}, {"question": QUESTIONS[3], "k": 2, "max_len": 6},
              {"question": QUESTIONS[4], "beam": 1, "max_len": 6},
              {"question": QUESTIONS[5], "max_len": 6, "explain": False},
              {"question": QUESTIONS[0], "k": 1, "beam": 2, "max_len": 6}]
    before = batches(server)
    together = _ok(concurrently(server, "/v1/answer", bodies))
    assert batches(server) - before < len(bodies)  # the two pairs of one key shared a batch each
    for body, got in zip(bodies, together):
        assert got["k"] == body.get("k", 3) and len(got["passages"]) == got["k"]
        assert (got["token_posterior"] is None) == (body.get("explain") is False)
        assert_same_answer(got, _ok([server.post("/v1/answer", body)])[0])


@pytest.mark.slow
def test_concurrent_searches_each_get_their_own_results(batching_server):
    server = batching_server
    bodies = [{"queries": [QUESTIONS[0]], "k": 3}, {"queries": QUESTIONS[1:4], "k": 3},
              {"queries": [QUESTIONS[4], QUESTIONS[5]], "k": 3}, {"queries": [QUESTIONS[2]], "k": 2},
              {"queries": QUESTIONS[:2], "k": 4, "retriever": "dense"},
              {"queries": QUESTIONS[3:5], "k": 4, "retriever": "dense"},
              {"queries": [QUESTIONS[0], QUESTIONS[3]], "k": 3, "retriever": "bm25"}]
    together = _ok(concurrently(server, "/v1/search", bodies))
    for body, got in zip(bodies, together):
        alone = _ok([server.post("/v1/search", body)])[0]
        assert got["retriever"] == body.get("retriever", "model") and got["knowledge_version"] == 1
        assert len(got["results"]) == len(body["queries"])
        for hits, hits_alone in zip(got["results"], alone["results"]):
            assert len(hits) == body["k"]
            assert [(h["rank"], h["id"], h["title"], h["text"]) for h in hits] == \
                [(h["rank"], h["id"], h["title"], h["text"]) for h in hits_alone]
            assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in hits_alone], abs=TOL)
    # different queries got different results (a mix-up between requests would show)
    assert len({tuple(h["id"] for h in got["results"][0]) for got in together}) > 2
