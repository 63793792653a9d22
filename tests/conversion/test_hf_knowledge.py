"""Knowledge sources imported from a Hugging Face knowledge dataset (save_to_disk folder,
parquet) or DPR's TSV + vectors: the passages, ids and vectors arrive unchanged, in order, and
the dataset's own FAISS index is reused only when it matches. No transformers needed (the
`datasets` forms need pyarrow, and skip without it)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.build.hf_knowledge import import_hf_knowledge
from rag_plugin.util.errors import UserError
from rag_plugin.retrieval.encoders import build_random_encoder, save_hf_dpr
from rag_plugin.retrieval.index import search
from tests.conversion import hf_world

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
                  dict_file=str(tiny_world["root"] / "dict.txt"), bpe_model=str(tiny_world["root"] / "spm.model"),
                  progress=False, log=lambda m: None)
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
    ks = import_hf_knowledge(str(tmp_path / "ks"), dataset=str(folder), faiss_index=str(kd["forms"]["faiss_index"]),
                             **common)
    _check_source(ks, kd["vectors"])
    assert ks.manifest["index_factory"] == "imported IndexFlatIP" and ks.input_format.name == "plugin"
    assert ks.encoder_spec == common["encoder_spec"]
    import_hf_knowledge(str(tmp_path / "ks"), dataset=str(folder), faiss_index=str(kd["forms"]["faiss_index"]),
                        **common)
    assert logs[-1].endswith("knowledge source is up to date")


def test_parquet_files_with_ids_and_a_built_index(kd, tmp_path):
    folder = _need(kd, "parquet")
    ks = import_hf_knowledge(str(tmp_path / "ks"), dataset=str(folder), index_factory="HNSW8", **kd["common"])
    _check_source(ks, kd["vectors"])
    assert ks.manifest["index_factory"] == "HNSW8"


def test_tsv_with_npy_vectors_and_hf_input_format(kd, tmp_path):
    tsv, npy, ids = kd["forms"]["tsv"]
    ks = import_hf_knowledge(str(tmp_path / "ks"), passages=str(tsv), vectors=[str(npy)], ids=[str(ids)],
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
            import_hf_knowledge(str(out), **{**common, **kwargs})
        assert fragment in str(err.value) and "\n" not in str(err.value), (fragment, str(err.value))
        assert not (out / "manifest.json").exists()
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "import_hf_knowledge.py"), "--passages", str(tsv),
                           "--vectors", str(npy), "--ids", str(ids), "--out", str(tmp_path / "cli"),
                           "--encoder-identity", json.dumps({"dim": 768, "spec": "x"}), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "768" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1] == errors[0]
