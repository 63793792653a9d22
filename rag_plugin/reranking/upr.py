"""The reader as reranker (UPR, Sachan et al. 2022): a candidate's score is the generator's own log-likelihood of the
question given the passage, teacher-forced.

For question ``x`` (the generator's tokens ``q1 ... qn``) and candidate passage ``z``::

    score(x, z) = log p(x | z) = sum_t log p(y_t | z, y_<t)      y = prefix + q1 ... qn </s>

read by ``model.generator``, the RAG/FiD model's own BART: no new weights (the reranker has no parameters, nothing
enters the state dict). The layout of one (question, passage) pair:

- encoder input: the passage alone, as the model's input format lays out a generator input with an EMPTY question
  (``model.generator_inputs``, so the passage is cut to ``--max-source-positions`` exactly as the reader's inputs
  cut it). ``plugin`` format: ``<s> </s> title </s> passage </s>`` (the question slot left empty, which also keeps
  question generation apart from answering, whose inputs fill that slot); ``hf`` format:
  ``<s> prefix title title_sep text doc_sep</s>``.
- decoder: the task's target layout (:func:`rag_plugin.core.input_format.target_layout`) applied to the question as
  it applies it to an answer. ``plugin`` targets: the decoder reads ``</s> q1 ... qn`` and is scored on
  ``q1 ... qn </s>`` (fairseq's shift; with the ``hf`` input format the target starts with ``<s>``, as answers do);
  ``hf`` targets: the decoder reads ``<s> q1 ... qn``. A question longer than ``--max-target-positions`` is cut to
  it, ``</s>`` kept, as answers are.

The question's tokens are the batch's ``src_tokens`` (padding, and a leading ``<s>`` / trailing ``</s>`` where a
caller put them, e.g. fairseq-interactive's line encoding, are stripped). All B*L pairs run in chunks of at most
``chunk`` pairs (and ``max_cells`` logits) through one encoder and one decoder forward each; the log-softmax runs with
autocast off, in float32 (float64 stays float64). With grad enabled the scores keep their graph through the
generator: the marginal (and every ``--retriever-loss``) then trains the generator through these scores too, as
question generation, besides the answer likelihood. In training mode the generator's dropout applies to the scores;
in eval mode they are deterministic.
"""
from __future__ import annotations

from typing import List

import torch

from rag_plugin.core.input_format import target_layout
from rag_plugin.reranking.base import RerankBatch, Reranker, register_reranker


class UprReranker(Reranker):
    """``forward(model, batch) -> [B, L]``: log p(question | passage) under ``model.generator`` (module docstring)."""

    name = "upr"
    #: no weights of its own, but its scores carry the gradient to the generator, which learns through them
    trainable = True

    def __init__(self, target_format: str = "plugin", chunk: int = 64, max_cells: int = 32_000_000):
        super().__init__()
        self.target_format = target_format
        self.chunk = max(1, int(chunk))          # (question, passage) pairs per encoder/decoder forward
        self.max_cells = max(1, int(max_cells))  # at most this many logits per forward (chunk shrinks for big V)

    def question_targets(self, model, src_tokens: torch.Tensor) -> List[torch.Tensor]:
        """The B targets ``prefix + q1 ... qn </s>`` (Long, on the CPU) of the task's target layout."""
        layout = target_layout(self.target_format, model.input_format, model.bos, model.eos)
        longest = int(model.cfg.max_target_positions)
        targets = []
        for q in src_tokens.cpu():
            q = q[q.ne(model.pad)]
            if len(q) and int(q[0]) == model.bos:
                q = q[1:]
            if len(q) and int(q[-1]) == model.eos:
                q = q[:-1]
            body = layout.prefix + q.tolist()
            targets.append(torch.tensor(body[: longest - 1] + [model.eos], dtype=torch.long))
        return targets

    def decoder_rows(self, model, targets: List[torch.Tensor]):
        """Targets right-padded and the decoder inputs behind the layout's decoder start: two Long[B, T]."""
        start = target_layout(self.target_format, model.input_format, model.bos, model.eos).decoder_start
        t = max(len(y) for y in targets)
        target = torch.full((len(targets), t), model.pad, dtype=torch.long)
        prev = torch.full((len(targets), t), model.pad, dtype=torch.long)
        for i, y in enumerate(targets):
            target[i, : len(y)] = y
            prev[i, 0] = start
            prev[i, 1: len(y)] = y[:-1]
        return target, prev

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:
        b, n = batch.rows.shape
        device = batch.src_tokens.device
        target, prev = self.decoder_rows(model, self.question_targets(model, batch.src_tokens))
        target, prev = target.to(device), prev.to(device)
        empty = torch.full((b, 1), model.pad, dtype=torch.long, device=device)
        src, lengths = model.generator_inputs(empty, batch.rows)           # [B*L, S] question-major
        owner = torch.arange(b, device=device).repeat_interleave(n)         # pair -> its question
        step = max(1, min(self.chunk, self.max_cells // (target.size(1) * len(model.dictionary))))
        scores = [self._score_chunk(model, src[s: s + step], lengths[s: s + step], prev[owner[s: s + step]],
                                    target[owner[s: s + step]]) for s in range(0, b * n, step)]
        return torch.cat(scores).view(b, n)

    @staticmethod
    def _score_chunk(model, src, lengths, prev, target) -> torch.Tensor:
        """sum_t log p(target_t | src, prev_<=t) for each row of a chunk: [R]."""
        src = src[:, : int(lengths.max())]                                  # this chunk's own padding only
        keep = int(target.ne(model.pad).sum(1).max())
        prev, target = prev[:, :keep], target[:, :keep]
        encoder_out = model.generator.encoder(src, src_lengths=lengths)
        logits, _ = model.generator.decoder(prev, encoder_out=encoder_out)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            lp = torch.log_softmax(logits.to(dtype), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
            return lp.masked_fill(target.eq(model.pad), 0.0).sum(-1)


@register_reranker("upr")
def build_upr(model_cfg, task) -> UprReranker:
    """``--reranker upr``: the model's generator scores its candidates (no options, no weights of its own)."""
    target_format = str(getattr(task.cfg, "target_format", "plugin") or "plugin")
    target_layout(target_format, task.input_format, task.dictionary.bos(), task.dictionary.eos())  # a known format
    return UprReranker(target_format)
