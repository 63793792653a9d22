"""Running a fairseq ``transformer_lm`` as a RAG reader: teacher-forced rows, and incremental decoding whose
per-passage context is computed once.

fairseq's ``TransformerDecoder.forward`` numbers positions from each row's first column (and, incrementally, from
the row's full length), which cannot place an answer after contexts of different lengths. The reader runs the
decoder's own modules (token and position embeddings, layers, final LayerNorm, output layer) with explicit
positions instead; for a row without padding it is exactly ``TransformerLanguageModel.forward`` (tested).

* :meth:`LMReader.teacher_forced`: ``context + prev_output_tokens`` packed per row (no padding between them), one
  causal pass, logits read at the answer's positions only ([N, T, V]).
* :meth:`LMReader.start` then :meth:`LMReader.extend`: the contexts (right-padded, their padding masked as keys) run
  once; their keys and values are held once per context (rag_plugin/models/lm_prefix_cache.py), shared by the rows
  that read it (beams, candidates), and every later call runs only the new tokens, at position ``length + t`` of
  their row. Nothing of a context is recomputed, or copied, per step, per beam or per candidate.

``masked_ids`` (a converted GPT-2's ``<s>``, ``<pad>``, ``<unk>``: no GPT-2 token, their logits copy
``<|endoftext|>``'s) get logit -inf, so the distribution over the vocabulary is GPT-2's exactly.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding

from rag_plugin.core.lm_layout import packed_rows
from rag_plugin.models.lm_prefix_cache import LayerCache, LayerView, PrefixCache, SharedPrefixAttention

IncrementalState = Dict[str, Dict[str, Optional[torch.Tensor]]]
#: where a search's incremental state holds the reader's shared cache
_CACHE = "rag_lm_prefix_cache"


class LMReader:
    """The RAG reader's view of a fairseq ``TransformerLanguageModel`` (``lm``; its weights stay the model's)."""

    def __init__(self, lm, pad: int, masked_ids: Sequence[int] = ()):
        self.lm = lm
        self.pad = pad
        self.masked_ids = tuple(int(i) for i in masked_ids)

    @property
    def decoder(self):
        return self.lm.decoder

    def max_positions(self) -> int:
        """Tokens a row may hold (context and answer together)."""
        return int(self.decoder.max_positions())

    # ------------------------------------------------------------------ the network
    def _positions(self, tokens: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        pe = self.decoder.embed_positions
        if pe is None:
            return None
        if isinstance(pe, LearnedPositionalEmbedding):
            return F.embedding(positions, pe.weight, pe.padding_idx)
        if isinstance(pe, SinusoidalPositionalEmbedding):
            need = int(positions.max()) + 1
            if need > pe.weights.size(0):
                pe.weights = SinusoidalPositionalEmbedding.get_embedding(need, pe.embedding_dim, pe.padding_idx)
            return pe.weights.to(device=tokens.device).index_select(0, positions.reshape(-1)).view(
                *positions.shape, -1).detach()
        raise TypeError(f"unsupported position embedding {type(pe).__name__}")

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The decoder's input embeddings of ``tokens`` at ``positions``, time-first [L, N, D]."""
        dec = self.decoder
        x = dec.embed_scale * dec.embed_tokens(tokens)
        if dec.project_in_dim is not None:
            x = dec.project_in_dim(x)
        pos = self._positions(tokens, positions)
        if pos is not None:
            x = x + pos.to(x.dtype)
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        return dec.dropout_module(x).transpose(0, 1)

    def features(self, tokens: torch.Tensor, positions: torch.Tensor, key_padding_mask: Optional[torch.Tensor],
                 attn_mask: Optional[torch.Tensor], incremental_state: Optional[IncrementalState]) -> torch.Tensor:
        """The decoder's last hidden states [N, L, D] of ``tokens`` at ``positions``."""
        dec = self.decoder
        x = self._embed(tokens, positions)                                        # [L, N, D]
        for layer in dec.layers:
            x, _, _ = layer(x, None, None, incremental_state, self_attn_mask=attn_mask,
                            self_attn_padding_mask=key_padding_mask)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        x = x.transpose(0, 1)
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        out = self.decoder.output_layer(features)
        if self.masked_ids:
            out = out.index_fill(-1, torch.tensor(self.masked_ids, device=out.device), float("-inf"))
        return out

    @staticmethod
    def _future_mask(new: int, cached: int, device) -> torch.Tensor:
        """[new, cached + new], added to the attention logits: each new token sees the cache and the new tokens up
        to itself (fairseq's incremental attention adds a float mask)."""
        causal = torch.triu(torch.full((new, new), float("-inf"), device=device), 1)
        return torch.cat([causal.new_zeros(new, cached), causal], dim=1)

    # ------------------------------------------------------------------ teacher forcing
    def teacher_forced(self, contexts: torch.Tensor, lengths: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """Logits [N, T, V] of the decoder input ``prev`` [N, T] read after each row's context."""
        tokens, answer_at = packed_rows(contexts, lengths, prev, self.pad)
        col = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0)
        keys_pad = tokens.eq(self.pad)
        positions = (col + self.pad + 1).masked_fill(keys_pad, self.pad)
        n = tokens.size(1)  # torch's attention (fairseq's path without a cache): boolean masks, True = hidden
        causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=tokens.device), 1)
        x = self.features(tokens, positions, keys_pad if keys_pad.any() else None, causal, None)
        at = answer_at.unsqueeze(-1).expand(-1, -1, x.size(-1))
        return self.logits(x.gather(1, at))

    # ------------------------------------------------------------------ incremental
    def start(self, incremental_state: IncrementalState, contexts: torch.Tensor, lengths: torch.Tensor) -> None:
        """Run the contexts [P, C] (right-padded) once; their keys and values become ``incremental_state``'s
        shared cache (rag_plugin/models/lm_prefix_cache.py), one copy per context whatever the rows reading it."""
        c = contexts.size(1)
        col = torch.arange(c, device=contexts.device).unsqueeze(0)
        keys_pad = col >= lengths.to(contexts.device).unsqueeze(1)
        positions = (col + self.pad + 1).masked_fill(keys_pad, self.pad)
        scratch: IncrementalState = {}  # fairseq's own cache of this one pass, its keys and values then taken over
        self.features(contexts, positions, keys_pad, self._future_mask(c, 0, contexts.device), scratch)
        layers = []
        for layer in self.decoder.layers:
            buffer = layer.self_attn._get_input_buffer(scratch)
            layers.append(LayerCache(buffer["prev_key"], buffer["prev_value"], keys_pad))
        incremental_state[_CACHE] = PrefixCache(layers)

    def reorder(self, incremental_state: IncrementalState, order: torch.Tensor) -> None:
        """The rows in ``order``: expanding each context to the rows that read it (no copy of it), following the
        beams (the generated tokens' keys only), dropping finished questions' contexts."""
        incremental_state[_CACHE].reorder(order)

    def extend(self, incremental_state: IncrementalState, tokens: torch.Tensor, lengths: torch.Tensor,
               offset: int) -> torch.Tensor:
        """Logits [N, L, V] of ``tokens`` [N, L] continuing the rows: token j of row i at position
        ``lengths[i] + offset + j`` of that row (``lengths``: the rows' context lengths), each attending to its
        context and to the row's tokens up to itself."""
        cache: PrefixCache = incremental_state[_CACHE]
        dec = self.decoder
        new = tokens.size(1)
        positions = (lengths.to(tokens.device).unsqueeze(1) + offset + self.pad + 1
                     + torch.arange(new, device=tokens.device).unsqueeze(0))
        x = self._embed(tokens, positions)
        for layer, layer_cache in zip(dec.layers, cache.layers):
            x = LayerView(layer, SharedPrefixAttention(layer.self_attn, layer_cache, cache.rows_per_group))(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        x = x.transpose(0, 1)
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        return self.logits(x)
