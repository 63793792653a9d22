"""What runs inside ``fairseq-train`` to keep the index fresh while the document encoder trains (``--reindex-every``):
the background re-indexer (:mod:`rag_plugin.reindexing.reindexer`). The task drives it; it hands the model the new
version through the task."""
