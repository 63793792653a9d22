"""The decoder-only reader as a user runs it: rag-pretraining-data --objective lm, fairseq-train --task
language_modeling --arch transformer_lm_rag_tiny (fairseq's own LM task and checkpoint), fairseq-train --arch
rag_lm_token_tiny / rag_lm_seq_tiny --generator-checkpoint THAT_CHECKPOINT (loaded as it is), fairseq-generate; and
the one-line errors: an LM checkpoint of another vocabulary, a context too short for the question, a checkpoint of the
other family."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, assert_one_line_error

BIN = Path(sys.executable).parent
COMMON = ["--cpu", "--num-workers", "0", "--no-progress-bar", "--no-epoch-checkpoints", "--optimizer", "adam",
          "--lr", "1e-3", "--batch-size", "8", "--required-batch-size-multiple", "1"]


def _run(*cmd, timeout=600):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def _rag_train(world, save, *extra):
    return _run(BIN / "fairseq-train", world["data"], "--user-dir", "rag_plugin", "--task", "retrieval_augmented",
                "--knowledge", world["ks"], "--criterion", "marginal_nll", "--n-docs", "2", "--max-update", "2",
                "--save-dir", save, "--disable-validation", "--max-source-positions", "64",
                "--max-target-positions", "32", *COMMON, *extra)


@pytest.fixture(scope="module")
def pretrained_lm(tiny_world, tmp_path_factory):
    """A fairseq transformer_lm pretrained (3 updates) on the tiny world's passages with fairseq's own task."""
    tmp = tmp_path_factory.mktemp("lm")
    r = _run(BIN / "rag-pretraining-data", "--knowledge", tiny_world["ks"], "--out", tmp / "data", "--objective",
             "lm", "--valid", "5")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp / "data").iterdir()} == {"dict.txt", "train.bin", "train.idx", "valid.bin",
                                                          "valid.idx"}
    r = _run(BIN / "fairseq-train", tmp / "data", "--user-dir", "rag_plugin", "--task", "language_modeling",
             "--arch", "transformer_lm_rag_tiny", "--sample-break-mode", "eos", "--tokens-per-sample", "128",
             "--shorten-method", "truncate", "--criterion", "cross_entropy", "--max-update", "3", "--save-dir",
             tmp / "ckpt", *COMMON)
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp / "ckpt" / "checkpoint_last.pt"


@pytest.mark.slow
@pytest.mark.parametrize("arch, decoding", [("rag_lm_token_tiny", "thorough"), ("rag_lm_seq_tiny", "thorough"),
                                            ("rag_lm_seq_tiny", "fast")])
def test_train_from_a_fairseq_lm_checkpoint_and_generate(tiny_world, pretrained_lm, tmp_path, arch, decoding):
    lm_copy = tmp_path / "lm.pt"  # removed before generating: the trained checkpoint must not need it
    lm_copy.write_bytes(pretrained_lm.read_bytes())
    r = _rag_train(tiny_world, tmp_path / "rag", "--arch", arch, "--generator-checkpoint", lm_copy)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"LM initialised from {lm_copy}" in r.stdout + r.stderr
    lm_copy.unlink()
    ckpt = tmp_path / "rag" / "checkpoint_last.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert '"decoder_layers": 4' in state["cfg"]["model"]["lm_architecture"]  # what the LM is rebuilt from
    lm = torch.load(pretrained_lm, map_location="cpu", weights_only=False)["model"]
    assert state["model"]["generator.decoder.embed_positions.weight"].shape == \
        lm["decoder.embed_positions.weight"].shape  # the checkpoint's 128 positions, not the arch's
    r = _run(BIN / "fairseq-generate", tiny_world["data"], "--user-dir", "rag_plugin", "--task",
             "retrieval_augmented", "--knowledge", tiny_world["ks"], "--path", ckpt, "--gen-subset", "test",
             "--beam", "2", "--max-len-b", "6", "--batch-size", "4", "--cpu", "--rag-decoding", decoding)
    assert r.returncode == 0, r.stderr[-3000:]
    hypotheses = [line for line in r.stdout.splitlines() if line.startswith("H-")]
    sources = [line for line in r.stdout.splitlines() if line.startswith("S-")]
    assert hypotheses and len(hypotheses) == len(sources)


def test_bad_inputs_are_one_line_errors(tiny_world, pretrained_lm, tmp_path):
    state = torch.load(pretrained_lm, map_location="cpu", weights_only=False)
    emb = state["model"]["decoder.embed_tokens.weight"]
    state["model"]["decoder.embed_tokens.weight"] = torch.cat([emb, emb[:3]])
    state["model"]["decoder.output_projection.weight"] = state["model"]["decoder.embed_tokens.weight"]
    torch.save(state, tmp_path / "other_vocab.pt")
    r = _rag_train(tiny_world, tmp_path / "a", "--arch", "rag_lm_token_tiny", "--generator-checkpoint",
                   tmp_path / "other_vocab.pt")
    assert_one_line_error(r, "another vocabulary", "other_vocab.pt")
    # found by the first batch that holds such a question (after torch's start-up warnings): its one error line
    r = _rag_train(tiny_world, tmp_path / "b", "--arch", "rag_lm_token_tiny", "--max-source-positions", "3")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "does not fit the decoder-only reader's context of 3 tokens" in last
    assert "--max-source-positions" in last
    r = _rag_train(tiny_world, tmp_path / "c", "--arch", "rag_lm_token_tiny", "--input-format", "hf")
    assert_one_line_error(r, "--input-format hf")
    r = _rag_train(tiny_world, tmp_path / "d", "--arch", "rag_lm_token_tiny", "--retriever-loss-only")
    assert_one_line_error(r, "--retriever-loss-only needs a --retriever-loss")
