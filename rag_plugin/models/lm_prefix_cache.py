"""Decoding over contexts shared by several rows: the decoder-only reader's attention cache, each context's keys and
values held once.

In a RAG search over an LM, every (question, passage) context is read by several rows: its beams (RAG-Token: the
beams of each question, for each of its passages), or the candidates Thorough scores under it. fairseq's
self-attention cache would hold a copy of the context's keys and values per row, and copy all of them at every step
(reordering the beams, appending a key). Here, as fairseq's cross-attention does for BART's encoder output, each
context's keys and values are held once per layer (``[G, H, C, d]``, G contexts in the rows' order); the rows that
read a context are adjacent (``rows_per_group`` of them), and only the tokens generated since (``[N, H, t, d]``,
small) follow the beams. A step attends to both with one softmax: exactly the attention over the concatenated row.

The layers themselves run unchanged (their norms, residuals, feed-forward blocks: fairseq's
``TransformerDecoderLayerBase.forward``); only their self-attention call is answered by :class:`SharedPrefixAttention`.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F


class LayerCache:
    """One layer's keys and values: the contexts' (shared by their rows) and the generated tokens' (per row)."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, padding: torch.Tensor):
        self.key, self.value = key, value          # [G, H, C, d]
        self.padding = padding                      # [G, C] True at a context's padding
        self.new_key: Optional[torch.Tensor] = None     # [N, H, t, d]
        self.new_value: Optional[torch.Tensor] = None


class PrefixCache:
    """Every layer's :class:`LayerCache`, and how rows map to contexts: row r reads context ``r // rows_per_group``."""

    def __init__(self, layers: List[LayerCache]):
        self.layers = layers
        self.rows_per_group = 1

    @property
    def groups(self) -> int:
        return int(self.layers[0].key.size(0))

    def reorder(self, order: torch.Tensor) -> None:
        """The rows in ``order`` (row i is old row ``order[i]``). The contexts are copied only when the groups change
        (rows expanded to beams keep them; finished questions drop theirs); a reorder that does not keep each
        context's rows adjacent in equal numbers gives every row its own copy (correct, not shared)."""
        old_group = torch.div(order, self.rows_per_group, rounding_mode="floor")
        n = order.numel()
        per = _equal_runs(old_group)
        if per is None:
            kept, per = old_group, 1
        else:
            kept = old_group.view(-1, per)[:, 0]
        if kept.numel() != self.groups or not torch.equal(kept, torch.arange(self.groups, device=kept.device)):
            for layer in self.layers:
                layer.key, layer.value = layer.key.index_select(0, kept), layer.value.index_select(0, kept)
                layer.padding = layer.padding.index_select(0, kept)
        identity = n == (self.layers[0].new_key.size(0) if self.layers[0].new_key is not None else -1) and \
            torch.equal(order, torch.arange(n, device=order.device))
        if not identity:
            for layer in self.layers:
                if layer.new_key is not None:
                    layer.new_key = layer.new_key.index_select(0, order)
                    layer.new_value = layer.new_value.index_select(0, order)
        self.rows_per_group = per


def _equal_runs(groups: torch.Tensor) -> Optional[int]:
    """The run length if ``groups`` is runs of equal length, each one group, groups ascending; else None."""
    n = groups.numel()
    if n == 0:
        return None
    changes = int((groups[1:] != groups[:-1]).sum()) + 1
    if n % changes:
        return None
    per = n // changes
    runs = groups.view(changes, per)
    if not bool((runs == runs[:, :1]).all()) or (changes > 1 and not bool((runs[1:, 0] > runs[:-1, 0]).all())):
        return None
    return per


class SharedPrefixAttention:
    """Answers a layer's self-attention call (fairseq's ``MultiheadAttention`` signature, time-first) from a
    :class:`LayerCache`: the new tokens' queries attend to their context's keys (shared) and to the generated
    tokens' keys up to their own (``causal`` among several new tokens)."""

    def __init__(self, mha, cache: LayerCache, rows_per_group: int):
        self.mha = mha
        self.cache = cache
        self.per = rows_per_group

    def _get_input_buffer(self, incremental_state):  # the layer asks; nothing of fairseq's cache is used
        return None

    def __call__(self, query, key=None, value=None, key_padding_mask=None, incremental_state=None,
                 need_weights=False, attn_mask=None, **unused):
        mha, cache = self.mha, self.cache
        length, n, dim = query.shape
        heads, head_dim = mha.num_heads, mha.head_dim
        x = query.transpose(0, 1)                                                   # [N, L, D]

        def split(t):
            return t.view(n, length, heads, head_dim).transpose(1, 2)               # [N, H, L, d]

        q = split(mha.q_proj(x)) * mha.scaling
        k, v = split(mha.k_proj(x)), split(mha.v_proj(x))
        if cache.new_key is not None:
            k, v = torch.cat([cache.new_key, k], dim=2), torch.cat([cache.new_value, v], dim=2)
        cache.new_key, cache.new_value = k, v
        groups, per = cache.key.size(0), self.per
        qg = q.reshape(groups, per, heads, length, head_dim)
        context = torch.einsum("gphld,ghcd->gphlc", qg, cache.key.to(q.dtype))        # [G, per, H, L, C]
        context = context.masked_fill(cache.padding.view(groups, 1, 1, 1, -1), float("-inf"))
        new = torch.matmul(q, k.transpose(2, 3))                                      # [N, H, L, T]
        if length > 1:
            t = k.size(2)
            future = torch.ones(length, t, dtype=torch.bool, device=q.device).triu(t - length + 1)
            new = new.masked_fill(future, float("-inf"))
        scores = torch.cat([context.reshape(n, heads, length, -1), new], dim=-1)
        probs = F.softmax(scores.float(), dim=-1).to(q.dtype)
        probs = mha.dropout_module(probs)
        c = cache.key.size(2)
        out = torch.einsum("gphlc,ghcd->gphld", probs[..., :c].reshape(groups, per, heads, length, c),
                           cache.value.to(q.dtype)).reshape(n, heads, length, head_dim)
        out = out + torch.matmul(probs[..., c:], v)
        out = out.transpose(1, 2).reshape(n, length, dim)
        return mha.out_proj(out).transpose(0, 1), None


class LayerView:
    """A decoder layer whose self-attention is ``attention`` (everything else: the layer's own), for running
    fairseq's ``TransformerDecoderLayerBase.forward`` unchanged over the shared cache."""

    def __init__(self, layer, attention: SharedPrefixAttention):
        self._layer = layer
        self.self_attn = attention

    def __getattr__(self, name):
        return getattr(self._layer, name)

    def __call__(self, x):
        return type(self._layer).forward(self, x, None, None, None)[0]
