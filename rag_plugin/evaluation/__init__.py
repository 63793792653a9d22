"""Evaluation of RAG outputs: the paper's metrics, a registry of them, readers, leaderboards.

* :mod:`~rag_plugin.evaluation.metrics` -- pure metric functions (values in [0, 1]).
* :mod:`~rag_plugin.evaluation.registry` -- every metric registered once (name, label, kind, what
  it needs, function); metric names (``em``, ``recall@5``, ...) and each task's default metrics.
* :mod:`~rag_plugin.evaluation.records` -- gold examples and guesses aligned with them.
* :mod:`~rag_plugin.evaluation.readers` -- KILT gold files, KILT JSONL guesses, passage texts;
  :mod:`~rag_plugin.evaluation.fairseq_output` -- fairseq-generate output as guesses. Checked
  strictly: errors name the file and line.
* :mod:`~rag_plugin.evaluation.inputs` -- what metrics read, derived once (documents, labels, texts).
* :mod:`~rag_plugin.evaluation.scoring` -- :func:`~rag_plugin.evaluation.scoring.evaluate`: every
  metric in percent, as the paper reports them.
* :mod:`~rag_plugin.evaluation.leaderboard` -- several systems as rows; Markdown and JSON.

Nothing here imports fairseq (or torch): ``rag-evaluate`` and ``rag-leaderboard``
(:mod:`rag_plugin.cli`) run on any machine with the plugin's light dependencies.
"""
