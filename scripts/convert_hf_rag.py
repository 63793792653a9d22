#!/usr/bin/env python
"""Convert a Hugging Face RAG folder (rag-token-nq, rag-sequence-nq, ...) into a plugin checkpoint.

    python scripts/convert_hf_rag.py --hf-dir rag-sequence-nq --out checkpoints/rag_sequence_nq \
        [--input-format hf|plugin] [--variant token|sequence] [--max-source-positions N]

Writes DIR/checkpoint.pt (fairseq-generate --path), the generator dictionary and BPE files,
the question encoder (hf-dpr:DIR/question_encoder) and input_format.json; import a knowledge
source for it with scripts/import_hf_knowledge.py --rag-checkpoint DIR. Local files only.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from rag_plugin.util.errors import cli_main  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="folder written by RagTokenForGeneration/RagSequenceForGeneration"
                                                   ".save_pretrained (+ RagTokenizer.save_pretrained)")
    p.add_argument("--out", required=True, help="output checkpoint directory (new or empty; see --overwrite)")
    p.add_argument("--input-format", default="hf",
                   help="hf (default: the reference's 'title / text // question', outputs match the reference) "
                        "or plugin ('<s> question </s> title </s> text </s>', e.g. to fine-tune in that format)")
    p.add_argument("--variant", choices=("token", "sequence"), default=None,
                   help="RAG-Token or RAG-Sequence (default: from config.json's architectures)")
    p.add_argument("--max-source-positions", type=int, default=None,
                   help="generator input length (default: the config's max_combined_length, 300)")
    p.add_argument("--knowledge", default="", help="knowledge source recorded in the checkpoint (optional)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    return p.parse_args(argv)


@cli_main
def main(argv=None):
    args = parse_args(argv)
    from rag_plugin.conversion.hf_rag import convert_hf_rag

    convert_hf_rag(args.hf_dir, args.out, input_format=args.input_format, variant=args.variant,
                   max_source_positions=args.max_source_positions, knowledge=args.knowledge,
                   overwrite=args.overwrite, log=lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
