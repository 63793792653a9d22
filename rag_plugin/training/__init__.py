"""Training helpers of the console scripts rag-pretrain and rag-choose-k: the tiny recipe as command
lines (:mod:`rag_plugin.training.recipes`) and a runner that prints each command as a user would type
it and keeps its output in a log (:mod:`rag_plugin.training.commands`). No fairseq import."""
