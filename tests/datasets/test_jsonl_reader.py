"""The one JSONL reader (rag_plugin.util.io.iter_jsonl): line numbers, gzip, and one-line errors
naming the file and line."""
import gzip
import json

import pytest

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import iter_jsonl

ROWS = [{"id": "a", "x": [1, 2]}, {"id": "b", "text": "é \u2603"}, {"id": "c"}]


def test_objects_with_their_line_numbers_blank_lines_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\ufeff" + json.dumps(ROWS[0]) + "\n\n   \n" + json.dumps(ROWS[1]) + "\r\n" + json.dumps(ROWS[2]),
                    encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, ROWS[0]), (4, ROWS[1]), (5, ROWS[2])]
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert list(iter_jsonl(gz)) == list(iter_jsonl(path))


@pytest.mark.parametrize("content,message", [
    (b'{"id": "a"}\n{"id": "b",\n', r"in.jsonl:2: invalid JSON \(Expecting property name enclosed in double quotes, "
                                    r"column 12\) \(one object per line\)"),
    (b'{"id": "a"}\n\n[1, 2]\n', r"in.jsonl:3: line is not a JSON object \(one object per line\)"),
    (b'{"id": "a"}\n{"id": "\xff"}\n', r"in.jsonl:2: not valid UTF-8 at byte 8 of the line"),
])
def test_bad_lines_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message) as err:
        list(iter_jsonl(path, fix="one object per line"))
    assert "\n" not in str(err.value)


def test_missing_file_and_damaged_gzip(tmp_path):
    with pytest.raises(UserError, match=r"nope.jsonl: gold file not found \(check the path\)"):
        list(iter_jsonl(tmp_path / "nope.jsonl", what="gold file"))
    data = gzip.compress(("".join(json.dumps(r) + "\n" for r in ROWS * 2000)).encode())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=r"cut.jsonl.gz: not a readable gzip file \(.*\) "
                                        r"\(download it again, or pass the decompressed file\)"):
        list(iter_jsonl(cut))
