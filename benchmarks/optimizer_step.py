#!/usr/bin/env python
"""One optimizer step on the trainable parameters of RAG models: fairseq's ``adam`` (what
``--optimizer adam`` builds on a machine without CUDA: a Python loop over the tensors), the
plugin's ``torch_adamw`` (torch's fused AdamW) and ``torch.optim.Adam``'s default CPU loop.

Also fairseq's whole update after the backward, as its trainer runs it: ``multiply_grads`` (by
1/sample size), ``clip_grad_norm`` (computed every update, here without ``--clip-norm``), the step;
for fairseq's ``adam``, for ``torch_adamw`` and for ``torch_adamw`` with fairseq's own
``multiply_grads``/``clip_grad_norm`` (what it ran before it deferred the factor to its kernel).

    .venv/bin/python benchmarks/optimizer_step.py [--sizes bench,base] [--threads 2] [--steps 20]

Sizes (random weights, the shapes are what matters):
* ``bench``: the side-by-side benchmark's model (BART d=256 3+3 layers, vocab 8000, and a
  DPR-shaped 4x256 BERT question encoder; 12.96M parameters);
* ``base``: BART base (fairseq's bart.base shapes, vocab 50265) with a BERT-base question encoder
  (vocab 30522), ~250M parameters;
* ``large``: BART large with BERT-base, the paper's 626M trainable parameters (10 GB of
  optimizer state and weights in fp32: not in the default list).

Prints a Markdown table (median milliseconds per step after warm-up) and writes JSON.
"""
import argparse
import functools
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent

import torch  # noqa: E402

SIZES = {  # generator size, generator overrides, dictionary size, BERT (layers, hidden, ffn, heads, vocab)
    "bench": ("tiny", dict(embed_dim=256, layers=3, heads=4, ffn_dim=1024), 8000, (4, 256, 1024, 4, 6094)),
    "base": ("base", {}, 50265, (12, 768, 3072, 12, 30522)),
    "large": ("large", {}, 50265, (12, 768, 3072, 12, 30522)),
}


def rag_parameters(size: str) -> list:
    """Fresh parameters with random gradients, shaped as the generator + question encoder of ``size``."""
    from fairseq.data import Dictionary

    from rag_plugin.models.generator import GeneratorShape, build_bart
    from rag_plugin.retrieval.encoders import BertConfig, BiEncoderTower

    gen_size, over, vocab, (layers, hidden, ffn, heads, qvocab) = SIZES[size]
    dictionary = Dictionary()
    for i in range(vocab - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    generator = build_bart(GeneratorShape(gen_size, 1024, 1024, 0.1, 0.1, 0.1, **over), dictionary)
    question = BiEncoderTower(BertConfig(vocab_size=qvocab, hidden_size=hidden, num_layers=layers,
                                         num_heads=heads, intermediate_size=ffn))
    params = [p for m in (generator, question) for p in m.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def optimizers():
    from fairseq.optim import FairseqOptimizer
    from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig

    from rag_plugin.optim.torch_adamw import TorchAdamW, TorchAdamWConfig

    class TorchAdamWFairseqPasses(TorchAdamW):
        """torch_adamw with fairseq's own gradient multiply and norm (two passes over the gradients)."""
        multiply_grads = FairseqOptimizer.multiply_grads
        clip_grad_norm = FairseqOptimizer.clip_grad_norm
        step = FairseqOptimizer.step

    return {
        "fairseq adam": lambda ps: FairseqAdam(FairseqAdamConfig(lr=[1e-5], adam_betas="(0.9, 0.999)", tpu=False), ps),
        "torch_adamw (fused)": lambda ps: TorchAdamW(TorchAdamWConfig(lr=[1e-5]), ps),
        "torch_adamw, fairseq's multiply and norm": lambda ps: TorchAdamWFairseqPasses(TorchAdamWConfig(lr=[1e-5]), ps),
        "torch.optim.Adam (default on CPU)": lambda ps: torch.optim.Adam(ps, lr=1e-5),
    }


def fairseq_update(opt) -> None:
    """The trainer's update after the backward (fairseq/trainer.py): gradients times 1/sample size
    (1.0 here, so the timed gradients stay the same), their norm, the step."""
    opt.multiply_grads(1.0)
    opt.clip_grad_norm(0.0)
    opt.step()


def print_table(results: dict, key: str, title: str, names: list) -> None:
    """A Markdown table of the ``key`` timings (ms), one row per size, ``names`` as columns."""
    print(f"| {title} | " + " | ".join(names) + " | fairseq adam ÷ torch_adamw |")
    print("|---|" + "---:|" * (len(names) + 1))
    for size, row in results["sizes"].items():
        ms = row[key]
        print(f"| {size}: {row['parameters'] / 1e6:.2f}M ({row['tensors']} tensors) | "
              + " | ".join(f"{ms[n]:.1f} ms" for n in names)
              + f" | {ms['fairseq adam'] / ms['torch_adamw (fused)']:.2f}x |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="bench,base", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per optimizer (after 3 warm-up steps)")
    ap.add_argument("--json-out", default=str(HERE / ".cache" / "optimizer_step.json"))
    args = ap.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        ap.error(f"unknown size(s) {', '.join(unknown)}: use {', '.join(SIZES)}")
    torch.set_num_threads(args.threads)
    import fairseq  # noqa: F401

    import rag_plugin

    rag_plugin.register()
    results = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "argv": sys.argv,
               "machine": {"processor": platform.processor() or platform.machine(), "nproc": os.cpu_count(),
                           "torch": torch.__version__, "threads": args.threads}, "sizes": {}}
    for size in sizes:
        params = rag_parameters(size)
        row = {"parameters": sum(p.numel() for p in params), "tensors": len(params), "ms": {}, "update_ms": {}}
        for name, make in optimizers().items():
            opt = make(params)
            # the step alone, then fairseq's whole update (fairseq optimizers only), alternating
            runs = {"ms": opt.step}
            if hasattr(opt, "multiply_grads"):
                runs["update_ms"] = functools.partial(fairseq_update, opt)
            times = {key: [] for key in runs}
            for _ in range(3 + args.steps):
                for key, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[key].append(time.perf_counter() - start)
            for key, ts in times.items():
                row[key][name] = statistics.median(ts[3:]) * 1e3
            del opt, runs
        results["sizes"][size] = row
        print(f"{size}: {row['parameters'] / 1e6:.2f}M parameters in {row['tensors']} tensors: step "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in row["ms"].items()) + "; fairseq's update "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in row["update_ms"].items()), file=sys.stderr)
        del params
    names = [n for n in optimizers() if n != "torch_adamw, fairseq's multiply and norm"]
    print_table(results, "ms", "parameters", names)
    print()
    names = list(next(iter(results["sizes"].values()))["update_ms"]) if results["sizes"] else []
    print_table(results, "update_ms", "fairseq's update (multiply_grads, clip_grad_norm, step)", names)
    from rag_plugin.util.io import atomic_write_json

    atomic_write_json(args.json_out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
