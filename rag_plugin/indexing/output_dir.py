"""The builder's output directory: new, an unfinished build to resume, or a finished source.

* :func:`check_out_dir` decides which, and refuses foreign content and other settings;
* :func:`check_same_encoder` refuses to resume (or call up to date) vectors of another encoder;
* :func:`resume_shard_size` and :func:`check_shards` keep a resumed build in the unit of its
  finished embedding shards (``.build/shards/{start:012d}.npy``);
* :func:`discard_unstarted_build_on_error` removes what a failed build created before any vector
  was computed, so the same command can start afresh once the input is fixed.
"""
from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from rag_plugin.indexing.settings import (
    ENCODER_IDENTITY,
    SHARD_SIZE,
    describe_differences,
    differences,
    passage_side,
    settings_part,
)
from rag_plugin.retrieval.knowledge import BUILD_DIR, MANIFEST
from rag_plugin.util.errors import UserError


def shards_dir(out: Path) -> Path:
    return out / BUILD_DIR / "shards"


def shard_path(shards: Path, start: int) -> Path:
    return shards / f"{start:012d}.npy"


def read_json_or_none(path: Path):
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def discard_unstarted_build_on_error(build):
    """A build into a new (or empty) directory that fails on bad input (:class:`UserError`)
    before any vector was computed removes what it created: after fixing the input, the same
    command starts afresh (no --restart, no "unfinished build with other settings")."""

    @functools.wraps(build)
    def wrapper(out_dir, *args, **kwargs):
        out = Path(out_dir)
        fresh = not out.exists() or (out.is_dir() and not any(out.iterdir()))
        try:
            return build(out_dir, *args, **kwargs)
        except UserError:
            shards = shards_dir(out)
            started = (out / MANIFEST).exists() or (shards.is_dir() and any(shards.glob("*.npy")))
            if fresh and out.is_dir() and not started:
                shutil.rmtree(out, ignore_errors=True)
            raise

    return wrapper


def check_out_dir(out: Path, fingerprint: dict, restart: bool) -> Tuple[str, Optional[dict]]:
    """Decide what to do with ``out``: ('new', None), ('resume', the unfinished build's recorded
    settings) or ('done', the manifest); refuse foreign content and other settings. The encoder
    identity and shard size recorded with the settings are checked by the caller."""
    if not out.exists():
        return "new", None
    if not out.is_dir():
        raise UserError("output path exists and is not a directory", path=str(out), fix="choose another --out")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return "new", None
    if MANIFEST in entries:
        return "done", _finished_source(out, fingerprint)
    state = out / BUILD_DIR / "settings.json"
    if state.is_file():
        if restart:
            shutil.rmtree(out)
            return "new", None
        recorded = read_json_or_none(state)
        if recorded is not None and settings_part(recorded) == fingerprint:
            return "resume", recorded
        differs = describe_differences(settings_part(recorded), fingerprint) if recorded else ""
        raise UserError(f"output directory holds an unfinished build with other settings"
                        f"{f' ({differs})' if differs else ''}",
                        path=str(out), fix="rerun with the same settings, or add --restart to discard it")
    raise UserError("output directory is not empty and is not a knowledge source", path=str(out),
                    fix="choose a new or empty --out directory")


def _finished_source(out: Path, fingerprint: dict) -> dict:
    """The manifest of the finished source in ``out``, if it was built with ``fingerprint``."""
    manifest = read_json_or_none(out / MANIFEST)
    if manifest is None:
        raise UserError("output directory holds a knowledge source whose manifest is corrupted",
                        path=str(out / MANIFEST), fix="choose another --out or delete it first")
    recorded = manifest.get("build_settings")
    if isinstance(recorded, dict) and settings_part(recorded) == fingerprint:
        return manifest
    differs = describe_differences(settings_part(recorded), fingerprint) if isinstance(recorded, dict) else ""
    raise UserError("output directory already holds a knowledge source built with other "
                    f"settings{f' ({differs})' if differs else ''}", path=str(out),
                    fix="choose another --out or delete it first")


def check_same_encoder(out: Path, mode: str, recorded: dict, identity: dict) -> None:
    """Refuse to call ``out`` up to date, or to resume it, when its vectors were (or began to be)
    made by an encoder whose passage side differs from ``identity`` (``passage_side``): new weights
    at the same path, another max_length, ... A finished source built by an older version is
    checked against the identity in its manifest; an unfinished one that recorded none, and has
    finished shards, cannot be checked and is refused."""
    if mode == "done":
        built = recorded.get("build_settings", {}).get(ENCODER_IDENTITY)
        built = passage_side(recorded.get("encoder") or {}) if built is None else built
        if differences(built, identity):
            raise UserError("output directory holds a knowledge source embedded with another document encoder "
                            f"({describe_differences(built, identity, 'there', 'now')})", path=str(out),
                            fix="choose another --out, or delete it first to rebuild it with this encoder")
        return
    started = recorded.get(ENCODER_IDENTITY)
    has_shards = any(shards_dir(out).glob("*.npy"))
    if started is None and has_shards:
        raise UserError("output directory holds an unfinished build from an older version, which did not record "
                        "its document encoder: its finished vectors cannot be checked against this one",
                        path=str(out), fix="add --restart to discard it and start over")
    if started is not None and differences(started, identity):
        raise UserError("output directory holds an unfinished build begun with another document encoder "
                        f"({describe_differences(started, identity, 'then', 'now')}); resuming would mix "
                        "vectors of the two", path=str(out),
                        fix="rerun with the encoder it was begun with, or add --restart to discard it")


def resume_shard_size(shards: Path, recorded: Optional[dict], requested: int, log) -> int:
    """The shard size a build continues with: the one its finished shards were made in (recorded
    with the settings; read off the first shard for builds by older versions), else ``requested``.
    The shard size is only the unit of resume, the vectors do not depend on it."""
    if not any(shards.glob("*.npy")):
        return requested  # nothing embedded yet: any shard size will do
    size = (recorded or {}).get(SHARD_SIZE)
    if size is None and shard_path(shards, 0).is_file():
        size = int(np.load(shard_path(shards, 0), mmap_mode="r").shape[0])
    if size is None or int(size) == requested:
        return requested
    log(f"resuming with the unfinished build's shard size {size} (not {requested}): its finished "
        "shards are in that unit")
    return int(size)


def check_shards(shards: Path, starts: List[int], shard_size: int, n: int, dim: Optional[int]) -> None:
    """Every finished shard must be one of this build's, of its size: else resuming would mix them."""
    expected = set(starts)
    for path in sorted(shards.glob("*.npy")):
        try:
            s = int(path.stem)
            shape = np.load(path, mmap_mode="r").shape
        except (ValueError, OSError, EOFError):
            s, shape = None, None
        if (s not in expected or len(shape) != 2 or shape[0] != min(shard_size, n - s)
                or (dim is not None and shape[1] != dim)):
            raise UserError(f"unfinished build holds a shard that does not fit it ({path.name}, for {n} "
                            f"passages in shards of {shard_size})", path=str(path),
                            fix="add --restart to discard the unfinished build and start over")
