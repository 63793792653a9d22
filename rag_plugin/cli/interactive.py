"""``rag-interactive``: ask a trained RAG model questions, answers with their provenance.

    rag-interactive CHECKPOINT [--knowledge KS_DIR] [--n-docs 5] [--beam 4] [--nbest 1]
        [--input questions.txt] [--json] [--device cuda]

Reads one question per line from ``--input`` (or standard input, with a prompt when it is a
terminal) and prints, per question, the answer with its score and the retrieved passages with
p(z|x), best first (``--json``: one JSON object per question instead). Built on
:class:`rag_plugin.hub.RAG`, so it answers exactly as the Python API does.
"""
import json
import sys

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.devices import DEVICE_HELP
from rag_plugin.util.errors import UserError, cli_main


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-interactive", description=__doc__)
    p.add_argument("checkpoint", help="a checkpoint*.pt written by fairseq-train with the plugin")
    p.add_argument("--knowledge", default=None,
                   help="knowledge source to retrieve from (default: the checkpoint's)")
    p.add_argument("--n-docs", type=int, default=None, help="documents per question (default: the checkpoint's)")
    p.add_argument("--rag-decoding", choices=("thorough", "fast"), default=None,
                   help="RAG-Sequence decoding (default: the checkpoint's)")
    p.add_argument("--beam", type=int, default=4, help="beam size")
    p.add_argument("--nbest", type=int, default=1, help="answers shown per question")
    p.add_argument("--max-len-b", type=int, default=64, help="longest answer, in tokens")
    p.add_argument("--input", default="-", help="file with one question per line ('-': standard input)")
    p.add_argument("--json", action="store_true", help="one JSON object per question")
    p.add_argument("--passages", type=int, default=3, help="passages shown per answer (text output)")
    p.add_argument("--device", default=None, help=f"where the model runs: {DEVICE_HELP}")
    return p


def _questions(path: str):
    if path == "-":
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                sys.stderr.write("question> ")
                sys.stderr.flush()
            line = sys.stdin.readline()
            if not line:
                return
            if line.strip():
                yield line.strip()
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                lines = [line.strip() for line in fh]
        except OSError as err:
            raise UserError(f"cannot read the questions ({err.strerror})", path=path, fix="check the path") from None
        yield from (q for q in lines if q)


def _print_text(result: dict, passages: int) -> None:
    print(f"A: {result['answer']}\t(score {result['score']:.3f} nats)")
    for alt in result["alternatives"]:
        print(f"   {alt['answer']}\t(score {alt['score']:.3f} nats)")
    for rank, doc in enumerate(result["provenance"][:passages]):
        print(f"   [{rank}] p={doc['p']:.3f}  {doc['title']}  ({doc['id']})")


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from rag_plugin.hub import RAG  # start-up: torch and fairseq, not needed by --help

    rag = RAG.from_pretrained(args.checkpoint, knowledge=args.knowledge, n_docs=args.n_docs,
                              rag_decoding=args.rag_decoding, device=args.device)
    for question in _questions(args.input):
        result = rag.generate([question], beam=args.beam, nbest=args.nbest, max_len_b=args.max_len_b)[0]
        if args.json:
            print(json.dumps(result, ensure_ascii=False), flush=True)
        else:
            _print_text(result, args.passages)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
