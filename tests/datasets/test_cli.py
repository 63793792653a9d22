"""The command lines of the datasets package: rag-prepare (rag_plugin.cli.prepare) and
rag-pretraining-data (rag_plugin.cli.pretraining_data), as their console scripts and modules."""
import json
import subprocess
import sys
from pathlib import Path

from rag_plugin.datasets.denoising import denoising_records, pseudo_question_records
from tests.datasets.dataset_fixtures import REPO, assert_one_line_error, read_jsonl, run_prepare

DATASETS = ("nq", "triviaqa", "webquestions", "curatedtrec", "msmarco", "jeopardy", "fever")


def _module(name, *args):
    return subprocess.run([sys.executable, "-m", f"rag_plugin.cli.{name}", *map(str, args)], capture_output=True,
                          text=True, cwd=str(REPO), timeout=120)


def test_prepare_help_lists_every_dataset_and_shows_defaults():
    proc = _module("prepare", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "usage: rag-prepare [-h] DATASET ..." in proc.stdout
    for dataset in DATASETS:
        assert f"\n    {dataset}" in proc.stdout
    proc = _module("prepare", "nq", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "held out for validation (default: 0.1)" in text and "seed of every random split (default: 0)" in text
    assert "input layout (auto: detect per file) (default: auto)" in text
    assert "--triviaqa-questions" not in text
    text = " ".join(_module("prepare", "triviaqa", "--help").stdout.split())
    assert "--triviaqa-questions FILE [FILE ...]" in text
    text = " ".join(_module("prepare", "msmarco", "--help").stdout.split())
    assert "--use-well-formed, --no-use-well-formed" in text and "(default: True)" in text
    text = " ".join(_module("prepare", "jeopardy", "--help").stdout.split())
    assert "records or fraction for test (default: 0.2)" in text


def test_prepare_usage_errors_are_one_line():
    assert_one_line_error(run_prepare("nqq", "--out", "x"), "invalid choice: 'nqq' (did you mean nq?)",
                          "see rag-prepare --help")
    assert_one_line_error(_module("prepare"), "the following arguments are required: DATASET")
    assert_one_line_error(run_prepare("fever", "--train", "x.jsonl"), "the following arguments are required: --out",
                          "see rag-prepare fever --help")
    assert_one_line_error(run_prepare("psgs_w100", "--passages", "psgs_w100.tsv"),
                          "psgs_w100 with DPR's precomputed vectors is imported by rag-import-knowledge",
                          "rag-import-knowledge --passages psgs_w100.tsv.gz --vectors")


def test_pretraining_data_writes_the_records_of_the_library(tiny_world, tmp_path):
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    store = KnowledgeSource(str(tiny_world["ks"])).passages
    passages = [store.passage(r) for r in range(len(store))]
    for objective, records in (("denoise", denoising_records(passages, 5, 12)),
                               ("pseudo-questions", pseudo_question_records(passages, 5))):
        out = tmp_path / objective
        proc = subprocess.run([str(Path(sys.executable).parent / "rag-pretraining-data"), "--knowledge",
                               tiny_world["ks"], "--out", out, "--objective", objective, "--valid", "3",
                               "--seed", "5", "--max-words", "12"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"{out}: {len(records) - 3} train, 3 valid records"
        assert read_jsonl(out / "valid.jsonl") == json.loads(json.dumps(records[:3]))
        assert read_jsonl(out / "train.jsonl") == json.loads(json.dumps(records[3:]))
    proc = _module("pretraining_data", "--knowledge", tiny_world["ks"], "--out", tmp_path / "x", "--valid", "100000")
    assert_one_line_error(proc, "usable passages for 100000 validation records", "lower --valid")
