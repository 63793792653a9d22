r"""rag-convert-hf: a Hugging Face RAG folder (rag-token-nq, rag-sequence-nq, ...) -> a plugin checkpoint directory.

    rag-convert-hf --hf-dir rag-sequence-nq --out checkpoints/rag_sequence_nq \
        [--input-format hf|plugin|FILE] [--variant token|sequence] [--max-source-positions N]

Writes OUT/checkpoint.pt (fairseq-generate --path), the generator dictionary and BPE files
(dict.txt, encoder.json, vocab.bpe), the question encoder (encoder spec hf-dpr:OUT/question_encoder),
input_format.json and conversion.json; import a knowledge source for it with
rag-import-knowledge --rag-checkpoint OUT. Local files only (rag_plugin/conversion/hf_rag.py).
To fine-tune the converted model on transformers' finetune_rag objective, train with --target-format hf.
"""
from __future__ import annotations

import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-convert-hf", description=__doc__)
    p.add_argument("--hf-dir", required=True, help="a transformers RAG folder (the model's and its RagTokenizer's "
                                                   "save_pretrained)")
    p.add_argument("--out", required=True, help="output checkpoint directory (new or empty; see --overwrite)")
    p.add_argument("--input-format", default="hf", metavar="hf|plugin|FILE",
                   help="the generator's input: hf (the reference's), plugin, or an input_format.json")
    p.add_argument("--variant", choices=("token", "sequence"), default=None,
                   help="RAG-Token or RAG-Sequence (default: from config.json's architectures)")
    p.add_argument("--max-source-positions", type=int, default=None,
                   help="generator input length (default: the config's max_combined_length, 300)")
    p.add_argument("--knowledge", default="", help="knowledge source recorded in the checkpoint (optional)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    return p


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rag_plugin.conversion.hf_rag import convert_hf_rag  # start-up: torch and fairseq, not needed by --help

    convert_hf_rag(args.hf_dir, args.out, input_format=args.input_format, variant=args.variant,
                   max_source_positions=args.max_source_positions, knowledge=args.knowledge,
                   overwrite=args.overwrite, log=lambda message: print(message, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
