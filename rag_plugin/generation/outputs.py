"""What a generation run writes besides fairseq's own lines: Z lines (the retrieved passages and p(z|x) of each
question, into fairseq-generate's output stream), ``--provenance-out`` and ``--doc-posterior-out`` JSONL files
(complete or absent: :class:`~rag_plugin.generation.provenance.JsonlOutput`) and the progress line."""
import sys
from pathlib import Path
from typing import Optional

from rag_plugin.generation import provenance
from rag_plugin.generation.fid import attention_of
from rag_plugin.generation.progress import GenerationProgress
from rag_plugin.generation.provenance import JsonlOutput


class GenerationOutputs:
    """The outputs of one task's generation run (the task creates one on first use)."""

    def __init__(self, task):
        self.task = task
        self._jsonl_outputs = {}
        self._progress = None

    def progress(self):
        if self._progress is None:
            self._progress = GenerationProgress(self.task.cfg.progress_interval, self.generation_size())
        return self._progress

    def generation_size(self) -> Optional[int]:
        """How many questions this run generates for: fairseq-generate's --gen-subset, else the one split
        loaded; None (fairseq-interactive, the hub) when unknown."""
        datasets = self.task.datasets
        name = self.task.fairseq_option("gen_subset")
        subset = datasets.get(name) if name else (next(iter(datasets.values())) if len(datasets) == 1 else None)
        return len(subset) if subset is not None else None

    def write_provenance(self, model, generator, sample, hypos, rows, doc_lp) -> None:
        """Z lines into fairseq's output (none with --quiet); --provenance-out / --doc-posterior-out files."""
        task, cfg = self.task, self.task.cfg
        ids = sample["id"].tolist()
        store = task.knowledge.passages
        lines = [] if task.fairseq_option("quiet", False) else provenance.z_lines(ids, rows, doc_lp, store)
        if lines:
            (task.output_stream or sys.stdout).write("\n".join(lines) + "\n")
        expected = self.generation_size()
        if cfg.provenance_out:
            self._jsonl(cfg.provenance_out, expected).write(  # FiD: with each passage's attention share
                provenance.provenance_records(ids, rows, doc_lp, store, attention=attention_of(hypos)))
        if cfg.doc_posterior_out and rows is not None and getattr(generator, "variant", None) == "token":
            self._jsonl(cfg.doc_posterior_out, expected).write(provenance.token_doc_posteriors(
                model, sample, hypos, rows, doc_lp, task.tokenizer, store))

    def _jsonl(self, path: str, expected: Optional[int]):
        key = str(Path(path).resolve())
        if key not in self._jsonl_outputs:
            self._jsonl_outputs[key] = JsonlOutput(path, expected)
        return self._jsonl_outputs[key]
