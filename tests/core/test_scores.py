"""core.scores.inner_products: q . d in float32 whatever the autocast state (--amp), against float64 by hand."""
import pytest
import torch

from rag_plugin.core.scores import inner_products


def _inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 16, generator=gen) * 3).to(dtype).requires_grad_()
    d = (torch.randn(3, 5, 16, generator=gen) * 3).to(dtype)
    return q, d


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_scores_stay_float32_under_cpu_autocast(autocast_dtype):
    q, d = _inputs()
    exact = torch.einsum("bkd,bd->bk", d.double(), q.double()) * 20.0
    with torch.autocast("cpu", dtype=autocast_dtype):
        plain = torch.bmm(d, q.unsqueeze(-1)).squeeze(-1) * 20.0  # what the product gives without the guard
        scores = inner_products(d, q, 20.0)
    assert plain.dtype == autocast_dtype  # the proxy does reproduce the defect
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores.double(), exact, rtol=1e-6, atol=1e-4)
    assert (plain.double() - exact).abs().max() > 1e-2  # 16 bits are visibly off at these magnitudes
    scores.sum().backward()
    torch.testing.assert_close(q.grad.double(), d.double().sum(1) * 20.0, rtol=1e-6, atol=1e-4)


def test_half_inputs_are_scored_in_float32_and_float64_stays_float64():
    q, d = _inputs(torch.bfloat16)
    assert inner_products(d, q).dtype == torch.float32
    q64, d64 = _inputs(torch.float64)
    assert inner_products(d64, q64).dtype == torch.float64
