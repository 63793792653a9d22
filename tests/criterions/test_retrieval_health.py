"""The retrieval-collapse warning and the query encoder's automatic learning-rate scale."""
import logging

import pytest
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
    from rag_plugin.models.rag import RagConfig, lr_scale

    assert abs(lr_scale(RagConfig(lr=[1e-3])) - 0.03) < 1e-12                    # the demo's 3e-5 / 1e-3
    assert lr_scale(RagConfig(lr=[3e-5])) == 1.0                                 # the paper's: unscaled
    assert lr_scale(RagConfig(lr=[1e-5])) == 1.0                                 # never faster than --lr
    assert lr_scale(RagConfig(lr=[1e-3], query_encoder_lr_scale=0.5)) == 0.5     # explicit wins
    assert lr_scale(RagConfig()) == 1.0                                          # no --lr known


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


def _rank_stats(questions, gold_sum, shared):
    """One rank's validation logging output for one batch, as marginal_nll writes it (tensors)."""
    from rag_plugin.criterions.retrieval_health import VALID_KEY

    t = torch.tensor
    return {"loss": t(1.0), "nll_loss": t(1.0), "ntokens": 4 * questions, "nsentences": questions,
            "sample_size": 4 * questions, "doc_entropy": t(0.5), "top1_doc_prob": t(0.5), "top1_shared": shared,
            "gold_doc_prob": t(gold_sum), "n_with_gold": t(questions), "gold_hits_at_3": t(questions),
            VALID_KEY: questions}


def _summed(*per_rank):
    """fairseq's aggregation across ranks (Trainer._fast_stat_sync_sum): each key summed; a rank out of batches
    adds zeros (its dummy batch)."""
    return {k: sum(stats[k] for stats in per_rank) for k in per_rank[0]}


def _valid_pass(task, criterion, steps):
    from fairseq import metrics

    for outputs in steps:
        with metrics.aggregate():
            task.reduce_metrics(outputs, criterion)


def test_valid_collapse_is_decided_on_every_ranks_counts(tiny_world, caplog):
    """Issue 33 item 11a: two ranks validate the 5 valid questions in batches of 2 (rank 0: 2 then 1, rank 1: 2
    then a dummy batch of zeros). Rank 0 alone looks collapsed (p(gold) 0), rank 1 alone healthy (0.02 each).
    Fed what fairseq hands the task's reduce_metrics (each step's outputs summed over the ranks), the check
    decides on the whole valid set; one rank's pass alone does not complete one (before, each rank counted its
    own questions against the valid set's size: with 2 ranks a pass never ended where it did, and the warning
    never fired or fired on a mix of two passes)."""
    import rag_plugin

    rag_plugin.register()
    from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=3)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("valid")
    assert len(task.datasets["valid"]) == 5
    criterion = MarginalNLLCriterion(task)
    rank0 = [_rank_stats(2, 0.0, 2), _rank_stats(1, 0.0, 0)]
    dummy = {k: 0 * v for k, v in _rank_stats(2, 0.0, 0).items()}

    def rank1(gold_each):
        return [_rank_stats(2, 2 * gold_each, 2), dummy]

    def summed_pass(gold_each):
        return [[_summed(a, b)] for a, b in zip(rank0, rank1(gold_each), strict=True)]

    with caplog.at_level(logging.WARNING):
        _valid_pass(task, criterion, summed_pass(0.02))    # 0.04 / 5 = 0.008 < 0.01; 4 of 5 share a passage
        assert len(_warnings(caplog)) == 1 and "collapsed on the valid set" in _warnings(caplog)[0]
        assert "p(gold passage | x) 0.0080" in _warnings(caplog)[0] and "80%" in _warnings(caplog)[0]
        assert task.collapse.valid_count() == 0 and task.collapse.previous_gold == pytest.approx(0.008)
        _valid_pass(task, criterion, summed_pass(0.9))     # 1.8 / 5 = 0.36: healthy, whatever rank 0 alone says
        assert len(_warnings(caplog)) == 1 and task.collapse.previous_gold == pytest.approx(0.36)
        _valid_pass(task, criterion, [[stats] for stats in rank0])  # rank 0's own pass alone: 3 of 5 questions
        assert len(_warnings(caplog)) == 1 and task.collapse.valid_count() == 3
    training = type(task.collapse)()                        # a training step's outputs (no VALID_KEY) do not count
    training.observe_reduced([{k: v for k, v in rank0[0].items() if k != "valid_questions"}], [2])
    assert training.valid_count() == 0


def test_marginal_nll_marks_validation_outputs(tiny_world):
    import rag_plugin

    rag_plugin.register()
    from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion
    from rag_plugin.criterions.retrieval_health import VALID_KEY
    from rag_plugin.models.rag import RagConfig, RagTokenModel
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=3)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("valid")
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    ds = task.datasets["valid"]
    sample = ds.collater([ds[i] for i in range(3)])
    criterion = MarginalNLLCriterion(task)
    with torch.no_grad():
        _, _, valid = criterion(model.eval(), sample)
        _, _, train = criterion(model.train(), sample)
    assert valid[VALID_KEY] == 3 and VALID_KEY not in train
