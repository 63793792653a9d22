"""TriviaQA's own JSON (``unfiltered-web-train.json``: ``{"Data": [{"QuestionId", "Question",
"Answer": {"Value", "Aliases", ...}}, ...]}``), streamed, and the questions KILT's TriviaQA
leaves out, filled in from it by ``QuestionId``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

from rag_plugin.datasets.inputs import progress as with_progress
from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.datasets.kilt_records import KILT_FIX, Lookup, kilt_fields
from rag_plugin.datasets.writer import clean_answers
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import PathLike, iter_jsonl

TRIVIAQA_FIX = 'expected TriviaQA JSON: {"Data": [{"QuestionId": ..., "Question": ..., "Answer": {...}}, ...]}'


def iter_triviaqa(path: PathLike) -> Iterator[Tuple[int, dict]]:
    """TriviaQA's JSON (``{"Data": [{"QuestionId", "Question", "Answer": {...}}, ...], ...}``),
    streamed; yields ``(line, element)``."""
    with JsonStream(path) as js:
        if js.peek() != "{":
            raise js.error("not a JSON object", fix=TRIVIAQA_FIX)
        found = False
        for _, key in js.iter_object():
            if key != "Data":
                js.value()
                continue
            found = True
            if js.peek() != "[":
                raise js.error("'Data' is not a list", fix=TRIVIAQA_FIX)
            for line, q in js.iter_array():
                if not isinstance(q, dict) or "QuestionId" not in q:
                    raise UserError("element lacks 'QuestionId'", path=str(path), line=line, fix=TRIVIAQA_FIX)
                yield line, q
        if not found:
            raise UserError("no 'Data' list", path=str(path), fix=TRIVIAQA_FIX)


def triviaqa_answers(q: dict) -> List[str]:
    """``Answer.Value`` then ``Answer.Aliases`` (NormalizedAliases are lower-cased duplicates)."""
    ans = q.get("Answer") or {}
    if not isinstance(ans, dict):
        return []
    return clean_answers([ans.get("Value")] + list(ans.get("Aliases") or []))


def load_triviaqa_lookup(files: Sequence[PathLike], wanted: set, progress: bool = False) -> Lookup:
    """QuestionId -> (question, answers) for the ``wanted`` ids, streaming TriviaQA files."""
    found: Lookup = {}
    for f in files:
        for _, q in with_progress(iter_triviaqa(f), f"read {Path(f).name}", progress):
            qid = str(q["QuestionId"])
            if qid in wanted and qid not in found:
                found[qid] = ((q.get("Question") or "").strip(), triviaqa_answers(q))
    return found


def _kilt_records(kilt_files: Sequence[PathLike]) -> Iterator[Tuple[PathLike, int, str, str, List[str]]]:
    for path in kilt_files:
        for line, obj in iter_jsonl(path, fix=KILT_FIX):
            rid, question, answers, _ = kilt_fields(obj, path, line)
            yield path, line, rid, question, answers


def kilt_triviaqa_lookup(kilt_files: Sequence[PathLike], triviaqa_questions: Sequence[PathLike],
                         progress: bool = False) -> Lookup:
    """What KILT's TriviaQA records lack (every question; some answers), looked up by id in
    TriviaQA's own files. A record left without a question is a one-line error naming its file,
    line and a few ids, and saying which files to pass."""
    wanted: Dict[str, Tuple[PathLike, int]] = {}
    for path, line, rid, question, answers in _kilt_records(kilt_files):
        if not question or not clean_answers(answers):
            wanted.setdefault(rid, (path, line))
    if not wanted:
        return {}
    lookup = load_triviaqa_lookup(triviaqa_questions, set(wanted), progress) if triviaqa_questions else {}
    need_question: Dict[str, Tuple[PathLike, int]] = {}
    for path, line, rid, question, _ in _kilt_records(kilt_files):
        if not question and not (lookup.get(rid) or ("",))[0]:
            need_question.setdefault(rid, (path, line))
    if need_question:
        raise _missing_questions_error(need_question, bool(triviaqa_questions))
    return lookup


def _missing_questions_error(need_question: Dict[str, Tuple[PathLike, int]], had_files: bool) -> UserError:
    path0, line0 = next(iter(need_question.values()))
    examples = ", ".join(list(need_question)[:5])
    if not had_files:
        return UserError(f"{len(need_question)} records have no question ('input'), e.g. ids {examples}",
                         path=str(path0), line=line0,
                         fix="KILT ships TriviaQA without questions: pass --triviaqa-questions "
                             "unfiltered-web-train.json unfiltered-web-dev.json (TriviaQA) to fill "
                             "them in by QuestionId")
    return UserError(f"{len(need_question)} records have no question and their ids are not in "
                     f"--triviaqa-questions, e.g. ids {examples}", path=str(path0), line=line0,
                     fix="pass the TriviaQA file(s) holding these QuestionIds (unfiltered-web-train.json "
                         "for KILT train, unfiltered-web-dev.json for KILT dev)")
