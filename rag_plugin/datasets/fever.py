"""FEVER converter (``rag-prepare fever``): input = the claim, output = the label string
(SUPPORTS / REFUTES / NOT ENOUGH INFO); ``two_way`` drops NOT ENOUGH INFO (FEVER-2-way).

Inputs: FEVER's own JSONL (``train.jsonl``, ``paper_dev.jsonl``, ``paper_test.jsonl``: ``{"id",
"verifiable", "label", "claim", "evidence"}``, evidence -> provenance) or KILT's FEVER JSONL.
"""
from __future__ import annotations

from typing import Iterator, Optional

from rag_plugin.datasets.inputs import layout_error, sniff_format
from rag_plugin.datasets.inputs import progress as with_progress
from rag_plugin.datasets.kilt_records import Row, kilt_fields
from rag_plugin.datasets.writer import (
    DatasetWriter,
    clean_answers,
    finish_with_carving,
    make_record,
    parse_size,
    plan_splits,
)
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl

FEVER_LABELS = ("SUPPORTS", "REFUTES", "NOT ENOUGH INFO")
NEI = "NOT ENOUGH INFO"
ACCEPTED = ("FEVER .jsonl (train.jsonl, paper_dev.jsonl, paper_test.jsonl)", "KILT FEVER .jsonl")

_FEVER_TITLE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
                "-COLON-": ":"}


def fever_title(page: str) -> str:
    """FEVER's wiki page id -> a Wikipedia title (``Nikolaj_Coster-Waldau`` -> ``Nikolaj Coster-Waldau``)."""
    s = str(page)
    for k, v in _FEVER_TITLE.items():
        s = s.replace(k, v)
    return s.replace("_", " ")


def _fever_label(label, path: PathLike, line: int) -> str:
    norm = " ".join(str(label).upper().replace("_", " ").split())
    if norm not in FEVER_LABELS:
        raise UserError(f"unknown FEVER label {label!r}", path=str(path), line=line,
                        fix=f"labels must be one of {', '.join(FEVER_LABELS)}")
    return norm


def _evidence_provenance(evidence) -> list:
    """FEVER's evidence sets -> provenance ``[{"title", "wikipedia_title", "sentence_id"}]``,
    each sentence once; evidence without a page (NOT ENOUGH INFO) is left out."""
    provenance, seen = [], set()
    for ev_set in evidence or []:
        for ev in ev_set or []:
            if not isinstance(ev, (list, tuple)) or len(ev) < 4 or ev[2] is None:
                continue
            key = (ev[2], ev[3])
            if key in seen:
                continue
            seen.add(key)
            provenance.append({"title": fever_title(ev[2]), "wikipedia_title": ev[2], "sentence_id": ev[3]})
    return provenance


def _fever_row(obj: dict, path: PathLike, line: int) -> Row:
    claim = obj.get("claim")
    if not isinstance(claim, str):
        raise UserError("'claim' must be a string", path=str(path), line=line, fix="fix that record")
    label = obj.get("label")
    label = None if label is None else _fever_label(label, path, line)
    meta = {"verifiable": obj["verifiable"]} if "verifiable" in obj else None
    return line, str(obj["id"]), claim.strip(), label, _evidence_provenance(obj.get("evidence")), meta


def _kilt_fever_row(obj: dict, path: PathLike, line: int) -> Row:
    rid, claim, answers, provenance = kilt_fields(obj, path, line)
    labels = [_fever_label(a, path, line) for a in clean_answers(answers)]
    if len(set(labels)) > 1:
        raise UserError(f"record has conflicting labels {sorted(set(labels))}", path=str(path),
                        line=line, fix="fix that record")
    return line, rid, claim, (labels[0] if labels else None), provenance, None


def _fever_rows(path: PathLike) -> Iterator[Row]:
    """Yield ``(line, id, claim, label|None, provenance, meta)`` from original or KILT FEVER."""
    if sniff_format(path) != "jsonl":
        raise layout_error(path, "FEVER", ACCEPTED)
    style = None
    for line, obj in iter_jsonl(path):
        this = "fever" if "claim" in obj else ("kilt" if "input" in obj else None)
        if this is None:
            raise UserError("record has neither 'claim' (FEVER) nor 'input' (KILT)", path=str(path), line=line,
                            fix='expected {"id", "claim", "label", "evidence"} or {"id", "input", "output"}')
        if style is None:
            style = this
        elif this != style:
            raise UserError(f"record is in {this} format, earlier ones in {style} format", path=str(path),
                            line=line, fix="do not mix original FEVER and KILT FEVER records in one file")
        if "id" not in obj:
            raise UserError("record lacks 'id'", path=str(path), line=line, fix="give every record an id")
        yield (_fever_row if style == "fever" else _kilt_fever_row)(obj, path, line)


def convert_fever(out: PathLike, train: PathLike, dev: Optional[PathLike] = None, test: Optional[PathLike] = None,
                  *, two_way: bool = False, keep_provenance: bool = True, valid_from_train="0.1", seed: int = 0,
                  overwrite: bool = False, progress: bool = True) -> dict:
    """FEVER (KILT or original JSONL) -> input = claim, output = the label string
    (SUPPORTS / REFUTES / NOT ENOUGH INFO). ``two_way`` drops NOT ENOUGH INFO."""
    plan, carve_valid = plan_splits(train, dev, test)
    if carve_valid:
        parse_size(valid_from_train)
    with DatasetWriter(out, overwrite=overwrite) as writer:
        for path, part, role in plan:
            writer.source(part, path)
            rows = with_progress(_fever_rows(path), f"fever {role}", progress)
            for line, rid, claim, label, provenance, meta in rows:
                if not claim:
                    raise UserError("empty claim", path=str(path), line=line, fix="remove that record")
                if label is None:
                    writer.skip(part, "no label")
                    continue
                if two_way and label == NEI:
                    writer.skip(part, "NOT ENOUGH INFO (--two-way)")
                    continue
                writer.write(part, make_record(rid, claim, [label], provenance if keep_provenance else (), meta))
        info = {"dataset": "fever-2way" if two_way else "fever",
                "options": {"two_way": two_way, "keep_provenance": keep_provenance,
                            "valid_from_train": str(valid_from_train) if carve_valid else None, "seed": seed}}
        return finish_with_carving(writer, carve_valid, valid_from_train, seed, info)
