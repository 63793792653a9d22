"""fairseq-train on the tiny world with --retriever-loss and --retriever hybrid: the retriever loss and the
recall@K are logged, and each logged loss is the marginal NLL + weight x the retriever loss (both in bits:
per target token and per question); bad options are one-line errors (exit 2)."""
import re
import subprocess

import pytest

from tests.conftest import assert_one_line_error
from tests.tasks.test_training import _args, _env

W = 0.5


def _fields(line):
    """``key=value, `` (train_inner) or ``| key value`` (valid) pairs of one log line."""
    pairs = re.findall(r"(\w+)=([-\d.]+)", line) or re.findall(r"\| (\w+) ([-\d.]+)(?= \||$)", line)
    return {k: float(v) for k, v in pairs}


def _lines(log, kind):
    return [_fields(line) for line in log.splitlines() if f"| {kind} |" in line]


@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    """Two runs side by side (4 updates each, validated after the epoch): RAG-Token + pdist on dense
    retrieval, and RAG-Token + emdr2 on hybrid retrieval (rrf)."""
    jobs = {}
    for name, extra in (("pdist", ["--retriever-loss", "pdist"]),
                        ("hybrid", ["--retriever", "hybrid", "--fusion", "rrf", "--hybrid-candidates", "6",
                                    "--retriever-loss", "emdr2"])):
        tmp = tmp_path_factory.mktemp(name)
        cmd = _args(tiny_world, tmp / "ckpt", extra=["--max-epoch", "1", "--retriever-loss-weight", str(W),
                                                     "--retriever-temperature", "2", "--no-save", *extra])
        jobs[name] = subprocess.Popen(cmd, cwd=tmp, env=_env(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
    out = {}
    for name, proc in jobs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, (stdout + stderr)[-4000:]
        out[name] = stdout + stderr
    return out


@pytest.mark.parametrize("name", ["pdist", "hybrid"])
def test_retriever_loss_and_recall_are_logged(runs, name):
    log = runs[name]
    train = [f for f in _lines(log, "train_inner") if "retriever_loss" in f]
    valid = [f for f in _lines(log, "valid") if "nll_loss" in f]
    assert len(train) == 4 and len(valid) == 1, log[-3000:]     # 30 questions in batches of 8
    for f in train + valid:
        assert f["retriever_loss"] > 0
        # loss = (sum nll + W x ntokens/nsentences x sum r) / ntokens, in bits: nll_loss + W x retriever_loss
        assert f["loss"] == pytest.approx(f["nll_loss"] + W * f["retriever_loss"], abs=2.5e-3)
    assert 0.0 <= valid[0]["recall_at_3"] <= 1.0
    # 5 valid questions: the recall is a count of 5
    assert round(valid[0]["recall_at_3"] * 5, 3) == pytest.approx(round(valid[0]["recall_at_3"] * 5), abs=2e-3)


BAD = [
    (["--retriever", "hybrid", "--fusion", "weighted", "--fusion-weight", "1.5"], ["--fusion-weight 1.5 is outside"]),
    (["--retriever", "hybrid", "--fusion", "max"], ["--fusion", "max"]),
    (["--retriever-loss", "adist"], ["--retriever-loss adist", "RagTokenModel"]),
    (["--retriever", "bm25", "--retriever-loss", "pdist"], ["--retriever-loss pdist", "--retriever bm25"]),
    (["--freeze-query-encoder", "--retriever-loss", "loop"], ["--retriever-loss loop", "frozen"]),
]


def test_bad_options_are_one_line_errors(tiny_world, tmp_path):
    procs = []
    for i, (extra, needles) in enumerate(BAD):
        cmd = _args(tiny_world, tmp_path / f"ckpt{i}", extra=["--max-update", "1", *extra])
        procs.append((subprocess.Popen(cmd, cwd=tmp_path, env=_env(1), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True), needles))
    for proc, needles in procs:
        proc.stdout_text, proc.stderr = proc.communicate(timeout=300)
        assert_one_line_error(proc, *needles)
