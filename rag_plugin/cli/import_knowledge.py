"""rag-import-knowledge: a knowledge source from passages whose vectors were computed elsewhere (no re-embedding).

    # a Hugging Face knowledge dataset (title, text, embeddings): save_to_disk folder, .arrow or .parquet
    rag-import-knowledge --dataset my_knowledge_dataset [--faiss-index my_index.faiss] \\
        --rag-checkpoint checkpoints/rag_sequence_nq --out ks/my_knowledge
    # DPR's psgs_w100.tsv (or .tsv.gz) with its embeddings (pickles: --trust-pickles; or .npy + --ids)
    rag-import-knowledge --passages psgs_w100.tsv.gz --vectors wikipedia_passages_*.pkl \\
        --trust-pickles --rag-checkpoint checkpoints/rag_sequence_nq --out ks/wiki_dpr

--rag-checkpoint (a folder written by rag-convert-hf) supplies the query encoder spec, the
generator tokenizer and the input format; or give --encoder-spec, --dict with the subword files
and --input-format yourself. The manifest records where the vectors came from and, unless
--encoder-identity (or an --encoder-spec with its own passage tower) names it, that their document
encoder is unknown. Resumable: rerun the same command.
"""
from __future__ import annotations

import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.indexing import BuildOptions
from rag_plugin.indexing.import_knowledge import IMPORT_SHARD_SIZE, ImportRequest, import_knowledge
from rag_plugin.retrieval.index import set_faiss_threads
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles, add_tokenizer_arguments
from rag_plugin.util.errors import cli_main


def build_parser(prog: str = "rag-import-knowledge") -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__)
    src = p.add_argument_group("input (one of)")
    src.add_argument("--dataset", default=None,
                     help="Hugging Face dataset (title, text, embeddings[, id]): save_to_disk folder or .parquet")
    src.add_argument("--passages", default=None,
                     help="psgs_w100.tsv (id<TAB>text<TAB>title, with header) or .jsonl; also .gz")
    p.add_argument("--vectors", nargs="+", default=[], metavar="FILE",
                   help="with --passages: wikipedia_passages_*.pkl (needs --trust-pickles) and/or .npy [N, D] arrays")
    p.add_argument("--ids", nargs="+", default=[], metavar="FILE",
                   help="with --passages: one per .npy, same order: passage ids (one per line, or a .npy of ids)")
    p.add_argument("--trust-pickles", action="store_true",
                   help="allow unpickling .pkl files (pickles can run code: only for files you trust)")
    p.add_argument("--faiss-index", default=None,
                   help="an existing FAISS inner-product index over the passages, used instead of building one")
    p.add_argument("--out", required=True, help="knowledge source directory (new, empty, or an unfinished import)")
    p.add_argument("--rag-checkpoint", default=None, metavar="DIR",
                   help="a converted RAG checkpoint folder: its query encoder, generator tokenizer and input format")
    p.add_argument("--encoder-spec", default=None,
                   help="spec of the query encoder that goes with the vectors (e.g. hf-dpr:DIR)")
    p.add_argument("--encoder-identity", default=None, metavar="JSON",
                   help="identity of the vectors' document encoder for the manifest (inline JSON or a file)")
    add_tokenizer_arguments(p, None, "unset: the --rag-checkpoint's, else plugin")
    p.add_argument("--index-factory", default="Flat", help="FAISS factory string when no --faiss-index is given")
    p.add_argument("--train-size", type=int, default=100_000, help="vectors sampled to train the quantizer")
    p.add_argument("--shard-size", type=int, default=IMPORT_SHARD_SIZE,
                   help="rows per vectors shard (the unit of resume)")
    p.add_argument("--threads", type=int, default=None, help="FAISS threads; unset: all CPUs")
    p.add_argument("--restart", action="store_true", help="discard an unfinished import in --out and start over")
    p.add_argument("--seed", type=int, default=0, help="seed of the quantizer's training sample")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def run(args) -> int:
    """Import as ``args`` (parsed by :func:`build_parser`) say; reports on stderr."""
    set_faiss_threads(args.threads)
    request = ImportRequest(
        dataset=args.dataset, passages=args.passages, vectors=args.vectors, ids=args.ids,
        trust_pickles=args.trust_pickles, faiss_index=args.faiss_index, rag_checkpoint=args.rag_checkpoint,
        encoder_spec=args.encoder_spec, encoder_identity=args.encoder_identity,
        tokenizer=GeneratorTokenizerFiles.from_args(args), input_format=args.input_format,
        index_factory=args.index_factory, train_size=args.train_size, seed=args.seed)
    options = BuildOptions(shard_size=args.shard_size, restart=args.restart, progress=not args.quiet,
                           log=lambda m: print(m, file=sys.stderr))
    ks = import_knowledge(args.out, request, options)
    print(f"wrote {args.out}: {len(ks)} passages, dim {ks.dim}, index {ks.manifest['index_factory']}, "
          f"input format {ks.input_format.name}", file=sys.stderr)
    return 0


@cli_main
def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
