"""Hypothesis fuzzing of the readers of user files: whatever bytes a file holds, reading it
either works (and what comes back is consistent) or raises the documented one-line
:class:`~rag_plugin.util.errors.UserError` naming the file. No other exception escapes.

* passage files (``.tsv`` in DPR's layout, ``.jsonl``) -> :func:`read_passages`, and the passage
  store written from what was read reads back the same;
* KILT-style JSONL (training data, gold files, KILT predictions) -> :func:`read_kilt`,
  :func:`read_gold`, :func:`read_kilt_guesses`; the converters' JSONL and DPR qas readers;
* fairseq-generate output files -> :func:`read_guesses` (the line parser alone is fuzzed in
  tests/evaluation/test_eval_fuzz.py; here the whole file, bytes included).

Files are built from fragments that are close to valid (right prefixes, tabs, quotes, JSON
pieces) mixed with arbitrary text and bytes that are not UTF-8, so that the checks past the
first line are reached too.
"""
import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rag_plugin.util.errors import UserError

FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)   # anything, tabs and newlines too
WORDS = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=10)
BAD_BYTES = st.sampled_from([b"\xff", b"\xc3", b"\xe9", b"\x00", b"\r", b"\xef\xbb\xbf", b"\xed\xa0\x80"])
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), TEXT)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["id", "title", "text", "input", "output", "answer",
                                                                   "provenance", "wikipedia_id", "meta", "x"]),
                                                 inner, max_size=4)), max_leaves=8)


@st.composite
def _files(draw, good, bad, base=None):
    """A file's bytes: mostly ``good`` lines (after the lines of ``base``, if given), a few
    ``bad`` ones, arbitrary text or bytes that are not UTF-8 in between; maybe no newline at the
    end, maybe cut short."""
    lines = list(draw(base)) if base is not None else []
    for _ in range(draw(st.integers(0 if base is not None else 1, 6))):
        lines.append(draw(good))
    for _ in range(draw(st.integers(0, 2))):
        noise = draw(st.one_of(bad, BAD_BYTES, TEXT))
        lines.insert(draw(st.integers(0, len(lines))), noise)
    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines)
    data += b"\n" if draw(st.booleans()) else b""
    cut = draw(st.one_of(st.just(0), st.just(0), st.integers(1, 8)))
    return data[: max(0, len(data) - cut)] if cut else data


def _written(name: str, data: bytes) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="fuzz"))
    path = directory / name
    path.write_bytes(data)
    return path


def _only_user_errors(read, path: Path):
    """``read(path)``; a UserError must be one line naming the file."""
    try:
        result = read(str(path))
    except UserError as err:
        text = err.render()
        assert "\n" not in text and text.startswith(str(path)), text
        event("one-line error")
        return None
    event("read")
    return result


# ------------------------------------------------------------------------------------ passages
PASSAGE_ID = st.one_of(st.integers(0, 40).map(str), WORDS)
TSV_ROW = st.builds(lambda i, x, t: f"{i}\t{x}\t{t}", PASSAGE_ID, st.one_of(WORDS, WORDS.map(lambda w: f'"{w}"')),
                    WORDS)
TSV_BAD = st.builds(lambda cols: "\t".join(cols), st.lists(st.one_of(TEXT, st.sampled_from(['"q"', '""', "1"])),
                                                          max_size=4))
JSONL_PASSAGE = st.builds(lambda i, t, x: json.dumps({"id": i, "title": t, "text": x}),
                          st.one_of(PASSAGE_ID, st.integers(0, 40)), st.one_of(WORDS, st.just("")), WORDS)
JSONL_BAD = st.one_of(JSON_VALUES.map(json.dumps), st.just('{"id": "1", "text": "a b"'),
                      st.builds(lambda i: json.dumps({"id": i, "text": ""}), PASSAGE_ID))


def _read_and_store(path: str):
    from rag_plugin.retrieval.passages import PassageStore, read_passages

    passages = list(read_passages(path, split_words=3))
    ids = [p.id for p in passages]
    assert passages and all(ids) and len(set(ids)) == len(ids)
    assert all(p.text.strip() or p.title.strip() for p in passages)
    store = PassageStore.write(str(Path(path).parent / "store"), passages, progress=False)
    assert [store.passage(i) for i in range(len(store))] == passages
    return passages


@FUZZ
@given(_files(TSV_ROW, st.one_of(TSV_BAD, st.just("id\ttext\ttitle"))), st.booleans())
def test_tsv_passages(data, header):
    if header:
        data = b"id\ttext\ttitle\n" + data
    _only_user_errors(_read_and_store, _written("psgs.tsv", data))


@FUZZ
@given(_files(JSONL_PASSAGE, JSONL_BAD))
def test_jsonl_passages(data):
    _only_user_errors(_read_and_store, _written("psgs.jsonl", data))


# ------------------------------------------------------------------------------------ KILT JSONL
KILT_LINE = st.builds(
    lambda i, q, answers, prov: json.dumps({"id": i, "input": q, "output": [
        {"answer": a, "provenance": [{"id": p} for p in prov]} for a in answers]}),
    st.one_of(st.integers(0, 40).map(lambda i: f"q{i}"), st.integers(0, 40)), WORDS, st.lists(WORDS, min_size=1,
                                                                                              max_size=2),
    st.lists(WORDS, max_size=2))
KILT_BAD = st.one_of(
    JSON_VALUES.map(json.dumps), st.just('{"id": "q", "input": "who?", "output": [{"answer": "x"}'),
    st.builds(lambda q, a: json.dumps({"id": "e", "input": q, "output": [{"answer": a}]}),
              st.sampled_from(["", " ", 3]), st.sampled_from(["", " ", None, 1])))


@FUZZ
@given(_files(KILT_LINE, KILT_BAD), st.booleans(), st.booleans())
def test_kilt_data(data, require_answers, allow_empty_input):
    from rag_plugin.data.kilt import read_kilt

    records = _only_user_errors(lambda p: read_kilt(p, require_answers=require_answers,
                                                    allow_empty_input=allow_empty_input),
                                _written("train.jsonl", data))
    if records is not None:
        assert records and len({r.id for r in records}) == len(records)
        assert all(isinstance(r.input, str) and (allow_empty_input or r.input.strip()) for r in records)
        assert all(isinstance(a, str) and a.strip() for r in records for a in r.answers)
        assert not require_answers or all(r.answers for r in records)


@FUZZ
@given(_files(KILT_LINE, KILT_BAD))
def test_gold_and_kilt_guesses(data):
    from rag_plugin.evaluation.readers import read_gold, read_kilt_guesses

    path = _written("gold.jsonl", data)
    gold = _only_user_errors(read_gold, path)
    if gold is not None:
        assert all(len(g.evidence_sets) >= 1 for g in gold)
    guesses = _only_user_errors(read_kilt_guesses, path)
    if guesses is not None:
        assert all(isinstance(g.retrieved, list) for g in guesses.values())


QAS_LINE = st.builds(lambda q, a: f"{q}\t{a}", WORDS, st.sampled_from(["['a', 'b']", '["x"]']))
QAS_BAD = st.builds(lambda q, a: f"{q}\t{a}", TEXT, st.sampled_from(["[1]", "'s'", "[", ""]))


@FUZZ
@given(_files(st.one_of(KILT_LINE, QAS_LINE), st.one_of(KILT_BAD, QAS_BAD)))
def test_converter_readers(data):
    from rag_plugin.datasets.dpr_qa import iter_dpr_qas
    from rag_plugin.util.io import iter_jsonl

    _only_user_errors(lambda p: list(iter_jsonl(p)), _written("in.jsonl", data))
    rows = _only_user_errors(lambda p: list(iter_dpr_qas(p)), _written("qas.csv", data))
    for _, question, answers, _ in rows or []:
        assert isinstance(question, str) and all(isinstance(a, str) for a in answers)


# ------------------------------------------------------------------------------------ fairseq-generate output
@st.composite
def _generate_blocks(draw):
    """Well-formed fairseq-generate output for examples 0-3 (H, D, P and Z lines)."""
    lines = []
    for i in draw(st.permutations(range(4))):
        hyp = draw(WORDS)
        lines += [f"S-{i}\t{draw(WORDS)}", f"H-{i}\t-0.5\t{hyp}", f"D-{i}\t-0.5\t{hyp}", f"P-{i}\t-0.2 -0.3"]
        lines += [f"Z-{i}\t{r}\t0.5\tp{r}\t{draw(WORDS)}" for r in range(draw(st.integers(0, 2)))]
    return lines


GENERATE_LINE = st.one_of(st.just("2024-01-01 00:00:00 | INFO | fairseq | x"), st.just("Generate test with beam=2"),
                          st.builds(lambda i: f"A-{i}\t0-0", st.integers(0, 3)))
GENERATE_BAD = st.builds(
    lambda kind, index, fields: f"{kind}-{index}\t" + "\t".join(fields),
    st.sampled_from("STHDPZAX"), st.one_of(st.integers(0, 5).map(str), st.just("x")),
    st.lists(st.one_of(TEXT, st.sampled_from(["-0.5", "0.3", "1.5", "nan", "0", "p1", ""])), max_size=4))


@FUZZ
@given(_files(GENERATE_LINE, GENERATE_BAD, base=_generate_blocks()), st.sampled_from(["auto", "fairseq", "kilt"]))
def test_generate_output_files(data, fmt):
    from rag_plugin.evaluation.readers import GoldExample, read_guesses

    gold = [GoldExample(f"id{i}", f"q{i}", [f"a{i}"], [[f"p{i}"]]) for i in range(4)]
    guesses = _only_user_errors(lambda p: read_guesses(p, gold, fmt), _written("gen.out", data))
    if guesses is not None:
        assert [g.id for g in guesses] == [g.id for g in gold]
        assert all(isinstance(g.answer, str) for g in guesses)
