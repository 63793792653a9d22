#!/usr/bin/env python
"""Peak memory of a ``--train-doc-encoder`` step's document side against ``--rerank-top`` and ``--doc-encoder-chunk``.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/doc_encoder_memory.py \
        [--layers 12] [--questions 1] [--n-docs 5] [--rerank 10 25 50 100] [--before-max 25] [--kept 16 32 64] \
        [--chunks 0 8] [--json-out benchmarks/results/doc_encoder_memory.json]

A benchmark, not a test: it reports only. The document tower is a BERT-base-shaped random encoder
(``random:dim=768,heads=12,intermediate=3072``, ``--layers`` layers, CLS pooling as DPR, MiniLM's uncased WordPiece
vocabulary); the passages are 100 words drawn from that vocabulary, one in eight a compound of two, so a passage
is ~140 wordpieces with its title (Wikipedia's 100-word passages are ~130-150 with BERT's tokenizer; the mean is
reported). A fake retriever hands each question ``--rerank-top`` distinct rows (what the index would); the query
vectors are random leaves with gradient. One training step's document side, each in a fresh process so that its
high-water mark is its own:

* ``before``: the computation before ``--doc-encoder-chunk``: every candidate of every question through the tower
  in one batch, in one graph, scored, the top ``--n-docs`` kept, the backward;
* ``now``: ``rag_plugin.models.doc_encoder.rescored_retrieval`` itself: the candidates scored without a graph
  (in chunks), the kept rows encoded again with one, in chunks of ``chunk`` under activation checkpointing when
  they are more (``chunk`` 0: one batch), the backward.

Two sweeps: ``--rerank`` (``--questions`` x ``--n-docs`` rows kept, ``before`` and ``now`` at the default chunk),
and ``--kept`` (rows kept per step, no re-ranking, as ``--n-docs`` x batch, at each of ``--chunks``).
Reported per step: the rise of the process's peak resident memory (``ru_maxrss``, with glibc giving freed blocks of
128 KiB and more back at once: :data:`MMAP_THRESHOLD`) over its value after the tower was built and warmed up (its
gradients allocated), and the step's seconds (CPU, one thread; noisy on a shared
machine, memory is not).
"""
import argparse
import json
import resource
import subprocess
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: synthetic passages in the store the fake retriever picks from
PASSAGES = 2000
#: glibc: blocks from this size up are mapped apart and given back when freed, so the peak resident memory follows
#: the live tensors (by default the threshold grows with the first large frees, and a heap that keeps freed
#: activations inflates the peak of a run that frees and allocates again, as a checkpointed backward does)
MMAP_THRESHOLD = 128 * 1024


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


class Store:
    """Seeded synthetic passages: a 3-word title and 100 words, one in eight of them two vocabulary words joined."""

    def __init__(self, vocab, n: int = PASSAGES, seed: int = 0):
        import numpy as np

        self.vocab, self.n, self.seed = vocab, n, seed
        self.rng = np.random.default_rng

    def __len__(self):
        return self.n

    def _words(self, row: int, count: int, salt: int):
        rng = self.rng([self.seed, row, salt])
        picks = rng.integers(0, len(self.vocab), size=(count, 2))
        joined = rng.random(count) < 1 / 8
        return [self.vocab[a] + (self.vocab[b] if j else "") for (a, b), j in zip(picks, joined, strict=True)]

    def title(self, row: int) -> str:
        return " ".join(self._words(row, 3, 0)).title()

    def text(self, row: int) -> str:
        return " ".join(self._words(row, 100, 1))


def _whole_words(tokenizer):
    return sorted(w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) >= 3)


def measure(mode: str, layers: int, questions: int, n_docs: int, rerank: int, chunk: int) -> dict:
    import numpy as np
    import torch

    from rag_plugin.core.scores import inner_products
    from rag_plugin.models import doc_encoder as doc_side
    from rag_plugin.models.context import PassageTokenizer
    from rag_plugin.retrieval.encoders.random import build_random_encoder

    torch.set_num_threads(1)
    encoder = build_random_encoder(dim=768, layers=layers, heads=12, intermediate=3072, pooling="cls",
                                   normalize=False, max_length=256)
    tower = encoder.passage_tower.train()
    for p in tower.parameters():
        p.requires_grad_(True)
    tokenizer = PassageTokenizer(encoder)
    store = Store(_whole_words(encoder.tokenizer))
    top = max(n_docs, rerank)
    rows = np.random.default_rng(1).permutation(PASSAGES)[:questions * top].reshape(questions, top)
    retriever = types.SimpleNamespace(store=store, retrieve=lambda q, k, scale, candidates=None: (
        None, torch.from_numpy(rows[:q.shape[0], :k])))
    model = types.SimpleNamespace(
        cfg=types.SimpleNamespace(rerank_top=rerank, doc_encoder_chunk=chunk, doc_encoder_train_layers=0),
        doc_encoder=tower, retriever=retriever, doc_score_scale=1.0, training=True,
        context=types.SimpleNamespace(passage_tokenizer=tokenizer, knowledge=None, serving=False))
    checkpoints = []
    plain_checkpoint = doc_side.checkpoint

    def counted(fn, *args, **kw):
        checkpoints.append(int(args[0].shape[0]))
        return plain_checkpoint(fn, *args, **kw)

    doc_side.checkpoint = counted

    def step(b: int, k: int, how: str) -> None:
        q = torch.randn(b, tower.dim, generator=torch.Generator().manual_seed(2), requires_grad=True)
        if how == "before":
            candidates = torch.from_numpy(rows[:b, :max(k, rerank)])
            scores = inner_products(doc_side.document_vectors(tower, candidates, store, tokenizer, q.device), q)
            scores = scores.topk(k, dim=1).values
        else:
            scores, _ = doc_side.rescored_retrieval(model, q, k)
        (torch.logsumexp(scores, 1) - scores[:, 0]).sum().backward()

    saved, model.cfg.rerank_top = model.cfg.rerank_top, 0
    step(1, 1, "now")  # warm-up: the gradients, the allocator's first arenas
    model.cfg.rerank_top = saved
    tower.zero_grad(set_to_none=False)
    checkpoints.clear()
    base = _peak_mib()
    start = time.perf_counter()
    step(questions, n_docs, mode)
    seconds = time.perf_counter() - start
    lengths = [len(x) for x in tokenizer.ids([store.title(int(r)) for r in rows.reshape(-1)],
                                             [store.text(int(r)) for r in rows.reshape(-1)])]
    return {"mode": mode, "layers": layers, "questions": questions, "n_docs": n_docs, "rerank_top": rerank,
            "chunk": chunk, "rows_scored": int(rows.size), "rows_with_graph":
                int(rows.size) if mode == "before" else questions * n_docs,
            "checkpointed_chunks": len(checkpoints), "tokens_per_passage": round(float(np.mean(lengths)), 1),
            "peak_rise_mib": round(_peak_mib() - base, 1), "seconds": round(seconds, 1)}


def _run(args, mode, questions, n_docs, rerank, chunk) -> dict:
    cmd = [sys.executable, __file__, "--measure", mode, str(args.layers), str(questions), str(n_docs), str(rerank),
           str(chunk)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                            "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)})
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-3000:])
        raise SystemExit(1)
    row = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    from rag_plugin.models.doc_encoder import DEFAULT_CHUNK

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--questions", type=int, default=1, help="questions per step in the --rerank sweep")
    ap.add_argument("--n-docs", type=int, default=5)
    ap.add_argument("--rerank", type=int, nargs="*", default=[10, 25, 50, 100])
    ap.add_argument("--before-max", type=int, default=25,
                    help="measure 'before' up to this --rerank only (its memory grows as questions x --rerank: "
                         "~150 MiB a candidate at BERT-base size, past a small machine's at 100)")
    ap.add_argument("--kept", type=int, nargs="*", default=[16, 32, 64],
                    help="rows kept per step (n-docs x questions) in the chunk sweep")
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 8],
                    help="--doc-encoder-chunk values of the --kept sweep (0: one batch)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--measure", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        mode, *numbers = args.measure
        print(json.dumps(measure(mode, *map(int, numbers))))
        return 0
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = []
    for rerank in args.rerank:
        for mode in ("before", "now") if rerank <= args.before_max else ("now",):
            rows.append(_run(args, mode, args.questions, args.n_docs, rerank, DEFAULT_CHUNK))
    for kept in args.kept:
        for chunk in args.chunks:
            rows.append(_run(args, "now", kept // args.n_docs or 1, min(kept, args.n_docs), 0, chunk))
    print(f"\n{'mode':7} {'layers':>6} {'B':>3} {'K':>3} {'L':>4} {'chunk':>5} {'graph rows':>10} {'ckpt':>4} "
          f"{'tokens':>6} {'peak MiB':>9} {'s':>6}")
    for r in rows:
        print(f"{r['mode']:7} {r['layers']:>6} {r['questions']:>3} {r['n_docs']:>3} {r['rerank_top']:>4} "
              f"{r['chunk']:>5} {r['rows_with_graph']:>10} {r['checkpointed_chunks']:>4} {r['tokens_per_passage']:>6} "
              f"{r['peak_rise_mib']:>9} {r['seconds']:>6}")
    if args.json_out:
        out = {"command": " ".join(["benchmarks/doc_encoder_memory.py", *(argv or sys.argv[1:])]),
               "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "rows": rows}
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
