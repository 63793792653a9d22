"""rag-update-knowledge (rag_plugin/indexing/update.py): a new version equal to a from-scratch build of the new
collection, the encoder called once per new or edited passage, deleted passages never returned, readers
keeping the version they opened, --keep, and the faults (bad changes, another encoder, a second update at
once, a killed update) leaving the current version untouched."""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.indexing.update import update_knowledge_source
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import ROOT, HashingEncoder, assert_one_line_error, synthetic_passages, write_jsonl

N = 120


class CountingEncoder(HashingEncoder):
    """The hashing encoder, counting the passages it embeds."""

    def __init__(self):
        super().__init__()
        self.embedded = []

    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        self.embedded.extend(texts)
        return super().encode_passages(titles, texts, batch_size, progress)


def _build(tmp, rows, name, factory="Flat", num_shards=1, encoder=None):
    src = write_jsonl(tmp / f"{name}.jsonl", rows)
    settings = BuildSettings(passages=str(src), encoder="hashing", index_factory=factory, num_shards=num_shards)
    return build_knowledge_source(str(tmp / name), settings,
                                  BuildOptions(shard_size=32, progress=False, log=lambda m: None),
                                  BuildHooks(encoder=encoder or HashingEncoder()))


def _changes(tmp, rows):
    """Delete 5, replace 4, add 10: the files, and the new collection as a from-scratch build would read it."""
    deleted = [rows[i]["id"] for i in (0, 17, 18, 60, 119)]
    replaced = [{**rows[i], "text": rows[i]["text"] + " edited river"} for i in (3, 40, 41, 90)]
    added = [{"id": f"new{i}", "title": f"New {i}", "text": r["text"] + " queen"}
             for i, r in enumerate(synthetic_passages(10, seed=9))]
    (tmp / "delete.txt").write_text("".join(d + "\n" for d in deleted))
    write_jsonl(tmp / "replace.jsonl", replaced)
    write_jsonl(tmp / "add.jsonl", added)
    by_id = {r["id"]: r for r in replaced}
    expected = [by_id.get(r["id"], r) for r in rows if r["id"] not in deleted] + added
    return deleted, expected


def _update(tmp, encoder, **kw):
    return update_knowledge_source(str(tmp / "ks"), add=[str(tmp / "add.jsonl")], delete=str(tmp / "delete.txt"),
                                   replace=[str(tmp / "replace.jsonl")], encoder=encoder, progress=False,
                                   log=lambda m: None, **kw)


def _tree_digest(d: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(x for x in d.rglob("*") if x.is_file() and versions.VERSIONS not in x.relative_to(d).parts
                    and x.name not in (versions.CURRENT, versions.UPDATE_LOCK)):
        h.update(str(p.relative_to(d)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("num_shards", [1, 3])
def test_update_equals_a_from_scratch_build_and_embeds_only_what_changed(tmp_path, num_shards):
    rows = synthetic_passages(N, seed=3)
    _build(tmp_path, rows, "ks", num_shards=num_shards)
    deleted, expected = _changes(tmp_path, rows)
    before = KnowledgeSource(str(tmp_path / "ks"))            # a reader of version 1, open across the switch
    q = np.random.default_rng(0).standard_normal((25, 64)).astype(np.float32)
    old = before.local_search().search(q, 8, with_vectors=True)
    encoder = CountingEncoder()
    updated = _update(tmp_path, encoder)
    assert updated.version == 2 and versions.current_version(tmp_path / "ks") == 2
    assert sorted(encoder.embedded) == sorted(r["text"] for r in expected if r["id"].startswith("new")
                                              or r["text"].endswith("edited river"))  # 10 added + 4 edited
    scratch = _build(tmp_path, expected, "scratch", num_shards=num_shards)
    assert [updated.passages.id(i) for i in range(len(updated))] == [r["id"] for r in expected]
    np.testing.assert_array_equal(updated.vectors[np.arange(len(updated))], scratch.vectors[np.arange(len(scratch))])
    for a, b in zip(updated.local_search().search(q, 8, with_vectors=True),
                    scratch.local_search().search(q, 8, with_vectors=True)):
        np.testing.assert_array_equal(a, b)
    # deleted passages are never returned, even for questions that are exactly them
    own = np.stack([HashingEncoder().encode_passages([r["title"]], [r["text"]])[0]
                    for r in rows if r["id"] in deleted])
    hits = updated.local_search().search(own.astype(np.float32), 20)[1]
    assert not {updated.passages.id(int(r)) for r in hits.reshape(-1)} & set(deleted)
    # the reader that opened version 1 still searches and reads version 1
    assert before.version == 1
    for a, b in zip(old, before.local_search().search(q, 8, with_vectors=True)):
        np.testing.assert_array_equal(a, b)
    assert before.passages.text(3) == rows[3]["text"]


def test_ivf_keeps_its_quantizer_and_advises_retraining(tmp_path):
    rows = synthetic_passages(N, seed=3)
    first = _build(tmp_path, rows, "ks", factory="IVF4,Flat")
    _changes(tmp_path, rows)
    logs = []
    updated = update_knowledge_source(str(tmp_path / "ks"), add=[str(tmp_path / "add.jsonl")], encoder=HashingEncoder(),
                                      progress=False, log=logs.append)
    np.testing.assert_array_equal(updated.part(0).index.quantizer.reconstruct_n(0, 4),
                                  first.part(0).index.quantizer.reconstruct_n(0, 4))
    assert updated.manifest["update"]["retrained"] is False and not any("advisable" in m for m in logs)
    (tmp_path / "many.txt").write_text("".join(r["id"] + "\n" for r in rows[:40]))  # a third of the passages
    update_knowledge_source(str(tmp_path / "ks"), delete=str(tmp_path / "many.txt"), encoder=HashingEncoder(),
                            progress=False, log=logs.append)
    assert any("retraining is advisable (rerun with --retrain)" in m for m in logs)


def test_keep_removes_only_versions_no_process_has_open(tmp_path):
    rows = synthetic_passages(N, seed=3)
    _build(tmp_path, rows, "ks")
    _changes(tmp_path, rows)
    root = tmp_path / "ks"
    update_knowledge_source(str(root), add=[str(tmp_path / "add.jsonl")], encoder=HashingEncoder(), progress=False,
                            log=lambda m: None)
    reader_of_2 = KnowledgeSource(str(root))
    logs = []
    update_knowledge_source(str(root), delete=str(tmp_path / "delete.txt"), encoder=HashingEncoder(), keep=1,
                            progress=False, log=logs.append)
    assert versions.versions(root) == [2, 3] and "version 2 is open in a running process: kept" in logs
    assert not (root / "manifest.json").exists() and not (root / "passages").exists()
    assert reader_of_2.passages.id(0) == rows[0]["id"]  # still readable
    del reader_of_2
    from rag_plugin.indexing.update import remove_old_versions

    assert remove_old_versions(root, 1, log=lambda m: None) == [2]
    assert KnowledgeSource(str(root)).version == 3


@pytest.mark.parametrize("kind, needle", [
    ("delete_missing", "cannot delete passage id 'nope'"),
    ("replace_missing", "cannot replace passage id 'ghost'"),
    ("add_existing", "cannot add passage id 'p5'"),
    ("other_encoder", "does not match"),
    ("locked", "another update of this knowledge source is running"),
])
def test_bad_updates_change_nothing(tmp_path, kind, needle):
    rows = synthetic_passages(N, seed=3)
    _build(tmp_path, rows, "ks")
    root = tmp_path / "ks"
    digest = _tree_digest(root)
    encoder = HashingEncoder()
    kw = {}
    if kind == "delete_missing":
        (tmp_path / "d.txt").write_text("p1\n\nnope\n")
        kw["delete"] = str(tmp_path / "d.txt")
    elif kind == "replace_missing":
        kw["replace"] = [str(write_jsonl(tmp_path / "r.jsonl", [{"id": "ghost", "title": "t", "text": "x"}]))]
    elif kind == "add_existing":
        kw["add"] = [str(write_jsonl(tmp_path / "a.jsonl", [{"id": "n1", "title": "t", "text": "x"}, rows[5]]))]
    else:
        kw["add"] = [str(write_jsonl(tmp_path / "a.jsonl", [{"id": "n1", "title": "t", "text": "x y"}]))]
        if kind == "other_encoder":
            encoder = HashingEncoder(dim=32)
    if kind == "locked":
        with versions.UpdateLock(root), pytest.raises(UserError, match=needle):
            update_knowledge_source(str(root), encoder=encoder, progress=False, log=lambda m: None, **kw)
    else:
        with pytest.raises(UserError, match=needle) as err:
            update_knowledge_source(str(root), encoder=encoder, progress=False, log=lambda m: None, **kw)
        if kind == "delete_missing":
            assert err.value.line == 3
    assert versions.current_version(root) == 1 and versions.versions(root) == [1]
    assert _tree_digest(root) == digest


KILLER = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from tests.conftest import HashingEncoder
from rag_plugin.indexing.update import update_knowledge_source

class DiesAfterTwoChunks(HashingEncoder):
    calls = 0
    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        DiesAfterTwoChunks.calls += 1
        if DiesAfterTwoChunks.calls == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode_passages(titles, texts, batch_size, progress)

tmp = sys.argv[1]
update_knowledge_source(tmp + "/ks", add=[tmp + "/add.jsonl"], replace=[tmp + "/replace.jsonl"],
                        encoder=DiesAfterTwoChunks(), shard_size=32, progress=False, log=print)
"""


def test_a_killed_update_leaves_the_current_version_and_resumes(tmp_path):
    rows = synthetic_passages(N, seed=3)
    _build(tmp_path, rows, "ks")
    _changes(tmp_path, rows)
    root = tmp_path / "ks"
    digest = _tree_digest(root)
    proc = subprocess.run([sys.executable, "-c", KILLER, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert versions.current_version(root) == 1 and _tree_digest(root) == digest
    assert KnowledgeSource(str(root)).version == 1
    encoder = CountingEncoder()
    updated = update_knowledge_source(str(root), add=[str(tmp_path / "add.jsonl")],
                                      replace=[str(tmp_path / "replace.jsonl")], encoder=encoder, shard_size=32,
                                      progress=False, log=lambda m: None)
    assert updated.version == 2 and len(updated) == N + 10
    assert len(encoder.embedded) == 11  # 1 replaced + 10 added: the 3 replaced in the 2 finished chunks not again


def test_command_line_errors_are_one_line(tiny_world, tmp_path):
    import shutil

    ks = tmp_path / "ks"
    shutil.copytree(tiny_world["ks"], ks)
    (tmp_path / "d.txt").write_text("c1\nmissing-id\n")
    proc = subprocess.run([sys.executable, "-m", "rag_plugin.cli.update_knowledge", "--knowledge", str(ks),
                           "--delete", str(tmp_path / "d.txt")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert_one_line_error(proc, "cannot delete passage id 'missing-id'", "d.txt:2:")
    (tmp_path / "d1.txt").write_text("c1\n")
    ok = subprocess.run([sys.executable, "-m", "rag_plugin.cli.update_knowledge", "--knowledge", str(ks),
                         "--delete", str(tmp_path / "d1.txt"), "--quiet"], capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert KnowledgeSource(str(ks)).version == 2 and len(KnowledgeSource(str(ks))) == len(tiny_world["countries"]) - 1
