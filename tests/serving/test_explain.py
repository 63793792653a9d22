"""The numbers of an explained answer (rag_plugin.serving.explain through the Engine, in process), each computed
again by brute force: the retrieval scores from the model's query encoder and every stored vector, the prior as
their softmax, and for each retrieved passage z alone the answer teacher-forced through the generator, giving
log p(y_t | x, z, y<t); then in float64 loops

    RAG-Token's per-token posterior   p(z | x, y_t, y<t) = p(z|x) p(y_t|x,z,y<t) / sum_z' p(z'|x) p(y_t|x,z',y<t)
    the answer's posterior            p(z | x, y)        ∝ p(z|x) prod_t p(y_t|x,z,y<t)

(rag_plugin.core.marginalization.rag_token_doc_log_posterior and rag_sequence_doc_log_posterior's definitions).
And the answer's pieces (explain.token_texts) concatenate to the decoded answer, with SentencePiece and with GPT-2's
byte-level BPE, whose tokens may end inside a character."""
import json
import math

import numpy as np
import pytest
import torch

from rag_plugin.hub import RAG
from rag_plugin.serving.engine import AnswerKey, Engine
from rag_plugin.serving.explain import token_texts
from rag_plugin.serving.settings import ServeSettings
from tests.generation.test_decoding import _exact_retrieval
from tests.serving.test_batching import answer_with_tokens

TOL = 1e-4
QUESTIONS = ["What is the capital of Kakaka?", "Vigasu capital?", "Which city is the capital of the country Gavisu?"]


@pytest.fixture(scope="module")
def engines(trained):
    out = {}
    for arch in ("rag_token_tiny", "rag_seq_tiny"):
        ckpt = str(trained[arch])
        out[arch] = Engine(RAG.from_pretrained(ckpt), ServeSettings(path=ckpt))
    return out


def retrieval_by_brute_force(rag, question: str, k: int):
    """[(row, scale * q·d)] of the top k of every stored vector (float64), best first."""
    dataset = rag.task.build_dataset([question])
    sample = dataset.collater([dataset[0]])
    with torch.no_grad():
        q = rag.model.query_encoder(sample["net_input"]["query_tokens"], sample["net_input"]["query_mask"])
    vectors = np.asarray(rag.task.knowledge.vectors, dtype=np.float64)
    scores = vectors @ q[0].double().numpy() * rag.model.doc_score_scale
    top = np.argsort(-scores, kind="stable")[:k]
    return [(int(r), float(scores[r])) for r in top], sample["net_input"]["src_tokens"]


@torch.no_grad()
def token_log_probs_alone(rag, src_tokens, row: int, answer):
    """log p(y_t | x, z, y<t) for t = 1..T, the answer teacher-forced with passage ``row`` alone (float64)."""
    model = rag.model
    src, lengths = model.generator_inputs(src_tokens, torch.tensor([[row]]))
    encoder_out = model.generator.encoder(src, src_lengths=lengths)
    prev = torch.tensor([[model.eos] + list(answer[:-1])])  # fairseq's decoder input: </s> y1 .. y_{T-1}
    logits, _ = model.generator.decoder(prev, encoder_out=encoder_out)
    lp = torch.log_softmax(logits[0].double(), dim=-1)
    return [float(lp[t, y]) for t, y in enumerate(answer)]


def _log_normalise(logs):
    top = max(logs)
    total = top + math.log(sum(math.exp(v - top) for v in logs))
    return [math.exp(v - total) for v in logs]


def expected_explanation(rag, question: str, answer, k: int):
    """By brute force: per retrieved passage (best prior first) its id, retrieval score, prior, posterior and
    per-token posterior over the answer's T tokens."""
    top, src_tokens = retrieval_by_brute_force(rag, question, k)
    prior = _log_normalise([s for _, s in top])
    lp = [token_log_probs_alone(rag, src_tokens, row, answer) for row, _ in top]
    posterior = _log_normalise([math.log(prior[z]) + sum(lp[z]) for z in range(k)])
    per_token = [[0.0] * len(answer) for _ in range(k)]
    for t in range(len(answer)):
        column = _log_normalise([math.log(prior[z]) + lp[z][t] for z in range(k)])
        for z in range(k):
            per_token[z][t] = column[z]
    store = rag.task.knowledge.passages
    return [{"id": store.id(row), "retrieval_score": score, "prior": prior[z], "posterior": posterior[z],
             "token_posterior": per_token[z]} for z, (row, score) in enumerate(top)]


@pytest.mark.slow
@pytest.mark.parametrize("k, beam", [(3, 4), (5, 1)])
def test_rag_token_explanation_equals_brute_force(engines, k, beam):
    engine = engines["rag_token_tiny"]
    rag = engine.rag
    responses, tokens = answer_with_tokens(engine, AnswerKey(k=k, decoding="beam", beam=beam, max_len=8,
                                                             explain=True), QUESTIONS)
    for question, response, answer in zip(QUESTIONS, responses, tokens):
        assert answer[-1] == rag.model.eos
        expect = expected_explanation(rag, question, answer, k)
        passages, explained = response["passages"], response["token_posterior"]
        assert [p["id"] for p in passages] == [e["id"] for e in expect]  # by prior, best first
        assert [p["rank"] for p in passages] == list(range(k))
        # the brute force of the project's other tests agrees on the retrieval (ids and p(z|x))
        (exact,) = _exact_retrieval(rag, [question], k)
        assert [p["id"] for p in passages] == [i for i, _ in exact]
        assert [p["prior"] for p in passages] == pytest.approx([pz for _, pz in exact], abs=TOL)
        for p, e in zip(passages, expect):
            assert p["retrieval_score"] == pytest.approx(e["retrieval_score"], rel=1e-5, abs=TOL)
            assert p["prior"] == pytest.approx(e["prior"], abs=TOL)
            assert p["posterior"] == pytest.approx(e["posterior"], abs=TOL)
        assert sum(p["posterior"] for p in passages) == pytest.approx(1.0, abs=1e-5)
        # K rows (the passages' order) by T columns (the answer's tokens, </s> included), each column summing to 1
        assert len(explained["posterior"]) == k and len(explained["tokens"]) == len(answer)
        for row, e in zip(explained["posterior"], expect):
            assert len(row) == len(answer)
            assert row == pytest.approx(e["token_posterior"], abs=TOL)
        for t in range(len(answer)):
            assert sum(row[t] for row in explained["posterior"]) == pytest.approx(1.0, abs=1e-5)
        # the answer's pieces concatenate to the decoded answer, then </s>
        assert explained["tokens"] == token_texts(rag.tokenizer, answer, rag.model.eos)
        assert explained["tokens"][-1] == "</s>" and "".join(explained["tokens"][:-1]) == response["answer"]
        assert response["answer"] == rag.tokenizer.decode(answer)
    # the posterior moved away from the prior somewhere (else comparing them would prove little)
    assert any(abs(p["posterior"] - p["prior"]) > 1e-3 for r in responses for p in r["passages"])


@pytest.mark.slow
@pytest.mark.parametrize("decoding", ["thorough", "fast"])
def test_rag_sequence_explanation_equals_brute_force(engines, decoding):
    """RAG-Sequence: each passage's posterior p(z|x,y) (its own posterior); no per-token posterior."""
    engine = engines["rag_seq_tiny"]
    rag = engine.rag
    responses, tokens = answer_with_tokens(engine, AnswerKey(k=3, decoding=decoding, beam=2, max_len=8,
                                                             explain=True), QUESTIONS)
    for question, response, answer in zip(QUESTIONS, responses, tokens):
        expect = expected_explanation(rag, question, answer, 3)
        assert response["token_posterior"] is None and response["decoding"] == decoding
        assert [p["id"] for p in response["passages"]] == [e["id"] for e in expect]
        for p, e in zip(response["passages"], expect):
            for field in ("retrieval_score", "prior", "posterior"):
                assert p[field] == pytest.approx(e[field], rel=1e-5, abs=TOL), field


@pytest.mark.slow
@pytest.mark.parametrize("arch, decoding", [("rag_token_tiny", "beam"), ("rag_seq_tiny", "fast")])
def test_the_explanation_reads_the_generators_own_retrieval_and_keeps_it_no_longer(engines, arch, decoding):
    """The engine's generators keep their batch's retrieval (logits and encoded pairs) for the explanation, which
    reads it (the brute-force tests above check its numbers) and lets it go once the batch is answered."""
    engine = engines[arch]
    key = AnswerKey(k=3, decoding=decoding, beam=2, max_len=6, explain=True)
    generator = engine._generator(key)
    assert generator.keep_retrieval
    seen = {}
    generate = generator.generate

    def spy(models, sample, **kw):
        hypos = generate(models, sample, **kw)
        seen.update(generator.last_retrieval)
        return hypos

    generator.generate = spy
    try:
        (response,) = engine.answer(key, QUESTIONS[:1])
    finally:
        del generator.generate
    assert {"rows", "doc_lp", "doc_scores", "encoder_out"} <= set(seen)
    assert [p["retrieval_score"] for p in response["passages"]] == pytest.approx(
        sorted(seen["doc_scores"][0].float().tolist(), reverse=True), rel=1e-6)
    assert generator.last_retrieval == {}  # not held into the next batch


@pytest.mark.slow
def test_without_explain_the_numbers_are_left_out(engines):
    engine = engines["rag_token_tiny"]
    (response,) = engine.answer(AnswerKey(k=3, decoding="beam", beam=2, max_len=6, explain=False), QUESTIONS[:1])
    assert response["token_posterior"] is None
    assert all(p["posterior"] is None and p["retrieval_score"] is None for p in response["passages"])
    assert sum(p["prior"] for p in response["passages"]) == pytest.approx(1.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------- token_texts


def test_token_texts_concatenate_with_sentencepiece(tiny_world):
    from rag_plugin.retrieval.tokenization import EOS, GeneratorTokenizer, GeneratorTokenizerFiles

    root = tiny_world["root"]
    tokenizer = GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(root / "dict.txt"),
                                                           bpe_model=str(root / "spm.model")))
    for text in ("Mipo", "The capital of Kakaka is Mipo.", "ka lo  mi", "?"):
        ids = tokenizer.encode(text) + [EOS]
        pieces = token_texts(tokenizer, ids, EOS)
        assert len(pieces) == len(ids) and pieces[-1] == "</s>"
        assert "".join(pieces[:-1]) == tokenizer.decode(ids), pieces


@pytest.fixture
def byte_level_tokenizer(tmp_path):
    """A GPT-2 byte-level BPE tokenizer (the one fairseq's BART uses) of the 256 byte symbols and no merges: every
    byte of a character outside ASCII is a token of its own."""
    from tokenizers import pre_tokenizers

    from rag_plugin.retrieval.tokenization import GeneratorTokenizer, GeneratorTokenizerFiles

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    (tmp_path / "encoder.json").write_text(json.dumps({c: i for i, c in enumerate(alphabet)}))
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n")
    (tmp_path / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(len(alphabet))))
    return GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(tmp_path / "dict.txt"),
                                                      gpt2_encoder_json=str(tmp_path / "encoder.json"),
                                                      gpt2_vocab_bpe=str(tmp_path / "vocab.bpe")))


@pytest.mark.parametrize("text", ["Bujumbura", "São Tomé", "東京", "a 🙂 b"],
                         ids=["ascii", "latin", "cjk", "emoji"])
def test_token_texts_concatenate_with_byte_level_bpe(byte_level_tokenizer, text):
    """A token ending inside a character adds no text of its own (no '\ufffd'); the token completing the character
    adds it: the pieces still concatenate to the answer."""
    from rag_plugin.retrieval.tokenization import EOS

    ids = byte_level_tokenizer.encode(text) + [EOS]
    assert byte_level_tokenizer.decode(ids) == text
    pieces = token_texts(byte_level_tokenizer, ids, EOS)
    assert len(pieces) == len(ids) and pieces[-1] == "</s>"
    assert "".join(pieces[:-1]) == text, pieces
    assert not any("\ufffd" in p for p in pieces), pieces
