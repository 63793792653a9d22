"""Provenance of generated answers: the retrieved documents, printed beside fairseq's lines.

Line format (tab-separated), one per retrieved document, best first (none with ``--quiet``)::

    Z-<sample id>\t<rank>\t<p(z|x)>\t<passage id>\t<title>

and, optionally, JSON lines with the same facts (``--provenance-out``) and RAG-Token's
per-token document posterior (``--doc-posterior-out``; the paper's Figure 2). The documents come
with the hypotheses (:func:`rag_plugin.generation.adapters.retrieval_of`); the task owns the
streams and files they are written to.
"""
import atexit
import json
import os
import sys
from pathlib import Path
from typing import List, Optional

import torch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import teacher_forced_token_lp


def z_lines(sample_ids: List[int], rows: Optional[torch.Tensor], doc_lp: Optional[torch.Tensor], store) -> List[str]:
    if rows is None or doc_lp is None:
        return []
    lines = []
    probs = doc_lp.exp().cpu()
    for i, sid in enumerate(sample_ids):
        order = torch.argsort(probs[i], descending=True)
        for rank, k in enumerate(order.tolist()):
            row = int(rows[i, k])
            title = store.title(row).replace("\t", " ").replace("\n", " ")
            lines.append(f"Z-{sid}\t{rank}\t{float(probs[i, k]):.6f}\t{store.id(row)}\t{title}")
    return lines


def provenance_records(sample_ids, rows, doc_lp, store, attention: Optional[torch.Tensor] = None) -> List[dict]:
    """One record per sample: its documents by p(z|x), best first. ``attention`` [B, K] (Fusion-in-Decoder):
    each passage's share of the decoder's cross-attention, added to its entry as ``attention``."""
    out = []
    if rows is None:
        return [{"sample_id": sid, "provenance": []} for sid in sample_ids]
    probs = doc_lp.exp().cpu()
    for i, sid in enumerate(sample_ids):
        order = torch.argsort(probs[i], descending=True).tolist()
        out.append({"sample_id": sid, "provenance": [
            {"rank": r, "id": store.id(int(rows[i, k])), "title": store.title(int(rows[i, k])),
             "p": round(float(probs[i, k]), 6)} for r, k in enumerate(order)]})
        if attention is not None:
            for entry, k in zip(out[-1]["provenance"], order):
                entry["attention"] = round(float(attention[i, k]), 6)
    return out


@torch.inference_mode()
def token_doc_posteriors(rag, sample, hypos, rows, doc_lp, tokenizer, store) -> List[dict]:
    """p(z | x, y_t, y<t) for each token of each sample's best hypothesis (RAG-Token), [K x T]."""
    ni = sample["net_input"]
    encoder_out, _, _ = rag.encode(ni["src_tokens"], ni.get("query_tokens"), ni.get("query_mask"),
                                   ni.get("fixed_doc_rows"), ni.get("fixed_doc_scores"))
    b, k = doc_lp.shape
    best = [h[0]["tokens"].cpu() for h in hypos]
    pair_rows = torch.arange(b * k)
    targets = [best[i] for i in range(b) for _ in range(k)]
    lp = teacher_forced_token_lp(rag, encoder_out, pair_rows, targets).view(b, k, -1).cpu()
    post = M.rag_token_doc_posterior(lp, doc_lp.cpu())
    out = []
    for i in range(b):
        n = len(best[i])
        pieces = [tokenizer.symbols[t] for t in best[i].tolist()]
        out.append({"sample_id": int(sample["id"][i]), "tokens": pieces,
                    "text": tokenizer.decode(best[i].tolist()),
                    "docs": [{"id": store.id(int(rows[i, j])), "title": store.title(int(rows[i, j])),
                              "prior": round(float(doc_lp[i, j].exp()), 6)} for j in range(k)],
                    "posterior": [[round(float(v), 6) for v in post[i, j, :n]] for j in range(k)]})
    return out


class JsonlOutput:
    """A JSON-lines file written while generating: into ``<path>.partial`` (replaced at the
    first write of this run, never appended to an old run's; missing folders are made), renamed
    onto ``path`` once it is complete (an old run's complete file stays until then): when every
    one of ``expected`` samples is in it, or (``expected`` unknown, as in fairseq-interactive)
    when the process ends normally. A run that fails or is killed leaves
    only the ``.partial`` file, never a ``path`` that looks complete."""

    def __init__(self, path: str, expected: Optional[int]):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.expected = expected
        self.samples = set()
        self.done = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.partial, "w", encoding="utf-8")
        atexit.register(self._at_exit)

    def write(self, records: List[dict]) -> None:
        if self.done:  # more records after completion: reopen the finished file
            os.replace(self.path, self.partial)
            self.fh = open(self.partial, "a", encoding="utf-8")
            self.done = False
        for r in records:
            self.fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            self.samples.add(r.get("sample_id"))
        self.fh.flush()
        if self.expected is not None and len(self.samples) >= self.expected:
            self.finish()

    def finish(self) -> None:
        if self.done:
            return
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.partial, self.path)
        self.done = True

    def _at_exit(self) -> None:
        if not self.done and getattr(sys, "last_value", None) is None:  # no uncaught exception
            self.finish()
