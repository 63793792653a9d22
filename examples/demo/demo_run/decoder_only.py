"""The decoder-only reader's pretraining (issue 37): a tiny fairseq ``transformer_lm`` on the knowledge source's
passages with fairseq's own ``language_modeling`` task (the same passages and updates as the encoder-decoder
generator's denoising stage), then the same pseudo-question stage as that generator's second, read by
``rag_lm_token_tiny`` from one BM25 passage. The systems of stages.yaml marked ``init: lm`` start from it."""
from __future__ import annotations

from pathlib import Path

from demo_run import recipe
from demo_run.runner import DATA, KS, training_done
from rag_plugin.pipeline.commands import console_script
from rag_plugin.pipeline.recipes import train_args, validate_interval

LM_DATA = DATA / "lm_passages"


def pretrain_lm(demo, updates: int, pseudo_updates: int) -> Path:
    """The LM (stage 1), then its pseudo-question stage (stage 2, when ``pseudo_updates`` > 0): the start of every
    ``init: lm`` system."""
    with demo.runner.step("the passages binarized for fairseq's language_modeling task"):
        demo.runner.run(console_script("rag-pretraining-data", "--knowledge", KS, "--out", LM_DATA,
                                       "--objective", "lm"))
    lm = train_language_model(demo, "pretrain_lm", updates)
    if pseudo_updates <= 0:
        return lm
    stage = demo.stages.train["pretrain_lm_pseudo"]
    with demo.runner.step("pseudo-questions from the knowledge source's passages"):
        demo.runner.run(console_script("rag-pretraining-data", "--knowledge", KS, "--out", DATA / "pseudo",
                                       "--objective", stage.objective))
    return demo.train("pretrain_lm_pseudo", stage, DATA / "pseudo", pseudo_updates, init=lm)


def train_language_model(demo, name: str, updates: int) -> Path:
    """fairseq-train --task language_modeling with the stage's config (stages.yaml ``train.<name>``)."""
    stage = demo.stages.train[name]
    save = demo.work / "checkpoints" / name
    ckpt = save / "checkpoint_last.pt"
    log_file = demo.work / f"train_{name}.log"
    if ckpt.is_file() and training_done(log_file, updates):
        demo.runner.log(f"   {name}: trained ({ckpt})")
        demo.reused.append(name)
        return ckpt
    config = recipe.compose_config(stage["config"], [stage.get("set") or {}, {
        "task.data": str(LM_DATA), "checkpoint.save_dir": str(save), "optimization.max_update": updates,
        "dataset.validate_interval_updates": validate_interval(updates)}])
    if "hydra" in config:
        del config["hydra"]
    with demo.runner.step(f"train {name} (fairseq's language_modeling task)"):
        demo.runner.run(console_script("fairseq-train", *train_args(config)), log_file=log_file)
    return ckpt
