"""The output side of every converter: the all-or-nothing dataset directory.

:class:`DatasetWriter` writes ``train.jsonl``, ``valid.jsonl``, ``test.jsonl`` (KILT style, read
by :func:`rag_plugin.data.kilt.read_kilt`) and ``prepare.json`` (sources, options, counts,
skipped records, notes) into a hidden temporary directory beside the output, renamed onto it only
when every split is complete and non-empty. Also here: the split plan shared by the converters
(:func:`plan_splits`: train/dev/test files -> parts, and whether ``valid`` is carved from train),
sizes of carved splits (:func:`parse_size`), and the record shape (:func:`make_record`,
:func:`clean_answers`).

One record per line::

    {"id": str, "input": str,
     "output": [{"answer": str, "provenance": [...]}, {"answer": alias}, ...],
     "meta": {...}}

every gold alias is its own ``{"answer": ...}`` entry; the provenance of a record (if any)
rides on its first entry.
"""
from __future__ import annotations

import io
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, atomic_write_json, replace_directory

FORMAT = "rag_plugin.prepared/1"
SPLITS = ("train", "valid", "test")
PREPARE_INFO = "prepare.json"

#: The paper's split sizes (Lewis et al. 2020, Table 7), for reference in summaries and docs.
PAPER_SPLIT_SIZES = {
    "nq": (79169, 8758, 3611),
    "triviaqa": (78786, 8838, 11314),
    "webquestions": (3418, 362, 2033),
    "curatedtrec": (635, 134, 635),
    "msmarco": (153726, 12468, 101093),
    "jeopardy": (97392, 13714, 26849),
    "fever": (145450, 10000, 10000),
    "fever-2way": (96966, 6666, 6666),
}


def parse_size(spec: Union[str, int, float], what: str = "--valid-from-train") -> Union[int, float]:
    """``'5000'`` -> 5000 records, ``'0.1'`` -> a fraction; anything else is an error."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        value = spec
    else:
        text = str(spec).strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise UserError(f"{what} must be a number of records or a fraction, got {spec!r}",
                                fix=f"e.g. {what} 5000 or {what} 0.1") from None
    if isinstance(value, float) and not (0.0 < value < 1.0):
        raise UserError(f"{what} fraction must be between 0 and 1, got {value}",
                        fix=f"e.g. {what} 0.1, or a whole number of records")
    if isinstance(value, int) and value < 1:
        raise UserError(f"{what} must be at least 1, got {value}")
    return value


def _resolve_size(spec: Union[int, float], n: int) -> int:
    return int(spec) if isinstance(spec, int) else max(1, int(round(spec * n)))


def make_record(rid: str, question: str, answers: Sequence[str], provenance: Sequence[dict] = (),
                meta: Optional[dict] = None) -> dict:
    """A KILT-style record: one ``{"answer"}`` entry per alias, provenance on the first."""
    output = [{"answer": a} for a in answers]
    if provenance:
        output[0]["provenance"] = list(provenance)
    record = {"id": rid, "input": question, "output": output}
    if meta:
        record["meta"] = meta
    return record


def clean_answers(answers: Iterable, drop: Iterable[str] = ()) -> List[str]:
    """Strip, drop empties (and ``drop``), de-duplicate keeping order."""
    dropped = set(drop)
    out: List[str] = []
    seen = set()
    for a in answers:
        if not isinstance(a, str):
            continue
        a = a.strip()
        if not a or a in dropped or a in seen:
            continue
        seen.add(a)
        out.append(a)
    return out


class DatasetWriter:
    """Writes the splits of one dataset into a temporary directory, renamed onto ``out`` last.

    Use as a context manager; any exception removes the temporary directory and leaves
    ``out`` untouched. ``write(part, record)`` appends to ``<part>.jsonl``; ``carve`` moves a
    seeded random sample of one part into others; ``finish`` checks that train/valid/test
    are non-empty, writes ``prepare.json`` and renames the directory into place.
    """

    def __init__(self, out: PathLike, overwrite: bool = False):
        self.out = Path(out)
        _check_output(self.out, overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp, 0o777 & ~umask)
        self.overwrite = overwrite
        self.counts: Counter = Counter()
        self.skipped: Dict[str, Counter] = {}
        self.sources: Dict[str, List[str]] = {}
        self.notes: List[str] = []
        self._files: Dict[str, io.TextIOBase] = {}
        self._ids: Dict[str, set] = {}
        self._done = False

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()

    @property
    def workdir(self) -> Path:
        """Scratch space inside the temporary directory (removed before the rename)."""
        d = self.tmp / ".work"
        d.mkdir(exist_ok=True)
        return d

    def source(self, part: str, path: PathLike) -> None:
        self.sources.setdefault(part, []).append(str(Path(path).resolve()))

    def write(self, part: str, record: dict) -> None:
        ids = self._ids.setdefault(part, set())
        rid = str(record["id"])
        if rid in ids:
            n = 2
            while f"{rid}#{n}" in ids:
                n += 1
            rid = f"{rid}#{n}"
            self.skip(part, "duplicate id (renamed with #N)")
        record["id"] = rid
        ids.add(rid)
        fh = self._files.get(part)
        if fh is None:
            fh = self._files[part] = open(self.tmp / f"{part}.jsonl", "w", encoding="utf-8", newline="\n")
        try:
            text = json.dumps(record, ensure_ascii=False)
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (valid JSON escape, not UTF-8): keep it escaped
            text = json.dumps(record, ensure_ascii=True)
        fh.write(text + "\n")
        self.counts[part] += 1

    def skip(self, part: str, reason: str, n: int = 1) -> None:
        self.skipped.setdefault(part, Counter())[reason] += n

    def _close(self, part: str) -> None:
        fh = self._files.pop(part, None)
        if fh is not None:
            fh.close()

    def carve(self, source: str, targets: Sequence[Tuple[str, Union[int, float]]], seed: int,
              rest: str, what: str = "--valid-from-train") -> None:
        """Move a seeded random sample of ``source`` into ``targets``; the remainder -> ``rest``."""
        self._close(source)
        n = self.counts.get(source, 0)
        sizes = [(name, _resolve_size(spec, n)) for name, spec in targets]
        total = sum(k for _, k in sizes)
        if total >= n:
            raise UserError(f"cannot take {total} records out of the {n} of {source!r}",
                            fix=f"lower {what}")
        chosen = random.Random(seed).sample(range(n), total)
        assign = bytearray(n)  # 0 -> rest, i -> targets[i - 1]
        at = 0
        for i, (_, k) in enumerate(sizes, 1):
            for idx in chosen[at:at + k]:
                assign[idx] = i
            at += k
        names = [rest] + [name for name, _ in sizes]
        for name in names:
            if name != rest and name in self.counts:
                raise RuntimeError(f"split {name!r} already written")
        outs = {i: open(self.tmp / (f".{rest}.carving" if i == 0 else f"{name}.jsonl"), "w",
                        encoding="utf-8", newline="\n") for i, name in enumerate(names)}
        counts = Counter()
        try:
            with open(self.tmp / f"{source}.jsonl", "r", encoding="utf-8", newline="\n") as fh:
                for idx, line in enumerate(fh):
                    outs[assign[idx]].write(line)
                    counts[assign[idx]] += 1
        finally:
            for fh in outs.values():
                fh.close()
        (self.tmp / f"{source}.jsonl").unlink()
        os.replace(self.tmp / f".{rest}.carving", self.tmp / f"{rest}.jsonl")
        del self.counts[source]
        for i, name in enumerate(names):
            self.counts[name] = counts[i]
        src = self.sources.pop(source, []) if source != rest else list(self.sources.get(source, []))
        if source != rest:
            self.sources.setdefault(rest, []).extend(src)
        for name, _ in sizes:
            self.sources.setdefault(name, []).extend(src)
        self.notes.append(f"{', '.join(f'{name} ({k})' for name, k in sizes)} carved from {source} "
                          f"with seed {seed}")

    def finish(self, info: dict) -> dict:
        for part in list(self._files):
            self._close(part)
        for split in SPLITS:
            if self.counts.get(split, 0) == 0:
                reasons = ", ".join(f"{k}: {v}" for k, v in (self.skipped.get(split) or {}).items())
                raise UserError(f"split {split!r} would be empty"
                                + (f" (skipped {reasons})" if reasons else ""),
                                path=", ".join(self.sources.get(split, [])) or None,
                                fix="check that file (a test file without answers cannot be a "
                                    "test split: pass the dev file as --dev instead)")
        extra = sorted(set(self.counts) - set(SPLITS))
        if extra:
            raise RuntimeError(f"unplaced parts {extra}")
        shutil.rmtree(self.tmp / ".work", ignore_errors=True)
        summary = {
            "format": FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **info,
            "counts": {s: self.counts[s] for s in SPLITS},
            "skipped": {p: dict(c) for p, c in self.skipped.items() if c},
            "sources": self.sources,
            "notes": self.notes,
        }
        atomic_write_json(self.tmp / PREPARE_INFO, summary)
        replace_directory(self.tmp, self.out)
        self._done = True
        return summary

    def abort(self) -> None:
        for part in list(self._files):
            try:
                self._close(part)
            except OSError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserError("output path exists and is not a directory", path=str(out), fix="choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not (out / PREPARE_INFO).is_file():
            raise UserError("output directory is not empty and is not a prepared dataset", path=str(out),
                            fix="choose a new or empty --out directory")
        if not overwrite:
            raise UserError("output directory already holds a prepared dataset", path=str(out),
                            fix="choose another --out, or pass --overwrite to replace it")


def plan_splits(train: Optional[PathLike], dev: Optional[PathLike], test: Optional[PathLike]
                ) -> Tuple[List[Tuple[PathLike, str, str]], bool]:
    """``[(path, part, role)]`` and whether ``valid`` must be carved from train.

    role is the file's official name (train/dev/test), used in record ids.
    """
    if not train:
        raise UserError("no training file given", fix="pass --train FILE")
    if not dev and not test:
        raise UserError("no evaluation file given",
                        fix="pass --dev FILE (it becomes the test split; valid is carved from train) "
                            "and/or --test FILE")
    plan: List[Tuple[PathLike, str, str]] = [(train, "train", "train")]
    if dev and test:
        plan += [(dev, "valid", "dev"), (test, "test", "test")]
        return plan, False
    if dev:
        plan.append((dev, "test", "dev"))
    else:
        plan.append((test, "test", "test"))
    return plan, True


def finish_with_carving(writer: DatasetWriter, carve_valid: bool, valid_from_train, seed: int,
                         info: dict) -> dict:
    if carve_valid:
        writer.carve("train", [("valid", parse_size(valid_from_train))], seed=seed, rest="train")
    return writer.finish(info)
