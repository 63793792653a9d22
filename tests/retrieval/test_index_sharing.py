"""The FAISS index mapped once per node: two processes reading the same index share its pages (smaps
Private stays a small fraction of the index), a private copy is private; a type FAISS cannot map falls back
to a private copy with one warning; a process keeps what it mapped when the source is rebuilt under it."""
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.retrieval import index as faiss_index
from rag_plugin.retrieval.knowledge import KnowledgeSource
from tests.conftest import build_hashing_knowledge_source

ROOT = Path(__file__).resolve().parents[2]

# A process that reads the index, searches it (touching every page), says it is ready, waits until its
# peer is ready too (both map the file at once), then prints its private bytes from smaps_rollup.
READER = r"""
import sys, time
from pathlib import Path
import numpy as np
from rag_plugin.retrieval import index as faiss_index
path, mode, me, peer = sys.argv[1:5]
index, how = faiss_index.read_index_as(path, mode)
index.search(np.ones((4, index.d), dtype=np.float32), 3)
Path(me).write_text("ready")
deadline = time.time() + 60
while not Path(peer).exists() and time.time() < deadline:
    time.sleep(0.05)
fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in open("/proc/self/smaps_rollup")
          if line.split(":")[0] in ("Private_Clean", "Private_Dirty", "Pss")}
print(how, fields["Private_Clean"] + fields["Private_Dirty"], fields["Pss"])
time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def flat_index(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharing") / "flat.faiss"
    x = np.random.default_rng(0).standard_normal((120_000, 64)).astype(np.float32)  # 30.7 MB of codes
    faiss_index.write_index(faiss_index.build_index(x, "Flat", progress=False), str(path))
    return path


def _two_readers(tmp_path, path, mode):
    """Private bytes of each of two processes that have the index open at the same time, over those of two
    processes doing the same with an index of 100 vectors."""
    tiny = tmp_path / "tiny.faiss"
    x = np.random.default_rng(0).standard_normal((100, 64)).astype(np.float32)
    faiss_index.write_index(faiss_index.build_index(x, "Flat", progress=False), str(tiny))
    baseline = _run_pair(tmp_path / "tiny", tiny, mode)
    loaded = _run_pair(tmp_path / mode, path, mode)
    return [b - a for (_, a, _), (_, b, _) in zip(baseline, loaded)], [how for how, _, _ in loaded]


def _run_pair(d, path, mode):
    d.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", READER, str(path), mode, str(d / f"{i}"), str(d / f"{1 - i}")],
                              stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                                                      "PATH": "/usr/bin:/bin"})
             for i in (0, 1)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        how, private, pss = text.split()
        out.append((how, int(private), int(pss)))
    return out


def test_processes_share_one_mapped_copy(tmp_path, flat_index):
    size = flat_index.stat().st_size
    added, hows = _two_readers(tmp_path, flat_index, "shared")
    assert hows == ["shared", "shared"]
    assert all(a < 0.05 * size for a in added), (added, size)  # each process: < 5% of the index private


def test_private_copy_is_private(tmp_path, flat_index):
    size = flat_index.stat().st_size
    added, hows = _two_readers(tmp_path, flat_index, "private")
    assert hows == ["private", "private"]
    assert all(a > 0.9 * size for a in added), (added, size)


def test_index_faiss_cannot_map_falls_back_to_a_private_copy(flat_index, monkeypatch):
    faiss = faiss_index._faiss()
    plain = faiss.read_index

    def refuse_mapping(path, flags=0):
        if flags:
            raise RuntimeError("Error in read: mmap not supported for this index")
        return plain(path, flags)

    monkeypatch.setattr(faiss, "read_index", refuse_mapping)
    warnings = []
    index, how = faiss_index.read_index_as(str(flat_index), "shared", warn=warnings.append)
    assert how == "private" and index.ntotal == 120_000
    assert len(warnings) == 1 and "cannot map a IndexFlatIP index" in warnings[0] and "\n" not in warnings[0]


@pytest.mark.parametrize("factory", ["IVF16,SQ8", "HNSW16", "PQ8"])
def test_other_index_types_map_with_the_same_results(tmp_path, factory):
    x = np.random.default_rng(1).standard_normal((3000, 32)).astype(np.float32)
    path = tmp_path / "i.faiss"
    faiss_index.write_index(faiss_index.build_index(x, factory, progress=False), str(path))
    shared, how = faiss_index.read_index_as(str(path), "shared")
    private, _ = faiss_index.read_index_as(str(path), "private")
    q = x[:50] + 0.1
    assert how == "shared"
    for a, b in zip(faiss_index.search(shared, q, 5), faiss_index.search(private, q, 5)):
        np.testing.assert_array_equal(a, b)


def test_a_process_keeps_the_source_it_mapped_while_it_is_rebuilt(tmp_path):
    """Delete a knowledge source that a process has open and build another in its place: the process keeps
    searching and reading the one it opened (mapped files are replaced by renames, never written in place)."""
    first = build_hashing_knowledge_source(tmp_path, n=200, num_shards=2, name="ks")
    search = first.local_search()
    q = np.random.default_rng(2).standard_normal((8, first.dim)).astype(np.float32)
    before = search.search(q, 5, with_vectors=True)
    texts = [first.passages.text(int(r)) for r in before[1][0]]
    import shutil

    shutil.rmtree(tmp_path / "ks")
    (tmp_path / "p.jsonl").unlink()
    time.sleep(0.01)
    second = build_hashing_knowledge_source(tmp_path, n=150, num_shards=2, name="ks")  # other passages, same path
    assert len(second) == 150 and len(KnowledgeSource(str(tmp_path / "ks"))) == 150
    after = search.search(q, 5, with_vectors=True)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    assert [first.passages.text(int(r)) for r in after[1][0]] == texts
