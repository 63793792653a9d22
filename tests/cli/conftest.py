"""Fixtures of tests/cli: the worked example's generated island corpus (examples/own_corpus/make_corpus.py),
small, and a tiny world with a knowledge source built by a random encoder (tests/tiny_world.py)."""
import importlib.util

import pytest

from tests.conftest import ROOT


def load_make_corpus():
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "examples" / "own_corpus" / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def island_corpus(tmp_path_factory):
    """examples/own_corpus/make_corpus.py --islands 40: passages.jsonl and qa/{train,valid,test}.jsonl."""
    out = tmp_path_factory.mktemp("islands")
    assert load_make_corpus().main(["--out", str(out), "--islands", "40"]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    from tests.tiny_world import make_world

    return make_world(tmp_path_factory.mktemp("tiny_world"))
