"""``--optimizer torch_adamw``: the same updates as fairseq's adam (its reference
implementation), built through fairseq's registry, and fairseq-train with it end to end
(checkpoint, resume with the optimizer state loaded under weights_only)."""
import copy

import pytest
import torch
from fairseq.optim.adam import Adam as FairseqAdamImpl

import rag_plugin
from rag_plugin.errors import UserError
from rag_plugin.optim.torch_adamw import TorchAdamW, TorchAdamWConfig, fusable, parse_betas

from tests.fairseq_parts.test_training import _args, _load, _run, _updates

rag_plugin.register()


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (7, 5, 3), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _cfg(**kw):
    cfg = TorchAdamWConfig(lr=[kw.pop("lr", 1e-2)], **kw)
    return cfg


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_same_updates_as_fairseq_adam(weight_decay):
    ours, ref = _params(), _params()
    opt = TorchAdamW(_cfg(adam_betas="(0.9, 0.98)", weight_decay=weight_decay), ours)
    assert opt.optimizer.defaults["fused"] is True
    ref_opt = FairseqAdamImpl(ref, lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay)
    g = torch.Generator().manual_seed(1)
    for step in range(12):
        if step == 6:  # a scheduler changing the learning rate through fairseq's set_lr
            opt.set_lr(3e-3)
            for group in ref_opt.param_groups:
                group["lr"] = 3e-3
        for a, b in zip(ours, ref):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad = grad.clone(), grad.clone()
        opt.step()
        ref_opt.step()
    moved = max((a - b0).abs().max().item() for a, b0 in zip(ours, _params()))
    assert moved > 0.05  # the parameters did move
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_continues_identically():
    a, b = _params(), _params()
    opt_a = TorchAdamW(_cfg(), a)
    for p in a:
        p.grad = torch.ones_like(p)
    opt_a.step()
    opt_b = TorchAdamW(_cfg(), b)
    with torch.no_grad():
        for pa, pb in zip(a, b):
            pb.copy_(pa)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()), opt_b.optimizer_config)
    for p, q in zip(a, b):
        p.grad = torch.full_like(p, 0.5)
        q.grad = torch.full_like(q, 0.5)
    opt_a.step()
    opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_param_groups_and_fallback():
    ps = _params()
    opt = TorchAdamW(_cfg(), [{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-4}])
    assert len(opt.param_groups) == 2 and opt.optimizer.defaults["fused"] is True
    assert fusable(ps)
    assert not fusable([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))])


@pytest.mark.parametrize("betas, expected", [("(0.9, 0.98)", (0.9, 0.98)), ([0.8, 0.9], (0.8, 0.9)),
                                             ("0.9,0.999", (0.9, 0.999))])
def test_betas_parse(betas, expected):
    assert parse_betas(betas) == expected


@pytest.mark.parametrize("betas", ["(0.9)", "(0.9, 1.5)", "fast", "(0.9, 0.98, 0.7)"])
def test_bad_betas_are_one_line_errors(betas):
    with pytest.raises(UserError) as err:
        TorchAdamW(_cfg(adam_betas=betas), _params())
    assert "\n" not in str(err.value) and "--adam-betas" in str(err.value)


@pytest.mark.parametrize("option, kw", [("--lr", {"lr": -1e-3}), ("--adam-eps", {"adam_eps": -1e-8}),
                                        ("--weight-decay", {"weight_decay": float("nan")})])
def test_negative_settings_are_one_line_errors(option, kw):
    with pytest.raises(UserError) as err:
        TorchAdamW(_cfg(**kw), _params())
    assert str(err.value).startswith(option) and "\n" not in str(err.value)


def test_fairseq_train_with_torch_adamw_resumes(tiny_world, tmp_path):
    """The real CLI: one epoch, then the same command for a second epoch loads the optimizer
    state from checkpoint_last.pt (fairseq's safe loading, no override)."""
    extra = ["--optimizer", "torch_adamw", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01"]
    save = tmp_path / "ckpt"
    rc, out, err = _run(_args(tiny_world, save, extra=[*extra, "--max-epoch", "1"]), tmp_path, threads=1)
    assert rc == 0, (out + err)[-4000:]
    state = _load(save / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["optimizer_name"] == "TorchAdamW"
    adam_state = state["last_optimizer_state"]
    assert adam_state["param_groups"][0]["fused"] is True and adam_state["state"]
    rc, out2, err2 = _run(_args(tiny_world, save, extra=[*extra, "--max-epoch", "2"]), tmp_path, threads=1)
    assert rc == 0, (out2 + err2)[-4000:]
    log2 = out2 + err2
    assert "Loaded checkpoint" in log2 and _updates(log2)[0] == _updates(out + err)[-1] + 1
