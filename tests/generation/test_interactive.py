"""fairseq-interactive with the plugin: every question answered, and its Z- lines (the passages
retrieved for it) carry the id of its own S-/H- lines, across batches sorted by length and across
buffers (ids continue)."""
import subprocess
import sys
from pathlib import Path

import pytest

import rag_plugin
from rag_plugin.hub import RAG
from tests.generation.test_decoding import _exact_retrieval

QUESTIONS = ["What is the capital of Kakaka and of all the other places named in the list?", "Who?",
             "What is the capital of Rimilo?", "Where is the river of Tokaka found in the south?", "Capital?"]


@pytest.mark.slow
def test_interactive_z_lines_follow_their_question(tiny_world, trained, tmp_path):
    questions = tmp_path / "questions.txt"
    questions.write_text("\n".join(QUESTIONS) + "\n")
    cmd = [str(Path(sys.executable).parent / "fairseq-interactive"), str(tiny_world["data"]),
           "--user-dir", "rag_plugin",
           "--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]), "--path",
           str(trained["rag_token_tiny"]), "--n-docs", "2", "--cpu", "--beam", "1", "--max-len-b", "4",
           "--buffer-size", "3", "--batch-size", "2", "--input", str(questions)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=rag_plugin.__path__[0] + "/..", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    hyps = {int(line.split("\t")[0][2:]) for line in r.stdout.splitlines() if line.startswith("H-")}
    z = {}
    for line in r.stdout.splitlines():
        if line.startswith("Z-"):
            sid, rank, p, pid, _ = line.split("\t")
            z.setdefault(int(sid[2:]), []).append((pid, float(p)))
    assert hyps == set(z) == set(range(len(QUESTIONS)))
    rag = RAG.from_pretrained(str(trained["rag_token_tiny"]), knowledge=str(tiny_world["ks"]), n_docs=2)
    tok = rag.task.tokenizer
    as_read = [tok.decode(ids) for ids in tok.encode_batch(QUESTIONS)]  # the text after the trip through pieces
    expected = _exact_retrieval(rag, as_read, k=2)
    for sid, want in enumerate(expected):
        assert [pid for pid, _ in z[sid]] == [pid for pid, _ in want], sid
        assert [p for _, p in z[sid]] == pytest.approx([p for _, p in want], abs=2e-6)
