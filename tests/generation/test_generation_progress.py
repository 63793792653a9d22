"""Generation logs its progress (issue 25, item 5) and a closed-book checkpoint generates without
--n-docs 0 (item 6): the task takes K from the checkpoint when --n-docs is not given."""
import os
import subprocess
import sys
from pathlib import Path

from rag_plugin.generation.progress import GenerationProgress

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_progress_lines_by_the_clock():
    now = [0.0]
    progress = GenerationProgress(interval=30, expected=100, clock=lambda: now[0])
    assert progress.update(10) is None                       # the first batch starts the clock
    now[0] = 20.0
    assert progress.update(10) is None                       # 20 s < 30 s
    now[0] = 40.0
    assert progress.update(20) == "generated 40/100 questions (1.00 s/question, about 60 s left)"
    now[0] = 41.0
    assert progress.update(60) == "generated 100/100 questions (0.41 s/question)"   # the last batch always
    assert GenerationProgress(interval=-1, expected=5).update(5) is None
    assert GenerationProgress(interval=0).update(3).startswith("generated 3 questions")


def _run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_closed_book_checkpoint_generates_without_n_docs(tiny_world, tmp_path):
    common = ["--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]), "--cpu", "--num-workers", "0",
              "--user-dir", str(ROOT / "rag_plugin")]
    train = _run([str(BIN / "fairseq-train"), str(tiny_world["data"]), *common, "--arch", "rag_token_tiny",
                  "--criterion", "marginal_nll", "--n-docs", "0", "--optimizer", "adam", "--lr", "1e-3",
                  "--batch-size", "8", "--max-update", "2", "--save-dir", str(tmp_path / "cb"), "--no-progress-bar",
                  "--disable-validation", "--no-epoch-checkpoints"], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    gen = _run([str(BIN / "fairseq-generate"), str(tiny_world["data"]), *common, "--path",
                str(tmp_path / "cb" / "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "1",
                "--batch-size", "2", "--progress-interval", "0"], tmp_path)
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert "--n-docs 0: as the checkpoint was trained" in gen.stderr
    assert sum(line.startswith("H-") for line in gen.stdout.splitlines()) == 5
    assert not any(line.startswith("Z-") for line in gen.stdout.splitlines())      # closed book: no documents
    assert "generated 2/5 questions" in gen.stderr and "generated 5/5 questions" in gen.stderr
