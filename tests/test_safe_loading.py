"""Files from an untrusted source cannot run code when loaded, and checkpoint copies land whole.

A crafted pickle whose ``__reduce__`` would create a marker file is handed to every loader of
the plugin: fairseq's own checkpoint loader (as the command-line hooks guard it), ``RAG.from_pretrained``,
the generator initialisation (``--generator-checkpoint``), the DPR encoder loader (what a
knowledge source's manifest may name), and knowledge sources holding a ``.pkl`` file or an
object array as ``vectors.npy``. Each refuses with a one-line :class:`UserError`, and the
marker never appears. (The command-line side of the same refusals is in tests/test_bad_inputs.py.)
"""
import os
import pickle
import shutil

import numpy as np
import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()


class Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def evil_checkpoint(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "checkpoint_best.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "cfg": None, "extra_state": {"x": Evil(marker)}}, path)
    assert not marker.exists()
    return path, marker


def test_fairseq_checkpoint_loader_refuses(evil_checkpoint, command_line_hooks):
    from fairseq import checkpoint_utils

    path, marker = evil_checkpoint
    with pytest.raises(UserError, match=r"checkpoint_best.pt: checkpoint refers to code .* posix.system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    with pytest.raises(UserError, match="safe loading refuses"):
        checkpoint_utils.load_model_ensemble([str(path)])
    assert not marker.exists()


def test_hub_refuses(evil_checkpoint):
    from rag_plugin.hub import RAG

    path, marker = evil_checkpoint
    with pytest.raises(UserError, match="safe loading refuses"):
        RAG.from_pretrained(str(path))
    assert not marker.exists()


def test_generator_initialisation_refuses(evil_checkpoint, tiny_world):
    from fairseq.data import Dictionary

    from rag_plugin.models.generator import build_bart, load_generator_weights
    from rag_plugin.util.safe_load import safe_torch_load

    path, marker = evil_checkpoint
    with pytest.raises(UserError, match="safe loading refuses"):
        safe_torch_load(path)
    dictionary = Dictionary.load(str(tiny_world["root"] / "dict.txt"))
    generator = build_bart("tiny", dictionary, 64, 64, 0.0, 0.0, 0.0, embed_dim=16, layers=1, heads=2, ffn_dim=32)
    with pytest.raises(UserError, match="safe loading refuses"):
        load_generator_weights(generator, str(path), dictionary)
    assert not marker.exists()


def test_encoder_named_by_a_manifest_refuses(tmp_path):
    from rag_plugin.retrieval.encoders import load_encoder

    marker = tmp_path / "PWNED"
    torch.save({"model_dict": {"question_model.x": Evil(marker)}}, tmp_path / "dpr.pt")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nword\n")
    with pytest.raises(UserError, match="refused to load"):
        load_encoder(f"dpr:{tmp_path / 'dpr.pt'}")
    assert not marker.exists()


def test_knowledge_source_holds_no_pickles(tiny_world, tmp_path):
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    marker = tmp_path / "PWNED"
    ks = tmp_path / "ks"
    shutil.copytree(tiny_world["ks"], ks)
    KnowledgeSource(str(ks))  # as built: loads
    kinds = {p.suffix for p in ks.rglob("*") if p.is_file()}
    assert kinds <= {".json", ".npy", ".faiss", ".bin", ".idx", ".txt", ".model"}, kinds  # arrays, FAISS, JSON
    assert not np.load(ks / "vectors.npy", mmap_mode="r").dtype.hasobject

    (ks / "passages" / "cache.pickle").write_bytes(pickle.dumps(Evil(marker)))
    with pytest.raises(UserError, match="cache.pickle: knowledge source holds a pickle file"):
        KnowledgeSource(str(ks))
    (ks / "passages" / "cache.pickle").unlink()

    good = np.load(ks / "vectors.npy")
    np.save(ks / "vectors.npy", np.array([Evil(marker)] * len(good), dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="vectors.npy: document vectors hold Python objects"):
        KnowledgeSource(str(ks))
    assert not marker.exists()


def test_checkpoint_copies_are_atomic(tmp_path, monkeypatch, command_line_hooks):
    """fairseq copies a just-saved checkpoint to checkpoint_last.pt / checkpoint_best.pt with
    PathManager.copy; guarded, a copy that fails half-way leaves the old file whole and no
    temporary file behind."""
    from fairseq.file_io import PathManager

    src, dst = tmp_path / "checkpoint_3_600.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"new" * 1000)
    dst.write_bytes(b"old checkpoint")

    def copy_half_then_fail(a, b, *args, **kwargs):
        with open(b, "wb") as fh:
            fh.write(open(a, "rb").read()[:100])
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copyfile", copy_half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_3_600.pt", "checkpoint_last.pt"]
    monkeypatch.undo()
    assert PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()
