"""rag_plugin.fairseq_hooks.checkpoints: the copies fairseq makes of a just-saved checkpoint land whole.
(Its safe loading is tested with the loader, in tests/util/test_safe_load.py.)"""
import shutil

import pytest


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
