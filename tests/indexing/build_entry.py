"""``python -m tests.indexing.build_entry ARGS``: rag-build-knowledge (rag_plugin.cli.build_knowledge.main) with the
tests' :class:`~tests.conftest.HashingEncoder` reachable as ``--encoder hashing`` (a build in seconds), for tests
that launch builds as separate processes (torchrun or one process per rank).

``RAG_TEST_DIE_AFTER_CHUNKS=N`` (set for one rank only): the process kills itself with SIGKILL when it starts
embedding its (N+1)-th chunk, a process lost in the middle of a build; ``RAG_TEST_STALL_AFTER_CHUNKS=N``: it
sleeps for ten minutes there instead, a process that hangs. The encoder's identity does not depend on them, so a
rerun without them resumes the same build.
"""
import os
import signal
import sys
import time

from rag_plugin.cli.build_knowledge import main
from rag_plugin.retrieval.encoders.registry import register_encoder
from tests.conftest import HashingEncoder


class _MortalHashingEncoder(HashingEncoder):
    """:class:`HashingEncoder` that dies (SIGKILL) or hangs at its (N+1)-th ``encode_passages`` call."""

    def __init__(self, dim: int, after: int, how: str):
        super().__init__(dim)
        self.calls, self.after, self.how = 0, after, how

    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        if self.calls == self.after:
            if self.how == "DIE":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(600)
        self.calls += 1
        return super().encode_passages(titles, texts, batch_size, progress)


@register_encoder("hashing", usage="hashing[:dim=N]")
def load_hashing(arg, options):
    dim = options.integer("dim", 64)
    options.done("dim")
    for how in ("DIE", "STALL"):
        after = os.environ.get(f"RAG_TEST_{how}_AFTER_CHUNKS")
        if after is not None:
            return _MortalHashingEncoder(dim, int(after), how)
    return HashingEncoder(dim)


if __name__ == "__main__":
    sys.exit(main())
