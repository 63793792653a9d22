"""rag-update-knowledge: add, delete or replace passages of a knowledge source as a new version.

    rag-update-knowledge --knowledge KS [--add FILE ...] [--delete IDS_FILE] [--replace FILE ...] \\
        [--retrain] [--keep N]
    rag-update-knowledge --knowledge KS --reembed CHECKPOINT     # every passage, with a trained document tower

Passage files in rag-build-knowledge's formats (.jsonl id/title/text, DPR .tsv, .gz); the ids file one
passage id per line. Version v+1 is written beside v (only new or edited passages embedded, with the
source's own encoder), then made current atomically; processes that have v open keep it. Killed at any
point, v stays current and the same command resumes. See rag_plugin/indexing/update.py.
``--reembed``: every passage embedded again by the source's encoder with the document tower of a checkpoint
trained with --train-doc-encoder (or a .pt holding {"document_tower": state dict}, or a .safetensors state
dict); see rag_plugin/indexing/reembed.py.
The passages embedded (new or edited ones; every one with ``--reembed``) go through the encoder on ``--device``
(default: a GPU when there is one), with ``--fp16`` in half precision (vectors stored float32).
"""
from __future__ import annotations

import sys
from pathlib import Path

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.indexing import BuildOptions
from rag_plugin.indexing.embedding import FP16_HELP, embedding_encoder
from rag_plugin.indexing.update import remove_old_versions, update_knowledge_source
from rag_plugin.retrieval.index import set_faiss_threads
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.devices import DEVICE_HELP, resolve_device
from rag_plugin.util.errors import UserError, cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-update-knowledge", description=__doc__)
    p.add_argument("--knowledge", required=True, help="the knowledge source directory (its current version is updated)")
    p.add_argument("--add", nargs="+", default=[], metavar="FILE", help="passages to add (ids not in the source)")
    p.add_argument("--delete", default=None, metavar="IDS_FILE", help="ids of passages to delete, one per line")
    p.add_argument("--replace", nargs="+", default=[], metavar="FILE",
                   help="new titles/texts for passages the source has (same ids)")
    p.add_argument("--reembed", default=None, metavar="CHECKPOINT",
                   help="embed every passage again with this document tower (checkpoint, .pt or .safetensors)")
    p.add_argument("--device", default=None, help=f"where the encoder embeds the passages: {DEVICE_HELP}")
    p.add_argument("--fp16", action="store_true", help=FP16_HELP)
    p.add_argument("--retrain", action="store_true",
                   help="train a new quantizer (IVF/PQ/SQ) on the new collection instead of keeping the current one")
    p.add_argument("--keep", type=int, default=None, metavar="N",
                   help="then remove the versions older than the N newest that no process has open")
    p.add_argument("--batch-size", type=int, default=64, help="encoder batch size")
    p.add_argument("--threads", type=int, default=None,
                   help="torch/FAISS threads (unset: torch's own)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch  # start-up: --help stays light

    from rag_plugin.retrieval.threads import faiss_thread_budget  # start-up: torch; --help stays light

    if args.reembed and (args.add or args.delete or args.replace):
        raise UserError("--reembed embeds the current passages again: it cannot be combined with --add, --delete "
                        "or --replace", fix="update the passages first, then re-embed in a second command")
    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    set_faiss_threads(args.threads or faiss_thread_budget(device))
    if args.reembed:
        from rag_plugin.indexing.reembed import Reembedding, read_tower_state, reembed  # start-up: torch

        job = Reembedding(args.reembed, device=device, fp16=args.fp16)
        options = BuildOptions(batch_size=args.batch_size, progress=not args.quiet,
                               log=lambda m: print(m, file=sys.stderr))
        reembed(args.knowledge, read_tower_state(args.reembed), job, options)
        if args.keep:
            remove_old_versions(Path(args.knowledge), args.keep, lambda m: print(m, file=sys.stderr))
        return 0
    encoder = None
    if (args.add or args.replace) and (device.type != "cpu" or args.fp16):  # else the builder loads it on the CPU
        encoder = embedding_encoder(KnowledgeSource(args.knowledge).encoder_spec, device, args.fp16)
    update_knowledge_source(args.knowledge, add=args.add, delete=args.delete, replace=args.replace,
                            retrain=args.retrain, keep=args.keep, batch_size=args.batch_size, encoder=encoder,
                            progress=not args.quiet, log=lambda m: print(m, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
