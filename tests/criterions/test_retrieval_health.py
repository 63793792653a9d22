"""The retrieval-collapse warning and the query encoder's automatic learning-rate scale."""
import logging

import torch

from rag_plugin.criterions.retrieval_health import CollapseMonitor, top1_shared


def test_top1_shared_counts_the_most_common_top_passage():
    rows = torch.tensor([[7, 1], [7, 2], [3, 7], [7, 9], [5, 5]])   # top-1 passages 7, 7, 3, 7, 5
    assert top1_shared(rows) == 3
    assert top1_shared(torch.tensor([[1, 2]])) == 0                   # one question: nothing to share
    assert top1_shared(None) == 0


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_training_warning_after_patience_batches_in_a_row(caplog):
    monitor = CollapseMonitor(share=0.5, patience=3, min_batch=4)
    with caplog.at_level(logging.WARNING):
        for shared in (8, 8, 2, 8, 8):               # a healthy batch breaks the run
            monitor.observe_train({"top1_shared": shared, "nsentences": 8})
        assert _warnings(caplog) == []
        monitor.observe_train({"top1_shared": 4, "nsentences": 8})   # 4/8 = share: the third in a row
        assert len(_warnings(caplog)) == 1 and "retrieval looks collapsed" in _warnings(caplog)[0]
        monitor.observe_train({"top1_shared": 8, "nsentences": 8})   # once per episode
        monitor.observe_train({"top1_shared": 3, "nsentences": 3})   # batches under min_batch do not count
        assert len(_warnings(caplog)) == 1


def test_validation_warnings(caplog):
    monitor = CollapseMonitor(gold_floor=0.01, fall=0.2, share=0.5)
    with caplog.at_level(logging.WARNING):
        for stats in ({"gold_doc_prob": 3.0, "n_with_gold": 10, "top1_shared": 2, "nsentences": 10},
                      {"gold_doc_prob": 2.0, "n_with_gold": 10, "top1_shared": 2, "nsentences": 10}):
            monitor.observe_valid(stats)
        assert monitor.valid_count() == 20
        monitor.end_valid()                                            # mean 0.25: healthy
        assert _warnings(caplog) == [] and monitor.valid_count() == 0
        monitor.observe_valid({"gold_doc_prob": 0.4, "n_with_gold": 10, "top1_shared": 3, "nsentences": 10})
        monitor.end_valid()                                            # 0.04 < 0.2 x 0.25: fell
        assert "fell from 0.2500 to 0.0400" in _warnings(caplog)[-1]
        monitor.observe_valid({"gold_doc_prob": 0.05, "n_with_gold": 10, "top1_shared": 9, "nsentences": 10})
        monitor.end_valid()                                            # 0.005, 90% share one passage
        assert "collapsed on the valid set" in _warnings(caplog)[-1] and len(_warnings(caplog)) == 2


def test_automatic_query_encoder_lr_scale():
    from rag_plugin.models.rag import RagConfig, query_encoder_lr_scale

    assert abs(query_encoder_lr_scale(RagConfig(lr=[1e-3])) - 0.03) < 1e-12     # the demo's 3e-5 / 1e-3
    assert query_encoder_lr_scale(RagConfig(lr=[3e-5])) == 1.0                   # the paper's: unscaled
    assert query_encoder_lr_scale(RagConfig(lr=[1e-5])) == 1.0                   # never faster than --lr
    assert query_encoder_lr_scale(RagConfig(lr=[1e-3], query_encoder_lr_scale=0.5)) == 0.5   # explicit wins
    assert query_encoder_lr_scale(RagConfig()) == 1.0                            # no --lr known


def test_the_readme_training_command_trains_the_query_encoder_at_3e_5(tiny_world, tmp_path):
    """Issue 25, item 2: the README's command as written (lr 1e-3, no --query-encoder-lr-scale) used to
    train the query encoder at 1e-3 and collapse retrieval; now its default is the paper's 3e-5."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    cmd = [str(Path(sys.executable).parent / "rag-train"), str(tiny_world["data"]), "--task", "retrieval_augmented",
           "--knowledge", str(tiny_world["ks"]), "--arch", "rag_token_tiny", "--criterion", "marginal_nll",
           "--n-docs", "3", "--optimizer", "torch_adamw", "--lr", "1e-3", "--batch-size", "8", "--max-update", "2",
           "--save-dir", str(tmp_path / "ckpt"), "--cpu", "--num-workers", "0", "--no-progress-bar",
           "--disable-validation", "--log-interval", "1", "--no-epoch-checkpoints"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "the query encoder learns at 0.03 x --lr" in log
    assert "top1_share" in log                                    # the collapse signal is in every log line
    from rag_plugin.hub import load_fairseq_checkpoint

    weights = load_fairseq_checkpoint(str(tmp_path / "ckpt" / "checkpoint_last.pt"))["model"]
    assert any(".parametrizations.weight.original" in k for k in weights if k.startswith("query_encoder."))
