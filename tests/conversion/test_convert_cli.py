"""rag-convert-hf (rag_plugin/cli/convert_hf.py) as a user runs it, and conversion as a library call.

* The command line prints nothing on stderr but its own lines (no ``INFO:fairseq...`` from
  importing fairseq), nothing on stdout, and writes what the library call writes;
* ``--help`` shows the defaults; a usage error is one line, exit status 2;
* converting in a host process changes none of its global state (no hook installed: excepthook,
  argparse, fairseq's checkpoint functions, torch's loader and allow-list, torch.distributed,
  logging, warning filters).
"""
import argparse
import json
import logging
import subprocess
import sys
import warnings
from pathlib import Path

from tests.conversion import hf_world

T = hf_world.transformers()  # skips the module without transformers (the world is made with it)

REPO = Path(__file__).resolve().parents[2]


def _convert_hf(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.convert_hf", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO))


def test_command_line_prints_only_its_own_lines(world, tmp_path):
    from rag_plugin.conversion.hf_rag import convert_hf_rag

    out = tmp_path / "converted"
    proc = _convert_hf("--hf-dir", world["sequence"]["dir"], "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wrote {out}: rag_seq, generator 2+2 layers d=32"), proc.stderr
    # the files the library call writes
    logged = []
    same = tmp_path / "library"
    convert_hf_rag(str(world["sequence"]["dir"]), str(same), log=logged.append)
    assert logged == [lines[0].replace(str(out), str(same))]
    names = sorted(str(p.relative_to(same)) for p in same.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert {"checkpoint.pt", "dict.txt", "question_encoder/model.safetensors"} < set(names)
    for name in set(names) - {"checkpoint.pt", "conversion.json"}:  # these two record their own paths
        assert (out / name).read_bytes() == (same / name).read_bytes(), name
    record = json.loads((out / "conversion.json").read_text())
    assert record["encoder_spec"] == f"hf-dpr:{out.resolve() / 'question_encoder'},max_length=128"
    assert record["architecture"] == "rag_seq" and record["input_format"]["name"] == "hf"


def test_help_and_usage_errors(tmp_path):
    proc = _convert_hf("--help")
    assert proc.returncode == 0 and "rag-convert-hf" in proc.stdout
    assert "(default: hf)" in proc.stdout and "--target-format hf" in proc.stdout
    proc = _convert_hf("--hf-dir", tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: the following arguments are required: --out")
    proc = _convert_hf("--hf-dir", tmp_path / "missing", "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not found" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def _host_state():
    import torch
    import torch.distributed
    from fairseq import checkpoint_utils

    root = logging.getLogger()
    return {
        "excepthook": sys.excepthook,
        "argparse_error": argparse.ArgumentParser.error,
        "argparse_parse_known_args": argparse.ArgumentParser.parse_known_args,
        "checkpoint_utils": {k: v for k, v in vars(checkpoint_utils).items() if callable(v)},
        "torch_load": torch.load,
        "safe_globals": list(torch.serialization.get_safe_globals()),
        "init_process_group": torch.distributed.init_process_group,
        "root_logger": (root.level, list(root.handlers)),
        "fairseq_logger": logging.getLogger("fairseq").level,
        "logging_disable": logging.root.manager.disable,
        "warnings": list(warnings.filters),
    }


def test_conversion_installs_no_hook(world, tmp_path):
    from rag_plugin.conversion.hf_rag import convert_hf_rag
    from rag_plugin.util.quiet_import import import_fairseq_quietly

    import_fairseq_quietly()
    before = _host_state()
    convert_hf_rag(str(world["token"]["dir"]), str(tmp_path / "converted"), log=lambda m: None)
    after = _host_state()
    assert after == before
