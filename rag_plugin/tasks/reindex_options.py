"""The task's options for re-indexing the knowledge source while the document encoder trains
(``--reindex-every``; the work itself: :mod:`rag_plugin.reindexing.reindexer`)."""
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass


@dataclass
class ReindexConfig(FairseqDataclass):
    reindex_every: int = field(default=0, metadata={
        "help": "every N updates re-embed the knowledge source with the training document encoder; 0 = never"})
    reindex_threads: int = field(default=1, metadata={
        "help": "torch/FAISS threads of each rank's background re-index process"})
    reindex_switch_after: int = field(default=0, metadata={
        "help": "switch to the re-indexed version exactly M updates after its start (reproducible); 0 = on landing"})
    reindex_device: str = field(default="cpu", metadata={
        "help": "where the re-index runs the document tower: cpu, cuda (the rank's own GPU) or cuda:N"})
    reindex_batch_size: int = field(default=64, metadata={"help": "encoder batch size of the re-index processes"})
    reindex_wait_minutes: float = field(default=120.0, metadata={
        "help": "how long rank 0's re-index waits for the other ranks' chunks before it gives up"})
    reindex_wait_at_exit: bool = field(default=False, metadata={
        "help": "at the end of training wait for a running re-index to land instead of stopping it"})
    reindex_keep: int = field(default=0, metadata={
        "help": "after each switch remove the versions older than the N newest no process has open; 0 = keep all"})
