"""rag-choose-k: choose the number of retrieved documents K a RAG model reads at test time, on the
valid set: generate with each K (the same generator settings otherwise), score each, print a table
and the best K.

    rag-choose-k --checkpoint CKPT --data DATA --knowledge KS_DIR --k 1 3 5 \\
        [--metric em] [--metrics em,f1] [--beam 1] [--json-out k.json] [-- more rag-generate options]

For each K: ``rag-generate DATA --task retrieval_augmented --knowledge KS_DIR --path CKPT --gen-subset
valid --n-docs K --beam B --batch-size N [options after --]`` (printed as it runs), its output kept as
OUT_DIR/<subset>_k<K>.txt (and its log beside it), scored with the same code as ``rag-evaluate --gold
DATA/<subset>.jsonl --guess OUT_DIR/<subset>_k<K>.txt --metrics ...``. The best K has the highest
--metric; a tie goes to the smaller K (cheaper to decode, and fewer passages to blend). More documents
are not always better: with RAG-Token, a K too large can blend two passages' names into one that
exists in neither. Then generate the test set with ``--n-docs <best K>``.

--json-out: {"metric", "best_k", "subset", "scores": {K: {metric: value}}, "outputs": {K: file}}.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.evaluation.registry import TEXT, lookup, metric_label, parse_metrics
from rag_plugin.evaluation.scoring import evaluate_files
from rag_plugin.pipeline import commands
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_path, atomic_write_json


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-choose-k", description=__doc__)
    p.add_argument("--checkpoint", required=True, help="the trained RAG model (checkpoint_last.pt or _best.pt)")
    p.add_argument("--data", required=True, help="directory with <subset>.jsonl (KILT style, with answers)")
    p.add_argument("--knowledge", required=True, help="knowledge source directory to retrieve from")
    p.add_argument("--k", type=int, nargs="+", required=True, help="the numbers of documents to try")
    p.add_argument("--subset", default="valid", help="the split to choose on (not test: K is then part of the model)")
    p.add_argument("--metric", default="em", help="the metric that chooses (higher is better)")
    p.add_argument("--metrics", default="em,f1", help="the table's columns (--metric is added if missing)")
    p.add_argument("--beam", type=int, default=1, help="beam size (RAG-Token: 1 is greedy, the paper's QA preset)")
    p.add_argument("--batch-size", type=int, default=32, help="questions per generation batch")
    p.add_argument("--out-dir", default=None, help="where the generations go (None: CHECKPOINT's folder/choose_k)")
    p.add_argument("--json-out", default=None, help="also write the scores and the best K here (JSON)")
    return p


def split_argv(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(rag-choose-k's own arguments, the rag-generate options after ``--``)."""
    argv = list(argv)
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1:]
    return argv, []


def check_args(args) -> Tuple[List[str], str, List[int]]:
    """One-line errors for bad input; (the table's metrics, the choosing metric, the Ks in order)."""
    from rag_plugin.retrieval.knowledge import KnowledgeSource  # start-up: numpy; --help stays light

    if not Path(args.checkpoint).is_file():
        raise UserError("checkpoint not found", path=args.checkpoint, fix="train a model first (rag-train)")
    if args.subset == "test":
        raise UserError("--subset test: a K chosen on the test set makes its test score optimistic",
                        fix="choose K on the valid set (the default), then generate the test set with it")
    gold = Path(args.data) / f"{args.subset}.jsonl"
    if not gold.is_file():
        raise UserError(f"no {args.subset} split in --data", path=str(gold),
                        fix="DATA must hold <subset>.jsonl in KILT style (with answers)")
    metric = parse_metrics(args.metric)
    if len(metric) != 1 or lookup(metric[0])[0].kind != TEXT:
        raise UserError(f"--metric {args.metric} is not one answer metric", fix="use e.g. --metric em or --metric f1")
    columns = parse_metrics(args.metrics)
    columns = columns + [m for m in metric if m not in columns]
    ks = sorted(set(args.k))
    if ks[0] < 1:
        raise UserError(f"--k {ks[0]}: K must be at least 1", fix="give positive numbers of documents, e.g. --k 1 3 5")
    passages = len(KnowledgeSource(args.knowledge))
    if ks[-1] > passages:
        raise UserError(f"--k {ks[-1]} is more documents than the knowledge source holds ({passages} passages)",
                        path=args.knowledge, fix=f"use K of at most {passages}")
    if args.beam < 1 or args.batch_size < 1:
        raise UserError("--beam and --batch-size must be positive", fix="see rag-choose-k --help")
    return columns, metric[0], ks


def generate(args, k: int, out_dir: Path, extra: Sequence[str]) -> Path:
    """rag-generate's output on --subset with K documents: OUT_DIR/<subset>_k<K>.txt (log beside it)."""
    out = out_dir / f"{args.subset}_k{k}.txt"
    command = commands.Command("rag-generate", [
        args.data, "--task", "retrieval_augmented", "--knowledge", args.knowledge, "--path", args.checkpoint,
        "--gen-subset", args.subset, "--n-docs", k, "--beam", args.beam, "--batch-size", args.batch_size, *extra])
    with atomic_path(out) as tmp:  # a generation that breaks off leaves no file that looks complete
        commands.run(command, log_file=out.with_suffix(".log"), stdout_file=tmp,
                     progress=commands.generation_progress,
                     echo=lambda m: print(m, flush=True))
    return out


def best_k(scores: Dict[int, Dict[str, float]], metric: str) -> int:
    """The K with the highest ``metric``; ties to the smaller K."""
    return max(scores, key=lambda k: (scores[k][metric], -k))


def table(scores: Dict[int, Dict[str, float]], columns: Sequence[str], best: int) -> str:
    """The scores as an aligned text table, the best K marked."""
    labels = [metric_label(m) for m in columns]
    widths = [max(6, len(label)) for label in labels]
    lines = ["   K  " + "  ".join(label.rjust(w) for label, w in zip(labels, widths))]
    for k, row in scores.items():
        cells = "  ".join(f"{row[m]:{w}.1f}" for m, w in zip(columns, widths))
        lines.append(f"{k:4d}  {cells}" + ("   <- best" if k == best else ""))
    return "\n".join(lines) + "\n"


@cli_main
def main(argv=None) -> int:
    own, extra = split_argv(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(own)
    columns, metric, ks = check_args(args)
    out_dir = Path(args.out_dir) if args.out_dir else Path(args.checkpoint).parent / "choose_k"
    gold = str(Path(args.data) / f"{args.subset}.jsonl")
    scores: Dict[int, Dict[str, float]] = {}
    outputs: Dict[int, str] = {}
    for n, k in enumerate(ks, 1):
        print(f"[{n}/{len(ks)}] K={k}: generating the {args.subset} answers", flush=True)
        start = time.perf_counter()
        outputs[k] = str(generate(args, k, out_dir, extra))
        scores[k] = evaluate_files(gold, outputs[k], columns)
        shown = ", ".join(f"{m} {scores[k][m]:.1f}" for m in columns)
        print(f"   K={k}: {shown} ({time.perf_counter() - start:.0f} s)", flush=True)
    best = best_k(scores, metric)
    sys.stdout.write(f"\n{args.subset} set, {Path(args.checkpoint)}\n" + table(scores, columns, best))
    print(f"best K by {metric}: {best} (generate the test set with --n-docs {best})")
    if args.json_out:
        atomic_write_json(args.json_out, {"metric": metric, "best_k": best, "subset": args.subset,
                                          "scores": {str(k): v for k, v in scores.items()},
                                          "outputs": {str(k): v for k, v in outputs.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
