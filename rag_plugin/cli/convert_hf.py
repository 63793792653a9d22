r"""rag-convert-hf: a Hugging Face RAG folder (rag-token-nq, rag-sequence-nq, ...) -> a plugin checkpoint directory;
or (--gpt2) a Hugging Face GPT-2-family model -> a fairseq transformer_lm.

    rag-convert-hf --hf-dir rag-sequence-nq --out checkpoints/rag_sequence_nq \
        [--input-format hf|plugin|FILE] [--variant token|sequence] [--max-source-positions N]
    rag-convert-hf --gpt2 gpt2 --out checkpoints/gpt2 [--overwrite]

Writes OUT/checkpoint.pt (fairseq-generate --path), the generator dictionary and BPE files
(dict.txt, encoder.json, vocab.bpe), the question encoder (encoder spec hf-dpr:OUT/question_encoder),
input_format.json and conversion.json; import a knowledge source for it with
rag-import-knowledge --rag-checkpoint OUT. Local files only (rag_plugin/conversion/hf_rag.py).
To fine-tune the converted model on transformers' finetune_rag objective, train with --target-format hf.

--gpt2 DIR (config.json, model.safetensors, vocab.json, merges.txt) writes OUT/checkpoint.pt (a fairseq
transformer_lm, task language_modeling), dict.txt (GPT-2 id g is fairseq id g+4; <|endoftext|> is </s>),
encoder.json, vocab.bpe and conversion.json (rag_plugin/conversion/hf_gpt2.py).
"""
from __future__ import annotations

import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-convert-hf", description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf-dir", help="a transformers RAG folder (the model's and its RagTokenizer's "
                                         "save_pretrained)")
    source.add_argument("--gpt2", metavar="DIR", help="instead: a transformers GPT-2-family folder (config.json, "
                                                      "model.safetensors, vocab.json, merges.txt) -> a fairseq "
                                                      "transformer_lm")
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


def _log(message: str) -> None:
    print(message, file=sys.stderr)


@cli_main
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gpt2 is not None:
        rag_only = [flag for flag, value in (("--input-format", args.input_format != "hf"), ("--variant", args.variant),
                                             ("--max-source-positions", args.max_source_positions),
                                             ("--knowledge", args.knowledge)) if value]
        if rag_only:
            parser.error(f"argument {rag_only[0]}: only with --hf-dir, not --gpt2")
        from rag_plugin.conversion.hf_gpt2 import convert_hf_gpt2  # start-up: torch and fairseq

        convert_hf_gpt2(args.gpt2, args.out, overwrite=args.overwrite, log=_log)
        return 0
    from rag_plugin.conversion.hf_rag import convert_hf_rag  # start-up: torch and fairseq, not needed by --help

    convert_hf_rag(args.hf_dir, args.out, input_format=args.input_format, variant=args.variant,
                   max_source_positions=args.max_source_positions, knowledge=args.knowledge,
                   overwrite=args.overwrite, log=_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
