"""rag_plugin.fairseq_hooks.mixed_precision on CPU proxies: fairseq's --amp wrapper over a CPU GradScaler moves
the weights as float32 does (torch_adamw and fairseq's adam, eps 1e-8); FP16Optimizer's master weights keep the
towers' weight decay x lr scale (flattening requested or not), checked against a float32 run, and a resume
across float32 and --fp16 loads; --memory-efficient-fp16 is refused while a tower learns at a fraction of --lr
(its updates measured rounding away); --bf16 stops implying --tpu; fairseq-train --cpu --bf16 / --fp16 end to end."""
import copy
import logging
import subprocess
import sys

import pytest
import torch

import rag_plugin

rag_plugin.register()

from fairseq import optim, options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.optim.amp_optimizer import AMPOptimizer  # noqa: E402
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer, _FP16OptimizerMixin  # noqa: E402

from rag_plugin.fairseq_hooks import mixed_precision  # noqa: E402
from rag_plugin.optim.lr_scale import scale_learning_rate  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402
from tests.tasks.test_training import ROOT, _args, _Job, _load, _updates  # noqa: E402

pytestmark = pytest.mark.usefixtures("command_line_hooks")

TOWER_SCALE = 0.03


def fairseq_cfg(*extra, optimizer="torch_adamw"):
    """A training config as fairseq-train builds it (its parser, through the hooks, then the DictConfig the
    trainer gets)."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data", "--task", "translation", "--arch", "transformer",
                                                "--optimizer", optimizer, "--lr", "1e-2", "--cpu", *extra])
    return convert_namespace_to_omegaconf(args)


@pytest.fixture
def cpu_grad_scaler(monkeypatch):
    """fairseq's --amp builds CUDA's GradScaler (disabled without CUDA): torch's CPU GradScaler stands in for it."""
    real = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device="cuda", **kw: real("cpu", **kw))


# ------------------------------------------------------------------------------------------------ --amp
def _amp_run(optimizer, scale, amp=True, steps=4, plain_norm=False):
    """fairseq's train step (zero_grad, backward, multiply_grads(1 / sample size), clip_grad_norm, step) on
    gradients of ~1e-4, through fairseq's AMP wrapper at loss scale ``scale`` or without it. Returns the
    weights' displacement."""
    extra = ["--amp", "--amp-init-scale", str(scale)] if amp else []
    cfg = fairseq_cfg(*extra, "--adam-eps", "1e-8", optimizer=optimizer)
    p = torch.nn.Parameter(torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 0.05)
    start = p.detach().clone()
    opt = AMPOptimizer.build_optimizer(cfg, [p]) if amp else optim.build_optimizer(cfg.optimizer, [p])
    for _ in range(steps):
        opt.zero_grad()
        opt.backward(1e-3 * (p ** 2).sum())
        opt.multiply_grads(1.0 / 30)
        if plain_norm:  # fairseq's own clip_grad_norm: the second unscale in step()
            AMPOptimizer.clip_grad_norm._plain(opt, 0.0)
        else:
            opt.clip_grad_norm(0.0)
        opt.step()
    if amp:
        assert opt.scaler.get_scale() == scale  # no overflow: every step was taken at this scale
    return p.detach() - start


@pytest.mark.parametrize("optimizer", ["torch_adamw", "adam"])
@pytest.mark.parametrize("scale", [2 ** 7, 2 ** 10, 2 ** 16])
def test_amp_moves_the_weights_as_float32_does(cpu_grad_scaler, optimizer, scale):
    moved = _amp_run(optimizer, scale)
    reference = _amp_run(optimizer, scale, amp=False)
    assert reference.abs().max() > 1e-3
    torch.testing.assert_close(moved, reference, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("optimizer", ["torch_adamw", "adam"])
def test_fairseqs_own_amp_step_shrinks_the_updates(cpu_grad_scaler, optimizer):
    """The defect the hook removes, measured: fairseq's clip_grad_norm unscales through the torch optimizer,
    its step through the fairseq one, and the weights move 0.27x (2^10) and 0.006x (2^16) as far with torch_adamw,
    0.02x and 0.0003x with fairseq's adam."""
    reference = _amp_run(optimizer, 2 ** 10, amp=False).norm()
    assert _amp_run(optimizer, 2 ** 10, plain_norm=True).norm() / reference < 0.35
    assert _amp_run(optimizer, 2 ** 16, plain_norm=True).norm() / reference < 0.01


def test_amp_scaler_takes_the_amp_options(cpu_grad_scaler):
    """--amp-init-scale starts the scale (fairseq gave --fp16-init-scale), --amp-scale-window clean steps double
    it (fairseq gave --amp-init-scale as the window)."""
    p = torch.nn.Parameter(torch.ones(4))
    cfg = fairseq_cfg("--amp", "--amp-init-scale", "64", "--amp-scale-window", "3", "--fp16-init-scale", "8")
    opt = AMPOptimizer.build_optimizer(cfg, [p])
    scales = []
    for _ in range(4):
        opt.zero_grad()
        opt.backward((p ** 2).sum())
        opt.clip_grad_norm(0.0)
        opt.step()
        scales.append(opt.scaler.get_scale())
    assert scales == [64.0, 64.0, 128.0, 128.0]


def test_amp_with_bf16_is_a_one_line_error(cpu_grad_scaler):
    with pytest.raises(UserError, match="--bf16 alone") as err:
        AMPOptimizer.build_optimizer(fairseq_cfg("--amp", "--bf16"), [torch.nn.Parameter(torch.ones(2))])
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------------------------- --fp16 / --bf16
def _net(seed=0, dtype=torch.float32):
    """A "generator" and a "tower" learning at 0.03 x lr (the query encoder's reparametrisation), weights
    representable in float16, cast as fairseq's trainer casts the model."""
    torch.manual_seed(seed)
    net = torch.nn.ModuleDict({"gen": torch.nn.Linear(6, 5), "tower": torch.nn.Linear(6, 4)})
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape).half().float())
    scale_learning_rate(net["tower"], TOWER_SCALE)
    return net.to(dtype)


def _loss(net, seed):
    """Linear in the weights, with coefficients representable in 16 bits: the same gradients in every precision."""
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for name in ("gen", "tower"):
        for w in (net[name].weight, net[name].bias):
            total = total + (w.float() * torch.randn(w.shape, generator=g).half().float()).sum()
    return total


def _train(opt, net, steps, first_seed=0):
    for step in range(steps):
        opt.zero_grad()
        opt.backward(_loss(net, first_seed + step))
        opt.multiply_grads(1.0)
        opt.clip_grad_norm(0.0)
        opt.step()


def _master(opt):
    """The float32 weights an optimizer steps (FP16Optimizer's master copies), in parameter order."""
    return [p.detach().clone() for group in opt.optimizer.param_groups for p in group["params"]]


def _stored(net):
    return [p.detach().float().clone() for p in net.parameters()]


def _decay(run, lr=1e-2, weight_decay=0.5):
    """Each weight's decay per step, divided by lr (the weight decay it got): the same run with and without
    --weight-decay (AdamW's decoupled decay is their only difference after one step)."""
    (start, with_decay), (_, without) = run(weight_decay), run(0.0)
    return [(b - a) / (lr * w) for a, b, w in zip(with_decay, without, start)]


def _expected_decay(weight_decay=0.5):
    net = _net()
    return [torch.full_like(p, weight_decay * float(getattr(p, "lr_scale", 1.0)), dtype=torch.float32)
            for p in net.parameters()]


def _fp16_run(*flags, optimizer="torch_adamw"):
    def run(weight_decay):
        net = _net(dtype=torch.bfloat16 if "--bf16" in flags else torch.float16)
        cfg = fairseq_cfg(*flags, "--weight-decay", str(weight_decay), optimizer=optimizer)
        opt = optim.FP16Optimizer.build_optimizer(cfg, list(net.parameters()))
        start = [p.detach().clone() for p in (opt.fp32_params if isinstance(opt.fp32_params, list)
                                               else _unflatten(opt.fp32_params[None], net))]
        _train(opt, net, steps=1)
        end = _master(opt) if isinstance(opt.fp32_params, list) else _unflatten(opt.fp32_params[None], net)
        return start, end
    return run


def _unflatten(flat, net):
    """A flat master tensor cut into the parameters' shapes (the flat path of FP16Optimizer)."""
    out, offset = [], 0
    for p in net.parameters():
        out.append(flat.detach()[offset: offset + p.numel()].view(p.shape).clone())
        offset += p.numel()
    return out


def _fp32_run(weight_decay):
    net = _net()
    opt = optim.build_optimizer(fairseq_cfg("--weight-decay", str(weight_decay)).optimizer, list(net.parameters()))
    start = _stored(net)
    _train(opt, net, steps=1)
    return start, _stored(net)


@pytest.mark.parametrize("flags", [("--fp16",), ("--fp16", "--fp16-no-flatten-grads"), ("--bf16",)],
                         ids=["fp16-flat-requested", "fp16-no-flatten", "bf16"])
def test_master_weights_keep_the_towers_weight_decay(flags, caplog, monkeypatch):
    """Per weight, the decay FP16Optimizer's master weights get is the float32 run's: weight decay x 0.03 in the
    tower, x 1 in the generator (a flat master tensor would give every weight one decay: kept unflattened).
    (Flat master weights live on fairseq's CUDA device; on a CPU run its index is None.)"""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    with caplog.at_level(logging.INFO, logger=mixed_precision.__name__):
        got = _decay(_fp16_run(*flags))
    reference = _decay(_fp32_run)
    for g, r, e in zip(got, reference, _expected_decay()):
        torch.testing.assert_close(r, e, rtol=1e-3, atol=0)
        torch.testing.assert_close(g, r, rtol=1e-3, atol=0)
    flattening_refused = "not flattened" in caplog.text
    assert flattening_refused == (flags == ("--fp16",))


def test_fairseqs_own_master_weights_decay_the_tower_33x(monkeypatch):
    """The defect the hook removes, measured: fairseq's FP16Optimizer copies the weights without the tag, and the
    tower decays at the full weight decay (--fp16-no-flatten-grads; flattened, one tensor, the same)."""
    monkeypatch.setattr(_FP16OptimizerMixin, "build_fp32_params",
                        classmethod(_FP16OptimizerMixin.build_fp32_params.__func__._plain))
    got = _decay(_fp16_run("--fp16", "--fp16-no-flatten-grads"))
    for g in got:
        torch.testing.assert_close(g, torch.full_like(g, 0.5), rtol=1e-3, atol=0)  # the tower's 0.03 lost


@pytest.mark.parametrize("flags, optimizer", [(("--fp16",), "adam"),
                                              (("--fp16", "--weight-decay", "0"), "torch_adamw")])
def test_flattening_is_kept_where_no_decay_depends_on_the_tag(monkeypatch, flags, optimizer, caplog):
    """fairseq's adam ignores the tag, and without weight decay nothing depends on it: the master weights stay one
    flat tensor. (Flat master weights live on fairseq's CUDA device; on a CPU run the device index is None.)"""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    net = _net(dtype=torch.float16)
    with caplog.at_level(logging.INFO, logger=mixed_precision.__name__):
        opt = optim.FP16Optimizer.build_optimizer(fairseq_cfg(*flags, optimizer=optimizer), list(net.parameters()))
    assert opt.has_flat_params and "not flattened" not in caplog.text
    _train(opt, net, steps=2)  # and it trains (the CPU proxy of the flat path works)
    assert torch.isfinite(opt.fp32_params[None]).all()


def _resumed(first, second, steps=2):
    """``first`` trains ``steps`` updates and saves its state; ``second`` (a fresh run from the same weights)
    loads it as fairseq's trainer does and both take one more update. Returns (first's, second's) weights."""
    net_a, opt_a = first()
    _train(opt_a, net_a, steps)
    state = copy.deepcopy(opt_a.state_dict())
    net_b, opt_b = second()
    with torch.no_grad():
        for a, b in zip(_master(opt_a), [p for g in opt_b.optimizer.param_groups for p in g["params"]]):
            b.copy_(a)
    if isinstance(opt_b, FP16Optimizer):
        opt_b._sync_fp32_params_to_fp16()
    opt_b.load_state_dict(state, {})
    _train(opt_a, net_a, 1, first_seed=steps)
    _train(opt_b, net_b, 1, first_seed=steps)
    return _master(opt_a), _master(opt_b)


def _fp32_opt():
    net = _net()
    return net, optim.build_optimizer(fairseq_cfg("--weight-decay", "0.5").optimizer, list(net.parameters()))


def _fp16_opt():
    net = _net(dtype=torch.float16)
    return net, optim.FP16Optimizer.build_optimizer(fairseq_cfg("--fp16", "--weight-decay", "0.5"),
                                                    list(net.parameters()))


@pytest.mark.parametrize("first, second", [(_fp32_opt, _fp16_opt), (_fp16_opt, _fp32_opt)],
                         ids=["fp32-to-fp16", "fp16-to-fp32"])
def test_optimizer_state_resumes_across_float32_and_fp16(first, second):
    """The same parameter groups (2: the tower's decay apart) on both sides, so the saved state loads and the
    next update is the one the first run takes."""
    assert len(first()[1].param_groups) == len(second()[1].param_groups) == 2
    a, b = _resumed(first, second)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------- --memory-efficient-*
def _memory_efficient_displacement(dtype):
    """20 Adam steps on noisy gradients: how far each part's 16-bit weights moved, against float32 master
    weights (fairseq's own MemoryEfficientFP16Optimizer, without the refusal)."""
    flag = "--memory-efficient-bf16" if dtype == torch.bfloat16 else "--memory-efficient-fp16"
    moved = {}
    for mode in ("16-bit", "float32"):
        net = torch.nn.ModuleDict({"gen": torch.nn.Linear(64, 64), "tower": torch.nn.Linear(64, 64)})
        with torch.no_grad():
            for p in net.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        scale_learning_rate(net["tower"], TOWER_SCALE)
        lr = ("--lr", "1e-3")  # the tower at 3e-5, the paper's query encoder lr
        cfg = fairseq_cfg(flag, *lr, optimizer="adam") if mode == "16-bit" else fairseq_cfg(*lr, optimizer="adam")
        if mode == "16-bit":
            net = net.to(dtype)
            opt = MemoryEfficientFP16Optimizer.build_optimizer.__func__._plain(
                MemoryEfficientFP16Optimizer, cfg, list(net.parameters()))
        else:
            opt = optim.build_optimizer(cfg.optimizer, list(net.parameters()))
        start = {k: net[k].weight.detach().float().clone() for k in net}
        g = torch.Generator().manual_seed(1)
        for _ in range(20):
            opt.zero_grad()
            opt.backward(sum((net[k].weight.float() * torch.randn(64, 64, generator=g)).sum() for k in net))
            opt.multiply_grads(1.0)
            opt.clip_grad_norm(0.0)
            opt.step()
        moved[mode] = {k: net[k].weight.detach().float() - start[k] for k in net}
    return {k: ((moved["16-bit"][k] - moved["float32"][k]).norm() / moved["float32"][k].norm()).item()
            for k in ("gen", "tower")}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_memory_efficient_16_bit_weights_lose_the_towers_updates(dtype):
    """Why it is refused, measured: the tower at 0.03 x lr 1e-3 (weights ~0.05, steps of ~3e-5, about one float16
    step of its weights) ends 48% (float16) / 93% (bfloat16) off its float32 path, the generator 1% / 8%."""
    error = _memory_efficient_displacement(dtype)
    assert error["tower"] > 0.3 and error["tower"] > 4 * error["gen"], error


@pytest.mark.parametrize("flag", ["--memory-efficient-fp16", "--memory-efficient-bf16"])
def test_memory_efficient_with_a_scaled_tower_is_a_one_line_error(flag):
    net = _net(dtype=torch.float16)
    with pytest.raises(UserError) as err:
        MemoryEfficientFP16Optimizer.build_optimizer(fairseq_cfg(flag, optimizer="adam"), list(net.parameters()))
    message = str(err.value)
    assert message.startswith(flag) and "0.03 x --lr" in message and "--fp16 or --bf16" in message
    assert "\n" not in message
    plain = torch.nn.Linear(3, 3).half()  # no tower at a fraction of --lr: fairseq's own behaviour
    assert MemoryEfficientFP16Optimizer.build_optimizer(fairseq_cfg(flag, optimizer="adam"), list(plain.parameters()))


# ------------------------------------------------------------------------------------------------ --bf16
@pytest.mark.parametrize("flags, tpu", [(("--bf16",), False), (("--memory-efficient-bf16",), False),
                                        (("--bf16", "--tpu"), True)])
def test_bf16_no_longer_implies_tpu(flags, tpu):
    cfg = fairseq_cfg(*flags)
    assert cfg.common.bf16 and cfg.common.tpu is tpu


def test_bf16_master_weights_are_float32_with_no_loss_scale():
    net = _net(dtype=torch.bfloat16)
    opt = optim.FP16Optimizer.build_optimizer(fairseq_cfg("--bf16", "--weight-decay", "0.1"), list(net.parameters()))
    assert opt.scaler is None and not opt.has_flat_params
    assert {p.dtype for p in _master(opt)} == {torch.float32} and len(opt.param_groups) == 2


def test_bf16_with_fp16_is_a_one_line_error():
    with pytest.raises(UserError, match="--bf16 and --fp16 together"):
        fairseq_cfg("--bf16", "--fp16")


def test_import_installs_nothing_and_install_patches_every_wrapper():
    code = (
        "import fairseq.optim.amp_optimizer as a, fairseq.optim.fp16_optimizer as f, fairseq.options as o\n"
        "def snap(): return [a.AMPOptimizer.clip_grad_norm, a.AMPOptimizer.__init__,"
        " a.AMPOptimizer.build_optimizer.__func__, f._FP16OptimizerMixin.build_fp32_params.__func__,"
        " f.FP16Optimizer.build_optimizer.__func__, f.MemoryEfficientFP16Optimizer.build_optimizer.__func__,"
        " o.parse_args_and_arch]\n"
        "before = snap()\n"
        "import rag_plugin; rag_plugin.register()\n"
        "imported = snap()\n"
        "from rag_plugin import fairseq_hooks; assert fairseq_hooks.install()\n"
        "installed = snap()\n"
        "changed = lambda now: sum(x is not y for x, y in zip(before, now))\n"
        "print(changed(imported), changed(installed))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["0", "7"]


# ------------------------------------------------------------------------------------- fairseq-train
@pytest.mark.slow
def test_fairseq_train_cpu_bf16_and_fp16_keep_the_towers_decay(tiny_world, tmp_path):
    """fairseq-train --cpu with --bf16 (no --tpu) and --fp16 (flattening requested: kept unflattened), torch_adamw,
    --weight-decay 0.01, the query encoder at 0.03 x lr: 3 updates each; the saved optimizer state has the two
    groups of a float32 run (decay 0.01 and 3e-4), float32 moments; --fp16 records its loss scale. Resumed in float32,
    the --bf16 run's state stops at fairseq's check of the optimizer wrapper with a one-line error."""
    extra = ["--optimizer", "torch_adamw", "--weight-decay", "0.01", "--query-encoder-lr-scale", str(TOWER_SCALE),
             "--max-update", "3", "--disable-validation"]
    jobs = {name: _Job(_args(tiny_world, tmp_path / name, extra=[*extra, flag]), tmp_path)
            for name, flag in (("bf16", "--bf16"), ("fp16", "--fp16"))}
    for name, job in jobs.items():
        rc, out, err = job.result()
        log = out + err
        assert rc == 0, log[-4000:]
        assert _updates(log)[-1] == 3
        assert ("not flattened" in log) == (name == "fp16")
        state = _load(tmp_path / name / "checkpoint_last.pt")
        optimizer_state = state["last_optimizer_state"]
        decays = sorted(g["weight_decay"] for g in optimizer_state["param_groups"])
        assert decays == pytest.approx([0.01 * TOWER_SCALE, 0.01])
        moments = [t for s in optimizer_state["state"].values() for t in s.values() if t.dim() > 0]
        assert moments and {t.dtype for t in moments} == {torch.float32}
        assert ("loss_scale" in optimizer_state) == (name == "fp16")
        assert not state["cfg"]["common"]["tpu"]
    # a resume in float32 of the --bf16 run: fairseq refuses another optimizer wrapper's state, in one line
    from tests.conftest import assert_one_line_error

    proc = subprocess.run(_args(tiny_world, tmp_path / "bf16", extra=[*extra[:-3], "--max-update", "4"]),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc, "written with another optimizer than this run's (FP16Optimizer vs TorchAdamW; "
                                "--fp16, --bf16 and --amp each wrap the optimizer) (fix: resume with the options")


@pytest.mark.parametrize("flags, needle", [(["--bf16", "--fp16"], "--bf16 and --fp16 together"),
                                           (["--bf16", "--amp"], "--amp with --bf16")])
def test_fairseq_train_refuses_bf16_combinations_in_one_line(tiny_world, tmp_path, flags, needle):
    from tests.conftest import assert_one_line_error

    proc = subprocess.run(_args(tiny_world, tmp_path / "ckpt", extra=["--max-update", "1", *flags]), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert_one_line_error(proc, needle)
