"""rag-build-knowledge: passages -> (split) -> pre-tokenize -> embed -> FAISS index -> knowledge source.

    rag-build-knowledge --passages FILE [FILE ...] --out DIR \\
        [--encoder minilm|dpr:PATH|hf-dpr:PATH] [--index-factory Flat|HNSW32|IVF256,SQ8|...] \\
        [--split-words N] [--dict dict.txt --bpe-model spm.model]

Passages: DPR's psgs_w100.tsv layout (id, text, title) or JSONL (id, title, text), either one
gzip-compressed (.gz). Resumable: rerun the same command after an interruption and finished shards
are skipped. A rerun whose encoder differs from the one the vectors were made with (e.g. new
weights at the same hf-dpr:DIR) is refused, never mixed or called up to date.

Split over several processes, on one node or several (the output directory on a filesystem they all see)::

    torchrun --nproc-per-node P -m rag_plugin.cli.build_knowledge --passages ... --out DIR [--num-shards S]

Rank 0 checks the input and writes the passage store, every process embeds its share of the chunks, rank 0
gathers the vectors, each index shard is built by one process, rank 0 writes the manifest. The vectors are
those of a one-process build; rerunning the same command (with any number of processes) finishes a build
that lost a process.

The encoder runs on ``--device`` (default: a GPU when there is one; under torchrun each process its node's
LOCAL_RANK-th GPU), with ``--fp16`` in half precision (vectors stored float32, within float16 rounding of
float32 ones; recorded in the manifest as ``embedding_fp16``). FAISS gets ``--threads``, else torch's threads
with the encoder on the CPU and the cores per process on the node with it on a GPU.
"""
from __future__ import annotations

import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.indexing.distributed import DEFAULT_TIMEOUT_MINUTES, BuildGroup
from rag_plugin.indexing.embedding import FP16_HELP, embedding_device, embedding_encoder, embedding_record
from rag_plugin.retrieval.index import set_faiss_threads
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles, add_tokenizer_arguments
from rag_plugin.util.devices import DEVICE_HELP
from rag_plugin.util.errors import cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-build-knowledge", description=__doc__)
    p.add_argument("--passages", required=True, nargs="+",
                   help="DPR-layout .tsv or .jsonl passage files (also .gz), read as one collection")
    p.add_argument("--out", required=True, help="output directory (new, empty, or an unfinished build to resume)")
    p.add_argument("--encoder", default="minilm", help="document encoder: minilm | dpr:CHECKPOINT | hf-dpr:DIR")
    p.add_argument("--index-factory", default="Flat",
                   help="FAISS factory string, inner-product metric: Flat, HNSW32, IVF4096,SQ8, IVF256,PQ32 ...")
    p.add_argument("--num-shards", type=int, default=1,
                   help="write the index in this many shards, held by different processes or nodes")
    p.add_argument("--split-words", type=int, default=None,
                   help="split documents into passages of this many words (the paper uses 100)")
    add_tokenizer_arguments(p, "plugin", "the one the model reads")
    p.add_argument("--train-size", type=int, default=100_000, help="vectors sampled to train the quantizer")
    p.add_argument("--shard-size", type=int, default=2048,
                   help="passages per embedding chunk, the unit of resume (not the index shards: --num-shards)")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    p.add_argument("--threads", type=int, default=None,
                   help="torch/FAISS threads (unset: torch's own)")
    p.add_argument("--device", default=None, help=f"where the document encoder runs: {DEVICE_HELP}")
    p.add_argument("--fp16", action="store_true", help=FP16_HELP)
    p.add_argument("--reuse-vectors-from", default=None, metavar="KS_DIR",
                   help="copy the vectors of unchanged passages (same id, title, text) from an existing knowledge "
                        "source with the same document encoder; embed only new or edited ones")
    p.add_argument("--restart", action="store_true", help="discard an unfinished build in --out and start over")
    p.add_argument("--seed", type=int, default=0, help="seed of the quantizer's training sample")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT_TIMEOUT_MINUTES, metavar="MINUTES",
                   help="under torchrun: how long a process waits for the others in one step before an error")
    return p


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch  # start-up: --help stays light

    from rag_plugin.core.input_format import InputFormat  # start-up: torch; --help stays light
    from rag_plugin.retrieval.threads import faiss_thread_budget  # start-up: torch; --help stays light

    passages = args.passages[0] if len(args.passages) == 1 else args.passages
    settings = BuildSettings(passages=passages, encoder=args.encoder, index_factory=args.index_factory,
                             split_words=args.split_words, tokenizer=GeneratorTokenizerFiles.from_args(args),
                             train_size=args.train_size, seed=args.seed, num_shards=args.num_shards,
                             input_format=InputFormat.parse(args.input_format).identity())
    group = BuildGroup.from_environment(args.dist_timeout)  # one process unless torchrun started several
    try:
        encoder = embedding_encoder(args.encoder, args.device, args.fp16)
        if args.threads:
            torch.set_num_threads(args.threads)
        # not all CPUs per process: torch's threads beside the encoder on the CPU (torchrun: its OMP_NUM_THREADS),
        # the cores per process on the node with the encoder on a GPU
        set_faiss_threads(args.threads or faiss_thread_budget(embedding_device(encoder)))
        options = BuildOptions(shard_size=args.shard_size, batch_size=args.batch_size, restart=args.restart,
                               progress=not args.quiet, log=lambda m: print(m, file=sys.stderr), group=group)
        hooks = BuildHooks(encoder=encoder, reuse_vectors_from=args.reuse_vectors_from,
                           manifest_extra=embedding_record(encoder) or None)
        build_knowledge_source(args.out, settings, options, hooks)
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
