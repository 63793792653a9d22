#!/usr/bin/env python
"""Heat map of RAG-Token's per-token document posterior (the paper's Figure 2).

    fairseq-generate ... --doc-posterior-out post.jsonl
    python scripts/plot_doc_posterior.py post.jsonl --sample 0 --out posterior.png
"""
import argparse
import json
import sys
from pathlib import Path

from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_path


def load_record(path: str, sample):
    p = Path(path)
    if not p.is_file():
        raise UserError("posterior file not found", path=path, fix="write one with fairseq-generate --doc-posterior-out")
    records = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            rec["posterior"], rec["tokens"], rec["docs"]  # noqa: B018 (presence check)
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError("not a per-token posterior record", path=path, line=lineno,
                            fix="use the file written by --doc-posterior-out") from None
        records.append(rec)
    if not records:
        raise UserError("posterior file is empty", path=path, fix="generate with --doc-posterior-out first")
    if sample is None:
        return records[0]
    for rec in records:
        if rec["sample_id"] == sample:
            return rec
    raise UserError(f"no record for sample {sample}", path=path, fix=f"pick one of {sorted(r['sample_id'] for r in records)[:10]}")


def plot(rec: dict, out: str, question: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    post = np.asarray(rec["posterior"], dtype=float)              # [K, T]
    tokens = [t.replace("\u2581", " ").strip() or "\u2423" for t in rec["tokens"]]
    labels = [f"{i + 1}. {d['title'][:40]} (p={d['prior']:.2f})" for i, d in enumerate(rec["docs"])]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(tokens) + 4), 0.5 * len(labels) + 1.8))
    im = ax.imshow(post, aspect="auto", cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(tokens)), tokens, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    for (k, t), v in np.ndenumerate(post):
        ax.text(t, k, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v > 0.6 else "black")
    ax.set_title((question + "\n" if question else "") + f"RAG-Token document posterior p(z | x, y_i, y<i): \"{rec['text']}\"",
                 fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=130)
    plt.close(fig)


@cli_main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("posterior", help="JSON lines written by fairseq-generate --doc-posterior-out")
    ap.add_argument("--sample", type=int, default=None, help="sample id to plot (default: the first record)")
    ap.add_argument("--question", default="", help="title line (e.g. the question)")
    ap.add_argument("--out", required=True, help="PNG file to write")
    args = ap.parse_args(argv)
    plot(load_record(args.posterior, args.sample), args.out, args.question)
    print(args.out)


if __name__ == "__main__":
    sys.exit(main())
