"""Knowledge sources imported from a Hugging Face knowledge dataset (save_to_disk folder,
parquet) or DPR's TSV + vectors (rag_plugin.indexing.import_knowledge): the passages, ids and vectors
arrive unchanged, in order, and the dataset's own FAISS index is reused only when it matches. The
manifest records what is known of the encoders (imported vectors, their fingerprint, the query
encoder), and loading the source and checking an encoder against it keep working. No transformers
needed (the `datasets` forms need pyarrow, and skip without it). (Moved from
tests/conversion/test_hf_knowledge.py.)"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.retrieval.encoders import build_random_encoder, save_hf_dpr
from rag_plugin.retrieval.index import search
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError
from tests.conversion import hf_world
from tests.indexing.test_import_dpr_vectors import import_with

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kd(tmp_path_factory, tiny_world):
    root = tmp_path_factory.mktemp("knowledge")
    vectors = hf_world.embeddings(len(hf_world.TITLES))
    forms = hf_world.write_knowledge_dataset(root / "data", vectors)
    encoder = build_random_encoder(dim=hf_world.DIM, layers=1, heads=4, vocab=hf_world.write_wordpiece_vocab(
        root / "vocab.txt"), pooling="cls", normalize=False, passage_format="pair", max_position=128, max_length=64)
    save_hf_dpr(encoder, root / "dpr")
    common = dict(encoder_spec=f"hf-dpr:{root / 'dpr' / 'question_encoder'},max_length=64",
                  tokenizer=GeneratorTokenizerFiles(dict=str(tiny_world["root"] / "dict.txt"),
                                                    bpe_model=str(tiny_world["root"] / "spm.model")))
    return {"root": root, "vectors": vectors, "forms": forms, "common": common}


def _check_source(ks, vectors, ids=None):
    n = len(hf_world.TITLES)
    assert len(ks) == n and ks.dim == hf_world.DIM
    ids = ids or [str(i) for i in range(n)]
    assert [ks.passages.id(r) for r in range(n)] == ids
    assert [ks.passages.title(r) for r in range(n)] == hf_world.TITLES
    assert [ks.passages.text(r) for r in range(n)] == hf_world.TEXTS
    np.testing.assert_array_equal(np.asarray(ks.vectors), vectors)
    assert all(len(ks.passages.text_tokens(r)) for r in range(n))  # pre-tokenized for the generator
    _, rows = search(ks.index, vectors[[5, 2]] * 10, k=1)
    assert rows[:, 0].tolist() == [5, 2]


def _need(kd, form):
    if form not in kd["forms"]:
        pytest.skip(f"the {form} form needs pyarrow")
    return kd["forms"][form]


def test_save_to_disk_folder_with_its_faiss_index(kd, tmp_path):
    folder = _need(kd, "save_to_disk")
    logs = []
    common = dict(kd["common"], log=logs.append)
    ks = import_with(str(tmp_path / "ks"), dataset=str(folder), faiss_index=str(kd["forms"]["faiss_index"]),
                             **common)
    _check_source(ks, kd["vectors"])
    assert ks.manifest["index_factory"] == "imported IndexFlatIP" and ks.input_format.name == "plugin"
    assert ks.encoder_spec == common["encoder_spec"]
    # what the vectors came from: the data files state.json lists, and datasets' own fingerprint
    state = json.loads((folder / "state.json").read_text())
    imported = ks.manifest["imported_vectors"]
    assert [Path(f["file"]).name for f in imported["files"]] == [f["filename"] for f in state["_data_files"]]
    assert imported["datasets_fingerprint"] == state.get("_fingerprint") and imported["format"] == "arrow"
    import_with(str(tmp_path / "ks"), dataset=str(folder), faiss_index=str(kd["forms"]["faiss_index"]),
                        **common)
    assert logs[-1].endswith("knowledge source is up to date")


def test_parquet_files_with_ids_and_a_built_index(kd, tmp_path):
    folder = _need(kd, "parquet")
    ks = import_with(str(tmp_path / "ks"), dataset=str(folder), index_factory="HNSW8", **kd["common"])
    _check_source(ks, kd["vectors"])
    assert ks.manifest["index_factory"] == "HNSW8"


def test_tsv_with_npy_vectors_and_hf_input_format(kd, tmp_path):
    tsv, npy, ids = kd["forms"]["tsv"]
    ks = import_with(str(tmp_path / "ks"), passages=str(tsv), vectors=[str(npy)], ids=[str(ids)],
                             faiss_index=str(kd["forms"]["faiss_index"]), input_format="hf", **kd["common"])
    _check_source(ks, kd["vectors"])
    assert ks.input_format.name == "hf" and ks.manifest["index_factory"] == "imported IndexFlatIP"


def test_bad_inputs_are_one_line_errors(kd, tmp_path):
    import faiss

    common = kd["common"]
    tsv, npy, ids = kd["forms"]["tsv"]
    vectors = kd["vectors"]

    def index_file(name, vecs, metric=faiss.METRIC_INNER_PRODUCT):
        index = faiss.IndexFlat(vecs.shape[1], metric)
        index.add(vecs)
        faiss.write_index(index, str(tmp_path / name))
        return str(tmp_path / name)

    tsv_kw = dict(passages=str(tsv), vectors=[str(npy)], ids=[str(ids)])
    cases = [
        (dict(tsv_kw, faiss_index=index_file("short.faiss", vectors[:-1])), "index holds 15 vectors"),
        (dict(tsv_kw, faiss_index=index_file("l2.faiss", vectors, faiss.METRIC_L2)), "not an inner-product"),
        (dict(tsv_kw, faiss_index=index_file("shuffled.faiss", vectors[::-1].copy())), "not in the order"),
        (dict(tsv_kw, faiss_index=str(tmp_path / "missing.faiss")), "FAISS index file not found"),
        (dict(tsv_kw, encoder_identity={"dim": 768, "spec": "x"}), "dimension 32, the encoder identity says 768"),
        (dict(dataset=str(tmp_path / "nowhere")), "dataset not found"),
        (dict(tsv_kw, dataset=str(tsv)), "either --dataset"),
        (dict(tsv_kw, input_format="json"), "unknown input format"),
    ]
    if "parquet" in kd["forms"]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        (tmp_path / "noemb").mkdir()
        pq.write_table(pa.table({"title": ["a"], "text": ["b"]}), str(tmp_path / "noemb" / "x.parquet"))
        cases.append((dict(dataset=str(tmp_path / "noemb")), "no column(s) embeddings"))
        cases.append((dict(dataset=str(kd["forms"]["parquet"]), encoder_spec=None), "no encoder spec"))
    for i, (kwargs, fragment) in enumerate(cases):
        out = tmp_path / f"ks{i}"
        with pytest.raises(UserError) as err:
            import_with(str(out), **{**common, **kwargs})
        assert fragment in str(err.value) and "\n" not in str(err.value), (fragment, str(err.value))
        assert not (out / "manifest.json").exists()
    proc = subprocess.run([str(Path(sys.executable).parent / "rag-import-knowledge"), "--passages", str(tsv),
                           "--vectors", str(npy), "--ids", str(ids), "--out", str(tmp_path / "cli"),
                           "--encoder-identity", json.dumps({"dim": 768, "spec": "x"}), "--quiet"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "768" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1] == errors[0]


# ------------------------------------------------------------------ what the manifest records about the encoders
def _names_and_sizes_sha256(files):
    """By hand: sha256 over "name<TAB>size" lines of the files, in order."""
    text = "".join(f"{Path(f).name}\t{Path(f).stat().st_size}\n" for f in files)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _question_encoder(directory, seed):
    encoder = build_random_encoder(dim=hf_world.DIM, layers=1, heads=4, vocab=hf_world.write_wordpiece_vocab(
        Path(directory).parent / "vocab.txt"), pooling="cls", normalize=False, passage_format="pair",
        max_position=128, max_length=64, seed=seed)
    save_hf_dpr(encoder, directory)
    return f"hf-dpr:{Path(directory) / 'question_encoder'},max_length=64"


def test_dataset_vectors_are_recorded_as_imported_not_as_the_question_encoder(kd, tmp_path):
    """A question encoder alone (shared towers) did not make the dataset's vectors: the manifest says the
    document encoder is unknown (kind imported, the vectors' dimension and fingerprint), where they came
    from, and the query encoder's identity apart. The source loads, its query encoder loads and is
    checked, and retrieval equals brute force over the stored vectors with that encoder."""
    from rag_plugin.retrieval.encoders import load_encoder
    from rag_plugin.retrieval.knowledge import KnowledgeSource
    from rag_plugin.retrieval.retriever import DenseRetriever

    folder = _need(kd, "parquet")
    files = sorted(Path(folder).glob("*.parquet"))
    import_with(str(tmp_path / "ks"), dataset=str(folder), **kd["common"])
    ks = KnowledgeSource(str(tmp_path / "ks"))
    spec = kd["common"]["encoder_spec"]
    query = load_encoder(spec).identity()
    assert query["shared_towers"] is True  # the case of the bug: a question encoder alone
    fingerprint = _names_and_sizes_sha256(files)
    assert ks.encoder_identity == {"kind": "imported", "name": f"vectors imported from {Path(folder).name}",
                                   "spec": spec, "dim": hf_world.DIM, "vectors_fingerprint": fingerprint}
    assert ks.imported and ks.manifest["pooling"] is None and ks.encoder_spec == spec
    assert ks.manifest["query_encoder"] == {**query, "spec": query["spec"] or spec}
    assert ks.query_encoder_identity["query_weights_sha256"] == query["query_weights_sha256"]
    assert ks.manifest["imported_vectors"] == {
        "from": "huggingface-dataset", "dataset": str(Path(folder).resolve()), "format": "parquet",
        "files": [{"file": str(f.resolve()), "bytes": f.stat().st_size} for f in files],
        "fingerprint": fingerprint, "datasets_fingerprint": None}
    # loading: the query encoder is the one recorded; retrieval is exact MIPS with it
    retriever = DenseRetriever(ks)
    questions = ["Kalomi river", "a quoted title", "Sune"]
    res = retriever.search(questions, k=4)
    q = retriever.encoder.encode_queries(questions)
    brute = q @ np.asarray(ks.vectors).T
    np.testing.assert_allclose(res.scores, -np.sort(-brute, axis=1)[:, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.take_along_axis(brute, res.rows, 1), res.scores, rtol=1e-5, atol=1e-6)


def test_checks_against_an_imported_source(kd, tmp_path, caplog):
    """What the model checks when a checkpoint loads (its training source's encoder identity, saved as
    JSON) and what loading the query encoder checks, for a source with imported vectors."""
    import logging

    from rag_plugin.retrieval.encoders import load_encoder
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    spec = _question_encoder(tmp_path / "dpr", seed=0)
    tsv, npy, ids = kd["forms"]["tsv"]
    common = dict(kd["common"], encoder_spec=spec)
    ks = import_with(str(tmp_path / "ks"), passages=str(tsv), vectors=[str(npy)], ids=[str(ids)], **common)
    assert ks.imported and ks.manifest["imported_vectors"]["from"] == "dpr-vectors"
    trained = json.loads(json.dumps({"encoder": ks.encoder_identity}, sort_keys=True))  # as a checkpoint keeps it
    caplog.set_level(logging.WARNING)
    ks.check_encoder(trained["encoder"], what="the checkpoint's document encoder")  # the same source: fine
    assert not caplog.records
    with pytest.raises(UserError, match="the checkpoint's document encoder does not match the document encoder"):
        ks.check_encoder(dict(trained["encoder"], dim=768), what="the checkpoint's document encoder")
    # a checkpoint trained on a source of a known encoder with the same dimension: only the dimension can be
    # compared, and a warning says so
    known = load_encoder(spec).identity()
    ks.check_encoder(known, what="the checkpoint's document encoder")
    assert any("only the dimension" in r.getMessage() for r in caplog.records)
    with pytest.raises(UserError, match="does not match"):
        ks.check_encoder(dict(known, dim=16))
    # another source with the same vectors (another index over them) checks as the same one
    again = import_with(str(tmp_path / "ks2"), passages=str(tsv), vectors=[str(npy)], ids=[str(ids)],
                             index_factory="HNSW8", **common)
    assert again.encoder_identity == ks.encoder_identity
    again.check_encoder(trained["encoder"])
    # the query encoder at the spec replaced by other weights: loading it is refused, not silently used
    assert KnowledgeSource(str(tmp_path / "ks")).load_encoder().identity()["dim"] == hf_world.DIM
    shutil.rmtree(tmp_path / "dpr")
    _question_encoder(tmp_path / "dpr", seed=1)
    with pytest.raises(UserError, match="does not match the query encoder this knowledge source was imported for"):
        KnowledgeSource(str(tmp_path / "ks")).load_encoder()


def test_a_spec_with_its_own_passage_tower_is_recorded_as_the_document_encoder(kd, tmp_path):
    """hf-dpr:DIR with ctx_encoder/ (DPR's bi-encoder) names the encoder that made the vectors: recorded
    as the document encoder, as a build with it would; no query encoder apart."""
    from rag_plugin.retrieval.encoders import load_encoder

    tsv, npy, ids = kd["forms"]["tsv"]
    spec = f"hf-dpr:{kd['root'] / 'dpr'},max_length=64"
    ks = import_with(str(tmp_path / "ks"), passages=str(tsv), vectors=[str(npy)], ids=[str(ids)],
                          **dict(kd["common"], encoder_spec=spec))
    identity = load_encoder(spec).identity()
    assert identity["shared_towers"] is False
    assert ks.encoder_identity == identity and not ks.imported and "query_encoder" not in ks.manifest
    ks.check_encoder(identity)
    assert ks.load_encoder().identity() == identity
