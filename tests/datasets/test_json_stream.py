"""The streaming JSON parser of the converters (rag_plugin.datasets.json_stream)."""
import pytest

from rag_plugin.datasets.json_stream import JsonStream
from rag_plugin.util.errors import UserError
from tests.datasets.dataset_fixtures import write_json


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 16])
def test_json_stream_matches_json_load_at_any_chunk_size(tmp_path, chunk):
    doc = [{"a": 1, "b": [1.5e3, -2, True, None, "x\"y\\z"], "c": "é \u2603 " * 5},
           12345678901234567890, "tail", [], {}, {"nested": {"k": [1, {"deep": "v"}]}}, 0.25, False]
    path = write_json(tmp_path / "a.json", doc, indent=2)
    with JsonStream(path, chunk_chars=chunk) as js:
        got = [v for _, v in js.iter_array()]
    assert got == doc
    obj = {"Data": doc, "Domain": "Web", "Version": 1.0}
    path = write_json(tmp_path / "o.json", obj)
    with JsonStream(path, chunk_chars=chunk) as js:
        seen = {}
        for _, key in js.iter_object():
            seen[key] = [v for _, v in js.iter_array()] if key == "Data" else js.value()
    assert seen == obj


def test_json_stream_reports_file_and_line_of_damage(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n  {"question": "q1", "answers": ["a"]},\n  {"question": "q2", "answers": ["a"],,}\n]\n')
    with pytest.raises(UserError) as err:
        with JsonStream(path, chunk_chars=4) as js:
            list(js.iter_array())
    assert f"{path}:3:" in str(err.value) and "invalid JSON" in str(err.value)
    path.write_text('[\n  {"question": "q1", "answers": ["a"]},\n  {"question": "q2", "ans')
    with pytest.raises(UserError, match="invalid JSON"):
        with JsonStream(path, chunk_chars=4) as js:
            list(js.iter_array())
