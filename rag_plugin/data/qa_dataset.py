"""The fairseq dataset of question/target pairs, pre-tokenized once at load time.

Each item holds: the question in the query encoder's tokens (for retrieval), the question
in the generator's tokens (the start of every generator input) and the target in the
generator's tokens followed by ``</s>``. Batches are padded to their longest member; the
decoder's input is the target shifted right behind ``decoder_start`` (``</s>``, fairseq's, by
default; ``<s>`` for the ``hf`` target format, see :func:`rag_plugin.core.input_format.target_layout`).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import FairseqDataset

from rag_plugin.util.errors import UserError


class RetrievalQADataset(FairseqDataset):
    def __init__(self, query_tokens: Optional[Sequence[Sequence[int]]], src_tokens: Sequence[Sequence[int]],
                 targets: Optional[Sequence[Sequence[int]]], pad: int, eos: int, query_pad: int = 0,
                 fixed_rows: Optional[np.ndarray] = None, fixed_scores: Optional[np.ndarray] = None,
                 record_ids: Optional[List[str]] = None, gold_rows: Optional[np.ndarray] = None,
                 decoder_start: Optional[int] = None):
        self.query_tokens = [np.asarray(q, dtype=np.int64) for q in query_tokens] if query_tokens is not None else None
        self.src_tokens = [np.asarray(q, dtype=np.int64) for q in src_tokens]
        self.targets = [np.asarray(list(t) + [eos], dtype=np.int64) for t in targets] if targets is not None else None
        self.pad, self.eos, self.query_pad = pad, eos, query_pad
        self.decoder_start = eos if decoder_start is None else decoder_start  # the decoder's first input token
        self.fixed_rows, self.fixed_scores = fixed_rows, fixed_scores
        self.record_ids = record_ids
        self.gold_rows = gold_rows  # int64 [N, G], -1 padded: gold passages' store rows (for p(gold|x) stats)
        self._full_tgt_sizes = (np.array([len(t) for t in self.targets], dtype=np.int64) if self.targets is not None
                                else np.zeros(len(self.src_tokens), dtype=np.int64))
        self._src_sizes = np.array([len(q) for q in self.src_tokens], dtype=np.int64)
        self.max_target = None
        #: set when the targets must not be trained or validated on (raised by the task's train/valid steps)
        self.loss_refusal: Optional[Exception] = None

    @property
    def max_target(self) -> Optional[int]:
        """The decoder's positions; longer targets are cut to it (</s> kept), and sizes (batching,
        --max-tokens) count the cut target."""
        return self._max_target

    @max_target.setter
    def max_target(self, value: Optional[int]) -> None:
        self._max_target = value
        tgt = self._full_tgt_sizes if value is None else np.minimum(self._full_tgt_sizes, value)
        self.tgt_sizes = tgt
        self.sizes = self._src_sizes + tgt

    def __len__(self) -> int:
        return len(self.src_tokens)

    def __getitem__(self, index: int) -> dict:
        item = {"id": index, "question": self.src_tokens[index]}
        if self.query_tokens is not None:
            item["query"] = self.query_tokens[index]
        if self.targets is not None:
            target = self.targets[index]
            if self.max_target is not None and len(target) > self.max_target:
                target = np.concatenate([target[: self.max_target - 1], target[-1:]])
            item["target"] = target
        return item

    def num_tokens(self, index: int) -> int:
        return int(self.sizes[index])

    def size(self, index: int) -> int:
        return int(self.sizes[index])

    def filter_indices_by_size(self, indices, max_sizes):
        """Never drop an example: the model truncates long questions/passages itself and the
        collater cuts targets to ``max_target`` tokens (see :attr:`max_target`)."""
        return indices, []

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """fairseq's batching, after checking that every example fits in ``--max-tokens`` (fairseq
        would stop with an assertion, even with --skip-invalid-size-inputs-valid-test, which only
        filters by the model's positions). Examples are never dropped (see
        :meth:`filter_indices_by_size`): one that does not fit is a one-line error."""
        if max_tokens is not None and len(indices) > 0:
            sizes = self.sizes[np.asarray(indices, dtype=np.int64)]
            longest = int(np.argmax(sizes))
            if int(sizes[longest]) > max_tokens:
                index = int(indices[longest])
                name = f"example {index}" + (f" (id {self.record_ids[index]!r})" if self.record_ids else "")
                over = int((sizes > max_tokens).sum())
                raise UserError(f"{over} example(s) do not fit in --max-tokens {max_tokens}; the longest, {name}, "
                                f"has {int(sizes[longest])} tokens (question + target), and rag_plugin never skips "
                                f"an example (--skip-invalid-size-inputs-valid-test included)",
                                fix=f"raise --max-tokens to at least {int(sizes[longest])}, or use --batch-size")
        return super().batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                     required_batch_size_multiple=required_batch_size_multiple)

    def ordered_indices(self) -> np.ndarray:
        return np.lexsort((np.arange(len(self)), self.sizes))

    @staticmethod
    def _pad(seqs: List[np.ndarray], pad: int) -> torch.Tensor:
        width = max(1, max(len(s) for s in seqs))
        out = torch.full((len(seqs), width), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.from_numpy(s)
        return out

    def collater(self, samples: List[dict]) -> dict:
        if not samples:
            return {}
        ids = torch.tensor([s["id"] for s in samples], dtype=torch.long)
        net_input = {"src_tokens": self._pad([s["question"] for s in samples], self.pad),
                     "src_lengths": torch.tensor([len(s["question"]) for s in samples], dtype=torch.long)}
        if self.query_tokens is not None:
            query = self._pad([s["query"] for s in samples], self.query_pad)
            mask = torch.zeros_like(query, dtype=torch.bool)
            for i, s in enumerate(samples):
                mask[i, : len(s["query"])] = True
            net_input["query_tokens"], net_input["query_mask"] = query, mask
        if self.fixed_rows is not None:
            idx = ids.numpy()
            net_input["fixed_doc_rows"] = torch.from_numpy(self.fixed_rows[idx])
            # float64: fairseq's --fp16/--bf16 cast every float32 tensor of a batch to 16 bits, which would
            # round BM25 scores (the prior's logits; bf16 steps of 0.125-0.25 at 16-64); the model takes them as float32
            net_input["fixed_doc_scores"] = torch.from_numpy(self.fixed_scores[idx]).double()
        batch = {"id": ids, "nsentences": len(samples), "net_input": net_input}
        if self.loss_refusal is not None:
            batch["loss_refusal"] = self.loss_refusal
        if self.gold_rows is not None:
            batch["gold_rows"] = torch.from_numpy(self.gold_rows[ids.numpy()])
        if self.targets is not None:
            target = self._pad([s["target"] for s in samples], self.pad)
            prev = torch.full_like(target, self.pad)
            prev[:, 0] = self.decoder_start
            for i, s in enumerate(samples):  # </s> y1 ... yn  (fairseq's shift; <s> y1 ... yn for hf targets)
                prev[i, 1: len(s["target"])] = torch.from_numpy(s["target"][:-1])
            net_input["prev_output_tokens"] = prev
            batch["target"] = target
            batch["ntokens"] = int(sum(len(s["target"]) for s in samples))
        else:
            batch["ntokens"] = 0
        return batch
