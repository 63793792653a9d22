"""rag_plugin.retrieval.encoders.registry: spec parsing, one-line errors, the loader registry; and the
encoders stay fairseq-free."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_plugin.retrieval.encoders import (
    build_random_encoder,
    load_encoder,
    register_encoder,
    registered_kinds,
    registry,
)
from rag_plugin.retrieval.encoders.registry import parse_spec
from rag_plugin.util.errors import UserError


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty"),
    ("bert-base", "unknown encoder spec"),
    ("hf-dpr", "needs a folder"),
    ("hf-dpr:/no/such/dir", "/no/such/dir"),
    ("dpr:/no/such/file.cp", "/no/such/file.cp"),
    ("minilm:/no/such/minilm", "/no/such/minilm"),
    ("random:dim=abc", "integer"),
    ("random:dim=32,layers=1,heads=5", "multiple"),
    ("random:dim=32,layers=1,heads=4,colour=red", "unknown option"),
    ("random:dim=32,layers=1,heads=4,vocab=/no/such/vocab.txt", "/no/such/vocab.txt"),
    ("random:dim=32,layers=1,heads=4,pooling=max", "pooling"),
    ("random:dim=32,layers=1,heads=4,max_length=1000", "max_length"),
    ("random:dim=32,layers=1,heads=4,shared=maybe", "0 or 1"),
    ("random:dim=0,layers=1,heads=4", "positive"),
    ("random:oops,dim=32", "unexpected 'oops'"),
    ("minilm,frobnicate=1", "unknown option"),
    ("minilm,frobnicate", "bad option"),
])
def test_bad_specs_raise_user_error(spec, fragment):
    with pytest.raises(UserError) as err:
        load_encoder(spec)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_parse_spec():
    assert parse_spec("minilm") == ("minilm", "", {})
    assert parse_spec(" MiniLM:/a/b ") == ("minilm", "/a/b", {})
    assert parse_spec("dpr:/x.cp,vocab=/v.txt,heads=12") == ("dpr", "/x.cp", {"vocab": "/v.txt", "heads": "12"})
    assert parse_spec("random:dim=8,layers=1") == ("random", "", {"dim": "8", "layers": "1"})
    assert parse_spec("random,dim=8") == ("random", "", {"dim": "8"})


def test_unknown_kind_names_the_registered_kinds():
    assert registered_kinds() == ("dpr", "hf-dpr", "minilm", "random")
    with pytest.raises(UserError) as err:
        load_encoder("bert:/models/bert")
    message = str(err.value)
    assert "\n" not in message
    assert "the kinds are dpr, hf-dpr, minilm, random" in message
    assert "dpr:CKPT[,vocab=FILE]" in message and "hf-dpr:DIR" in message


def test_a_new_family_is_one_decorated_loader(vocab_file, monkeypatch):
    monkeypatch.setattr(registry, "_LOADERS", dict(registry._LOADERS))

    @register_encoder("tiny", usage="tiny[,seed=N]")
    def load_tiny(arg, options):
        seed = options.integer("seed", 0)
        options.done("seed")
        return build_random_encoder(dim=8, layers=1, heads=2, vocab=vocab_file, seed=seed,
                                    max_position=32, max_length=16)

    assert "tiny" in registered_kinds()
    encoder = load_encoder("tiny,seed=3")
    assert encoder.spec == "tiny,seed=3" and encoder.identity()["spec"] == "tiny,seed=3"
    assert encoder.identity()["weights_sha256"] == build_random_encoder(
        dim=8, layers=1, heads=2, vocab=vocab_file, seed=3, max_position=32, max_length=16).identity()["weights_sha256"]
    with pytest.raises(UserError, match=r"unknown option\(s\) colour .*allowed here: seed"):
        load_encoder("tiny,colour=red")
    with pytest.raises(ValueError, match="registered twice"):
        register_encoder("tiny", usage="tiny")(lambda arg, options: None)


def test_hf_dpr_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="model.safetensors") as err:
        load_encoder(f"hf-dpr:{tmp_path}")
    assert str(tmp_path) in str(err.value)


def test_encoders_import_no_fairseq():
    """rag_plugin.retrieval is usable without fairseq: importing the encoders (every family) in a fresh
    interpreter loads no fairseq module."""
    code = ("import sys, rag_plugin.retrieval.encoders as e; e.registered_kinds(); "
            "print(sorted(m for m in sys.modules if m == 'fairseq' or m.startswith('fairseq.')))")
    root = str(Path(__file__).resolve().parents[3])  # this checkout, ahead of any installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
