"""The worked example examples/own_corpus/run.py, end to end in a reduced form (40 islands, a few updates
per run): every step's files, the knowledge source holding every passage of the corpus, rag-vocab's
dictionary equal to its model's pieces, rag-choose-k's table equal to rag-evaluate run by hand for each
K, the test answers generated with the chosen K, the leaderboard with every row and "–" in the closed
book's retrieval columns; then a rerun that trains nothing. The numbers are not checked (a few updates
learn nothing); the full-size run's are in docs/findings.md."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

RUN = ROOT / "examples" / "own_corpus" / "run.py"
ISLANDS = 40
KS_TRIED = (1, 2)
REDUCED = ["--islands", ISLANDS, "--vocab-size", 500, "--pretrain-updates", 3, "--pseudo-updates", 3,
           "--updates", 3, "--batch-size", 8, "--k", *KS_TRIED]
SYSTEMS = ("closed_book", "rag_token", "rag_seq")

pytestmark = pytest.mark.slow


def python(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=900,
                          cwd=str(cwd), env=env)


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    """The reduced run, from a working directory of its own (the paths it prints are relative to it)."""
    cwd = tmp_path_factory.mktemp("own_corpus")
    proc = python(RUN, "--work", "work", *REDUCED, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return cwd / "work", proc.stdout


def commands_run(stdout):
    return [line[2:].split()[0] for line in stdout.splitlines() if line.startswith("$ ")]


def test_every_step_runs_its_console_script_and_writes_its_files(journey):
    work, stdout = journey
    assert commands_run(stdout) == (
        ["python", "rag-vocab", "rag-build-knowledge", "rag-pretrain",
         "rag-pretraining-data", "rag-train", "rag-pretraining-data", "rag-train"]   # rag-pretrain's own
        + ["rag-train"] * 3 + ["rag-choose-k"] + ["rag-generate"] * len(KS_TRIED)
        + ["rag-choose-k"] + ["rag-generate"] * len(KS_TRIED) + ["rag-generate"] * 3
        + ["rag-search", "rag-evaluate", "rag-evaluate", "rag-leaderboard"])
    expected = ["corpus/passages.jsonl", "corpus/qa/train.jsonl", "corpus/qa/valid.jsonl", "corpus/qa/test.jsonl",
                "vocab/spm.model", "vocab/dict.txt", "vocab/vocab.json", "ks/manifest.json",
                "pretrain/generator.pt", "pretrain/pretrain.json", "test/retrieval_hits.jsonl",
                "test/retrieval_scores.json", "leaderboard.md", "leaderboard.json", "summary.json"]
    expected += [f"checkpoints/{name}/checkpoint_last.pt" for name in SYSTEMS]
    expected += [f"test/{name}.txt" for name in SYSTEMS] + ["k_rag_token.json", "k_rag_seq.json"]
    expected += [f"choose_k/{name}/valid_k{k}.txt" for name in ("rag_token", "rag_seq") for k in KS_TRIED]
    missing = [path for path in expected if not (work / path).is_file() or (work / path).stat().st_size == 0]
    assert not missing
    pretrained = json.loads((work / "pretrain" / "pretrain.json").read_text())
    assert pretrained["stages"] == {"denoise": 3, "pseudo_questions": 3}
    assert os.path.samefile(work / "pretrain" / "generator.pt",
                            work / "pretrain" / "checkpoints" / "pseudo_questions" / "checkpoint_last.pt")


def test_the_knowledge_source_holds_every_passage_and_the_vocabulary(journey):
    from rag_plugin.datasets.vocab import load_spm
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    work, _ = journey
    passages = (work / "corpus" / "passages.jsonl").read_text().splitlines()
    ks = KnowledgeSource(str(work / "ks"))
    assert len(ks) == len(passages) == ISLANDS
    assert {ks.passages.id(r) for r in range(len(ks))} == {json.loads(line)["id"] for line in passages}
    sp = load_spm(work / "vocab" / "spm.model")
    pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize()) if not (sp.IsControl(i) or sp.IsUnknown(i))]
    assert (work / "vocab" / "dict.txt").read_text().splitlines() == [f"{p} 1" for p in pieces]
    assert (work / "ks" / "tokenizer" / "dict.txt").read_bytes() == (work / "vocab" / "dict.txt").read_bytes()


def test_choose_k_equals_rag_evaluate_run_by_hand(journey):
    work, stdout = journey
    for name in ("rag_token", "rag_seq"):
        chosen = json.loads((work / f"k_{name}.json").read_text())
        assert sorted(chosen["scores"]) == [str(k) for k in KS_TRIED] and chosen["metric"] == "em"
        for k in KS_TRIED:
            proc = python("-m", "rag_plugin.cli.evaluate", "--gold", work / "corpus" / "qa" / "valid.jsonl",
                          "--guess", work / "choose_k" / name / f"valid_k{k}.txt", "--metrics", "em,f1", cwd=work)
            assert proc.returncode == 0, proc.stderr
            assert json.loads(proc.stdout) == chosen["scores"][str(k)]
            row = f"{k:4d}  {chosen['scores'][str(k)]['em']:6.1f}  {chosen['scores'][str(k)]['f1']:6.1f}"
            assert row in stdout
        best = max(KS_TRIED, key=lambda k: (chosen["scores"][str(k)]["em"], -k))
        assert chosen["best_k"] == best and f"best K by em: {best}" in stdout


def z_lines_per_question(path):
    counts = {}
    for line in path.read_text().splitlines():
        if line.startswith("Z-"):
            qid = line.split("\t")[0]
            counts[qid] = counts.get(qid, 0) + 1
    return counts


def test_the_test_answers_use_the_chosen_k_and_the_leaderboard_has_every_row(journey):
    work, stdout = journey
    test_questions = len((work / "corpus" / "qa" / "test.jsonl").read_text().splitlines())
    for name in ("rag_token", "rag_seq"):
        k = json.loads((work / f"k_{name}.json").read_text())["best_k"]
        counts = z_lines_per_question(work / "test" / f"{name}.txt")
        assert len(counts) == test_questions and set(counts.values()) == {k}, (name, k)
    assert z_lines_per_question(work / "test" / "closed_book.txt") == {}  # closed book: no documents
    hypotheses = [line for line in (work / "test" / "closed_book.txt").read_text().splitlines()
                  if line.startswith("H-")]
    assert len(hypotheses) == test_questions
    board = json.loads((work / "leaderboard.json").read_text())["systems"]
    assert sorted(board) == sorted(SYSTEMS)  # every row (the board orders them by score)
    assert board["closed_book"]["rprec"] is None and isinstance(board["closed_book"]["em"], float)
    for name in ("rag_token", "rag_seq"):
        assert all(isinstance(board[name][m], float) for m in ("em", "f1", "rprec"))
    table = (work / "leaderboard.md").read_text()
    closed = next(line for line in table.splitlines() if line.startswith("| closed_book"))
    assert [cell.strip() for cell in closed.strip("|").split("|")][-1:] == ["–"]
    assert table in stdout
    retrieval = json.loads((work / "test" / "retrieval_scores.json").read_text())
    assert set(retrieval) == {"rprec", "recall@5"}


def test_a_rerun_trains_nothing(journey):
    work, _ = journey
    proc = python(RUN, "--work", "work", *REDUCED, cwd=work.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert commands_run(proc.stdout) == ["rag-pretrain", "rag-evaluate", "rag-leaderboard"], proc.stdout
    assert proc.stdout.count("finished before") == 2 and len(re.findall(r"done before", proc.stdout)) >= 9
