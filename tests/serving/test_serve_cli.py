"""rag-serve's command line refuses bad options with one line (``error: ...``, exit 2) before it loads anything: no
server starts, so these are fast. (A port in use is found after the model loads: tests/serving/test_endpoints.py.)"""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error
from tests.serving.live import ROOT

RAG_SERVE = str(Path(sys.executable).parent / "rag-serve")


def rag_serve(*args, timeout: float = 120.0):
    return subprocess.run([RAG_SERVE, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_path_is_required():
    assert_one_line_error(rag_serve(), "--path", "required")


@pytest.mark.parametrize("where", ["missing.pt", "."])
def test_checkpoint_not_found(tmp_path, where):
    path = tmp_path / where
    assert_one_line_error(rag_serve("--path", path), "checkpoint not found", str(path))


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    path.write_text("not a checkpoint\n")
    assert_one_line_error(rag_serve("--path", path), str(path), "checkpoint")


BAD_OPTIONS = [
    (["--max-batch", "0"], ["--max-batch must be at least 1", "got 0"]),
    (["--workers", "0"], ["--workers must be at least 1"]),
    (["--max-k", "-1"], ["--max-k must be at least 1"]),
    (["--max-pending", "0"], ["--max-pending"]),
    (["--max-question-chars", "0"], ["--max-question-chars"]),
    (["--max-queries", "0"], ["--max-queries"]),
    (["--max-beam", "0"], ["--max-beam"]),
    (["--max-len", "0"], ["--max-len"]),
    (["--port", "70000"], ["--port 70000", "0..65535"]),
    (["--port", "-1"], ["--port -1"]),
    (["--port", "http"], ["--port", "invalid int value"]),
    (["--timeout", "0"], ["--timeout"]),
    (["--max-wait-ms", "-1"], ["--max-wait-ms"]),
    (["--admin-token", "short"], ["--admin-token", "8 characters"]),
    (["--n-docs", "0"], ["--n-docs must be at least 1"]),
    (["--log-level", "loud"], ["--log-level", "loud"]),
    (["--reload-stamp", "x"], ["unrecognized arguments", "--reload-stamp"]),  # internal: set for --workers only
]


@pytest.mark.parametrize("args,needles", BAD_OPTIONS, ids=[" ".join(args) for args, _ in BAD_OPTIONS])
def test_bad_option(tmp_path, args, needles):
    """Each refused before the checkpoint is read (it does not exist: that would be another error)."""
    assert_one_line_error(rag_serve("--path", tmp_path / "checkpoint_best.pt", *args), *needles)


def test_n_docs_is_an_integer_option(tmp_path):
    """--n-docs 2 passes the option checks (then the missing checkpoint is the error)."""
    path = tmp_path / "checkpoint_best.pt"
    assert_one_line_error(rag_serve("--path", path, "--n-docs", "2"), "checkpoint not found")


def test_help_lists_the_options():
    proc = rag_serve("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--path", "--host", "--port", "--workers", "--timeout", "--max-pending", "--admin-token",
                   "--cors-origin", "--max-question-chars"):
        assert option in proc.stdout
    assert "--reload-stamp" not in proc.stdout
