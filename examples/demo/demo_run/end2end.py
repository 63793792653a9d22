"""The demo's system with a trained document encoder (stages.yaml ``own_knowledge: true``): it trains on its own copy
of the knowledge source (its background re-indexes write new versions there, never into the source the other
systems read), its final document encoder embeds that copy once more (rag-update-knowledge --reembed: generation
reads vectors of the encoder it was trained with), and its training log says what the re-indexes cost."""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Dict, Optional

from rag_plugin.pipeline.commands import console_script

_REINDEXED = re.compile(r"re-index started at update (\d+) wrote knowledge version (\d+) in ([0-9.]+)s")
_SWITCHED = re.compile(r"knowledge version (\d+) \(was \d+\) is read from update (\d+) on")
_UPS = re.compile(r"train_inner \|.*?ups=([0-9.]+)")
_WAITED = re.compile(r"waited ([0-9.]+)s at update \d+ for knowledge version \d+")


def linked_copy(source: Path, dest: Path) -> Path:
    """``dest``: a copy of the knowledge source ``source`` made of hard links (updates write new files, never into
    existing ones, so the source is never changed through it); made under ``dest.partial``, then renamed."""
    if not dest.is_dir():
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial, copy_function=os.link,
                        ignore=shutil.ignore_patterns(".lower_states", ".reindex", ".update.lock"))
        partial.rename(dest)
    return dest


def embedded_by(knowledge: Path, ckpt: Path) -> bool:
    """Whether ``knowledge``'s current version holds the vectors of the checkpoint's document encoder."""
    from rag_plugin.models.doc_encoder import version_document_hash
    from rag_plugin.retrieval.encoders.trained_tower import doc_encoder_state_from_checkpoint
    from rag_plugin.retrieval.encoders.weights import state_dict_sha256
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    return version_document_hash(KnowledgeSource(str(knowledge))) == state_dict_sha256(
        doc_encoder_state_from_checkpoint(str(ckpt)))


def reembed_final(runner, knowledge: Path, ckpt: Path) -> None:
    """Make ``knowledge``'s current version the checkpoint's document encoder's vectors, unless it already is."""
    if embedded_by(knowledge, ckpt):
        runner.log(f"   {knowledge.name}: already embedded by {ckpt}")
        return
    runner.run(console_script("rag-update-knowledge", "--knowledge", knowledge, "--reembed", ckpt))


def _mean(values) -> Optional[float]:
    values = list(values)
    return round(sum(values) / len(values), 3) if values else None


def reindex_report(log: str, baseline_log: str) -> Dict:
    """From a training log with --reindex-every: each re-index (the update it started at, the version it wrote, its
    seconds), the update each version was switched to, the seconds the trainer waited for a version
    (--reindex-switch-after) and the mean training updates/s beside the baseline's (the same system without the
    document encoder, from its own log)."""
    return {"reindexes": [{"started_at_update": int(u), "version": int(v), "seconds": float(s)}
                          for u, v, s in _REINDEXED.findall(log)],
            "switched_at_updates": {int(v): int(u) for v, u in _SWITCHED.findall(log)},
            "waited_s": round(sum(float(s) for s in _WAITED.findall(log)), 1),
            "train_updates_per_s": _mean(float(x) for x in _UPS.findall(log)),
            "baseline_updates_per_s": _mean(float(x) for x in _UPS.findall(baseline_log))}


def end2end_section(name: str, row: Dict, baseline: str) -> list:
    """RESULTS.md lines: the re-indexes and the throughput of ``name`` against ``baseline``."""
    runs = row.get("reindexes") or []
    each = ", ".join(f"update {r['started_at_update']} -> version {r['version']} in {r['seconds']:.0f} s" for r in runs)
    switched = ", ".join(f"v{v} at update {u}" for v, u in sorted(row.get("switched_at_updates", {}).items()))
    after = row.get("reindex_switch_after")
    schedule = (f", each version switched in {after} updates after its re-index started (`--reindex-switch-after "
                f"{after}`: the same updates on any machine; the trainer waited {row.get('waited_s', 0)} s for them)"
                if after else "")
    return ["", f"## Knowledge that learns ({name})", "",
            f"{name} trains its document encoder too (`--train-doc-encoder --doc-encoder-train-layers "
            f"{row.get('doc_encoder_train_layers', '?')}`: the top layer; the embeddings and lower layers stay the "
            "knowledge source's, computed once per passage) and re-indexes its own copy of the knowledge source in the "
            f"background every {row.get('reindex_every', '?')} updates{schedule}; before testing, its final document "
            "encoder embeds the copy once more.", "",
            f"- re-indexes: {each or 'none landed'}; switched to: {switched or 'none'}",
            f"- training throughput: {row.get('train_updates_per_s')} updates/s with re-indexing (mean of the log's "
            f"intervals), {row.get('baseline_updates_per_s')} for {baseline}"]
