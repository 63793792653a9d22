"""Exact merging of candidates from several index parts, and search settings across shards."""
import numpy as np
import pytest

from rag_plugin.retrieval.parts import merge_top_k
from tests.conftest import build_hashing_knowledge_source


def _brute_top_k(q, x, k):
    """Top k of q.x by score, ties by the lower row (the order the merge promises)."""
    s = q @ x.T
    order = np.lexsort((np.broadcast_to(np.arange(len(x)), s.shape), -s.astype(np.float64)), axis=-1)[:, :k]
    return np.take_along_axis(s, order, 1), order


@pytest.mark.parametrize("cuts", [[0, 40], [0, 13, 27, 40], [0, 1, 2, 39, 40]])
def test_merge_of_parts_equals_brute_force_with_ties(cuts):
    rng = np.random.default_rng(len(cuts))
    base = rng.integers(-2, 3, size=(10, 4)).astype(np.float32)  # small integers: many exact ties
    x = base[rng.integers(0, 10, size=40)]                          # duplicated rows in every part
    q = rng.integers(-2, 3, size=(6, 4)).astype(np.float32)
    k = 9
    parts_s, parts_r = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        s, r = _brute_top_k(q, x[a:b], min(k, b - a))
        pad = k - s.shape[1]
        parts_s.append(np.pad(s, ((0, 0), (0, pad)), constant_values=-np.inf))
        parts_r.append(np.pad(r + a, ((0, 0), (0, pad)), constant_values=-1))
    scores, rows, vecs = merge_top_k(parts_s, parts_r, k, [x[np.maximum(r, 0)] for r in parts_r])
    want_s, want_r = _brute_top_k(q, x, k)
    np.testing.assert_array_equal(rows, want_r)
    np.testing.assert_array_equal(scores, want_s)
    np.testing.assert_array_equal(vecs, x[want_r])


def test_unfilled_places_sort_last_and_stay_marked():
    scores = [np.array([[3.0, -np.inf]], dtype=np.float32), np.array([[1.0, -np.inf]], dtype=np.float32)]
    rows = [np.array([[7, -1]]), np.array([[2, -1]])]
    s, r, _ = merge_top_k(scores, rows, 3)
    assert r.tolist() == [[7, 2, -1]] and s[0, :2].tolist() == [3.0, 1.0]


def test_ivf_shards_share_one_quantizer_and_search_settings(tmp_path):
    """IVF shards are copies of one trained template: with every list probed (nprobe = nlist, set once on the
    source, applied to every shard) a sharded IVF-Flat returns the exact top k, like Flat."""
    flat = build_hashing_knowledge_source(tmp_path, n=600, name="flat")
    ivf = build_hashing_knowledge_source(tmp_path, n=600, factory="IVF8,Flat", num_shards=3, name="ivf")
    ivf.set_search_params(nprobe=8)
    assert all(ivf.part(i).index.nprobe == 8 for i in range(3))
    q = np.random.default_rng(0).standard_normal((30, flat.dim)).astype(np.float32)
    want_s, want_r, _ = flat.local_search().search(q, 10)
    got_s, got_r, _ = ivf.local_search().search(q, 10)
    np.testing.assert_array_equal(got_r, want_r)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-5, atol=1e-6)
    centroids = [ivf.part(i).index.quantizer.reconstruct_n(0, 8) for i in range(3)]
    assert all(np.array_equal(c, centroids[0]) for c in centroids)


def test_sharded_source_reads_vectors_by_row_and_refuses_the_single_index_view(tmp_path):
    whole = build_hashing_knowledge_source(tmp_path, n=100, name="whole")
    sharded = build_hashing_knowledge_source(tmp_path, n=100, num_shards=4, name="sharded")
    rows = np.array([[99, 0, 25], [24, 50, 75]])
    np.testing.assert_array_equal(sharded.vectors[rows], whole.vectors[rows])
    np.testing.assert_array_equal(sharded.vectors[10:60], whole.vectors[10:60])
    assert [e.rows for e in sharded.shards] == [25, 25, 25, 25] and sharded.num_shards == 4
    with pytest.raises(ValueError, match="sharded"):
        sharded.index  # noqa: B018
