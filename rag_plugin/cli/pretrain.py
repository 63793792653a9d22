"""rag-pretrain: pretrain a tiny generator on your own passages, as the demo does (no pretrained
seq2seq model ships offline), so that RAG models can start from it.

    rag-pretrain --knowledge KS_DIR --out PRE_DIR [--updates 1500] [--pseudo-updates 2000]

Two stages, each its data from the knowledge source's passages (rag-pretraining-data) and a
rag-train run of the tiny recipe (rag_plugin/pipeline/config/recipe/tiny.yaml, the demo's), every
command printed as it runs:
  1. denoise: BART's denoising objective in miniature (reconstruct corrupted passages), closed book;
  2. pseudo-questions (a run of a passage's words -> its title, or the words that follow them),
     answered from one BM25-retrieved passage, starting from stage 1 (--pseudo-updates 0: none).
Then PRE_DIR/generator.pt is the pretrained model (the last stage's checkpoint) and PRE_DIR/pretrain.json
says how it was made. Train RAG models from it with the same position sizes:

    rag-train DATA ... --generator-checkpoint PRE_DIR/generator.pt --max-source-positions 96 --max-target-positions 64

Resumable: rerun the same command after an interruption; a finished stage is skipped, an interrupted
one continues from its checkpoint_last.pt. A stage whose number of updates changed is trained again
from its start, and so is every stage after one that was trained. Logs: PRE_DIR/logs/.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.pipeline import commands, markers
from rag_plugin.pipeline.recipes import PRETRAINING_STAGES, PretrainingStage, load_recipe, rag_train_args, run_settings
from rag_plugin.util.errors import UserError, cli_main
from rag_plugin.util.io import atomic_write_json


def build_parser() -> ArgumentParser:
    recipe = load_recipe()
    p = ArgumentParser(prog="rag-pretrain", description=__doc__)
    p.add_argument("--knowledge", required=True, help="knowledge source directory (built with your vocabulary)")
    p.add_argument("--out", required=True, help="output directory (data/, checkpoints/, logs/, generator.pt)")
    p.add_argument("--updates", type=int, default=1500, help="updates of stage 1 (denoising, closed book)")
    p.add_argument("--pseudo-updates", type=int, default=2000,
                   help="updates of stage 2 (pseudo-questions, one BM25 passage); 0: stage 1 only")
    p.add_argument("--valid", type=int, default=0,
                   help="records of each stage held out for validation; 0: a tenth of the passages, at most 200")
    p.add_argument("--batch-size", type=int, default=recipe.dataset.batch_size, help="training batch size")
    p.add_argument("--max-source-positions", type=int, default=recipe.model.max_source_positions,
                   help="generator input length (question + title + passage); RAG models from it need the same")
    p.add_argument("--max-target-positions", type=int, default=recipe.model.max_target_positions,
                   help="generator output length; RAG models from it need the same")
    p.add_argument("--seed", type=int, default=recipe.common.seed, help="training seed")
    p.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    return p


def check_args(args) -> int:
    """One-line errors for bad input; the number of passages in the knowledge source."""
    from rag_plugin.retrieval.knowledge import KnowledgeSource  # start-up: numpy; --help stays light

    if args.updates < 1 or args.pseudo_updates < 0:
        raise UserError("--updates must be positive and --pseudo-updates 0 or more",
                        fix="e.g. --updates 1500 --pseudo-updates 2000")
    if args.batch_size < 1 or args.valid < 0:
        raise UserError("--batch-size must be positive and --valid 0 or more", fix="see rag-pretrain --help")
    if min(args.max_source_positions, args.max_target_positions) < 8:
        raise UserError("--max-source-positions and --max-target-positions must be at least 8",
                        fix="use the demo's 96 and 64")
    knowledge = KnowledgeSource(args.knowledge)
    if knowledge.passages.tokenizer_identity is None:
        raise UserError("the knowledge source has no generator vocabulary", path=args.knowledge,
                        fix="build it with --dict and --bpe-model (rag-vocab makes both)")
    return len(knowledge)


def valid_records(args, passages: int) -> int:
    return args.valid or max(1, min(200, passages // 10))


class Pretraining:
    """The stages of one ``rag-pretrain`` run under ``out``."""

    def __init__(self, args, passages: int):
        self.args = args
        self.out = Path(args.out)
        self.knowledge = str(Path(args.knowledge))
        self.valid = valid_records(args, passages)
        self.recipe = load_recipe()
        self.own = {"dataset.batch_size": args.batch_size, "model.max_source_positions": args.max_source_positions,
                    "model.max_target_positions": args.max_target_positions, "common.seed": args.seed}
        self.retrained = False  # a stage was trained in this run: the later ones start over

    def stages(self) -> List[tuple]:
        updates = {"denoise": self.args.updates, "pseudo_questions": self.args.pseudo_updates}
        return [(stage, updates[stage.name]) for stage in PRETRAINING_STAGES if updates[stage.name] > 0]

    def run(self, stage: PretrainingStage, updates: int, init: Optional[Path]) -> Path:
        """Data and training of one stage; its checkpoint_last.pt."""
        print(f"\n== stage {stage.name}: {stage.what} ({updates} updates)", flush=True)
        data = self.out / "data" / stage.name
        make_data = commands.Command("rag-pretraining-data", [
            "--knowledge", self.knowledge, "--out", data, "--objective", stage.objective, "--valid", self.valid])
        if self.args.dry_run:
            print(f"$ {make_data.shown()}", flush=True)
        elif not (data / "train.jsonl").is_file():  # written last by rag-pretraining-data
            commands.run(make_data, echo=lambda m: print(m, flush=True))
        return self.train(stage, updates, data, init)

    def train(self, stage: PretrainingStage, updates: int, data: Path, init: Optional[Path]) -> Path:
        save = self.out / "checkpoints" / stage.name
        settings = {"updates": updates, "batch_size": self.args.batch_size, "init": str(init) if init else None,
                    "positions": [self.args.max_source_positions, self.args.max_target_positions]}
        args = rag_train_args(self.recipe, self.own, stage.settings(),
                              run_settings(data, self.knowledge, save, updates, init=init))
        command = commands.Command("rag-train", args)
        if self.args.dry_run:
            print(f"$ {command.shown()}", flush=True)
        elif not self.retrained and markers.is_finished(save, settings):
            print(f"   finished before ({save / 'checkpoint_last.pt'})", flush=True)
        else:
            markers.prepare(save, settings, start_over=self.retrained)  # after a retrained stage: start over
            commands.run(command, log_file=self.out / "logs" / f"{stage.name}.log", progress=commands.condensed,
                         echo=lambda m: print(m, flush=True))
            markers.mark_finished(save, settings)
            self.retrained = True
        return save / "checkpoint_last.pt"


def publish(checkpoint: Path, out: Path) -> Path:
    """``out/generator.pt``: the final checkpoint, hard-linked (copied where links fail), atomically."""
    target = out / "generator.pt"
    tmp = out / ".generator.pt.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(checkpoint, tmp)
    except OSError:
        shutil.copy2(checkpoint, tmp)  # keeps the modification time, which RAG runs started from it record
    os.replace(tmp, target)
    return target


@cli_main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    passages = check_args(args)
    out = Path(args.out)
    job = Pretraining(args, passages)
    if not args.dry_run:
        (out / "pretrain.json").unlink(missing_ok=True)  # written last: its presence means the run finished
    init: Optional[Path] = None
    for stage, updates in job.stages():
        init = job.run(stage, updates, init)
    if args.dry_run:
        return 0
    generator = publish(init, out)
    atomic_write_json(out / "pretrain.json", {
        "generator_checkpoint": str(generator.resolve()), "knowledge": str(Path(args.knowledge).resolve()),
        "max_source_positions": args.max_source_positions, "max_target_positions": args.max_target_positions,
        "stages": {stage.name: updates for stage, updates in job.stages()}, "batch_size": args.batch_size})
    print(f"\n{generator}: the pretrained generator. Train RAG models from it with\n"
          f"  --generator-checkpoint {generator} --max-source-positions {args.max_source_positions} "
          f"--max-target-positions {args.max_target_positions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
