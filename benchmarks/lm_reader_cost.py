#!/usr/bin/env python
"""Speed and memory per example of the decoder-only reader (``rag_lm_token_tiny``, ``rag_lm_seq_tiny``) against the
encoder-decoder reader (``rag_token_tiny``, ``rag_seq_tiny``) at the same K.

    PYTHONPATH=. .venv/bin/python benchmarks/lm_reader_cost.py [--k 5 10] [--batch 8] [--json-out FILE]

The world is benchmarks/fid_memory.py's (300 passages of 100 random words, 64 questions of 12 words whose answer is
the 3 words after them, SentencePiece of 700 pieces), built once under ``--work``. Both readers read the same
question + passage tokens (``--max-source-positions 160``: the whole 100-word passage) and have about the same
weights (the encoder-decoder: 2 + 2 layers, the LM: 4 layers, d=192; parameter counts in the table). Each (arch, K,
phase) runs in a fresh process, one thread, so that its peak memory is its own:

* ``train``: forward + backward of a batch of ``--batch`` questions through the marginal NLL (dropout 0.1), median
  of ``--repeats`` after one warm-up;
* ``generate``: the task's generator for the same batch, up to 16 tokens (RAG-Token: beam 4; RAG-Sequence: beam 4
  per passage, then Thorough), median of ``--repeats``.

Reported per example: milliseconds, and the rise of the peak resident memory (``ru_maxrss``) over its value after a
one-question warm-up at K = 1, in MiB.
"""
import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from fid_memory import build_world  # noqa: E402  (the same synthetic world)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(world: dict, arch: str, k: int, phase: str, batch: int, repeats: int) -> dict:
    import torch

    import rag_plugin

    torch.set_num_threads(1)
    rag_plugin.register()
    from fairseq.dataclass.configs import GenerationConfig

    from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion
    from rag_plugin.models.generator import count_parameters
    from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel
    from rag_plugin.models.rag_lm import RagLMConfig, RagLMSequenceModel, RagLMTokenModel
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    classes = {"rag_token_tiny": (RagTokenModel, RagConfig), "rag_seq_tiny": (RagSequenceModel, RagConfig),
               "rag_lm_token_tiny": (RagLMTokenModel, RagLMConfig),
               "rag_lm_seq_tiny": (RagLMSequenceModel, RagLMConfig)}
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=world["data"], knowledge=world["ks"],
                                                                      n_docs=k))
    task.load_dataset("train")
    cls, cfg = classes[arch]
    torch.manual_seed(0)
    model = cls.build_model(cfg(generator_size="tiny", max_source_positions=160, max_target_positions=64), task)
    criterion = MarginalNLLCriterion(task)
    ds = task.datasets["train"]
    sample = ds.collater([ds[i] for i in range(batch)])
    one = ds.collater([ds[0]])
    model.train()
    one["net_input"]["n_docs"] = 1
    criterion(model, one)[0].backward()  # warm-up: lazily allocated buffers, the allocator's first arenas
    model.zero_grad(set_to_none=True)
    base = _peak_mib()
    times = []
    if phase == "train":
        for _ in range(repeats + 1):
            start = time.perf_counter()
            criterion(model, sample)[0].backward()
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    else:
        model.eval()
        generator = task.build_generator([model], GenerationConfig(beam=4, max_len_a=0, max_len_b=16))
        for _ in range(repeats + 1):
            start = time.perf_counter()
            generator.generate([model], sample)
            times.append(time.perf_counter() - start)
    return {"arch": arch, "k": k, "phase": phase, "batch": batch, "parameters": count_parameters(model.generator),
            "ms_per_example": round(1000 * statistics.median(times[1:]) / batch, 2),
            "peak_rise_mib_per_example": round((_peak_mib() - base) / batch, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10])
    ap.add_argument("--arch", nargs="+", default=["rag_token_tiny", "rag_lm_token_tiny", "rag_seq_tiny",
                                                  "rag_lm_seq_tiny"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/fid_memory")
    ap.add_argument("--json-out", help="write the rows here too")
    ap.add_argument("--measure", nargs=3, metavar=("ARCH", "K", "PHASE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    world = build_world(Path(args.work) / "w100", 100)
    if args.measure:
        arch, k, phase = args.measure
        print(json.dumps(measure(world, arch, int(k), phase, args.batch, args.repeats)))
        return 0
    rows = []
    for k in args.k:
        for arch in args.arch:
            for phase in ("train", "generate"):
                cmd = [sys.executable, __file__, "--measure", arch, str(k), phase, "--batch", str(args.batch),
                       "--repeats", str(args.repeats), "--work", args.work]
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                   env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
                if r.returncode != 0:
                    sys.stderr.write(r.stderr[-3000:])
                    return 1
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\n{'arch':18} {'K':>3} {'params':>10} {'train ms/ex':>12} {'train MiB/ex':>13} {'gen ms/ex':>10} "
          f"{'gen MiB/ex':>11}")
    for k in args.k:
        for arch in args.arch:
            t, g = [r for r in rows if r["arch"] == arch and r["k"] == k]
            print(f"{arch:18} {k:>3} {t['parameters']:>10,} {t['ms_per_example']:>12} "
                  f"{t['peak_rise_mib_per_example']:>13} {g['ms_per_example']:>10} "
                  f"{g['peak_rise_mib_per_example']:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
