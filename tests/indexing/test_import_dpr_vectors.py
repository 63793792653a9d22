"""DPR's psgs_w100.tsv (also .tsv.gz) with DPR's precomputed passage vectors (.npy + ids, or pickles
behind --trust-pickles) imported by rag_plugin.indexing.import_knowledge / rag-import-knowledge: every
vector lands on the row of its passage id, and the manifest records what is known about the encoders.
(Moved here with the code from tests/data/test_prepare.py.)"""
from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.indexing import BuildOptions
from rag_plugin.indexing.import_knowledge import IMPORT_SHARD_SIZE, ImportRequest, import_knowledge
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]


def write_lines(path, lines):
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def psgs_tsv(path, n):
    lines = ["id\ttext\ttitle"]
    for i in range(1, n + 1):
        text = f"passage number {i} about topic {i % 7}"
        if i == 1:
            text = '"Aaron Aaron ( or ; ""Ahärôn"") is a prophet, high priest, and the brother of Moses."'
        lines.append(f"{i}\t{text}\tTitle {i}")
    return write_lines(path, lines)


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.import_knowledge", *map(str, args), "--quiet"],
                          capture_output=True, text=True, cwd=str(REPO), timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})




#: the keywords of import_with that go to BuildOptions; the others make the ImportRequest
OPTIONS = ("shard_size", "restart", "progress", "log")


def import_with(out, **kw):
    """import_knowledge with ``kw`` split between the ImportRequest and BuildOptions (quiet, unless given)."""
    options = {"shard_size": IMPORT_SHARD_SIZE, "progress": False, "log": lambda m: None,
               **{k: v for k, v in kw.items() if k in OPTIONS}}
    request = ImportRequest(**{k: v for k, v in kw.items() if k not in OPTIONS})
    return import_knowledge(str(out), request, BuildOptions(**options))


def _import(out, tsv, vectors, ids=(), **kw):
    return import_with(out, passages=str(tsv), vectors=[str(v) for v in vectors], ids=[str(i) for i in ids], **kw)


IDENTITY = {"kind": "hf-dpr", "name": "dpr-ctx_encoder-single-nq-base", "spec": "hf-dpr:/models/dpr", "dim": 16,
            "pooling": "cls", "normalize": False, "passage_weights_sha256": "abc", "query_weights_sha256": "def"}


def test_import_precomputed_npy_vectors_aligned_by_id(tmp_path):
    from rag_plugin.retrieval.index import search

    n, dim = 40, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(0)
    truth = {str(i): rng.standard_normal(dim).astype(np.float32) for i in range(1, n + 1)}
    truth["999"] = rng.standard_normal(dim).astype(np.float32)  # an id not in the TSV: ignored
    ids = list(truth)
    rng.shuffle(ids)
    half = len(ids) // 2
    files = []
    for k, chunk in enumerate((ids[:half], ids[half:])):
        np.save(tmp_path / f"emb_{k}.npy", np.stack([truth[i] for i in chunk]).astype(np.float64))
        write_lines(tmp_path / f"emb_{k}.ids", chunk)
        files.append((tmp_path / f"emb_{k}.npy", tmp_path / f"emb_{k}.ids"))
    out = tmp_path / "ks"
    logs = []
    _import(out, tsv, [f for f, _ in files], [i for _, i in files], encoder_identity=json.dumps(IDENTITY),
            shard_size=16, log=logs.append)
    assert sorted(os.listdir(out)) == ["index.faiss", "manifest.json", "passages", "vectors.npy"]
    ks = KnowledgeSource(str(out))
    assert len(ks) == n and ks.dim == dim and ks.vectors.dtype == np.float32
    for row in range(n):
        np.testing.assert_array_equal(ks.vectors[row], truth[ks.passages.id(row)])
    assert ks.passages.id(0) == "1" and ks.passages.text(0).startswith('Aaron Aaron ( or ; "Ahärôn")')
    assert ks.encoder_identity == IDENTITY and ks.encoder_spec == "hf-dpr:/models/dpr"
    # where the vectors came from (no query encoder apart: the identity given is the document encoder's)
    imported = ks.manifest["imported_vectors"]
    assert imported["from"] == "dpr-vectors" and imported["passages"] == str(tsv.resolve())
    assert [f["file"] for f in imported["files"]] == [str(p.resolve()) for pair in files for p in pair]
    assert "query_encoder" not in ks.manifest and not ks.imported
    _, rows = search(ks.index, np.stack([truth["17"], truth["3"]]) * 10, k=1)
    assert [ks.passages.id(int(r)) for r in rows[:, 0]] == ["17", "3"]
    assert any("ignored 1 vectors" in m and "999" in m for m in logs)
    # rerun with the same inputs: up to date
    _import(out, tsv, [f for f, _ in files], [i for _, i in files], encoder_identity=IDENTITY, shard_size=16,
            log=logs.append)
    assert logs[-1].endswith("knowledge source is up to date")


def test_gzipped_psgs_w100_and_ids(tmp_path):
    """psgs_w100.tsv.gz (as DPR's download script fetches it) and a gzipped ids file: the same source
    as the uncompressed files."""
    n, dim = 12, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    gz = tmp_path / "psgs_w100.tsv.gz"
    gz.write_bytes(gzip.compress(tsv.read_bytes()))
    vecs = np.random.default_rng(3).standard_normal((n, dim)).astype(np.float32)
    np.save(tmp_path / "e.npy", vecs)
    ids = write_lines(tmp_path / "e.ids", [str(i) for i in range(1, n + 1)])
    ids_gz = tmp_path / "e.ids.gz"
    ids_gz.write_bytes(gzip.compress(ids.read_bytes()))
    plain = _import(tmp_path / "plain", tsv, [tmp_path / "e.npy"], [ids], encoder_identity=IDENTITY)
    packed = _import(tmp_path / "packed", gz, [tmp_path / "e.npy"], [ids_gz], encoder_identity=IDENTITY)
    assert [packed.passages.passage(r) for r in range(n)] == [plain.passages.passage(r) for r in range(n)]
    np.testing.assert_array_equal(np.asarray(packed.vectors), vecs)
    assert packed.passages.sha256 == plain.passages.sha256


def test_import_missing_ids_and_bad_dims_are_errors(tmp_path):
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", 10)
    np.save(tmp_path / "e.npy", np.ones((8, 16), np.float32))
    write_lines(tmp_path / "e.ids", [str(i) for i in range(1, 9)])
    with pytest.raises(UserError, match=r"2 of 10 passages have no vector, e.g. ids '9', '10'"):
        _import(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], encoder_identity=IDENTITY)
    with pytest.raises(UserError, match="dimension 16, the encoder identity says 768"):
        _import(tmp_path / "ks2", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"],
                encoder_identity=dict(IDENTITY, dim=768))
    write_lines(tmp_path / "short.ids", ["1", "2"])
    with pytest.raises(UserError, match="2 ids for 8 vector rows"):
        _import(tmp_path / "ks3", tsv, [tmp_path / "e.npy"], [tmp_path / "short.ids"], encoder_identity=IDENTITY)
    with pytest.raises(UserError, match="1 .npy vectors file"):
        _import(tmp_path / "ks4", tsv, [tmp_path / "e.npy"], [], encoder_identity=IDENTITY)


def _dpr_pickle(path, pairs):
    """DPR's wikipedia_passages_*.pkl: a pickled list of (id, numpy vector)."""
    with open(path, "wb") as fh:
        pickle.dump(pairs, fh)
    return path


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickles_need_trust_pickles(tmp_path):
    n, dim = 12, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(1)
    vecs = {str(i): rng.standard_normal(dim).astype(np.float32) for i in range(1, n + 1)}
    items = list(vecs.items())
    p0 = _dpr_pickle(tmp_path / "wikipedia_passages_0.pkl", [(f"wiki:{i}", v) for i, v in items[:5]])
    p1 = _dpr_pickle(tmp_path / "wikipedia_passages_1.pkl", [(i, v) for i, v in items[5:]])
    ident = tmp_path / "identity.json"
    ident.write_text(json.dumps(IDENTITY), encoding="utf-8")
    out = tmp_path / "ks"
    proc = run_cli("--passages", tsv, "--vectors", p0, p1, "--out", out, "--encoder-identity", ident)
    assert_one_line_error(proc, "refusing to unpickle 2 file(s)", "--trust-pickles", str(p0))
    assert not out.exists()
    proc = run_cli("--passages", tsv, "--vectors", p0, p1, "--out", out, "--encoder-identity", ident,
                   "--trust-pickles")
    assert proc.returncode == 0, proc.stderr
    assert "warning: unpickling" in proc.stderr and f"wrote {out}: {n} passages, dim {dim}" in proc.stderr
    ks = KnowledgeSource(str(out))
    for row in range(n):
        np.testing.assert_array_equal(ks.vectors[row], vecs[ks.passages.id(row)])
    # even trusted, a pickle is only allowed to build numpy arrays
    evil = _dpr_pickle(tmp_path / "evil.pkl", [("1", _Evil())])
    with pytest.raises(UserError, match=r"cannot read the pickle \(global posix.system is not allowed"):
        _import(tmp_path / "ks_evil", tsv, [evil], trust_pickles=True, encoder_identity=IDENTITY)


def test_encoder_spec_or_identity_is_required(tmp_path):
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", 3)
    np.save(tmp_path / "e.npy", np.ones((3, 16), np.float32))
    write_lines(tmp_path / "e.ids", ["1", "2", "3"])
    ident = {k: v for k, v in IDENTITY.items() if k != "spec"}
    with pytest.raises(UserError, match="no encoder spec"):
        _import(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], encoder_identity=ident)
    ks = _import(tmp_path / "ks", tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], encoder_identity=ident,
                 encoder_spec="hf-dpr:/elsewhere")
    assert ks.encoder_spec == "hf-dpr:/elsewhere" and ks.encoder_identity["dim"] == 16


def test_import_resumes_after_an_interruption_and_restarts_on_request(tmp_path, monkeypatch):
    from rag_plugin.retrieval import index as faiss_index

    n, dim = 20, 16
    tsv = psgs_tsv(tmp_path / "psgs_w100.tsv", n)
    rng = np.random.default_rng(2)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    np.save(tmp_path / "e.npy", vecs[:15])
    write_lines(tmp_path / "e.ids", [str(i) for i in range(1, 16)])
    np.save(tmp_path / "all.npy", vecs)
    write_lines(tmp_path / "all.ids", [str(i) for i in range(1, n + 1)])
    out = tmp_path / "ks"
    kw = dict(encoder_identity=IDENTITY, shard_size=8)
    # incomplete vectors: an error before any vector was placed, and nothing is left behind
    with pytest.raises(UserError, match="5 of 20 passages have no vector"):
        _import(out, tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], **kw)
    assert not out.exists()
    # interrupted after the shards (while building the index): the unfinished build cannot be
    # loaded, other vectors are refused unless --restart, and the rerun resumes (the passage
    # store is not rewritten)
    real = faiss_index.build_index

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(faiss_index, "build_index", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _import(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"], **kw)
    assert sorted(os.listdir(out / ".build" / "shards")) == [f"{s:012d}.npy" for s in (0, 8, 16)]
    with pytest.raises(UserError, match="build did not finish"):
        KnowledgeSource(str(out))
    with pytest.raises(UserError, match="unfinished build with other settings"):
        _import(out, tsv, [tmp_path / "e.npy"], [tmp_path / "e.ids"], **kw)
    with pytest.raises(KeyboardInterrupt):  # --restart discards it (and is interrupted again)
        _import(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"], restart=True, **kw)
    monkeypatch.setattr(faiss_index, "build_index", real)
    logs = []
    ks = _import(out, tsv, [tmp_path / "all.npy"], [tmp_path / "all.ids"], log=logs.append, **kw)
    assert "passage store: 20 passages (already built)" in logs
    np.testing.assert_array_equal(np.asarray(ks.vectors), vecs)
    assert not (out / ".build").exists()
