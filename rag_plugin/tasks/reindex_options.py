"""The task's options for re-indexing the knowledge source while the document encoder trains
(``--reindex-every``; the work itself: :mod:`rag_plugin.reindexing.reindexer`)."""
from dataclasses import dataclass, field

from fairseq.dataclass import FairseqDataclass


@dataclass
class ReindexConfig(FairseqDataclass):
    reindex_every: int = field(
        default=0, metadata={"help": "every N updates, embed the whole knowledge source again with a snapshot of the "
                                     "document encoder being trained (--train-doc-encoder), in background processes "
                                     "(the embedding split over the ranks), as a new version of the source that "
                                     "every rank switches to at the same step once it is complete (until then "
                                     "retrieval uses the stale index); 0 = never"})
    reindex_threads: int = field(
        default=1, metadata={"help": "torch/FAISS threads of each rank's re-index process (it runs beside training "
                                     "at a lower priority: keep this small enough not to starve the trainer)"})
    reindex_switch_after: int = field(
        default=0, metadata={"help": "switch every rank to the re-indexed version exactly M updates after its "
                                     "re-index started, never earlier (a version that landed sooner waits), waiting "
                                     "there for one that has not landed: the same seed then trains on the same "
                                     "versions at the same updates on a fast or a slow machine (the next re-index "
                                     "starts at the first multiple of --reindex-every from the switch); 0 = switch "
                                     "at whatever update the re-index lands"})
    reindex_device: str = field(
        default="cpu", metadata={"help": "where the re-index processes run the document tower: cpu, cuda (each "
                                         "rank's own GPU, the one its model is on: a second copy of the tower and a "
                                         "batch beside training) or cuda:N"})
    reindex_batch_size: int = field(default=64, metadata={"help": "encoder batch size of the re-index processes"})
    reindex_wait_minutes: float = field(
        default=120.0, metadata={"help": "how long rank 0's re-index process waits for the other ranks' embedding "
                                         "chunks before it gives up (a warning; the next re-index tries again)"})
    reindex_wait_at_exit: bool = field(
        default=False, metadata={"help": "at the end of training wait for a running re-index to land (the source's "
                                         "current version is then embedded by the last snapshot) instead of stopping "
                                         "it (its unfinished version is never made current)"})
    reindex_keep: int = field(
        default=0, metadata={"help": "after each switch to a re-indexed version, remove the versions older than the "
                                     "N newest that no process has open (each version is a full copy of the vectors "
                                     "and index); 0 = keep every version"})
