"""rag-choose-k (rag_plugin/cli/choose_k.py): the choice rule (highest metric, ties to the smaller K), the
table, the rag-generate command it runs per K, and one-line errors for bad input. The whole command on a
trained model, its table against rag-evaluate run by hand, is in tests/examples/test_own_corpus.py."""
import shlex

import pytest

from rag_plugin.cli import choose_k
from tests.cli.helpers import assert_one_line_error, run_module

MODULE = "rag_plugin.cli.choose_k"


def test_the_best_k_has_the_highest_metric_and_ties_go_to_the_smaller_k():
    scores = {1: {"em": 40.0, "f1": 50.0}, 3: {"em": 45.0, "f1": 52.0}, 5: {"em": 45.0, "f1": 60.0}}
    assert choose_k.best_k(scores, "em") == 3
    assert choose_k.best_k(scores, "f1") == 5
    assert choose_k.best_k({2: {"em": 0.0}, 1: {"em": 0.0}}, "em") == 1
    text = choose_k.table(scores, ["em", "f1"], best=3)
    rows = [line.split() for line in text.splitlines()]
    assert rows[0] == ["K", "EM", "F1"]
    assert rows[1:] == [["1", "40.0", "50.0"], ["3", "45.0", "52.0", "<-", "best"], ["5", "45.0", "60.0"]]


def test_options_after_a_double_dash_go_to_rag_generate(monkeypatch, tmp_path):
    own, extra = choose_k.split_argv(["--k", "1", "3", "--", "--beam", "4", "--rag-decoding", "thorough"])
    assert own == ["--k", "1", "3"] and extra == ["--beam", "4", "--rag-decoding", "thorough"]
    assert choose_k.split_argv(["--k", "1"]) == (["--k", "1"], [])
    ran = []
    monkeypatch.setattr(choose_k.commands, "run", lambda command, **kw: ran.append((command, kw)))
    args = choose_k.build_parser().parse_args(["--checkpoint", "c.pt", "--data", "D", "--knowledge", "KS",
                                               "--k", "3", "--beam", "2"])
    out = choose_k.generate(args, 3, tmp_path, ["--max-len-b", "24"])
    command, kw = ran[0]
    assert command.shown() == shlex.join(["rag-generate", "D", "--task", "retrieval_augmented", "--knowledge", "KS",
                                          "--path", "c.pt", "--gen-subset", "valid", "--n-docs", "3", "--beam", "2",
                                          "--batch-size", "32", "--max-len-b", "24"])
    assert out == tmp_path / "valid_k3.txt" and kw["log_file"] == tmp_path / "valid_k3.log"


@pytest.fixture()
def inputs(tiny_world, tmp_path):
    checkpoint = tmp_path / "checkpoint_last.pt"
    checkpoint.write_bytes(b"not checked before generation")
    return ["--checkpoint", checkpoint, "--data", tiny_world["data"], "--knowledge", tiny_world["ks"]]


@pytest.mark.parametrize("change, fragments", [
    ({"--k": ["41"]}, ["--k 41", "40 passages"]),
    ({"--k": ["0", "3"]}, ["--k 0", "at least 1"]),
    ({"--metric": "rprec"}, ["--metric rprec", "answer metric"]),
    ({"--metric": "exact"}, ["unknown metric 'exact'"]),
    ({"--subset": "dev"}, ["dev.jsonl", "no dev split"]),
    ({"--subset": "test"}, ["--subset test", "valid set"]),
    ({"--checkpoint": "missing.pt"}, ["missing.pt", "checkpoint not found"]),
    ({"--knowledge": "no_ks"}, ["no_ks", "knowledge source"]),
    ({"--beam": "0"}, ["--beam"]),
    ({"--k": ["three"]}, ["--k", "invalid int value"]),
])
def test_bad_inputs_are_one_line(inputs, change, fragments):
    options = dict(zip(inputs[::2], inputs[1::2]))
    options.setdefault("--k", ["1", "3"])
    options.update(change)
    argv = [a for key, value in options.items() for a in [key, *(value if isinstance(value, list) else [value])]]
    assert_one_line_error(run_module(MODULE, *argv), *fragments)


def test_help_shows_the_defaults():
    proc = run_module(MODULE, "--help")
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0 and "(default: em)" in text and "(default: valid)" in text
