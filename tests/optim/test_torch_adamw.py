"""``--optimizer torch_adamw``: the same updates as fairseq's adam (its reference
implementation), built through fairseq's registry, and fairseq-train with it end to end
(checkpoint, resume with the optimizer state loaded under weights_only)."""
import copy

import pytest
import torch
from fairseq.optim.adam import Adam as FairseqAdamImpl
from omegaconf import OmegaConf

import rag_plugin
from rag_plugin.optim.torch_adamw import TorchAdamW, TorchAdamWConfig, fusable, parse_betas
from rag_plugin.util.errors import UserError
from tests.tasks.test_training import _args, _load, _run, _updates

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


def test_epsilon_sits_where_the_docstring_says():
    """Gradients of 1e-7 at step 1 (sqrt(v) ~ 3e-9, next to eps 1e-8): the updates differ exactly as
    fairseq's eps against torch's eps * sqrt(1 - beta2) predicts."""
    lr, (b1, b2), eps, g = 1e-3, (0.9, 0.999), 1e-8, 1e-7
    ours, ref = [torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))], \
        [torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))]
    opt = TorchAdamW(_cfg(lr=lr, adam_betas=f"({b1}, {b2})", adam_eps=eps), ours)
    ref_opt = FairseqAdamImpl(ref, lr=lr, betas=(b1, b2), eps=eps)
    ours[0].grad, ref[0].grad = torch.full((4,), g, dtype=torch.float64), torch.full((4,), g, dtype=torch.float64)
    opt.step()
    ref_opt.step()
    m, v = (1 - b1) * g, (1 - b2) * g * g
    step = lr * (1 - b2) ** 0.5 / (1 - b1)
    expect_ref = -step * m / (v ** 0.5 + eps)
    expect_ours = -step * m / (v ** 0.5 + eps * (1 - b2) ** 0.5)
    torch.testing.assert_close(ref[0].detach(), torch.full((4,), expect_ref, dtype=torch.float64))
    torch.testing.assert_close(ours[0].detach(), torch.full((4,), expect_ours, dtype=torch.float64))
    assert expect_ours / expect_ref > 3  # a real difference at this size, not rounding


def _stepped(cfg_kw=None, grad=1.0):
    ps = _params()
    opt = TorchAdamW(_cfg(**(cfg_kw or {})), ps)
    for p in ps:
        p.grad = torch.full_like(p, grad)
    opt.step()
    return ps, opt


def test_state_dict_round_trip_continues_identically():
    a, opt_a = _stepped()
    b = _params()
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


def test_resume_keeps_the_saved_settings_and_takes_this_runs_kernel():
    """fairseq's resume: the checkpoint's settings unless ``--optimizer-overrides`` names them (the
    trainer passes ``{}`` by default; the lr comes from the scheduler after loading), but the kernel is
    always this run's: a state saved by the foreach fallback resumes on the fused kernel."""
    _, opt_a = _stepped()
    saved = copy.deepcopy(opt_a.state_dict())
    for group in saved["param_groups"]:
        group.update(fused=None, foreach=True, lr=0.5)
    opt_kept = TorchAdamW(_cfg(lr=2e-3, weight_decay=0.05), _params())
    opt_kept.load_state_dict(copy.deepcopy(saved), {})  # what fairseq's trainer passes by default
    group = opt_kept.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["fused"], group["foreach"]) == (0.5, 0.0, True, None)
    opt_b = TorchAdamW(_cfg(lr=2e-3, weight_decay=0.05), _params())
    opt_b.load_state_dict(saved, {"lr": 2e-3, "weight_decay": 0.05})  # --optimizer-overrides
    group = opt_b.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["fused"], group["foreach"]) == (2e-3, 0.05, True, None)
    # the reference: torch's single-tensor AdamW resumed from the same moments with the new settings
    ref_params = _params()
    ref_state = copy.deepcopy(saved)
    for g in ref_state["param_groups"]:
        g.update(lr=2e-3, weight_decay=0.05, fused=None, foreach=False)
    ref = torch.optim.AdamW(ref_params, lr=2e-3, weight_decay=0.05, foreach=False)
    ref.load_state_dict(ref_state)
    for p, q in zip(opt_b.params, ref_params):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    opt_b.multiply_grads(0.5)  # a pending factor: the fused kernel's grad_scale must be accepted
    for q in ref_params:
        q.grad.mul_(0.5)
    opt_b.step()
    ref.step()
    moved = max((p - p0).abs().max().item() for p, p0 in zip(opt_b.params, _params()))
    assert moved > 1e-3
    for p, q in zip(opt_b.params, ref_params):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_state_of_fairseq_adam_is_refused():
    ps = _params()
    ref_opt = FairseqAdamImpl(ps, lr=1e-3)
    for p in ps:
        p.grad = torch.ones_like(p)
    ref_opt.step()
    opt = TorchAdamW(_cfg(), _params())
    with pytest.raises(UserError, match="--reset-optimizer"):
        opt.load_state_dict(ref_opt.state_dict(), opt.optimizer_config)


def test_param_groups_and_fallback():
    ps = _params()
    opt = TorchAdamW(_cfg(), [{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-4}])
    assert len(opt.param_groups) == 2 and opt.optimizer.defaults["fused"] is True
    assert fusable(ps)
    odd = [torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    assert not fusable(odd)
    opt = TorchAdamW(_cfg(), odd)  # steps with the foreach loop instead
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0]["fused"]
    odd[0].grad = torch.ones_like(odd[0])
    opt.step()
    assert odd[0].detach().real.lt(1).all()


# ---------------------------------------------------------------------- fairseq's update, deferred
def _fairseq_update(opt, grads, factor, max_norm, aggregate=None, use_base=False):
    """What fairseq's trainer does after the backward: multiply_grads(1 / sample size), the norm
    (clip_grad_norm, with or without --clip-norm), the step. ``use_base``: fairseq's own
    FairseqOptimizer methods (two passes over the gradients), the reference."""
    from fairseq.optim import FairseqOptimizer

    for p, g in zip(opt.params, grads):
        p.grad = g.clone()
    if use_base:
        FairseqOptimizer.multiply_grads(opt, factor)
        norm = FairseqOptimizer.clip_grad_norm(opt, max_norm, aggregate)
        torch.optim.AdamW.step(opt.optimizer)
    else:
        opt.multiply_grads(factor)
        norm = opt.clip_grad_norm(max_norm, aggregate)
        opt.step()
    opt.zero_grad()
    return norm


@pytest.mark.parametrize("max_norm", [0.0, 0.05, 1e6])
@pytest.mark.parametrize("tensor_factor", [False, True])
def test_deferred_gradient_factor_matches_fairseq(max_norm, tensor_factor):
    """multiply_grads and clip_grad_norm kept as a factor that the fused kernel applies: the same
    returned norms and parameters as fairseq's two passes over the gradients, over 6 updates
    (max_norm 0.05 clips every update, 1e6 never)."""
    ours, ref = _params(), _params()
    opt, ref_opt = TorchAdamW(_cfg(weight_decay=0.01), ours), TorchAdamW(_cfg(weight_decay=0.01), ref)
    g = torch.Generator().manual_seed(3)
    seen = []
    for update in range(6):
        grads = [torch.randn(p.shape, generator=g) * 10 for p in ours]
        factor = 1.0 / (7 + update)
        if tensor_factor:  # fairseq passes a tensor when the sample size is one
            factor = torch.tensor(factor)
        aggregate = (lambda n: seen.append(n) or n)
        n_ours = _fairseq_update(opt, grads, factor, max_norm, aggregate)
        n_ref = _fairseq_update(ref_opt, grads, factor, max_norm, use_base=True)
        torch.testing.assert_close(n_ours, n_ref, rtol=1e-6, atol=0)
        assert seen[-1] is n_ours  # aggregate_norm_fn saw the scaled norm
    if max_norm == 0.05:
        assert n_ref > 10 * max_norm  # clipping was active
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert max((a - b).abs().max().item() for a, b in zip(ours, _params())) > 1e-3  # they moved


def test_deferred_factor_on_the_foreach_fallback_and_step_scale():
    odd, ref = ([torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))] for _ in range(2))
    opt, ref_opt = TorchAdamW(_cfg(), odd), torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    grad = torch.tensor([1 + 2j, -3j, 0.5], dtype=torch.complex64)
    odd[0].grad, ref[0].grad = grad.clone(), grad * 0.25 / 2.0
    opt.multiply_grads(0.25)
    opt.step(scale=2.0)  # fairseq's step(scale=...) divides the gradients by scale
    ref_opt.step()
    torch.testing.assert_close(odd[0], ref[0])


def test_zero_grad_drops_a_pending_factor():
    """After a skipped update (overflow, NaN: fairseq calls zero_grad) the next update starts clean."""
    ours, ref = _params(), _params()
    opt, ref_opt = TorchAdamW(_cfg(), ours), TorchAdamW(_cfg(), ref)
    opt.multiply_grads(1e-3)
    opt.clip_grad_norm(0.01)
    opt.zero_grad()
    grads = [torch.ones_like(p) for p in ours]
    _fairseq_update(opt, grads, 0.5, 0.0)
    _fairseq_update(ref_opt, grads, 0.5, 0.0, use_base=True)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)
    assert not hasattr(opt.optimizer, "grad_scale")


@pytest.mark.parametrize("overflow", ["inf", "nan"])
def test_amp_overflow_then_retry_moves_like_fairseq_adam(command_line_hooks, overflow):
    """fairseq-train --amp --clip-norm: an overflowing batch (its clipping coefficient 0 or NaN) is
    skipped by the grad scaler and retried; fairseq's AMP wrapper clears the gradients through the
    torch optimizer, not through TorchAdamW.zero_grad. The retried update must be fairseq adam's, at
    the command line's hooks installed (they unscale the gradients once: rag_plugin.fairseq_hooks.mixed_precision,
    where tests/fairseq_hooks/test_mixed_precision.py checks both optimizers against float32 at the default eps).
    (fairseq's AMP needs CUDA's GradScaler; torch's CPU GradScaler stands in for it.)"""
    from fairseq.optim.adam import FairseqAdam
    from fairseq.optim.amp_optimizer import AMPOptimizer

    def run(build):
        p = torch.nn.Parameter(torch.randn(500, generator=torch.Generator().manual_seed(0)))
        target = torch.randn(500, generator=torch.Generator().manual_seed(1))
        cfg = OmegaConf.create({"optimizer": {}, "common": {"fp16_init_scale": 128, "min_loss_scale": 1e-4,
                                                            "amp_scale_window": None}})
        opt = AMPOptimizer(cfg, [p], build([p]))
        opt._grad_scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
        norms = []
        for bad in (True, False):  # the trainer's train_step, then its retry of the same batch
            opt.zero_grad()
            loss = ((p - target) ** 2).sum()
            if bad:
                spoil = (p * float("inf")).sum()
                loss = loss + (spoil if overflow == "inf" else spoil - spoil)
            opt.backward(loss)
            opt.multiply_grads(1.0 / 30)
            norms.append(opt.clip_grad_norm(0.5))
            opt.step()
        return p.detach(), norms

    # eps 1e-16: a few of these 500 clipped gradients are below ~1e-5, where the two optimizers' epsilons sit
    # apart at the first step (test_epsilon_sits_where_the_docstring_says: 4 weights differ by 3e-5 relative at 1e-8)
    ours, our_norms = run(lambda ps: TorchAdamW(_cfg(lr=1e-3, adam_eps=1e-16), ps))
    ref_cfg = OmegaConf.create({"lr": [1e-3], "adam_betas": "(0.9, 0.999)", "adam_eps": 1e-16, "weight_decay": 0.0,
                                "use_old_adam": False, "fp16_adam_stats": False, "tpu": False})
    ref, ref_norms = run(lambda ps: FairseqAdam(ref_cfg, ps))
    assert not torch.isfinite(our_norms[0]) and float(ref_norms[1]) > 1.0
    torch.testing.assert_close(our_norms[1], ref_norms[1], rtol=1e-6, atol=0)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-7)
    start = torch.randn(500, generator=torch.Generator().manual_seed(0))
    assert (ours - start).abs().max() > 5e-4  # the retried update moved the weights


def test_expert_parameters_take_fairseqs_path():
    """Mixture-of-experts parameters (fairseq leaves their gradients out of the norm): no
    deferral, fairseq's own multiply and norm."""
    ours, ref = _params(), _params()
    ours[0].expert = ref[0].expert = True
    opt, ref_opt = TorchAdamW(_cfg(), ours), TorchAdamW(_cfg(), ref)
    grads = [torch.full_like(p, 2.0) for p in ours]
    n_ours = _fairseq_update(opt, grads, 0.5, 0.1)
    n_ref = _fairseq_update(ref_opt, grads, 0.5, 0.1, use_base=True)
    assert torch.equal(n_ours, n_ref)
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads[1:]])) * 0.5
    torch.testing.assert_close(n_ours, expected)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def test_gradient_norm_is_accurate():
    """The norm from per-tensor dot products against float64, on a large gradient (where torch's
    float32 norm, fairseq's, is off by 1.3e-4 relative), a non-contiguous one and a complex one: within
    the module's stated 5e-5 and closer than torch's float32 norm. (How close depends on the BLAS's
    threads: 1.4e-5 with 2 threads here, 4.8e-5 with one, which a bound of 2e-5 failed.)"""
    g = torch.Generator().manual_seed(5)
    big = torch.nn.Parameter(torch.zeros(5_000_000))
    big.grad = torch.randn(5_000_000, generator=g)
    strided = torch.nn.Parameter(torch.zeros(40, 30))
    strided.grad = torch.randn(30, 40, generator=g).t()
    assert not strided.grad.is_contiguous()
    opt = TorchAdamW(_cfg(), [big, strided])
    expected = torch.linalg.vector_norm(torch.cat([big.grad.double(), strided.grad.double().flatten()]))
    norm = opt.clip_grad_norm(0.0)
    assert norm.dtype == torch.float32
    torch.testing.assert_close(norm.double(), expected, rtol=5e-5, atol=0)
    fairseqs = torch.linalg.vector_norm(torch.cat([big.grad, strided.grad.flatten()])).double()
    assert abs(norm.double() - expected) < abs(fairseqs - expected)
    odd = [torch.nn.Parameter(torch.ones(3, dtype=torch.complex64))]
    odd[0].grad = torch.tensor([3 + 4j, 0, 0], dtype=torch.complex64)
    torch.testing.assert_close(TorchAdamW(_cfg(), odd).clip_grad_norm(0.0), torch.tensor(5.0))


@pytest.mark.parametrize("option", ["memory_efficient_fp16", "memory_efficient_bf16"])
def test_memory_efficient_fp16_is_a_one_line_error(option):
    with pytest.raises(UserError) as err:
        TorchAdamW(_cfg(**{option: True}), _params())
    message = str(err.value)
    assert "use --fp16" in message and "--bf16" in message and "\n" not in message


@pytest.mark.parametrize("betas, expected", [("(0.9, 0.98)", (0.9, 0.98)), ([0.8, 0.9], (0.8, 0.9)),
                                             ("0.9,0.999", (0.9, 0.999)),
                                             (OmegaConf.create([0.9, 0.95]), (0.9, 0.95))])
def test_betas_parse(betas, expected):
    assert parse_betas(betas) == expected


@pytest.mark.parametrize("betas", ["(0.9)", "(0.9, 1.5)", "fast", "(0.9, 0.98, 0.7)", 0.9, None])
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
