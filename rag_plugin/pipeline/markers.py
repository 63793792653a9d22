"""Finished-run markers: a training run's save directory gets ``finished.json`` (the settings it ran
with) when its command succeeds, so that a rerun of the command that started it skips it, and a run
whose settings changed is started over rather than continued from a checkpoint made otherwise."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Mapping

from rag_plugin.util.io import atomic_write_json

MARKER = "finished.json"


def read_marker(save_dir: Path) -> Any:
    try:
        return json.loads((Path(save_dir) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_finished(save_dir: Path, settings: Mapping[str, Any]) -> bool:
    """Whether ``save_dir`` holds a finished run with exactly these settings (and its checkpoint_last.pt)."""
    return (Path(save_dir) / "checkpoint_last.pt").is_file() and read_marker(save_dir) == dict(settings)


def prepare(save_dir: Path, settings: Mapping[str, Any], start_over: bool = False) -> None:
    """Before (re)running: remove ``save_dir`` when it finished with other settings (or ``start_over``);
    an unfinished run's checkpoints are kept, so that fairseq continues from checkpoint_last.pt."""
    marker = read_marker(save_dir)
    if start_over or (marker is not None and marker != dict(settings)):
        shutil.rmtree(save_dir, ignore_errors=True)


def mark_finished(save_dir: Path, settings: Mapping[str, Any]) -> None:
    atomic_write_json(Path(save_dir) / MARKER, dict(settings))
