"""The tiny training recipe as fairseq-train arguments, and the generator pretraining stages.

:class:`TinyRecipe` holds the values of the demo's recipe (examples/demo/config/recipe/tiny.yaml, which
the package cannot read: examples/ is not installed; tests/cli/test_pretrain.py checks that the two
agree): a tiny BART generator (2+2 layers, d=192) at lr 1e-3 with Adam betas (0.9, 0.98), inverse
square root warm-up, gradient clipping, batches of 32, the query encoder's token embeddings frozen and
the query encoder at the automatic learning-rate scale (min(1, 3e-5 / lr): 3e-5 here).
:meth:`TinyRecipe.train_args` turns it into the arguments of ``rag-train`` for one run.

:data:`PRETRAINING_STAGES` are what the demo does to pretrain a generator on passages alone (no
pretrained seq2seq model ships offline): BART's denoising objective, closed book, then
pseudo-questions answered from one BM25-retrieved passage (``rag-pretraining-data --objective``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class TinyRecipe:
    """fairseq-train options shared by every run of the tiny recipe."""

    lr: float = 1e-3
    adam_betas: str = "(0.9, 0.98)"
    warmup_updates: int = 100
    clip_norm: float = 1.0
    batch_size: int = 32
    batch_size_valid: int = 64
    dropout: float = 0.1
    max_source_positions: int = 96   # question + title + the passage's first ~50 words (demo's vocabulary)
    max_target_positions: int = 64
    log_interval: int = 25
    seed: int = 1
    freeze_query_embeddings: bool = True  # the query encoder's 30k-token table stays fixed (CPU time)

    def common_args(self) -> List[str]:
        """Optimizer, schedule, batches, lengths, logging: what every run shares."""
        args = ["--criterion", "marginal_nll", "--optimizer", "torch_adamw", "--adam-betas", self.adam_betas,
                "--lr", repr(self.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(self.warmup_updates),
                "--clip-norm", repr(self.clip_norm), "--dropout", repr(self.dropout),
                "--max-source-positions", str(self.max_source_positions),
                "--max-target-positions", str(self.max_target_positions),
                "--batch-size", str(self.batch_size), "--batch-size-valid", str(self.batch_size_valid),
                "--required-batch-size-multiple", "1", "--num-workers", "0", "--cpu",
                "--log-format", "simple", "--log-interval", str(self.log_interval), "--seed", str(self.seed),
                "--no-epoch-checkpoints"]
        if self.freeze_query_embeddings:
            args.append("--freeze-query-embeddings")
        return args

    def train_args(self, data: str, knowledge: str, save_dir: str, updates: int, *, arch: str = "rag_token_tiny",
                   n_docs: int = 3, retriever: str = "dense", generator_checkpoint: Optional[str] = None,
                   extra: Tuple[str, ...] = ()) -> List[str]:
        """``rag-train``'s arguments for one run: ``data`` (a directory of KILT train/valid.jsonl) with
        ``knowledge``, ``updates`` updates into ``save_dir``, validated four times (at least every 50
        updates), from ``generator_checkpoint`` if given; ``extra`` options last."""
        args = [str(data), "--task", "retrieval_augmented", "--knowledge", str(knowledge), "--arch", arch,
                "--n-docs", str(n_docs)]
        if retriever != "dense":
            args += ["--retriever", retriever]
        if generator_checkpoint:
            args += ["--generator-checkpoint", str(generator_checkpoint)]
        args += self.common_args()
        args += ["--max-update", str(updates), "--validate-interval-updates", str(validate_interval(updates)),
                 "--save-dir", str(save_dir)]
        return args + list(extra)


def validate_interval(updates: int) -> int:
    """Validation four times in a run, at least 50 updates apart (the demo's rule)."""
    return max(50, updates // 4)


@dataclass(frozen=True)
class PretrainingStage:
    """One stage of generator pretraining: data made by ``rag-pretraining-data --objective objective``,
    trained with ``n_docs`` documents from ``retriever`` (0: closed book)."""

    name: str
    objective: str
    n_docs: int
    retriever: str = "dense"
    what: str = ""


PRETRAINING_STAGES = (
    PretrainingStage("denoise", "denoise", n_docs=0,
                     what="BART's denoising objective in miniature: reconstruct corrupted passages, closed book"),
    PretrainingStage("pseudo_questions", "pseudo-questions", n_docs=1, retriever="bm25",
                     what="pseudo-questions (a run of words -> the title, or -> the words that follow), answered "
                          "from one BM25-retrieved passage"),
)
