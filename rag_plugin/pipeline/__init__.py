"""Command pipelines built from the plugin's console scripts, outside fairseq-train: the runner that
prints each command as a user would type it and keeps its output in a log (:mod:`.commands`), the
finished-run markers that make a rerun skip what is done (:mod:`.markers`) and the tiny training
recipe, shipped as package data (``config/recipe/tiny.yaml``, the demo's fairseq-hydra-train configs
compose the same file), turned into command lines (:mod:`.recipes`). Used by rag-pretrain,
rag-choose-k and the worked examples (examples/demo, examples/own_corpus). No fairseq import."""
