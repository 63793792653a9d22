"""rag-plot-posterior: heat map of RAG-Token's per-token document posterior (the paper's Figure 2).

    fairseq-generate ... --doc-posterior-out post.jsonl
    rag-plot-posterior post.jsonl --sample 0 --out posterior.png

Needs matplotlib (pip install -e .[plot]).
"""
import sys
from pathlib import Path
from typing import Optional

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_path, iter_jsonl

RECORD_FIX = "use the file written by fairseq-generate --doc-posterior-out"


def load_record(path: str, sample: Optional[int]) -> dict:
    """The record of ``sample`` (``None``: the first) in a ``--doc-posterior-out`` file."""
    if not Path(path).is_file():
        raise UserError("posterior file not found", path=path,
                        fix="write one with fairseq-generate --doc-posterior-out")
    records = []
    for lineno, rec in iter_jsonl(path, fix=RECORD_FIX):
        if not all(key in rec for key in ("posterior", "tokens", "docs")):
            raise UserError("not a per-token posterior record", path=path, line=lineno, fix=RECORD_FIX)
        records.append(rec)
    if not records:
        raise UserError("posterior file is empty", path=path, fix="generate with --doc-posterior-out first")
    if sample is None:
        return records[0]
    for rec in records:
        if rec.get("sample_id") == sample:
            return rec
    ids = sorted(r["sample_id"] for r in records if isinstance(r.get("sample_id"), int))
    raise UserError(f"no record for sample {sample}", path=path, fix=f"pick one of {ids[:10]}")


def plot(rec: dict, out: str, question: str = "") -> None:
    """Draw ``rec``'s posterior p(z | x, y_i, y<i) (documents x tokens) into the PNG file ``out``."""
    try:  # optional dependency (the [plot] extra)
        import matplotlib
    except ImportError:
        raise UserError("rag-plot-posterior needs matplotlib", fix="pip install -e .[plot]") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the backend
    import numpy as np  # start-up: --help needs no numpy

    post = np.asarray(rec["posterior"], dtype=float)  # [K, T]
    tokens = [t.replace("\u2581", " ").strip() or "\u2423" for t in rec["tokens"]]
    labels = [f"{i + 1}. {d['title'][:40]} (p={d['prior']:.2f})" for i, d in enumerate(rec["docs"])]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(tokens) + 4), 0.5 * len(labels) + 1.8))
    im = ax.imshow(post, aspect="auto", cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for (k, t), v in np.ndenumerate(post):
        ax.text(t, k, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v > 0.6 else "black")
    title = f"RAG-Token document posterior p(z | x, y_i, y<i): \"{rec.get('text', '')}\""
    ax.set_title((question + "\n" if question else "") + title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=130)
    plt.close(fig)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="rag-plot-posterior", description=__doc__)
    p.add_argument("posterior", help="JSON lines written by fairseq-generate --doc-posterior-out")
    p.add_argument("--sample", type=int, default=None, help="sample id to plot (None: the first record)")
    p.add_argument("--question", default="", help="title line (e.g. the question)")
    p.add_argument("--out", required=True, help="PNG file to write")
    return p


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    plot(load_record(args.posterior, args.sample), args.out, args.question)
    print(args.out)


if __name__ == "__main__":
    sys.exit(main())
