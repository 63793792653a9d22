"""Re-embedding a knowledge source with a trained document tower (rag_plugin/indexing/reembed.py,
``rag-update-knowledge --reembed``): the source's own weights give back its vectors and search results; other
weights give a from-scratch embedding with them, each passage embedded once, with the index settings kept
(Flat, IVF retrained, shards); a killed re-embedding leaves the previous version current and byte-identical and
the same call resumes; chunks split between independent processes; the command line's one-line errors."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.indexing.reembed import CHUNK_SIZE, Reembedding, TowerEncoder, reembed, tower_encoder
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.encoders import load_encoder
from rag_plugin.retrieval.encoders.weights import load_tower_state, state_dict_sha256
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import ROOT, assert_one_line_error, synthetic_passages, write_jsonl

SPEC = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0,max_length=32"
N, CHUNK = 150, 32
assert CHUNK < CHUNK_SIZE


def _quiet(message):
    pass


def _build(tmp: Path, factory="Flat", num_shards=1) -> KnowledgeSource:
    src = write_jsonl(tmp / "p.jsonl", synthetic_passages(N, seed=5))
    settings = BuildSettings(passages=str(src), encoder=SPEC, index_factory=factory, num_shards=num_shards,
                             train_size=N)
    return build_knowledge_source(str(tmp / "ks"), settings, BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))


def _own_state(ks: KnowledgeSource) -> dict:
    return {k: v.clone() for k, v in ks.load_encoder().passage_tower.state_dict().items()}


def _perturbed(state: dict, seed=1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in state.items()}


class Counting(TowerEncoder):
    """The tower encoder, counting the passages it embeds."""

    def __init__(self, base: TowerEncoder):
        super().__init__(base.encoder, base.base_identity, base.tower_sha)
        self.embedded = []

    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        self.embedded.extend(texts)
        return super().encode_passages(titles, texts, batch_size, progress)


def _digest(root: Path) -> str:
    """Version 1's files (not the versions beside it, CURRENT, the lock or the re-embedding's scratch)."""
    h = hashlib.sha256()
    skip = (versions.VERSIONS, ".reindex")
    for p in sorted(x for x in root.rglob("*") if x.is_file() and not set(skip) & set(x.relative_to(root).parts)
                    and x.name not in (versions.CURRENT, versions.UPDATE_LOCK)):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _vectors(ks: KnowledgeSource) -> np.ndarray:
    return np.asarray(ks.vectors[np.arange(len(ks))])


def _search(ks: KnowledgeSource, queries: np.ndarray, k=10):
    return ks.local_search().search(queries, k)


def test_the_sources_own_tower_gives_back_its_vectors_and_search_results(tmp_path):
    ks = _build(tmp_path)
    root = tmp_path / "ks"
    state = _own_state(ks)
    assert reembed(str(root), state, Reembedding("own weights"),
                   BuildOptions(shard_size=CHUNK, progress=False, log=_quiet)) == 2
    new = KnowledgeSource(str(root))
    assert new.version == 2 and versions.current_version(root) == 2
    np.testing.assert_allclose(_vectors(new), _vectors(ks), atol=1e-6, rtol=0)
    queries = ks.load_encoder().encode_queries(["alpha river king", "blue mountain", "omega city"])
    old_rows, new_rows = ks.index.search(queries, 10)[1], new.index.search(queries, 10)[1]
    np.testing.assert_array_equal(old_rows, new_rows)
    assert new.passages.sha256 == ks.passages.sha256
    assert [new.passages.id(r) for r in range(N)] == [ks.passages.id(r) for r in range(N)]
    m = new.manifest
    assert m["document_tower_sha256"] == state_dict_sha256(state) and m["reembedded_from"] == "own weights"
    assert m["encoder"] == ks.manifest["encoder"] and m["index_factory"] == "Flat"
    assert new.load_encoder() is not None  # the source's own encoder still opens it
    assert not (root / ".reindex" / f"v000001-{state_dict_sha256(state)[:16]}").exists()


@pytest.mark.parametrize("factory,num_shards", [("Flat", 1), ("IVF4,Flat", 1), ("Flat", 2)])
def test_another_tower_equals_a_from_scratch_embedding_each_passage_once(tmp_path, factory, num_shards):
    ks = _build(tmp_path, factory, num_shards)
    root = tmp_path / "ks"
    state = _perturbed(_own_state(ks))
    encoder = Counting(tower_encoder(ks, state, "perturbed"))
    reembed(str(root), state, Reembedding("perturbed", encoder=encoder),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    assert len(encoder.embedded) == N and sorted(encoder.embedded) == sorted(ks.passages.text(r) for r in range(N))
    reference = load_encoder(SPEC)
    load_tower_state(reference.passage_tower, state, "test", "document tower")
    titles, texts = [ks.passages.title(r) for r in range(N)], [ks.passages.text(r) for r in range(N)]
    expected = reference.encode_passages(titles, texts, batch_size=7, progress=False)
    new = KnowledgeSource(str(root))
    got = _vectors(new)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(got - _vectors(ks)).max() > 1e-3  # the weights did change the vectors
    assert new.num_shards == num_shards and new.manifest["index_factory"] == factory
    assert new.manifest["document_tower_sha256"] == state_dict_sha256(state)
    queries = expected[:5] + 0.01
    brute = np.argsort(-(queries @ expected.T), axis=1, kind="stable")[:, :5]
    if factory.startswith("IVF"):
        new.set_search_params(nprobe=4)  # every list: exact, over a quantizer trained on the new vectors
    rows = _search(new, queries, 5)[1] if num_shards > 1 else new.index.search(queries, 5)[1]
    np.testing.assert_array_equal(rows, brute)


def test_chunks_split_between_independent_processes(tmp_path):
    ks = _build(tmp_path)
    root = tmp_path / "ks"
    state = _perturbed(_own_state(ks), seed=2)
    encoders = [Counting(tower_encoder(ks, state, "w")) for _ in range(2)]
    assert reembed(str(root), state, Reembedding("w", rank=1, world=2, encoder=encoders[1]),
                   BuildOptions(shard_size=CHUNK, progress=False, log=_quiet)) == 2
    assert versions.current_version(root) == 1  # rank 1 only wrote its chunks
    reembed(str(root), state, Reembedding("w", rank=0, world=2, encoder=encoders[0], wait_minutes=0.1),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    assert len(encoders[0].embedded) + len(encoders[1].embedded) == N
    assert len(encoders[1].embedded) == 2 * CHUNK  # chunks 1 and 3 of 0..4
    assert KnowledgeSource(str(root)).version == 2


def test_a_failed_rank_stops_rank_0_waiting(tmp_path):
    ks = _build(tmp_path)
    state = _own_state(ks)
    chunks = tmp_path / "ks" / ".reindex" / f"v000001-{state_dict_sha256(state)[:16]}"
    chunks.mkdir(parents=True)
    (chunks / "failed.rank1").write_text("RuntimeError: out of memory\n")
    with pytest.raises(UserError, match="out of memory"):
        reembed(str(tmp_path / "ks"), state, Reembedding("w", world=2),
                BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    assert versions.current_version(tmp_path / "ks") == 1


KILLER = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from rag_plugin.indexing import BuildOptions
from rag_plugin.indexing.reembed import Reembedding, reembed, tower_encoder
from rag_plugin.retrieval.knowledge import KnowledgeSource
from tests.indexing.test_reembed import Counting, _own_state, _perturbed, CHUNK

class DiesAtTheThirdChunk(Counting):
    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        if len(self.embedded) == 2 * CHUNK:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode_passages(titles, texts, batch_size, progress)

root = sys.argv[1] + "/ks"
ks = KnowledgeSource(root)
state = _perturbed(_own_state(ks))
reembed(root, state, Reembedding("x", encoder=DiesAtTheThirdChunk(tower_encoder(ks, state, "x"))),
        BuildOptions(shard_size=CHUNK, progress=False))
"""


def test_a_killed_reembedding_leaves_the_version_current_and_resumes(tmp_path):
    ks = _build(tmp_path)
    root = tmp_path / "ks"
    digest = _digest(root)
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert versions.current_version(root) == 1 and _digest(root) == digest and versions.versions(root) == [1]
    assert KnowledgeSource(str(root)).version == 1
    state = _perturbed(_own_state(ks))
    encoder = Counting(tower_encoder(ks, state, "x"))
    reembed(str(root), state, Reembedding("x", encoder=encoder),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    assert len(encoder.embedded) == N - 2 * CHUNK  # the 2 chunks written before the kill are not made again
    assert KnowledgeSource(str(root)).version == 2 and _digest(root) == digest


def test_other_weights_discard_an_unfinished_reembedding_instead_of_mixing(tmp_path):
    ks = _build(tmp_path)
    root = tmp_path / "ks"
    first = _perturbed(_own_state(ks), seed=3)
    half = Counting(tower_encoder(ks, first, "a"))
    reembed(str(root), first, Reembedding("a", rank=1, world=2, encoder=half),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    second = _perturbed(_own_state(ks), seed=4)
    encoder = Counting(tower_encoder(ks, second, "b"))
    reembed(str(root), second, Reembedding("b", encoder=encoder),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    assert len(encoder.embedded) == N
    assert KnowledgeSource(str(root)).manifest["document_tower_sha256"] == state_dict_sha256(second)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.update_knowledge", *args, "--quiet"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


def test_command_line(tmp_path):
    ks = _build(tmp_path)
    root = tmp_path / "ks"
    state = _perturbed(_own_state(ks))
    torch.save({"document_tower": state}, tmp_path / "tower.pt")
    write_jsonl(tmp_path / "add.jsonl", [{"id": "new", "title": "t", "text": "a new passage"}])
    assert_one_line_error(_cli("--knowledge", str(root), "--reembed", str(tmp_path / "tower.pt"), "--add",
                               str(tmp_path / "add.jsonl")), "cannot be combined with --add")
    ok = _cli("--knowledge", str(root), "--reembed", str(tmp_path / "tower.pt"))
    assert ok.returncode == 0, ok.stderr
    new = KnowledgeSource(str(root))
    assert new.version == 2 and new.manifest["reembedded_from"] == str(tmp_path / "tower.pt")
    assert new.manifest["document_tower_sha256"] == state_dict_sha256(state)
    # a re-embedded version gains no passage (the source's own tower would embed it), but can lose some
    assert_one_line_error(_cli("--knowledge", str(root), "--add", str(tmp_path / "add.jsonl")),
                          "was re-embedded with a trained document tower")
    (tmp_path / "gone.txt").write_text(ks.passages.id(3) + "\n")
    ok = _cli("--knowledge", str(root), "--delete", str(tmp_path / "gone.txt"))
    assert ok.returncode == 0, ok.stderr
    third = KnowledgeSource(str(root))
    assert third.version == 3 and len(third) == N - 1
    assert third.manifest["document_tower_sha256"] == state_dict_sha256(state)
    np.testing.assert_array_equal(_vectors(third), np.delete(_vectors(new), 3, axis=0))
    assert json.loads((root / "versions" / "000002" / "manifest.json").read_text())["version"] == 2


def test_an_update_does_not_take_over_a_reembedded_version_never_made_current(tmp_path):
    from rag_plugin.indexing.update import update_knowledge_source

    ks = _build(tmp_path)
    root = tmp_path / "ks"
    reembed(str(root), _perturbed(_own_state(ks)), Reembedding("x"),
            BuildOptions(shard_size=CHUNK, progress=False, log=_quiet))
    versions.switch_to(root, 1)  # as if killed between the rename of version 2 and the switch
    (tmp_path / "gone.txt").write_text(ks.passages.id(0) + "\n")
    updated = update_knowledge_source(str(root), delete=str(tmp_path / "gone.txt"), progress=False, log=_quiet)
    assert updated.version == 2 and len(updated) == N - 1 and "document_tower_sha256" not in updated.manifest
    np.testing.assert_array_equal(_vectors(updated), _vectors(ks)[1:])


GROUP_RANK = r"""
import sys
sys.path.insert(0, sys.argv[2])
from rag_plugin.indexing import BuildOptions
from rag_plugin.indexing.distributed import BuildGroup
from rag_plugin.indexing.reembed import Reembedding, reembed
from rag_plugin.retrieval.knowledge import KnowledgeSource
from tests.indexing.test_reembed import CHUNK, _own_state, _perturbed

root = sys.argv[1]
group = BuildGroup.from_environment()
state = _perturbed(_own_state(KnowledgeSource(root)))
print("version", reembed(root, state, Reembedding("g"), BuildOptions(shard_size=CHUNK, progress=False, log=print,
                                                                       group=group)))
group.close()
"""


def test_a_torchrun_group_splits_the_embedding_and_rank_0_commits(tmp_path):
    from tests.indexing.test_distributed_build import _ranks

    ks = _build(tmp_path)
    root = tmp_path / "ks"
    procs = _ranks(2, ["-c", GROUP_RANK], str(root), str(ROOT))
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "version 2" in proc.stdout
    new = KnowledgeSource(str(root))
    state = _perturbed(_own_state(ks))
    assert new.version == 2 and new.manifest["document_tower_sha256"] == state_dict_sha256(state)
    reference = load_encoder(SPEC)
    load_tower_state(reference.passage_tower, state, "test", "document tower")
    expected = reference.encode_passages([ks.passages.title(r) for r in range(N)],
                                         [ks.passages.text(r) for r in range(N)], progress=False)
    np.testing.assert_allclose(_vectors(new), expected, atol=1e-5, rtol=0)
