"""The layouts an open-domain QA file comes in, how each is told apart, and its records.

Every layout yields rows ``(line, id, question, answers, provenance, meta)``:

=============  ===============================================================================
``dpr-qas``    DPR's qas TSV (``nq-test.csv``: ``question<TAB>['answer', ...]``), :mod:`.dpr_qa`
``dpr-json``   DPR's retriever JSON (``nq-train.json``), :mod:`.dpr_qa`
``kilt``       KILT JSONL (``nq-dev-kilt.jsonl``: ``{"id", "input", "output": [...]}``)
``qa-jsonl``   ``{"question", "answer": [...]}`` lines without ids: NQ-open's own files
               (``NQ-open.train.jsonl``, ``NQ-open.efficientqa.test.1.1.jsonl``) and DrQA's
               (``CuratedTrec-train.txt``, ``WebQuestions-test.txt``)
``sempre``     WebQuestions as released with SEMPRE (``webquestions.examples.train.json``:
               ``[{"url", "targetValue": "(list (description ...))", "utterance"}]``)
``triviaqa``   TriviaQA's own JSON (``unfiltered-web-dev.json``), :mod:`.triviaqa`
=============  ===============================================================================

Records without an id of their own are named ``<dataset>-<official split>-<index>`` (index =
position in the file, from 0), the same scheme for every id-less layout.
"""
from __future__ import annotations

import re
from typing import Iterator, List

from rag_plugin.datasets.dpr_qa import iter_dpr_json, iter_dpr_qas
from rag_plugin.datasets.inputs import first_record, layout_error, sniff_format
from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.datasets.kilt_records import Lookup, Row, kilt_rows
from rag_plugin.datasets.triviaqa import iter_triviaqa, triviaqa_answers
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl

QA_FORMATS = ("auto", "dpr-qas", "dpr-json", "kilt", "qa-jsonl", "sempre", "triviaqa")
#: What each layout looks like to a user, for the error on a file in none of them.
ACCEPTED = ("DPR qas .csv/.tsv", "DPR retriever .json", "KILT .jsonl", "NQ-open .jsonl",
            "DrQA .txt (JSON lines)", "WebQuestions SEMPRE .json", "TriviaQA .json")

QA_JSONL_FIX = 'expected one {"question": ..., "answer": [...]} per line (NQ-open, DrQA)'
SEMPRE_FIX = 'expected WebQuestions JSON: [{"utterance": ..., "targetValue": "(list (description ...))"}, ...]'



# ---------------------------------------------------------------------------------- detection
def detect_qa_format(path: PathLike, what: str) -> str:
    """The layout of one open-QA input file, from its name and its first record; a file in none
    of the layouts is a one-line error naming ``what`` (e.g. ``NQ``) and the layouts accepted."""
    kind = sniff_format(path)
    if kind == "csv":
        return "dpr-qas"
    if kind == "triviaqa":
        return "triviaqa"
    if kind in ("json-list", "jsonl"):
        first = first_record(path, kind)
        if first is None or not isinstance(first, dict):
            return "dpr-json" if kind == "json-list" else "kilt"  # empty: the split-is-empty error says so
        if kind == "json-list":
            if "utterance" in first and "targetValue" in first:
                return "sempre"
            if "question" in first:
                return "dpr-json"
        elif "question" in first and ("answer" in first or "answers" in first):
            return "qa-jsonl"
        elif {"id", "input", "output"} & set(first):
            return "kilt"
    raise layout_error(path, what, ACCEPTED, fix="is this the right file? --format names the layout if it is")


# ---------------------------------------------------------------------------------- NQ-open, DrQA
def qa_jsonl_rows(path: PathLike, prefix: str) -> Iterator[Row]:
    """``{"question": str, "answer": [str, ...]}`` per line (``answers`` and a single string are
    read too); a record's own ``id`` is kept, else it is ``<prefix>-<index>``."""
    for i, (line, obj) in enumerate(iter_jsonl(path, fix=QA_JSONL_FIX)):
        question = obj.get("question")
        answers = obj.get("answer", obj.get("answers"))
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not isinstance(answers, list) \
                or not all(isinstance(a, str) for a in answers):
            raise UserError("'question' must be a string and 'answer' a list of strings", path=str(path),
                            line=line, fix=QA_JSONL_FIX)
        rid = str(obj["id"]) if obj.get("id") is not None else f"{prefix}-{i}"
        yield line, rid, question.strip(), answers, [], None


# ---------------------------------------------------------------------------------- SEMPRE (WebQuestions)
_DESCRIPTION = re.compile(r'\(description\s+(?:"((?:[^"\\]|\\.)*)"|([^\s()"]+))\s*\)')
_ESCAPE = re.compile(r"\\(.)")


def parse_target_value(text, path: PathLike, line: int) -> List[str]:
    """SEMPRE's ``targetValue`` -> answers: ``(list (description "Jazmine Grace Grimaldi")
    (description Rabat))`` -> ``["Jazmine Grace Grimaldi", "Rabat"]`` (quoted descriptions
    unescaped, unquoted ones taken as they are)."""
    s = text.strip() if isinstance(text, str) else ""
    if not (s.startswith("(list") and s.endswith(")")):
        raise UserError(f"targetValue is not a (list ...) of descriptions: {str(text)[:60]!r}", path=str(path),
                        line=line, fix=SEMPRE_FIX)
    inner, answers, at = s[len("(list"):-1], [], 0
    for m in _DESCRIPTION.finditer(inner):
        if inner[at:m.start()].strip():
            break
        answers.append(_ESCAPE.sub(r"\1", m.group(1)) if m.group(1) is not None else m.group(2))
        at = m.end()
    if inner[at:].strip():
        raise UserError(f"cannot read targetValue at {inner[at:][:40]!r}", path=str(path), line=line,
                        fix=SEMPRE_FIX)
    return answers


def sempre_rows(path: PathLike, prefix: str) -> Iterator[Row]:
    """WebQuestions' SEMPRE JSON: question = ``utterance``, answers from ``targetValue``."""
    with JsonStream(path) as js:
        if js.peek() != "[":
            raise js.error("not a JSON array", fix=SEMPRE_FIX)
        for i, (line, obj) in enumerate(js.iter_array()):
            if not isinstance(obj, dict) or not isinstance(obj.get("utterance"), str):
                raise UserError("element lacks a string 'utterance'", path=str(path), line=line, fix=SEMPRE_FIX)
            answers = parse_target_value(obj.get("targetValue"), path, line)
            meta = {"url": obj["url"]} if isinstance(obj.get("url"), str) else None
            yield line, f"{prefix}-{i}", obj["utterance"].strip(), answers, [], meta


# ---------------------------------------------------------------------------------- all layouts
def qa_rows(fmt: str, path: PathLike, prefix: str, lookup: Lookup) -> Iterator[Row]:
    """The rows of ``path`` read in layout ``fmt``; ids of id-less layouts start with ``prefix``."""
    if fmt == "dpr-qas":
        return ((line, f"{prefix}-{i}", q, a, [], {"extra_columns": extra} if extra else None)
                for i, (line, q, a, extra) in enumerate(iter_dpr_qas(path)))
    if fmt == "dpr-json":
        return ((line, f"{prefix}-{i}", q, a, p, None) for i, (line, q, a, p) in enumerate(iter_dpr_json(path)))
    if fmt == "triviaqa":
        return ((line, str(q["QuestionId"]), (q.get("Question") or "").strip(), triviaqa_answers(q), [], None)
                for line, q in iter_triviaqa(path))
    if fmt == "qa-jsonl":
        return qa_jsonl_rows(path, prefix)
    if fmt == "sempre":
        return sempre_rows(path, prefix)
    return kilt_rows(path, lookup)
