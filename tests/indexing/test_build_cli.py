"""rag-build-knowledge and rag-import-knowledge command lines (rag_plugin/cli/build_knowledge.py,
import_knowledge.py), run as their console scripts and modules: the same knowledge source as the library
call, --help shows the defaults, usage errors are one line."""
import gzip
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from tests.conftest import ROOT, synthetic_passages, write_jsonl

SPEC = "random:dim=32,layers=1,heads=2,intermediate=64,seed=0"


def _run(*args):
    """``python ARGS`` (``-m MODULE ...``), or the console script ``args[0]`` when it is a path."""
    argv = list(map(str, args)) if os.path.isabs(str(args[0])) else [sys.executable, *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_build_cli_on_a_gzipped_collection_equals_the_library_build(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(30))
    gz = tmp_path / "p.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    proc = _run(Path(sys.executable).parent / "rag-build-knowledge", "--passages", gz, "--out", tmp_path / "cli",
                "--encoder", SPEC, "--split-words", 6, "--shard-size", 7, "--quiet")
    assert proc.returncode == 0, proc.stderr
    lib = build_knowledge_source(str(tmp_path / "lib"), BuildSettings(passages=str(src), encoder=SPEC, split_words=6),
                                 BuildOptions(progress=False, log=lambda m: None))
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    cli = KnowledgeSource(str(tmp_path / "cli"))
    assert len(cli) == len(lib) > 30 and cli.passages.sha256 == lib.passages.sha256
    np.testing.assert_allclose(np.asarray(cli.vectors), np.asarray(lib.vectors), rtol=1e-5, atol=1e-6)
    assert cli.manifest["build_settings"]["split_words"] == 6 and cli.manifest["encoder_spec"] == SPEC


@pytest.mark.parametrize("module, defaults", [
    ("rag_plugin.cli.build_knowledge", ["(default: minilm)", "(default: Flat)", "(default: 2048)"]),
    ("rag_plugin.cli.import_knowledge", ["(default: Flat)", "(default: 65536)", "(default: 100000)"]),
])
def test_help_shows_defaults_and_usage_errors_are_one_line(module, defaults):
    proc = _run("-m", module, "--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and all(d in text for d in defaults), proc.stdout
    proc = _run("-m", module, "--shard-size", "many")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: ")
    assert "Traceback" not in proc.stderr
