"""Configs shipped with the package, as fairseq ships fairseq/config: recipe/tiny.yaml, the tiny training recipe
(read by :mod:`rag_plugin.pipeline.recipes`; the demo's fairseq-hydra-train configs find it on their
``hydra.searchpath``, pkg://rag_plugin.pipeline.config)."""
