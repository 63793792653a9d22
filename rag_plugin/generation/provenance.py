"""Provenance of generated answers: the retrieved documents, printed beside fairseq's lines.

Line format (tab-separated), one per retrieved document, best first (none with ``--quiet``)::

    Z-<sample id>\t<rank>\t<p(z|x)>\t<passage id>\t<title>

and, optionally, JSON lines with the same facts (``--provenance-out``) and RAG-Token's
per-token document posterior (``--doc-posterior-out``; the paper's Figure 2).
"""
import atexit
import json
import os
import sys
from pathlib import Path
from types import FrameType
from typing import IO, Dict, Iterator, List, Optional

import torch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import teacher_forced_token_lp


def caller_frames(depth: int = 2) -> Iterator[FrameType]:
    """The frames of the calling stack, from ``sys._getframe(depth)`` as the function that calls this
    one counts it (2: its caller's caller) outwards. fairseq's command-line mains keep what the task
    is not handed (the output stream, the whole config, fairseq-interactive's batch ids) in locals."""
    frame = sys._getframe(depth + 1)  # + 1: this generator's own frame
    while frame is not None:
        yield frame
        frame = frame.f_back


def output_stream(depth: int = 2) -> IO:
    """The stream fairseq-generate prints its S/T/H/D/P lines to (else stdout).

    fairseq-generate's loop keeps it in a local ``output_file`` (stdout, or the file under
    ``--results-path``); provenance lines go to the same place.
    """
    for frame in caller_frames(depth):
        stream = frame.f_locals.get("output_file")
        if stream is not None and hasattr(stream, "write"):
            return stream
    return sys.stdout


def cli_option(name: str, depth: int = 2, generate_only: bool = False):
    """An option of the running fairseq-generate or fairseq-interactive (``cfg.common_eval.<name>``,
    e.g. ``quiet``, ``post_process``), read from the frame of its main function, which keeps the
    whole config in a local ``cfg`` (fairseq hands the task only the task, generation and BPE
    configs); ``generate_only``: fairseq-generate's frame only, the one :func:`output_stream`
    finds. None outside those commands."""
    for frame in caller_frames(depth):
        local = frame.f_locals
        common_eval = getattr(local.get("cfg"), "common_eval", None)
        if common_eval is not None and (not generate_only or local.get("output_file") is not None):
            return getattr(common_eval, name, None)
    return None


def interactive_ids(batch_size: int, depth: int = 2) -> Optional[List[int]]:
    """The ids fairseq-interactive prints for the batch being decoded (``S-<id>``, ``H-<id>``):
    ``start_id + batch.ids``, read from its main function's frame (it hands the task a sample
    without ids). None outside fairseq-interactive."""
    for frame in caller_frames(depth):
        local = frame.f_locals
        batch, start = local.get("batch"), local.get("start_id")
        ids = getattr(batch, "ids", None)
        if isinstance(start, int) and torch.is_tensor(ids) and ids.numel() == batch_size:
            return [start + int(i) for i in ids.tolist()]
    return None


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


def provenance_records(sample_ids, rows, doc_lp, store) -> List[dict]:
    out = []
    if rows is None:
        return [{"sample_id": sid, "provenance": []} for sid in sample_ids]
    probs = doc_lp.exp().cpu()
    for i, sid in enumerate(sample_ids):
        order = torch.argsort(probs[i], descending=True).tolist()
        out.append({"sample_id": sid, "provenance": [
            {"rank": r, "id": store.id(int(rows[i, k])), "title": store.title(int(rows[i, k])),
             "p": round(float(probs[i, k]), 6)} for r, k in enumerate(order)]})
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


class _JsonlOutput:
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


_OUTPUTS: Dict[str, _JsonlOutput] = {}


def append_jsonl(path: str, records: List[dict], expected: Optional[int] = None) -> None:
    """Add ``records`` (each with a ``sample_id``) to the JSON-lines output ``path`` of this run;
    ``expected``: how many samples the run generates for (see :class:`_JsonlOutput`)."""
    key = os.path.abspath(path)
    out = _OUTPUTS.get(key)
    if out is None:
        out = _OUTPUTS[key] = _JsonlOutput(path, expected)
    out.write(records)
