"""rag-plot-posterior (rag_plugin/cli/plot_doc_posterior.py): the paper's Figure 2 from --doc-posterior-out."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_plugin.cli import plot_doc_posterior
from rag_plugin.util.errors import UserError

REPO = Path(__file__).resolve().parents[2]
RECORD = {"sample_id": 3, "tokens": ["\u2581Hem", "ing", "way", "</s>"], "text": "Hemingway",
          "docs": [{"id": "a", "title": "A Farewell to Arms", "prior": 0.6},
                   {"id": "b", "title": "The Sun", "prior": 0.4}],
          "posterior": [[0.9, 0.5, 0.5, 0.6], [0.1, 0.5, 0.5, 0.4]]}


def _run(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(list(map(str, args)), capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("entry", ["script", "module"])
def test_plot_doc_posterior(tmp_path, entry):
    f = tmp_path / "post.jsonl"
    f.write_text(json.dumps(dict(RECORD, sample_id=1)) + "\n\n" + json.dumps(RECORD) + "\n")
    out = tmp_path / "p.png"
    command = [Path(sys.executable).parent / "rag-plot-posterior"] if entry == "script" else \
        [sys.executable, "-m", "rag_plugin.cli.plot_doc_posterior"]
    r = _run(*command, f, "--sample", "3", "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = _run(*command, f, "--sample", "9", "--out", out)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    assert "no record for sample 9" in r.stderr and "[1, 3]" in r.stderr


def test_load_record_picks_the_sample_and_names_bad_lines(tmp_path):
    f = tmp_path / "post.jsonl"
    f.write_text(json.dumps(dict(RECORD, sample_id=1)) + "\n" + json.dumps(RECORD) + "\n")
    assert plot_doc_posterior.load_record(str(f), None)["sample_id"] == 1
    assert plot_doc_posterior.load_record(str(f), 3)["text"] == "Hemingway"
    f.write_text(json.dumps(RECORD) + "\n" + json.dumps({"tokens": []}) + "\n")
    with pytest.raises(UserError) as err:
        plot_doc_posterior.load_record(str(f), None)
    assert f"{f}:2:" in str(err.value) and "not a per-token posterior record" in str(err.value)
    f.write_text(json.dumps(RECORD) + "\n{oops\n")
    with pytest.raises(UserError) as err:
        plot_doc_posterior.load_record(str(f), None)
    assert f"{f}:2:" in str(err.value) and "invalid JSON" in str(err.value)


def test_without_matplotlib_one_line_error(tmp_path, monkeypatch, capsys):
    f = tmp_path / "post.jsonl"
    f.write_text(json.dumps(RECORD) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the [plot] extra were not installed
    assert plot_doc_posterior.main([str(f), "--out", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs matplotlib" in err and "pip install -e .[plot]" in err
    assert not (tmp_path / "p.png").exists()
