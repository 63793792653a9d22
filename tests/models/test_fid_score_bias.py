"""FiD that sees retrieval (--fid-score-bias, --fid-attention-temperature, --fid-random-passages): at w = 0 it is
plain FiD bit for bit; the cross-attention moves as softmax(a + w log p(z|x)) says; the bias follows the beams and
the finished questions of the search; the learned weight and the retrieval scores get their gradient; random
passages replace exactly the last passage, scored as the retriever scores; one-line errors for bad values."""
import math

import numpy as np
import pytest
import torch
from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.dataclass.configs import GenerationConfig

import rag_plugin

rag_plugin.register()

from rag_plugin.core.scores import inner_products  # noqa: E402
from rag_plugin.generation.fid_attention import CrossAttentionRecorder  # noqa: E402
from rag_plugin.generation.fid_score_bias import PRIOR_KEY, ScoreBias, with_prior  # noqa: E402
from rag_plugin.models import fid_random_passages as R  # noqa: E402
from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402
from tests.generation.test_fid_generate import _forced, _select  # noqa: E402  (teacher forcing of given answers)

K = 3


def _task(world, split="test", retriever="dense", n_docs=K):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=str(world["data"]), retriever=retriever,
                                                                      knowledge=str(world["ks"]), n_docs=n_docs))
    task.load_dataset(split)
    return task


def _fid(task, seed=0, doubled=False, **kw):
    """A tiny FiD; ``doubled``: every weight matrix doubled, so that hypotheses have 2 to 9 tokens (questions and
    beams finish the search at different steps, as in tests/generation/test_fid_generate.py)."""
    torch.manual_seed(seed)
    model = FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0, **kw), task)
    if doubled:
        with torch.no_grad():
            for p in model.generator.parameters():
                if p.dim() == 2:
                    p.mul_(2.0)
    return model


def _batch(task, split="test"):
    ds = task.datasets[split]
    return ds.collater([ds[i] for i in range(len(ds))])


@pytest.fixture
def float64(monkeypatch):
    """A converter of models to float64 throughout: fairseq's attention softmax and GELU run in float32 whatever
    their input; here a float64 model's stay float64, so that hand computations and finite differences hold to
    float64's precision."""
    from fairseq import utils
    from fairseq.modules.gelu import gelu

    softmax = utils.softmax

    def keeps_float64(x, dim: int, onnx_trace: bool = False):
        return torch.softmax(x, dim=dim) if x.dtype == torch.float64 else softmax(x, dim, onnx_trace)

    monkeypatch.setattr(utils, "softmax", keeps_float64)

    def convert(model):
        for module in model.modules():
            if getattr(module, "activation_fn", None) is gelu:
                module.activation_fn = torch.nn.functional.gelu
        return model.double()

    return convert


def _set_weight(model, w: float):
    with torch.no_grad():
        model.score_bias_log_weight.fill_(math.log(w) if w > 0 else -math.inf)


def _generate(task, model, sample, **kw):
    return task.build_generator([model], GenerationConfig(max_len_a=0, max_len_b=8, **kw)).generate([model], sample)


# ----------------------------------------------------------------------------------------------- w = 0: plain FiD
def test_plain_fid_has_no_weight_and_no_prior(tiny_world):
    task = _task(tiny_world)
    plain, biased = _fid(task), _fid(task, fid_score_bias=True)
    assert set(biased.state_dict()) - set(plain.state_dict()) == {"score_bias_log_weight"}
    assert float(biased.score_bias_log_weight.detach()) == 0.0  # w = 1 at the start
    assert "score_bias_log_weight" not in _fid(task, fid_score_bias=True, fid_attention_temperature=2.0).state_dict()
    ni = _select(_batch(task), torch.arange(5), drop=("prev_output_tokens", "src_lengths"))
    assert PRIOR_KEY not in plain.fused_encode(**ni)[0] and plain.score_bias_weight() is None
    assert PRIOR_KEY in biased.fused_encode(**ni)[0]


def test_bias_at_zero_weight_equals_plain_fid_exactly(tiny_world):
    """w = exp(-inf) = 0: training logits bit-identical, and the same hypotheses and scores; at w = 1 they differ
    (the bias is applied)."""
    task = _task(tiny_world)
    plain, biased = _fid(task, doubled=True), _fid(task, doubled=True, fid_score_bias=True)
    biased.load_state_dict(plain.state_dict())  # a plain FiD checkpoint loads: the weight starts at 1
    assert float(biased.score_bias_log_weight.detach()) == 0.0
    sample = _batch(task)
    plain.train(), biased.train()
    _set_weight(biased, 0.0)
    assert torch.equal(plain(**sample["net_input"])[0], biased(**sample["net_input"])[0])
    _set_weight(biased, 1.0)
    assert not torch.allclose(plain(**sample["net_input"])[0], biased(**sample["net_input"])[0], atol=1e-3)
    plain.eval(), biased.eval()
    _set_weight(biased, 0.0)
    for mine, theirs in zip(_generate(task, biased, sample, beam=4), _generate(task, plain, sample, beam=4)):
        assert len(mine) == len(theirs)
        for h, e in zip(mine, theirs):
            assert torch.equal(h["tokens"], e["tokens"]) and torch.equal(h["positional_scores"],
                                                                         e["positional_scores"])
            assert torch.equal(h["doc_attention"], e["doc_attention"])


# ---------------------------------------------------------------------------------------------------- the formula
class _PerHeadRecorder(CrossAttentionRecorder):
    """Every layer's cross-attention probabilities per head [heads, R, T, S] (not averaged)."""

    def _keep(self, module, args, output):
        self.layers.append(output[1].double())


def test_bias_shifts_cross_attention_as_the_formula_says(tiny_world, float64):
    """Layer 0 (whose queries the bias cannot change), every head: biased = softmax(a + w log p(z_k|x)) over the
    positions of passage k, computed from the plain probabilities (a up to a constant) by hand in float64; the
    ratio of two positions' probabilities moves by (p(z_k|x) / p(z_j|x))^w; padding gets no attention."""
    task = _task(tiny_world)
    w = 2.0
    model = float64(_fid(task, fid_score_bias=True, fid_attention_temperature=1 / w).eval())
    sample = _batch(task)
    ni = _select(sample, torch.arange(sample["id"].numel()), drop=("prev_output_tokens", "src_lengths"))
    with torch.no_grad():
        enc, doc_scores, _ = model.fused_encode(**ni)
        prev = sample["net_input"]["prev_output_tokens"]
        with _PerHeadRecorder(model.generator.decoder) as plain:
            model.generator.decoder(prev, encoder_out=enc)
        with _PerHeadRecorder(model.generator.decoder) as biased:
            model.fused_decode(prev, enc)
    lp = torch.log_softmax(doc_scores.double(), -1)                                # [B, K]
    s = enc["encoder_out"][0].size(0)
    passage = torch.arange(s) // (s // K)                                          # position -> its passage
    b_pos = (w * lp)[:, passage]                                                   # [B, S]
    pad = enc["encoder_padding_mask"][0]
    a = plain.layers[0]                                                            # [H, B, T, S]
    assert a.size(0) > 1  # several heads: the bias's (row, head) layout is checked
    logits = torch.log(a) + b_pos[None, :, None, :]
    expected = torch.softmax(logits.masked_fill(pad[None, :, None, :], -math.inf), -1)
    torch.testing.assert_close(biased.layers[0], expected, atol=1e-12, rtol=1e-9)
    assert (biased.layers[0] - a).abs().max() > 1e-3  # it moved
    assert float(biased.layers[0].masked_select(pad[None, :, None, :].expand_as(a)).abs().max()) == 0.0
    # ratios: positions i in passage k, j in passage 0 of question 0, head 0, step 0
    i, j = int((~pad[0] & passage.eq(2)).nonzero()[0]), int((~pad[0] & passage.eq(0)).nonzero()[0])
    ratio = biased.layers[0][0, 0, 0, i] / biased.layers[0][0, 0, 0, j]
    assert float(ratio) == pytest.approx(float(a[0, 0, 0, i] / a[0, 0, 0, j] * torch.exp(w * (lp[0, 2] - lp[0, 0]))),
                                         rel=1e-9)
    assert all((x - y).abs().max() > 1e-3 for x, y in zip(biased.layers[1:], plain.layers[1:]))  # every layer


def test_score_bias_lays_the_bias_out_per_key_row_beam_and_head_and_restores(tiny_world):
    """fairseq's grouped logits (key/value row, beams, heads): each slice gets its row's bias; the instances get the
    class's apply_sparse_mask back on exit, an exception's too."""
    model = _fid(_task(tiny_world))
    decoder = model.generator.decoder
    attn = decoder.layers[0].encoder_attn
    heads, rows, beams, t, s = attn.num_heads, 2, 3, 4, 6
    bias = torch.randn(rows, s)
    with ScoreBias(decoder, bias):
        out = attn.apply_sparse_mask(torch.zeros(rows * beams * heads, t, s), t, s, rows * beams)
        assert all("apply_sparse_mask" in layer.encoder_attn.__dict__ for layer in decoder.layers)
    grouped = out.view(rows, beams, heads, t, s)
    for r in range(rows):
        assert torch.equal(grouped[r], bias[r].expand(beams, heads, t, s))
    assert not any("apply_sparse_mask" in layer.encoder_attn.__dict__ for layer in decoder.layers)
    with pytest.raises(RuntimeError, match="boom"):
        with ScoreBias(decoder, bias):
            raise RuntimeError("boom")
    assert not any("apply_sparse_mask" in layer.encoder_attn.__dict__ for layer in decoder.layers)
    zeros = torch.zeros(2, t, s)
    assert attn.apply_sparse_mask(zeros, t, s, 2) is zeros


# -------------------------------------------------------------------------------------------------- beam search
@pytest.mark.parametrize("beam", [1, 4])
def test_beam_scores_with_the_bias_equal_teacher_forced_scores(tiny_world, beam):
    """The prior follows the search's beams and its finished questions: each hypothesis's scores equal the training
    forward's on it (and --score-reference's); without the bias they are other scores."""
    task = _task(tiny_world)
    model = _fid(task, seed=1, doubled=True, fid_score_bias=True).eval()
    _set_weight(model, 3.0)
    sample = _batch(task)
    key_rows = []
    hook = model.generator.decoder.layers[0].encoder_attn.register_forward_pre_hook(
        lambda m, a, kw: key_rows.append((kw["key"].size(1), kw["query"].size(1))), with_kwargs=True)
    try:
        hypos = _generate(task, model, sample, beam=beam)
    finally:
        hook.remove()
    if beam > 1:
        assert any(k < sample["id"].numel() for k, q in key_rows if q > k)  # finished questions left the search
    owner = torch.tensor([i for i, hyps in enumerate(hypos) for _ in hyps])
    tokens = [h["tokens"] for hyps in hypos for h in hyps]
    assert len({len(t) for t in tokens}) > 1
    forced, _, _ = _forced(model, sample, owner, tokens)
    for r, h in enumerate(h for hyps in hypos for h in hyps):
        n = len(h["tokens"])
        torch.testing.assert_close(h["positional_scores"], forced[r, :n], atol=1e-5, rtol=1e-5)
    _set_weight(model, 0.0)
    unbiased, _, _ = _forced(model, sample, owner, tokens)
    assert (unbiased - forced).abs().max() > 1e-2
    _set_weight(model, 3.0)
    best = [hyps[0]["tokens"] for hyps in hypos]
    ref = dict(sample)
    _, prev, ref["target"] = _forced(model, sample, torch.arange(len(best)), best)
    ref["net_input"] = dict(sample["net_input"], prev_output_tokens=prev)
    for hyps, scored in zip(hypos, task.build_generator([model], GenerationConfig(score_reference=True))
                            .generate([model], ref)):
        assert float(scored[0]["score"]) == pytest.approx(float(hyps[0]["score"]), abs=1e-5)
        torch.testing.assert_close(scored[0]["doc_attention"], hyps[0]["doc_attention"], atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ gradients
def _loss(model, sample, **net_input):
    logits, _ = model(**dict(sample["net_input"], **net_input))
    lp = torch.log_softmax(logits, -1).gather(-1, sample["target"].unsqueeze(-1)).squeeze(-1)
    return -(lp * sample["target"].ne(model.pad)).sum()


def test_learned_weight_gets_its_gradient(tiny_world, float64):
    """d loss / d score_bias_log_weight against central finite differences, float64."""
    task = _task(tiny_world, split="train")
    model = float64(_fid(task, fid_score_bias=True).eval())
    sample = _batch(task, "train")
    _set_weight(model, 1.5)
    loss = _loss(model, sample)
    (grad,) = torch.autograd.grad(loss, [model.score_bias_log_weight])
    h, theta = 1e-5, float(model.score_bias_log_weight.detach())
    values = []
    for step in (h, -h):
        with torch.no_grad():
            model.score_bias_log_weight.fill_(theta + step)
            values.append(float(_loss(model, sample)))
    assert abs(float(grad)) > 1e-3
    assert float(grad) == pytest.approx((values[0] - values[1]) / (2 * h), rel=1e-6)


def test_the_bias_is_differentiable_in_the_retrieval_scores(tiny_world, float64):
    """Scores with a graph (a trainable retriever's, a reranker's) get the answer's gradient through the bias
    (checked against finite differences in float64 on the prior's scores); FiD's fixed query encoder gets none."""
    task = _task(tiny_world, split="train")
    model = float64(_fid(task, fid_score_bias=True, fid_attention_temperature=0.5).eval())
    sample = _batch(task, "train")
    ni = _select(sample, torch.arange(sample["id"].numel()), drop=("prev_output_tokens", "src_lengths"))
    with torch.no_grad():
        enc, doc_scores, _ = model.fused_encode(**ni)
    prev, target = sample["net_input"]["prev_output_tokens"], sample["target"]

    def loss_of(scores):
        logits, _ = model.fused_decode(prev, with_prior(enc, torch.log_softmax(scores, -1)))
        lp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return -(lp * target.ne(model.pad)).sum()

    scores = doc_scores.detach().double().requires_grad_()
    (grad,) = torch.autograd.grad(loss_of(scores), [scores])
    h = 1e-5
    for i, j in ((0, 0), (3, 2)):
        up, down = scores.detach().clone(), scores.detach().clone()
        up[i, j] += h
        down[i, j] -= h
        with torch.no_grad():
            numeric = (float(loss_of(up)) - float(loss_of(down))) / (2 * h)
        assert abs(numeric) > 1e-4 and float(grad[i, j]) == pytest.approx(numeric, rel=1e-5)
    # through the model's forward: scores handed with a graph keep it; the fixed query encoder gets nothing
    model.train()
    fixed = doc_scores.detach().float().requires_grad_()
    loss, _, _ = CrossEntropyCriterion(task, sentence_avg=False)(model, dict(sample, net_input=dict(
        sample["net_input"], fixed_doc_rows=_retrieved_rows(model, ni), fixed_doc_scores=fixed)))
    loss.backward()
    assert fixed.grad is not None and float(fixed.grad.abs().sum()) > 0
    assert all(p.grad is None for p in model.query_encoder.parameters())


def _retrieved_rows(model, ni):
    with torch.no_grad():
        return model.fused_encode(**ni)[2]


# ------------------------------------------------------------------------------------------------ random passages
def test_draw_outside_is_uniform_over_the_rest():
    torch.manual_seed(0)
    counts = np.bincount([R.draw_outside(6, [4, 0, 2, 2]) for _ in range(3000)], minlength=6)
    assert counts[[0, 2, 4]].sum() == 0 and all(abs(c - 1000) < 120 for c in counts[[1, 3, 5]])
    assert R.draw_outside(3, [0, 1, 2]) is None


def _retrieval(model, ni, training):
    model.train(training)
    with torch.no_grad():
        return model.retrieve(ni.get("query_tokens"), ni.get("query_mask"), K, ni.get("fixed_doc_rows"),
                              ni.get("fixed_doc_scores"), ni["src_tokens"])


def test_random_passages_replace_exactly_the_last_passage_with_its_dense_score(tiny_world):
    """P = 1: each question's last passage is a random one not among its K, logit scale * q.d from its stored
    vector; the others as retrieved; reproducible from torch's seed; never in evaluation."""
    task = _task(tiny_world, split="train")
    model = _fid(task, fid_random_passages=1.0)
    ni = _batch(task, "train")["net_input"]
    scores, rows = _retrieval(model, ni, training=False)
    torch.manual_seed(3)
    mixed_scores, mixed = _retrieval(model, ni, training=True)
    assert torch.equal(mixed[:, :-1], rows[:, :-1]) and torch.equal(mixed_scores[:, :-1], scores[:, :-1])
    assert all(int(new) not in row.tolist() for new, row in zip(mixed[:, -1], rows))
    with torch.no_grad():
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
    d = torch.from_numpy(model.retriever.doc_vectors(mixed[:, -1:].numpy()))
    torch.testing.assert_close(mixed_scores[:, -1:], inner_products(d, q, model.doc_score_scale), atol=1e-5, rtol=1e-6)
    torch.manual_seed(3)
    assert torch.equal(_retrieval(model, ni, training=True)[1], mixed)
    assert torch.equal(_retrieval(model, ni, training=False)[1], rows)
    # the training forward reads them
    torch.manual_seed(3)
    model.train()
    with torch.no_grad():
        assert torch.equal(model(**ni)[1]["doc_rows"], mixed)


def test_random_passages_at_zero_or_half(tiny_world):
    """P = 0: the batch and torch's generator untouched; P = 0.5: some questions read a random passage, others not."""
    task = _task(tiny_world, split="train")
    ni = _batch(task, "train")["net_input"]
    plain = _fid(task)
    scores, rows = _retrieval(plain, ni, training=False)
    state = torch.get_rng_state()
    zero_scores, zero_rows = _retrieval(_fid(task, fid_random_passages=0.0), ni, training=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(zero_rows, rows) and torch.equal(zero_scores, scores)
    torch.manual_seed(0)
    _, half = _retrieval(_fid(task, fid_random_passages=0.5), ni, training=True)
    changed = half[:, -1].ne(rows[:, -1])
    assert torch.equal(half[:, :-1], rows[:, :-1]) and 0 < int(changed.sum()) < rows.size(0)


def test_random_passages_without_a_dense_score_take_the_margin_rule(tiny_world):
    """BM25 (and hybrid, and a reranker's scores): the random passage's logit is the minimum of the question's K
    logits minus RANDOM_LOGIT_MARGIN."""
    task = _task(tiny_world, split="train", retriever="bm25")
    model = _fid(task, fid_random_passages=1.0)
    ni = _batch(task, "train")["net_input"]
    scores, rows = _retrieval(model, ni, training=False)
    mixed_scores, mixed = _retrieval(model, ni, training=True)
    assert all(int(new) not in row.tolist() for new, row in zip(mixed[:, -1], rows))
    torch.testing.assert_close(mixed_scores[:, -1], scores.min(1).values - R.RANDOM_LOGIT_MARGIN)


# ---------------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("options, needle", [
    (dict(fid_score_bias=True, fid_attention_temperature=-1.0), "--fid-attention-temperature -1.0 is negative"),
    (dict(fid_score_bias=True, fid_attention_temperature=float("nan")), "temperature nan is not a number"),
    (dict(fid_attention_temperature=2.0), "the bias is off"),
    (dict(fid_random_passages=1.5), "--fid-random-passages 1.5 is not a probability"),
    (dict(fid_random_passages=-0.1), "--fid-random-passages -0.1"),
])
def test_bad_values_are_one_line_errors(tiny_world, options, needle):
    with pytest.raises(UserError, match=needle) as e:
        _fid(_task(tiny_world), **options)
    assert "\n" not in str(e.value)


def test_random_passages_without_the_bias_are_allowed(tiny_world):
    model = _fid(_task(tiny_world), fid_random_passages=0.5)
    assert model.score_bias_weight() is None and "score_bias_log_weight" not in model.state_dict()


# ----------------------------------------------------------------------------------------------- the command line
def test_fairseq_train_and_generate_with_the_score_bias(tiny_world, tmp_path):
    """fairseq-train (2 updates, --fid-score-bias --fid-random-passages 0.5) learns the weight; fairseq-generate reads
    its checkpoint; a plain FiD checkpoint from before these options (no options saved, no weight) still generates."""
    from rag_plugin.util.safe_load import checkpoint_types_allowed
    from tests.generation.test_fid_cli import _run, _train

    save = tmp_path / "fid_sb"
    r = _train(tiny_world, save, "--arch", "fid_tiny", "--criterion", "cross_entropy", "--n-docs", "3",
               "--fid-score-bias", "--fid-random-passages", "0.5", "--dropout", "0", "--max-update", "2",
               "--disable-validation")
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = save / "checkpoint_last.pt"
    with checkpoint_types_allowed():
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert state["cfg"]["model"]["fid_score_bias"] and state["cfg"]["model"]["fid_random_passages"] == 0.5
    assert 0 < abs(float(state["model"]["score_bias_log_weight"])) < 0.1  # it learned (Adam's steps: about --lr)
    for path in (ckpt, _as_plain_fid(state, tmp_path / "plain.pt")):
        r = _run("fairseq-generate", tiny_world, "--path", path, "--gen-subset", "test", "--beam", "4",
                 "--max-len-b", "8")
        assert r.returncode == 0, r.stderr[-3000:]
        assert sum(line.startswith("H-") for line in r.stdout.splitlines()) == len(tiny_world["countries"]) - 35


def _as_plain_fid(state, path):
    """The checkpoint as plain FiD saved it before --fid-score-bias existed: no such options, no weight."""
    new = ("fid_score_bias", "fid_attention_temperature", "fid_random_passages")
    model_cfg = {key: value for key, value in state["cfg"]["model"].items() if key not in new}
    state = dict(state, model={k: v for k, v in state["model"].items() if k != "score_bias_log_weight"},
                 cfg=dict(state["cfg"], model=model_cfg))
    torch.save(state, path)
    return path


@pytest.mark.parametrize("args, needles", [
    (["--arch", "rag_token_tiny", "--criterion", "marginal_nll", "--fid-score-bias"], ["--fid-score-bias"]),
    (["--arch", "fid_tiny", "--criterion", "cross_entropy", "--fid-score-bias", "--fid-attention-temperature", "-1"],
     ["--fid-attention-temperature -1.0 is negative"]),
    (["--arch", "fid_tiny", "--criterion", "cross_entropy", "--fid-random-passages", "2"],
     ["--fid-random-passages 2.0 is not a probability"]),
])
def test_bad_options_on_the_command_line_are_one_line_errors(tiny_world, tmp_path, args, needles):
    from tests.generation.test_fid_cli import _assert_one_line_error, _train

    r = _train(tiny_world, tmp_path / "save", *args, "--n-docs", "3", "--max-update", "1")
    _assert_one_line_error(r, *needles)
