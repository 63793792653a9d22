"""A knowledge source built in S index shards (``rag-build-knowledge --num-shards S``; rag_plugin/indexing/sharding.py,
rag_plugin/retrieval/shards.py): it searches exactly like the unsharded one (rows, scores, stored vectors) and like
brute force; bad --num-shards values are one-line errors that leave nothing behind; a shard file that is missing,
truncated or from another build is refused by name when the source is opened."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.indexing.distributed import shard_builders, share
from rag_plugin.indexing.sharding import shard_bounds
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import (
    ROOT,
    HashingEncoder,
    build_hashing_knowledge_source,
    synthetic_passages,
    write_jsonl,
)

N = 301  # no shard count below divides it


def _queries(dim: int, count: int = 9) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((count, dim)).astype(np.float32)


def _brute_force(vectors: np.ndarray, queries: np.ndarray, k: int):
    """Top k by inner product, best first, equal scores by the lower row."""
    scores = queries.astype(np.float64) @ vectors.astype(np.float64).T
    rows = np.stack([np.lexsort((np.arange(len(vectors)), -s))[:k] for s in scores])
    return np.take_along_axis(scores, rows, axis=1), rows


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory):
    return build_hashing_knowledge_source(tmp_path_factory.mktemp("unsharded"), n=N)


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_sharded_source_searches_exactly_like_the_unsharded_one(tmp_path, unsharded, num_shards):
    ks = build_hashing_knowledge_source(tmp_path, n=N, num_shards=num_shards)
    assert ks.num_shards == num_shards and len(ks) == N
    if num_shards > 1:
        sizes = [e.rows for e in ks.shards]
        assert [(e.start, e.end) for e in ks.shards] == shard_bounds(N, num_shards) and max(sizes) - min(sizes) == 1
        assert not (tmp_path / "ks" / "vectors.npy").exists() and not (tmp_path / "ks" / ".build").exists()
    np.testing.assert_array_equal(ks.vectors[np.arange(N)], np.asarray(unsharded.vectors))
    queries = _queries(ks.dim)
    for k in (1, 10, 70):  # 70: more than a shard of 5 holds
        scores, rows, vectors = ks.local_search().search(queries, k, with_vectors=True)
        ref_scores, ref_rows, ref_vectors = unsharded.local_search().search(queries, k, with_vectors=True)
        np.testing.assert_array_equal(rows, ref_rows)
        np.testing.assert_array_equal(scores, ref_scores)
        np.testing.assert_array_equal(vectors, ref_vectors)
        np.testing.assert_array_equal(vectors, np.asarray(unsharded.vectors)[rows])
        bf_scores, bf_rows = _brute_force(np.asarray(unsharded.vectors), queries, k)
        np.testing.assert_array_equal(rows, bf_rows)
        np.testing.assert_allclose(scores, bf_scores, rtol=1e-5, atol=1e-6)


def test_ivf_shards_share_one_trained_quantizer_and_probing_every_list_is_exact(tmp_path, unsharded):
    ks = build_hashing_knowledge_source(tmp_path, n=N, factory="IVF4,Flat", num_shards=3)
    ks.set_search_params(nprobe=4)
    centroids = [ks.part(i).index.quantizer.reconstruct_n(0, 4) for i in range(3)]
    assert all(np.array_equal(c, centroids[0]) for c in centroids)
    queries = _queries(ks.dim)
    scores, rows, _ = ks.local_search().search(queries, 10)
    bf_scores, bf_rows = _brute_force(np.asarray(unsharded.vectors), queries, 10)
    np.testing.assert_array_equal(rows, bf_rows)
    np.testing.assert_allclose(scores, bf_scores, rtol=1e-5, atol=1e-6)


def test_every_shard_and_chunk_has_exactly_one_builder():
    for num_shards, world in [(1, 1), (1, 3), (2, 3), (3, 2), (5, 2), (4, 4), (7, 3)]:
        builders = shard_builders(num_shards, world)
        assert len(builders) == num_shards and all(0 <= r < world for r in builders)
        if num_shards >= world:
            assert set(builders) == set(range(world))  # nobody idle
    from rag_plugin.indexing.distributed import BuildGroup

    items = list(range(0, 1000, 64))
    shares = [share(items, BuildGroup(rank, 3)) for rank in range(3)]
    assert sorted(sum(shares, [])) == items and max(map(len, shares)) - min(map(len, shares)) <= 1


def _cli(tmp_path, *args):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(20))
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.build_knowledge", "--passages", str(src),
                           "--out", str(tmp_path / "ks"), "--encoder", "random:dim=16,layers=1,heads=1", "--quiet",
                           *map(str, args)], capture_output=True, text=True, timeout=300, cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("shards, message", [(0, "--num-shards must be at least 1, got 0"),
                                             (21, "--num-shards 21 is more than the 20 passages")])
def test_bad_num_shards_is_one_line_and_writes_nothing(tmp_path, shards, message):
    proc = _cli(tmp_path, "--num-shards", shards)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("error: ") == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and message in proc.stderr  # after the log
    assert not (tmp_path / "ks").exists()


def test_num_shards_with_an_existing_faiss_index_is_refused_before_anything_is_written(tmp_path, unsharded):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(N))
    settings = BuildSettings(passages=str(src), encoder="hashing", num_shards=2,
                             index_file=str(unsharded.directory / "index.faiss"))
    with pytest.raises(UserError, match=r"--faiss-index\) cannot be cut into shards"):
        build_knowledge_source(str(tmp_path / "ks"), settings, BuildOptions(progress=False, log=lambda m: None),
                               BuildHooks(encoder=HashingEncoder()))
    assert not (tmp_path / "ks").exists()


def _other_build(tmp_path, num_shards):
    """A build with the same shard sizes but other passages."""
    src = write_jsonl(tmp_path / "other.jsonl", synthetic_passages(N, seed=7))
    return build_knowledge_source(str(tmp_path / "other"),
                                  BuildSettings(passages=str(src), encoder="hashing",
                                                                         num_shards=num_shards),
                                  BuildOptions(progress=False, log=lambda m: None),
                                  BuildHooks(encoder=HashingEncoder()))


@pytest.mark.parametrize("damage, message", [
    ("delete index", "index shard 1 (rows 100-199) is missing"),
    ("delete vectors", "index shard 1 (rows 100-199) is missing"),
    ("truncate vectors", "index shard 1 (rows 100-199) is 25536 bytes, the manifest says 25728"),
    ("swap index", "index shard 1 (rows 100-199) does not match the manifest checksum"),
    ("swap vectors", "index shard 1 (rows 100-199) does not match the manifest checksum"),
])
def test_a_damaged_or_foreign_shard_is_refused_by_name(tmp_path, damage, message):
    ks = build_hashing_knowledge_source(tmp_path, n=N, num_shards=3)
    action, which = damage.split()
    name = {"index": "index.faiss", "vectors": "vectors.npy"}[which]
    target = ks.directory / "shards" / "00001" / name
    if action == "delete":
        target.unlink()
    elif action == "truncate":
        with open(target, "r+b") as fh:
            fh.truncate(target.stat().st_size - 192)
    else:
        other = _other_build(tmp_path, 3).directory / "shards" / "00001" / name
        assert other.stat().st_size == target.stat().st_size and other.read_bytes() != target.read_bytes()
        shutil.copyfile(other, target)
    with pytest.raises(UserError) as err:
        KnowledgeSource(str(ks.directory)).local_search()
    line = err.value.render()
    assert message in line and str(target) in line and "\n" not in line
    KnowledgeSource(str(ks.directory)).local_search([0, 2])  # the other shards still open
