
import numpy as np
import pytest

from rag_plugin.errors import UserError
from rag_plugin.retrieval.passages import Passage, PassageStore, read_passages, split_passage
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
    store = PassageStore.write(str(tmp_path / "s"), [Passage("a", "A", "hello")], progress=False)
    data = tmp_path / "s" / "texts.bin"
    data.write_bytes(data.read_bytes()[:-2])
    with pytest.raises(UserError, match="damaged"):
        PassageStore(str(tmp_path / "s"))
    (tmp_path / "s" / "meta.json").write_text("{", encoding="utf-8")
    with pytest.raises(UserError, match="corrupted"):
        PassageStore(str(tmp_path / "s"))
