#!/usr/bin/env python
"""Memory per example of Fusion-in-Decoder (``fid_tiny``) against RAG-Token (``rag_token_tiny``) as K grows.

    PYTHONPATH=. .venv/bin/python benchmarks/fid_memory.py [--k 5 10 20] [--batch 8] [--words 100] [--work DIR]

A synthetic world is built once under ``--work``: 300 passages of ``--words`` random words (FiD's
psgs_w100 passages have 100), 64 questions (12 words of a gold passage; the answer: the 3 words that follow
it), a SentencePiece vocabulary of 700 pieces, a knowledge source with a small random encoder. Each
(arch, K, phase) then runs in a fresh process so that its high-water mark is its own:

* ``train``: one forward + backward of a batch of ``--batch`` questions (cross-entropy for FiD, the
  marginal for RAG-Token, dropout 0.1);
* ``generate``: beam search (beam 4, up to 16 tokens) for the same batch through the task's generator
  (FiD: with the attention shares).

Reported per example: the rise of the process's peak resident memory (``ru_maxrss``) over its value after
the model was built and warmed up on a single question with K = 1 (MiB / ``--batch``), and the size of
the encoder states the decoder reads (K pairs x L positions x d, float32). CPU, one thread.
"""
import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build_world(work: Path, words: int) -> dict:
    import numpy as np

    from rag_plugin.datasets.vocab import train_spm, write_fairseq_dict_from_spm
    from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
    from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles

    ks = work / "ks"
    world = {"data": str(work / "qa"), "ks": str(ks)}
    if (ks / "manifest.json").exists():
        return world
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = sorted({"".join(rng.choice(letters, size=int(rng.integers(3, 9)))) for _ in range(800)})
    passages = [{"id": f"p{i}", "title": " ".join(rng.choice(vocab, size=2)),
                 "text": " ".join(rng.choice(vocab, size=words))} for i in range(300)]
    work.mkdir(parents=True, exist_ok=True)
    (work / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    records = []
    for i in range(64):
        text = passages[i]["text"].split()
        start = int(rng.integers(0, words - 15))
        records.append({"id": f"q{i}", "input": " ".join(text[start: start + 12]),
                        "output": [{"answer": " ".join(text[start + 12: start + 15]),
                                    "provenance": [{"id": f"p{i}"}]}]})
    (work / "qa").mkdir(exist_ok=True)
    for split in ("train", "valid"):
        (work / "qa" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    train_spm([p["text"] for p in passages], work / "spm.model", work / "spm.vocab", vocab_size=700,
              byte_fallback=False)
    write_fairseq_dict_from_spm(work / "spm.model", work / "dict.txt")
    settings = BuildSettings(passages=str(work / "passages.jsonl"),
                             encoder="random:dim=64,layers=1,heads=2,intermediate=128,seed=0",
                             index_factory="Flat", tokenizer=GeneratorTokenizerFiles(
                                 dict=str(work / "dict.txt"), bpe_model=str(work / "spm.model")))
    build_knowledge_source(str(ks), settings, BuildOptions(progress=False, log=lambda m: None))
    return world


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def measure(world: dict, arch: str, k: int, phase: str, batch: int) -> dict:
    import torch

    import rag_plugin

    torch.set_num_threads(1)
    rag_plugin.register()
    from fairseq.dataclass.configs import GenerationConfig

    from rag_plugin.core import marginalization as M
    from rag_plugin.models.fid import FidConfig, FidModel
    from rag_plugin.models.rag import RagConfig, RagTokenModel
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=world["data"], knowledge=world["ks"],
                                                                      n_docs=k))
    task.load_dataset("train")
    cls, cfg = (FidModel, FidConfig) if arch.startswith("fid") else (RagTokenModel, RagConfig)
    torch.manual_seed(0)
    model = cls.build_model(cfg(generator_size="tiny", max_source_positions=256, max_target_positions=64), task)
    ds = task.datasets["train"]
    sample = ds.collater([ds[i] for i in range(batch)])
    one = ds.collater([ds[0]])

    def loss_of(s, n_docs=None):
        logits, extra = model(**s["net_input"], n_docs=n_docs)
        target, mask = s["target"], s["target"].ne(model.pad)
        if model.variant == "fid":
            lp = torch.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
            return -(lp * mask).sum()
        lprobs = torch.log_softmax(logits.float(), -1).view(target.size(0), -1, *logits.shape[1:])
        return M.rag_token_loss(lprobs, M.doc_log_prior(extra["doc_scores"].float()), target, mask)[0].sum()

    model.train()
    loss_of(one, n_docs=1).backward()  # warm-up: lazily allocated buffers, the allocator's first arenas
    model.zero_grad(set_to_none=True)
    base = _peak_mib()
    with torch.no_grad():
        src, _ = model.generator_inputs(sample["net_input"]["src_tokens"],
                                        model.retrieve(sample["net_input"].get("query_tokens"),
                                                       sample["net_input"].get("query_mask"), k)[1])
    if phase == "train":
        loss_of(sample).backward()
    else:
        model.eval()
        task.build_generator([model], GenerationConfig(beam=4, max_len_a=0, max_len_b=16)).generate([model], sample)
    dim = model.generator.encoder.embed_tokens.embedding_dim
    return {"arch": arch, "k": k, "phase": phase, "batch": batch, "pair_length": int(src.size(1)),
            "peak_rise_mib_per_example": round((_peak_mib() - base) / batch, 2),
            "encoder_states_mib_per_example": round(k * src.size(1) * dim * 4 / 2 ** 20, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, nargs="+", default=[5, 10, 20])
    ap.add_argument("--arch", nargs="+", default=["fid_tiny", "rag_token_tiny"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--words", type=int, default=100)
    ap.add_argument("--work", default="/tmp/fid_memory")
    ap.add_argument("--measure", nargs=3, metavar=("ARCH", "K", "PHASE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    world = build_world(Path(args.work) / f"w{args.words}", args.words)
    if args.measure:
        arch, k, phase = args.measure
        print(json.dumps(measure(world, arch, int(k), phase, args.batch)))
        return 0
    rows = []
    for arch in args.arch:
        for k in args.k:
            for phase in ("train", "generate"):
                cmd = [sys.executable, __file__, "--measure", arch, str(k), phase, "--batch", str(args.batch),
                       "--words", str(args.words), "--work", args.work]
                r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                   env={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
                if r.returncode != 0:
                    sys.stderr.write(r.stderr[-3000:])
                    return 1
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'arch':16} {'K':>3} {'L':>4} {'train MiB/ex':>13} {'generate MiB/ex':>16} {'enc. states MiB/ex':>19}")
    for arch in args.arch:
        for k in args.k:
            t, g = [r for r in rows if r["arch"] == arch and r["k"] == k]
            print(f"{arch:16} {k:>3} {t['pair_length']:>4} {t['peak_rise_mib_per_example']:>13} "
                  f"{g['peak_rise_mib_per_example']:>16} {t['encoder_states_mib_per_example']:>19}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
