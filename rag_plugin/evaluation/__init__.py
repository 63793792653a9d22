"""Evaluation of RAG outputs: the paper's metrics, readers for gold and guess files.

* :mod:`rag_plugin.evaluation.metrics` -- pure metric functions (values in [0, 1]).
* :mod:`rag_plugin.evaluation.readers` -- KILT gold files; KILT JSONL or fairseq-generate
  guess files, checked strictly (errors name the file and line).
* :mod:`rag_plugin.evaluation.scoring` -- metric names (``em``, ``recall@5``, ...), the
  default metric set of each task, and :func:`~rag_plugin.evaluation.scoring.evaluate`,
  which reports every metric in percent, as the paper does.

Nothing here imports fairseq (or torch): ``scripts/evaluate.py`` and
``scripts/leaderboard.py`` run on any machine with the plugin's light dependencies.
"""
