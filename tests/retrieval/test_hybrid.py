"""Hybrid retrieval (rag_plugin.retrieval.hybrid): RRF and weighted fusion against hand computations, the
candidate union, the fused logits' gradient by finite differences (float64), and bad options."""
import types

import numpy as np
import pytest
import torch

from rag_plugin.retrieval import hybrid as H
from rag_plugin.util.errors import UserError


def test_union_keeps_dense_order_then_new_bm25_hits_and_drops_zero_scores():
    c = H.union_candidates(np.array([[5, 2, 9]]), np.array([[9, 7, 4, 3]]), np.array([[3.0, 2.5, 1.0, 0.0]]))
    assert c.rows.tolist() == [[5, 2, 9, 7, 4]]           # row 3 scored 0: no word in common, not a candidate
    assert c.dense_rank.tolist() == [[1, 2, 3, 0, 0]]
    assert c.bm25_rank.tolist() == [[0, 0, 1, 2, 3]]
    np.testing.assert_array_equal(c.bm25_score, [[np.nan, np.nan, 3.0, 2.5, 1.0]])


def test_rrf_against_hand_computation():
    c = H.union_candidates(np.array([[5, 2, 9], [1, 2, 3]]), np.array([[9, 7, 5], [3, 1, 8]]),
                           np.array([[3.0, 2.0, 1.0], [4.0, 1.0, 0.5]]))
    k = 60.0
    norm = (k + 1) / 2
    # question 0: 5 = dense 1 + bm25 3; 2 = dense 2; 9 = dense 3 + bm25 1; 7 = bm25 2
    expected0 = {5: 1 / 61 + 1 / 63, 2: 1 / 62, 9: 1 / 63 + 1 / 61, 7: 1 / 62}
    # question 1: 1 = dense 1 + bm25 2; 2 = dense 2; 3 = dense 3 + bm25 1; 8 = bm25 3
    expected1 = {1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61, 8: 1 / 63}
    got = H.rrf_scores(c, k)
    for i, expected in enumerate((expected0, expected1)):
        for j, r in enumerate(c.rows[i]):
            assert got[i, j] == pytest.approx(expected[int(r)] * norm, rel=1e-12)
    assert H.rrf_scores(H.union_candidates(np.array([[4]]), np.array([[4]]), np.array([[1.0]])), 7.0)[0, 0] == 1.0


def _fake_dense(vectors):
    """A dense side over ``vectors`` [N, D]: exact MIPS, stored vectors by row."""
    def search_vectors(queries, k, compute_threads=None):
        scores = queries @ vectors.T
        rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return types.SimpleNamespace(rows=rows, scores=np.take_along_axis(scores, rows, 1))

    return types.SimpleNamespace(search_vectors=search_vectors, doc_vectors=lambda rows: vectors[rows], store=None)


def test_weighted_fusion_against_hand_computation():
    vectors = np.array([[1.0, 0.0], [0.8, 0.1], [0.0, 1.0], [0.5, 0.5], [0.1, 0.2]])
    q = np.array([[2.0, 1.0]])                          # q.d = 2.0, 1.7, 1.0, 1.5, 0.4
    bm25_rows, bm25_scores = np.array([[2, 4, 0]]), np.array([[6.0, 4.0, 2.0]])
    w, scale = 0.3, 10.0
    hybrid = H.HybridRetriever(_fake_dense(vectors), None, fusion="weighted", weight=w, scale=scale, candidates=2)
    logits, rows = hybrid.fuse(torch.tensor(q), bm25_rows, bm25_scores, k=3, doc_score_scale=5.0)
    # candidates: dense 0, 1 (top 2), then bm25 2, 4; dense q.d over them 2.0, 1.7, 1.0, 0.4 -> min 0.4, span 1.6
    dense = {0: 1.6 / 1.6, 1: 1.3 / 1.6, 2: 0.6 / 1.6, 4: 0.0}
    bm25 = {0: 0.0, 1: 0.0, 2: 1.0, 4: 0.5}            # min-max over the BM25 list 6, 4, 2; row 1 not in it
    fused = {r: scale * (w * dense[r] + (1 - w) * bm25[r]) for r in dense}
    best = sorted(fused, key=lambda r: -fused[r])[:3]
    assert rows.tolist() == [best]
    np.testing.assert_allclose(logits.detach().numpy(), [[fused[r] for r in best]], rtol=1e-12)


def _setup(seed=0, b=2, n=12, d=6):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(n, d))
    q0 = rng.normal(size=(b, d))
    bm25_rows = np.stack([rng.permutation(n)[:4] for _ in range(b)])
    bm25_scores = np.sort(rng.uniform(1, 8, size=(b, 4)))[:, ::-1].copy()
    return vectors, q0, bm25_rows, bm25_scores


def _loss(logits):
    """A loss of the K logits as a criterion would compute it: -log p(z_0|x) + a KL-ish term."""
    lp = torch.log_softmax(logits, -1)
    return -(lp[:, 0] + 0.3 * lp[:, -1]).sum()


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
def test_fused_logits_gradient_by_finite_differences(fusion):
    vectors, q0, bm25_rows, bm25_scores = _setup()
    hybrid = H.HybridRetriever(_fake_dense(vectors), None, fusion=fusion, weight=0.6, scale=4.0, candidates=5)
    scale = 2.0
    q = torch.tensor(q0, requires_grad=True)
    logits, rows = hybrid.fuse(q, bm25_rows, bm25_scores, k=4, doc_score_scale=scale)
    _loss(logits).backward()
    # the candidates and the kept rows, fixed at q0 (a finite step must not change them)
    cands = H.union_candidates(hybrid.dense.search_vectors(q0, 5).rows, bm25_rows, bm25_scores)
    keep = np.array([[list(cands.rows[i]).index(r) for r in rows[i]] for i in range(len(rows))])
    d = vectors[np.where(cands.valid, cands.rows, 0)]

    def value(qv):
        dense = torch.tensor(np.einsum("bcd,bd->bc", d, qv) * scale)
        if fusion == "rrf":  # the straight-through surrogate: fused value, dense RAG's logit's gradient
            dense0 = torch.tensor(np.einsum("bcd,bd->bc", d, q0) * scale)
            full = 4.0 * torch.tensor(H.rrf_scores(cands, 60.0)) + (dense - dense0)
        else:
            full = H.fused_logits(dense, cands, fusion, weight=0.6, scale=4.0)
        return float(_loss(full.gather(1, torch.tensor(keep))))

    eps, fd = 1e-6, np.zeros_like(q0)
    for idx in np.ndindex(q0.shape):
        up, down = q0.copy(), q0.copy()
        up[idx] += eps
        down[idx] -= eps
        fd[idx] = (value(up) - value(down)) / (2 * eps)
    np.testing.assert_allclose(q.grad.numpy(), fd, atol=1e-7)
    assert np.abs(fd).sum() > 1e-3
    if fusion == "rrf":  # the value is the fused score itself
        full = 4.0 * H.rrf_scores(cands, 60.0)
        np.testing.assert_allclose(logits.detach().numpy(), np.take_along_axis(full, keep, 1), rtol=1e-12)


def test_bad_fusion_options():
    with pytest.raises(UserError, match="--fusion-weight 1.5 is outside"):
        H.HybridRetriever(None, None, fusion="weighted", weight=1.5)
    with pytest.raises(UserError, match="unknown --fusion 'max'"):
        H.HybridRetriever(None, None, fusion="max")
    c = H.union_candidates(np.array([[1, 2]]), np.array([[3]]), np.array([[1.0]]))
    with pytest.raises(UserError, match="--hybrid-candidates"):
        H.top_k(H.fused_logits(torch.zeros(1, 3, dtype=torch.float64), c, "rrf"), c, 4)
