"""rag-vocab (rag_plugin/cli/vocab.py): the dictionary is the SentencePiece model's pieces, in its order;
byte fallback spells characters the corpus never had; the same input gives the same files; bad input
is one line, exit 2."""
import json

import pytest

from tests.cli.helpers import assert_one_line_error, run_module

MODULE = "rag_plugin.cli.vocab"


@pytest.fixture(scope="module")
def vocab(island_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab")
    proc = run_module(MODULE, "--passages", island_corpus / "passages.jsonl", "--questions",
                      island_corpus / "qa" / "train.jsonl", "--out", out, "--size", 600)
    assert proc.returncode == 0, proc.stderr
    return out


def test_dict_txt_is_the_models_pieces_in_order(vocab):
    from rag_plugin.datasets.vocab import load_spm

    sp = load_spm(vocab / "spm.model")
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not (sp.IsControl(i) or sp.IsUnknown(i))]
    lines = (vocab / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert [line.split(" ") for line in lines] == [[p, "1"] for p in pieces]
    assert sp.GetPieceSize() == 600 and len(lines) == 600 - 3  # <unk>, <s>, </s> are fairseq's own
    assert {f"<0x{b:02X}>" for b in range(256)} <= set(pieces)  # byte fallback
    ids = sp.encode("São Tomé")  # "ã" and "é" are not in the (ASCII) corpus: spelled in bytes, not <unk>
    assert sp.unk_id() not in ids and sp.decode(ids) == "São Tomé"
    info = json.loads((vocab / "vocab.json").read_text())
    assert info["size"] == 600 and info["dict_symbols"] == 597 and info["byte_fallback"] is True


def test_the_same_input_gives_the_same_files(vocab, island_corpus, tmp_path):
    proc = run_module(MODULE, "--passages", island_corpus / "passages.jsonl", "--questions",
                      island_corpus / "qa" / "train.jsonl", "--out", tmp_path, "--size", 600)
    assert proc.returncode == 0, proc.stderr
    for name in ("spm.model", "spm.vocab", "dict.txt"):
        assert (tmp_path / name).read_bytes() == (vocab / name).read_bytes(), name


def test_help_shows_the_defaults():
    proc = run_module(MODULE, "--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "(default: 8000)" in text and "(default: unigram)" in text


def test_bad_inputs_are_one_line(island_corpus, tmp_path):
    passages = island_corpus / "passages.jsonl"
    assert_one_line_error(run_module(MODULE, "--passages", tmp_path / "none.jsonl", "--out", tmp_path / "v"),
                          "none.jsonl")
    proc = run_module(MODULE, "--passages", passages, "--out", tmp_path / "v", "--size", 100000)
    assert_one_line_error(proc, "--size 100000", "at most")
    most = int(proc.stderr.split("at most ")[1].split(")")[0])
    assert 300 < most < 100000 and f"use --size {most}" in proc.stderr
    assert_one_line_error(run_module(MODULE, "--passages", passages, "--out", tmp_path / "v", "--size", 0), "--size")
    assert_one_line_error(run_module(MODULE, "--passages", passages, "--out", tmp_path / "v", "--size", 50),
                          "at least")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b"\n')
    assert_one_line_error(run_module(MODULE, "--passages", bad, "--out", tmp_path / "v"), "bad.jsonl:2")
    assert_one_line_error(run_module(MODULE, "--passages", passages, "--questions", tmp_path / "q.jsonl",
                                     "--out", tmp_path / "v"), "q.jsonl")
    (tmp_path / "file").write_text("x")
    assert_one_line_error(run_module(MODULE, "--passages", passages, "--out", tmp_path / "file"), "not a directory")
    assert_one_line_error(run_module(MODULE, "--passages", passages), "--out")
