"""rag-serve's engine over decoder-only checkpoints (rag_lm_token_tiny, rag_lm_seq_tiny trained two updates): the
explanation of each answer (retrieval score, prior, posterior, RAG-Token's per-token posterior) equals a brute
force in which each retrieved passage's row (``</s> title </s> passage </s> question``) is followed by the answer
and run through fairseq's own TransformerLanguageModel.forward, alone."""
import math

import pytest
import torch

from rag_plugin.hub import RAG
from rag_plugin.serving.engine import AnswerKey, Engine
from rag_plugin.serving.settings import ServeSettings
from tests.conftest import _train_tiny
from tests.serving.test_batching import answer_with_tokens
from tests.serving.test_explain import QUESTIONS, TOL, _log_normalise, retrieval_by_brute_force


@pytest.fixture(scope="module")
def engines(tiny_world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_serve")
    out = {}
    for arch in ("rag_lm_token_tiny", "rag_lm_seq_tiny"):
        ckpt = str(_train_tiny(tiny_world, tmp, arch))
        out[arch] = Engine(RAG.from_pretrained(ckpt), ServeSettings(path=ckpt))
    return out


@torch.no_grad()
def lm_log_probs_alone(rag, src_tokens, row: int, answer):
    """log p(y_t | row of passage ``row``, y<t) by fairseq's own forward of the unpadded row, float64."""
    model = rag.model
    contexts = model.generator_inputs(src_tokens, torch.tensor([[row]]))
    ids = torch.cat([contexts.tokens[0, : contexts.lengths[0]], torch.tensor([model.eos] + list(answer[:-1]))])
    logits, _ = model.generator(ids.unsqueeze(0))
    lp = torch.log_softmax(logits[0, int(contexts.lengths[0]):].double(), -1)
    return [float(lp[t, y]) for t, y in enumerate(answer)]


@pytest.mark.slow
@pytest.mark.parametrize("arch, decoding", [("rag_lm_token_tiny", "beam"), ("rag_lm_seq_tiny", "thorough"),
                                            ("rag_lm_seq_tiny", "fast")])
def test_lm_explanation_equals_brute_force(engines, arch, decoding):
    engine = engines[arch]
    rag = engine.rag
    k = 3
    responses, tokens = answer_with_tokens(engine, AnswerKey(k=k, decoding=decoding, beam=2, max_len=8,
                                                             explain=True), QUESTIONS)
    for question, response, answer in zip(QUESTIONS, responses, tokens):
        top, src_tokens = retrieval_by_brute_force(rag, question, k)
        prior = _log_normalise([s for _, s in top])
        lp = [lm_log_probs_alone(rag, src_tokens, row, answer) for row, _ in top]
        posterior = _log_normalise([math.log(prior[z]) + sum(lp[z]) for z in range(k)])
        store = rag.task.knowledge.passages
        assert [p["id"] for p in response["passages"]] == [store.id(r) for r, _ in top]
        for z, p in enumerate(response["passages"]):
            assert p["retrieval_score"] == pytest.approx(top[z][1], rel=1e-5, abs=TOL)
            assert p["prior"] == pytest.approx(prior[z], abs=TOL)
            assert p["posterior"] == pytest.approx(posterior[z], abs=TOL)
        if decoding != "beam":
            assert response["token_posterior"] is None
            continue
        for t in range(len(answer)):
            column = _log_normalise([math.log(prior[z]) + lp[z][t] for z in range(k)])
            got = [row[t] for row in response["token_posterior"]["posterior"]]
            assert got == pytest.approx(column, abs=TOL)
