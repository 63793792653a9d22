"""The read side of a knowledge source (rag_plugin.retrieval.knowledge): loading, verification, search
against brute force, and the encoder checks (imported vectors included)."""
import json
import os

import numpy as np
import pytest

from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever
from rag_plugin.util.errors import UserError
from tests.conftest import HashingEncoder, build_hashing_knowledge_source


def _build(tmp_path, n=300, factory="Flat", **kw):
    return build_hashing_knowledge_source(tmp_path, n, factory, **kw)


def test_build_then_load_and_search_exactly(tmp_path):
    ks = _build(tmp_path)
    assert len(ks) == 300 and ks.dim == 64
    assert set(os.listdir(tmp_path / "ks")) == {"passages", "vectors.npy", "index.faiss", "manifest.json"}
    ks2 = KnowledgeSource(str(tmp_path / "ks"))
    enc = HashingEncoder()
    retr = DenseRetriever(ks2, encoder=enc)
    questions = [ks2.passages.text(i) for i in (0, 17, 299)]
    res = retr.search(questions, k=5)
    # exact index == brute force over the stored vectors
    q = enc.encode_queries(questions)
    brute = np.argsort(-(q @ np.asarray(ks2.vectors).T), axis=1, kind="stable")[:, :5]
    np.testing.assert_allclose(res.scores, np.take_along_axis(q @ np.asarray(ks2.vectors).T, brute, 1), rtol=1e-5)
    assert [r[0] for r in res.ids()] == ["p0", "p17", "p299"]
    # stored vectors of the hits give back the scores (what the model recomputes as q.d)
    dv = retr.doc_vectors(res.rows)
    np.testing.assert_allclose(np.einsum("bd,bkd->bk", q, dv), res.scores, rtol=1e-5, atol=1e-6)
    # manifest
    m = ks2.manifest
    assert m["count"] == 300 and m["index_factory"] == "Flat" and m["encoder"]["name"] == "hashing"


def test_incomplete_or_inconsistent_sources_cannot_load(tmp_path):
    _build(tmp_path)
    ks_dir = tmp_path / "ks"
    (ks_dir / "manifest.json").rename(tmp_path / "manifest.bak")
    with pytest.raises(UserError, match="no manifest.json"):
        KnowledgeSource(str(ks_dir))
    (tmp_path / "manifest.bak").rename(ks_dir / "manifest.json")
    m = json.loads((ks_dir / "manifest.json").read_text())
    m["count"] = 301
    (ks_dir / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="does not match the manifest"):
        KnowledgeSource(str(ks_dir))


def test_truncated_index_is_refused(tmp_path):
    _build(tmp_path)
    p = tmp_path / "ks" / "index.faiss"
    p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(UserError, match="corrupted or truncated"):
        _ = KnowledgeSource(str(tmp_path / "ks")).index


def test_dimension_mismatch_is_refused(tmp_path):
    ks = _build(tmp_path)
    with pytest.raises(UserError, match="dimension"):
        DenseRetriever(ks, encoder=HashingEncoder(dim=32))


def test_k_larger_than_collection(tmp_path):
    ks = _build(tmp_path, n=10)
    with pytest.raises(UserError, match="larger than the collection"):
        DenseRetriever(ks, encoder=HashingEncoder()).search(["alpha"], k=11)


def test_bm25_finds_lexical_match(tmp_path):
    ks = _build(tmp_path)
    bm25 = BM25Retriever(ks.passages)
    res = bm25.search(["unique42", "unique7 alpha"], k=3)
    assert res.ids()[0][0] == "p42" and res.ids()[1][0] == "p7"
    assert res.scores.shape == (2, 3)


def test_bm25_scores_equal_the_lucene_formula(tmp_path):
    """Every score by hand: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), term weight
    tf / (tf + k1 (1 - b + b |d| / avgdl)) (Lucene's: the textbook's constant factor k1 + 1 dropped,
    the ranking unchanged), k1 = 1.5, b = 0.75, over lower-cased tokens of two or more word
    characters without English stopwords (bm25s' tokenizer)."""
    import math
    import re
    from collections import Counter

    from bm25s.stopwords import STOPWORDS_EN

    ks = _build(tmp_path)
    stop = set(STOPWORDS_EN)

    def tokens(text):
        return [w for w in re.findall(r"(?u)\b\w\w+\b", text.lower()) if w not in stop]

    docs = [Counter(tokens(f"{t} {x}")) for t, x in ks.passages.iter_titles_texts()]
    lengths = [sum(d.values()) for d in docs]
    n, avgdl, k1, b = len(docs), sum(lengths) / len(docs), 1.5, 0.75
    df = Counter(w for d in docs for w in d)
    questions = ["unique42 river", "alpha beta king", "the city of omega"]
    res = BM25Retriever(ks.passages).search(questions, k=5)
    for qi, q in enumerate(questions):
        scores = []
        for d, dl in zip(docs, lengths):
            s = sum(math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5)) * d[w]
                    / (d[w] + k1 * (1 - b + b * dl / avgdl)) for w in set(tokens(q)) if w in d)
            scores.append(s)
        top = sorted(range(n), key=lambda i: -scores[i])[:5]
        np.testing.assert_allclose(res.scores[qi], [scores[i] for i in top], rtol=1e-5)
        # and each returned passage has the score the formula gives it (ties may come in any order)
        np.testing.assert_allclose([scores[i] for i in res.rows[qi]], res.scores[qi], rtol=1e-5)
