"""KILT-style JSONL question/target records (no fairseq import).

One JSON object per line: ``{"id", "input", "output": [{"answer": ..., "provenance": [...]}, ...]}``.
Every answer of ``output`` is a gold alias; provenance lists gold passages.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import iter_jsonl

logger = logging.getLogger(__name__)

FIX = 'each line must be {"id": ..., "input": "question", "output": [{"answer": "..."}]}'


@dataclass
class QARecord:
    id: str
    input: str
    answers: List[str]
    provenance: List[str] = field(default_factory=list)  # gold passage ids
    meta: dict = field(default_factory=dict)
    line: Optional[int] = None  # line in the file it was read from
    evidence_sets: List[List[str]] = field(default_factory=list)  # per output, its provenance ids (KILT's alternatives)


def _outputs(obj: dict, path: Path, lineno: int, require_answers: bool):
    """``(answers, provenance ids, evidence sets)`` of one record's ``output`` list."""
    outputs = obj.get("output")
    if outputs is None and require_answers:
        raise UserError("missing field 'output'", path=str(path), line=lineno, fix=FIX)
    answers, provenance, evidence_sets = [], [], []
    for out in outputs or []:
        if not isinstance(out, dict):
            raise UserError("'output' must be a list of objects", path=str(path), line=lineno, fix=FIX)
        ans = out.get("answer")
        if isinstance(ans, str):
            if not ans.strip():
                raise UserError("empty target ('answer')", path=str(path), line=lineno,
                                fix="remove the record or give it an answer")
            answers.append(ans)
        evidence = []
        for prov in out.get("provenance") or []:
            if isinstance(prov, dict):
                pid = prov.get("id", prov.get("wikipedia_id"))
                if pid is not None:
                    provenance.append(str(pid))
                    evidence.append(str(pid).strip())
        evidence_sets.append(evidence)
    if require_answers and not answers:
        raise UserError("no answer in 'output'", path=str(path), line=lineno, fix=FIX)
    return answers, provenance, evidence_sets


def read_kilt(path: str, require_answers: bool = True, allow_empty_input: bool = False,
              warn_empty_input: bool = True) -> List[QARecord]:
    """Read and check a KILT-style JSONL file (``.gz`` too); errors name the file and line.

    ``allow_empty_input``: keep records with an empty question (with a warning unless
    ``warn_empty_input`` is False) so that generation still answers every line.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError("data file not found", path=str(p),
                        fix="DATA must hold train.jsonl/valid.jsonl (and test.jsonl) in KILT style")
    records: List[QARecord] = []
    seen = set()
    for lineno, obj in iter_jsonl(p, fix=FIX, what="data file"):
        if "input" not in obj:
            raise UserError("missing field 'input'", path=str(p), line=lineno, fix=FIX)
        question = obj["input"]
        if not isinstance(question, str):
            raise UserError("'input' must be a string", path=str(p), line=lineno, fix=FIX)
        if not question.strip():
            if not allow_empty_input:
                raise UserError("empty question ('input')", path=str(p), line=lineno,
                                fix="give every record a question")
            if warn_empty_input:
                logger.warning("%s:%d: empty question (kept, so that every line gets an answer)", p, lineno)
        rid = str(obj.get("id", lineno))
        if rid in seen:
            raise UserError(f"duplicate id {rid!r}", path=str(p), line=lineno, fix="make ids unique")
        seen.add(rid)
        answers, provenance, evidence_sets = _outputs(obj, p, lineno, require_answers)
        records.append(QARecord(rid, question, answers, provenance, obj.get("meta") or {}, lineno, evidence_sets))
    if not records:
        raise UserError("data file holds no records", path=str(p), fix="check the file")
    return records


def regex_target_refusal(records: List[QARecord], path: Path) -> Optional[UserError]:
    """The error to raise if ``records`` are trained or validated on as they are: regular-expression
    answers (CuratedTrec: ``meta.answer_is_regex``) whose concrete targets were not derived (no
    ``meta.answer_pattern``) would teach the generator to write the pattern. The paper takes the most
    frequent match in the retrieved passages instead. None if every target is concrete."""
    bad = [i for i, r in enumerate(records)
           if r.meta.get("answer_is_regex") and r.meta.get("answer_pattern") is None]
    if not bad:
        return None
    what = "training target" if path.stem == "train" else "target of the validation loss"
    return UserError(f"{len(bad)} of {len(records)} records have regular-expression answers "
                     f"(meta.answer_is_regex, CuratedTrec) and no concrete target, e.g. {records[bad[0]].id!r}: "
                     f"the pattern itself would be the {what}", path=str(path), line=records[bad[0]].line,
                     fix=f"run rag-curatedtrec-targets --data {path.parent} --knowledge KS_DIR, which takes each "
                         f"pattern's most frequent match in the retrieved passages as the target as the paper "
                         f"does, and train on its output")
