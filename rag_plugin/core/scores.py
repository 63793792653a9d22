"""Retrieval scores q . d, the logits of p(z|x), in full precision whatever the caller's precision.

Under ``--amp`` (torch.autocast) a ``bmm`` runs in float16/bfloat16 even on float32 inputs, and under
``--fp16`` the query encoder itself is half: DPR's inner products of 60-90 would land on a grid of
0.25-0.5 in bfloat16 (0.03-0.06 in float16), enough to reorder close passages and to blur p(z|x). Every
site that scores documents (dense retrieval, the trainable document encoder, hybrid fusion) calls
:func:`inner_products`, which runs with autocast off, in float32 (float64 stays float64). Pure torch.
"""
import torch


def inner_products(d: torch.Tensor, q: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale * q . d`` for each document: d [B, L, D], q [B, D] -> [B, L], at least float32, differentiable in
    both; autocast is off for the product whatever its state on ``q``'s device."""
    dtype = torch.promote_types(torch.promote_types(q.dtype, d.dtype), torch.float32)
    with torch.autocast(device_type=q.device.type, enabled=False):
        return torch.bmm(d.to(dtype), q.to(dtype).unsqueeze(-1)).squeeze(-1) * scale
