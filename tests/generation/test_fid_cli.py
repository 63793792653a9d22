"""Fusion-in-Decoder on the command line: fairseq-train --arch fid_tiny with fairseq's cross-entropy lowers the
loss; fairseq-generate writes hypotheses, Z lines and provenance with attention shares; bad input is a
one-line error (exit 2)."""
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import rag_plugin
from tests.conftest import assert_one_line_error

BIN = Path(sys.executable).parent
ROOT = Path(rag_plugin.__path__[0]).parent
#: fairseq's log lines (fairseq-generate logs in Python's default format on stderr), set aside as in test_bad_inputs
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|DEBUG) \| |(INFO|DEBUG):[\w.]+:)")


def _assert_one_line_error(proc, *needles):
    stderr = "\n".join(line for line in proc.stderr.splitlines() if not LOG_LINE.match(line))
    assert "Traceback" not in proc.stderr
    assert_one_line_error(types.SimpleNamespace(returncode=proc.returncode, stderr=stderr), *needles)
    assert not any(line.startswith(("H-", "D-")) for line in proc.stdout.splitlines())


def _run(command, world, *args):
    cmd = [str(BIN / command), str(world["data"]), "--user-dir", "rag_plugin", "--task", "retrieval_augmented",
           "--knowledge", str(world["ks"]), "--cpu", "--num-workers", "0", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


def _train(world, save: Path, *args):
    return _run("fairseq-train", world, "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8",
                "--save-dir", save, "--no-progress-bar", "--no-epoch-checkpoints", "--log-format", "json",
                "--log-interval", "100", *args)


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    save = tmp_path_factory.mktemp("fid_cli") / "fid"
    r = _train(tiny_world, save, "--arch", "fid_tiny", "--criterion", "cross_entropy", "--n-docs", "3",
               "--dropout", "0", "--max-update", "16")
    assert r.returncode == 0, r.stderr[-3000:]
    return save / "checkpoint_last.pt", r.stdout + r.stderr


def _logged(log: str, key: str):
    values = []
    for line in log.splitlines():
        if f'"{key}"' in line:
            values.append(float(json.loads(line[line.index("{"):])[key]))
    return values


def test_fairseq_train_lowers_the_loss(trained):
    """4 epochs of the tiny world's 30 questions (16 updates): the epoch's mean training loss and the valid
    loss both fall (base 2, per token)."""
    _, log = trained
    train, valid = _logged(log, "train_loss"), _logged(log, "valid_loss")
    assert len(train) == 4 and len(valid) == 4, log[-2000:]
    assert train[-1] < train[0] - 1.0
    assert valid[-1] < valid[0] - 0.5


def test_fairseq_generate_writes_hypotheses_and_provenance(tiny_world, trained, tmp_path):
    ckpt, _ = trained
    out = tmp_path / "provenance.jsonl"
    r = _run("fairseq-generate", tiny_world, "--path", ckpt, "--gen-subset", "test", "--beam", "4", "--nbest", "2",
             "--max-len-b", "8", "--batch-size", "2", "--provenance-out", out)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    n = len(tiny_world["countries"]) - 35  # the test split: the last 5 questions
    hyps = [line for line in lines if line.startswith("H-")]
    assert sorted({int(line.split("\t")[0][2:]) for line in hyps}) == list(range(n)) and len(hyps) == 2 * n
    z = {}
    for line in lines:
        if line.startswith("Z-"):
            sid, rank, p, pid, _ = line.split("\t")
            z.setdefault(int(sid[2:]), []).append((int(rank), float(p), pid))
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(rec["sample_id"] for rec in records) == list(range(n))
    for rec in records:
        passages = rec["provenance"]
        assert len(passages) == 3
        assert [(e["rank"], e["p"], e["id"]) for e in passages] == z[rec["sample_id"]]
        assert sum(e["attention"] for e in passages) == pytest.approx(1.0, abs=1e-5)
        assert all(0 < e["attention"] < 1 for e in passages)


def test_fid_with_attention_distillation_trains_its_query_encoder_and_generates(tiny_world, tmp_path):
    """--criterion reader_cross_entropy --retriever-loss adist: the retriever loss and the recall of the gold
    passages are logged, the query encoder's weights move, and the checkpoint generates (its encoder fixed)."""
    import torch

    save = tmp_path / "fid_adist"
    r = _train(tiny_world, save, "--arch", "fid_tiny", "--criterion", "reader_cross_entropy", "--n-docs", "3",
               "--retriever-loss", "adist", "--retriever-target-temperature", "0.1", "--dropout", "0",
               "--max-update", "8")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert _logged(log, "train_retriever_loss") and _logged(log, "valid_recall_at_3"), log[-2000:]
    from rag_plugin.retrieval.knowledge import KnowledgeSource
    from rag_plugin.util.safe_load import checkpoint_types_allowed

    with checkpoint_types_allowed():
        state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=True)["model"]
    marker = ".parametrizations.weight.original"
    scale = 3e-5 / 1e-3  # --query-encoder-lr-scale 0 (automatic): min(1, 3e-5 / --lr)
    initial = KnowledgeSource(str(tiny_world["ks"])).load_encoder().query_tower.state_dict()
    moved = [k for k in state if k.startswith("query_encoder.") and k.endswith(marker)
             and not torch.allclose(state[k] * scale, initial[k[len("query_encoder."):-len(marker)] + ".weight"],
                                    atol=1e-7)]
    assert moved, "the query encoder's weights moved"
    r = _run("fairseq-generate", tiny_world, "--path", save / "checkpoint_last.pt", "--gen-subset", "test",
             "--beam", "2", "--max-len-b", "8")
    assert r.returncode == 0, r.stderr[-3000:]
    assert any(line.startswith("H-") for line in r.stdout.splitlines())


@pytest.mark.parametrize("loss", ["pdist", "emdr2"])
def test_fid_with_a_likelihood_based_retriever_loss_is_an_error_on_the_command_line(tiny_world, tmp_path, loss):
    r = _train(tiny_world, tmp_path / "save", "--arch", "fid_tiny", "--criterion", "reader_cross_entropy",
               "--n-docs", "3", "--retriever-loss", loss, "--max-update", "1")
    _assert_one_line_error(r, f"--retriever-loss {loss}", "--retriever-loss adist")


def test_rag_decoding_with_fid_is_an_error(tiny_world, trained):
    """(--doc-posterior-out, RAG-Token's, is refused the same way: tests/generation/test_fid_generate.py)"""
    ckpt, _ = trained
    r = _run("fairseq-generate", tiny_world, "--path", ckpt, "--gen-subset", "test", "--rag-decoding", "fast")
    _assert_one_line_error(r, "--rag-decoding fast")


@pytest.mark.parametrize("args, needles", [
    (["--arch", "fid_tiny", "--criterion", "cross_entropy", "--n-docs", "0"], ["--n-docs 0", "fid"]),
    (["--arch", "fid_tiny", "--criterion", "marginal_nll", "--n-docs", "3"], ["--criterion marginal_nll"]),
])
def test_bad_fid_training_options_are_errors(tiny_world, tmp_path, args, needles):
    r = _train(tiny_world, tmp_path / "save", *args, "--max-update", "1")
    _assert_one_line_error(r, *needles)
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


def test_fid_checkpoint_loaded_as_rag_is_an_error(tiny_world, trained, tmp_path):
    ckpt, _ = trained
    r = _train(tiny_world, tmp_path / "save", "--arch", "rag_token_tiny", "--criterion", "marginal_nll",
               "--n-docs", "3", "--max-update", "1", "--finetune-from-model", ckpt)
    _assert_one_line_error(r, "the checkpoint is a FiD model", "--arch fid_*", "--generator-checkpoint")
