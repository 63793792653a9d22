"""rag_plugin.models.dropout: the generator's dropout (a cheaper mask than bernoulli_ on CPU)
has dropout's distribution, expectation, gradient and reproducibility."""
import math

import pytest
import torch

pytest.importorskip("fairseq")
from fairseq.data import Dictionary  # noqa: E402
from fairseq.modules.fairseq_dropout import FairseqDropout  # noqa: E402

from rag_plugin.models.dropout import FastDropout, fast_dropout, keep_mask, use_fast_dropout  # noqa: E402
from rag_plugin.models.generator import GeneratorShape, build_bart  # noqa: E402


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_fraction_and_scale(p):
    torch.manual_seed(0)
    n = 1 << 22
    keep, scale = keep_mask((n,), p)
    p_rounded = round(p * 65536) / 65536
    assert abs(p_rounded - p) <= 2 ** -17
    assert scale == pytest.approx(1 / (1 - p_rounded), rel=1e-12)
    sd = math.sqrt(p * (1 - p) / n)  # binomial standard deviation of the kept fraction
    assert abs(keep.float().mean().item() - (1 - p_rounded)) < 6 * sd


def test_neighbouring_draws_are_independent():
    # four 16-bit draws come from one 64-bit word: the four positions of a word, and adjacent
    # words, must be dropped independently (P(both dropped) = p^2)
    torch.manual_seed(1)
    p, n = 0.5, 1 << 22
    dropped = ~keep_mask((n,), p)[0]
    sd = math.sqrt(p * p * (1 - p * p) / (n - 4))
    for lag in (1, 2, 3, 4, 5):
        both = (dropped[:-lag] & dropped[lag:]).float().mean().item()
        assert abs(both - p * p) < 6 * sd, lag
    within_word = dropped.view(-1, 4).float()
    assert abs(torch.corrcoef(within_word.T).fill_diagonal_(0).abs().max().item()) < 0.01


def test_output_is_zero_or_scaled_input_with_the_input_mean():
    torch.manual_seed(2)
    x = torch.rand(64, 32, 128) + 1.0
    y = fast_dropout(x, 0.1)
    kept = y != 0
    scale = 65536 / (65536 - round(0.1 * 65536))
    assert torch.equal(y[kept], x[kept] * scale)
    assert abs(y.mean().item() / x.mean().item() - 1) < 3e-3
    assert abs(1 - kept.float().mean().item() - 0.1) < 3e-3


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(3)
    x = torch.randn(40, 200, requires_grad=True)
    w = torch.randn(40, 200)
    y = fast_dropout(x, 0.2)
    (y * w).sum().backward()
    kept = (y != 0) | (x == 0)
    scale = 65536 / (65536 - round(0.2 * 65536))
    assert torch.allclose(x.grad, w * kept * scale, rtol=0, atol=1e-6)
    assert torch.count_nonzero(x.grad[~kept]) == 0


def test_reproducible_from_the_seed_and_fresh_per_call():
    x = torch.ones(8192)
    torch.manual_seed(7)
    a, b = fast_dropout(x, 0.1), fast_dropout(x, 0.1)
    torch.manual_seed(7)
    assert torch.equal(fast_dropout(x, 0.1), a)
    assert not torch.equal(a, b)


def test_edge_cases():
    x = torch.ones(16, 16)
    assert fast_dropout(x, 0.0) is x
    assert torch.count_nonzero(fast_dropout(torch.ones(10_000), 1.0)) == 0  # F.dropout's p=1
    small = fast_dropout(torch.ones(100), 0.5)  # below the size where the mask matters: F.dropout
    assert set(small.unique().tolist()) <= {0.0, 2.0}
    nearly_one = fast_dropout(torch.ones(10_000), 1 - 2 ** -18)  # rounds to 1 at 16 bits: F.dropout
    assert set(nearly_one.unique().tolist()) <= {0.0, 2.0 ** 18}  # kept values scaled by 1 / (1 - p)
    assert torch.count_nonzero(nearly_one) <= 3  # 10,000 * 2**-18 = 0.04 expected survivors
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="dropout probability"):
            fast_dropout(torch.ones(10_000), bad)


def test_generator_uses_it_in_training_only_and_checkpoints_are_unchanged():
    d = Dictionary()
    for i in range(300):
        d.add_symbol(f"w{i}")
    torch.manual_seed(0)
    bart = build_bart(GeneratorShape(max_source_positions=64, max_target_positions=64, dropout=0.1, embed_dim=64,
                                 heads=4, ffn_dim=128), d)
    drops = [m for m in bart.modules() if isinstance(m, FairseqDropout)]
    assert drops and all(type(m) is FastDropout for m in drops)
    plain = torch.nn.Module()
    plain.d = FairseqDropout(0.1)
    assert use_fast_dropout(plain) == 1 and type(plain.d) is FastDropout
    src = torch.randint(4, 300, (6, 50))
    prev = torch.randint(4, 300, (6, 9))
    lengths = torch.full((6,), 50)
    bart.eval()
    assert torch.equal(bart(src, lengths, prev)[0], bart(src, lengths, prev)[0])  # no dropout in eval
    bart.train()
    torch.manual_seed(5)
    a = bart(src, lengths, prev)[0]
    torch.manual_seed(5)
    assert torch.equal(bart(src, lengths, prev)[0], a)  # seeded training is reproducible
    assert not torch.equal(bart(src, lengths, prev)[0], a)
    assert all(not k.endswith(("p", "module_name")) for k in bart.state_dict())


def test_generator_torch_dropout_option_keeps_fairseq_dropout(tiny_world):
    import rag_plugin

    rag_plugin.register()
    from rag_plugin.models.rag import RagConfig, RagTokenModel
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=str(tiny_world["data"]),
                                                                      knowledge=str(tiny_world["ks"]), n_docs=2))
    for flag, expected in ((True, FairseqDropout), (False, FastDropout)):
        model = RagTokenModel.build_model(RagConfig(generator_torch_dropout=flag), task)
        kinds = {type(m) for m in model.generator.modules() if isinstance(m, FairseqDropout)}
        assert kinds == {expected}
