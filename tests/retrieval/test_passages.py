
import numpy as np
import pytest

from rag_plugin.retrieval.passages import Passage, PassageStore, read_passages, split_passage
from rag_plugin.util.errors import UserError
from tests.conftest import write_jsonl


def test_reads_dpr_tsv_layout(tmp_path):
    f = tmp_path / "psgs.tsv"
    f.write_text('id\ttext\ttitle\n1\t"Aaron is a ""prophet""."\tAaron\n2\tSecond text\tB\n', encoding="utf-8")
    got = list(read_passages(str(f)))
    assert got == [Passage("1", "Aaron", 'Aaron is a "prophet".'), Passage("2", "B", "Second text")]


def test_reads_jsonl(tmp_path):
    f = write_jsonl(tmp_path / "p.jsonl", [{"id": 7, "title": "T", "text": "x y"}])
    assert list(read_passages(str(f))) == [Passage("7", "T", "x y")]


def test_split_words_makes_100_word_passages():
    p = Passage("d", "T", " ".join(str(i) for i in range(250)))
    parts = split_passage(p, 100)
    assert [len(x.text.split()) for x in parts] == [100, 100, 50]
    assert [x.id for x in parts] == ["d_0", "d_1", "d_2"]
    assert " ".join(x.text for x in parts) == p.text


@pytest.mark.parametrize("content, line, what", [
    ("id\ttext\ttitle\n1\tonly two\n", 2, "3 tab-separated columns"),
    ("id\ttext\n1\tx\n", 1, "header"),
    ("id\ttext\ttitle\n1\ta\tA\n1\tb\tB\n", None, "duplicate passage id"),
    ("id\ttext\ttitle\n", None, "no passages"),
])
def test_tsv_errors_name_file_and_line(tmp_path, content, line, what):
    f = tmp_path / "bad.tsv"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(UserError) as err:
        list(read_passages(str(f)))
    msg = err.value.render()
    assert str(f) in msg and what in msg and "\n" not in msg
    if line is not None:
        assert f"{f}:{line}:" in msg


def test_non_utf8_reports_line(tmp_path):
    f = tmp_path / "bad.tsv"
    f.write_bytes(b"id\ttext\ttitle\n1\tok\tA\n2\tbad \xff byte\tB\n")
    with pytest.raises(UserError, match=r"bad.tsv:3: not valid UTF-8"):
        list(read_passages(str(f)))


@pytest.mark.parametrize("line, what", [
    ('{"id": 1, "title": "x"}', "missing field"),
    ("not json", "invalid JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_jsonl_errors(tmp_path, line, what):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"id": 0, "title": "a", "text": "b"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=what) as err:
        list(read_passages(str(f)))
    assert f"{f}:2:" in err.value.render()


def test_missing_and_unknown_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        list(read_passages(str(tmp_path / "nope.tsv")))
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(UserError, match="unknown passages format"):
        list(read_passages(str(tmp_path / "x.csv")))


class _ToyTokenizer:
    def encode_batch(self, texts):
        return [[4 + (hash(w) % 50) for w in t.split()] for t in texts]

    def identity(self):
        return {"kind": "toy"}


def test_store_roundtrip_random_access(tmp_path):
    rows = [Passage(f"id{i}", f"Title {i} é", f"text number {i} " * (i % 5 + 1)) for i in range(1000)]
    tok = _ToyTokenizer()
    store = PassageStore.write(str(tmp_path / "store"), rows, tokenizer=tok, progress=False, batch_size=97)
    assert len(store) == 1000
    for i in (0, 1, 499, 999):
        assert store.passage(i) == rows[i]
        assert store.text_tokens(i).tolist() == tok.encode_batch([rows[i].text])[0]
        assert store.title_tokens(i).dtype == np.int32
    assert store.row_of_id("id499") == 499
    assert not (tmp_path / "store.tmp").exists()
    again = PassageStore.write(str(tmp_path / "store2"), rows, tokenizer=tok, progress=False)
    assert again.sha256 == store.sha256


def test_failed_write_leaves_nothing(tmp_path):
    def rows():
        yield Passage("a", "A", "x")
        raise UserError("boom")
    with pytest.raises(UserError):
        PassageStore.write(str(tmp_path / "store"), rows(), progress=False)
    assert not (tmp_path / "store").exists() and not (tmp_path / "store.tmp").exists()


def test_damaged_store_is_refused(tmp_path):
    PassageStore.write(str(tmp_path / "s"), [Passage("a", "A", "hello")], progress=False)
    data = tmp_path / "s" / "texts.bin"
    data.write_bytes(data.read_bytes()[:-2])
    with pytest.raises(UserError, match="damaged"):
        PassageStore(str(tmp_path / "s"))
    (tmp_path / "s" / "meta.json").write_text("{", encoding="utf-8")
    with pytest.raises(UserError, match="corrupted"):
        PassageStore(str(tmp_path / "s"))


TRICKY_TSV = (
    'id\ttext\ttitle\n'
    '1\t"Aaron is a ""prophet""."\tAaron\n'
    '2\t"A" and "B" were there\t"""Weird Al"" Yankovic"\n'     # unquoted text that begins with a quote
    '3\t"ends" and "begins"\tX\n'                              # ... and ends with one
    '4\tsaid "hi" once\tsaid "hi"\n'                           # quotes inside unquoted fields are literal
    '5\t"a tab\tinside, and a\nnewline"\tTitle with "quotes"\n'  # a quoted field holds a tab and a newline
    '"6"\t"x"y\t\n'                                             # a quoted id; text after a closing quote; no title
    '7\t"""quoted"" start"\t"T"\r\n'                           # CRLF line end
)


def test_tsv_columns_follow_dprs_csv_reading(tmp_path):
    """Every column is read as DPR reads psgs_w100.tsv: csv.reader(f, delimiter="\\t") is the reference."""
    import csv

    f = tmp_path / "psgs.tsv"
    f.write_bytes(TRICKY_TSV.encode("utf-8"))
    with open(f, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))[1:]
    expected = [Passage(pid.strip(), title, text) for pid, text, title in rows]
    assert len(expected) == 7
    assert list(read_passages(str(f))) == expected
    assert expected[1] == Passage("2", '"Weird Al" Yankovic', 'A and "B" were there')
    # a row after a row that runs over two lines still names its own line
    f.write_bytes((TRICKY_TSV + "8\tonly two\n").encode("utf-8"))
    with pytest.raises(UserError, match="3 tab-separated columns") as err:
        list(read_passages(str(f)))
    assert f"{f}:10:" in err.value.render()


def test_tsv_unbalanced_quote_names_the_row_it_starts_on(tmp_path):
    f = tmp_path / "psgs.tsv"
    f.write_text('id\ttext\ttitle\n1\tok\tA\n2\t"never closed\tB\n3\tthree\tC\n', encoding="utf-8")
    with pytest.raises(UserError) as err:
        list(read_passages(str(f)))
    msg = err.value.render()
    assert f"{f}:3:" in msg and "lines 3-4" in msg and "\n" not in msg and msg.endswith(")")


def test_same_file_twice_is_a_duplicate_id(tmp_path):
    from rag_plugin.retrieval.passages import read_collection

    f = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "title": "A", "text": "x"},
                                           {"id": "b", "title": "B", "text": "y"}])
    with pytest.raises(UserError, match="duplicate passage id 'a'") as err:
        list(read_collection([str(f), str(f)]))
    assert f"{f}:1:" in err.value.render() and "given twice" in err.value.render()
    g = write_jsonl(tmp_path / "d.jsonl", [{"id": "z", "title": "Z", "text": "w"},
                                           {"id": "b", "title": "B", "text": "y"}])
    with pytest.raises(UserError, match="duplicate passage id 'b'") as err:
        list(read_collection([str(f), str(g)]))
    assert f"{g}:2:" in err.value.render() and str(f) in err.value.render()


def test_gzip_compressed_passage_files_read_as_the_plain_ones(tmp_path):
    """psgs_w100.tsv.gz and .jsonl.gz (as downloaded) give the passages of the decompressed files;
    errors still name the file and line; a damaged gzip file is one line."""
    import gzip

    tsv = tmp_path / "psgs_w100.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"Aaron is a ""prophet""."\tAaron\n2\tSecond text\tB\n3\t'
                   + " ".join(f"w{i}" for i in range(250)) + "\tLong\n", encoding="utf-8")
    jsonl = write_jsonl(tmp_path / "more.jsonl", [{"id": "j1", "title": "T", "text": "x y"},
                                                  {"id": "j2", "title": "U", "text": "z"}])
    packed = []
    for f in (tsv, jsonl):
        gz = f.with_name(f.name + ".gz")
        gz.write_bytes(gzip.compress(f.read_bytes()))
        packed.append(gz)
        assert list(read_passages(str(gz), split_words=100)) == list(read_passages(str(f), split_words=100))
    from rag_plugin.retrieval.passages import read_collection

    assert list(read_collection([str(p) for p in packed])) == list(read_collection([str(tsv), str(jsonl)]))
    assert len(list(read_passages(str(packed[0]), split_words=100))) == 2 + 3
    bad = tmp_path / "bad.tsv.gz"
    bad.write_bytes(gzip.compress(b"id\ttext\ttitle\n1\tok\tA\n2\tbad \xff byte\tB\n"))
    with pytest.raises(UserError, match=r"bad.tsv.gz:3: not valid UTF-8"):
        list(read_passages(str(bad)))
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(packed[1].read_bytes()[:-12])  # truncated download
    with pytest.raises(UserError, match="not a readable gzip file") as err:
        list(read_passages(str(broken)))
    assert "\n" not in err.value.render() and str(broken) in err.value.render()
    (tmp_path / "fake.tsv.gz").write_bytes(tsv.read_bytes())  # named .gz, not compressed
    with pytest.raises(UserError, match="not a readable gzip file"):
        list(read_passages(str(tmp_path / "fake.tsv.gz")))
