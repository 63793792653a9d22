"""rag_plugin.util.safe_load: the one allow-list and loader; what it accepts, what it refuses (without
running anything), the one-line messages, and torch's process-wide allow-list left alone.

Then every loader of the plugin, handed a crafted pickle whose ``__reduce__`` would create a marker file:
fairseq's own checkpoint loader (as the command-line hooks guard it), ``RAG.from_pretrained``, the generator
initialisation (``--generator-checkpoint``), the DPR encoder loader (what a knowledge source's manifest may
name), and knowledge sources holding a ``.pkl`` file or an object array as ``vectors.npy``. Each refuses with
a one-line :class:`UserError`, and the marker never appears. (The command-line side of the same refusals is in
tests/test_bad_inputs.py; fairseq-train resuming from such a checkpoint in tests/tasks/test_training.py.)
"""
from __future__ import annotations

import argparse
import fractions
import os
import pickle
import shutil

import numpy as np
import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import checkpoint_types_allowed, safe_torch_load

rag_plugin.register()


class Evil:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_loads_tensors_and_the_allowed_settings_types(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    state = {"w": torch.arange(6.0).view(2, 3), "args": argparse.Namespace(lr=0.5, arch="bart"),
             "cfg": omegaconf.OmegaConf.create({"model": {"layers": 2}}), "n": [1, 2]}
    torch.save(state, tmp_path / "ok.pt")
    loaded = safe_torch_load(tmp_path / "ok.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["args"] == state["args"]
    assert loaded["cfg"].model.layers == 2 and loaded["n"] == [1, 2]
    assert argparse.Namespace not in torch.serialization.get_safe_globals()  # scoped, not process-wide
    with pytest.raises(pickle.UnpicklingError):  # outside the loader, torch itself still refuses those types
        torch.load(tmp_path / "ok.pt", weights_only=True)
    with checkpoint_types_allowed():
        assert torch.load(tmp_path / "ok.pt", weights_only=True)["args"] == state["args"]


@pytest.mark.parametrize("legacy", [False, True])
def test_code_is_refused_not_run(tmp_path, legacy):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pt"
    torch.save({"x": Evil(marker)}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(UserError) as err:
        safe_torch_load(path, what="DPR checkpoint")
    assert str(err.value).startswith(f"{path}: DPR checkpoint refers to code that safe loading refuses "
                                      "(it refers to posix.system); refused to load, nothing in it was run")
    assert "\n" not in str(err.value)
    assert not marker.exists()


def test_a_type_outside_the_allow_list_is_refused(tmp_path):
    torch.save({"x": fractions.Fraction(1, 3)}, tmp_path / "f.pt")
    with pytest.raises(UserError, match=r"checkpoint refers to code .*\(it refers to fractions.Fraction\)"):
        safe_torch_load(tmp_path / "f.pt")


def test_unreadable_files_are_not_called_unsafe(tmp_path):
    good = tmp_path / "good.pt"
    torch.save({"w": torch.zeros(1000)}, good)
    cases = {"garbage.pt": (b"not a torch file", "Unsupported operand 110"),
             "cut.pt": (good.read_bytes()[:2000], "PytorchStreamReader failed reading zip archive"),
             "empty.pt": (b"", "EOFError")}
    for name, (data, reason) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UserError) as err:
            safe_torch_load(tmp_path / name, what="weights file", fix_unreadable="re-save the weights")
        message = str(err.value)
        assert message.startswith(f"{tmp_path / name}: cannot read weights file: unreadable or truncated ({reason}")
        assert message.endswith("(re-save the weights)") and "refuses" not in message, message


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"nope.pt: checkpoint not found \(check the path\)"):
        safe_torch_load(tmp_path / "nope.pt")


# ----------------------------------------------------------------------------- every loader of the plugin

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

    from rag_plugin.models.generator import GeneratorShape, build_bart, load_generator_weights

    path, marker = evil_checkpoint
    with pytest.raises(UserError, match="safe loading refuses"):
        safe_torch_load(path)
    dictionary = Dictionary.load(str(tiny_world["root"] / "dict.txt"))
    generator = build_bart(GeneratorShape(max_source_positions=64, max_target_positions=64, dropout=0.0, embed_dim=16,
                                           layers=1, heads=2, ffn_dim=32), dictionary)
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
