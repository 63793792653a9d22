"""Update a knowledge source without rebuilding it: add, delete or replace passages, as a new version
(``rag-update-knowledge``; the versions' layout is :mod:`rag_plugin.retrieval.versions`).

The new version is a complete knowledge source written beside the current one by the builder, with the
current one's settings (encoder, index type, shards, tokenizer, input format): the passages in their old
order without the deleted ones, replaced ones in place, added ones at the end; the vectors of unchanged
passages copied, so the encoder is called once per new or edited passage and never otherwise. Passage ids
stay stable (rows may move: a deletion closes the gap). Per index type:

* Flat: the index is the new vectors in order, so the new version searches exactly like a from-scratch
  build of the new collection;
* IVF / PQ / SQ (a trained quantizer): the new vectors go into a copy of the current quantizer (no
  training); when the changed share passes ``RETRAIN_ADVICE`` the update says retraining is advisable
  (``--retrain`` trains a new one on the new collection);
* HNSW: FAISS cannot delete from an HNSW graph, so the graph is rebuilt over the new vectors (said so).

The switch is the last step (``CURRENT`` replaced by a rename) after the version is complete: killed at
any point, the previous version stays current and byte-identical, and the same command resumes.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from rag_plugin.indexing.builder import BuildHooks, BuildOptions, build_knowledge_source
from rag_plugin.indexing.embedding import embedding_record
from rag_plugin.indexing.settings import BuildSettings, settings_part
from rag_plugin.retrieval import versions
from rag_plugin.retrieval.index import _faiss, read_index
from rag_plugin.retrieval.knowledge import MANIFEST, KnowledgeSource
from rag_plugin.retrieval.passages import Passage, read_numbered_passages
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import open_text

#: Above this share of changed passages an IVF/PQ quantizer trained on the old collection may no longer fit.
RETRAIN_ADVICE = 0.2


@dataclass
class Changes:
    """What an update changes, read and checked against the current version."""

    added: List[Passage] = field(default_factory=list)
    deleted: List[str] = field(default_factory=list)
    replaced: Dict[str, Passage] = field(default_factory=dict)

    def count(self) -> int:
        return len(self.added) + len(self.deleted) + len(self.replaced)


def read_changes(current: KnowledgeSource, add: Sequence[str], delete: Optional[str], replace: Sequence[str],
                 split_words: Optional[int]) -> Changes:
    """The changes in the files given, each refused in one line (file and line) if it does not fit."""
    store, changes = current.passages, Changes()
    seen: Dict[str, str] = {}

    def claim(pid: str, path: str, line: int) -> None:
        if pid in seen:
            raise UserError(f"passage id {pid!r} is changed twice (also in {seen[pid]})", path=path, line=line,
                            fix="change each passage once per update")
        seen[pid] = path

    if delete:
        with open_text(delete, what="ids file") as fh:
            for line, raw in enumerate(fh, 1):
                pid = raw.strip()
                if not pid:
                    continue
                if _row(store, pid) is None:
                    raise UserError(f"cannot delete passage id {pid!r}: the knowledge source has no such passage",
                                    path=delete, line=line, fix="delete only ids of the current version")
                claim(pid, delete, line)
                changes.deleted.append(pid)
    for path in replace:
        for line, p in read_numbered_passages(path, split_words):
            if _row(store, p.id) is None:
                raise UserError(f"cannot replace passage id {p.id!r}: the knowledge source has no such passage",
                                path=path, line=line, fix="use --add for new passages")
            claim(p.id, path, line)
            changes.replaced[p.id] = p
    for path in add:
        for line, p in read_numbered_passages(path, split_words):
            if _row(store, p.id) is not None:
                raise UserError(f"cannot add passage id {p.id!r}: the knowledge source has it already", path=path,
                                line=line, fix="use --replace to change it, or give the new passage another id")
            claim(p.id, path, line)
            changes.added.append(p)
    if not changes.count():
        raise UserError("nothing to change: no passage to add, delete or replace",
                        fix="pass --add, --delete or --replace")
    return changes


def _row(store, pid: str) -> Optional[int]:
    try:
        return store.row_of_id(pid)
    except (KeyError, UserError):
        return None


def new_collection(current: KnowledgeSource, changes: Changes) -> Callable[[], list]:
    """The new version's passages: the current ones in order (deleted left out, replaced in place), then the added."""
    def passages():
        store, gone = current.passages, set(changes.deleted)
        for row in range(len(store)):
            pid = store.id(row)
            if pid not in gone:
                yield changes.replaced.get(pid) or Passage(pid, store.title(row), store.text(row))
        yield from changes.added

    return passages


def update_settings(current: KnowledgeSource, files: List[str]) -> BuildSettings:
    """The build settings of the new version: the current one's, with the update's files as its input and
    the tokenizer copy the current version carries."""
    recorded = settings_part(current.manifest.get("build_settings") or {})
    if current.imported or not recorded:
        raise UserError("this knowledge source's vectors were imported (or built by an older version): its document "
                        "encoder cannot embed new passages here", path=str(current.directory / MANIFEST),
                        fix="rebuild it with rag-build-knowledge or rag-import-knowledge")
    tok = (current.manifest.get("tokenizer") or {}).get("files", {})
    return BuildSettings(
        passages=files, encoder=current.encoder_spec, index_factory=recorded.get("index_factory", "Flat"),
        split_words=None, train_size=recorded.get("train_size", 100_000), seed=recorded.get("seed", 0),
        input_format=current.passages.meta.get("input_format"), num_shards=current.num_shards,
        tokenizer=GeneratorTokenizerFiles.in_directory(current.directory / "tokenizer", tok))


def index_plan(current: KnowledgeSource, changes: Changes, new_count: int, retrain: bool, log):
    """The template index the new version copies (the current quantizer), or None to build afresh; says why."""
    factory = current.manifest.get("index_factory", "")
    index = current.part(0).index
    share = changes.count() / max(1, len(current))
    if "HNSW" in factory:
        log(f"index {factory}: FAISS cannot delete from an HNSW graph; the graph is rebuilt over the "
            f"{new_count} passages")
        return None
    if index.is_trained and _has_quantizer(index) and not retrain:
        if share > RETRAIN_ADVICE:
            log(f"{share:.0%} of the passages changed: the quantizer was trained on the old collection; retraining is "
                "advisable (rerun with --retrain)")
        # a private copy (a mapped IVF index's lists cannot be emptied): the builder keeps it emptied
        return read_index(current.part(0).name)
    return None


def _has_quantizer(index) -> bool:
    faiss = _faiss()
    return type(faiss.downcast_index(index)).__name__ not in ("IndexFlatIP", "IndexFlatL2", "IndexFlat")


def update_knowledge_source(root: str, add: Sequence[str] = (), delete: Optional[str] = None,
                            replace: Sequence[str] = (), retrain: bool = False, keep: Optional[int] = None,
                            encoder=None, batch_size: int = 64, shard_size: int = 2048, progress: bool = True,
                            log=print) -> KnowledgeSource:
    """Write version v+1 of the knowledge source at ``root`` with these changes and make it current
    (``shard_size``: passages per embedding chunk, the unit of resume)."""
    root = Path(root)
    with versions.UpdateLock(root):
        current = KnowledgeSource(str(root))
        new = current.version + 1
        recorded = settings_part(current.manifest.get("build_settings") or {})
        changes = read_changes(current, add, delete, replace, recorded.get("split_words"))
        carried = _check_reembedded(current, changes)
        files = [str(Path(f).resolve()) for f in [*add, *replace, *([delete] if delete else [])]]
        settings = update_settings(current, files)
        n_new = len(current) - len(changes.deleted) + len(changes.added)
        template = index_plan(current, changes, n_new, retrain, log)
        partial, final = versions.partial_dir(root, new), versions.version_dir(root, new)
        _discard_other_finished(final, settings, log)
        if not (final / MANIFEST).is_file():
            extra = {"version": new, "previous_version": current.version,
                     "update": {"added": len(changes.added), "deleted": len(changes.deleted),
                                "replaced": len(changes.replaced), "retrained": template is None}, **carried,
                     **embedding_record(encoder)}
            partial.parent.mkdir(parents=True, exist_ok=True)
            build_knowledge_source(
                str(partial), settings, BuildOptions(shard_size=shard_size, batch_size=batch_size, progress=progress,
                                                     log=log),
                BuildHooks(encoder=encoder, reuse_vectors_from=str(current.directory),
                           collection=new_collection(current, changes), index_template=template, manifest_extra=extra))
            os.replace(partial, final)
        versions.switch_to(root, new)
        log(f"{root}: version {new} is current ({len(changes.added)} added, {len(changes.deleted)} deleted, "
            f"{len(changes.replaced)} replaced; {n_new} passages)")
        if keep:
            remove_old_versions(root, keep, log)
        return KnowledgeSource(str(root))


def _discard_other_finished(final: Path, settings: BuildSettings, log) -> None:
    """A complete v+1 that was never made current (a re-embedding killed before its switch) is not this update's."""
    manifest = final / MANIFEST
    if manifest.is_file() and not versions.in_use(final):
        recorded = settings_part(json.loads(manifest.read_text(encoding="utf-8")).get("build_settings") or {})
        if recorded != settings.fingerprint():
            log(f"discarding {final.name}: a version of other content that was never made current")
            manifest.unlink()
            shutil.rmtree(final)


def _check_reembedded(current: KnowledgeSource, changes: Changes) -> dict:
    """A version re-embedded with a trained document tower (rag_plugin/indexing/reembed.py) can lose passages (its
    record carried on), not gain any: the tower is not stored with it, the source's own would embed them."""
    carried = {k: current.manifest[k] for k in ("document_tower_sha256", "reembedded_from") if k in current.manifest}
    if carried and (changes.added or changes.replaced):
        raise UserError(f"version {current.version} was re-embedded with a trained document tower "
                        f"({carried.get('reembedded_from')}): new or edited passages cannot be embedded like it",
                        path=str(current.directory / MANIFEST),
                        fix="delete only here; to add or edit passages, rebuild the source (rag-build-knowledge), "
                            "then re-embed it (rag-update-knowledge --reembed CHECKPOINT)")
    return carried


def remove_old_versions(root: Path, keep: int, log) -> List[int]:
    """Remove the versions older than the ``keep`` newest that no process has open; returns those removed."""
    if keep < 1:
        raise UserError(f"--keep must be at least 1, got {keep}", fix="keep at least the current version")
    removed = []
    for version in versions.versions(root)[:-keep]:
        d = versions.version_dir(root, version)
        if versions.in_use(d):
            log(f"version {version} is open in a running process: kept")
            continue
        if version == 1:  # the source as built, at the top level: its files, not the versions beside them
            (d / MANIFEST).unlink()
            for entry in d.iterdir():
                if entry.name not in (versions.CURRENT, versions.VERSIONS, versions.UPDATE_LOCK, ".reindex"):
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        else:
            (d / MANIFEST).unlink()  # first: a half-removed version can never be opened
            shutil.rmtree(d)
        removed.append(version)
    if removed:
        log(f"removed versions {removed}")
    return removed
