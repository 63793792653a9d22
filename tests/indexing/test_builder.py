"""The knowledge-source builder (rag_plugin.indexing): up to date, resume after an interruption (a
SIGKILL included), reuse of unchanged passages' vectors, and every rerun check; each result
compared with a build that was never interrupted."""
import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import ROOT, HashingEncoder, build_hashing_knowledge_source, synthetic_passages, write_jsonl


def _build(tmp_path, n=300, factory="Flat", **kw):
    return build_hashing_knowledge_source(tmp_path, n, factory, **kw)


def test_rebuild_same_settings_is_up_to_date_other_settings_refused(tmp_path):
    _build(tmp_path)
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ks").rglob("*")}
    _build(tmp_path)  # no error: up to date, nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "ks").rglob("*")} == stamps
    with pytest.raises(UserError, match="other settings"):
        _build(tmp_path, factory="HNSW32")


def test_output_dir_with_foreign_content_is_refused(tmp_path):
    (tmp_path / "ks").mkdir()
    (tmp_path / "ks" / "thesis.docx").write_text("precious")
    with pytest.raises(UserError, match="not empty and is not a knowledge source"):
        _build(tmp_path)
    assert (tmp_path / "ks" / "thesis.docx").read_text() == "precious"


SLOW_BUILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.conftest import HashingEncoder
    from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source

    class Slow(HashingEncoder):
        embedded = 0

        def encode_passages(self, titles, texts, **kw):
            time.sleep({delay})
            Slow.embedded += len(texts)
            return super().encode_passages(titles, texts)

    s = BuildSettings(passages={src!r}, encoder="hashing", index_factory="Flat")
    build_knowledge_source({out!r}, s, BuildOptions(shard_size=50, progress=False, log=print),
                           BuildHooks(encoder=Slow()))
    print("BUILT", Slow.embedded, flush=True)
""")


def test_sigkill_midway_then_resume_skips_finished_shards(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(500))
    out = tmp_path / "ks"
    script = tmp_path / "build.py"
    script.write_text(SLOW_BUILD.format(root=str(ROOT), src=str(src), out=str(out), delay=0.3))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    shards = out / ".build" / "shards"
    import time
    deadline = time.time() + 60
    while time.time() < deadline and len(list(shards.glob("*.npy"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(shards.glob("*.npy"))
    assert 3 <= len(done) < 10
    with pytest.raises(UserError, match="did not finish"):
        KnowledgeSource(str(out))
    # the resumed run must not recompute the finished shards
    script.write_text(SLOW_BUILD.format(root=str(ROOT), src=str(src), out=str(out), delay=0.0))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "BUILT" in r.stdout, r.stderr
    assert int(r.stdout.split("BUILT")[1].split()[0]) <= 500 - 50 * len(done)
    ks = KnowledgeSource(str(out))
    assert len(ks) == 500 and not (out / ".build").exists()
    # identical to a build that was never interrupted
    fresh = build_knowledge_source(str(tmp_path / "fresh"), BuildSettings(passages=str(src), encoder="hashing"),
                                   BuildOptions(shard_size=50, progress=False, log=lambda m: None),
                                   BuildHooks(encoder=HashingEncoder()))
    np.testing.assert_array_equal(np.asarray(ks.vectors), np.asarray(fresh.vectors))


class CountingEncoder(HashingEncoder):
    def __init__(self):
        super().__init__()
        self.embedded = 0

    def encode_passages(self, titles, texts, **kw):
        self.embedded += len(texts)
        return super().encode_passages(titles, texts)


def test_reuse_vectors_embeds_only_changed_passages(tmp_path):
    rows = synthetic_passages(200)
    first = write_jsonl(tmp_path / "a.jsonl", rows)
    build_knowledge_source(str(tmp_path / "ks1"), BuildSettings(passages=str(first), encoder="hashing"),
                           BuildOptions(shard_size=64, progress=False, log=lambda m: None),
                           BuildHooks(encoder=HashingEncoder()))
    rows[5]["text"] = "an edited passage about rivers"
    rows.append({"id": "new", "title": "New", "text": "a new passage"})
    second = write_jsonl(tmp_path / "b.jsonl", rows)
    enc = CountingEncoder()
    ks2 = build_knowledge_source(str(tmp_path / "ks2"), BuildSettings(passages=str(second), encoder="hashing"),
                                 BuildOptions(shard_size=64, progress=False, log=lambda m: None),
                                 BuildHooks(encoder=enc, reuse_vectors_from=str(tmp_path / "ks1")))
    assert enc.embedded == 2
    fresh = build_knowledge_source(str(tmp_path / "ks3"), BuildSettings(passages=str(second), encoder="hashing"),
                                   BuildOptions(shard_size=64, progress=False, log=lambda m: None),
                                   BuildHooks(encoder=HashingEncoder()))
    np.testing.assert_allclose(np.asarray(ks2.vectors), np.asarray(fresh.vectors), rtol=1e-6)


def test_reuse_vectors_refuses_another_encoder(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", synthetic_passages(20))
    build_knowledge_source(str(tmp_path / "ks1"), BuildSettings(passages=str(src), encoder="hashing"),
                           BuildOptions(progress=False, log=lambda m: None), BuildHooks(encoder=HashingEncoder()))
    with pytest.raises(UserError, match="does not match the document encoder"):
        build_knowledge_source(str(tmp_path / "ks2"), BuildSettings(passages=str(src), encoder="hashing"),
                               BuildOptions(progress=False, log=lambda m: None),
                               BuildHooks(encoder=HashingEncoder(dim=32), reuse_vectors_from=str(tmp_path / "ks1")))


# ------------------------------------------------------------------ what a rerun checks
TINY = dict(dim=32, layers=1, heads=2, intermediate=64)


class _Stop(Exception):
    pass


class _StopAfter:
    """Wraps an encoder; raises _Stop (an interruption) once ``shards`` shards are embedded."""

    def __init__(self, encoder, shards):
        self.encoder, self.left = encoder, shards

    dim = property(lambda self: self.encoder.dim)

    def identity(self):
        return self.encoder.identity()

    def encode_passages(self, *args, **kw):
        if self.left == 0:
            raise _Stop()
        self.left -= 1
        return self.encoder.encode_passages(*args, **kw)


def _quiet(**kw):
    return dict(progress=False, log=lambda m: None, **kw)


def _save_dpr(directory, seed):
    from rag_plugin.retrieval.encoders import build_random_encoder, save_hf_dpr

    save_hf_dpr(build_random_encoder(**TINY, seed=seed, pooling="cls", normalize=False), directory)


def test_rerun_after_the_encoder_changed_is_refused_not_mixed(tmp_path):
    """hf-dpr:DIR whose weights change at the same path: neither a resume nor a finished build may
    keep vectors of the old weights (reference: a fresh build with the new ones)."""
    from rag_plugin.retrieval.encoders import load_encoder

    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(40))
    dpr = tmp_path / "dpr"
    _save_dpr(dpr, 0)
    s = BuildSettings(passages=str(src), encoder=f"hf-dpr:{dpr}")
    out = tmp_path / "ks"
    with pytest.raises(_Stop):
        build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()),
                               BuildHooks(encoder=_StopAfter(load_encoder(s.encoder), 1)))
    _save_dpr(dpr, 1)  # fine-tuned / replaced at the same path
    with pytest.raises(UserError, match="unfinished build begun with another document encoder") as err:
        build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()))
    assert "passage_weights_sha256" in str(err.value) and "--restart" in str(err.value)
    ks = build_knowledge_source(str(out), s, BuildOptions(shard_size=16, restart=True, **_quiet()))
    fresh = build_knowledge_source(str(tmp_path / "fresh"), s, BuildOptions(shard_size=16, **_quiet()))
    np.testing.assert_allclose(np.asarray(ks.vectors), np.asarray(fresh.vectors), rtol=1e-5, atol=1e-6)
    # unchanged encoder: up to date; changed: refused, and the source is left as it was
    logs = []
    build_knowledge_source(str(out), s, BuildOptions(shard_size=16, progress=False, log=logs.append))
    assert any("up to date" in m for m in logs)
    _save_dpr(dpr, 2)
    manifest = (out / "manifest.json").read_bytes()
    with pytest.raises(UserError, match="knowledge source embedded with another document encoder") as err:
        build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()))
    assert "passage_weights_sha256" in str(err.value)
    assert (out / "manifest.json").read_bytes() == manifest and len(KnowledgeSource(str(out))) == 40


def test_resume_refuses_other_encoder_settings_at_the_same_spec(tmp_path):
    """Another max_length through the same --encoder string (a wrapper around the encoder): refused."""
    from rag_plugin.retrieval.encoders import build_random_encoder

    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(40))
    s = BuildSettings(passages=str(src), encoder="mine")
    out = tmp_path / "ks"
    with pytest.raises(_Stop):
        build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()),
                               BuildHooks(encoder=_StopAfter(build_random_encoder(**TINY), 1)))
    with pytest.raises(UserError, match="max_length 256 then, 8 now"):
        build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()),
                               BuildHooks(encoder=build_random_encoder(**TINY, max_length=8)))
    ks = build_knowledge_source(str(out), s, BuildOptions(shard_size=16, **_quiet()),
                                BuildHooks(encoder=build_random_encoder(**TINY)))
    fresh = build_knowledge_source(str(tmp_path / "fresh"), s, BuildOptions(**_quiet()),
                                   BuildHooks(encoder=build_random_encoder(**TINY)))
    np.testing.assert_allclose(np.asarray(ks.vectors), np.asarray(fresh.vectors), rtol=1e-5, atol=1e-6)


def test_sources_and_unfinished_builds_of_older_versions(tmp_path):
    """Their settings do not hold the encoder identity or the shard size: a finished one is checked
    against its manifest's encoder; an unfinished one with finished shards cannot be checked."""
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(40))
    s = BuildSettings(passages=str(src), encoder="hashing")
    out = tmp_path / "ks"
    build_knowledge_source(str(out), s, BuildOptions(**_quiet()), BuildHooks(encoder=HashingEncoder()))
    m = json.loads((out / "manifest.json").read_text())
    del m["build_settings"]["encoder_identity"]  # as older versions wrote it
    (out / "manifest.json").write_text(json.dumps(m))
    logs = []
    build_knowledge_source(str(out), s, BuildOptions(progress=False, log=logs.append),
                           BuildHooks(encoder=HashingEncoder()))
    assert any("up to date" in line for line in logs) and len(KnowledgeSource(str(out))) == 40
    with pytest.raises(UserError, match="another document encoder"):
        build_knowledge_source(str(out), s, BuildOptions(**_quiet()), BuildHooks(encoder=HashingEncoder(dim=32)))

    old = tmp_path / "old"
    with pytest.raises(_Stop):
        build_knowledge_source(str(old), s, BuildOptions(shard_size=16, **_quiet()),
                               BuildHooks(encoder=_StopAfter(HashingEncoder(), 1)))
    state = json.loads((old / ".build" / "settings.json").read_text())
    (old / ".build" / "settings.json").write_text(json.dumps(
        {k: v for k, v in state.items() if k not in ("encoder_identity", "shard_size")}))
    with pytest.raises(UserError, match="older version") as err:
        build_knowledge_source(str(old), s, BuildOptions(shard_size=16, **_quiet()),
                               BuildHooks(encoder=HashingEncoder()))
    assert "--restart" in str(err.value)


def test_resume_with_another_shard_size_equals_a_fresh_build(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(40))
    s = BuildSettings(passages=str(src), encoder="hashing")
    out = tmp_path / "ks"
    with pytest.raises(_Stop):
        build_knowledge_source(str(out), s, BuildOptions(shard_size=10, **_quiet()),
                               BuildHooks(encoder=_StopAfter(HashingEncoder(), 2)))
    logs = []
    ks = build_knowledge_source(str(out), s, BuildOptions(shard_size=16, progress=False, log=logs.append),
                                BuildHooks(encoder=CountingEncoder()))
    assert any("shard size 10" in line for line in logs)
    fresh = build_knowledge_source(str(tmp_path / "fresh"), s, BuildOptions(**_quiet()),
                                   BuildHooks(encoder=HashingEncoder()))
    np.testing.assert_array_equal(np.asarray(ks.vectors), np.asarray(fresh.vectors))
    # an unfinished build of an older version (no recorded shard size): read off its first shard
    with pytest.raises(_Stop):
        build_knowledge_source(str(tmp_path / "old"), s, BuildOptions(shard_size=10, **_quiet()),
                               BuildHooks(encoder=_StopAfter(HashingEncoder(), 2)))
    settings_file = tmp_path / "old" / ".build" / "settings.json"
    state = json.loads(settings_file.read_text())
    del state["shard_size"]
    settings_file.write_text(json.dumps(state))
    enc = CountingEncoder()
    old = build_knowledge_source(str(tmp_path / "old"), s, BuildOptions(shard_size=16, **_quiet()),
                                 BuildHooks(encoder=enc))
    assert enc.embedded == 20
    np.testing.assert_array_equal(np.asarray(old.vectors), np.asarray(fresh.vectors))
    # a shard that fits no shard size of this build: refused, not broadcast into the vectors
    with pytest.raises(_Stop):
        build_knowledge_source(str(tmp_path / "bad"), s, BuildOptions(shard_size=10, **_quiet()),
                               BuildHooks(encoder=_StopAfter(HashingEncoder(), 2)))
    np.save(tmp_path / "bad" / ".build" / "shards" / f"{10:012d}.npy", np.zeros((7, 64), dtype=np.float32))
    with pytest.raises(UserError, match="does not fit"):
        build_knowledge_source(str(tmp_path / "bad"), s, BuildOptions(shard_size=10, **_quiet()),
                               BuildHooks(encoder=HashingEncoder()))


def test_reuse_vectors_checks_every_passage_side_setting(tmp_path):
    """Same weights with another max_length: refused, naming it. The same encoder at another path
    (another spec, same passage side): reused, and equal to a fresh build."""
    import shutil

    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(40))
    base = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0"
    build_knowledge_source(str(tmp_path / "a"), BuildSettings(passages=str(src), encoder=base),
                           BuildOptions(**_quiet()))
    with pytest.raises(UserError, match="does not match the document encoder") as err:
        build_knowledge_source(str(tmp_path / "b"), BuildSettings(passages=str(src), encoder=base + ",max_length=8"),
                               BuildOptions(**_quiet()), BuildHooks(reuse_vectors_from=str(tmp_path / "a")))
    assert "max_length 256 there, 8 here" in str(err.value) and not (tmp_path / "b").exists()

    _save_dpr(tmp_path / "dpr1", 0)
    shutil.copytree(tmp_path / "dpr1", tmp_path / "dpr2")
    build_knowledge_source(str(tmp_path / "c"), BuildSettings(passages=str(src), encoder=f"hf-dpr:{tmp_path / 'dpr1'}"),
                           BuildOptions(**_quiet()))
    logs = []
    s2 = BuildSettings(passages=str(src), encoder=f"hf-dpr:{tmp_path / 'dpr2'}")
    reused = build_knowledge_source(str(tmp_path / "d"), s2, BuildOptions(progress=False, log=logs.append),
                                    BuildHooks(reuse_vectors_from=str(tmp_path / "c")))
    assert any("reused the vectors of 40" in line for line in logs)
    fresh = build_knowledge_source(str(tmp_path / "e"), s2, BuildOptions(**_quiet()))
    np.testing.assert_allclose(np.asarray(reused.vectors), np.asarray(fresh.vectors), rtol=1e-5, atol=1e-6)
