"""rag_plugin.core.marginalization against brute force that enumerates documents explicitly.

The reference values are computed in plain Python floats (float64) with explicit loops
over documents k and positions t (and, for RAG-Token, over all K^T per-token document
assignments), straight from the paper's definitions:

    RAG-Sequence  p(y|x) = sum_z p(z|x) prod_t p(y_t|x,z,y_<t)
    RAG-Token     p(y|x) = prod_t sum_z p(z|x) p(y_t|x,z,y_<t)
                         = sum_{z_1..z_T} prod_t p(z_t|x) p(y_t|x,z_t,y_<t)
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_plugin.core import marginalization as M

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- fixtures


def make_case(B=3, K=4, T=5, V=7, seed=0, pad=True, doc_pad=True, poison=True):
    """Random inputs; padding positions and masked documents are filled with junk.

    Returns dict with doc_scores [B,K], doc_mask [B,K], lprobs [B,K,T,V] (log_softmax),
    target [B,T], target_mask [B,T]. With ``poison``, target log-probs at padding are
    -inf and masked documents' lprobs are NaN: the functions must ignore both.
    """
    g = torch.Generator().manual_seed(seed)
    doc_scores = torch.randn(B, K, generator=g, dtype=DT) * 2
    lprobs = torch.log_softmax(torch.randn(B, K, T, V, generator=g, dtype=DT) * 1.5, -1)
    target = torch.randint(0, V, (B, T), generator=g)
    if pad:
        lengths = torch.randint(1, T + 1, (B,), generator=g)
        lengths[0] = T
        target_mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    else:
        target_mask = torch.ones(B, T, dtype=torch.bool)
    doc_mask = torch.ones(B, K, dtype=torch.bool)
    if doc_pad and K > 1:
        doc_mask[-1, K // 2:] = False  # last row: only the first K//2 docs exist
        if B > 1:
            doc_mask[0, 0] = False  # first row: the top-scored slot is missing
    if poison:
        lprobs = lprobs.clone()
        b, t = (~target_mask).nonzero(as_tuple=True)
        lprobs[b, :, t, target[b, t]] = float("-inf")
        lprobs[~doc_mask] = float("nan")
    return dict(doc_scores=doc_scores, doc_mask=doc_mask, lprobs=lprobs, target=target,
                target_mask=target_mask)


def py_prior(scores, mask):
    """[K] floats -> [K] probabilities (0 for masked), explicit softmax."""
    m = max(s for s, keep in zip(scores, mask) if keep)
    w = [math.exp(s - m) if keep else 0.0 for s, keep in zip(scores, mask)]
    z = sum(w)
    return [x / z for x in w]


def py_logsumexp(xs):
    xs = [x for x in xs if x != float("-inf")]
    if not xs:
        return float("-inf")
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


def unpack(case, b):
    """Python-list view of batch row b: prior[K], tlp[K][T], lp[K][T][V], y[T], mask[T]."""
    prior = py_prior(case["doc_scores"][b].tolist(), case["doc_mask"][b].tolist())
    lp = case["lprobs"][b].tolist()
    y = case["target"][b].tolist()
    mask = case["target_mask"][b].tolist()
    K, T = len(prior), len(y)
    tlp = [[lp[k][t][y[t]] for t in range(T)] for k in range(K)]
    return prior, tlp, lp, y, mask


def bf_seq_nll(prior, tlp, mask):
    total = 0.0
    for k, pz in enumerate(prior):
        if pz == 0.0:
            continue
        p_y = 1.0
        for t, keep in enumerate(mask):
            if keep:
                p_y *= math.exp(tlp[k][t])
        total += pz * p_y
    return -math.log(total)


def bf_token_nll(prior, tlp, mask):
    nll = 0.0
    for t, keep in enumerate(mask):
        if not keep:
            continue
        p_t = sum(pz * math.exp(tlp[k][t]) for k, pz in enumerate(prior) if pz > 0.0)
        nll -= math.log(p_t)
    return nll


def bf_token_enumerated(prior, tlp, mask):
    """Sum over all K^T' per-token document assignments (T' = scored positions).

    Returns (p(y|x), post) with post[k][t] = p(z_t = k | x, y) for scored t.
    """
    K = len(prior)
    pos = [t for t, keep in enumerate(mask) if keep]
    total = 0.0
    post = [[0.0] * len(mask) for _ in range(K)]
    for zs in itertools.product(range(K), repeat=len(pos)):
        p = 1.0
        for z, t in zip(zs, pos):
            p *= prior[z] * (math.exp(tlp[z][t]) if prior[z] > 0 else 0.0)
        total += p
        for z, t in zip(zs, pos):
            post[z][t] += p
    post = [[v / total for v in row] for row in post]
    return total, post


def prior_of(case):
    return M.doc_log_prior(case["doc_scores"], case["doc_mask"])


def token_lp_of(case):
    return M.target_token_log_probs(case["lprobs"], case["target"])


# ----------------------------------------------------------------------------- prior


def test_doc_log_prior_matches_softmax_and_masks():
    case = make_case()
    lp = prior_of(case)
    for b in range(lp.size(0)):
        prior = py_prior(case["doc_scores"][b].tolist(), case["doc_mask"][b].tolist())
        for k, pz in enumerate(prior):
            if pz == 0.0:
                assert lp[b, k].item() == float("-inf")
            else:
                assert math.isclose(lp[b, k].item(), math.log(pz), rel_tol=1e-12)
    torch.testing.assert_close(torch.logsumexp(lp, 1), torch.zeros(lp.size(0), dtype=DT))


def test_doc_log_prior_all_masked_row_is_an_error():
    scores = torch.zeros(2, 3, dtype=DT)
    mask = torch.tensor([[True, False, False], [False, False, False]])
    with pytest.raises(ValueError, match=r"row\(s\) \[1\]"):
        M.doc_log_prior(scores, mask)


def test_doc_log_prior_shift_invariant():
    s = torch.randn(2, 5, dtype=DT)
    torch.testing.assert_close(M.doc_log_prior(s), M.doc_log_prior(s + 123.0), **TOL)


# ----------------------------------------------------------------------------- gather


def test_target_token_log_probs_is_a_gather():
    case = make_case(poison=False)
    got = token_lp_of(case)
    B, K, T, _ = case["lprobs"].shape
    assert got.shape == (B, K, T)
    for b, k, t in itertools.product(range(B), range(K), range(T)):
        assert got[b, k, t] == case["lprobs"][b, k, t, case["target"][b, t]]


# ----------------------------------------------------------------------------- NLLs


@pytest.mark.parametrize("seed", range(4))
def test_nlls_match_brute_force_with_padding_and_masked_docs(seed):
    case = make_case(seed=seed)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    seq = M.rag_sequence_nll(tlp, doc_lp, case["target_mask"])
    tok = M.rag_token_nll(tlp, doc_lp, case["target_mask"])
    assert torch.isfinite(seq).all() and torch.isfinite(tok).all()
    for b in range(seq.size(0)):
        prior, tl, _, _, mask = unpack(case, b)
        assert math.isclose(seq[b].item(), bf_seq_nll(prior, tl, mask), rel_tol=1e-10)
        assert math.isclose(tok[b].item(), bf_token_nll(prior, tl, mask), rel_tol=1e-10)


@pytest.mark.parametrize("K,T", [(2, 3), (3, 3), (3, 4), (4, 2)])
def test_rag_token_equals_sum_over_all_document_assignments(K, T):
    case = make_case(B=2, K=K, T=T, V=5, seed=K * 10 + T)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    tok = M.rag_token_nll(tlp, doc_lp, case["target_mask"])
    for b in range(2):
        prior, tl, _, _, mask = unpack(case, b)
        p_y, _ = bf_token_enumerated(prior, tl, mask)
        assert math.isclose(tok[b].item(), -math.log(p_y), rel_tol=1e-10)


def test_k_equals_one_reduces_to_seq2seq_nll():
    case = make_case(K=1, doc_pad=False)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    assert (doc_lp == 0).all()
    mask = case["target_mask"]
    plain = -torch.where(mask, tlp[:, 0], torch.zeros_like(tlp[:, 0])).sum(-1)
    torch.testing.assert_close(M.rag_sequence_nll(tlp, doc_lp, mask), plain, **TOL)
    torch.testing.assert_close(M.rag_token_nll(tlp, doc_lp, mask), plain, **TOL)


def test_one_token_targets_sequence_equals_token():
    case = make_case(T=1, pad=False, K=5, seed=3)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    mask = case["target_mask"]
    torch.testing.assert_close(M.rag_sequence_nll(tlp, doc_lp, mask),
                               M.rag_token_nll(tlp, doc_lp, mask), **TOL)


def test_fully_padded_target_has_zero_nll():
    case = make_case(T=3)
    mask = torch.zeros_like(case["target_mask"])
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    zeros = torch.zeros(mask.size(0), dtype=DT)
    torch.testing.assert_close(M.rag_sequence_nll(tlp, doc_lp, mask), zeros, **TOL)
    torch.testing.assert_close(M.rag_token_nll(tlp, doc_lp, mask), zeros, **TOL)


def test_extreme_log_probs_stay_finite():
    """Log-probs far below float underflow (exp(-2000) == 0) are handled exactly."""
    tlp = torch.full((1, 2, 3), -1000.0, dtype=DT)
    tlp[0, 1] = -1001.0
    doc_lp = torch.log(torch.tensor([[0.25, 0.75]], dtype=DT))
    mask = torch.ones(1, 3, dtype=torch.bool)
    seq = M.rag_sequence_nll(tlp, doc_lp, mask)
    expected = -(-3000.0 + math.log(0.25 + 0.75 * math.exp(-3.0)))
    assert math.isclose(seq.item(), expected, rel_tol=1e-12)
    tok = M.rag_token_nll(tlp, doc_lp, mask)
    assert math.isclose(tok.item(), -3 * (-1000.0 + math.log(0.25 + 0.75 * math.exp(-1.0))),
                        rel_tol=1e-12)


def test_shape_errors():
    tlp = torch.zeros(2, 3, 4, dtype=DT)
    doc_lp = torch.zeros(2, 3, dtype=DT)
    with pytest.raises(ValueError):
        M.rag_token_nll(tlp, doc_lp, torch.ones(2, 4))  # not bool
    with pytest.raises(ValueError):
        M.rag_sequence_nll(tlp, torch.zeros(2, 2, dtype=DT), torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------------------- marginal next-token


@pytest.mark.parametrize("with_t", [False, True])
def test_marginal_lprobs_match_brute_force_and_normalise(with_t):
    case = make_case(seed=7, pad=False)
    doc_lp = prior_of(case)
    lprobs = case["lprobs"] if with_t else case["lprobs"][:, :, 0]
    marg = M.rag_token_marginal_lprobs(lprobs, doc_lp)
    assert marg.shape == (lprobs.shape[:1] + lprobs.shape[2:])
    assert torch.isfinite(marg).all()  # NaN rows of masked documents are ignored
    torch.testing.assert_close(torch.logsumexp(marg, -1), torch.zeros(marg.shape[:-1], dtype=DT),
                               **TOL)
    B, K = doc_lp.shape
    for b in range(B):
        prior = py_prior(case["doc_scores"][b].tolist(), case["doc_mask"][b].tolist())
        flat_lp = lprobs[b].reshape(K, -1).tolist()
        flat_m = marg[b].reshape(-1).tolist()
        for i, m in enumerate(flat_m):
            p = sum(pz * math.exp(flat_lp[k][i]) for k, pz in enumerate(prior) if pz > 0)
            assert math.isclose(m, math.log(p), rel_tol=1e-10, abs_tol=1e-12)


def test_token_nll_is_nll_of_marginal():
    case = make_case(seed=11)
    doc_lp = prior_of(case)
    marg = M.rag_token_marginal_lprobs(case["lprobs"], doc_lp)  # [B,T,V]
    gathered = marg.gather(-1, case["target"].unsqueeze(-1)).squeeze(-1)
    mask = case["target_mask"]
    expected = -torch.where(mask, gathered, torch.zeros_like(gathered)).sum(-1)
    got = M.rag_token_nll(token_lp_of(case), doc_lp, mask)
    torch.testing.assert_close(got, expected, **TOL)


# ----------------------------------------------------------------------------- label smoothing


def bf_token_smoothed(prior, lp, y, mask, eps):
    V = len(lp[0][0])
    loss = 0.0
    for t, keep in enumerate(mask):
        if not keep:
            continue
        marg = [sum(pz * math.exp(lp[k][t][v]) for k, pz in enumerate(prior) if pz > 0)
                for v in range(V)]
        loss += (1 - eps) * -math.log(marg[y[t]]) + eps / V * -sum(math.log(m) for m in marg)
    return loss


def bf_sequence_smoothed(prior, lp, y, mask, eps, prior_weight):
    V = len(lp[0][0])
    K = len(prior)
    T = len(y)
    nll_terms, smooth_terms = [], []
    for k in range(K):
        if prior[k] == 0.0:
            continue
        ll = sum(lp[k][t][y[t]] for t in range(T) if mask[t])
        sm = sum(lp[k][t][v] for t in range(T) if mask[t] for v in range(V))
        nll_terms.append(math.log(prior[k]) + ll)
        smooth_terms.append(prior_weight * math.log(prior[k]) + sm)
    nll = -py_logsumexp(nll_terms)
    smooth = -py_logsumexp(smooth_terms)
    return (1 - eps) * nll + eps / V * smooth, nll


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_rag_token_label_smoothing_brute_force(eps):
    case = make_case(seed=5, poison=False)  # smoothing sums every vocab entry
    lprobs = case["lprobs"].clone()
    lprobs[~case["doc_mask"]] = float("nan")  # masked docs still ignored
    doc_lp = prior_of(case)
    loss, nll = M.rag_token_loss(lprobs, doc_lp, case["target"], case["target_mask"], eps)
    torch.testing.assert_close(nll, M.rag_token_nll(token_lp_of(case), doc_lp,
                                                    case["target_mask"]), **TOL)
    for b in range(loss.size(0)):
        prior, _, lp, y, mask = unpack(case, b)
        assert math.isclose(loss[b].item(), bf_token_smoothed(prior, lp, y, mask, eps),
                            rel_tol=1e-10)


@pytest.mark.parametrize("hf_compat", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
def test_rag_sequence_label_smoothing_brute_force(eps, hf_compat):
    case = make_case(seed=6, poison=False)
    lprobs = case["lprobs"].clone()
    lprobs[~case["doc_mask"]] = float("nan")
    doc_lp = prior_of(case)
    V = lprobs.size(-1)
    loss, nll = M.rag_sequence_loss(lprobs, doc_lp, case["target"], case["target_mask"], eps,
                                    hf_compat=hf_compat)
    for b in range(loss.size(0)):
        prior, _, lp, y, mask = unpack(case, b)
        want_loss, want_nll = bf_sequence_smoothed(prior, lp, y, mask, eps,
                                                   V if hf_compat else 1)
        assert math.isclose(loss[b].item(), want_loss, rel_tol=1e-10)
        assert math.isclose(nll[b].item(), want_nll, rel_tol=1e-10)


def test_label_smoothing_eps_zero_equals_nll_exactly():
    case = make_case(seed=9)
    doc_lp = prior_of(case)
    for fn in (M.rag_token_loss, M.rag_sequence_loss):
        loss, nll = fn(case["lprobs"], doc_lp, case["target"], case["target_mask"], 0.0)
        assert torch.equal(loss, nll)
        assert torch.isfinite(loss).all()


def _hf_rag_sequence_get_nll(seq_logprobs, doc_scores, target, pad, epsilon):
    """transformers' RagSequenceForGeneration.get_nll (target already shifted, no BOS skip)."""
    doc_logprobs = torch.log_softmax(doc_scores, dim=1).unsqueeze(-1).unsqueeze(-1)
    rag = torch.cat([seq_logprobs[:, :, :1], seq_logprobs[:, :, 1:2] + doc_logprobs,
                     seq_logprobs[:, :, 2:]], dim=2)
    n_docs = seq_logprobs.size(1)
    tgt = target.unsqueeze(1).unsqueeze(-1).repeat(1, n_docs, 1, 1)
    ll = rag.gather(-1, tgt)
    smooth = rag.sum(-1, keepdim=True)
    pad_mask = tgt.eq(pad)
    ll = ll.masked_fill(pad_mask, 0.0).squeeze(-1).sum(2).logsumexp(1)
    smooth = smooth.masked_fill(pad_mask, 0.0).squeeze(-1).sum(2).logsumexp(1)
    eps_i = epsilon / rag.size(-1)
    return (1.0 - epsilon) * -ll + eps_i * -smooth


def _hf_rag_token_get_nll(seq_logprobs, doc_scores, target, pad, epsilon):
    """transformers' RagTokenForGeneration.get_nll (target already shifted)."""
    doc_logprobs = torch.log_softmax(doc_scores, dim=1)
    rag = torch.logsumexp(seq_logprobs + doc_logprobs.unsqueeze(-1).unsqueeze(-1), dim=1)
    tgt = target.unsqueeze(-1)
    ll = rag.gather(-1, tgt)
    smooth = rag.sum(-1, keepdim=True)
    pad_mask = tgt.eq(pad)
    ll = ll.masked_fill(pad_mask, 0.0).squeeze(-1).sum(1)
    smooth = smooth.masked_fill(pad_mask, 0.0).squeeze(-1).sum(1)
    eps_i = epsilon / rag.size(-1)
    return (1.0 - epsilon) * -ll + eps_i * -smooth


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_parity_with_transformers_formulas(eps):
    """Same values as transformers' get_nll (re-expressed here) for >= 2 scored tokens."""
    case = make_case(B=4, K=3, T=6, V=9, seed=21, doc_pad=False, poison=False)
    pad = 0
    target = case["target"].clamp(min=1)
    target[1, 4:] = pad
    target[2, 2:] = pad
    mask = target.ne(pad)
    lprobs, scores = case["lprobs"], case["doc_scores"]
    doc_lp = M.doc_log_prior(scores)
    tok, _ = M.rag_token_loss(lprobs, doc_lp, target, mask, eps)
    torch.testing.assert_close(tok, _hf_rag_token_get_nll(lprobs, scores, target, pad, eps), **TOL)
    seq, _ = M.rag_sequence_loss(lprobs, doc_lp, target, mask, eps, hf_compat=True)
    torch.testing.assert_close(seq, _hf_rag_sequence_get_nll(lprobs, scores, target, pad, eps),
                               **TOL)


# ----------------------------------------------------------------------------- gradients


def _losses_from_scores(doc_scores, logits, target, target_mask, doc_mask):
    doc_lp = M.doc_log_prior(doc_scores, doc_mask)
    lprobs = torch.log_softmax(logits, -1)
    tlp = M.target_token_log_probs(lprobs, target)
    return (M.rag_sequence_nll(tlp, doc_lp, target_mask),
            M.rag_token_nll(tlp, doc_lp, target_mask))


def test_gradcheck_doc_scores_and_logits():
    case = make_case(B=2, K=3, T=3, V=4, seed=13, poison=False)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 3, 4, generator=g, dtype=DT, requires_grad=True)
    scores = case["doc_scores"].clone().requires_grad_(True)
    args = (case["target"], case["target_mask"], case["doc_mask"])
    assert torch.autograd.gradcheck(lambda s, l: _losses_from_scores(s, l, *args),
                                    (scores, logits))


def test_gradcheck_smoothed_losses():
    case = make_case(B=2, K=3, T=3, V=4, seed=14, poison=False)
    scores = case["doc_scores"].clone().requires_grad_(True)
    lprobs = case["lprobs"].clone().requires_grad_(True)
    t, m, dm = case["target"], case["target_mask"], case["doc_mask"]

    def f(s, lp):
        doc_lp = M.doc_log_prior(s, dm)
        return (M.rag_token_loss(lp, doc_lp, t, m, 0.1)[0],
                M.rag_sequence_loss(lp, doc_lp, t, m, 0.1)[0],
                M.rag_sequence_loss(lp, doc_lp, t, m, 0.1, hf_compat=True)[0])

    assert torch.autograd.gradcheck(f, (scores, lprobs))


def test_gradient_reaches_doc_scores_and_is_finite_despite_padding():
    """-inf at padded targets and NaN in masked documents must not leak into gradients."""
    case = make_case(seed=17)  # poisoned
    for nll_fn in (M.rag_sequence_nll, M.rag_token_nll):
        scores = case["doc_scores"].clone().requires_grad_(True)
        lprobs = case["lprobs"].clone().requires_grad_(True)
        doc_lp = M.doc_log_prior(scores, case["doc_mask"])
        tlp = M.target_token_log_probs(lprobs, case["target"])
        nll_fn(tlp, doc_lp, case["target_mask"]).sum().backward()
        assert torch.isfinite(scores.grad).all()
        assert torch.isfinite(lprobs.grad).all()
        assert (scores.grad[case["doc_mask"]].abs() > 0).any()
        assert (scores.grad[~case["doc_mask"]] == 0).all()
        # RAG-Sequence: d nll / d score_k = p(z_k|x) - p(z_k|x,y) exactly.
        if nll_fn is M.rag_sequence_nll:
            post = M.rag_sequence_doc_log_posterior(tlp.detach(), doc_lp.detach(),
                                                    case["target_mask"]).exp()
            torch.testing.assert_close(scores.grad, doc_lp.detach().exp() - post, **TOL)


# ----------------------------------------------------------------------------- RAG-Sequence decoding


def _seq_lp_case(B=2, K=3, H=4, seed=31):
    g = torch.Generator().manual_seed(seed)
    seq_lp = -torch.rand(B, K, H, generator=g, dtype=DT) * 10
    doc_lp = M.doc_log_prior(torch.randn(B, K, generator=g, dtype=DT))
    return seq_lp, doc_lp


def test_thorough_scores_brute_force():
    seq_lp, doc_lp = _seq_lp_case()
    got = M.rag_sequence_scores(seq_lp, doc_lp)
    B, K, H = seq_lp.shape
    for b, h in itertools.product(range(B), range(H)):
        p = sum(math.exp(doc_lp[b, k].item()) * math.exp(seq_lp[b, k, h].item()) for k in range(K))
        assert math.isclose(got[b, h].item(), math.log(p), rel_tol=1e-12)


def test_fast_with_all_true_mask_equals_thorough():
    seq_lp, doc_lp = _seq_lp_case()
    in_beam = torch.ones_like(seq_lp, dtype=torch.bool)
    fast = M.rag_sequence_scores(M.fast_decoding_seq_log_probs(seq_lp, in_beam), doc_lp)
    assert torch.equal(fast, M.rag_sequence_scores(seq_lp, doc_lp))


def test_fast_decoding_brute_force_and_absent_hypothesis():
    seq_lp, doc_lp = _seq_lp_case(seed=32)
    g = torch.Generator().manual_seed(0)
    in_beam = torch.rand(seq_lp.shape, generator=g) < 0.5
    in_beam[:, :, 0] = True
    in_beam[0, :, 3] = False  # hypothesis 3 of question 0 is in no beam
    junk = seq_lp.masked_fill(~in_beam, float("nan"))  # never computed off-beam
    got = M.rag_sequence_scores(M.fast_decoding_seq_log_probs(junk, in_beam), doc_lp)
    assert got[0, 3].item() == float("-inf")
    B, K, H = seq_lp.shape
    for b, h in itertools.product(range(B), range(H)):
        p = sum(math.exp(doc_lp[b, k].item() + seq_lp[b, k, h].item())
                for k in range(K) if in_beam[b, k, h])
        want = math.log(p) if p > 0 else float("-inf")
        assert got[b, h].item() == want or math.isclose(got[b, h].item(), want, rel_tol=1e-12)


def test_scores_ignore_masked_documents():
    seq_lp, _ = _seq_lp_case()
    doc_lp = M.doc_log_prior(torch.zeros(2, 3, dtype=DT),
                             torch.tensor([[True, True, False], [True, False, False]]))
    seq_lp[:, 2] = float("nan")
    got = M.rag_sequence_scores(seq_lp, doc_lp)
    torch.testing.assert_close(got[1], seq_lp[1, 0], **TOL)
    assert torch.isfinite(got).all()


# ----------------------------------------------------------------------------- posteriors & stats


@pytest.mark.parametrize("K,T", [(2, 4), (3, 3)])
def test_rag_token_doc_posterior_equals_enumerated_posterior(K, T):
    """p(z_t|x, y) under the full RAG-Token joint (the paper's p(z_i|x,y_i,y_-i))."""
    case = make_case(B=2, K=K, T=T, V=5, seed=41 + K, pad=False)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    post = M.rag_token_doc_posterior(tlp, doc_lp)
    torch.testing.assert_close(post.sum(1), torch.ones(2, T, dtype=DT), **TOL)
    for b in range(2):
        prior, tl, _, _, mask = unpack(case, b)
        _, bf = bf_token_enumerated(prior, tl, mask)
        for k, t in itertools.product(range(K), range(T)):
            assert math.isclose(post[b, k, t].item(), bf[k][t], rel_tol=1e-9, abs_tol=1e-14)


def test_rag_sequence_doc_posterior_brute_force():
    case = make_case(seed=43)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    post = M.rag_sequence_doc_log_posterior(tlp, doc_lp, case["target_mask"]).exp()
    for b in range(post.size(0)):
        prior, tl, _, _, mask = unpack(case, b)
        joint = [pz * math.exp(sum(tl[k][t] for t in range(len(mask)) if mask[t])) if pz > 0
                 else 0.0 for k, pz in enumerate(prior)]
        z = sum(joint)
        for k in range(len(prior)):
            assert math.isclose(post[b, k].item(), joint[k] / z, rel_tol=1e-10, abs_tol=1e-15)


def test_entropy_and_top1():
    case = make_case(seed=47)
    doc_lp = prior_of(case)
    ent = M.doc_posterior_entropy(doc_lp)
    top1 = M.top1_doc_prob(doc_lp)
    for b in range(doc_lp.size(0)):
        prior = py_prior(case["doc_scores"][b].tolist(), case["doc_mask"][b].tolist())
        want = -sum(p * math.log(p) for p in prior if p > 0)
        assert math.isclose(ent[b].item(), want, rel_tol=1e-12)
        assert math.isclose(top1[b].item(), max(prior), rel_tol=1e-12)
    uniform = M.doc_log_prior(torch.zeros(2, 4, dtype=DT),
                              torch.tensor([[True] * 4, [True, True, False, False]]))
    torch.testing.assert_close(M.doc_posterior_entropy(uniform),
                               torch.tensor([math.log(4), math.log(2)], dtype=DT), **TOL)


def test_entropy_gradient_finite_with_masked_docs():
    scores = torch.randn(2, 4, dtype=DT, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    ent = M.doc_posterior_entropy(M.doc_log_prior(scores, mask))
    ent.sum().backward()
    assert torch.isfinite(scores.grad).all()
    # analytically, with p = softmax over the documents that exist: dH/ds_i = -p_i (log p_i + H), 0 for the others
    for b in range(2):
        alive = [k for k in range(4) if mask[b, k]]
        z = sum(math.exp(scores[b, k].item()) for k in alive)
        prior = {k: math.exp(scores[b, k].item()) / z for k in alive}
        h = -sum(q * math.log(q) for q in prior.values())
        assert math.isclose(ent[b].item(), h, rel_tol=1e-12, abs_tol=1e-15)
        for k in range(4):
            want = -prior[k] * (math.log(prior[k]) + h) if k in prior else 0.0
            assert math.isclose(scores.grad[b, k].item(), want, rel_tol=1e-10, abs_tol=1e-14)


# ----------------------------------------------------------------------------- float32


def test_float32_agrees_with_float64():
    case = make_case(seed=51)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    m = case["target_mask"]
    for fn in (M.rag_sequence_nll, M.rag_token_nll):
        torch.testing.assert_close(fn(tlp.float(), doc_lp.float(), m).double(),
                                   fn(tlp, doc_lp, m), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- hypothesis invariants

shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 6), st.integers(2, 9),
                   st.integers(0, 2**31 - 1))


def _random(B, K, T, V, seed, spread=3.0):
    case = make_case(B=B, K=K, T=T, V=V, seed=seed, doc_pad=K > 1)
    case["lprobs"] = torch.log_softmax(torch.randn(B, K, T, V, dtype=DT,
                                                   generator=torch.Generator().manual_seed(seed))
                                       * spread, -1)
    return case


@settings(max_examples=60, deadline=None)
@given(shapes, st.floats(0.1, 20.0))
def test_hyp_nll_between_best_and_worst_document(shape, spread):
    """-log sum_k p_k q_k lies in [min_k -log q_k, max_k -log q_k] over docs with p_k > 0;
    per position likewise for RAG-Token. Both are >= 0 and shift-invariant in the scores."""
    case = _random(*shape, spread=spread)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    mask = case["target_mask"]
    active = torch.isfinite(doc_lp)
    per_doc = -torch.where(mask.unsqueeze(1), tlp, torch.zeros_like(tlp)).sum(-1)  # [B,K]
    seq = M.rag_sequence_nll(tlp, doc_lp, mask)
    lo = per_doc.masked_fill(~active, float("inf")).min(1).values
    hi = per_doc.masked_fill(~active, float("-inf")).max(1).values
    assert (seq >= lo - 1e-9).all() and (seq <= hi + 1e-9).all()
    tok = M.rag_token_nll(tlp, doc_lp, mask)
    pos = -tlp.masked_fill(~mask.unsqueeze(1), 0.0)
    tlo = pos.masked_fill(~active.unsqueeze(-1), float("inf")).min(1).values.sum(-1)
    thi = pos.masked_fill(~active.unsqueeze(-1), float("-inf")).max(1).values.sum(-1)
    assert (tok >= tlo - 1e-9).all() and (tok <= thi + 1e-9).all()
    assert (seq >= -1e-12).all() and (tok >= -1e-12).all()
    shifted = M.doc_log_prior(case["doc_scores"] + 7.5, case["doc_mask"])
    torch.testing.assert_close(M.rag_sequence_nll(tlp, shifted, mask), seq, rtol=1e-9, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_hyp_document_permutation_and_identical_documents(shape):
    """Permuting documents changes nothing; identical documents collapse to K=1."""
    B, K, T, V, seed = shape
    case = _random(B, K, T, V, seed)
    doc_lp, tlp = prior_of(case), token_lp_of(case)
    mask = case["target_mask"]
    perm = torch.randperm(K, generator=torch.Generator().manual_seed(seed))
    for fn in (M.rag_sequence_nll, M.rag_token_nll):
        torch.testing.assert_close(fn(tlp[:, perm], doc_lp[:, perm], mask), fn(tlp, doc_lp, mask),
                                   rtol=1e-10, atol=1e-10)
    same = tlp[:, :1].expand(B, K, T)
    plain = -tlp[:, 0].masked_fill(~mask, 0.0).sum(-1)
    for fn in (M.rag_sequence_nll, M.rag_token_nll):
        torch.testing.assert_close(fn(same, doc_lp, mask), plain, rtol=1e-10, atol=1e-10)
    marg = M.rag_token_marginal_lprobs(case["lprobs"], doc_lp)
    torch.testing.assert_close(marg.logsumexp(-1), torch.zeros(B, T, dtype=DT),
                               rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- per-token decompositions
from rag_plugin.core.marginalization import rag_sequence_positional_scores, rag_token_positional_scores  # noqa: E402


def test_sequence_positional_scores_telescope_to_the_marginal():
    torch.manual_seed(0)
    token_lp = torch.log_softmax(torch.randn(3, 4, 6, 9, dtype=torch.float64), -1)[..., 0]
    doc_lp = torch.log_softmax(torch.randn(3, 4, dtype=torch.float64), -1)
    pos = rag_sequence_positional_scores(token_lp, doc_lp)
    full = torch.logsumexp(doc_lp + token_lp.sum(-1), dim=1)
    torch.testing.assert_close(pos.sum(-1), full)
    # position 0 is the prior-weighted mixture of the first token
    torch.testing.assert_close(pos[:, 0], torch.logsumexp(doc_lp + token_lp[..., 0], 1))


def test_sequence_positional_scores_with_off_beam_documents():
    token_lp = torch.tensor([[[-1.0, -2.0], [float("-inf"), float("-inf")]]], dtype=torch.float64)
    doc_lp = torch.log(torch.tensor([[0.25, 0.75]], dtype=torch.float64))
    pos = rag_sequence_positional_scores(token_lp, doc_lp)
    assert torch.isfinite(pos).all()
    assert float(pos.sum()) == pytest.approx(math.log(0.25) - 3.0)


def test_positional_scores_per_position_against_brute_force():
    """Every position, in Python floats from the definitions: RAG-Token's
    log sum_k p(z_k|x) p(y_t|x,z_k,y<t); RAG-Sequence's log p(y<=t|x) - log p(y<t|x) with
    p(y<=t|x) = sum_k p(z_k|x) prod_{s<=t} p(y_s|x,z_k,y<s). Document 1 of question 0 is
    off its beam (Fast decoding's -inf row): it must count as probability 0."""
    g = torch.Generator().manual_seed(3)
    B, K, T = 2, 3, 4
    token_lp = torch.log_softmax(torch.randn(B, K, T, 6, generator=g, dtype=DT) * 2, -1)[..., 1].clone()
    token_lp[0, 1] = float("-inf")
    doc_lp = torch.log_softmax(torch.randn(B, K, generator=g, dtype=DT), -1)
    seq = rag_sequence_positional_scores(token_lp, doc_lp)
    tok = rag_token_positional_scores(token_lp, doc_lp)
    for b in range(B):
        p = [math.exp(float(doc_lp[b, k])) for k in range(K)]
        q = [[math.exp(float(token_lp[b, k, t])) for t in range(T)] for k in range(K)]
        for t in range(T):
            expect_tok = math.log(sum(p[k] * q[k][t] for k in range(K)))
            assert float(tok[b, t]) == pytest.approx(expect_tok, rel=1e-10, abs=1e-12)
            upto = sum(p[k] * math.prod(q[k][: t + 1]) for k in range(K))
            before = sum(p[k] * math.prod(q[k][:t]) for k in range(K))
            assert float(seq[b, t]) == pytest.approx(math.log(upto / before), rel=1e-10, abs=1e-12)


def test_token_positional_scores_sum_to_minus_nll():
    torch.manual_seed(1)
    token_lp = torch.log_softmax(torch.randn(2, 3, 5, 7, dtype=torch.float64), -1)[..., 2]
    doc_lp = torch.log_softmax(torch.randn(2, 3, dtype=torch.float64), -1)
    mask = torch.ones(2, 5, dtype=torch.bool)
    torch.testing.assert_close(rag_token_positional_scores(token_lp, doc_lp).sum(-1),
                               -M.rag_token_nll(token_lp, doc_lp, mask))
