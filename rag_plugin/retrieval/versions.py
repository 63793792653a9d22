"""A knowledge source as a sequence of versions, each complete and checked, switched atomically.

Layout (``KS``: the directory a user names)::

    KS/manifest.json, passages/, ...   version 1: the source as built (every source starts so)
    KS/versions/000002/                version 2, written by ``rag-update-knowledge`` beside version 1:
                                       a complete knowledge source of its own (manifest written last)
    KS/versions/.000003.partial/       an update under way (resumed by rerunning the same command)
    KS/CURRENT                         "2": the version a reader opens; replaced atomically (rename)
                                       after the new version is complete, so a reader sees v or v+1
    KS/.update.lock                    held (flock) by the one update allowed at a time

A source without ``CURRENT`` is at version 1. A reader resolves ``CURRENT`` once, when it opens the
source, and keeps that version (its files are mapped; a later switch does not touch them). While open, a
version is marked in use by a shared ``flock`` on its ``manifest.json`` (read-only: works on a read-only
filesystem), so ``--keep N`` removes only versions no process has open (an exclusive lock that cannot be
taken means a reader holds it). Locks are advisory and local to a machine's kernel (or a filesystem that
supports them across machines).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import List, Optional

from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_write_text

CURRENT = "CURRENT"
VERSIONS = "versions"
UPDATE_LOCK = ".update.lock"


def version_dir(root: Path, version: int) -> Path:
    """The directory holding ``version`` of the source at ``root``."""
    return Path(root) if version == 1 else Path(root) / VERSIONS / f"{version:06d}"


def partial_dir(root: Path, version: int) -> Path:
    """Where ``version`` is written until it is complete."""
    return Path(root) / VERSIONS / f".{version:06d}.partial"


def current_version(root: Path) -> int:
    """The version ``CURRENT`` names (1 without it)."""
    path = Path(root) / CURRENT
    if not path.is_file():
        return 1
    try:
        version = int(path.read_text(encoding="utf-8").strip())
        if version < 1:
            raise ValueError
    except (ValueError, UnicodeDecodeError, OSError):
        raise UserError("the knowledge source's CURRENT file is damaged", path=str(path),
                        fix="write the number of a complete version into it (see the versions/ folder)") from None
    return version


def resolve(root: Path, version: Optional[int] = None) -> tuple:
    """``(directory, version)`` of ``version`` (default: the current one) of the source at ``root``."""
    version = current_version(root) if version is None else int(version)
    d = version_dir(root, version)
    if version > 1 and not (d / "manifest.json").is_file():
        raise UserError(f"version {version} of the knowledge source is missing or incomplete", path=str(d),
                        fix="point CURRENT at a complete version, or rerun the update that makes it")
    return d, version


def versions(root: Path) -> List[int]:
    """The complete versions of the source at ``root``, oldest first."""
    found = [1] if (Path(root) / "manifest.json").is_file() else []
    folder = Path(root) / VERSIONS
    if folder.is_dir():
        for d in folder.iterdir():
            if d.name.isdigit() and (d / "manifest.json").is_file():
                found.append(int(d.name))
    return sorted(found)


def switch_to(root: Path, version: int) -> None:
    """Make ``version`` current (one atomic rename of ``CURRENT``)."""
    atomic_write_text(Path(root) / CURRENT, f"{int(version)}\n")


class InUse(SharedOnCopy):
    """A shared lock on a version's manifest, held while a reader has the version open."""

    def __init__(self, directory: Path):
        self._fd = None
        try:
            self._fd = os.open(Path(directory) / "manifest.json", os.O_RDONLY)
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # no manifest (reported elsewhere), or locks unsupported: the reader still works
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


def in_use(directory: Path) -> bool:
    """Whether a process holds ``directory``'s version open (its manifest shared-locked)."""
    try:
        fd = os.open(Path(directory) / "manifest.json", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class UpdateLock:
    """The one update of a knowledge source allowed at a time (``KS/.update.lock``, exclusive flock)."""

    def __init__(self, root: Path):
        self.path = Path(root) / UPDATE_LOCK
        self._fd = None

    def __enter__(self):
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise UserError("another update of this knowledge source is running", path=str(self.path),
                            fix="wait for it to finish, then run this one") from None
        return self

    def __exit__(self, *exc):
        os.close(self._fd)
        self._fd = None
