"""Retriever losses (rag_plugin.core.retriever_losses) against their formulas computed by hand in numpy,
finite-difference gradients (float64), zero where the two distributions agree, and no gradient to the reader."""
import numpy as np
import pytest
import torch

from rag_plugin.core import marginalization as M
from rag_plugin.core import retriever_losses as R

B, K, T = 3, 4, 5


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_kl(target_logits, scores, temp):
    p = np.exp(_np_log_softmax(target_logits))
    q = _np_log_softmax(scores / temp)
    return (p * (np.log(p) - q)).sum(-1)


def _np_emdr2(scores, seq_lp, temp):
    q = np.exp(_np_log_softmax(scores / temp))
    return -np.log((q * np.exp(seq_lp)).sum(-1))


def _np_loo(token_lp, doc_lp, mask, variant):
    """log p(y|x, D without k) by enumeration, one document left out at a time."""
    b, k, _ = token_lp.shape
    out = np.zeros((b, k))
    for i in range(b):
        for j in range(k):
            keep = [z for z in range(k) if z != j]
            prior = np.exp(doc_lp[i, keep])
            prior = prior / prior.sum()
            p = np.exp(token_lp[i, keep])                        # [K-1, T]
            if variant == "sequence":
                out[i, j] = np.log((prior * np.prod(np.where(mask[i], p, 1.0), -1)).sum())
            else:
                per_t = (prior[:, None] * p).sum(0)
                out[i, j] = np.log(np.where(mask[i], per_t, 1.0)).sum()
    return out


def _fd_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        g[idx] = (f(up).sum() - f(down).sum()) / (2 * eps)
    return g


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(B, K)) * 2
    token_lp = np.log(rng.uniform(0.05, 0.95, size=(B, K, T)))
    mask = np.ones((B, T), dtype=bool)
    mask[0, 3:] = False
    mask[2, 4:] = False
    seq_lp = np.where(mask[:, None, :], token_lp, 0.0).sum(-1)
    doc_lp = _np_log_softmax(rng.normal(size=(B, K)))
    return dict(scores=scores, token_lp=token_lp, mask=mask, seq_lp=seq_lp, doc_lp=doc_lp,
                attn=rng.normal(size=(B, K)))


def _t(x, grad=False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("temp", [1.0, 0.3])
def test_pdist_adist_emdr2_values_and_gradients(data, temp):
    s, seq, attn = data["scores"], data["seq_lp"], data["attn"]
    cases = {
        "pdist": (lambda x: R.pdist_loss(x, _t(seq, True), temp), lambda x: _np_kl(seq, x, temp)),
        "adist": (lambda x: R.adist_loss(x, _t(attn, True), temp), lambda x: _np_kl(attn, x, temp)),
        "emdr2": (lambda x: R.emdr2_loss(x, _t(seq, True), temp), lambda x: _np_emdr2(x, seq, temp)),
    }
    for name, (ours, ref) in cases.items():
        x = _t(s, True)
        value = ours(x)
        np.testing.assert_allclose(value.detach().numpy(), ref(s), rtol=1e-10, err_msg=name)
        value.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), _fd_grad(ref, s), atol=1e-7, err_msg=name)


def test_reader_side_gets_no_gradient(data):
    s = _t(data["scores"], True)
    seq, attn = _t(data["seq_lp"], True), _t(data["attn"], True)
    tok, prior = _t(data["token_lp"], True), _t(data["doc_lp"], True)
    mask = torch.tensor(data["mask"])
    total = (R.pdist_loss(s, seq) + R.adist_loss(s, attn) + R.emdr2_loss(s, seq)
             + R.loop_loss(s, tok, prior, mask, "token")).sum()
    total.backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    for reader in (seq, attn, tok, prior):
        assert reader.grad is None


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_leave_one_out_likelihood_by_enumeration_and_by_the_marginal(data, variant):
    tok, prior, mask = data["token_lp"], data["doc_lp"], data["mask"]
    ours = R.leave_one_out_log_likelihood(_t(tok), _t(prior), torch.tensor(mask), variant).numpy()
    np.testing.assert_allclose(ours, _np_loo(tok, prior, mask, variant), rtol=1e-10)
    # the same through the marginals of core/marginalization.py, the document removed
    nll = M.rag_sequence_nll if variant == "sequence" else M.rag_token_nll
    for j in range(K):
        keep = [z for z in range(K) if z != j]
        sub_prior = torch.log_softmax(_t(prior[:, keep]), -1)
        ref = -nll(_t(tok[:, keep]), sub_prior, torch.tensor(mask)).numpy()
        np.testing.assert_allclose(ours[:, j], ref, rtol=1e-10)


@pytest.mark.parametrize("variant", ["sequence", "token"])
@pytest.mark.parametrize("temp", [1.0, 2.0])
def test_loop_value_and_gradient(data, variant, temp):
    tok, prior, mask, s = data["token_lp"], data["doc_lp"], data["mask"], data["scores"]
    target_logits = -_np_loo(tok, prior, mask, variant)

    def ref(x):
        return _np_kl(target_logits, x, temp)

    x = _t(s, True)
    value = R.loop_loss(x, _t(tok), _t(prior), torch.tensor(mask), variant, temp)
    np.testing.assert_allclose(value.detach().numpy(), ref(s), rtol=1e-10)
    value.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), _fd_grad(ref, s), atol=1e-7)


def test_kl_losses_are_zero_where_the_distributions_agree(data):
    temp, shift = 0.5, np.array([[3.0], [-1.0], [0.2]])
    seq, attn = data["seq_lp"], data["attn"]
    for loss, target in ((R.pdist_loss, seq), (R.adist_loss, attn)):
        x = _t(temp * (target + shift), True)          # s / T = target logits + constant
        value = loss(x, _t(target), temp)
        value.sum().backward()
        np.testing.assert_allclose(value.detach().numpy(), 0.0, atol=1e-12)
        np.testing.assert_allclose(x.grad.numpy(), 0.0, atol=1e-12)
    tok, prior, mask = data["token_lp"], data["doc_lp"], torch.tensor(data["mask"])
    loo = R.leave_one_out_log_likelihood(_t(tok), _t(prior), mask, "token").numpy()
    x = _t(temp * (-loo + shift), True)
    value = R.loop_loss(x, _t(tok), _t(prior), mask, "token", temp)
    value.sum().backward()
    np.testing.assert_allclose(value.detach().numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), 0.0, atol=1e-12)


def test_emdr2_stationary_and_minimal(data):
    # the same p(y|x,z) under every document: no gradient, value -log p(y|x,z)
    s = _t(data["scores"], True)
    same = np.repeat(data["seq_lp"][:, :1], K, axis=1)
    value = R.emdr2_loss(s, _t(same))
    value.sum().backward()
    np.testing.assert_allclose(value.detach().numpy(), -same[:, 0], rtol=1e-12)
    np.testing.assert_allclose(s.grad.numpy(), 0.0, atol=1e-12)
    # the minimum over retrievers: all mass on the best document, -log max_k p(y|x,z_k)
    seq = data["seq_lp"]
    best = np.where(np.arange(K)[None, :] == seq.argmax(-1)[:, None], 60.0, 0.0)
    np.testing.assert_allclose(R.emdr2_loss(_t(best), _t(seq)).numpy(), -seq.max(-1), rtol=1e-9)
    rng = np.random.default_rng(1)
    for _ in range(20):
        assert (R.emdr2_loss(_t(rng.normal(size=(B, K)) * 3), _t(seq)).numpy() >= -seq.max(-1) - 1e-12).all()


def test_a_target_with_the_retriever_prior_would_duplicate_emdr2(data):
    """Why pdist's target has a uniform prior: with the retriever's prior in it, the gradient is EMDR²'s."""
    s, seq = data["scores"], data["seq_lp"]
    x1, x2 = _t(s, True), _t(s, True)
    posterior = torch.log_softmax(torch.log_softmax(x1, -1) + _t(seq), -1).detach()
    R.kl_from_target(posterior, torch.log_softmax(x1, -1)).sum().backward()
    R.emdr2_loss(x2, _t(seq)).sum().backward()
    np.testing.assert_allclose(x1.grad.numpy(), x2.grad.numpy(), atol=1e-12)
    assert not np.allclose(x1.grad.numpy(), _fd_grad(lambda x: _np_kl(seq, x, 1.0), s), atol=1e-3)


def test_excluded_documents_and_bad_shapes(data):
    s = data["scores"].copy()
    s[:, -1] = -np.inf
    seq = data["seq_lp"]
    x = _t(s, True)
    value = R.pdist_loss(x, _t(seq))
    value.sum().backward()
    np.testing.assert_allclose(value.detach().numpy(), _np_kl(seq[:, :-1], s[:, :-1], 1.0), rtol=1e-10)
    np.testing.assert_allclose(R.emdr2_loss(_t(s), _t(seq)).numpy(), _np_emdr2(s[:, :-1], seq[:, :-1], 1.0),
                               rtol=1e-10)
    assert torch.isfinite(x.grad).all() and (x.grad[:, -1] == 0).all()
    with pytest.raises(ValueError, match="K >= 2"):
        R.leave_one_out_log_likelihood(_t(data["token_lp"][:, :1]), _t(data["doc_lp"][:, :1]),
                                       torch.tensor(data["mask"]), "token")
    with pytest.raises(ValueError, match="temperature"):
        R.retriever_log_probs(_t(s), 0.0)
    with pytest.raises(ValueError, match="doc_scores"):
        R.pdist_loss(_t(s), _t(seq[:, :2]))


def test_emdr2_at_temperature_1_is_the_rag_sequence_marginal(data):
    """EMDR² at T = 1 is RAG-Sequence's marginal NLL as a function of the retriever's scores (the reader fixed):
    added to RAG-Sequence it only rescales the query encoder's gradient."""
    tok, mask = _t(data["token_lp"]), torch.tensor(data["mask"])
    x1, x2 = _t(data["scores"], True), _t(data["scores"], True)
    seq = R.sequence_log_likelihood(tok, mask)
    value = R.emdr2_loss(x1, seq)
    marginal = M.rag_sequence_nll(tok, torch.log_softmax(x2, -1), mask)
    torch.testing.assert_close(value, marginal, rtol=1e-12, atol=1e-12)
    value.sum().backward()
    marginal.sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target_temp", [0.1, 3.0])
def test_target_temperature_sharpens_or_flattens_the_target(data, target_temp):
    """Atlas's temperature_gold: the target is softmax(target logits / T_t), for pdist, adist and loop alike."""
    s, seq, attn, temp = data["scores"], data["seq_lp"], data["attn"], 0.5
    tok, prior, mask = data["token_lp"], data["doc_lp"], data["mask"]
    loo = -_np_loo(tok, prior, mask, "token")
    cases = {
        "pdist": (lambda x: R.pdist_loss(x, _t(seq), temp, target_temp), seq),
        "adist": (lambda x: R.adist_loss(x, _t(attn), temp, target_temp), attn),
        "loop": (lambda x: R.loop_loss(x, _t(tok), _t(prior), torch.tensor(mask), "token", temp,
                                       target_temperature=target_temp), loo),
    }
    for name, (ours, logits) in cases.items():
        def ref(x, logits=logits):
            return _np_kl(logits / target_temp, x, temp)

        x = _t(s, True)
        value = ours(x)
        np.testing.assert_allclose(value.detach().numpy(), ref(s), rtol=1e-10, err_msg=name)
        value.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), _fd_grad(ref, s), atol=1e-7, err_msg=name)
    with pytest.raises(ValueError, match="temperature must be positive"):
        R.pdist_loss(_t(s), _t(seq), temp, 0.0)
