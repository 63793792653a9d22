"""rag_plugin.util.safe_load: the one allow-list and loader; what it accepts, what it refuses (without
running anything), the one-line messages, and torch's process-wide allow-list left alone."""
from __future__ import annotations

import argparse
import fractions
import os
import pickle

import pytest
import torch

from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import checkpoint_types_allowed, safe_torch_load


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
