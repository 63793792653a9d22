"""``python -m tests.build.build_entry ARGS``: rag-build-knowledge (rag_plugin.cli.build_knowledge.main) with the
tests' :class:`~tests.conftest.HashingEncoder` reachable as ``--encoder hashing`` (a build in seconds), for tests
that launch builds as separate processes (torchrun or one process per rank).

``RAG_TEST_DIE_AFTER_CHUNKS=N`` (set for one rank only): the process kills itself with SIGKILL when it starts
embedding its (N+1)-th chunk, a process lost in the middle of a build. The encoder's identity does not depend on
it, so a rerun without it resumes the same build.
"""
import os
import signal
import sys

from rag_plugin.cli.build_knowledge import main
from rag_plugin.retrieval.encoders.registry import register_encoder
from tests.conftest import HashingEncoder


class _MortalHashingEncoder(HashingEncoder):
    """:class:`HashingEncoder` that dies (SIGKILL) at its (N+1)-th ``encode_passages`` call."""

    def __init__(self, dim: int, die_after: int):
        super().__init__(dim)
        self.calls, self.die_after = 0, die_after

    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        if self.calls == self.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        self.calls += 1
        return super().encode_passages(titles, texts, batch_size, progress)


@register_encoder("hashing", usage="hashing[:dim=N]")
def load_hashing(arg, options):
    dim = options.integer("dim", 64)
    options.done("dim")
    die_after = os.environ.get("RAG_TEST_DIE_AFTER_CHUNKS")
    return HashingEncoder(dim) if die_after is None else _MortalHashingEncoder(dim, int(die_after))


if __name__ == "__main__":
    sys.exit(main())
