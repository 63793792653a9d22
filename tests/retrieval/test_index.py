import numpy as np
import pytest

from rag_plugin.retrieval import index as fi
from rag_plugin.util.errors import UserError


def _data(n=3000, d=32, nq=50, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((nq, d)).astype(np.float32)
    return x, q


def _brute(x, q, k):
    s = q @ x.T
    rows = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, rows, 1), rows


def test_flat_equals_brute_force_mips():
    x, q = _data()
    scores, rows = fi.search(fi.build_index(x, "Flat", progress=False), q, 10)
    bs, br = _brute(x, q, 10)
    np.testing.assert_allclose(scores, bs, rtol=1e-5, atol=1e-5)
    assert (rows == br).mean() > 0.999  # ties aside, the same rows


@pytest.mark.parametrize("factory, params", [
    ("IVF32,SQ8", {"nprobe": 32}),
    ("HNSW32", {"ef_search": 128}),
    ("IVF32,Flat", {"nprobe": 32}),
])
def test_compressed_recall_at_20_against_exact(factory, params):
    x, q = _data(n=4000, d=32, nq=100)
    exact = fi.build_index(x, "Flat", progress=False)
    approx = fi.build_index(x, factory, progress=False)
    fi.set_search_params(approx, **params)
    _, er = fi.search(exact, q, 20)
    _, ar = fi.search(approx, q, 20)
    recall = np.mean([len(set(a) & set(e)) / 20 for a, e in zip(ar, er)])
    assert recall >= 0.95, recall


def test_pq_is_inner_product_and_searchable():
    x, q = _data(n=4000, d=32)
    idx = fi.build_index(x, "IVF16,PQ8", progress=False)
    fi.set_search_params(idx, nprobe=16)
    _, er = fi.search(fi.build_index(x, "Flat", progress=False), q, 20)
    _, ar = fi.search(idx, q, 20)
    recall = np.mean([len(set(a) & set(e)) / 20 for a, e in zip(ar, er)])
    assert recall >= 0.5  # PQ8 on 32 dims is lossy; it must still rank by inner product
    assert idx.metric_type == 0  # faiss.METRIC_INNER_PRODUCT


def test_errors():
    x, q = _data(n=100)
    with pytest.raises(UserError, match="cannot build index"):
        fi.build_index(x, "NotAFactory", progress=False)
    with pytest.raises(UserError, match="needs at least 256 vectors"):
        fi.build_index(x, "IVF256,SQ8", progress=False)
    idx = fi.build_index(x, "Flat", progress=False)
    with pytest.raises(UserError, match="larger than the collection"):
        fi.search(idx, q, 101)
    with pytest.raises(UserError, match="dimension"):
        fi.search(idx, q[:, :8], 1)
    with pytest.raises(UserError, match="IVF indexes only"):
        fi.set_search_params(idx, nprobe=4)


def test_write_read_and_truncated_file(tmp_path):
    x, q = _data(n=200)
    idx = fi.build_index(x, "Flat", progress=False)
    fi.write_index(idx, str(tmp_path / "i.faiss"))
    back = fi.read_index(str(tmp_path / "i.faiss"))
    np.testing.assert_array_equal(fi.search(back, q, 5)[1], fi.search(idx, q, 5)[1])
    raw = (tmp_path / "i.faiss").read_bytes()
    (tmp_path / "cut.faiss").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UserError, match="corrupted or truncated"):
        fi.read_index(str(tmp_path / "cut.faiss"))
    with pytest.raises(UserError, match="missing"):
        fi.read_index(str(tmp_path / "none.faiss"))


def test_unfilled_results_are_refused_not_read_as_the_last_passage():
    """An IVF search whose probed lists hold fewer than k vectors: FAISS fills the rest with row
    -1, which numpy would read as the last passage. One probed list of 64 holds ~16 of 1000
    vectors, so k=100 cannot be filled; probing every list can."""
    x, q = _data(n=1000, d=16, nq=4)
    idx = fi.build_index(x, "IVF64,Flat", progress=False)
    fi.set_search_params(idx, nprobe=1)
    raw_scores, raw_rows = idx.search(np.ascontiguousarray(q), 100)
    assert (raw_rows < 0).any()  # what FAISS itself returns
    with pytest.raises(UserError, match=r"found only \d+ of the k=100 passages .* nprobe=1.*raise --nprobe"):
        fi.search(idx, q, 100)
    fi.set_search_params(idx, nprobe=64)
    scores, rows = fi.search(idx, q, 100)
    bs, br = _brute(x, q, 100)
    np.testing.assert_allclose(scores, bs, rtol=1e-5, atol=1e-5)
